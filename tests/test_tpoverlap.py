"""Tensor-parallel overlap as Transformer Engine's userbuffers run it (step.tpoverlap): hand
cases of the pipeline and ring-exchange GEMMs on an H100, the limits where it is the
collective in series or nothing, the closed forms against the chunked streams replayed
event by event, and the step model's use of it."""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step.block_gemms import attention_gemms, grad_gemms, mlp_gemms
from commsim.step.compute import _Block
from commsim.step.gemm import TILE_M, TILE_N, Rates
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel, tp_bytes
from commsim.step.tpoverlap import (
    COMM_SMS,
    NUM_SPLITS,
    Comm,
    GemmClock,
    bulk,
    pair,
    pipeline,
    ring_exchange,
    userbuffers,
)
from commsim.workload.presets import build_workload

H100 = Rates.of(catalog.GPUS["h100"])
BF16 = GemmClock(H100, np.array([False]))


def _flops_seconds(m, n, k, utilisation, sms=H100.sms):
    """2 m n k at the H100's BF16 GEMM rate on `sms` SMs (the rate scales with the SMs'
    share) at `utilisation` of them, then the m x n output's write (2 bytes an element)."""
    return 2.0 * m * n * k / (H100.gemm * sms / H100.sms * utilisation) + _write(m, n)


def _write(m, n):
    return m * n * 2 / H100.memory


def test_a_pipeline_gemm_on_an_h100_by_hand():
    # proj_fprop-like: 2048 tokens x 14,848 outputs, k 4096, cut in 4 along the outputs
    # (split_overlap_rs) of 3712 = 29 tiles of 128. Alone: 8 x 116 = 928 tiles on 132 SMs,
    # ceil(7.03) = 8 waves, 928 / 1056 = 116 / 132 of the GPU. Chunked: 4 x 8 x 29 = 928
    # tiles on the 116 SMs the reduce-scatter's 16 leave (set_sm_margin), 8 waves exactly:
    # all of 116 / 132 of the GPU. Each chunk is a quarter of the GEMM alone.
    assert (H100.sms, COMM_SMS, NUM_SPLITS) == (132, 16, 4)
    m, n, k = 8 * TILE_M, 4 * 29 * TILE_N, 4096
    alone = float(BF16([(m, n, k, 1.0)])[0])
    assert alone == pytest.approx(_flops_seconds(m, n, k, 116 / 132), rel=1e-12)
    chunk = float(BF16([(m, n, k, 1.0)], cols=4, taken=16)[0])
    assert chunk == pytest.approx(_flops_seconds(m, n / 4, k, 1.0, sms=116), rel=1e-12)
    assert chunk == pytest.approx(alone / 4, rel=1e-12)
    # reduce-scatter chunks shorter than a GEMM chunk: each runs under the next chunk's GEMM,
    # the last one's shows: 4 chunks + one reduce-scatter
    rs = 0.4 * chunk
    assert float(pipeline(chunk, rs, 4)) == pytest.approx(alone + rs, rel=1e-12)
    # longer: the reduce-scatters run back to back after the first chunk
    assert float(pipeline(chunk, 3 * chunk, 4)) == pytest.approx(chunk + 12 * chunk)


def test_a_ring_exchange_gemm_on_an_h100_by_hand():
    # qkv_fprop-like on tp 4: 1536 tokens x 2816 outputs. Alone: 6 x 22 = 132 tiles, one
    # full wave. Ring exchange runs 4 chunks of 384 rows (split_overlap_ag): 2 row tiles
    # each, 3/4 filled, 4 x 2 x 22 = 176 tiles on all 132 SMs (copy engines: none taken),
    # 2 waves: 0.75 x 176 / 264 = 1/2 of the GPU, twice the time alone
    m, n, k = 6 * TILE_M, 22 * TILE_N, 8192
    alone = float(BF16([(m, n, k, 1.0)])[0])
    assert alone == pytest.approx(_flops_seconds(m, n, k, 1.0), rel=1e-12)
    chunk = float(BF16([(m, n, k, 1.0)], rows=4)[0])
    w = _write(m, n)  # the chunks write the output once between them
    assert 4 * chunk == pytest.approx(2 * (alone - w) + w, rel=1e-12)
    # ring steps shorter than a chunk hide; longer, the ring sets the pace after the first
    assert float(ring_exchange(chunk, 0.5 * chunk, 4)) == pytest.approx(4 * chunk)
    assert float(ring_exchange(chunk, 2 * chunk, 4)) == pytest.approx(chunk + 6 * chunk)


