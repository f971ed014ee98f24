"""FSDP1's gradient cast and pre-divide before each unit's reduce-scatter (llm-foundry's
Composer, torch 2.1): bytes by hand and by the dispatcher's count, and their price as HBM
traffic beside the backward (step.contention), only where compute is on the roofline."""

from __future__ import annotations

import numpy as np
import pytest
from aten_bytes import aten_bytes
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step import fsdp
from commsim.step.eager import KERNELS
from commsim.step.fsdp import fsdp1_pre_reduce_bytes
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.workload.presets import build_workload

FOUNDRY, MEGATRON = KERNELS.index("llm-foundry"), KERNELS.index("megatron")


def test_bytes_by_hand():
    """fp32 reduction: the cast reads bf16 2 and writes fp32 4, the divide reads and writes 4
    each: 14; a bf16 reduction has no cast, the divide 2 + 2: 4; no other stack pays."""
    assert fsdp1_pre_reduce_bytes(FOUNDRY, 4) == 2 + 4 + 4 + 4 == 14
    assert fsdp1_pre_reduce_bytes(FOUNDRY, 2) == 2 + 2
    for stack in ("megatron", "torchtitan", "torchtitan-compile"):
        assert fsdp1_pre_reduce_bytes(KERNELS.index(stack), 4) == 0


@pytest.mark.torch
def test_the_dispatcher_counts_the_same():
    """grad.to(fp32) then div_ by the pre-divide factor (4 on 8 ranks), as torch 2.1's
    _post_backward_hook and _div_if_needed run them, on a bf16 gradient."""
    import torch

    grad = torch.randn(4096, dtype=torch.bfloat16)
    assert aten_bytes(lambda: grad.to(torch.float32).div_(4)) / 4096 == 14


def _steps(efficiency, pre_reduce):
    # one NVSwitch node, 8 sequences a micro-batch: the units' collectives hide under the
    # blocks, whose speed then counts
    spec = ModelSpec(name="gpt", layers=4, hidden=4096, heads=32, vocab=50257, seq_len=2048)
    cluster = make_cluster(nodes=1, gpus_per_node=8, intra_bw="450GB/s", backend="nccl")
    model = StepModel(build_workload(spec), cluster, catalog.GPUS["h100"], 8, 256, efficiency)
    kernels = np.array([FOUNDRY, MEGATRON, FOUNDRY])
    L = Layouts.build(
        dp=8, zero=np.array([3, 3, 1]), micro_batch=8, micro_batches=4, kernels=kernels
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp, "fsdp1_pre_reduce_bytes", pre_reduce)
        return model.evaluate(L).step


def test_priced_beside_the_backward_on_the_roofline_only():
    """The llm-foundry ZeRO-3 layout is slower with the cast's bytes beside its backward;
    Megatron's ZeRO-3 and llm-foundry's ZeRO-1 layouts do not change, nor does anything where
    one measured efficiency prices compute (it holds whatever contention its runs had)."""
    none = lambda kernels, grad_bytes: np.zeros(np.shape(kernels))  # noqa: E731
    priced, without = _steps(None, fsdp1_pre_reduce_bytes), _steps(None, none)
    assert priced[0] > without[0]
    np.testing.assert_array_equal(priced[1:], without[1:])
    np.testing.assert_array_equal(_steps(0.5, fsdp1_pre_reduce_bytes), _steps(0.5, none))
