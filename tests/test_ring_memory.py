"""Ring attention's buffers (one layer's at a time, at its peak, beyond what the layer keeps):
PyTorch's all-gather ring (step.torch_ring.held_bytes) and Transformer Engine's p2p ring
(step.context.held_bytes), as memory counts them (step.memory), by hand and against PyTorch's
own code."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from commsim.specs import ModelSpec
from commsim.step.context import held_bytes as te_held
from commsim.step.memory import ParallelLayout, memory_per_gpu, memory_per_gpu_batch
from commsim.step.torch_ring import held_bytes as torch_held
from commsim.workload.presets import build_workload

# Llama 3.1 8B's shape (Meta's config.json): 32 heads of 128, 8 kv heads
LLAMA = dict(hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_mlp=True, vocab=128256)


def _workload(layers=32, seq_len=262_144):
    return build_workload(ModelSpec(name="llama31-8b", layers=layers, seq_len=seq_len, **LLAMA))


def _ring(w, **layout):
    """Bytes the ring adds to the fullest stage: buffers less those of the same layout without
    context parallelism (nothing else in the buffers depends on cp); nothing else changes."""
    on, off = (
        memory_per_gpu(w, ParallelLayout(dp=1, micro_batch=1, **{**layout, **cp}))
        for cp in ({}, {"cp": 1, "kv_gather": False})
    )
    assert (on.params, on.grads, on.optimizer) == (off.params, off.grads, off.optimizer)
    return on.buffers - off.buffers


def test_torch_ring_by_hand():
    """cp 8 at 256K tokens: each rank holds 32K tokens, K and V repeated to all 32 heads of
    128 (4,096 elements a token, 2^27 a rank, as many as its queries): the all-gather's
    output 8 x 2^27 x 2 x 2 bytes = 2^32 and the backward's 46 bytes a query element beside
    it (cp > 2); cp 2 at 64K tokens (2^27 again): 2 x 2^27 x 4 and 44 bytes a query element."""
    assert _ring(_workload(), cp=8, kv_gather=True) == 2**32 + 46 * 2**27
    assert _ring(_workload(seq_len=65_536), cp=2, kv_gather=True) == 8 * 2**27 + 44 * 2**27


def test_te_ring_by_hand():
    """Llama 3 8B at 8K tokens, cp 2: a rank's 4,096 tokens, 2^24 query and 2^22 key elements.
    Backward: dq_buffer 2 x 2^24, the two (2, K + V) buffers 16 x 2^22, the diagonal step's
    dQ, dK, dV 2 x 2^24 + 4 x 2^22: 9 x 2^24; forward: 2 x (4 x 2^22 + 2 x 2^24 + 4 x 2^17
    rows), less. cp 8 at 64K tokens (8,192 a rank): forward 8 x (4 x 2^23 + 2 x 2^25 + 4 x
    2^18) over the backward's 9 x 2^25."""
    assert _ring(_workload(seq_len=8192), cp=2) == 9 * 2**24
    forward = 8 * (4 * 2**23 + 2 * 2**25 + 4 * 2**18)
    assert forward > 9 * 2**25
    assert _ring(_workload(seq_len=65_536), cp=8) == forward


def test_te_ring_walked_step_by_step():
    """The closed form against TE's loops walked allocation by allocation (the last rank,
    bf16 attention): the forward's buffers and step results all live at its end, the
    backward's at its diagonal (last) step; the larger, for several cp and sizes."""
    for cp in (2, 3, 4, 8, 32):
        for q, k, rows in ((2.0**20, 2.0**18, 2.0**13), (2.0**20, 2.0**20, 2.0**13)):
            live = [2 * 2 * k]  # torch.cat(k, v)
            for i in range(cp):
                live += [2 * 2 * k] if i < cp - 1 else []  # the next pair, received
                live += [2 * q, 4 * rows]  # out_per_step[i], softmax_lse_per_step[i]
            forward = sum(live)
            dq_buffer, pairs, diagonal = 2 * q, 2 * (2 * 2 * 2 * k), 2 * q + 2 * 2 * k
            backward = dq_buffer + pairs + diagonal
            assert te_held(cp, q, k, rows) == max(forward, backward)
    assert te_held(1, 1.0, 1.0, 1.0) == 0.0


