"""The element-wise inventory of a block (step.compute._Block._elementwise) against a
hand-written count of its HBM traffic, and with a feature removed against the difference it
must make."""

from __future__ import annotations

import pytest

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step.compute import ACT, MASK, stage_times
from commsim.step.layouts import Layouts
from commsim.workload.presets import build_workload

GPT = ModelSpec(name="toy", layers=4, hidden=512, heads=8, vocab=1000, seq_len=256)
A100 = catalog.GPUS["a100-80gb"]


def _block_fwd(model: ModelSpec, tp=2, sp=True):
    L = Layouts.build(tp=tp, micro_batch=1, sequence_parallel=sp)
    return float(stage_times(build_workload(model), A100, L).block_fwd[0])


@pytest.mark.parametrize("sp", [True, False])
def test_dropout_masks_by_hand(sp):
    """GPT-style blocks train with dropout (Megatron --hidden-dropout 0.1): each of the two
    fused bias-dropout-adds writes a 1-byte mask of h per token it holds; 256 tokens over
    tp = 2 with SP (128 held), all 256 without: 2 x 512 x 1 x held bytes more."""
    held = 128 if sp else 256
    extra = 2 * 512 * MASK * held / A100.hbm_bandwidth
    with_dropout = _block_fwd(GPT, sp=sp)
    without = _block_fwd(GPT.model_copy(update={"dropout": False}), sp=sp)
    assert with_dropout - without == pytest.approx(extra, rel=1e-9)


def test_the_masks_are_a_fixed_share_of_the_held_work():
    """Independently of the split: the mask bytes over the rest of the held work (norms
    2 x 2 h and residual adds 2 x 3 h of ACT bytes) is 2 MASK / (10 ACT), whatever tp or
    SP; the rest of the block (GEMMs, attention, the MLP activation) does not see it."""
    share = 2 * MASK / (10 * ACT)
    for tp, sp in ((2, True), (4, True), (4, False)):
        held_with = _block_fwd(GPT, tp, sp) - _block_fwd(GPT, tp, not sp)
        nodrop = GPT.model_copy(update={"dropout": False})
        held_without = _block_fwd(nodrop, tp, sp) - _block_fwd(nodrop, tp, not sp)
        assert held_with / held_without == pytest.approx(1 + share, rel=1e-9)
