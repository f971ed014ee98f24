"""Compressors: wire bytes and costs by hand, contraction on constructed vectors, round trips,
PowerSGD's rank behaviour, error feedback's bookkeeping, and the collectives they need."""

import math
import re

import numpy as np
import pytest

from commsim.catalog import gpu
from commsim.collectives.algorithms import ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.compression import (
    INT8_CHUNK,
    ErrorFeedback,
    bucket_collectives,
    collective,
    measure,
    parse_compressor,
    synthetic_gradients,
)
from commsim.step.sync import encode_decode_seconds

ALL = [
    "none",
    "fp16",
    "bf16",
    "int8",
    "topk:0.05",
    "topk:0.05+int8",
    "randomk:0.05",
    "randomk:0.05+fp16",
    "powersgd:4",
    "sign",
]


def payload_bytes(payload) -> int:
    """Bytes of the numpy data in a payload (plain ints, e.g. random-k's round, are not sent)."""
    if isinstance(payload, np.ndarray | np.generic):
        return payload.nbytes
    if isinstance(payload, tuple):
        return sum(payload_bytes(p) for p in payload)
    return 0


@pytest.fixture(scope="module")
def grad():
    return synthetic_gradients([(100, 100)], seed=1)[0]


@pytest.mark.parametrize("spec", ALL)
def test_parse_round_trips_the_spelling(spec):
    assert parse_compressor(spec).spec == spec
    assert parse_compressor(f" {spec.upper()} ").spec == spec


