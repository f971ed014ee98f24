"""Buffers a step keeps besides model states: an error-feedback residual (counted by predict
and by the vectorised search alike) and gradient buckets that never exceed the gradient."""

from __future__ import annotations

import pytest

from commsim.planner.plan import plan
from commsim.scenario import load_scenario, resolve
from commsim.step.predict import predict


def _setup(**overrides):
    spec, source = load_scenario(None, overrides)
    return resolve(spec, source)


def _memory(**overrides) -> dict:
    return predict(_setup(**overrides)).to_dict()["memory"]


def test_error_feedback_keeps_a_gradient_sized_residual():
    """By hand: GPT-2 XL's 1,557,611,200 parameters x 4 B (the fp32 bucket dtype) = 6.23 GB
    more than the same compressor without error feedback."""
    setup = _setup(compression="topk:0.01")
    plain = _memory(compression="topk:0.01")
    ef = _memory(compression="topk:0.01", error_feedback=True)
    assert setup.workload.params == 1_557_611_200
    assert ef["buffers_bytes"] - plain["buffers_bytes"] == pytest.approx(4 * 1_557_611_200)
    assert ef["total_bytes"] - plain["total_bytes"] == pytest.approx(6.2304448e9)
    # lossless: nothing dropped, nothing kept
    assert _memory(error_feedback=True) == _memory()


def _plan(micro_batch: int, error_feedback: bool):
    setup = _setup(micro_batch=micro_batch, compression="powersgd:4", error_feedback=error_feedback)
    pins = {"compression", "error_feedback", "micro_batch"}
    return setup, plan(setup, setup.scenario.strategy, pins)


def test_the_search_counts_the_residual_as_predict_does():
    """The vectorised memory of every error-feedback layout the search ranks equals the
    scalar model's; at micro-batch 4 PowerSGD fits on 40 GB A100s (40,960 MiB) without error
    feedback and not with it (its 6.2 GB residual)."""
    setup, found = _plan(1, True)
    assert found.ranked
    for p in found.ranked[:5]:
        assert p.strategy.error_feedback
        assert p.memory.total == pytest.approx(predict(setup, p.strategy).memory.total)
        assert p.fits
    assert _plan(4, False)[1].ranked
    assert _plan(4, True)[1].ranked == []


def test_a_bucket_never_holds_more_than_the_gradient():
    """Two buckets of 20,000 MiB for a 3.1 GB gradient (2 B a parameter in the memory
    model's split) cost the gradient, not 2 x 20,000 MiB."""
    small, huge = _memory(bucket_mb=25), _memory(bucket_mb=20000)
    assert huge["buffers_bytes"] - small["buffers_bytes"] == pytest.approx(
        2 * 1_557_611_200 - 2 * 25 * 2**20
    )
    assert huge["fits"]
