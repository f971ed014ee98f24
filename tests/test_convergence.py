"""Convergence through compressors: the MLP's backprop is right, it learns digits, and the
orderings the literature predicts (error feedback rescues aggressive Top-K) hold."""

import numpy as np
import pytest

from commsim.convergence import (
    evaluate,
    init_params,
    load_digits_split,
    loss_and_grads,
    mlp_gradients,
    plot_curves,
    run,
    train,
)


@pytest.fixture(scope="module")
def data():
    return load_digits_split(0)


@pytest.fixture(scope="module")
def reference():
    """Uncompressed, Top-K 1% without and with error feedback, Top-K 5% + int8 with it."""
    return run(["topk:0.01", "topk:0.05+int8"], error_feedback="both", steps=300, seed=0)


def test_split_is_fixed_and_stratified(data):
    assert data.x_train.shape == (1347, 64) and data.x_test.shape == (450, 64)
    assert np.array_equal(data.x_test, load_digits_split(0).x_test)
    assert np.bincount(data.y_test).min() >= 43  # ~45 of each digit


def test_backprop_matches_finite_differences(data):
    params = [p.astype(np.float64) for p in init_params(np.random.default_rng(1))]
    x, y = data.x_train[:32].astype(np.float64), data.y_train[:32]
    _, grads = loss_and_grads(params, x, y)
    rng = np.random.default_rng(2)
    for t, p in enumerate(params):
        for i in rng.choice(p.size, 5, replace=False):
            eps = np.zeros(p.size)
            eps[i] = 1e-5
            plus = [q + (eps.reshape(p.shape) if j == t else 0) for j, q in enumerate(params)]
            minus = [q - (eps.reshape(p.shape) if j == t else 0) for j, q in enumerate(params)]
            numeric = (loss_and_grads(plus, x, y)[0] - loss_and_grads(minus, x, y)[0]) / 2e-5
            assert grads[t].reshape(-1)[i] == pytest.approx(numeric, rel=1e-3, abs=1e-6)


def test_mlp_gradients_are_the_four_tensors():
    shapes = [g.shape for g in mlp_gradients(warmup_steps=5)]
    assert shapes == [(64, 128), (128,), (128, 10), (10,)]


def test_uncompressed_learns_digits(reference):
    base = reference[0]
    assert (base.compressor, base.error_feedback) == ("none", False)
    assert base.test_accuracy > 0.9 and base.accuracy_retained == 1.0
    assert base.losses[-20:].mean() < base.losses[:20].mean() / 10
    assert base.wire_bytes_per_step == 4 * (64 * 128 + 128 + 128 * 10 + 10)


def test_runs_are_deterministic(data):
    a = train("topk:0.05", True, data, steps=20, seed=3)
    b = train("topk:0.05", True, data, steps=20, seed=3)
    assert np.array_equal(a[0], b[0])


def test_error_feedback_rescues_top_k_one_percent(reference):
    # Observed at seed 0 (300 steps, lr 0.1, momentum 0.9): without EF the last-20-step
    # training loss is ~0.10 vs ~0.03 and the test loss ~0.17 vs ~0.12. Test accuracy
    # (96.9% vs 97.3%) differs by two of 450 images, too few to test an ordering on.
    by = {(r.compressor, r.error_feedback): r for r in reference}
    plain, ef = by[("topk:0.01", False)], by[("topk:0.01", True)]
    assert ef.losses[-20:].mean() < plain.losses[-20:].mean() / 2
    assert ef.test_loss < plain.test_loss


@pytest.mark.parametrize("seed", [1, 2])
def test_error_feedback_ordering_holds_on_other_seeds(data, seed):
    # Observed on seeds 0-5: at 300 steps EF's full training loss is 3-4x lower (at 150
    # steps EF still trails: its delayed updates overshoot under momentum early on).
    losses = {}
    for ef in (False, True):
        params = train("topk:0.01", ef, data, steps=300, seed=seed)[1]
        losses[ef] = evaluate(params, data.x_train, data.y_train)[0]
    assert losses[True] < losses[False] / 2


def test_top_k_5_percent_int8_with_ef_keeps_99_2_percent_of_accuracy(reference):
    # the seed documents' claim: Top-K 5% + 8-bit + error feedback keeps 99.2% of accuracy
    by = {(r.compressor, r.error_feedback): r for r in reference}
    r = by[("topk:0.05+int8", True)]
    assert r.accuracy_retained >= 0.992
    assert r.wire_bytes_per_step < by[("none", False)].wire_bytes_per_step / 15


def test_evaluate_agrees_with_the_recorded_accuracy(reference, data):
    _, params, _ = train("none", False, data, steps=300, seed=0)
    assert evaluate(params, data.x_test, data.y_test)[1] == reference[0].test_accuracy


def test_plot_curves_writes_a_png(reference, tmp_path):
    path = tmp_path / "curves.png"
    plot_curves(reference, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