def test_one_layer_at_a_time_and_split_as_the_heads():
    """One layer's, however many layers; tp halves the heads and the buffers; cp 1 holds none
    (no ring)."""
    w16, w32 = _workload(16), _workload(32)
    for stack in ({"kv_gather": True}, {}):
        assert _ring(w16, cp=8, **stack) == _ring(w32, cp=8, **stack) > 0
        assert _ring(w32, cp=8, tp=2, **stack) == _ring(w32, cp=8, **stack) / 2
        assert _ring(w32, cp=1, **stack) == 0.0


def test_batch_matches_per_layout():
    """The vectorised form (step model's layouts) gives each layout's own figure."""
    w = _workload()
    cp, gather = np.array([1, 4, 8, 8, 2]), np.array([True, True, True, False, False])
    batch = memory_per_gpu_batch(w, 1, 1, 1, 1, 0, 0, False, cp=cp, kv_gather=gather)
    one = [
        memory_per_gpu(w, ParallelLayout(cp=int(c), kv_gather=bool(g))).total
        for c, g in zip(cp, gather, strict=True)
    ]
    assert batch == pytest.approx(one, rel=1e-12)


@pytest.mark.parametrize("kernels", ["torchtitan", "megatron"])
def test_predict_and_search_count_it_alike(kernels):
    """cp 2 (Llama 3 8B, 16 H100s), PyTorch's ring and TE's: predict's layout and the
    search's vectorised layouts (each passing kv_gather its own way) hold the same bytes."""
    from commsim.scenario import resolve
    from commsim.specs import Scenario, Strategy
    from commsim.step.predict import predict, step_model, strategy_layouts

    strategy = Strategy(cp=2, kernels=kernels)
    s = resolve(
        Scenario(
            model="llama3-8b", cluster="dgx-h100-ib", gpus=16, global_batch=64, strategy=strategy
        )
    )
    p = predict(s)
    L = strategy_layouts(s, [s.scenario.strategy])
    assert step_model(s).memory(L)[0] == pytest.approx(p.memory.total, rel=1e-12)


# PyTorch's ring itself (torch 2.13's _templated_ring_attention and its backward) on the last
# of `cp` ranks of a fake process group (collectives allocate their outputs, move nothing),
# SDPA on CPU, every tensor it allocates tracked by torch's MemTracker: the peak bytes.
MEASURE = """
import json, sys
import torch, torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor.experimental._context_parallel import _attention as A
from torch.testing._internal.distributed.fake_pg import FakeStore

B, H, S, D = 1, 4, 64, 16  # a rank's b, heads, s / cp, head width
A._cp_options.enable_load_balance = True
aten = torch.ops.aten
peaks = {}
for cp in map(int, sys.argv[1:]):
    dist.init_process_group("fake", store=FakeStore(), rank=cp - 1, world_size=cp)
    heads = lambda: torch.randn(B, S, H, D, dtype=torch.bfloat16).transpose(1, 2)
    q, k, v, dout = heads(), heads(), heads(), heads()
    out, lse = heads().contiguous(), torch.randn(B, H, S, dtype=torch.float32)
    group, found = dist.group.WORLD, []
    for run in (
        lambda: A._templated_ring_attention(
            group, 2, aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, True
        ),
        lambda: A._templated_ring_attention_backward(
            group, 2, aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            dout, "grad_out", q, k, v, out, lse, True, dropout_p=0.0,
        ),
    ):
        tracker = MemTracker()
        with tracker:
            run()
        found.append(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    peaks[cp] = found
    dist.destroy_process_group()
print(json.dumps(peaks))
"""


@pytest.mark.torch
@pytest.mark.shared  # MemTracker counts bytes: no timing
def test_torch_ring_is_what_pytorch_holds():
    """The eager ring's peak, measured on PyTorch's own code, is held_bytes at every cp (the
    all-gathered K and V and the backward's buffers), and its forward holds less."""
    pytest.importorskip("torch")
    cps = (2, 3, 4, 8)
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, *map(str, cps)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    peaks = json.loads(run.stdout.strip().splitlines()[-1])
    queries = 1 * 4 * 64 * 16
    for cp in cps:
        forward, backward = peaks[str(cp)]
        assert backward == torch_held(cp, float(queries))
        assert forward < backward
