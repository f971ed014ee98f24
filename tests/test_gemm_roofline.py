"""A GEMM's time is its math over the SMs its tiles keep busy plus its output's write through
HBM (step.gemm): by hand, against the measured best GEMM its math rate comes from, and against
an independent table of measured H100 GEMMs."""

import numpy as np
import pytest

from commsim import catalog
from commsim.catalog import _math_share
from commsim.step.gemm import Rates, gemm_seconds

H100 = catalog.GPUS["h100"]

# OpenXLA's measured H100 (sm_90) BF16 GEMMs, TFLOP/s of b x (m x k) @ (k x n)
# (openxla/xla, xla/service/gpu/model/matmul_interpolator_data.h, kDefaultMatmulPTable, as
# vendored in tensorflow/tensorflow third_party/xla at 372d578b): every entry of at least 30
# GFLOP (a kernel of 40 us or more, where a few microseconds of launch are no part of it),
# and the m = n = 4096 sweep of K.
XLA_SM90 = [
    # b, m, n, k, TFLOP/s
    (1, 4096, 4096, 4096, 783.3),
    (2, 4096, 4096, 4096, 807.7),
    (4, 4096, 4096, 4096, 793.1),
    (1, 4096, 4096, 2048, 738.7),
    (2, 4096, 4096, 2048, 763.0),
    (1, 4096, 4096, 1024, 677.4),
    (2, 4096, 4096, 1024, 693.0),
    (1, 4096, 2048, 4096, 758.4),
    (1, 2048, 4096, 4096, 753.6),
    (2, 2048, 4096, 4096, 779.3),
    (4, 2048, 4096, 4096, 801.9),
    (4, 4096, 2048, 4096, 808.7),
    (1, 4096, 1024, 4096, 738.5),
    (1, 1024, 4096, 4096, 738.5),
    (1, 2048, 2048, 4096, 738.0),
    (1, 4096, 2048, 2048, 716.1),
    (1, 2048, 4096, 2048, 715.4),
    (1, 4096, 4096, 512, 543.1),
    (1, 4096, 4096, 256, 392.2),
]


def _tflops(b, m, n, k, write):
    rates = Rates.of(H100)
    t = gemm_seconds(m, n, k, rates.gemm, rates.sms, b, b, write=write)
    return 2 * b * m * n * k / float(t) / 1e12


def test_a_gemm_is_its_math_then_its_output_by_hand():
    # 12 x 11 = 132 tiles of 256 x 128 on 132 SMs: one full wave; 2 x 3072 x 1408 x 8192
    # FLOPs at 1e15, then 3072 x 1408 outputs at 2 bytes over 3e12 bytes/s
    m, n, k = 3072, 1408, 8192
    t = gemm_seconds(m, n, k, 1e15, 132, write=2 / 3e12)
    assert float(t) == pytest.approx(2 * m * n * k / 1e15 + m * n * 2 / 3e12)


def test_the_math_rate_gives_back_the_measured_best_gemm_at_its_shape():
    # the catalog's H100 math rate, its MAMF's output written: 792.1 TFLOP/s at 6144 x
    # 17,920 x 2,816 (its tiles a whole number of waves: 24 x 140 = 3,360 on 132 SMs would
    # be 25.45 of them, so the check runs on 3,360 SMs' worth at once, one wave)
    rates = Rates.of(H100)
    m, n, k = 6144, 17920, 2816
    t = gemm_seconds(m, n, k, rates.gemm, 3360, write=2 / 2.97e12)
    assert 2 * m * n * k / float(t) == pytest.approx(792.1e12)
    assert rates.gemm == pytest.approx(_math_share(792.1, (m, n, k), 2, 2.97, 989) * 989e12)
    assert 792.1e12 < rates.gemm < 989e12


def test_measured_h100_gemms_follow_math_plus_output():
    """Independent check: the model (MAMF and its shape, BabelStream's bandwidth, no figure
    from this table) against OpenXLA's measurements, median within 3%, every entry within
    8%; without the output's write the K sweep is off by up to 96%."""
    err = np.array(
        [_tflops(b, m, n, k, 2 / H100.stream_bandwidth) / t - 1 for b, m, n, k, t in XLA_SM90]
    )
    assert np.median(np.abs(err)) < 0.03
    assert np.abs(err).max() < 0.08
    sweep = [(b, m, n, k, t) for b, m, n, k, t in XLA_SM90 if b == 1 and m == n == 4096]
    assert [k for *_, k, _ in sweep] == [4096, 2048, 1024, 512, 256]
    for b, m, n, k, t in sweep:  # the fall with K is the output's write
        assert _tflops(b, m, n, k, 2 / H100.stream_bandwidth) == pytest.approx(t, rel=0.03)
    without = [_tflops(b, m, n, k, 0.0) / t - 1 for b, m, n, k, t in sweep]
    assert max(without) > 0.9
