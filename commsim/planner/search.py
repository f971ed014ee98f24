"""Enumerate data x tensor x pipeline layouts of a transformer and price them all at once.

Every combination of tensor-parallel degree (inside a node unless pinned higher), pipeline
stages, expert-parallel degree (MoE models only), micro-batch size, ZeRO stage,
recomputation, interleaving, gradient bucket, algorithm, placement and overlap that the
model and batch allow becomes one entry of numpy arrays; commsim.step.parallel prices them in
one pass, memory drops what does not fit.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from commsim.scenario import Setup
from commsim.step.memory import RECOMPUTE
from commsim.step.parallel import (
    ALGORITHMS,
    NCCL_ALGORITHMS,
    HybridModel,
    Layouts,
    Shape,
    StepBreakdown,
    balanced_ends,
)
from commsim.topology.placement import PLACEMENT_KINDS
from commsim.workload.model import Workload

MICRO_BATCHES = (1, 2, 4, 8)
EXPERT_PARALLEL = (1, 2, 4, 8)  # searched where they divide the experts and dp
ZERO_STAGES = (0, 1, 2, 3)
INTERLEAVES = (1, 2, 4)
BUCKETS_MB = (25.0, 200.0)
SEARCHED_PLACEMENTS = ("blocked",)  # interleaved only ever loses; the DDP search shows it


@dataclass(frozen=True)
class SearchResult:
    """All layouts searched, their prices, and the fitting ones best first."""

    layouts: Layouts
    breakdown: StepBreakdown
    ranked: np.ndarray  # indices of fitting layouts, best first
    dropped: int  # layouts that do not fit in GPU memory

    @property
    def searched(self) -> int:
        return len(self.layouts)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(setup: Setup, pins: dict[str, Any] | None = None) -> Layouts:
    """Every valid layout of the setup's model on its GPUs; `pins` fixes dimensions
    (tp, pp, ep, zero, recompute, interleave, micro_batch, bucket_mb, algorithm, placement,
    overlap) to one value each."""
    pins = {k: v for k, v in (pins or {}).items() if v is not None}
    s, w, n = setup.scenario, setup.workload, setup.n_gpus
    blocks = sum(layer.name.startswith("block.") for layer in w.layers)
    gpn = setup.cluster.gpus_per_node
    tps = [pins["tp"]] if "tp" in pins else [t for t in (1, 2, 4, 8, 16) if t <= gpn]
    combos = []
    for tp in tps:
        if n % tp or w.heads % tp:
            continue
        pps = [pins["pp"]] if "pp" in pins else _divisors(n // tp)
        for pp in pps:
            if (n // tp) % pp or pp > blocks:
                continue
            splits = pipeline_splits(w, blocks, pp, pins)
            dp = n // (tp * pp)
            eps = [pins["ep"]] if "ep" in pins else EXPERT_PARALLEL if w.moe else (1,)
            for ep, b in itertools.product(
                [e for e in eps if e == 1 or (w.moe and w.experts % e == 0 and dp % e == 0)],
                [pins["micro_batch"]] if "micro_batch" in pins else MICRO_BATCHES,
            ):
                if s.global_batch % (dp * b):
                    continue
                m = s.global_batch // (dp * b)
                vs = [pins["interleave"]] if "interleave" in pins else INTERLEAVES
                for v, (first, last) in itertools.product(vs, splits):
                    # interleaving: pp > 1, and micro-batches in groups of pp (check_layout);
                    # an even split must divide, an uneven one runs without interleaving
                    even = first < 0 and last < 0
                    if (v > 1 and (pp == 1 or m < pp or not even)) or (even and blocks % (pp * v)):
                        continue
                    combos.append((dp, tp, pp, ep, b, m, v, first, last))
    grid = {
        "zero": [pins["zero"]] if "zero" in pins else ZERO_STAGES,
        "recompute": [RECOMPUTE.index(pins["recompute"])]
        if "recompute" in pins
        else range(len(RECOMPUTE)),
        "bucket_mb": [pins["bucket_mb"]] if "bucket_mb" in pins else BUCKETS_MB,
        "algorithm": [ALGORITHMS.index(pins["algorithm"])]
        if "algorithm" in pins
        else [ALGORITHMS.index(a) for a in NCCL_ALGORITHMS],  # hierarchical: the DDP search
        "placement": [PLACEMENT_KINDS.index(pins["placement"])]
        if "placement" in pins
        else [PLACEMENT_KINDS.index(p) for p in SEARCHED_PLACEMENTS],
        "overlap": [pins["overlap"]] if "overlap" in pins else (True, False),
    }
    rows = [c + g for c in combos for g in itertools.product(*grid.values())]
    names = ("dp", "tp", "pp", "ep", "micro_batch", "micro_batches", "interleave")
    names += ("first_layers", "last_layers", *grid)
    cols = np.array(rows, dtype=float).T if rows else np.zeros((len(names), 0))
    arrays = dict(zip(names, cols, strict=True))
    return Layouts(
        **{
            k: arrays[k].astype(bool if k == "overlap" else float if k == "bucket_mb" else int)
            for k in Layouts.__dataclass_fields__
        }
    )


def pipeline_splits(
    w: Workload, blocks: int, pp: int, pins: dict[str, Any]
) -> list[tuple[int, int]]:
    """(first, last) stage layer counts to try at pp stages, -1 for an even split: the pinned
    ones, else the even split where the layers divide and, for pp > 1, the uneven split that
    balances the embedding and head stages (parallel.balanced_ends) where it differs."""
    if "first_stage_layers" in pins or "last_stage_layers" in pins:
        return [(pins.get("first_stage_layers", -1), pins.get("last_stage_layers", -1))]
    out = [(-1, -1)] if blocks % pp == 0 else []
    if pp > 1:
        sh = Shape.of(w)
        first, last = balanced_ends(blocks, pp, sh.block_flops, sh.pre_flops, sh.post_flops)
        if not (blocks % pp == 0 and first == last == blocks // pp):
            out.append((first, last))
    return out


def search(setup: Setup, model: HybridModel, layouts: Layouts) -> SearchResult:
    """Price every layout, drop those that do not fit, rank the rest by step time."""
    b = model.evaluate(layouts)
    fitting = np.nonzero(b.fits & np.isfinite(b.step))[0]
    ranked = fitting[np.argsort(b.step[fitting], kind="stable")]
    return SearchResult(layouts, b, ranked, int((~b.fits).sum()))
