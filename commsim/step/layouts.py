"""Strategies as columns: one entry per layout, so the step model prices many in one pass.

Every strategy, plain DDP included, is a layout: the parallel degrees, micro-batching, ZeRO,
recomputation, the pipeline split, and how data-parallel gradients are synchronised
(buckets, overlap, algorithm, placement, compression). Names are stored as codes into the
tuples below (compression into the Layouts' own `compressions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, get_args

import numpy as np

from commsim.specs import (
    Algorithm,
    GradAccumulation,
    GradDtype,
    NormBackward,
    PipelineSchedule,
    RankOrder,
    Strategy,
    Zero3Issue,
)
from commsim.step.activations import RECOMPUTE, recompute_code, recompute_names
from commsim.step.buckets import first_bucket_mb
from commsim.step.eager import KERNELS
from commsim.topology.placement import PLACEMENTS

ALGORITHMS: tuple[str, ...] = get_args(Algorithm)  # auto, nccl, then the algorithms
GRAD_DTYPES: tuple[str, ...] = get_args(GradDtype)
RANK_ORDERS: tuple[str, ...] = get_args(RankOrder)
ZERO3_ISSUES: tuple[str, ...] = get_args(Zero3Issue)
GRAD_ACCUMULATIONS: tuple[str, ...] = get_args(GradAccumulation)
NORM_BACKWARDS: tuple[str, ...] = get_args(NormBackward)
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# Strategy.reshard_after_forward as a code: true, false, "all-but-last" (step.fsdp)
RESHARDS: tuple[bool | str, ...] = (True, False, "all-but-last")
_GRAD_BYTES = np.array([DTYPE_BYTES[d] for d in GRAD_DTYPES])
_DEFAULTS: dict[str, Any] = {
    "dp": 1,
    "tp": 1,
    "pp": 1,
    "ep": 1,
    "etp": 0,
    "micro_batch": 1,
    "micro_batches": 1,
    "zero": 0,
    "recompute": 0,
    "interleave": 1,
    "first_layers": -1,
    "last_layers": -1,
    "bucket_mb": 25.0,
    "first_bucket_mb": 1.0,
    "overlap": True,
    "gather_overlap": True,
    "algorithm": ALGORITHMS.index("ring"),
    "placement": 0,
    "ps_shards": 1,
    "compression": 0,
    "error_feedback": False,
    "grad_dtype": GRAD_DTYPES.index("fp32"),
    "cp": 1,
    "fp8": False,
    "flash": True,
    "sequence_parallel": True,
    "grad_accumulation": 0,
    "norm_backward": 0,
    "kernels": 0,
    "tp_overlap": False,
    "ep_overlap": False,
    "fsdp_shard": 0,
    "zero3_issue": 0,
    "order": 0,
    "fsdp_states": False,
    "moment_bytes": 4,
    "recompute_parts": 0,
    "fp8_param": False,
    "fp8_cache": False,
    "schedule": 0,
    "reshard": 0,
}


@dataclass(frozen=True)
class Layouts:
    """Candidate layouts as parallel arrays (one entry each); recompute, algorithm, placement
    and compression hold codes into RECOMPUTE, ALGORITHMS, PLACEMENTS and `compressions`."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray  # expert-parallel degree (ep x etp divides tp x cp x dp: MoE folding)
    etp: np.ndarray  # expert tensor-parallel degree (0: tp, Megatron-core's default)
    micro_batch: np.ndarray
    micro_batches: np.ndarray  # per step and data-parallel rank: global / (dp x micro_batch)
    zero: np.ndarray
    recompute: np.ndarray
    interleave: np.ndarray
    first_layers: np.ndarray  # layers on the first pipeline stage (-1: an even split)
    last_layers: np.ndarray  # layers on the last pipeline stage (-1: an even split)
    bucket_mb: np.ndarray
    first_bucket_mb: np.ndarray
    overlap: np.ndarray
    gather_overlap: np.ndarray  # ZeRO 1-2's parameter gathers under the next forward
    algorithm: np.ndarray
    placement: np.ndarray
    ps_shards: np.ndarray
    compression: np.ndarray
    error_feedback: np.ndarray
    grad_dtype: np.ndarray  # the gradients' dtype on the wire
    cp: np.ndarray  # context-parallel degree (the sequence split over cp ranks)
    fp8: np.ndarray  # the blocks' linear layers in FP8 (Transformer Engine)
    flash: np.ndarray  # FlashAttention (fused attention: no s x s scores kept)
    sequence_parallel: np.ndarray  # element-wise work split over tp (Strategy.sequence_parallel)
    grad_accumulation: np.ndarray  # code into GRAD_ACCUMULATIONS (Strategy.grad_accumulation)
    norm_backward: np.ndarray  # code into NORM_BACKWARDS (Strategy.norm_backward)
    kernels: np.ndarray  # code into KERNELS (Strategy.kernels)
    tp_overlap: np.ndarray  # tensor-parallel collectives overlapped with the GEMMs
    ep_overlap: np.ndarray  # expert all-to-alls under another micro-batch's compute
    fsdp_shard: np.ndarray  # ZeRO-3 shards over groups of this many dp ranks (0: all of dp)
    zero3_issue: np.ndarray  # code into ZERO3_ISSUES: how ZeRO-3 issues its collectives
    order: np.ndarray  # code into RANK_ORDERS
    fsdp_states: np.ndarray  # ZeRO-3 shards kept as PyTorch FSDP keeps them (Strategy.states)
    moment_bytes: np.ndarray  # bytes of an Adam moment (Strategy.optimizer_moments)
    recompute_parts: np.ndarray  # recompute_code of Strategy.recompute_modules
    fp8_param: np.ndarray  # FP8 primary weights (Strategy.fp8_param)
    fp8_cache: np.ndarray  # DeepSeek-V3's low-precision activation caching (Strategy.fp8_cache)
    schedule: np.ndarray  # code into PIPELINE_SCHEDULES (Strategy.pipeline_schedule)
    reshard: np.ndarray  # code into RESHARDS (Strategy.reshard_after_forward)
    compressions: tuple[str, ...] = field(default=("none",))

    def __len__(self) -> int:
        return len(self.dp)

    @classmethod
    def build(cls, compressions: tuple[str, ...] = ("none",), **columns: Any) -> Layouts:
        """Layouts from columns (arrays or scalars, broadcast together); the rest default to
        plain DDP's values."""
        names = _COLUMNS
        unknown = set(columns) - set(names)
        if unknown:
            raise TypeError(f"unknown layout columns {sorted(unknown)}")
        values = [np.asarray(columns.get(n, _DEFAULTS[n])) for n in names]
        arrays = np.broadcast_arrays(*(np.atleast_1d(v) for v in values))
        types = {"bucket_mb": float, "first_bucket_mb": float}
        flags = ("overlap", "error_feedback", "fp8", "flash", "tp_overlap", "ep_overlap")
        flags += ("fsdp_states", "gather_overlap", "sequence_parallel", "fp8_param")
        flags += ("fp8_cache",)
        types |= {k: bool for k in flags}
        cast = {n: a.astype(types.get(n, np.int64)) for n, a in zip(names, arrays, strict=True)}
        return cls(**cast, compressions=tuple(compressions))

    @classmethod
    def of(cls, strategies: list[Strategy], micro_batch: int, dp, micro_batches) -> Layouts:
        """Strategies as layouts; dp and micro_batches are functions of a strategy."""
        compressions = tuple(dict.fromkeys(["none", *(s.compression for s in strategies)]))

        def col(f):
            return [f(s) for s in strategies]

        return cls.build(
            compressions,
            dp=col(dp),
            tp=col(lambda s: s.tp),
            pp=col(lambda s: s.pp),
            ep=col(lambda s: s.ep),
            etp=col(lambda s: s.etp or 0),
            micro_batch=micro_batch,
            micro_batches=col(micro_batches),
            zero=col(lambda s: s.zero),
            recompute=col(lambda s: RECOMPUTE.index(s.recompute)),
            interleave=col(lambda s: s.interleave),
            first_layers=col(lambda s: s.split_layers[0]),
            last_layers=col(lambda s: s.split_layers[1]),
            bucket_mb=col(lambda s: s.bucket_mb),
            first_bucket_mb=col(lambda s: float(first_bucket_mb(s.bucket_mb, s.first_bucket_mb))),
            overlap=col(lambda s: s.overlap),
            gather_overlap=col(lambda s: s.overlap_param_gather),
            algorithm=col(lambda s: ALGORITHMS.index(s.algorithm)),
            placement=col(lambda s: PLACEMENTS.index(s.placement)),
            ps_shards=col(lambda s: s.ps_shards),
            compression=col(lambda s: compressions.index(s.compression)),
            error_feedback=col(lambda s: s.error_feedback),
            grad_dtype=col(lambda s: GRAD_DTYPES.index(s.grad_dtype)),
            cp=col(lambda s: s.cp),
            fp8=col(lambda s: s.precision == "fp8"),
            flash=col(lambda s: s.flash_attention),
            sequence_parallel=col(lambda s: s.sequence_parallel),
            grad_accumulation=col(lambda s: GRAD_ACCUMULATIONS.index(s.grad_accumulation)),
            norm_backward=col(lambda s: NORM_BACKWARDS.index(s.norm_backward)),
            kernels=col(lambda s: KERNELS.index(s.kernels)),
            tp_overlap=col(lambda s: s.tp_overlap),
            ep_overlap=col(lambda s: s.ep_overlap),
            fsdp_shard=col(lambda s: s.fsdp_shard or 0),
            zero3_issue=col(lambda s: ZERO3_ISSUES.index(s.zero3_issue)),
            order=col(lambda s: RANK_ORDERS.index(s.order)),
            fsdp_states=col(lambda s: s.states == "fsdp"),
            moment_bytes=col(lambda s: DTYPE_BYTES[s.optimizer_moments]),
            recompute_parts=col(lambda s: recompute_code(s.recompute_modules)),
            fp8_param=col(lambda s: s.fp8_param),
            fp8_cache=col(lambda s: s.fp8_cache),
            schedule=col(lambda s: PIPELINE_SCHEDULES.index(s.pipeline_schedule)),
            reshard=col(lambda s: reshard_code(s.reshard_after_forward)),
        )

    def take(self, index: np.ndarray) -> Layouts:
        """The layouts at `index`."""
        return replace(self, **{n: getattr(self, n)[index] for n in _COLUMNS})

    def row(self, i: int) -> dict[str, Any]:
        """Layout i as plain values, names for the coded fields."""
        out = {n: getattr(self, n)[i].item() for n in _COLUMNS}
        out["recompute"] = RECOMPUTE[out["recompute"]]
        out["algorithm"] = ALGORITHMS[out["algorithm"]]
        out["placement"] = PLACEMENTS[out["placement"]]
        out["compression"] = self.compressions[out["compression"]]
        out["grad_dtype"] = GRAD_DTYPES[out["grad_dtype"]]
        out["order"] = RANK_ORDERS[out["order"]]
        out["zero3_issue"] = ZERO3_ISSUES[out["zero3_issue"]]
        out["grad_accumulation"] = GRAD_ACCUMULATIONS[out["grad_accumulation"]]
        out["norm_backward"] = NORM_BACKWARDS[out["norm_backward"]]
        out["schedule"] = PIPELINE_SCHEDULES[out["schedule"]]
        out["kernels"] = KERNELS[out["kernels"]]
        out["reshard"] = RESHARDS[out["reshard"]]
        return out

    def strategy(self, i: int, base: Strategy) -> Strategy:
        """Layout i as a Strategy (fields a layout does not hold are base's)."""
        r = self.row(i)
        update = {k: r[k] for k in _STRATEGY_FIELDS}
        update |= {
            "first_stage_layers": r["first_layers"] if r["first_layers"] >= 0 else None,
            "last_stage_layers": r["last_layers"] if r["last_layers"] >= 0 else None,
            "precision": "fp8" if r["fp8"] else "bf16",
            "flash_attention": r["flash"],
            "fsdp_shard": r["fsdp_shard"] or None,
            "etp": r["etp"] or None,
            "states": "fsdp" if r["fsdp_states"] else "zero",
            "overlap_param_gather": r["gather_overlap"],
            "optimizer_moments": "bf16" if r["moment_bytes"] == 2 else "fp32",
            "recompute_modules": recompute_names(r["recompute_parts"]),
            "fp8_param": r["fp8_param"],
            "fp8_cache": r["fp8_cache"],
            "pipeline_schedule": r["schedule"],
            "reshard_after_forward": r["reshard"],
        }
        return base.model_copy(update=update)

    @property
    def grad_bytes(self) -> np.ndarray:
        """Bytes of a gradient element on the wire."""
        return _GRAD_BYTES[self.grad_dtype]

    @property
    def expert_tp(self) -> np.ndarray:
        """The expert layers' tensor-parallel degree (etp; tp where it is 0)."""
        return np.where(self.etp > 0, self.etp, self.tp)

    @property
    def edp(self) -> np.ndarray:
        """Expert data-parallel degree: the ranks holding the same experts, tp cp dp / (ep etp)."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    @property
    def plain(self) -> np.ndarray:
        """Plain data parallelism: no model parallelism, ZeRO or recomputation, whole-layer or
        of recompute_modules (what DDP runs; as Strategy.data_parallel_only)."""
        return (
            (self.tp == 1)
            & (self.pp == 1)
            & (self.ep == 1)
            & (self.expert_tp == 1)
            & (self.zero == 0)
            & (self.recompute == 0)
            & (self.recompute_parts == 0)
            & (self.interleave == 1)
            & (self.cp == 1)
        )


def reshard_code(value: bool | int | str) -> int:
    """Strategy.reshard_after_forward's code in RESHARDS (an int, a group to reshard to, has
    none: scenario.check_layout refuses it)."""
    if isinstance(value, bool) or value == "all-but-last":
        return RESHARDS.index(value)
    raise ValueError(f"reshard_after_forward {value!r}: true, false or all-but-last")


_STRATEGY_FIELDS = (
    "tp",
    "pp",
    "ep",
    "zero",
    "recompute",
    "interleave",
    "bucket_mb",
    "first_bucket_mb",
    "overlap",
    "algorithm",
    "placement",
    "ps_shards",
    "compression",
    "error_feedback",
    "grad_dtype",
    "cp",
    "tp_overlap",
    "ep_overlap",
    "zero3_issue",
    "order",
    "sequence_parallel",
    "grad_accumulation",
    "norm_backward",
    "kernels",
)


_COLUMNS = tuple(f.name for f in fields(Layouts) if f.name != "compressions")
