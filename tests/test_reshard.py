"""FSDP's reshard_after_forward: the gathers a unit's backward keeps or drops and the memory
the kept units hold. Checked by hand on a stub fabric, against a replay of the units'
schedule (which units are gathered when), against ZeRO-2's weights (what the kept units hold
at the peak), and true against today's formula."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec, SpecError
from commsim.step.fsdp import fsdp_per_micro_batch
from commsim.step.layouts import RESHARDS, Layouts
from commsim.step.memory import ParallelLayout, memory_per_gpu
from commsim.step.shape import Shape
from commsim.workload.model import Layer, Workload
from commsim.workload.presets import build_workload

# a stub fabric: all-gather 1 ms + 1 ns a byte, reduce-scatter 2 ms + 2 ns a byte
AG, RS = (1e-3, 1e-9), (2e-3, 2e-9)
ALWAYS, NEVER, ALL_BUT_LAST = (RESHARDS.index(v) for v in (True, False, "all-but-last"))


class _Groups:
    def price(self, op, kind, L, nbytes):
        a, b = AG if op == "all-gather" else RS
        return a + b * np.broadcast_to(np.asarray(nbytes, dtype=float), L.dp.shape)


def _stub(blocks: int):
    """`blocks` blocks of 250,000 parameters, a 300,000-parameter embedding and a norm of
    10; compute priced at one efficiency (no contention beside the units)."""
    block = Layer("block.0", (200_000, 50_000), 1.0, ("tp", ""))
    layers = [Layer("embedding", (300_000,), 0.0, ("tp",))]
    layers += [Layer(f"block.{i}", block.tensors, 1.0, block.shards) for i in range(blocks)]
    layers += [Layer("final_norm", (10,), 0.0, ("",))]
    w = Workload("stub", tuple(layers), 8, heads=2, hidden=4)
    return SimpleNamespace(
        workload=w,
        shape=Shape.of(w),
        groups=_Groups(),
        efficiency=0.5,
        gpu=SimpleNamespace(stream_bandwidth=1e12),
    )


def _priced(blocks, reshard, overlap, f=1e-3, b=2e-3, fsdp_states=False):
    """(network, exposed) seconds a micro-batch of the stub at 4 ranks, fp16 gradients, its
    shards DeepSpeed's (states zero) or PyTorch FSDP's (`fsdp_states`)."""
    L = Layouts.build(
        zero=3, dp=4, grad_dtype=1, reshard=reshard, overlap=overlap, fsdp_states=fsdp_states
    )
    n = len(L)
    c = SimpleNamespace(blocks=np.full(n, float(blocks)), block_fwd=np.full(n, f))
    c.block_bwd = np.full(n, b)
    return fsdp_per_micro_batch(_stub(blocks), L, c)


# a unit's gather 1 ms + 500 kB (1.5 ms), its reduce-scatter 2 ms + 1 ms (3 ms), the end
# layers' gather 1 ms + 600,020 B (1.60002 ms)
G, R, E = 1.5e-3, 3e-3, 1.60002e-3


def test_gathers_counted_by_hand():
    """Two blocks, nothing overlapped: true gathers both units and the end layers in each
    pass (4 G + 2 E + 2 R = 15.20004 ms); all-but-last the forward's three, the first block
    alone in the backward (3 G + E + 2 R = 12.10002 ms); false the forward's (2 G + E +
    2 R = 10.60002 ms)."""
    net, exposed = _priced(2, [ALWAYS, ALL_BUT_LAST, NEVER], False)
    want = [4 * G + 2 * E + 2 * R, 3 * G + E + 2 * R, 2 * G + E + 2 * R]
    assert net == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx([15.20004e-3, 12.10002e-3, 10.60002e-3], rel=1e-12)
    np.testing.assert_array_equal(exposed, net)


def test_overlapped_by_hand():
    """Two blocks of 1 ms forward, 2 ms backward, prefetched: true exposes the first gather
    of each pass (2 x 3.10002 ms), the second unit's gather beyond the forward (0.5 ms) and
    its gather and its neighbour's reduce-scatter beyond the backward (2.5 ms), the last
    reduce-scatter (3 ms): 12.20004 ms. all-but-last: the backward starts on the kept
    block, 9.10002 ms. false: no backward gathers, the reduce-scatter 1 ms beyond a
    backward: 7.60002 ms."""
    _, exposed = _priced(2, [ALWAYS, ALL_BUT_LAST, NEVER], True)
    assert exposed == pytest.approx([12.20004e-3, 9.10002e-3, 7.60002e-3], rel=1e-12)


@pytest.mark.parametrize("blocks", [1, 2, 5])
def test_true_is_the_formula_before(blocks):
    """reshard_after_forward true prices what step.fsdp priced before it existed:
    k (2 g + r) + 2 (g_first - g) on the network; 2 g_first + (k - 1) (max(0, g - f) +
    max(0, g + r - b)) + r exposed."""
    net, exposed = _priced(blocks, [ALWAYS, ALWAYS], [False, True])
    k, first = blocks, G + E
    assert net[0] == pytest.approx(k * (2 * G + R) + 2 * E, rel=1e-12)
    hidden = 2 * first + (k - 1) * (max(0.0, G - 1e-3) + max(0.0, G + R - 2e-3)) + R
    assert exposed[1] == pytest.approx(min(hidden, net[0]), rel=1e-12)


def _replay(blocks: int, policy, root_kept=False) -> tuple[float, int]:
    """(network seconds, most blocks held gathered) of one micro-batch replayed unit by
    unit, the rules as FSDP runs them: a unit not held is gathered before it computes; after
    its forward it is freed if its policy reshards (all-but-last: every block but the last;
    the root, the end layers, resharded under true only, and never where `root_kept`, as
    PyTorch's FSDP runs it); after its backward it is freed and its gradient
    reduce-scattered."""
    reshards = {
        True: lambda i: True,
        False: lambda i: False,
        "all-but-last": lambda i: i < blocks - 1,
    }[policy]
    held, network, most = set(), 0.0, 0

    def need(unit):
        nonlocal network
        if unit not in held:
            network += E if unit == "root" else G
            held.add(unit)

    need("root")  # the root's forward opens the pass: the embedding
    for i in range(blocks):
        need(i)
        most = max(most, len(held - {"root"}))
        if reshards(i):
            held.discard(i)
    if policy is True and not root_kept:
        held.discard("root")
    need("root")  # the head's backward opens the backward pass
    for i in reversed(range(blocks)):
        need(i)
        most = max(most, len(held - {"root"}))
        held.discard(i)
        network += R
    return network, most


@pytest.mark.parametrize("blocks", [1, 2, 3, 8])
def test_against_a_replay_of_the_units(blocks):
    """The network seconds of each policy equal a unit-by-unit replay's; false holds every
    block gathered at once at the peak, the others never more than one (the buffers' two,
    computing and prefetching, step.memory)."""
    policies = [True, "all-but-last", False]
    net, _ = _priced(blocks, [RESHARDS.index(p) for p in policies], False)
    replays = [_replay(blocks, p) for p in policies]
    assert net == pytest.approx([seconds for seconds, _ in replays], rel=1e-12)
    assert [most for _, most in replays] == [1, 1, blocks]


def test_pytorch_fsdp_keeps_the_root_by_hand():
    """PyTorch's FSDP (states fsdp) never reshards the root, the end layers, after the
    forward: under true two blocks cost 4 G + E + 2 R = 13.60002 ms unoverlapped (DeepSpeed's
    states, 15.20004 ms, gather them again), and overlapped the backward's first gather is
    the block's alone: 12.20004 - 1.60002 = 10.60002 ms. all-but-last and false as before."""
    policies = [ALWAYS, ALL_BUT_LAST, NEVER]
    net, _ = _priced(2, policies, False, fsdp_states=True)
    assert net == pytest.approx([4 * G + E + 2 * R, 3 * G + E + 2 * R, 2 * G + E + 2 * R])
    assert net[0] == pytest.approx(13.60002e-3, rel=1e-12)
    _, exposed = _priced(2, policies, True, fsdp_states=True)
    assert exposed == pytest.approx([10.60002e-3, 9.10002e-3, 7.60002e-3], rel=1e-12)


@pytest.mark.parametrize("blocks", [1, 2, 3, 8])
def test_pytorch_fsdp_against_a_replay(blocks):
    """PyTorch FSDP's network seconds equal a replay whose root is never resharded."""
    policies = [True, "all-but-last", False]
    net, _ = _priced(blocks, [RESHARDS.index(p) for p in policies], False, fsdp_states=True)
    replays = [_replay(blocks, p, root_kept=True)[0] for p in policies]
    assert net == pytest.approx(replays, rel=1e-12)


TOY = ModelSpec(name="toy", layers=6, hidden=1024, heads=8, vocab=32000, seq_len=512)


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_kept_units_hold_zero2s_weights(micro_batches):
    """reshard_after_forward false holds every unit and the end layers gathered between the
    passes: beside the ZeRO-3 shards and one unit's gradient its gathered bf16 parameters
    are ZeRO-2's whole bf16 weights (2 bytes a parameter), whatever the micro-batches
    (they run one after another, the units gathered once for all of them)."""
    w = build_workload(TOY)
    kw = dict(dp=8, micro_batch=1, micro_batches=micro_batches, grad_bytes=2)
    never = memory_per_gpu(w, ParallelLayout(zero=3, reshard=NEVER, **kw))
    always = memory_per_gpu(w, ParallelLayout(zero=3, **kw))
    zero2 = memory_per_gpu(w, ParallelLayout(zero=2, **kw))
    # ZeRO-3's buffers: (2 + 2 + grad) x the largest layer: two gathered, one gradient
    largest = always.buffers / (2 + 2 + 2)
    assert never.buffers - 2 * largest == pytest.approx(zero2.params, rel=1e-12)
    assert zero2.params == pytest.approx(2 * w.layer_params.sum(), rel=1e-12)
    for part in ("params", "grads", "optimizer", "activations"):
        assert getattr(never, part) == getattr(always, part)


def test_pytorch_fsdp_holds_the_root_through_the_backward():
    """PyTorch's FSDP keeps the root's end layers (the embedding, the final norm, the head)
    gathered from the forward through the backward: at a block's backward they are held
    beside the two units gathered (computing, prefetching), bf16, where the buffers counted
    two of the largest layer (here a block); false (every unit kept) as before."""
    w = build_workload(TOY.model_copy(update=dict(hidden=4096, heads=32, layers=2)))
    sizes = dict(zip((layer.name for layer in w.layers), w.layer_params, strict=True))
    block = sizes["block.0"]
    ends = sum(n for name, n in sizes.items() if not name.startswith("block."))
    largest = max(sizes.values())
    assert largest == block > ends
    kw = dict(dp=8, micro_batch=1, zero=3)
    for reshard, extra in ((ALWAYS, 2 * ends), (ALL_BUT_LAST, 2 * ends), (NEVER, 0.0)):
        pytorch, deepspeed = (
            memory_per_gpu(w, ParallelLayout(fsdp_states=s, reshard=reshard, **kw))
            for s in (True, False)
        )
        assert pytorch.buffers - deepspeed.buffers == pytest.approx(extra, rel=1e-12)


def test_all_but_last_holds_what_true_holds():
    w = build_workload(TOY)
    layouts = [ParallelLayout(dp=8, zero=3, micro_batch=1, reshard=r) for r in (0, 2)]
    assert memory_per_gpu(w, layouts[0]) == memory_per_gpu(w, layouts[1])


def _setup(**strategy):
    fields = dict(model=TOY, cluster="dgx-a100-ib", gpus=16, global_batch=32, seq_len=512)
    spec, src = load_scenario(None, {"zero": 3} | fields | strategy)
    return resolve(spec, src)


@pytest.mark.parametrize(
    "strategy, problem",
    [
        ({"reshard_after_forward": 8}, "resharding to a smaller group is not priced"),
        ({"reshard_after_forward": False, "zero": 2}, "applies to FSDP units"),
        ({"reshard_after_forward": False, "zero3_issue": "parameter"}, "applies to FSDP"),
        ({"reshard_after_forward": "all-but-last", "pp": 2}, "pipeline schedule decides"),
    ],
)
def test_refused_where_not_priced(strategy, problem):
    with pytest.raises(SpecError, match=problem) as e:
        _setup(**strategy)
    assert e.value.field == "strategy.reshard_after_forward"


def test_predict_false_is_faster_and_heavier():
    """On 16 A100s (two nodes) the toy's ZeRO-3 without the backward gathers runs faster and
    holds more; its strategy comes back as given."""
    from commsim.step.predict import predict

    kept, freed = (predict(_setup(reshard_after_forward=v)) for v in (False, True))
    assert kept.step_time_s < freed.step_time_s
    assert kept.memory.total > freed.memory.total


def test_search_adds_false_where_it_applies_and_a_pin_holds_it():
    """The planner prices each ZeRO-3 single-stage layout with its units resharded (the
    stack's) and kept; every other layout as before; a pin of false keeps those rows only."""
    from commsim.planner.search import enumerate_layouts

    setup = _setup()
    L = enumerate_layouts(setup)
    fsdp = (L.zero == 3) & (L.pp == 1)
    assert fsdp.any() and (~fsdp).any()
    assert set(L.reshard[fsdp].tolist()) == {ALWAYS, NEVER}
    assert (L.reshard[~fsdp] == ALWAYS).all()
    assert (L.reshard == NEVER).sum() == (fsdp & (L.reshard == ALWAYS)).sum()
    pinned = enumerate_layouts(setup, {"reshard_after_forward": False})
    assert len(pinned) == (L.reshard == NEVER).sum()
    assert (pinned.zero == 3).all() and (pinned.pp == 1).all() and (pinned.reshard == NEVER).all()
    assert pinned.strategy(0, setup.scenario.strategy).reshard_after_forward is False


def test_labels():
    from commsim.report.labels import layout_label, reshard_label
    from commsim.specs import Strategy

    def label(value):
        s = Strategy(zero=3, reshard_after_forward=value).model_dump()
        return layout_label({"strategy": s, "layout": {"dp": 8, "micro_batch": 1}})

    assert [label(v) for v in (True, False, "all-but-last")] == [
        "dp8 z3 mb1",
        "dp8 z3nr mb1",
        "dp8 z3nl mb1",
    ]
    assert reshard_label({"reshard_after_forward": False}) == "units kept from forward to backward"
