"""Expert all-to-alls under another micro-batch's compute (`ep_overlap`): what shows is what
outlasts a micro-batch's forward and backward, with two micro-batches or more."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.planner.search import enumerate_layouts, search
from commsim.scenario import load_scenario, resolve
from commsim.specs import SpecError
from commsim.step.predict import predict, step_model, strategy_layouts

MIXTRAL = dict(model="mixtral-8x7b", cluster="dgx-h100-ib", gpus=64, global_batch=64)


def _setup(**fields):
    sc, src = load_scenario(None, MIXTRAL | {"seq_len": 4096, "ep": 8, "tp": 2, "pp": 4} | fields)
    return resolve(sc, src)


def _parts(setup):
    model = step_model(setup)
    L = strategy_layouts(setup, [setup.scenario.strategy])
    return model.evaluate(L).row(0), model.compute(L), model._expert_parallel(L, model.compute(L))


def test_what_outlasts_a_micro_batchs_compute_shows():
    """By hand from the model's own parts: off, every all-to-all shows; on, max(all-to-alls -
    (forward + backward), 0) a micro-batch, split as the all-to-alls are (the etp gathers,
    none at etp 1 here, are not hidden)."""
    off, c, (f_off, b_off) = _parts(_setup(etp=1))
    on, _, (f_on, b_on) = _parts(_setup(etp=1, ep_overlap=True))
    both = float(f_off[0] + b_off[0])
    shown = max(both - float(c.forward[0] + c.backward[0]), 0.0)
    assert float(f_on[0] + b_on[0]) == pytest.approx(shown, abs=1e-15)
    if shown:
        assert float(f_on[0] / b_on[0]) == pytest.approx(float(f_off[0] / b_off[0]))
    assert on["step"] < off["step"] and on["ep_comm"] < off["ep_comm"]


def test_a_slow_network_shows_the_excess_and_one_micro_batch_hides_nothing():
    # ep 8 spread over nodes 10 Gb/s apart
    across = dict(etp=1, tp=1, pp=1, cluster="ethernet-10g", placement="interleaved")
    across |= dict(global_batch=256)  # 4 micro-batches a rank
    _, c, (f, b) = _parts(_setup(**across, ep_overlap=True))
    plain = _parts(_setup(**across))[2]
    both = float(plain[0][0] + plain[1][0])
    assert both > float(c.forward[0] + c.backward[0])  # the network outlasts the compute
    assert float(f[0] + b[0]) == pytest.approx(both - float(c.forward[0] + c.backward[0]))
    one = dict(etp=1, pp=1, tp=1)  # dp 64: one micro-batch a rank
    alone = _parts(_setup(**one))[2]
    overlapped = _parts(_setup(**one, ep_overlap=True))[2]
    assert np.allclose(np.ravel(alone), np.ravel(overlapped))


def test_search_and_predict_agree_and_dense_models_refuse_it():
    setup = _setup(ep_overlap=True)
    layouts = enumerate_layouts(setup, {"ep": 8})
    found = search(step_model(setup), layouts)
    for k, i in list(enumerate(found.fitting))[:: max(1, len(found.fitting) // 12)]:
        strategy = layouts.strategy(int(i), setup.scenario.strategy)
        assert strategy.ep_overlap
        sc = setup.scenario.model_copy(update={"micro_batch": int(layouts.micro_batch[i])})
        variant = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
        assert predict(variant, strategy).step_time_s == pytest.approx(
            float(found.breakdown.step[k]), rel=1e-9
        )
    with pytest.raises(SpecError, match="strategy.ep_overlap"):
        sc, src = load_scenario(None, {"model": "llama2-7b", "gpus": 8, "ep_overlap": True})
        resolve(sc, src)