@pytest.mark.parametrize(
    "bad, says",
    [
        ("gzip", "valid spellings: none, fp16"),
        ("topk:0", "RATIO must be a number in (0, 1]"),
        ("topk:1.5", "RATIO must be a number in (0, 1]"),
        ("randomk:x", "RATIO must be a number in (0, 1]"),
        ("topk", "valid spellings"),
        ("powersgd:0", "RANK must be an integer >= 1"),
        ("powersgd:2.5", "RANK must be an integer >= 1"),
        ("topk:0.1+int4", "fp16, bf16 or int8"),
    ],
)
def test_parse_errors_name_the_valid_choices(bad, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_compressor(bad)


@pytest.mark.parametrize(
    "spec, n, shape, expected",
    [
        ("none", 10_000, None, 4 * 10_000),
        ("fp16", 10_000, None, 2 * 10_000),
        ("bf16", 10_000, None, 2 * 10_000),
        ("int8", 10_000, None, 10_000 + 4 * 5),  # ceil(10000 / 2048) = 5 scales
        ("topk:0.05", 10_000, None, 500 * (4 + 4)),  # k = 500 (value, uint32 index)
        ("topk:0.07", 100, None, 7 * 8),  # k = 7, not ceil(7.000000000000001) = 8
        ("topk:0.05+int8", 10_000, None, 500 * (1 + 4) + 4 * 1),  # one scale for 500 values
        ("topk:0.05+fp16", 10_000, None, 500 * (2 + 4)),
        ("randomk:0.05", 10_000, None, 500 * 4),  # values only: indices from the shared seed
        ("randomk:0.05+int8", 10_000, None, 500 + 4),
        ("powersgd:4", 10_000, None, (100 + 100) * 4 * 4),  # flat: 100 x 100 square view
        ("powersgd:4", 10_001, None, (101 + 101) * 4 * 4),  # padded to 101 x 101
        ("powersgd:4", 0, (10, 1000), (10 + 1000) * 4 * 4),
        ("powersgd:64", 0, (10, 1000), (10 + 1000) * 10 * 4),  # rank clipped to min(n, m)
        ("powersgd:4", 0, (8, 4, 25), (8 + 100) * 4 * 4),  # (shape[0], rest)
        ("sign", 10_000, None, 10_000 // 8 + 4),
        ("sign", 10_001, None, 1251 + 4),
    ],
)
def test_wire_bytes_by_hand(spec, n, shape, expected):
    assert parse_compressor(spec).wire_bytes(n, shape) == expected


@pytest.mark.parametrize("spec", ALL)
@pytest.mark.parametrize("shape", [(100, 100), (12345,), (3, 5, 7)])
def test_wire_bytes_are_the_payload_bytes(spec, shape):
    g = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    c = parse_compressor(spec)
    assert payload_bytes(c.compress(g)) == c.wire_bytes(g.size, shape)


def test_topk_delta_is_the_energy_of_the_top_k():
    g = np.ones(1000, np.float32)
    g[::100] = 10.0  # 10 big entries; topk:0.01 keeps exactly those
    m = measure("topk:0.01", g, repeats=1)
    assert m["delta"] == pytest.approx(10 * 100 / (10 * 100 + 990 * 1))
    assert m["wire_ratio"] == pytest.approx(10 * 8 / 4000)


def test_sign_delta_is_l1_squared_over_n_l2_squared(grad):
    # ||g - s sign(g)||^2 = ||g||^2 - ||g||_1^2 / n with s = ||g||_1 / n
    g = grad.astype(np.float64)
    expected = np.abs(g).sum() ** 2 / (g.size * (g**2).sum())
    assert measure("sign", grad, repeats=1)["delta"] == pytest.approx(expected, rel=1e-5)


def test_randomk_keeps_each_index_with_probability_k_over_n():
    c = parse_compressor("randomk:0.1")
    n, rounds = 50, 2000
    counts = np.zeros(n)
    x = np.arange(1, n + 1, dtype=np.float32)
    for _ in range(rounds):
        _, (sent,) = c.exchange([x])
        kept = sent != 0
        assert kept.sum() == 5  # k distinct indices
        counts += kept
    assert np.allclose(counts / rounds, 0.1, atol=0.025)


def test_randomk_workers_share_indices_so_values_sum_in_place(grad):
    c = parse_compressor("randomk:0.05")
    mean, sent = c.exchange([grad, 2 * grad, -grad])
    support = [np.flatnonzero(s) for s in sent]
    assert all(np.array_equal(support[0], s) for s in support)
    assert np.allclose(mean, 2 / 3 * sent[0])


def test_topk_ratio_one_is_exact(grad):
    c = parse_compressor("topk:1")
    assert np.array_equal(c.decompress(c.compress(grad), grad.shape), grad)


@pytest.mark.parametrize("spec, rel", [("fp16", 2.0**-11), ("bf16", 2.0**-8)])
def test_16_bit_round_trip_within_half_an_ulp(spec, rel, grad):
    c = parse_compressor(spec)
    x = grad / np.abs(grad).max()  # keep fp16 in its normal range
    x = x[np.abs(x) > 1e-4]
    y = c.decompress(c.compress(x), x.shape)
    assert np.all(np.abs(y - x) <= rel * np.abs(x))


def test_bf16_rounds_to_nearest_even():
    one, ulp = 1.0, 2.0**-7  # bf16 keeps 7 mantissa bits
    x = np.array(
        [one + ulp / 2, one + 1.5 * ulp, one + 0.51 * ulp, -(one + 1.5 * ulp), np.inf, np.nan],
        np.float32,
    )
    c = parse_compressor("bf16")
    y = c.decompress(c.compress(x), x.shape)
    assert y[0] == one  # tie: down to the even mantissa ...0
    assert y[1] == one + 2 * ulp  # tie: up to the even mantissa ...10
    assert y[2] == one + ulp  # above the tie: up
    assert y[3] == -(one + 2 * ulp)
    assert y[4] == np.inf and np.isnan(y[5])
    big = np.array([np.finfo(np.float32).max], np.float32)
    assert c.decompress(c.compress(big), (1,))[0] == np.inf  # rounds past bf16's max


def test_int8_error_at_most_half_a_step_per_chunk(grad):
    c = parse_compressor("int8")
    x = grad.reshape(-1)
    y = c.decompress(c.compress(x), x.shape)
    for start in range(0, x.size, INT8_CHUNK):
        chunk = slice(start, start + INT8_CHUNK)
        step = np.abs(x[chunk]).max() / 127
        assert np.abs(y[chunk] - x[chunk]).max() <= step / 2 * (1 + 1e-5)


def _low_rank_matrix(n=40, m=60, seed=0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((m, n)))
    s = 2.0 ** -np.arange(n)  # decaying spectrum
    return ((u * s) @ v.T).astype(np.float32), s


def test_powersgd_error_decreases_with_rank():
    mat, _ = _low_rank_matrix()
    deltas = [measure(f"powersgd:{r}", mat, repeats=1)["delta"] for r in (1, 2, 4, 8, 16)]
    assert all(a < b for a, b in zip(deltas, deltas[1:], strict=False))


def test_powersgd_full_rank_reconstructs_exactly():
    mat, _ = _low_rank_matrix(n=30, m=50)
    for r in (30, 64):  # rank >= min(n, m)
        c = parse_compressor(f"powersgd:{r}")
        out = c.decompress(c.compress(mat), mat.shape)
        assert np.allclose(out, mat, atol=1e-5)


def test_powersgd_warm_start_converges_to_the_best_rank_r():
    mat, s = _low_rank_matrix()
    r = 3
    best = np.sum(s[r:] ** 2)  # Eckart-Young: the tail of the spectrum
    c = parse_compressor(f"powersgd:{r}")
    for _ in range(10):  # each round is one more power iteration on the same matrix
        mean, _ = c.exchange([mat])
    assert np.sum((mean - mat) ** 2) == pytest.approx(best, rel=0.05)


def test_powersgd_workers_share_p_and_average_q():
    mats = [_low_rank_matrix(seed=s)[0] for s in (1, 2)]
    c = parse_compressor("powersgd:2")
    mean, sent = c.exchange(mats)
    assert np.allclose(mean, (sent[0] + sent[1]) / 2, atol=1e-6)  # P Q^T is linear in Q


@pytest.mark.parametrize("spec", ALL)
def test_error_feedback_loses_nothing(spec):
    grads = synthetic_gradients([(30, 40)] * 12, seed=3)
    ef = ErrorFeedback(spec)
    sent = sum(ef.step(7, g) for g in grads)
    produced = np.sum(grads, axis=0)
    tol = 1e-5 * np.abs(produced).max()
    assert np.allclose(sent + ef.residuals[(7, 0)], produced, rtol=1e-5, atol=tol)


def test_error_feedback_keeps_a_residual_per_worker_and_bucket():
    ef = ErrorFeedback("topk:0.1")
    g = synthetic_gradients([(20, 20), (20, 20)], seed=4)
    ef.exchange(0, g)
    ef.exchange(1, g[::-1])
    assert set(ef.residuals) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert np.array_equal(ef.residuals[(0, 0)], ef.residuals[(1, 1)])


@pytest.mark.parametrize(
    "spec, op",
    [
        ("none", "all-reduce"),
        ("fp16", "all-reduce"),
        ("bf16", "all-reduce"),
        ("int8", "all-reduce"),
        ("powersgd:4", "all-reduce"),
        ("randomk:0.05", "all-reduce"),  # shared seed: same indices on every worker
        ("topk:0.05", "all-gather"),
        ("topk:0.05+int8", "all-gather"),
        ("sign", "all-gather"),
    ],
)
def test_collective_choice(spec, op):
    assert collective(spec) == op


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("none", [("all-reduce", 40_000)]),
        ("fp16", [("all-reduce", 20_000)]),
        ("int8", [("all-to-all", 10_020), ("all-gather", 10_020)]),  # ZeRO++ qgZ
        ("randomk:0.05", [("all-reduce", 2000)]),
        ("randomk:0.05+int8", [("all-to-all", 504), ("all-gather", 504)]),
        ("powersgd:4", [("all-reduce", 100 * 4 * 4), ("all-reduce", 100 * 4 * 4)]),
        ("topk:0.05", [("all-gather", 8 * 4000)]),  # output = N x (500 pairs x 8 bytes)
        ("sign", [("all-gather", 8 * 1254)]),
    ],
)
def test_bucket_collectives_by_hand(spec, expected):
    assert bucket_collectives(spec, 40_000, 8) == expected


