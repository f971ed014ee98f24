"""FSDP1's gradient cast and pre-divide before each unit's reduce-scatter (llm-foundry's
Composer, torch 2.1) and FSDP2's copies into and out of it (torchtitan, torch of Dec 2024):
bytes by hand and by the dispatcher's count, and their price as HBM traffic beside the
backward (step.contention), only where compute is on the roofline."""

from __future__ import annotations

import numpy as np
import pytest
from aten_bytes import aten_bytes
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step import fsdp
from commsim.step.eager import KERNELS
from commsim.step.fsdp import fsdp1_pre_reduce_bytes, fsdp2_reduce_bytes
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.workload.presets import build_workload

FOUNDRY, MEGATRON = KERNELS.index("llm-foundry"), KERNELS.index("megatron")
TITAN, COMPILED = KERNELS.index("torchtitan"), KERNELS.index("torchtitan-compile")


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


def test_fsdp2_bytes_by_hand():
    """fp32 reduction of bf16 gradients on 8 ranks: the copy-in reads 2 and writes 4, nothing
    on the shard on one micro-batch: 6; over 4 micro-batches three of them add the shard to
    the fp32 gradient (12 bytes on 1/8): 6 + 12 x 3/4 / 8; a bf16 reduction copies 2 + 2 and
    casts the shard to fp32 (2 + 4 on 1/8) every micro-batch; no other stack pays."""
    for stack in (TITAN, COMPILED):
        assert fsdp2_reduce_bytes(stack, 4, 8, 1) == 6
        assert fsdp2_reduce_bytes(stack, 4, 8, 4) == 6 + 12 * 3 / 4 / 8
        assert fsdp2_reduce_bytes(stack, 2, 8, 1) == 2 + 2 + (2 + 4) / 8
    for stack in (FOUNDRY, MEGATRON):
        assert fsdp2_reduce_bytes(stack, 4, 8, 4) == 0


@pytest.mark.torch
@pytest.mark.parametrize("reduce_bytes", [4, 2])
def test_fsdp2_dispatcher_counts_the_same(reduce_bytes):
    """foreach_reduce's ops on 8 ranks over 4 micro-batches, as torch of Dec 2024 runs them
    on a unit of bf16 gradients: torch._chunk_cat into the reduce dtype's buffer, the shard
    (the reduce-scatter's output; NCCL's own traffic counted apart) cast to fp32 where it
    differs, set as the gradient on the first micro-batch and added to it on the others."""
    import torch

    n, m = 8, 4
    dtype = {4: torch.float32, 2: torch.bfloat16}[reduce_bytes]
    grads = [torch.randn(256, 64, dtype=torch.bfloat16), torch.randn(512, dtype=torch.bfloat16)]
    numel = sum(g.numel() for g in grads)
    buffer = torch.empty(n, numel // n, dtype=dtype)
    # the reduce-scatter's outputs, a new 1/n buffer each micro-batch
    shards = [torch.randn(numel // n).to(dtype) for _ in range(m)]

    def micro_batches():
        sharded = None
        for shard in shards:
            torch._chunk_cat(grads, dim=0, num_chunks=n, out=buffer)
            out = shard if shard.dtype == torch.float32 else shard.to(torch.float32)
            if sharded is None:
                sharded = out
            else:
                sharded += out

    counted = aten_bytes(micro_batches) / (numel * m)
    assert counted == pytest.approx(fsdp2_reduce_bytes(TITAN, reduce_bytes, n, m))


def _steps(efficiency, name, price, stack=FOUNDRY):
    # one NVSwitch node, 8 sequences a micro-batch: the units' collectives hide under the
    # blocks, whose speed then counts
    spec = ModelSpec(name="gpt", layers=4, hidden=4096, heads=32, vocab=50257, seq_len=2048)
    cluster = make_cluster(nodes=1, gpus_per_node=8, intra_bw="450GB/s", backend="nccl")
    model = StepModel(build_workload(spec), cluster, catalog.GPUS["h100"], 8, 256, efficiency)
    kernels = np.array([stack, MEGATRON, stack])
    L = Layouts.build(
        dp=8, zero=np.array([3, 3, 1]), micro_batch=8, micro_batches=4, kernels=kernels
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsdp, name, price)
        return model.evaluate(L).step


@pytest.mark.parametrize(
    "stack, name, price",
    [
        (FOUNDRY, "fsdp1_pre_reduce_bytes", fsdp1_pre_reduce_bytes),
        (TITAN, "fsdp2_reduce_bytes", fsdp2_reduce_bytes),
    ],
)
def test_priced_beside_the_backward_on_the_roofline_only(stack, name, price):
    """The stack's ZeRO-3 layout (llm-foundry's FSDP1, torchtitan's FSDP2) is slower with its
    copies' bytes beside its backward; Megatron's ZeRO-3 and the stack's ZeRO-1 layouts do
    not change, nor does anything where one measured efficiency prices compute (it holds
    whatever contention its runs had)."""
    none = lambda kernels, *_: np.zeros(np.shape(kernels))  # noqa: E731
    priced, without = _steps(None, name, price, stack), _steps(None, name, none, stack)
    assert priced[0] > without[0]
    np.testing.assert_array_equal(priced[1:], without[1:])
    np.testing.assert_array_equal(_steps(0.5, name, price, stack), _steps(0.5, name, none, stack))
