"""One model of the step: `predict`, the search and the detailed timeline give one figure.

The search prices thousands of layouts in one vectorised pass; `predict` prices one; the
per-bucket timeline (timeline.schedule_streams) lays a plain-DDP step out event by event,
and sync.Tail is that schedule in closed form. All four must agree.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_ddp_layers

from commsim.planner.search import COMPRESSIONS, enumerate_layouts, search
from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec
from commsim.step.contention import contended_tail
from commsim.step.predict import layouts_timeline, predict, step_model, strategy_layouts
from commsim.step.sync import BucketCosts, tail_of_leads, upper_envelope
from commsim.step.timeline import schedule_streams

TOY = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)
TOY_MOE = TOY.model_copy(update={"name": "toy-moe", "experts": 4, "top_k": 2})


def _setup(model, cluster="dgx-a100-ib", gpus=32, global_batch=64):
    seq_len = model.seq_len if isinstance(model, ModelSpec) else 1024
    fields = dict(model=model, cluster=cluster, gpus=gpus, global_batch=global_batch)
    sc, src = load_scenario(None, fields | {"seq_len": seq_len})
    return resolve(sc, src, check=False)


def _draw(layouts, pool, rng, count):
    """`count` layouts of `pool`: every compressor at least once on plain DDP, overlap on and
    off, the rest drawn at random."""
    plain = pool[layouts.plain[pool]]
    picks = []
    for code in range(len(layouts.compressions)):
        for overlap in (True, False):
            mine = plain[(layouts.compression[plain] == code) & (layouts.overlap[plain] == overlap)]
            picks.append(int(rng.choice(mine)))
    rest = np.setdiff1d(pool, picks)
    picks += rng.choice(rest, size=count - len(picks), replace=False).tolist()
    return picks


@pytest.mark.parametrize(
    "model,cluster,gpus,batch",
    [
        (TOY, "dgx-a100-ib", 32, 64),
        (TOY_MOE, "dgx-h100-ib", 32, 64),
        ("gpt2-xl", "aws-p4d", 64, 512),
    ],
)
def test_predict_and_the_search_agree_on_random_strategies(model, cluster, gpus, batch):
    setup = _setup(model, cluster, gpus, batch)
    layouts = enumerate_layouts(setup)
    assert set(layouts.compressions) == set(COMPRESSIONS)
    found = search(step_model(setup), layouts)
    rng = np.random.default_rng(7)
    picks = _draw(layouts, found.fitting, rng, 60)
    kinds = set()
    for i in picks:
        strategy = _agree(setup, layouts, found, i)
        kinds.add((bool(layouts.plain[i]), strategy.compression, strategy.overlap))
    assert any(not plain for plain, _, _ in kinds)
    assert {c for plain, c, _ in kinds if plain} == set(COMPRESSIONS)


def test_predict_and_the_search_agree_where_compute_is_slowed_beside_collectives():
    # the roofline (no single efficiency) on NCCL: ZeRO 0-2 syncs, FSDP units and ep_overlap
    # priced beside their collectives (step.contention), on subsets of the layouts
    setup = _setup(TOY_MOE, "dgx-h100-ib", 32, 64)
    sc = setup.scenario.model_copy(update={"compute_efficiency": None})
    setup = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
    layouts = enumerate_layouts(setup)
    found = search(step_model(setup), layouts)
    slowed = found.fitting[found.breakdown.sync_rate < 1.0]
    fsdp = found.fitting[layouts.zero[found.fitting] == 3]
    rng = np.random.default_rng(11)
    picks = [*rng.choice(slowed, 10, replace=False), *rng.choice(fsdp, 5, replace=False)]
    picks += rng.choice(found.fitting, 5, replace=False).tolist()
    for i in picks:
        _agree(setup, layouts, found, int(i))


def _agree(setup, layouts, found, i):
    """Layout i's strategy, after checking that `predict` prices it as the search did."""
    rank = {int(j): k for k, j in enumerate(found.fitting)}  # layout -> breakdown row
    strategy = layouts.strategy(i, setup.scenario.strategy)
    sc = setup.scenario.model_copy(update={"micro_batch": int(layouts.micro_batch[i])})
    variant = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
    searched = float(found.breakdown.step[rank[i]])
    predicted = predict(variant, strategy)
    assert predicted.step_time_s == pytest.approx(searched, rel=1e-9, abs=0), strategy
    assert predicted.memory.total == pytest.approx(float(found.breakdown.memory[rank[i]]))
    return strategy


