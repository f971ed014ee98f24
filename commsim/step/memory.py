"""Memory per GPU: model states (step.states) on each pipeline stage, activations under
tensor, sequence, context and pipeline parallelism and recomputation (step.activations per
layer, Korthikanti et al. 2022, times the layers and micro-batches a stage holds) and
communication buffers, added up on the fullest stage; one set of numpy formulas for one
layout (memory_per_gpu) and many at once (memory_per_gpu_batch).

Expert (MoE) parameters are split over ep x etp ranks (expert parallel x expert tensor
parallel, Megatron-core's MoE parallel folding, arXiv:2504.14960) and their ZeRO shards over
the expert-data-parallel ranks holding the same shard (DeepSpeed-MoE, Rajbhandari et al.
2022, arXiv:2201.05596, where etp = tp and ep comes out of dp).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import numpy as np

from commsim.step.activations import RECOMPUTE, activation_bytes_per_layer
from commsim.step.breakdown import MemoryBreakdown
from commsim.step.context import held_bytes
from commsim.step.dualpipe import in_flight as dualpipe_in_flight
from commsim.step.dualpipe import ranks as dualpipe_ranks
from commsim.step.inflight import in_flight
from commsim.step.memory_shape import MemoryShape, transformer_shape
from commsim.step.shape import expert_shards, stage_layers
from commsim.step.states import FP8_WEIGHT_COPY_BYTES, PARAM_BYTES, comm_buffers, zero_states
from commsim.step.torch_ring import held_bytes as torch_held_bytes
from commsim.workload.model import Workload

# Non-transformers: stored activation bytes per forward FLOP. From torchvision ResNet-50 at
# 224x224: its convolutions output 11,113,984 values per image; batch norm keeps each conv
# output and the next layer the ReLU output, 2 bytes each, so 4 bytes per conv output value =
# 44.46 MB per image over 8.178 GFLOP forward. Other models get the same ratio (a rough rule).
ACTIVATION_BYTES_PER_FLOP = 4 * 11_113_984 / 8_178_368_512


@dataclass(frozen=True)
class ParallelLayout:
    """How a model is laid out over GPUs, as memory sees it; independent of `specs.Strategy`
    (the caller maps a Strategy onto a layout)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert-parallel degree (ep x etp divides tp x cp x dp)
    etp: int = 0  # expert tensor-parallel degree (0: tp)
    micro_batch: int = 1
    seq_len: int | None = None  # None: the workload's
    zero: Literal[0, 1, 2, 3] = 0  # 3 is also FSDP full shard
    recompute: Literal["none", "selective", "full", "op"] = "none"
    sequence_parallel: bool = False
    interleave: int = 1  # virtual pipeline stages (model chunks) per pipeline rank
    micro_batches: int | None = None  # per step; None: at least enough to fill the pipeline
    grad_bytes: int = 2  # 4 when gradients are accumulated in fp32 (Megatron's main_grad)
    bucket_mb: float = 25.0  # gradient bucket (MiB), DDP bucket_cap_mb
    first_layers: int = -1  # layers on the first / last pipeline stage (-1: an even split)
    last_layers: int = -1
    cp: int = 1  # context-parallel degree: each GPU holds s / cp of every sequence
    flash: bool = True  # FlashAttention: no s x s attention scores kept
    shard: int = 0  # hybrid sharding (HSDP): ZeRO-3 groups of this many dp ranks (0: all)
    fsdp_states: bool = False  # ZeRO-3 shards kept as PyTorch FSDP keeps them (fp32 weights)
    residual_bytes: int = 0  # error feedback: its residual's bytes a parameter (0: none)
    fp8: bool = False  # Transformer Engine FP8 GEMMs: their saved inputs in FP8
    moment_bytes: int = 4  # bytes of each Adam moment (4: fp32; 2: bf16, DeepSeek-V3 3.3.3)
    recompute_parts: int = 0  # activations.recompute_code of RECOMPUTE_MODULES
    fp8_param: bool = False  # FP8 primary weights: no FP8 weight copy beside them
    fp8_cache: bool = False  # DeepSeek-V3's low-precision activation caching (activations)
    workspace: float = 0.0  # bytes outside the tensors: context, cuBLAS, NCCL (step.workspace)
    dualpipe: bool = False  # DeepSeek-V3's DualPipe: two stages a rank (dualpipe.ranks)
    reshard: int = 0  # code of layouts.RESHARDS: 1 keeps ZeRO-3 units gathered (_components)
    kv_gather: bool = False  # PyTorch's all-gather ring attention (step.torch_ring), cp > 1

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")