@pytest.mark.parametrize("spec", ["topk:0.01", "topk:0.01+int8", "sign"])
def test_all_gather_bytes_grow_with_workers_all_reduce_do_not(spec):
    per_rank = parse_compressor(spec).wire_bytes(2**20)
    for n in (2, 8, 64):
        assert bucket_collectives(spec, 4 * 2**20, n) == [("all-gather", n * per_rank)]
    assert bucket_collectives("fp16", 4 * 2**20, 2) == bucket_collectives("fp16", 4 * 2**20, 64)


@pytest.mark.parametrize("spec", ALL)
def test_group_cost_prices_every_collective(spec, nvswitch_node):
    group = GroupCost(nvswitch_node, np.arange(8))
    for op, size in bucket_collectives(spec, 25 * 2**20, 8):
        assert op in ALGORITHMS
        assert group.time(op, "auto", size)[0] > 0


def test_sparse_all_gather_costs_more_than_fp16_at_scale(nvswitch_node):
    # topk:0.1 sends 0.8 bytes/element per rank and each rank receives all 8 payloads
    # (6.4 bytes/element), more than fp16's ring all-reduce moves (2 x 2 x 7/8 = 3.5)
    group = GroupCost(nvswitch_node, np.arange(8))
    t = {
        s: sum(group.time(op, "auto", b)[0] for op, b in bucket_collectives(s, 2**26, 8))
        for s in ("fp16", "topk:0.1", "topk:0.001")
    }
    assert t["topk:0.001"] < t["fp16"] < t["topk:0.1"]


H100 = gpu("h100")
BW, TF32 = 2970e9, 989e12 / 2  # BabelStream Triad on H100 (catalog), TF32 = half BF16
N = 2**20