def test_the_limits():
    g, r = np.array([1.0, 2.0, 0.5]), np.array([0.3, 5.0, 0.5])
    # one split: the GEMM, then its whole reduce-scatter, in series
    assert np.allclose(pipeline(g, r, 1), g + r)
    # tp 1: one local chunk, nothing to wait for
    assert np.allclose(ring_exchange(g, r, 1), g)
    # nothing to communicate: the chunks alone
    assert np.allclose(pipeline(g / 4, 0.0, 4), g) and np.allclose(bulk(g, 0.0), g)
    # one row chunk and one column chunk at no SMs taken is the GEMM alone
    shape = [(3000.0, 5000.0, 1024.0, 1.0)]
    assert BF16(shape, rows=1, cols=1, taken=0)[0] == BF16(shape)[0]


def _replay_pipeline(g, r, splits):
    """The pipeline's streams event by event: GEMM chunks one after another on the compute
    streams; reduce-scatter i on the comm stream once GEMM i and reduce-scatter i - 1 end."""
    gemm_end, rs_end = 0.0, 0.0
    for _ in range(splits):
        gemm_end += g
        rs_end = max(gemm_end, rs_end) + r
    return max(gemm_end, rs_end)


def _replay_ring(g, s, tp):
    """The ring exchange as a queue of events: chunk 0 is local; the receive of chunk i + 1
    starts when chunk i has arrived (the send stream waits for the receive before it); GEMM
    chunk i starts when its data is in and the previous chunk's GEMM is done."""
    events = [(0.0, "arrived", 0)]
    gemm_free, end = 0.0, 0.0
    while events:
        t, kind, i = heapq.heappop(events)
        if kind == "arrived":
            if i + 1 < tp:
                heapq.heappush(events, (t + s, "arrived", i + 1))
            start = max(t, gemm_free)
            gemm_free = start + g
            end = gemm_free
    return end


@pytest.mark.parametrize("seed", range(5))
def test_the_closed_forms_are_the_streams_replayed(seed):
    rng = np.random.default_rng(seed)
    for splits, tp in itertools.product((1, 2, 4, 7), (1, 2, 4, 8)):
        g, r = rng.uniform(0.1, 2.0, size=2)
        assert float(pipeline(g, r, splits)) == pytest.approx(_replay_pipeline(g, r, splits))
        assert float(ring_exchange(g, r, tp)) == pytest.approx(_replay_ring(g, r, tp))