def _components(workload: Workload, c: dict[str, np.ndarray], schedule: str):
    """(params, grads, optimizer, activations, buffers) byte arrays on the worst stage."""
    shape = transformer_shape(workload)
    if shape is None:
        return _other_components(workload, c, schedule)
    t, pp, v, zero, ep = c["tp"], c["pp"], c["interleave"], c["zero"], c["ep"]
    # ZeRO shards over the data-parallel ranks and their context-parallel ones (Megatron's
    # distributed optimizer group); hybrid sharding over its groups of `shard` dp ranks
    dp = np.where((zero == 3) & (c["shard"] > 0), c["shard"], c["dp"]) * c["cp"]
    per_chunk = np.ceil(shape.blocks / (pp * v))  # layers per virtual stage, worst rank
    uneven = (c["first_layers"] >= 0) | (c["last_layers"] >= 0)  # only with v = 1
    k_first, k_mid, k_last = stage_layers(shape.blocks, pp, c["first_layers"], c["last_layers"])
    etp = np.where(c["etp"] > 0, c["etp"], t)
    experts = shape.expert / (etp * ep)  # one block's expert parameters on this GPU
    block = (shape.block[0] - shape.expert) / t + shape.block[1] + experts
    first = shape.first[0] / t + shape.first[1]
    last = shape.last[0] / t + shape.last[1] + np.where(pp > 1, shape.tied / t, 0.0)
    per_layer = _layer_activations(shape, c)
    output = _output_layer(shape, c, schedule)
    ring = _ring_buffers(shape, c)
    # FP8 weight copies of 16-bit primary weights; ZeRO-3 casts a unit's as it gathers it
    copy = np.where(c["fp8"] & ~c["fp8_param"] & (zero < 3), FP8_WEIGHT_COPY_BYTES, 0)
    stages = []
    dual = c["dualpipe"]
    dp = np.where(dual, 2, 1) * dp  # DualPipe: both copies' holders share a ZeRO shard
    # the first stage, the second (the most loaded middle one: most in flight), the last
    for rank, layers, extra, on_last, exists in dualpipe_ranks(
        dual,
        (0, k_first, first, pp == 1, True),
        (np.minimum(1, pp - 1), k_mid, 0.0, False, pp > 2),
        (pp - 1, k_last, last, True, True),
    ):
        held = np.where(exists, np.where(uneven | dual, layers, per_chunk * v), 0.0)
        ends = np.where(exists, np.where(pp == 1, first + last, extra), 0.0)
        params = held * block + ends
        expert = held * experts  # ZeRO shards these over the expert-data-parallel ranks
        kinds = (zero, c["grad_bytes"], c["fsdp_states"], c["moment_bytes"])
        dense = zero_states(params - expert, dp, *kinds)
        sparse = zero_states(expert, expert_shards(dp, t, ep, etp), *kinds)
        flight = in_flight(rank, pp, v, c["micro_batches"], schedule)
        acts = np.where(dual, dualpipe_in_flight(pp), flight) * held * per_layer
        acts = acts + np.where(on_last, output, 0.0)
        largest = np.maximum(block, np.where(pp == 1, np.maximum(first, last), extra))
        buffers = _stage_buffers(c, params, ends, block, largest) + ring
        weights, *rest = (d + x for d, x in zip(dense, sparse, strict=True))
        weights = weights + copy * held * (block - shape.block[1])  # the blocks' GEMMs
        stages.append((weights, *rest, acts, buffers))
    totals = np.stack([sum(stage) for stage in stages])
    worst = np.argmax(totals, axis=0)  # ties go to the first stage, as before
    return tuple(np.choose(worst, parts) for parts in zip(*stages, strict=True))


