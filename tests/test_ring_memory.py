"""PyTorch's all-gather ring attention (step.torch_ring) holds one layer's gathered K and V
while that layer's attention runs: memory counts it once at the peak (step.memory)."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.specs import ModelSpec
from commsim.step.memory import ParallelLayout, memory_per_gpu, memory_per_gpu_batch
from commsim.workload.presets import build_workload

# Llama 3.1 8B's shape (Meta's config.json), at 256K tokens
LLAMA = dict(hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_mlp=True, vocab=128256)


def _workload(layers=32, seq_len=262_144):
    return build_workload(ModelSpec(name="llama31-8b", layers=layers, seq_len=seq_len, **LLAMA))


def _held(w, **layout):
    """Bytes the gathered K and V add on the fullest stage: with and without kv_gather."""
    on, off = (
        memory_per_gpu(w, ParallelLayout(kv_gather=g, dp=1, micro_batch=1, **layout))
        for g in (True, False)
    )
    for part in ("params", "grads", "optimizer", "activations"):
        assert getattr(on, part) == getattr(off, part)
    return on.buffers - off.buffers


def test_gathered_kv_by_hand():
    """cp 8 at 256K tokens: each rank holds 32K tokens; the all-gather's output is the 8
    ranks' cat(K, V), K and V repeated to all 32 heads of 128 (4,096 elements a token),
    bf16: 8 x 32,768 x 2 x 4,096 x 2 = 2^32 bytes (4.29 GB), cp x 4 bytes a query element."""
    assert _held(_workload(), cp=8) == 2**32
    assert 8 * 32_768 * 2 * 4_096 * 2 == 2**32


def test_one_layer_at_a_time_and_split_as_the_heads():
    """One layer's, however many layers; tp halves the heads and the buffer; cp 1 holds none
    (no ring); a rank's tokens times cp, so the same at cp 4 and cp 8 for the same tokens."""
    w16, w32 = _workload(16), _workload(32)
    assert _held(w16, cp=8) == _held(w32, cp=8) == 2**32
    assert _held(w32, cp=8, tp=2) == 2**31
    assert _held(w32, cp=4) == 2**32
    assert _held(w32, cp=1) == 0.0


def test_batch_matches_per_layout():
    """The vectorised form (step model's layouts) gives each layout's own figure."""
    w = _workload()
    cp, gather = np.array([1, 4, 8, 8]), np.array([True, True, True, False])
    batch = memory_per_gpu_batch(w, 1, 1, 1, 1, 0, 0, False, cp=cp, kv_gather=gather)
    one = [
        memory_per_gpu(w, ParallelLayout(cp=int(c), kv_gather=bool(g))).total
        for c, g in zip(cp, gather, strict=True)
    ]
    assert batch == pytest.approx(one, rel=1e-12)


def test_predict_and_search_count_it_alike():
    """A torchtitan stack with cp 2 (Llama 3 8B, 16 H100s): predict's layout and the search's
    vectorised layouts (each passing kv_gather its own way) hold the same bytes."""
    from commsim.scenario import resolve
    from commsim.specs import Scenario, Strategy
    from commsim.step.predict import predict, step_model, strategy_layouts

    strategy = Strategy(cp=2, kernels="torchtitan")
    s = resolve(
        Scenario(
            model="llama3-8b", cluster="dgx-h100-ib", gpus=16, global_batch=64, strategy=strategy
        )
    )
    p = predict(s)
    L = strategy_layouts(s, [s.scenario.strategy])
    assert step_model(s).memory(L)[0] == pytest.approx(p.memory.total, rel=1e-12)