def test_a_pair_by_hand_with_no_communication():
    # no collective time: the pair costs only what chunking and the SM margin cost its GEMMs.
    # Forward: the column GEMM is the ring-exchange hand case (twice the time alone in 4 row
    # chunks); the row GEMM, 1536 x 14,848: alone 6 x 116 = 696 tiles on 132 SMs, 6 waves,
    # 116 / 132 of the GPU; in 4 column chunks on 116 SMs 696 tiles, 6 full waves: the same,
    # so its pipeline loses nothing. Backward, each gradient at its own shape (it was priced
    # at the forward's, where the one-wave column GEMM lost a whole wave in both bulk
    # overlaps): the row GEMM's data gradient 1536 x 4096 (k 14,848), 6 x 32 = 192 tiles, 2
    # waves, 192 / 264 of the GPU; in 4 chunks of 384 rows 4 x 2 x 32 = 256 tiles 3/4 full,
    # 2 waves: 192 / 264 again, its ring exchange loses nothing. The column GEMM's data
    # gradient 1536 x 8192 (k 2816), 384 tiles: 3 waves of 132 (384 / 396), 4 of the 116
    # SMs left (384 / 464 of 116 / 132): 4/3 of its math; its weight gradient 8192 x 2816
    # (k 1536), 704 tiles: 6 waves of 132 (704 / 792), 7 of 116 (704 / 812): 7/6 of its math
    zero = np.zeros(1)
    comm = Comm(zero, zero, zero, zero)
    col = (6 * TILE_M, 22 * TILE_N, 8192, 1.0)  # ring exchange: twice the time alone
    row = (6 * TILE_M, 4 * 29 * TILE_N, 4096, 1.0)
    fwd, bwd = pair(BF16, [col], row, comm, np.array([4.0]))
    col_alone, row_alone = BF16([col])[0], BF16([row])[0]
    pipe_row = 4 * BF16([row], cols=4, taken=16)[0] - row_alone
    assert float(pipe_row) == pytest.approx(0.0, abs=1e-18)
    col_math = float(col_alone) - _write(col[0], col[1])  # what chunking doubles
    assert float(fwd[0]) == pytest.approx(col_math, rel=1e-12)
    flops = 2.0 * col[0] * col[1] * col[2]
    dgrad_math = flops / (H100.gemm * 384 / 396)
    wgrad_math = flops / (H100.gemm * 704 / 792)
    assert float(bwd[0]) == pytest.approx(dgrad_math / 3 + wgrad_math / 6, rel=1e-12)


def test_the_weight_gradients_write_what_compute_writes():
    # a reduce-scatter that outlasts the column GEMM's weight gradient shows whole, less that
    # GEMM alone: 8 bytes an element of its k x n output where it accumulates into the fp32
    # main gradient (read 4, write 4) shows 6 bytes an element less than a bf16 gradient's 2
    comm = Comm(*(np.array([x]) for x in (0.0, 0.0, 1.0, 0.25)))
    col, row = (4096.0, 3072.0, 1024.0, 1.0), (4096.0, 1024.0, 1024.0, 1.0)
    tp = np.array([2.0])
    fused = GemmClock(H100, np.array([False]), wgrad=np.array([8]))
    _, b_fused = pair(fused, [col], row, comm, tp)
    _, b_bf16 = pair(BF16, [col], row, comm, tp)
    assert float((b_bf16 - b_fused)[0]) == pytest.approx(1024 * 3072 * 6 / H100.memory, rel=1e-9)


@pytest.mark.parametrize("fp8", [False, True])
def test_the_backward_gemms_alone_are_computes(fp8):
    # with no collective to hide, each backward GEMM the overlap chunks and subtracts is
    # step.compute's data or weight gradient (_Block.gemms, its own loop over the shapes),
    # at the same shape, rate and output bytes, whatever the weight gradient accumulates into
    w = build_workload(ModelSpec(name="g", layers=2, hidden=4096, heads=32, vocab=1000, seq_len=8))
    shapes = attention_gemms(w.arch, 3000.0, 4.0) + mlp_gemms(w.arch, 3000.0, 16384, 4.0)
    for wgrad in (2, 8):
        block = _Block(w.arch, H100, *[None] * 4, np.array([fp8]), *[None] * 4,
                       np.array([wgrad / H100.memory]))  # fmt: skip
        clock = GemmClock(H100, np.array([fp8]), wgrad=np.array([wgrad]))
        dgrad, wgrads = grad_gemms(shapes)
        got = block.gemms(shapes)
        assert float(clock(dgrad)[0]) == pytest.approx(float(got.dgrad[0]), rel=1e-12)
        alone = clock(wgrads, write=clock.wgrad)[0]
        assert float(alone) == pytest.approx(float(got.wgrad[0]), rel=1e-12)