def _layer_activations(shape: MemoryShape, c: dict[str, np.ndarray]) -> np.ndarray:
    """Bytes a block keeps for its backward per micro-batch (step.activations) on the s / cp
    tokens a GPU holds, with the FP8 widths where the GEMMs run in FP8."""
    return np.where(
        c["fp8"],
        *(
            activation_bytes_per_layer(
                c["seq_len"] / c["cp"],
                c["micro_batch"],
                shape.hidden,
                shape.heads,
                c["tp"],
                c["sequence_parallel"],
                c["recompute"],
                c["flash"],
                widths,
                c["recompute_parts"],
                c["fp8_cache"],
            )
            for widths in (shape.widths_fp8, shape.widths)
        ),
    )


def _output_layer(shape: MemoryShape, c: dict[str, np.ndarray], schedule: str) -> np.ndarray:
    """Bytes the output layer keeps on the last stage, all micro-batches in flight there."""
    # norm output, logits and fp32 cross-entropy, 4sbh/t(1 + v/h) (Korthikanti Sec. 4.3), per
    # micro-batch its chunk holds: one under 1F1B, interleaved or not
    sbh = c["seq_len"] / c["cp"] * c["micro_batch"] * shape.hidden
    output = 4.0 * sbh / c["tp"] * (1.0 + shape.vocab / shape.hidden)
    return output * in_flight(c["pp"] - 1, c["pp"], 1, c["micro_batches"], schedule)


def _stage_buffers(c: dict[str, np.ndarray], params, ends, block, largest) -> np.ndarray:
    """A stage's communication buffers (states.comm_buffers, `largest` its largest layer)
    and the ZeRO-3 units its reshard policy keeps gathered beside them."""
    zero = c["zero"]
    buffers = comm_buffers(
        zero, c["bucket_mb"], c["grad_bytes"], largest, params, c["residual_bytes"], c["workspace"]
    )
    # reshard_after_forward false (pp 1, scenario): every unit and the root's end layers
    # held gathered from the forward to the backward, two of them the buffers' own
    kept = np.maximum(params - 2 * largest, 0.0) * PARAM_BYTES
    buffers = buffers + np.where((zero == 3) & (c["reshard"] == 1), kept, 0.0)
    # PyTorch's FSDP never reshards the root (the end layers) after the forward
    # (step.fsdp.backward_gathers): held beside the two units computing and prefetching
    root = np.maximum(ends + 2 * block - 2 * largest, 0.0) * PARAM_BYTES
    return buffers + np.where((zero == 3) & c["fsdp_states"] & (c["reshard"] != 1), root, 0)


def _ring_buffers(shape: MemoryShape, c: dict[str, np.ndarray]) -> np.ndarray:
    """Bytes context parallelism's ring attention holds for one layer at its peak beyond the
    layer's activations (one layer's at a time): PyTorch's (kv_gather, step.torch_ring) or
    Transformer Engine's (step.context), per element of this rank's tokens x heads / tp."""
    tokens = c["micro_batch"] * (c["seq_len"] / c["cp"]) / c["tp"]
    queries = tokens * shape.queries
    te = held_bytes(c["cp"], queries, tokens * shape.keys, tokens * shape.heads)
    return np.where(c["kv_gather"], torch_held_bytes(c["cp"], queries), te)


def _other_components(workload: Workload, c: dict[str, np.ndarray], schedule: str):
    """Non-transformers: activations ACTIVATION_BYTES_PER_FLOP x forward FLOPs, a rough rule."""
    # pp stages of equal layer count, parameters and FLOPs each from its worst stage (an upper
    # bound); tp splits everything evenly (an idealisation); recompute and SP not modelled.
    pp, t = c["pp"], c["tp"]
    params = np.zeros(pp.shape)
    flops = np.zeros(pp.shape)
    for p in np.unique(pp):  # a handful of pipeline depths, not one pass per candidate
        stages = np.array_split(np.arange(len(workload.layers)), int(p))
        params[pp == p] = max(workload.layer_params[s].sum() for s in stages)
        flops[pp == p] = max(workload.layer_flops[s].sum() for s in stages)
    per_pass = ACTIVATION_BYTES_PER_FLOP * flops * c["micro_batch"] / t
    acts = in_flight(0, pp, c["interleave"], c["micro_batches"], schedule) * per_pass
    largest = workload.layer_params.max() / t
    return (
        *zero_states(
            params / t, c["dp"], c["zero"], c["grad_bytes"], c["fsdp_states"], c["moment_bytes"]
        ),
        acts,
        comm_buffers(
            *(c["zero"], c["bucket_mb"], c["grad_bytes"], largest, params / t, c["residual_bytes"]),
            c["workspace"],
        ),
    )


