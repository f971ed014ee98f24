"""The DDP step timeline: tensor bucketing, stream schedule against a brute-force clock."""

import numpy as np
import pytest

from commsim.catalog import gpu
from commsim.planner.search import DDP_BUCKETS_MB
from commsim.specs import Strategy
from commsim.step.buckets import MIB, assign_buckets, first_bucket_mb, stage_buckets
from commsim.step.layouts import DTYPE_BYTES
from commsim.step.optimizer import adam_step_time
from commsim.step.predict import ddp_timeline
from commsim.step.sync import BucketCosts
from commsim.step.timeline import schedule_streams
from commsim.workload.model import layer_times
from commsim.workload.presets import build_workload


def simulate_step(w, gpu_, strategy, sync, efficiency=0.5):
    """One DDP step of `w` by the step model's bucket rule and DDP timeline, network seconds
    of each bucket from `sync` (bucket bytes -> seconds)."""
    g = DTYPE_BYTES[strategy.grad_dtype]
    forward, backward = layer_times(w, gpu_, efficiency, 1)
    plan = stage_buckets(
        w,
        "only",
        0,
        1,
        1,
        g,
        strategy.bucket_mb * MIB,
        float(first_bucket_mb(strategy.bucket_mb, strategy.first_bucket_mb)) * MIB,
        tuple(backward.tolist()),
    )
    none = np.zeros(len(plan))
    costs = BucketCosts(np.asarray(sync(plan.bytes), dtype=float), none, none)
    return ddp_timeline(
        w,
        forward,
        backward,
        plan,
        costs,
        g,
        overlap=strategy.overlap,
        accum_steps=1,
        optimizer_s=adam_step_time(w.params, gpu_, g),
    )


def zero_cost(sizes):
    """Free communication: only the bucket layout matters."""
    return np.zeros(len(sizes))


def test_assign_buckets_hand_computed():
    # forward order, MiB: [4, 20, 6, 30, 0.25, 0, 0.5, 0.5]; walked in reverse:
    # 0.5 (7) + 0.5 (6) = 1.0 >= 1 (first cap)      -> [7, 6], later caps 25
    # layer 5 has no parameters and is skipped
    # 0.25 (4) + 30 (3) = 30.25 >= 25 (30 crosses, stays) -> [4, 3]
    # 6 (2) + 20 (1) = 26 >= 25                       -> [2, 1]
    # 4 (0) is left over                              -> [0]
    sizes = np.array([4, 20, 6, 30, 0.25, 0, 0.5, 0.5]) * MIB
    assert assign_buckets(sizes, 25 * MIB, 1 * MIB) == [[7, 6], [4, 3], [2, 1], [0]]
    assert assign_buckets(sizes, 25 * MIB) == [[7, 6], [4, 3], [2, 1], [0]]  # DDP's 1 MiB default
    assert assign_buckets(sizes, 1e12, 1e12) == [[7, 6, 4, 3, 2, 1, 0]]
    assert assign_buckets([0, 0], 1, 1) == []


def test_assign_buckets_properties():
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 15))
        sizes = rng.integers(0, 12, n) * (rng.random(n) < 0.8)  # some layers without parameters
        first, cap = int(rng.integers(1, 10)), int(rng.integers(1, 30))
        buckets = assign_buckets(sizes, cap, first)
        flat = [i for b in buckets for i in b]
        assert flat == [i for i in reversed(range(len(sizes))) if sizes[i] > 0]
        for k, b in enumerate(buckets[:-1]):  # every closed bucket reached its limit ...
            limit = first if k == 0 else cap
            assert sizes[b].sum() >= limit > sizes[b[:-1]].sum()  # ... at its last tensor
        if buckets:
            assert sizes[buckets[-1][:-1]].sum() < (first if len(buckets) == 1 else cap)


