"""Enumerate every layout a model and batch allow and price them all at once.

Model-parallel shapes (tensor-parallel degree inside a node unless pinned higher, context
parallelism for long sequences, pipeline stages and their split, expert parallelism for MoE
models, micro-batch, interleaving, the rank order) times how the step is run: ZeRO stage
(and hybrid sharding over a node for ZeRO-3) and recomputation, and the data-parallel sync
(bucket, algorithm, placement, overlap, and for plain data parallelism a DDP comm hook's
compression), FP8 or BF16 GEMMs on GPUs with FP8, and tensor-parallel communication
overlapped with the GEMMs or not. FlashAttention is the user's stack (the base strategy's).
Plain data parallelism is searched in more detail (every bucket cap, algorithm, placement
and compressor), the way a DDP user tunes it; model-parallel layouts with NCCL's two
all-reduces and two bucket caps. Memory drops what does not fit before the step model
(step.model) prices the rest in one pass.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from commsim.collectives.algorithms import SEARCHED
from commsim.scenario import Setup, cp_split_problem
from commsim.specs import Strategy
from commsim.step.activations import RECOMPUTE, recompute_code
from commsim.step.buckets import first_bucket_mb
from commsim.step.dualpipe import applies as dualpipe_applies
from commsim.step.eager import KERNELS
from commsim.step.layouts import (
    ALGORITHMS,
    DTYPE_BYTES,
    GRAD_ACCUMULATIONS,
    GRAD_DTYPES,
    NORM_BACKWARDS,
    PIPELINE_SCHEDULES,
    RANK_ORDERS,
    RESHARDS,
    ZERO3_ISSUES,
    Layouts,
    reshard_code,
)
from commsim.step.model import StepBreakdown, StepModel
from commsim.step.shape import Shape, balanced_ends, split_problem
from commsim.topology.placement import PLACEMENTS, place

MICRO_BATCHES = (1, 2, 4, 8)
# expert-parallel degrees, searched where they divide the experts and, with the expert
# tensor-parallel degree, a stage's tp x cp x dp ranks (MoE parallel folding); etp is tp
# (Megatron-core's default) or 1 (the experts whole, ep spanning the tp ranks)
EXPERT_PARALLEL = (1, 2, 4, 8, 16, 32, 64)
ZERO_STAGES = (0, 1, 2, 3)
INTERLEAVES = (1, 2, 4)
CONTEXT_PARALLEL = (1, 2, 4, 8, 16, 32)
# a context-parallel rank's chunks (2 cp of them, load-balanced causal) keep at least this many
# tokens, so that their attention blocks stay large enough for FlashAttention's tiles
MIN_CP_CHUNK = 512
BUCKETS_MB = (25.0, 200.0)  # model-parallel layouts
DDP_BUCKETS_MB = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0)  # DDP bucket_cap_mb choices
NCCL_ALGORITHMS = ("ring", "tree")  # what NCCL picks between for all-reduce
# One of each kind: half precision, 8-bit, sparse (+ 8-bit values), low rank, 1-bit.
COMPRESSIONS = ("none", "fp16", "int8", "topk:0.01", "topk:0.05+int8", "powersgd:4", "sign")
LOSSLESS_ENOUGH = ("none", "fp16", "bf16")  # everything else is searched with error feedback
CHUNK = 50_000  # layouts priced per pass (bounds memory; a progress bar counts them)
BEST_FIRST_CHUNK = 2_000  # per pass when only the best is kept: the bound prunes between


@dataclass(frozen=True)
class SearchResult:
    """All layouts searched, the prices of those that fit, and those best first."""

    layouts: Layouts
    fitting: np.ndarray  # indices (into layouts) of the layouts that fit and were priced
    breakdown: StepBreakdown  # of layouts.take(fitting)
    ranked: np.ndarray  # indices into `fitting` of the runnable ones, best first
    memory: np.ndarray  # bytes per GPU of every layout
    fits: np.ndarray  # whether each layout fits in memory (all priced but with best_only)

    @property
    def searched(self) -> int:
        return len(self.layouts)

    @property
    def dropped(self) -> int:
        """Layouts that do not fit in GPU memory."""
        return self.searched - int(self.fits.sum())


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choices(pins: dict[str, Any], name: str, default) -> list:
    return [pins[name]] if name in pins else list(default)


def context_parallel_choices(seq_len: int) -> list[int]:
    """Context-parallel degrees worth trying for a sequence: those that split it
    (scenario.cp_split_problem) into 2 cp chunks of MIN_CP_CHUNK tokens or more."""
    return [
        c
        for c in CONTEXT_PARALLEL
        if not cp_split_problem(seq_len, c) and seq_len // (2 * c) >= MIN_CP_CHUNK
    ] or [1]


def expert_grids(setup: Setup, pins: dict[str, Any], tp: int, cp: int, dp: int) -> list:
    """(ep, etp) expert grids folded over a stage's tp x cp x dp ranks (etp 0: tp); none
    where a pinned ep or etp cannot apply (a dense model has no expert grid)."""
    w = setup.workload
    if not w.moe:
        return [(1, 0)] if pins.get("ep", 1) == 1 and "etp" not in pins else []
    eps = [e for e in _choices(pins, "ep", EXPERT_PARALLEL) if w.experts % e == 0]
    etps = _choices(pins, "etp", sorted({tp, 1}))
    return [
        (e, 0 if t == tp else t)
        for e, t in itertools.product(eps, etps)
        if (tp * cp * dp) % (e * t) == 0
    ]


def model_parallel_shapes(setup: Setup, pins: dict[str, Any]) -> list[tuple]:
    """(dp, tp, pp, ep, micro_batch, micro_batches, interleave, first, last, cp, etp) of
    every way the model and batch split over the GPUs; a model without blocks runs data-
    parallel only."""
    s, w, n = setup.scenario, setup.workload, setup.n_gpus
    blocks = Shape.of(w).blocks
    gpn = setup.cluster.gpus_per_node
    default_mb = sorted({*MICRO_BATCHES, s.micro_batch}) if blocks else [s.micro_batch]
    mbs = _choices(pins, "micro_batch", default_mb)
    tps = _choices(pins, "tp", [t for t in (1, 2, 4, 8, 16) if t <= gpn] if blocks else [1])
    cps = _choices(pins, "cp", context_parallel_choices(w.seq_len or 1) if blocks else [1])
    out = []
    for tp, cp in itertools.product(tps, cps):
        if n % (tp * cp) or (blocks and w.heads % tp):
            continue
        for pp in _choices(pins, "pp", _divisors(n // (tp * cp)) if blocks else [1]):
            if (n // (tp * cp)) % pp or (blocks and pp > blocks):
                continue
            splits = pipeline_splits(setup, blocks, pp, pins)
            dp = n // (tp * pp * cp)
            grids = expert_grids(setup, pins, tp, cp, dp)
            for (ep, etp), b in itertools.product(grids, mbs):
                if s.global_batch % (dp * b):
                    continue
                m = s.global_batch // (dp * b)
                vs = _choices(pins, "interleave", INTERLEAVES if blocks else (1,))
                for v, (first, last) in itertools.product(vs, splits):
                    # interleaving: pp > 1, and micro-batches in groups of pp (check_layout)
                    if (v > 1 and (pp == 1 or m < pp)) or (
                        blocks and split_problem(blocks, pp, v, first, last)
                    ):
                        continue
                    out.append((dp, tp, pp, ep, b, m, v, first, last, cp, etp))
    return out


def pipeline_splits(
    setup: Setup, blocks: int, pp: int, pins: dict[str, Any]
) -> list[tuple[int, int]]:
    """(first, last) stage layer counts to try at pp stages, -1 for an even split: the pinned
    ones, else the even split where the layers divide and, for pp > 1, the uneven split that
    balances the embedding and head stages (shape.balanced_ends) where it differs."""
    if "first_stage_layers" in pins or "last_stage_layers" in pins:
        return [(pins.get("first_stage_layers", -1), pins.get("last_stage_layers", -1))]
    out = [(-1, -1)] if pp == 1 or blocks % pp == 0 else []
    if pp > 1:
        sh = Shape.of(setup.workload)
        first, last = balanced_ends(blocks, pp, sh.block_flops, sh.pre_flops, sh.post_flops)
        if not (blocks % pp == 0 and first == last == blocks // pp):
            out.append((first, last))
    return out


def distinct_placements(setup: Setup) -> tuple[list[str], dict[str, str]]:
    """The placements that give different rank orders here, and the others: which one each
    repeats (on a freshly packed allocation topology-aware is blocked)."""
    orders: dict[str, np.ndarray] = {}
    same: dict[str, str] = {}
    for p in PLACEMENTS:
        order = place(setup.cluster, setup.n_gpus, p)
        twin = next((q for q, o in orders.items() if np.array_equal(o, order)), None)
        if twin:
            same[p] = twin
        else:
            orders[p] = order
    return list(orders), same


def sync_grids(setup: Setup, base: Strategy, pins: dict[str, Any]) -> tuple[list, list]:
    """(plain DDP rows, model-parallel rows) of sync choices: (zero, recompute, bucket,
    algorithm, placement, overlap, compression, error feedback)."""
    placements, _ = distinct_placements(setup)
    overlap = _choices(pins, "overlap", (True, False))
    ef = [pins["error_feedback"]] if "error_feedback" in pins else None
    plain = [
        (0, 0, b, a, p, o, c, e)
        for b, a, p, o, c in itertools.product(
            _choices(pins, "bucket_mb", DDP_BUCKETS_MB),
            _choices(pins, "algorithm", SEARCHED["all-reduce"]),
            _choices(pins, "placement", placements),
            overlap,
            _choices(pins, "compression", COMPRESSIONS),
        )
        for e in (ef or [c not in LOSSLESS_ENOUGH])
    ]
    model = []
    if "compression" not in pins or pins["compression"] == "none":
        model = [
            (z, r, b, a, p, o, "none", False)
            for z, r, b, a, p, o in itertools.product(
                _choices(pins, "zero", ZERO_STAGES),
                [RECOMPUTE.index(pins["recompute"])] if "recompute" in pins else range(3),
                _choices(pins, "bucket_mb", BUCKETS_MB),
                _choices(pins, "algorithm", NCCL_ALGORITHMS),
                _choices(pins, "placement", ("blocked",)),
                overlap,
            )
        ]
    return plain, model


def enumerate_layouts(
    setup: Setup, pins: dict[str, Any] | None = None, base: Strategy | None = None
) -> Layouts:
    """Every valid layout of the setup's model on its GPUs; `pins` fixes strategy fields
    (and micro_batch) to one value each; `base` gives the fields never searched
    (first bucket, PS shards, gradient dtype)."""
    pins = {k: v for k, v in (pins or {}).items() if v is not None}
    base = base or setup.scenario.strategy
    if "zero" in pins and pins["zero"] or "recompute" in pins and pins["recompute"] != "none":
        pins.setdefault("compression", "none")  # only plain data parallelism compresses
    plain_sync, model_sync = sync_grids(setup, base, pins)
    if not Shape.of(setup.workload).blocks:
        model_sync = []  # no transformer: plain data parallelism only (check_layout)
    plain_zero = pins.get("zero", 0) == 0 and pins.get("recompute", "none") == "none"
    first_algorithm = model_sync[0][3] if model_sync else None
    first_bucket = model_sync[0][2] if model_sync else None
    rows = []
    for shape in model_parallel_shapes(setup, pins):
        dp, tp, pp, ep, b, m, v, first, last, cp, etp = shape
        # recompute_modules is never plain DDP (Layouts.plain): the model grid prices it
        plain = tp == pp == ep == v == cp == 1 and etp == 0 and not base.recompute_modules
        for sync in model_sync:
            if plain and sync[0] == 0 and sync[1] == 0:
                continue  # plain DDP: the DDP grid below
            if tp == 1 and sync[0] > 0 and sync[3] != first_algorithm:
                continue  # no all-reduce left (ZeRO's are reduce-scatters): one algorithm
            if sync[0] == 3 and sync[2] != first_bucket:
                continue  # ZeRO-3 syncs per block (FSDP units), not in buckets: one cap
            rows.append(shape + sync)
        if plain and plain_zero:
            rows += [shape + sync for sync in plain_sync]
    names = ("dp", "tp", "pp", "ep", "micro_batch", "micro_batches", "interleave")
    names += ("first_layers", "last_layers", "cp", "etp", "zero", "recompute", "bucket_mb")
    names += ("algorithm", "placement", "overlap", "compression", "error_feedback")
    compressions = tuple(dict.fromkeys(["none", *(r[names.index("compression")] for r in rows)]))
    cols = {n: np.array([r[k] for r in rows]) for k, n in enumerate(names)}
    cols["algorithm"] = np.array([ALGORITHMS.index(a) for a in cols["algorithm"]], dtype=int)
    cols["placement"] = np.array([PLACEMENTS.index(p) for p in cols["placement"]], dtype=int)
    cols["compression"] = np.array([compressions.index(c) for c in cols["compression"]], dtype=int)
    cols = _with_rank_orders(cols, pins, setup.workload.moe)
    if base.zero3_issue == "unit":  # DeepSpeed's per-parameter ZeRO-3 had no hybrid sharding
        cols = _with_hybrid_sharding(cols, pins, setup.cluster.gpus_per_node)
    elif pins.get("fsdp_shard"):
        raise ValueError("fsdp_shard: zero3_issue 'parameter' (DeepSpeed's 2021 ZeRO-3) has none")
    fp8 = bool(setup.gpu.fp8_flops) and bool(Shape.of(setup.workload).blocks)
    cols = _with_kernels(cols, pins, fp8, base.sequence_parallel)
    cols = _with_schedules(cols, pins.get("pipeline_schedule"), base.pipeline_schedule)
    cols = _with_reshard(cols, pins, base)
    if not base.sequence_parallel and setup.workload.moe:  # MoE with tp > 1 needs SP
        cols = {k: v[cols["tp"] == 1] for k, v in cols.items()}
    return Layouts.build(
        compressions,
        **cols,
        first_bucket_mb=first_bucket_mb(cols["bucket_mb"], base.first_bucket_mb),
        ps_shards=base.ps_shards,
        grad_dtype=GRAD_DTYPES.index(base.grad_dtype),
        flash=base.flash_attention,
        sequence_parallel=base.sequence_parallel,
        grad_accumulation=GRAD_ACCUMULATIONS.index(base.grad_accumulation),  # the stack's
        norm_backward=NORM_BACKWARDS.index(base.norm_backward),  # the stack's
        kernels=KERNELS.index(base.kernels),  # the stack's
        fsdp_states=(base.states == "fsdp") & (cols["zero"] == 3),  # ZeRO-3's shards only
        ep_overlap=base.ep_overlap & (cols["ep"] > 1),  # where there are all-to-alls
        # the stack's, where there are ZeRO 1-2 gathers to place
        gather_overlap=base.overlap_param_gather | ~np.isin(cols["zero"], (1, 2)),
        zero3_issue=ZERO3_ISSUES.index(base.zero3_issue),  # the stack's, as its dtype
        # the stack's memory savers (Strategy.optimizer_moments, recompute_modules), the FP8
        # ones (fp8_param, fp8_cache) where the layout trains in FP8
        moment_bytes=DTYPE_BYTES[base.optimizer_moments],
        recompute_parts=recompute_code(base.recompute_modules),
        fp8_param=base.fp8_param & cols["fp8"],
        fp8_cache=base.fp8_cache & cols["fp8"],
    )


def _with_kernels(cols: dict[str, np.ndarray], pins: dict[str, Any], fp8: bool, sp: bool) -> dict:
    """FP8 GEMMs beside BF16 on a GPU with FP8 (`fp8`), and tensor-parallel collectives
    overlapped with the GEMMs beside not where tp > 1 and sequence parallelism (`sp`) runs;
    either as pinned."""
    if "precision" in pins:
        want = pins["precision"] == "fp8"
        if want and not fp8:  # no FP8 tensor cores: no layout takes the pin (it priced them)
            cols = {k: v[:0] for k, v in cols.items()}
        cols = cols | {"fp8": np.full(len(cols["dp"]), want)}
    else:
        cols = _branch(cols, "fp8", np.full(len(cols["dp"]), fp8), True, False)
    n = len(cols["dp"])
    if "tp_overlap" in pins and not pins["tp_overlap"]:
        return cols | {"tp_overlap": np.zeros(n, dtype=bool)}
    if "tp_overlap" in pins:  # where it applies only: tp 1 rows ran without it, pin dropped
        keep = (cols["tp"] > 1) & sp
        return {k: v[keep] for k, v in cols.items()} | {"tp_overlap": np.ones(keep.sum(), bool)}
    return _branch(cols, "tp_overlap", (cols["tp"] > 1) & sp, True, False)


def _with_schedules(cols: dict[str, np.ndarray], pinned: str | None, stack: str) -> dict:
    """1F1B, and DualPipe beside it where it applies (step.dualpipe) when the stack runs it
    (the base strategy's pipeline_schedule: Megatron-core has none); pinned, the one
    schedule, DualPipe on the layouts it applies to."""
    n = len(cols["dp"])
    where = dualpipe_applies(cols["pp"], cols["interleave"], cols["micro_batches"])
    if pinned == "dualpipe":
        return {k: v[where] for k, v in cols.items()} | {"schedule": np.ones(where.sum(), int)}
    if pinned or stack == "1f1b":
        return cols | {"schedule": np.zeros(n, dtype=int)}
    return _branch(cols, "schedule", where, PIPELINE_SCHEDULES.index("dualpipe"), 0)


def _branch(cols: dict[str, np.ndarray], name: str, where: np.ndarray, value, default):
    """The columns with `name` set to `default`, plus a copy of the rows `where` selects with
    `name` set to `value` (a second choice for those rows)."""
    n = len(next(iter(cols.values())))
    out = {k: np.concatenate([v, v[where]]) for k, v in cols.items()}
    out[name] = np.concatenate([np.full(n, default), np.full(int(where.sum()), value)])
    return out


def _with_reshard(cols: dict[str, np.ndarray], pins: dict[str, Any], base: Strategy) -> dict:
    """FSDP units' reshard_after_forward where it applies (zero 3 issued per unit, pp 1:
    scenario._check_reshard): the stack's (base's) and false beside it; elsewhere true. A
    pin other than true keeps the rows it applies to only."""
    n = len(cols["dp"])
    where = (cols["zero"] == 3) & (cols["pp"] == 1) & (base.zero3_issue == "unit")
    if "reshard_after_forward" in pins:
        code = reshard_code(pins["reshard_after_forward"])
        keep = where if code else np.ones(n, dtype=bool)
        return {k: v[keep] for k, v in cols.items()} | {"reshard": np.full(keep.sum(), code)}
    stack, never = reshard_code(base.reshard_after_forward), RESHARDS.index(False)
    out = _branch(cols, "reshard", where & (stack != never), never, 0)
    out["reshard"][:n] = np.where(where, stack, 0)
    return out


def _with_rank_orders(cols: dict[str, np.ndarray], pins: dict[str, Any], moe: bool) -> dict:
    """Both rank orders where they differ (pp > 1 and dp > 1) and Megatron-core allows the
    pipeline inside data parallelism (an expert grid of the attention grid's dp: ep x etp =
    tp x cp, scenario._check_experts), or the pinned one (enumerate_layouts drops the rows
    it does not allow)."""
    etp = np.where(cols["etp"] > 0, cols["etp"], cols["tp"])
    unfolded = (cols["ep"] * etp == cols["tp"] * cols["cp"]) | (not moe)
    if "order" in pins:
        out = cols | {"order": np.full(len(cols["dp"]), RANK_ORDERS.index(pins["order"]))}
        if pins["order"] == "tp-cp-ep-pp-dp":
            keep = unfolded | (cols["pp"] == 1)
            out = {k: v[keep] for k, v in out.items()}
        return out
    differs = (cols["pp"] > 1) & (cols["dp"] > 1) & unfolded
    return _branch(cols, "order", differs, RANK_ORDERS.index("tp-cp-ep-pp-dp"), 0)


def _shardable(cols: dict[str, np.ndarray], shard: Any) -> np.ndarray:
    """The layouts ZeRO-3 can hybrid-shard over `shard` data-parallel ranks, as
    scenario.check_layout allows it: zero 3, shard dividing dp, a shard group's tp x cp
    ranks holding whole expert grids (ep x etp)."""
    etp = np.where(cols["etp"] > 0, cols["etp"], cols["tp"])
    whole = (shard * cols["cp"] * cols["tp"]) % (cols["ep"] * etp) == 0
    return (cols["zero"] == 3) & (cols["dp"] % shard == 0) & whole


def _with_hybrid_sharding(cols: dict[str, np.ndarray], pins: dict[str, Any], gpn: int) -> dict:
    """ZeRO-3 sharded over all of dp, and hybrid-sharded over a node's data-parallel ranks
    where that is a proper divisor of dp (PyTorch's HYBRID_SHARD default: shard in the
    node, replicate across); or the pinned shard size."""
    if "fsdp_shard" in pins:  # the layouts it applies to only (a dp of 1 crashed the grid)
        keep = _shardable(cols, pins["fsdp_shard"])
        return {k: v[keep] for k, v in cols.items()} | {
            "fsdp_shard": np.full(int(keep.sum()), pins["fsdp_shard"])
        }
    node = np.maximum(gpn // (cols["tp"] * cols["cp"]), 1)
    hybrid = _shardable(cols, node) & (node > 1) & (node < cols["dp"])
    out = _branch(cols, "fsdp_shard", hybrid, 0, 0)
    out["fsdp_shard"][len(cols["dp"]) :] = node[hybrid]
    return out


def search(
    model: StepModel, layouts: Layouts, on_progress=None, best_only: bool = False
) -> SearchResult:
    """Drop the layouts that do not fit in GPU memory, price the rest (in chunks, calling
    on_progress(done, total) after each), rank the runnable ones by step time (a layout
    whose algorithm cannot run on its groups costs inf). With `best_only` (a planner that
    keeps the fastest alone) only the layouts that may beat the best are priced
    (_best_first): the fastest is the same, ties broken alike."""
    memory = model.memory(layouts)
    fits = memory <= model.usable
    fitting = np.nonzero(fits)[0]
    if best_only:
        fitting, breakdown = _best_first(model, layouts, fitting, on_progress)
    else:
        parts = []
        for lo in range(0, len(fitting), CHUNK):
            parts.append(model.evaluate(layouts.take(fitting[lo : lo + CHUNK])))
            if on_progress:
                on_progress(min(lo + CHUNK, len(fitting)), len(fitting))
        breakdown = StepBreakdown.concat(parts) if parts else model.evaluate(layouts.take(fitting))
    runnable = np.nonzero(np.isfinite(breakdown.step))[0]
    ranked = runnable[np.argsort(breakdown.step[runnable], kind="stable")]
    return SearchResult(layouts, fitting, breakdown, ranked, memory, fits)


def _best_first(
    model: StepModel, layouts: Layouts, fitting: np.ndarray, on_progress
) -> tuple[np.ndarray, StepBreakdown]:
    """Price the fitting layouts in order of a lower bound on their step (StepModel.
    step_bound: no network), BEST_FIRST_CHUNK at a time, leaving out every layout whose
    bound passes the fastest step priced so far: it can neither beat nor tie the fastest.
    Returns the priced ones (ascending, as `fitting`) and their breakdown."""
    bound = model.step_bound(layouts.take(fitting))
    order = np.argsort(bound, kind="stable")
    best, taken, parts = np.inf, [], []
    for lo in range(0, len(order), BEST_FIRST_CHUNK):
        chunk = order[lo : lo + BEST_FIRST_CHUNK]
        chunk = chunk[bound[chunk] <= best]
        if chunk.size == 0:
            break  # bounds ascend: every later layout's passes the best too
        part = model.evaluate(layouts.take(fitting[chunk]))
        best = min(best, float(part.step.min()))
        taken.append(chunk)
        parts.append(part)
        if on_progress:
            on_progress(min(lo + BEST_FIRST_CHUNK, len(order)), len(order))
    if not parts:
        return fitting, model.evaluate(layouts.take(fitting))
    priced = np.concatenate(taken)
    back = np.argsort(priced)
    both = StepBreakdown.concat(parts)
    return fitting[priced[back]], StepBreakdown(
        **{f.name: getattr(both, f.name)[back] for f in fields(both)}
    )
