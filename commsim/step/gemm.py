"""A GEMM's time on one GPU and the GPU's kernel rates: the roofline's GEMM class (its
output tiles over the SMs at its math rate, then its output), shared by step.compute's blocks,
tensor-parallel overlap (step.tpoverlap) and the rates a collective leaves (step.contention).

GEMM: 2 M N K FLOPs at the GPU's GEMM math rate (catalog: a measured best GEMM less its
output's write) over the fraction of the GPU its output tiles keep busy, then its output
through HBM. cuBLAS tiles the output in 256 x 128 blocks, one block per SM at a time
(NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, sec. 3): a
dimension that is not a multiple of its tile wastes the rest of the tile (tile
quantization), and ceil(tiles / SMs) waves run where tiles / SMs would do (wave
quantization).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsim.specs import GPUSpec

TILE_M, TILE_N = 256, 128  # cuBLAS's large output tile (NVIDIA GEMM guide, sec. 3.2)


@dataclass(frozen=True)
class Rates:
    """A GPU's kernel rates (FLOP/s, bytes/s) for the roofline."""

    gemm: float | np.ndarray  # BF16 GEMM math FLOP/s on every SM
    fp8: float | np.ndarray  # FP8 GEMM math FLOP/s on every SM (0: no FP8)
    attention: float | np.ndarray  # FlashAttention FLOP/s
    memory: float | np.ndarray  # HBM bytes/s that streaming kernels reach
    # HBM bytes/s a GEMM writes its output at: memory's, a field of its own so that a fit
    # can tell the GEMMs' writes from the element-wise work (traces.kernels)
    write: float | np.ndarray
    sms: int | np.ndarray  # SMs the kernels may use (fewer beside a collective: step.contention)

    @classmethod
    def of(cls, gpu: GPUSpec) -> Rates:
        """The rates of a catalog GPU; a ValueError naming what the catalog lacks."""
        missing = [
            f
            for f in ("sm_count", "gemm_efficiency", "attention_efficiency")
            if getattr(gpu, f) is None
        ]
        if missing:
            raise ValueError(
                f"GPU {gpu.name!r} has no measured {', '.join(missing)} for the compute "
                "roofline: set the scenario's compute_efficiency instead"
            )
        fp8 = (gpu.fp8_flops or 0.0) * (gpu.fp8_gemm_efficiency or 0.0)
        return cls(
            gemm=gpu.peak_flops * gpu.gemm_efficiency,
            fp8=fp8,
            attention=gpu.peak_flops * gpu.attention_efficiency,
            memory=gpu.stream_bandwidth,
            write=gpu.stream_bandwidth,
            sms=int(gpu.sm_count),
        )


def tile_utilisation(m, n, sms: int, concurrent=1.0) -> np.ndarray:
    """The share of the GPU a GEMM with an m x n output keeps doing useful work: its tiles'
    useful area over their area, times tiles over the SMs that whole waves occupy; with
    `concurrent` such GEMMs on the GPU at once (streams), their tiles fill the waves together."""
    m, n = np.maximum(np.asarray(m, dtype=float), 1.0), np.maximum(np.asarray(n, dtype=float), 1)
    tm, tn = np.ceil(m / TILE_M), np.ceil(n / TILE_N)
    tiles = tm * tn * concurrent
    waves = np.ceil(tiles / sms)
    return (m * n) / (tm * tn * TILE_M * TILE_N) * tiles / (waves * sms)


def gemm_seconds(m, n, k, rate, sms: int, count=1.0, concurrent=1.0, *, write) -> np.ndarray:
    """Seconds of `count` GEMMs of (m x k) by (k x n): their math at `rate` (FLOP/s on every
    SM: the catalog's gemm_efficiency) over the share of the GPU their tiles keep busy,
    `concurrent` of them at a time (tile_utilisation), then the m x n output through HBM,
    `write` seconds an element (its bytes over the streaming bandwidth; 0 where a GEMM
    writes nowhere the roofline counts). Derivation: each output tile is written by its
    epilogue after its K loop, so a GEMM moves its whole output once beside its math, not
    under it. OpenXLA's measured H100 GEMMs (xla/service/gpu/model/
    matmul_interpolator_data.h, sm_90, bf16, m = n = 4096) follow the sum as K shrinks: K
    4096, 2048, 1024, 512, 256 run at 783, 739, 677, 543, 392 TFLOP/s, the sum gives 793,
    745, 663, 545, 401 (tests/test_gemm_roofline.py)."""
    m, n = np.asarray(m, float), np.asarray(n, float)
    flops = 2.0 * m * n * np.asarray(k, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = count * (flops / (rate * tile_utilisation(m, n, sms, concurrent)) + m * n * write)
    return np.where(flops > 0, out, 0.0)