def brute_force(fwd, bwd, buckets, comm, overlap, accum, opt):
    """Step a clock one integer unit at a time; each stream starts its next task when allowed.

    `buckets` lists the layers each bucket waits for. Returns (step end, bucket starts,
    bucket ends, last micro-batch backward end per layer).
    """
    n = len(fwd)
    tasks = []
    for m in range(accum):
        tasks += [("forward", m, i, fwd[i]) for i in range(n)]
        tasks += [("backward", m, i, bwd[i]) for i in reversed(range(n))]
    tasks.append(("optimizer", accum, -1, opt))
    bwd_end, starts, ends = {}, [], []
    task, left, nb, comm_left, t = 0, None, 0, None, 0
    while task < len(tasks) or nb < len(buckets):
        settling = True
        while settling:  # everything that can start or finish at time t
            settling = False
            if task < len(tasks):
                kind, m, i, d = tasks[task]
                if left is None and (kind != "optimizer" or len(ends) == len(buckets)):
                    left, settling = d, True
                if left == 0:
                    if kind == "backward" and m == accum - 1:
                        bwd_end[i] = t
                    step, task, left, settling = t, task + 1, None, True
            if nb < len(buckets):
                needed = buckets[nb] if overlap else range(n)
                if comm_left is None and all(i in bwd_end for i in needed):
                    comm_left, settling = comm[nb], True
                    starts.append(t)
                if comm_left == 0:
                    ends.append(t)
                    nb, comm_left, settling = nb + 1, None, True
        t += 1
        left = left - 1 if left else left
        comm_left = comm_left - 1 if comm_left else comm_left
    return step, starts, ends, bwd_end


def allreduce(sizes):
    """An integer stand-in cost model: 1 unit of latency plus 1 unit per 8 bytes."""
    return 1 + np.asarray(sizes) // 8


@pytest.mark.parametrize("overlap", [True, False])
def test_schedule_matches_brute_force(overlap):
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 7))
        fwd, bwd = rng.integers(0, 4, n), rng.integers(0, 5, n)
        tensor_layer = np.repeat(np.arange(n), rng.integers(0, 4, n))  # 0 to 3 tensors a layer
        tensor_bytes = rng.integers(1, 40, len(tensor_layer))
        buckets = assign_buckets(tensor_bytes, int(rng.integers(1, 60)), int(rng.integers(1, 20)))
        accum, opt = int(rng.integers(1, 4)), int(rng.integers(0, 3))
        report = schedule_streams(
            fwd,
            bwd,
            tensor_bytes,
            buckets,
            allreduce,
            tensor_layer=tensor_layer,
            overlap=overlap,
            accum_steps=accum,
            optimizer_s=opt,
        )
        comm = allreduce([tensor_bytes[b].sum() for b in buckets])
        waits = [set(tensor_layer[b].tolist()) for b in buckets]
        step, starts, ends, bwd_end = brute_force(fwd, bwd, waits, comm, overlap, accum, opt)
        assert report.step_time_s == step
        assert [b.start_s for b in report.buckets] == starts
        assert [b.end_s for b in report.buckets] == ends
        assert [b.layers for b in report.buckets] == [
            tuple(f"layer {i}" for i in sorted(w, reverse=True)) for w in waits
        ]
        assert [b.tensors for b in report.buckets] == [len(b) for b in buckets]
        backward = {e.label: e.end_s for e in report.events if e.label.startswith("backward layer")}
        assert backward == {f"backward layer {i}": float(t) for i, t in bwd_end.items()}


def test_hand_computed_step():
    # forward 1+2+3 = 6; backward: layer 2 6->12, layer 1 12->16, layer 0 16->18.
    # bucket 0 = [2] ready 12, runs 12->17; bucket 1 = [1, 0] ready 18, runs 18->19;
    # optimizer 19->20. Compute 6 + 12 + 1 = 19, exposed 1, comm 6.
    fwd, bwd, layer_bytes = [1, 2, 3], [2, 4, 6], [3, 3, 10]
    buckets = assign_buckets(layer_bytes, 100, 10)
    assert buckets == [[2], [1, 0]]

    def cost(sizes):
        return np.where(np.asarray(sizes) == 10, 5.0, 1.0)

    on = schedule_streams(fwd, bwd, layer_bytes, buckets, cost, optimizer_s=1.0)
    assert [(b.ready_s, b.start_s, b.end_s) for b in on.buckets] == [(12, 12, 17), (18, 18, 19)]
    assert (on.step_time_s, on.compute_s, on.comm_s, on.exposed_comm_s) == (20, 19, 6, 1)
    assert on.overlap_ratio == pytest.approx(5 / 6)
    assert on.overlap_efficiency == 1.0
    assert on.buckets[1].layers == ("layer 1", "layer 0") and on.buckets[1].bytes == 6

    # overlap off: both all-reduces wait for the backward to end at 18: 18->23, 23->24, opt 24->25
    off = schedule_streams(fwd, bwd, layer_bytes, buckets, cost, overlap=False, optimizer_s=1.0)
    assert [(b.start_s, b.end_s) for b in off.buckets] == [(18, 23), (23, 24)]
    assert (off.step_time_s, off.exposed_comm_s, off.overlap_ratio) == (25, 6, 0.0)
    assert off.buckets[0].ready_s == 12  # ready is when the gradients exist, launched or not


