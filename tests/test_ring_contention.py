"""Ring attention's K/V sends hold SMs: NCCL's p2p channel count (nccl.topo.p2p_channels)
by hand from NCCL's rules, a ring step's attention slowed while its transfer runs
(step.context.ring_attention with `contended`) against a time-stepped replay, and the step
model (a send's channels taken from the SMs the attention runs on)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

import commsim.step.model as step_model
from commsim import catalog
from commsim.collectives import nccl
from commsim.collectives.nccl.topo import Machine
from commsim.specs import ModelSpec
from commsim.step.contention import contended_attention, contended_compute
from commsim.step.context import ring_attention
from commsim.step.groups import _key_columns
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.workload.presets import build_workload


def _machine(cc=90, nvlink=True, links=18, per_link=20.6, nics=8):
    return Machine(
        cc=cc,
        nvlink=nvlink,
        gpu_bw=links * per_link,
        pci_bw=48.0,
        nic_bw=50.0,
        nics=nics,
        gpus_per_node=8,
        cpu="intel",
        nvls=nvlink,
        sharp=False,
    )


def test_p2p_channels_by_hand():
    # one H100 node: 2 x 18 NVLink links = 36 a peer, rounded up to 64; the communicator's
    # 24 channels round up to 32 p2p channels: 32
    assert nccl.p2p_channels(_machine(), 24, 8, 1) == 32
    # an A100 node (12 links x 20): 24 a peer -> 32, comm 16 -> 16 p2p channels: 16
    assert nccl.p2p_channels(_machine(cc=80, links=12, per_link=20.0), 16, 8, 1) == 16
    # PCIe: 2 a peer
    assert nccl.p2p_channels(_machine(nvlink=False), 16, 4, 1) == 2
    # two DGX H100 nodes (a 400 Gb/s NIC a GPU, 50 GB/s): max(1, ceil(50 / 14)) = 4 a peer
    # on the network, the fewest; 4 x ceil(16 / 8) = 8 <= 16 p2p channels: 4
    assert nccl.p2p_channels(_machine(), 16, 16, 2) == 4
    # 1,024 ranks on 128 nodes: 4 x 128 > 16, halved down to 1
    assert nccl.p2p_channels(_machine(), 16, 1024, 128) == 1
    # two NICs a node of 8 GPUs: the GPU's nearest NIC is shared, one: 4 again
    assert nccl.p2p_channels(_machine(nics=2), 16, 16, 2) == 4


def test_a_contended_step_by_hand():
    # cp 4, 2 s of attention core (0.5 s a step), on half the SMs 1 s a step; a 0.25 s
    # transfer: the step's attention runs at half speed for 0.25 s, 0.125 s lost, 3 steps;
    # backward: 1.25 s a step beside a 0.5 s transfer, 0.25 s lost, 3 steps
    fwd, bwd = ring_attention(4, 0.25, 2.0, 0.0, 0.0, 1.0, contended=4.0)
    assert (float(fwd), float(bwd)) == pytest.approx((3 * 0.125, 3 * 0.25))
    # a transfer longer than the contended step shows beyond it; without contention the
    # transfers alone
    fwd, _ = ring_attention(4, 1.5, 2.0, 0.0, 0.0, 1.0, contended=4.0)
    assert float(fwd) == pytest.approx(3 * 1.0)
    plain = ring_attention(4, 0.25, 2.0, 0.0, 0.0, 1.0)
    assert [float(x) for x in plain] == [0.0, 0.0]


def _stepped(cp: int, transfer: float, share: float, slow: float, dt: float = 1e-4) -> float:
    """A ring's forward in small time steps: each step's attention progresses at share /
    slow of its speed while that step's transfer is in flight, at full speed after; the
    next step starts when both are done. The end, less the attention alone."""
    t = 0.0
    for _ in range(cp - 1):
        work, start = 0.0, t
        while work < share or t - start < transfer:
            rate = share / slow if t - start < transfer else 1.0
            work += rate * dt if work < share else 0.0
            t += dt
    return t - (cp - 1) * share


@pytest.mark.parametrize("seed", range(12))
def test_the_contended_ring_is_the_stepped_replay(seed):
    rng = np.random.default_rng(seed)
    cp = int(rng.choice([2, 4, 8]))
    share = rng.uniform(0.01, 0.05)
    slow, transfer = share * rng.uniform(1.0, 2.0), rng.uniform(0.0, 0.08)
    fwd, _ = ring_attention(cp, transfer, share * cp, 0.0, 0.0, 1.0, contended=slow * cp)
    want = _stepped(cp, transfer, share, slow)
    assert float(fwd) == pytest.approx(want, abs=2e-4 * cp)


def _model(efficiency=None):
    shape = dict(layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816, gated_mlp=True)
    spec = ModelSpec(name="llama-ish", vocab=1000, seq_len=32768, **shape)
    cluster = make_cluster(nodes=2, gpus_per_node=8, nics=8, nic_bw="400Gbps", backend="nccl")
    return StepModel(build_workload(spec), cluster, catalog.GPUS["h100"], 16, 16, efficiency)


def test_the_step_model_slows_each_steps_attention_beside_its_send(monkeypatch):
    hm = _model()
    L = Layouts.build(dp=2, cp=8, micro_batches=1)
    # the cp group's sends on NCCL's p2p channels (an A100 node's: 2 x 12 links a peer)
    channels, on_gpu = hm.groups.channels("cp", L, p2p=True)
    place, *key = (int(k[0]) for k in _key_columns("cp", L))
    comm = hm.groups.cost(place, "cp", *key)
    comm = comm.comm()
    assert on_gpu[0] and channels[0] == nccl.p2p_channels(
        comm.m, comm.graphs.comm_channels, comm.ranks, comm.nodes
    )
    got = hm.evaluate(L).row(0)["cp_comm"]
    # the same ring with the attention at its own speed throughout
    monkeypatch.setattr(step_model, "contended_attention", lambda *a, **k: None)
    free = hm.evaluate(L).row(0)["cp_comm"]
    assert got > free > 0.0
    # at most every step's attention at (132 - channels) / 132 of its speed (the H100's SMs)
    # for the whole transfer
    c = hm.compute(L)
    step = hm.groups.price("send-recv", "cp", L, step_model.cp_bytes(L, hm.shape, hm.workload.arch))
    lost = channels[0] / 132 * float(step[0]) * (1 + 2)  # forward and backward (2 transfers)
    assert got - free <= 4 * 7 * lost * (1 + 1e-9)  # 4 blocks, cp - 1 steps
    assert float(c.core_fwd[0]) > 0


def test_the_attentions_shortcut_is_the_contended_roofline():
    """contended_attention (the core over the SMs' share) against the whole roofline priced
    again at the contended rates (contended_compute), HBM traffic and all."""
    hm = _model()
    L = Layouts.build(dp=np.array([8, 4, 2]), cp=np.array([2, 4, 8]), micro_batches=2)
    seconds = np.array([1e-3, 2e-3, 0.0])  # the last: nothing running beside it
    core = hm.compute(L).core_fwd
    whole = contended_compute(hm, L, "cp", np.array([3e9, 5e9, 0.0]), seconds, p2p=True)
    short = contended_attention(hm, L, "cp", seconds, core, p2p=True)
    assert short == pytest.approx(whole.core_fwd, rel=1e-12)
    assert short[0] > core[0] and short[2] == core[2]
    assert contended_attention(_model(efficiency=0.5), L, "cp", seconds, core) is None
