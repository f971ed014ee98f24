"""stage_times prices each distinct row of the columns it reads once (step.distinct) and
broadcasts it back: the same bits as pricing every layout alone, on random layouts and rates."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step import distinct
from commsim.step.activations import RECOMPUTE, RECOMPUTE_MODULES
from commsim.step.compute import stage_times
from commsim.step.contention import contended_rates
from commsim.step.distinct import distinct_rows
from commsim.step.eager import KERNELS
from commsim.step.gemm import Rates
from commsim.step.layouts import GRAD_ACCUMULATIONS, NORM_BACKWARDS, RESHARDS, Layouts
from commsim.workload.presets import build_workload

H100 = catalog.GPUS["h100"]
GPT = ModelSpec(name="toy", layers=4, hidden=512, heads=8, vocab=1000, seq_len=256)
POOLS = {  # values of every column stage_times reads, and of two it does not (dp, pp)
    "micro_batch": [1, 2, 4],
    "micro_batches": [1, 3, 8],
    "tp": [1, 2, 4, 8],
    "cp": [1, 2],
    "ep": [1, 2, 8],
    "etp": [0, 1, 2],
    "fp8": [False, True],
    "flash": [False, True],
    "kernels": range(len(KERNELS)),
    "zero": range(4),
    "reshard": range(len(RESHARDS)),
    "recompute": range(len(RECOMPUTE)),
    "recompute_parts": range(2 ** len(RECOMPUTE_MODULES)),
    "sequence_parallel": [False, True],
    "norm_backward": range(len(NORM_BACKWARDS)),
    "grad_accumulation": range(len(GRAD_ACCUMULATIONS)),
    "dp": [1, 2, 4],
    "pp": [1, 2],
}


def _layouts(rng, n=240, kinds=40) -> tuple[Layouts, np.ndarray]:
    """n layouts drawn from `kinds` random ones (so rows repeat), dp and pp drawn per row;
    and each row's kind."""
    protos = {k: rng.choice(list(v), kinds) for k, v in POOLS.items()}
    pick = rng.integers(0, kinds, n)
    cols = {k: v[pick] for k, v in protos.items()}
    cols["dp"], cols["pp"] = rng.choice(POOLS["dp"], n), rng.choice(POOLS["pp"], n)
    return Layouts.build(**cols), pick


def _row_by_row(workload, L, rates):
    """Every layout priced alone (each its own group), at its own rates."""
    per_row = [f.name for f in fields(rates) if np.ndim(getattr(rates, f.name))]
    rows = []
    for i in range(len(L)):
        own = replace(rates, **{k: getattr(rates, k)[[i]] for k in per_row})
        rows.append(stage_times(workload, H100, L.take([i]), own))
    return {f.name: np.concatenate([getattr(r, f.name) for r in rows]) for f in fields(rows[0])}


def _same_bits(grouped, alone):
    for name, column in alone.items():
        assert getattr(grouped, name).tobytes() == column.tobytes(), name


@pytest.mark.parametrize("model", [GPT, "deepseek-v3", "resnet50"])
@pytest.mark.parametrize("contended", [False, True])
def test_grouped_equals_row_by_row(model, contended):
    """Random layouts at the GPU's rates, or beside collectives holding random SMs and HBM
    bandwidth per row (step.contention): bit for bit the prices of each layout alone."""
    rng = np.random.default_rng(7)
    workload = build_workload(model, 1024) if isinstance(model, str) else build_workload(model)
    L, _ = _layouts(rng)
    rates = Rates.of(H100)
    if contended:  # a few rates per row, independent of the layout: alike layouts split
        sms, hbm = rng.choice([0, 24], len(L)), rng.choice([0.0, 6e11, 3e12], len(L))
        rates = contended_rates(rates, sms, hbm)
    groups = distinct_rows([getattr(L, n) for n in POOLS if n not in ("dp", "pp")], len(L))
    assert len(groups[1]) < len(L) / 2  # the rows do repeat: grouping is exercised
    _same_bits(stage_times(workload, H100, L, rates), _row_by_row(workload, L, rates))


def test_a_hash_collision_prices_row_by_row(monkeypatch):
    """Every row hashed alike: distinct_rows sees the rows differ and says so (None), and
    stage_times prices every row itself, to the same bits."""
    rng = np.random.default_rng(3)
    workload = build_workload(GPT)
    L, _ = _layouts(rng, n=60)
    grouped = stage_times(workload, H100, L)
    monkeypatch.setattr(distinct, "row_hash", lambda words: np.zeros(len(words[0]), np.uint64))
    assert distinct_rows([L.tp, L.cp], len(L)) is None
    colliding = stage_times(workload, H100, L)
    _same_bits(colliding, {f.name: getattr(grouped, f.name) for f in fields(grouped)})


def test_distinct_rows_by_hand():
    """Rows (1, 0.5), (2, 0.5), (1, 0.5), (1, -0.0), (1, 0.0): four groups, the first and
    third rows together, -0.0 apart from 0.0 (different bits: 1 / x differs); a scalar
    column splits nothing."""
    tp = np.array([1, 2, 1, 1, 1])
    rate = np.array([0.5, 0.5, 0.5, -0.0, 0.0])
    inverse, first = distinct_rows([tp, rate, 7.0], 5)
    assert len(first) == 4
    assert inverse[0] == inverse[2]
    assert len({inverse[0], inverse[1], inverse[3], inverse[4]}) == 4
    assert (tp[first][inverse] == tp).all() and (rate[first][inverse] == rate).all()
    inverse, first = distinct_rows([3, 7.0], 4)  # scalars alone: one group
    assert inverse.tolist() == [0, 0, 0, 0] and first.tolist() == [0]
    inverse, first = distinct_rows([np.array([], dtype=int)], 0)  # no rows: no groups
    assert inverse.size == 0 and first.size == 0