def test_compression_codec_runs_on_the_compute_stream():
    # The hand case above with a comm hook: encode 1 and decode 0.5 per bucket.
    # bucket 0 ready 12, encode 12->13, all-reduce 13->18; the backward of layers 1 and 0
    # slides by 1 (13->17, 17->19); bucket 1 ready 19, encode 19->20, all-reduce 20->21;
    # decodes after the backward (20): bucket 0 20->20.5, bucket 1 max(20.5, 21)->21.5;
    # optimizer 21.5->22.5. Exposed = 22.5 - 19 = 3.5 (encode/decode included), codec 3.
    fwd, bwd, layer_bytes = [1, 2, 3], [2, 4, 6], [3, 3, 10]
    buckets = assign_buckets(layer_bytes, 100, 10)

    def cost(sizes):
        return np.where(np.asarray(sizes) == 10, 5.0, 1.0)

    def codec(sizes):
        return np.full(len(sizes), 1.0), np.full(len(sizes), 0.5)

    r = schedule_streams(fwd, bwd, layer_bytes, buckets, cost, optimizer_s=1.0, codec_time=codec)
    assert [(b.ready_s, b.start_s, b.end_s) for b in r.buckets] == [(12, 13, 18), (19, 20, 21)]
    assert (r.step_time_s, r.compute_s, r.comm_s, r.codec_s) == (22.5, 19, 6, 3)
    assert r.exposed_comm_s == 3.5
    assert r.overlap_ratio == pytest.approx(1 - 3.5 / (6 + 3))
    bars = {e.label: (e.start_s, e.end_s) for e in r.events}
    assert bars["backward layer 1"] == (13, 17) and bars["backward layer 0"] == (17, 19)
    assert bars["encode bucket 1"] == (19, 20) and bars["decode bucket 1"] == (21, 21.5)


def test_comm_fully_hidden():
    # layer 0 has no parameters, so the last bucket is ready before the backward ends and
    # short all-reduces finish under the remaining compute
    report = schedule_streams(
        [1] * 4, [2] * 4, [0, 8, 8, 8], [[3], [2], [1]], lambda s: np.full(len(s), 1.5)
    )
    assert report.exposed_comm_s == 0 and report.overlap_ratio == 1.0
    assert report.step_time_s == report.compute_s == 12


def test_comm_bound_efficiency():
    report = schedule_streams([1], [2], [8], [[0]], lambda s: np.array([9.0]))
    assert (report.step_time_s, report.exposed_comm_s) == (12, 9)
    assert report.overlap_efficiency == pytest.approx(3 / 9)
    assert report.overlap_ratio == 0.0


def test_accumulation_overlaps_only_the_last_micro_batch():
    fwd, bwd, layer_bytes = [1, 1, 1], [2, 2, 2], [8, 8, 8]
    buckets = [[2], [1], [0]]
    one = schedule_streams(fwd, bwd, layer_bytes, buckets, allreduce, optimizer_s=0.5)
    four = schedule_streams(
        fwd, bwd, layer_bytes, buckets, allreduce, accum_steps=4, optimizer_s=0.5
    )
    assert four.compute_s == 4 * 9 + 0.5 and four.comm_s == one.comm_s
    assert four.step_time_s == one.step_time_s + 3 * 9
    assert min(b.start_s for b in four.buckets) >= 3 * 9 + 3  # no_sync until the last backward
    labels = [e.label for e in four.events if e.stream == "compute"]
    assert labels[:3] == ["forward mb0", "backward mb0", "forward mb1"]
    assert labels[-1] == "optimizer" and "backward layer 0" in labels


def test_no_buckets():
    report = schedule_streams([1, 1], [2, 2], [0, 0], [], allreduce)
    assert (report.comm_s, report.overlap_ratio, report.step_time_s) == (0.0, 1.0, 6)