def _check(c: dict[str, np.ndarray]) -> None:
    keys = ("dp", "tp", "pp", "ep", "cp", "micro_batch", "interleave", "seq_len", "micro_batches")
    for key in keys:
        if np.any(c[key] < 1):
            raise ValueError(f"{key} must be at least 1")
    etp = np.where(c["etp"] > 0, c["etp"], c["tp"])
    if np.any((c["tp"] * c["cp"] * c["dp"]) % (c["ep"] * etp)):
        raise ValueError("ep x etp must divide tp x cp x dp")
    if np.any((c["moment_bytes"] != 2) & (c["moment_bytes"] != 4)):
        raise ValueError("moment_bytes must be 2 (bf16) or 4 (fp32)")
    if np.any((c["zero"] < 0) | (c["zero"] > 3)):
        raise ValueError("zero must be 0, 1, 2 or 3")
    if np.any((c["recompute"] < 0) | (c["recompute"] >= len(RECOMPUTE))):
        raise ValueError(f"recompute codes are 0-{len(RECOMPUTE) - 1} for {RECOMPUTE}")


def _inputs(workload: Workload, **columns) -> dict[str, np.ndarray]:
    """Broadcast the layout columns to one shape; defaults for seq_len and micro_batches."""
    if columns["seq_len"] is None:
        columns["seq_len"] = workload.seq_len or 1
    if columns["micro_batches"] is None:
        columns["micro_batches"] = np.inf
    keys = list(columns)
    arrays = np.broadcast_arrays(*(np.asarray(columns[k]) for k in keys))
    c = dict(zip(keys, arrays, strict=True))
    _check(c)
    return c


def memory_per_gpu_batch(
    workload: Workload,
    dp,
    tp,
    pp,
    micro_batch,
    zero,
    recompute,
    sequence_parallel,
    interleave=1,
    *,
    seq_len=None,
    micro_batches=None,
    grad_bytes=2,
    bucket_mb=25.0,
    ep=1,
    etp=0,
    first_layers=-1,
    last_layers=-1,
    cp=1,
    flash=True,
    shard=0,
    residual_bytes=0,
    fsdp_states=False,
    fp8=False,
    moment_bytes=4,
    recompute_parts=0,
    fp8_param=False,
    fp8_cache=False,
    workspace=0.0,
    dualpipe=False,
    reshard=0,
    kv_gather=False,
    schedule: str = "1f1b",
) -> np.ndarray:
    """Total bytes per GPU for many layouts at once (arrays broadcast; recompute as codes of
    RECOMPUTE); the same formulas as `memory_per_gpu`, the arguments its layout's fields."""
    columns = dict(locals())  # the arguments, named as ParallelLayout's fields (a test holds it)
    del columns["workload"], columns["schedule"]
    return sum(_components(workload, _inputs(workload, **columns), schedule))


def memory_per_gpu(
    workload: Workload,
    layout: ParallelLayout,
    *,
    schedule: Literal["1f1b", "gpipe"] = "1f1b",
) -> MemoryBreakdown:
    """Bytes per GPU on the worst pipeline stage (the first, the second or the last: with an
    even split the first holds the most of the middle ones), by kind."""
    columns = {f.name: getattr(layout, f.name) for f in fields(ParallelLayout)}
    columns["recompute"] = RECOMPUTE.index(layout.recompute)
    parts = (float(x) for x in _components(workload, _inputs(workload, **columns), schedule))
    return MemoryBreakdown(*parts, workspace=layout.workspace)