@pytest.mark.parametrize(
    "spec, workers, enc_bytes, dec_bytes, enc_flops, dec_flops",
    [
        ("none", 8, 0, 0, 0, 0),
        ("fp16", 8, 6 * N, 6 * N, 0, 0),  # read 4 + write 2; read 2 + write 4
        # absmax pass 4, quantise 4 + 1, 512 scales; qgZ: read N shards, write own, dequant
        ("int8", 8, 9 * N + 2048, (N + 2048) * (1 + 1 / 8) + N + 2048 + 4 * N, 0, 0),
        # k = 10486: 4 radix passes + gather pass over fp32, write pairs; decode: zero-fill,
        # read 8 workers' pairs, scatter-add 8k pairs (one 32 B sector read + written each)
        ("topk:0.01", 8, 5 * 4 * N + 8 * 10486, 4 * N + 8 * 8 * 10486 + 8 * 10486 * 64, 0, 0),
        # k = 104858: 8k sector updates exceed a full read + write of the output (8 N)
        ("topk:0.1", 8, 20 * N + 8 * 104858, 4 * N + 8 * 8 * 104858 + 8 * N, 0, 0),
        ("topk:0.001", 2, 20 * N + 8 * 1049, 4 * N + 2 * 8 * 1049 + 2 * 1049 * 64, 0, 0),
        # random-k: gather one sector per value, write values; zero-fill, read, scatter
        ("randomk:0.01", 8, 10486 * 32 + 4 * 10486, 4 * N + 4 * 10486 + 10486 * 64, 0, 0),
        # 1024 x 1024 view, r = 4: two reads of M + P, Q twice; decode writes M
        (
            "powersgd:4",
            8,
            8 * N + 2 * 4 * 2048 * 4,
            4 * 2048 * 4 + 4 * N,
            2 * 2 * N * 4,
            2 * N * 4,
        ),
        ("sign", 8, 8 * N + N / 8 + 4, 8 * (N / 8 + 4) + 4 * N, 0, 0),  # L1 pass, pack pass
    ],
)
def test_encode_decode_seconds_by_hand(spec, workers, enc_bytes, dec_bytes, enc_flops, dec_flops):
    enc, dec = encode_decode_seconds(spec, N, H100, workers)
    assert enc == pytest.approx(enc_bytes / BW + enc_flops / TF32)
    assert dec == pytest.approx(dec_bytes / BW + dec_flops / TF32)


def test_error_feedback_adds_two_fused_passes():
    plain = encode_decode_seconds("topk:0.01", N, H100, 8)
    ef = encode_decode_seconds("topk:0.01", N, H100, 8, error_feedback=True)
    assert ef[0] - plain[0] == pytest.approx(20 * N / BW)  # (8 + 4) + (4 + 4) bytes/elt
    assert ef[1] == plain[1]


def test_measure_reports_the_fields(grad):
    m = measure("topk:0.05+int8", grad, repeats=2)
    assert m["compressor"] == "topk:0.05+int8"
    assert m["wire_ratio"] == pytest.approx((500 * 5 + 4) / 40_000)
    assert 0 < m["delta"] < 1
    assert m["encode_s_per_MB"] > 0 and m["decode_s_per_MB"] > 0


def test_synthetic_gradients_are_heavy_tailed():
    (g,) = synthetic_gradients([(256, 256)], seed=0)
    x = g.reshape(-1) / g.std()
    kurtosis = np.mean(x**4)
    assert g.dtype == np.float32 and kurtosis > 6  # a Gaussian's is 3
    assert math.isfinite(float(g.sum()))


def test_powersgd_bucket_as_torchs_per_tensor_hook():
    # a 384 x 384 weight and its bias, a 1536 x 384 weight, a 3 x 5 matrix too small to gain
    # 2x at rank 1, a layer norm's 384: at rank 1 the Ps hold 384 + 1536 rows, the Qs
    # 384 + 384, and the bias, 3 x 5 and layer norm go uncompressed first
    shapes = [(384, 384), (384,), (1536, 384), (3, 5), (384,)]
    plan = parse_compressor("powersgd:1").tensor_collectives(shapes, 8)
    assert plan == [
        ("all-reduce", 4 * (384 + 15 + 384)),
        ("all-reduce", 4 * (384 + 1536)),
        ("all-reduce", 4 * (384 + 384)),
    ]
    # other compressors see the bucket as one flat vector
    n = sum(int(np.prod(s)) for s in shapes)
    assert parse_compressor("fp16").tensor_collectives(shapes, 8) == [("all-reduce", 2 * n)]


@pytest.mark.torch
def test_powersgd_compresses_what_torchs_hook_compresses():
    # the decision against torch's own rule (powerSGD_hook._should_compress, default rate 2)
    hook = pytest.importorskip("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook")
    rng = np.random.default_rng(0)
    for _ in range(200):
        shape = tuple(int(x) for x in rng.integers(1, 64, rng.integers(1, 4)))
        rank = int(rng.integers(1, 9))
        n, m = shape[0], int(np.prod(shape[1:]))
        plain, ps, qs = (
            b for _, b in parse_compressor(f"powersgd:{rank}").tensor_collectives([shape], 2)
        )
        torch_says = hook._should_compress(n, m, min(n, m, rank), 2)[0]
        assert (plain == 0) == torch_says, (shape, rank)
        assert ps == (4 * n * min(n, m, rank) if torch_says else 0)