def test_bad_cost_model():
    with pytest.raises(ValueError, match="one non-negative time per bucket"):
        schedule_streams([1], [2], [8], [[0]], lambda s: np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="accum_steps"):
        schedule_streams([1], [2], [8], [[0]], allreduce, accum_steps=0)


def test_assign_buckets_over_a_gpt2_xl_block():
    # fp32 gradients of ln_1 (w, b), c_attn (w, b), c_proj (w, b), ln_2 (w, b), c_fc, c_proj:
    #   0: 6400 B   1: 6400   2: 30,720,000   3: 19,200   4: 10,240,000   5: 6400
    #   6: 6400     7: 6400   8: 40,960,000   9: 25,600  10: 40,960,000  11: 6400
    # reversed, first limit 1 MiB then 25 MiB = 26,214,400 B:
    #   11 + 10 = 40,966,400 >= 1 MiB                             -> [11, 10]
    #   9 + 8 = 40,985,600 >= 25 MiB                               -> [9, 8]
    #   7..4 = 10,259,200; + 3 = 10,278,400; + 2 = 40,998,400 >= 25 MiB -> [7, 6, 5, 4, 3, 2]
    #   1 + 0 = 12,800 left over                                   -> [1, 0]
    block = build_workload("gpt2-xl").layers[1]
    sizes = 4 * np.array(block.tensors)
    assert sizes.tolist()[:5] == [6400, 6400, 30_720_000, 19_200, 10_240_000]
    assert assign_buckets(sizes, 25 * MIB) == [[11, 10], [9, 8], [7, 6, 5, 4, 3, 2], [1, 0]]
    assert assign_buckets([sizes.sum()], 25 * MIB) == [[0]]  # the block as one tensor


def test_bucket_cap_changes_gpt2_xl_buckets():
    w, a100 = build_workload("gpt2-xl"), gpu("a100")
    counts = {
        mb: len(simulate_step(w, a100, Strategy(bucket_mb=mb), zero_cost, efficiency=0.5).buckets)
        for mb in DDP_BUCKETS_MB
    }
    # 1 MiB: each of a block's 4 weight matrices (>= 9.8 MiB) closes a bucket, then wpe, wte:
    # 48 * 4 + 2. 25 MiB: 3 a block (c_proj joins c_attn, as above), then the embedding.
    assert (counts[1], counts[25]) == (48 * 4 + 2, 48 * 3 + 1)
    # 200 MiB: every bucket but the last holds at least 200 MiB of the 5.9 GB
    assert counts[200] < counts[25] and counts[200] <= 4 * w.params / (200 * MIB) + 1
    assert list(counts.values()) == sorted(counts.values(), reverse=True)


def test_simulate_step_gpt2_xl():
    w, a100 = build_workload("gpt2-xl"), gpu("a100")
    free = simulate_step(w, a100, Strategy(), zero_cost, efficiency=0.5)
    forward, backward = layer_times(w, a100, 0.5, 1)
    # fp32 grads: 50 bytes per parameter (norm 4, clip 8, Adam 28, copy back 6, zeroing 4)
    # at the A100's BabelStream Triad, 1.70 TB/s
    optimizer = w.params * 50 / 1.70e12
    assert free.optimizer_s == pytest.approx(optimizer) == adam_step_time(w.params, a100)
    assert free.step_time_s == pytest.approx(forward.sum() + backward.sum() + optimizer)
    assert free.exposed_comm_s == pytest.approx(0.0, abs=1e-12)
    # lm_head is tied (no gradient); the first bucket crosses 1 MiB at the last block's
    # mlp.c_proj weight, and the next one holds block.47's c_fc alone
    assert free.buckets[0].layers == ("final_norm", "block.47")
    assert free.buckets[0].tensors == 4 and free.buckets[1].layers == ("block.47",)
    assert free.buckets[0].ready_s == free.buckets[1].ready_s  # a layer's tensors: all at its end
    assert free.buckets[-1].layers[-1] == "embedding"
    assert sum(b.bytes for b in free.buckets) == 4 * w.params

    bf16 = simulate_step(
        w, a100, Strategy(grad_dtype="bf16", overlap=False), lambda s: s / 1e11, efficiency=0.5
    )
    assert sum(b.bytes for b in bf16.buckets) == 2 * w.params
    assert bf16.comm_s == pytest.approx(2 * w.params / 1e11)
    assert bf16.exposed_comm_s == pytest.approx(bf16.comm_s)
