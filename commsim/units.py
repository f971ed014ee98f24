"""Parse and format physical quantities: SI inside the code, human strings at the edges.

Sizes ("25MiB", "4GB", "8B"), rates ("400Gbps", "50GB/s") and times ("1.5us", "2ms")
become bytes, bytes/s and seconds. Decimal prefixes are powers of 1000, binary ones
(Ki, Mi, Gi, Ti) powers of 1024, and a lower-case "b" means bits.
"""

from __future__ import annotations

import re

_PREFIX = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*(Ki|Mi|Gi|Ti|k|K|M|G|T|P)?(B|b|bit|bits|byte|bytes)?\s*$")
_RATE_RE = re.compile(rf"^\s*{_NUMBER}\s*(Ki|Mi|Gi|Ti|k|K|M|G|T|P)?(B/s|Bps|bps|b/s|bit/s)\s*$")
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
_TIME_UNITS.update({"d": 86400.0})
_TIME_RE = re.compile(rf"^\s*{_NUMBER}\s*(s|ms|us|µs|ns|min|h|d)?\s*$")


class UnitError(ValueError):
    """A quantity string that cannot be parsed."""


def parse_bytes(value: str | float | int) -> float:
    """Bytes from "25MiB", "4GB", "8B", "1Gb" (bits) or a bare number of bytes."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _SIZE_RE.match(value)
    if not m:
        raise UnitError(f"not a size: {value!r} (examples: 8B, 25MiB, 4GB)")
    number, prefix, unit = m.groups()
    scale = _PREFIX[prefix or ""]
    bits = unit in ("b", "bit", "bits")
    return float(number) * scale / (8.0 if bits else 1.0)


def parse_rate(value: str | float | int) -> float:
    """Bytes per second from "400Gbps", "50GB/s", "25GiB/s" or a bare number of bytes/s."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _RATE_RE.match(value)
    if not m:
        raise UnitError(f"not a rate: {value!r} (examples: 400Gbps, 50GB/s)")
    number, prefix, unit = m.groups()
    scale = _PREFIX[prefix or ""]
    bits = unit in ("bps", "b/s", "bit/s")
    return float(number) * scale / (8.0 if bits else 1.0)


def parse_time(value: str | float | int) -> float:
    """Seconds from "1.5us", "2ms", "30d" or a bare number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _TIME_RE.match(value)
    if not m:
        raise UnitError(f"not a time: {value!r} (examples: 1.5us, 2ms, 30d)")
    number, unit = m.groups()
    return float(number) * _TIME_UNITS[unit or "s"]


def parse_size_range(value: str) -> tuple[float, float]:
    """A size sweep "8B:4GiB" as (low, high) bytes; a single size gives (s, s)."""
    parts = value.split(":")
    if len(parts) == 1:
        s = parse_bytes(parts[0])
        return s, s
    if len(parts) != 2:
        raise UnitError(f"not a size range: {value!r} (example: 8B:4GiB)")
    lo, hi = parse_bytes(parts[0]), parse_bytes(parts[1])
    if lo <= 0 or hi < lo:
        raise UnitError(f"size range {value!r} must satisfy 0 < low <= high")
    return lo, hi


def fmt_bytes(n: float) -> str:
    """Binary-prefixed size, as nccl-tests users read it: 1.0 MiB, 256 B."""
    for prefix, scale in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}B"
    return f"{n:.0f} B"


def fmt_time(t: float) -> str:
    """Seconds with the unit that keeps 3-4 significant digits: 12.3 ms, 4.56 us."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(t) >= scale:
            return f"{t / scale:.4g} {unit}"
    return f"{t / 1e-9:.4g} ns"


def fmt_rate(bps: float) -> str:
    """Bytes/s as GB/s (decimal, as nccl-tests prints)."""
    return f"{bps / 1e9:.2f} GB/s"