def test_the_search_places_deepspeeds_gathers_as_predict_does():
    setup = _setup("gpt2-xl", "aws-p4d", 64, 512)
    base = setup.scenario.strategy.model_copy(update={"overlap_param_gather": False})
    sc = setup.scenario.model_copy(update={"strategy": base})
    setup = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
    layouts = enumerate_layouts(setup)
    found = search(step_model(setup), layouts)
    zero12 = [int(i) for i in found.fitting if layouts.zero[i] in (1, 2) and layouts.overlap[i]]
    assert zero12 and not layouts.gather_overlap[zero12].any()
    assert layouts.gather_overlap[layouts.zero == 0].all()  # nothing to place: as predict has it
    for i in np.random.default_rng(3).choice(zero12, 8, replace=False):
        assert not _agree(setup, layouts, found, int(i)).overlap_param_gather


def test_the_detailed_timeline_is_the_models_step():
    setup = _setup("gpt2-xl", "aws-p4d", 64, 512)
    model = step_model(setup)
    layouts = enumerate_layouts(setup, {"micro_batch": 1})
    plain = np.nonzero(layouts.plain)[0]
    breakdown = model.evaluate(layouts.take(plain))
    for k in np.random.default_rng(3).choice(plain.size, size=40, replace=False):
        one = layouts.take(plain[[k]])
        report = layouts_timeline(
            setup, model, one, float(breakdown.optimizer[k]), float(breakdown.sync_rate[k])
        )
        assert report.step_time_s == pytest.approx(float(breakdown.step[k]), rel=1e-9)
        assert report.codec_s == pytest.approx(float(breakdown.codec[k]), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("seed", range(200))
def test_the_closed_form_tail_is_the_two_stream_schedule(seed):
    # random layers, tensors, buckets (in DDP's reverse order), costs, overlap, accumulation
    rng = np.random.default_rng(seed)
    fwd, bwd, tensor_layer, buckets = random_ddp_layers(rng)
    hooked = seed % 2 == 1
    t = rng.uniform(0, 3, len(buckets))
    e, d = (rng.uniform(0, 0.5, len(buckets)) * hooked for _ in range(2))
    overlap, accum = bool(rng.uniform() < 0.7), int(rng.integers(1, 4))
    # without a hook, the backward at a rate r beside the buckets (step.contention): event by
    # event against the Tail at x / r
    rate = 1.0 if hooked else float(rng.uniform(0.3, 1.0))
    report = schedule_streams(
        fwd,
        bwd,
        rng.uniform(1, 10, tensor_layer.size),
        buckets,
        lambda sizes: t,
        tensor_layer=tensor_layer,
        overlap=overlap,
        accum_steps=accum,
        optimizer_s=0.3,
        codec_time=(lambda sizes: (e, d)) if hooked else None,
        contention=rate,
    )
    suffix = np.cumsum(bwd[::-1])[::-1]
    ready = np.array([suffix[min(tensor_layer[b])] for b in buckets]) / max(suffix[0], 1e-300)
    closed = tail_of_leads(BucketCosts(t, e, d), 1.0 - ready)
    r = rate if overlap else 1.0  # off, every bucket runs after the backward
    tail = contended_tail(t.sum(), closed.at(bwd.sum() / r, overlap), r)
    step = accum * (fwd.sum() + bwd.sum()) + closed.encode + float(tail)
    rel = 1e-12 if r == 1.0 else 1e-9  # the contended schedule is walked event by event
    assert step + 0.3 == pytest.approx(report.step_time_s, rel=rel, abs=1e-12)
    bars = [ev for ev in report.events if ev.label.startswith("backward layer")]
    assert sum(ev.end_s - ev.start_s for ev in bars) >= bwd.sum() * (1 - 1e-12)


def test_upper_envelope_keeps_the_lines_that_win_for_positive_x():
    # y = -x + 5, y = -0.5x + 4, y = 1 (flat), y = -2x + 3 (never the max for x >= 0)
    slopes, intercepts = np.array([-1.0, -0.5, 0.0, -2.0]), np.array([5.0, 4.0, 1.0, 3.0])
    keep = upper_envelope(slopes, intercepts)
    assert sorted(keep.tolist()) == [0, 1, 2]
    x = np.linspace(0, 20, 401)
    full = np.max(intercepts + slopes * x[:, None], axis=1)
    kept = np.max(intercepts[keep] + slopes[keep] * x[:, None], axis=1)
    assert np.allclose(full, kept)


def test_deepspeeds_gathers_after_the_optimizer_add_their_whole_time():
    """ZeRO-1 with overlap: Megatron's --overlap-param-gather hides the parameter gathers
    under the next forward; DeepSpeed's step() runs them after the optimizer, one by one.
    The step grows by the gathers' whole network time less what the forward hid; that
    time is an all-gather of each bucket's parameters in bf16."""
    setup = _setup("gpt2-xl", "aws-p4d", 64, 512)
    strategy = setup.scenario.strategy.model_copy(update={"zero": 1, "overlap": True})
    model = step_model(setup)
    ahead = predict(setup, strategy)
    after = predict(setup, strategy.model_copy(update={"overlap_param_gather": False}))
    L = strategy_layouts(setup, [strategy])
    plan = model.dp.sync_plan(L, 0)
    assert plan.params.sum() > 0
    hidden = plan.gather.network - float(
        plan.gather.at(model.compute(L).forward[0], True)
    )  # what the next forward hid of them
    assert after.step_time_s - ahead.step_time_s == pytest.approx(hidden, rel=1e-9)
    grads = plan.buckets.bytes  # each bucket's gradients, fp32: its parameters in bf16
    assert grads.sum() / 4 == setup.workload.params
    each = model.groups.price("all-gather", "dp", L.take(np.zeros(len(grads), int)), grads / 2)
    assert plan.gather.network == pytest.approx(each.sum(), rel=1e-9)


def test_the_search_prices_the_memory_savers_as_predict_does():
    """The stack's memory savers (recompute_modules, bf16 moments, FP8 primary weights and
    activation caching) reach every searched layout as they reach predict's."""
    setup = _setup(TOY_MOE, "dgx-h100-ib", 8, 16)
    savers = dict(recompute_modules=("layernorm", "moe_act"), optimizer_moments="bf16")
    base = setup.scenario.strategy.model_copy(update=savers | dict(fp8_param=True, fp8_cache=True))
    sc = setup.scenario.model_copy(update={"strategy": base})
    setup = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
    layouts = enumerate_layouts(setup)
    found = search(step_model(setup), layouts)
    assert (layouts.moment_bytes == 2).all() and layouts.fp8[found.fitting].any()
    # the same recompute_modules (never plain DDP: no comm hooks searched), no other saver
    plain_setup = _setup(TOY_MOE, "dgx-h100-ib", 8, 16)
    modules = {"recompute_modules": savers["recompute_modules"]}
    sc = plain_setup.scenario.model_copy(
        update={"strategy": plain_setup.scenario.strategy.model_copy(update=modules)}
    )
    plain_setup = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
    plain = search(step_model(plain_setup), enumerate_layouts(plain_setup))
    assert len(plain.layouts) == len(layouts)  # the same layouts, in the same order
    assert (found.breakdown.memory < plain.breakdown.memory).all()  # bf16 moments: every one
    for i in np.random.default_rng(5).choice(found.fitting, 12, replace=False):
        strategy = _agree(setup, layouts, found, int(i))
        assert strategy.recompute_modules == ("layernorm", "moe_act")


def test_the_search_prices_dualpipe_as_predict_does():
    """A stack that runs DualPipe (the base strategy's pipeline_schedule): the search tries it
    beside 1F1B where it applies (even pp, no interleaving, an even count of micro-batches of
    at least 2 pp) and prices it, memory included, as predict does."""
    setup = _setup(TOY, "dgx-a100-ib", 32, 64)
    base = setup.scenario.strategy.model_copy(update={"pipeline_schedule": "dualpipe"})
    sc = setup.scenario.model_copy(update={"strategy": base})
    setup = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
    layouts = enumerate_layouts(setup)
    found = search(step_model(setup), layouts)
    dual = layouts.schedule == 1
    assert (
        dual.any() and (layouts.pp[dual] % 2 == 0).all() and (layouts.interleave[dual] == 1).all()
    )
    assert (layouts.micro_batches[dual] >= 2 * layouts.pp[dual]).all()
    one_f_one_b = len(enumerate_layouts(_setup(TOY, "dgx-a100-ib", 32, 64)))
    assert len(layouts) == one_f_one_b + dual.sum()  # a DualPipe copy of each such layout
    pool = [int(i) for i in found.fitting if dual[i]]
    for i in np.random.default_rng(7).choice(pool, 8, replace=False):
        assert _agree(setup, layouts, found, int(i)).pipeline_schedule == "dualpipe"
