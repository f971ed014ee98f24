"""What the harness measures and how: the `calibrate run` options, checked."""

from __future__ import annotations

import math
from dataclasses import dataclass

from commsim.profile import OPS
from commsim.specs import SpecError
from commsim.units import parse_size_range


def _valid_hook(name: str) -> bool:
    kind, _, rank = name.partition(":")
    if kind == "powersgd":
        return rank.isdigit() and int(rank) >= 1
    return name in ("none", "fp16", "bf16")


@dataclass(frozen=True)
class HarnessConfig:
    """What to measure and how (the `calibrate run` options)."""

    out: str
    backend: str = "auto"  # gloo, nccl, or auto: nccl when CUDA is available
    sizes: str = "8B:256MiB"  # doubling sweep, nccl-tests' -b/-e/-f 2
    ops: tuple[str, ...] = OPS
    bucket_mb: tuple[float, ...] = (1.0, 5.0, 25.0)  # DDP bucket_cap_mb values; () skips DDP
    warmup: int = 5
    repeats: int = 20
    point_budget_s: float = 2.0  # fewer repeats (at least 3) when one op is slow
    groups: str = "tiers"  # "tiers": world + rank 0's rack and host; "world": world only
    timeout_s: float = 300.0
    width: int = 512  # DDP model: hidden width
    depth: int = 4  # blocks
    batch: int = 32  # samples per rank per step
    ddp_repeats: int = 10
    comm_hooks: tuple[str, ...] = ("none",)  # DDP comm hooks, spelled as commsim spells them
    profile_dir: str | None = None  # write torch.profiler traces of DDP steps here

    def __post_init__(self) -> None:
        try:
            lo, _ = parse_size_range(self.sizes)
        except ValueError as e:  # units.UnitError
            raise SpecError("--sizes", "", str(e)) from None
        unknown = [op for op in self.ops if op not in OPS]
        if unknown:
            raise SpecError(
                "--ops", "", f"unknown op {unknown[0]!r} (choose from {', '.join(OPS)})"
            )
        checks = {
            "--sizes": (lo >= 1, "sizes start at 1 byte"),
            "--backend": (self.backend in ("auto", "gloo", "nccl"), "gloo, nccl or auto"),
            "--groups": (self.groups in ("tiers", "world"), "tiers or world"),
            "--bucket-mb": (all(b > 0 for b in self.bucket_mb), "caps must be positive"),
            "--warmup": (self.warmup >= 1, "at least 1"),
            "--repeats": (self.repeats >= 3, "at least 3 (a median and a spread)"),
            "--timeout": (self.timeout_s > 0, "must be positive"),
            "--width": (self.width >= 1, "at least 1"),
            "--depth": (self.depth >= 1, "at least 1"),
            "--batch": (self.batch >= 1, "at least 1"),
            "--comm-hooks": (
                bool(self.comm_hooks) and all(map(_valid_hook, self.comm_hooks)),
                "none, fp16, bf16 or powersgd:R (R an integer >= 1), comma-separated",
            ),
        }
        for flag, (ok, why) in checks.items():
            if not ok:
                raise SpecError(flag, "", why)
        if "bf16" in self.comm_hooks and not self._nccl():
            raise SpecError("--comm-hooks", "", "torch's bf16 hook needs CUDA and NCCL 2.10+")

    def _nccl(self) -> bool:
        """Whether the ranks will run NCCL; torch is imported only to ask (the launcher of
        `--local N` otherwise never imports it)."""
        if self.backend != "auto":
            return self.backend == "nccl"
        import torch

        return torch.cuda.is_available()

    def size_grid(self) -> list[int]:
        lo, hi = parse_size_range(self.sizes)
        return [int(lo * 2**k) for k in range(int(math.floor(math.log2(hi / lo) + 1e-9)) + 1)]
