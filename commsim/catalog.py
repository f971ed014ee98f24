"""Hardware facts (GPUs), each with its source, and where the built-in YAML files live."""

from __future__ import annotations

from pathlib import Path

from commsim.spec_io import load_spec
from commsim.specs import GPUSpec, SpecError

# compute_capability is CUDA's sm version (NVIDIA CUDA GPU list: V100 7.0, A100 8.0, H100 and
# H200 9.0, B200 10.0); NCCL's tuner picks its table rows by it (src/graph/tuning.cc).
# Peak figures are dense (no structured sparsity) BF16/FP16 tensor-core FLOP/s, HBM size
# and bandwidth, and NVLink bandwidth per direction (vendors quote the bidirectional sum).
# Kernel figures: gemm_efficiency is the share of peak a GEMM's math runs at: the Maximum
# Achievable Matmul FLOPS (MAMF, the best BF16 matmul over a sweep of large shapes) as
# measured in S. Bekman's "Machine Learning Engineering" (github.com/stas00/ml-engineering,
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", and its
# H200 -> B200 upgrade guide for H200/B200 and FP8), less that GEMM's output write
# (_math_share): each GPU's newest figure there, but for the H100's BF16, whose newest (794.5
# at 2048 x 2048 x 13312, torch 2.7.0) leaves a math rate that OpenXLA's measured H100 GEMMs
# exceed by ~8% (tests/test_gemm_roofline.py): its CUDA 12.1 figure, 792.1 at 6144 x 17920 x
# 2816. attention_efficiency is FlashAttention's forward + backward FLOP/s
# over peak on causal attention with 128-wide heads, as the stacks these GPUs train with run
# it: FlashAttention-2 reaches 50-73% of the A100's peak (Dao 2023, arXiv:2307.08691);
# on Hopper the same kernel reaches only 35% ("FlashAttention-2 achieves only 35%
# utilization on H100", Shah et al. 2024, arXiv:2407.08608), and FlashAttention-2 is what
# PyTorch's SDPA and most 2024 stacks run there (FlashAttention-3 reaches 75% forward but is
# a separate install). Blackwell has no published measurement in our sources: Hopper's
# figure is assumed. hbm_efficiency is what streaming kernels reach of the datasheet HBM
# bandwidth: BabelStream's Triad (two reads, a write; its best kernel that writes, as MAMF is
# the best matmul) on Azure's ND A100 v4 (A100-SXM4-80GB, 1.70 TB/s), ND H100 v5 (H100 80GB
# HBM3, 2.97 TB/s) and ND H200 v5 (4.15 TB/s) (github.com/Azure/AI-benchmarking-guide,
# Azure_Results/ND_*_results.md, "HBM Bandwidth"); no measurement of the 40 GB A100's HBM2
# or of the B200 in our sources: their datasheet figure stands.
# HBM_NVML: memory capacity as the driver reports it (NVML / nvidia-smi "Total"), not the
# datasheet's rounded "80 GB" (the stacks are 16 GiB each): H100 SXM 81,559 MiB, A100 80GB
# 81,920 MiB, A100 40GB 40,960 MiB, H200 143,771 MiB (Modal's measured table,
# thundergolfer.com/blog/nvidia-gpu-memory-capacity, 2024); what step.memory fills, less its
# reserve. GPUs not in that table keep their datasheet figure
_FA2_AMPERE = 0.6
_FA2_HOPPER = 0.35
_STREAM_SOURCE = "; HBM: BabelStream Triad {} TB/s of {} (Azure AI-benchmarking-guide, {})"


def _math_share(best: float, shape, out_bytes: int, stream: float, peak: float) -> float:
    """The share of peak a GEMM's math runs at: a measured best GEMM (MAMF, `best` TFLOP/s at
    its M x N x K `shape`, the table's "Best Shape") less the write of its output through HBM
    (`out_bytes` an element at the measuring GPU's BabelStream `stream` TB/s; mamf-finder
    writes its input dtype, 2 bytes BF16, 1 FP8), step.gemm.gemm_seconds solved for the rate:
    a GEMM is its math, then its output. The search found that shape because its kernel's
    tiles fill every SM, so no tile loss is taken out."""
    m, n, k = shape
    flops = 2.0 * m * n * k
    math = flops / (best * 1e12) - m * n * out_bytes / (stream * 1e12)
    return flops / math / (peak * 1e12)


