"""Parse and format physical quantities: SI inside the code, human strings at the edges.

Sizes ("25MiB", "4GB", "8B"), rates ("400Gbps", "50GB/s") and times ("1.5us", "2ms")
become bytes, bytes/s and seconds. Decimal prefixes are powers of 1000, binary ones
(Ki, Mi, Gi, Ti) powers of 1024, and a lower-case "b" means bits.
"""

from __future__ import annotations

import math
import re

_PREFIX = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_PREFIXES = "(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E)"
_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*{_PREFIXES}?(B|b|bit|bits|byte|bytes)?\s*$")
_RATE_RE = re.compile(rf"^\s*{_NUMBER}\s*{_PREFIXES}?(B/s|Bps|bps|b/s|bit/s)\s*$")
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
_TIME_UNITS.update({"d": 86400.0})
_TIME_RE = re.compile(rf"^\s*{_NUMBER}\s*(s|ms|us|µs|ns|min|h|d)?\s*$")


class UnitError(ValueError):
    """A quantity string that cannot be parsed."""


_EXAMPLES = {"size": "8B, 25MiB, 4GB", "rate": "400Gbps, 50GB/s", "time": "1.5us, 2ms, 30d"}


def _checked(x: float, value: object, what: str, unit_given: bool, bare: bool) -> float:
    """x, unless it is not finite, or a non-zero bare number where a unit is required."""
    if not math.isfinite(x):
        raise UnitError(f"{value!r} is not a finite {what}")
    if not bare and not unit_given and x != 0:
        raise UnitError(
            f"{value!r} has no unit: write the {what} with one (examples: {_EXAMPLES[what]})"
        )
    return x


def _number(value: object, what: str) -> float | None:
    """A number given as a number (not a string); None for a string."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UnitError(f"not a {what}: {value!r} (examples: {_EXAMPLES[what]})")
    return None if isinstance(value, str) else float(value)


def parse_bytes(value: str | float | int, bare: bool = True) -> float:
    """Bytes from "25MiB", "4GB", "8B", "1Gb" (bits) or a bare number of bytes (refused
    when `bare` is False: a file must say its unit)."""
    if (n := _number(value, "size")) is not None:
        return _checked(n, value, "size", False, bare)
    m = _SIZE_RE.match(value)
    if not m:
        raise UnitError(f"not a size: {value!r} (examples: {_EXAMPLES['size']})")
    number, prefix, unit = m.groups()
    scale = _PREFIX[prefix or ""]
    bits = unit in ("b", "bit", "bits")
    x = float(number) * scale / (8.0 if bits else 1.0)
    return _checked(x, value, "size", bool(unit), bare)


def parse_rate(value: str | float | int, bare: bool = True) -> float:
    """Bytes per second from "400Gbps", "50GB/s", "25GiB/s" or a bare number of bytes/s
    (refused when `bare` is False)."""
    if (n := _number(value, "rate")) is not None:
        return _checked(n, value, "rate", False, bare)
    m = _RATE_RE.match(value)
    if not m:
        raise UnitError(f"not a rate: {value!r} (examples: {_EXAMPLES['rate']})")
    number, prefix, unit = m.groups()
    scale = _PREFIX[prefix or ""]
    bits = unit in ("bps", "b/s", "bit/s")
    return _checked(float(number) * scale / (8.0 if bits else 1.0), value, "rate", True, bare)


def parse_time(value: str | float | int, bare: bool = True) -> float:
    """Seconds from "1.5us", "2ms", "30d" or a bare number of seconds (refused when `bare`
    is False)."""
    if (n := _number(value, "time")) is not None:
        return _checked(n, value, "time", False, bare)
    m = _TIME_RE.match(value)
    if not m:
        raise UnitError(f"not a time: {value!r} (examples: {_EXAMPLES['time']})")
    number, unit = m.groups()
    return _checked(float(number) * _TIME_UNITS[unit or "s"], value, "time", bool(unit), bare)


def parse_size_range(value: str) -> tuple[float, float]:
    """A size sweep "8B:4GiB" as (low, high) bytes; a single size gives (s, s)."""
    parts = value.split(":")
    if len(parts) > 2:
        raise UnitError(f"not a size range: {value!r} (example: 8B:4GiB)")
    lo, hi = parse_bytes(parts[0]), parse_bytes(parts[-1])  # one size: (s, s)
    if lo <= 0 or hi < lo:
        raise UnitError(f"size range {value!r} must satisfy 0 < low <= high")
    if lo % 1 or hi % 1:  # 1.5B was timed as 1.5 bytes and shown as "2 B"
        raise UnitError(f"size range {value!r}: a message is a whole number of bytes")
    if hi / lo > 2.0**64:
        raise UnitError(f"size range {value!r} spans over 64 doublings")
    return lo, hi


def fmt_bytes(n: float) -> str:
    """Binary-prefixed size, as nccl-tests users read it: 1.0 MiB, 256 B."""
    for prefix, scale in (
        ("Ei", 2**60),
        ("Pi", 2**50),
        ("Ti", 2**40),
        ("Gi", 2**30),
        ("Mi", 2**20),
        ("Ki", 2**10),
    ):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}B"
    return f"{n:.0f} B"


def fmt_time(t: float) -> str:
    """Seconds with the unit that keeps 3-4 significant digits: 12.3 ms, 4.56 us; 0 as 0,
    and anything under a nanosecond (rounding left-overs of a sum) as < 1 ns."""
    if t == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(t) >= scale:
            return f"{t / scale:.4g} {unit}"
    return "< 1 ns" if t > 0 else "> -1 ns"


def fmt_duration(t: float, days: str = "days", decimals: int | None = None) -> str:
    """A long span in the unit a person plans in: 41.3 days, 9.6 h, 12 min, or fmt_time's;
    `days` spells the day ("d" where a table is narrow). Below 100 of the unit, 3
    significant digits or `decimals` fixed ones (a column: 10.72 d over 10.78 d); whole
    units with commas up to a million, then 1.16e+09."""
    for unit, scale in ((days, 86400.0), ("h", 3600.0), ("min", 60.0)):
        if abs(t) >= scale:
            v = t / scale
            if 100 <= abs(v) < 1e6:
                return f"{v:,.0f} {unit}"
            small = abs(v) < 100 and decimals is not None
            return f"{v:.{decimals}f} {unit}" if small else f"{v:.3g} {unit}"
    return fmt_time(t)


def fmt_rate(bps: float) -> str:
    """Bytes/s as GB/s (decimal, as nccl-tests prints)."""
    return f"{bps / 1e9:.2f} GB/s"


def fmt_gpus(n: int) -> str:
    """A GPU count as titles say it: 1 GPU, 1,024 GPUs."""
    return f"{n:,} GPU" + ("" if n == 1 else "s")
