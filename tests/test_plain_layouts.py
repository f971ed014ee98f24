"""Plain DDP (Layouts.plain, Strategy.data_parallel_only) is the layout with no model
parallelism, ZeRO or recomputation of any kind: recompute_modules too, whose replays the
per-bucket DDP timeline does not lay out (and which plain torch DDP does not run)."""

from __future__ import annotations

import numpy as np
import pytest
from test_one_model import _setup

from commsim.scenario import check_layout
from commsim.specs import SpecError
from commsim.step.activations import recompute_code
from commsim.step.layouts import Layouts
from commsim.step.predict import layout_memory, predict


def test_recompute_modules_are_not_plain():
    L = Layouts.build(dp=8, recompute_parts=[0, recompute_code(["mlp"]), 0], recompute=[0, 0, 1])
    assert L.plain.tolist() == [True, False, False]


def test_the_strategy_and_its_layout_agree():
    setup = _setup("gpt2-xl", "aws-p4d", 64, 512)
    base = setup.scenario.strategy
    for update in ({}, {"recompute_modules": ("mlp",)}, {"recompute": "selective"}):
        s = base.model_copy(update=update)
        L = Layouts.of([s], 1, lambda _: 64, lambda _: 8)
        assert s.data_parallel_only == bool(L.plain[0]) == (update == {})


def test_a_dp_only_layout_with_recompute_modules_is_priced_as_megatrons():
    """gpt2-xl on 64 GPUs, fp32 gradients on the wire: with recompute_modules it is laid out
    stage by stage as a selective layout is (no DDP buckets drawn), its gradients kept in
    their dtype, 4 B a parameter, where plain DDP keeps torch.amp's 2 + 2 split."""
    setup = _setup("gpt2-xl", "aws-p4d", 64, 512)
    base = setup.scenario.strategy
    assert base.grad_dtype == "fp32"
    params = setup.workload.params
    plain = predict(setup, base)
    modules = base.model_copy(update={"recompute_modules": ("mlp",)})
    pred = predict(setup, modules)
    assert plain.buckets and not pred.buckets
    assert all(e.stream.startswith("stage 0") for e in pred.events)
    assert layout_memory(setup, base).grads == 2 * params
    np.testing.assert_allclose(layout_memory(setup, modules).grads, 4 * params)


def test_a_comm_hook_is_refused_beside_recompute_modules():
    """A DDP comm hook compresses plain DDP only: with recompute_modules it is refused."""
    setup = _setup("gpt2-xl", "aws-p4d", 64, 512)
    hooked = setup.scenario.strategy.model_copy(update={"compression": "fp16"})
    check_layout(setup, hooked)  # plain DDP: accepted
    with pytest.raises(SpecError, match="strategy.compression"):
        check_layout(setup, hooked.model_copy(update={"recompute_modules": ("mlp",)}))
