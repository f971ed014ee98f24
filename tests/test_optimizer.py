"""The optimizer step per stack (step.optimizer): Megatron-core's, torch's foreach AdamW
(torchtitan) and Composer's DecoupledAdamW (llm-foundry), bytes by hand kernel by kernel and
against the bytes PyTorch's dispatcher sees the ops touch; predict and the search alike."""

from __future__ import annotations

import numpy as np
import pytest
from aten_bytes import aten_bytes

from commsim import whatif
from commsim.catalog import gpu
from commsim.step.eager import KERNELS
from commsim.step.optimizer import adam_step_time, update_bytes

H100 = gpu("h100")


def test_adam_step_bytes_pass_by_pass():
    """The optimizer step's HBM bytes a parameter, kernel by kernel as Megatron-core runs it
    (each pass: the tensors it reads and writes, by their bytes an element): 50 with fp32
    main gradients, 54 with a 16-bit gradient buffer (its cast to fp32 comes first)."""
    fp32, half = 4, 2
    passes = {
        "grad norm": ((fp32,), ()),
        "clip": ((fp32,), (fp32,)),
        "adam": ((fp32, fp32, fp32, fp32), (fp32, fp32, fp32)),  # g, p, m, v -> p, m, v
        "copy to 16-bit params": ((fp32,), (half,)),
    }
    body = sum(sum(r) + sum(w) for r, w in passes.values())
    h100 = gpu("h100")
    for grad, cast in ((fp32, 0), (half, half + fp32)):
        want = 1e9 * (body + grad + cast) / h100.stream_bandwidth  # + zeroing the buffer
        assert adam_step_time(1e9, h100, grad) == pytest.approx(want)
    assert adam_step_time(1e9, h100, 4) == pytest.approx(1e9 * 50 / 2.97e12)
    assert adam_step_time(1e9, h100, 2) == pytest.approx(1e9 * 54 / 2.97e12)
    # bf16 moments (DeepSeek-V3): Adam reads and writes m and v at 2 bytes: 42 a parameter
    adam = ((fp32, fp32, half, half), (fp32, half, half))  # g, p, m, v -> p, m, v
    bf16 = body - sum(map(sum, passes["adam"])) + sum(map(sum, adam)) + fp32
    assert adam_step_time(1e9, h100, 4, moment_bytes=2) == pytest.approx(1e9 * bf16 / 2.97e12)
    assert bf16 == 42


def test_torch_stacks_by_hand():
    """Both torch stacks' updates, (read + write) bytes of fp32 tensors a kernel, 80 a
    parameter: foreach AdamW p*=decay 4+4, lerp m 8+4, v*=b2 4+4, addcmul v 8+4, sqrt 4+4,
    /bias 4+4, +eps 4+4, addcdiv p 12+4; DecoupledAdamW with no decay m*=b1 4+4, m+=g 8+4 and
    the same six. With the clip (norm 4, scale 8) the step is 92, no copy back or zeroing; with
    bf16 moments (m, v and the temporary 2 wide) the update is 52."""
    assert update_bytes("torchtitan") == 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16 == 80
    assert update_bytes("llm-foundry") == 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16 == 80
    assert update_bytes("torchtitan-compile") == 80 and update_bytes("megatron") == 28
    assert update_bytes("torchtitan", 2) == 8 + 8 + 4 + 8 + 4 + 4 + 4 + 12 == 52
    for stack in ("torchtitan", "torchtitan-compile", "llm-foundry"):
        code = KERNELS.index(stack)
        for grad in (4, 2):  # the torch stacks' gradient is fp32 when the optimizer sees it
            got = adam_step_time(1e9, H100, grad, kernels=code)
            assert got == pytest.approx(1e9 * 92 / H100.stream_bandwidth)


def test_one_call_prices_every_stack():
    """Arrays of stacks, gradients and moments price each layout as the scalar calls do."""
    codes = np.arange(len(KERNELS))
    grads, moments = np.array([2, 4, 4, 2]), np.array([4, 2, 4, 2])
    together = adam_step_time(1e9, H100, grads, moments, codes)
    alone = [
        adam_step_time(1e9, H100, g, m, k) for g, m, k in zip(grads, moments, codes, strict=True)
    ]
    np.testing.assert_allclose(together, alone)


@pytest.mark.torch
def test_torch_adamw_against_the_dispatcher():
    """torch.optim.AdamW as torchtitan builds it (foreach, weight decay 0.1) moves
    update_bytes a parameter by the dispatcher's count, on two tensors after the first step
    (which allocates the moments)."""
    import torch

    params = [torch.nn.Parameter(torch.randn(n)) for n in (1000, 3000)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    opt.step()
    assert aten_bytes(opt.step) / 4000 == update_bytes("torchtitan")


@pytest.mark.torch
def test_decoupled_adamw_sequence_against_the_dispatcher():
    """DecoupledAdamW's eager ops on one tensor with no weight decay (the sequence quoted in
    step.optimizer, from Composer 2deccf2c8) move update_bytes("llm-foundry") a parameter."""
    import torch

    p, g, m, v = (torch.randn(5000) for _ in range(4))
    v = v.abs()

    def step():
        m.mul_(0.9).add_(g, alpha=0.1)
        v.mul_(0.95).addcmul_(g, g, value=0.05)
        denom = (v.sqrt() / 0.5).add_(1e-8)
        p.addcdiv_(m, denom, value=-1e-3)

    assert aten_bytes(step) / 5000 == update_bytes("llm-foundry")


def test_predict_prices_the_stacks_optimizer():
    """predict's optimizer on the same layout with fp32 gradients and moments: 92 bytes a
    parameter for the torch stacks against Megatron-core's 50."""
    base = whatif.load(changes={"model": "llama3-8b", "seq_len": 2048, "gpus": 8})
    base = base.model_copy(update={"compute_efficiency": None})
    opt = {
        k: whatif.predict(whatif.change(base, {"kernels": k, "grad_dtype": "fp32"})).parts[
            "optimizer_s"
        ]
        for k in KERNELS
    }
    for k in ("torchtitan", "torchtitan-compile", "llm-foundry"):
        assert opt[k] / opt["megatron"] == pytest.approx(92 / 50)