_A100_MATH = _math_share(271.2, (1024, 10240, 5120), 2, 1.70, 312)  # both A100s' SMs
_GH100_MATH = _math_share(792.1, (6144, 17920, 2816), 2, 2.97, 989)  # H100's and H200's

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec(
            name="v100",
            peak_flops=125e12,
            hbm_bytes="32GB",
            hbm_bandwidth="900GB/s",
            nvlink_bandwidth="150GB/s",
            source="NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOPS tensor, 32 GB, "
            "900 GB/s, NVLink 300 GB/s bidirectional",
            compute_capability=7.0,
            nvlink_links=6,  # NVLink 2: 6 links x 25 GB/s per direction (V100 datasheet)
        ),
        GPUSpec(
            name="a100-40gb",
            peak_flops=312e12,
            hbm_bytes="40960MiB",  # NVML's total: see HBM_NVML
            hbm_bandwidth="1555GB/s",
            nvlink_bandwidth="300GB/s",
            source="NVIDIA A100 datasheet (SXM4 40GB): 312 TFLOPS BF16 dense, 1,555 GB/s, "
            "NVLink 600 GB/s bidirectional",
            sm_count=108,
            gemm_efficiency=_A100_MATH,
            attention_efficiency=_FA2_AMPERE,
            kernel_source="108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper); MAMF "
            "A100 SXM 271.2 of 312 TFLOPS (ml-engineering, torch 2.6.0)",
            compute_capability=8.0,
            nvlink_links=12,  # NVLink 3: 12 links x 25 GB/s per direction (A100 datasheet)
        ),
        GPUSpec(
            name="a100-80gb",
            peak_flops=312e12,
            hbm_bytes="81920MiB",  # NVML's total: see HBM_NVML
            hbm_bandwidth="2039GB/s",
            nvlink_bandwidth="300GB/s",
            source="NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOPS BF16 dense, 2,039 GB/s, "
            "NVLink 600 GB/s bidirectional",
            sm_count=108,
            gemm_efficiency=_A100_MATH,
            attention_efficiency=_FA2_AMPERE,
            hbm_efficiency=1.70 / 2.039,
            kernel_source="108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper); MAMF "
            "A100 SXM 271.2 of 312 TFLOPS (ml-engineering, torch 2.6.0)"
            + _STREAM_SOURCE.format(1.70, 2.039, "ND A100 v4"),
            compute_capability=8.0,
            nvlink_links=12,  # NVLink 3: 12 links (A100 datasheet)
        ),
        GPUSpec(
            name="h100",
            peak_flops=989e12,
            hbm_bytes="81559MiB",  # NVML's total: see HBM_NVML
            hbm_bandwidth="3350GB/s",
            nvlink_bandwidth="450GB/s",
            source="NVIDIA H100 datasheet (SXM5): 989 TFLOPS BF16 dense (1,979 with "
            "sparsity), 80 GB, 3.35 TB/s, NVLink 900 GB/s bidirectional; FP8 1,979 dense",
            sm_count=132,
            fp8_flops=1979e12,
            gemm_efficiency=_GH100_MATH,
            fp8_gemm_efficiency=_math_share(1402.6, (1024, 9216, 14336), 1, 2.97, 1979),
            attention_efficiency=_FA2_HOPPER,
            hbm_efficiency=2.97 / 3.35,
            kernel_source="132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper, SXM5); "
            "MAMF H100 SXM 792.1 of 989 TFLOPS BF16 (ml-engineering, CUDA 12.1) and 1,402.6 of "
            "1,979 FP8 (torch 2.7.0)" + _STREAM_SOURCE.format(2.97, 3.35, "ND H100 v5"),
            compute_capability=9.0,
            nvlink_links=18,  # NVLink 4: 18 links x 25 GB/s per direction (H100 datasheet)
        ),
        GPUSpec(
            name="h200",
            peak_flops=989e12,
            hbm_bytes="143771MiB",  # NVML's total: see HBM_NVML
            hbm_bandwidth="4800GB/s",
            nvlink_bandwidth="450GB/s",
            source="NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense, 141 GB, 4.8 TB/s, "
            "NVLink 900 GB/s bidirectional; FP8 1,979 dense",
            sm_count=132,
            fp8_flops=1979e12,
            gemm_efficiency=_GH100_MATH,  # the H100's die
            fp8_gemm_efficiency=_math_share(1453.4, (1280, 4096, 12032), 1, 4.15, 1979),
            attention_efficiency=_FA2_HOPPER,
            hbm_efficiency=4.15 / 4.8,
            kernel_source="132 SMs (GH100, as H100 SXM5); MAMF H100 SXM 792.1 of 989 TFLOPS "
            "BF16 (the table's H200 is the same die: 794.5 at 2048x2048x13312 implies a math "
            "rate 7% lower that OpenXLA's H100 GEMMs do not show) and H200 SXM 1,453.4 of 1,979 "
            "FP8 (ml-engineering)" + _STREAM_SOURCE.format(4.15, 4.8, "ND H200 v5"),
            compute_capability=9.0,
            nvlink_links=18,  # NVLink 4: 18 links (H200 datasheet)
        ),
        GPUSpec(
            name="b200",
            peak_flops=2250e12,
            hbm_bytes="180GB",
            hbm_bandwidth="7700GB/s",
            nvlink_bandwidth="900GB/s",
            source="NVIDIA DGX B200 datasheet: 72 PFLOPS FP8 training for 8 GPUs "
            "(4.5 PF FP8, 2.25 PF BF16 dense per GPU), 1,440 GB HBM3e, 64 TB/s; "
            "NVLink 5 1.8 TB/s bidirectional",
            sm_count=148,
            fp8_flops=4500e12,
            gemm_efficiency=_math_share(1745.0, (1792, 16128, 3072), 2, 7.7, 2250),
            fp8_gemm_efficiency=_math_share(3432.5, (15360, 4096, 3072), 1, 7.7, 4500),
            attention_efficiency=_FA2_HOPPER,
            kernel_source="148 SMs (NVIDIA Blackwell architecture technical brief, B200); MAMF "
            "B200 SXM 1,745.0 of 2,250 TFLOPS BF16 and 3,432.5 of 4,500 FP8 (ml-engineering)",
            compute_capability=10.0,
            nvlink_links=18,  # NVLink 5: 18 links x 50 GB/s per direction (DGX B200 datasheet)
        ),
        GPUSpec(
            name="cpu-host",
            peak_flops=100e9,
            hbm_bytes="16GB",
            hbm_bandwidth="20GB/s",
            nvlink_bandwidth="10GB/s",
            source="a stand-in for the CPU processes of the emulated testbed (commsim testbed): "
            "order-of-magnitude figures for 2 cores with AVX2 FP32 FMA and DDR4; calibration "
            "measures its compute instead of trusting these",
        ),
    )
}
GPUS["a100"] = GPUS["a100-80gb"]

_ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY_DIR = _ROOT / "topologies"
SCENARIO_DIR = _ROOT / "scenarios"
DEFAULT_SCENARIO = SCENARIO_DIR / "default.yaml"


def gpu(name: str, source: str = "", field: str = "gpu") -> GPUSpec:
    """Look a GPU up by name, or read one the catalog lacks from a YAML file of GPUSpec
    fields (a name ending in .yaml or .yml); an unknown name is a SpecError listing the
    known ones."""
    if Path(name).suffix in (".yaml", ".yml"):
        return load_spec(GPUSpec, name)
    try:
        return GPUS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(GPUS))
        raise SpecError(
            source or "catalog",
            field,
            f"unknown GPU {name!r} (known: {known}; or a YAML file of its figures)",
        ) from None


def topology_names() -> list[str]:
    """Names of the built-in cluster files in topologies/."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.yaml"))


def topology_path(name_or_path: str, source: str = "", field: str = "cluster") -> Path:
    """A built-in topology name or a path to a YAML file."""
    if not name_or_path.strip():
        raise SpecError(source or "(empty)", field, "empty: give a topology name or a YAML path")
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    candidate = TOPOLOGY_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = ", ".join(topology_names())
    raise SpecError(
        source or name_or_path, field, f"unknown topology {name_or_path!r} (known: {known})"
    )