def _gpt_on_one_node(efficiency=None):
    spec = ModelSpec(name="gpt", layers=8, hidden=12288, heads=96, vocab=51200, seq_len=2048)
    cluster = make_cluster(nodes=1, gpus_per_node=8, backend="nccl")
    return StepModel(build_workload(spec), cluster, catalog.GPUS["h100"], 8, 16, efficiency)


def _layouts(**kw):
    base = dict(dp=2, tp=4, micro_batch=1, micro_batches=8, sequence_parallel=True)
    return Layouts.build(**(base | kw))


def test_the_step_model_prices_the_overlap_per_block():
    model = _gpt_on_one_node()
    for fp8, recompute in itertools.product((False, True), (0, 2)):
        on = _layouts(fp8=fp8, recompute=recompute, tp_overlap=True)
        off = _layouts(fp8=fp8, recompute=recompute)
        fwd, bwd = userbuffers(model, on, tp_bytes(on, model.shape))
        c = model.compute(on)
        b_on, b_off = model.evaluate(on), model.evaluate(off)
        again = 1.0 if recompute == 2 else 0.0  # a full recompute's forward, again
        per_mb = c.blocks * (fwd + bwd + again * fwd)
        assert float(b_on.tp_comm[0]) == pytest.approx(float(8 * per_mb[0]), rel=1e-12)
        # GPT-3's block on 4 H100s: the overlap hides most of the collectives, not all
        assert 0 < b_on.tp_comm[0] < 0.7 * b_off.tp_comm[0]
        assert b_on.compute[0] == b_off.compute[0]


def test_no_overlap_is_priced_as_before():
    # the all-reduces (their sequence-parallel halves) in series, 2 a block each way
    model = _gpt_on_one_node()
    L = _layouts()
    ar = model.groups.price("all-reduce", "tp", L, tp_bytes(L, model.shape))
    c = model.compute(L)
    assert float(model.evaluate(L).tp_comm[0]) == pytest.approx(8 * 2 * 2 * c.blocks[0] * ar[0])


def test_tp_1_runs_no_userbuffers():
    model = _gpt_on_one_node()
    L = Layouts.build(dp=8, micro_batch=1, micro_batches=2, tp_overlap=True)
    fwd, bwd = userbuffers(model, L, tp_bytes(L, model.shape))
    assert fwd[0] == 0.0 and bwd[0] == 0.0


def test_one_measured_efficiency_loses_nothing_to_chunks():
    # one rate for every GEMM (a calibrated profile): chunks take their share of the FLOPs,
    # no SMs are lost, and what shows is the collectives the GEMMs do not cover: at least
    # the last reduce-scatter chunk of each of the two pairs
    model = _gpt_on_one_node(efficiency=0.5)
    L = _layouts(tp_overlap=True)
    nbytes = tp_bytes(L, model.shape)
    fwd, _ = userbuffers(model, L, nbytes)
    rs_chunk = model.groups.price("reduce-scatter", "tp", L, nbytes / NUM_SPLITS)
    assert float(fwd[0]) == pytest.approx(2 * float(rs_chunk[0]), rel=1e-9)


def test_a_batch_prices_each_layout_as_alone():
    # userbuffers prices each distinct (groups, micro-batch, precision) once: a mixed batch
    # gives each layout what it gives that layout alone
    model = _gpt_on_one_node()
    L = Layouts.build(
        dp=np.array([2, 1, 2, 4, 1, 2]),
        tp=np.array([4, 8, 4, 2, 8, 4]),
        micro_batch=np.array([1, 1, 2, 1, 2, 1]),
        micro_batches=8,
        fp8=np.array([False, True, False, True, False, True]),
        tp_overlap=True,
        sequence_parallel=True,
    )
    fwd, bwd = userbuffers(model, L, tp_bytes(L, model.shape))
    assert len(set(fwd.tolist())) == len(L)  # all distinct
    for i in range(len(L)):
        one = L.take(np.array([i]))
        f, b = userbuffers(model, one, tp_bytes(one, model.shape))
        assert (f[0], b[0]) == (fwd[i], bwd[i])
