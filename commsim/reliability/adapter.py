"""The one place the reliability model reads commsim.step, commsim.scenario and the
collectives: a predicted step becomes a JobState (sizes, layout, the state to checkpoint,
the link rates recovery uses), and stragglers re-predict a step on a changed setup. When the
step or collectives packages change their names, this module is what follows them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.group import GroupCost
from commsim.scenario import Setup
from commsim.specs import Strategy
from commsim.step.layouts import DTYPE_BYTES
from commsim.step.predict import predict
from commsim.step.prediction import Prediction
from commsim.step.states import model_state_bytes
from commsim.topology.build import Cluster
from commsim.topology.routing import routes


@dataclass(frozen=True)
class JobState:
    """What recovery needs to know of a job and its predicted step.

    held_bytes: the state one GPU must save and load (fp16/bf16 weights + fp32 master
    weights and Adam moments: commsim.step.states' params + optimizer, on the fullest
    pipeline stage, after ZeRO's sharding). unique_bytes: the job's checkpoint written once,
    every parameter's weights and optimizer state (2 + 12 bytes; 2 + 8 with bf16 moments;
    FSDP's fp32 shards 4 + 8), data-parallel replicas of a shard written once, as
    Megatron-core's distributed checkpoint does."""

    gpus: int
    gpus_per_node: int
    dp: int
    tp: int
    pp: int
    zero: int
    step_s: float
    held_bytes: float
    unique_bytes: float
    pcie_Bps: float  # GPU <-> host, per GPU
    nic_per_gpu_Bps: float  # a GPU's share of its node's NICs
    node_nic_Bps: float  # all NICs of a node
    ideal_time_s: float | None  # time to train with no failure (given tokens)
    price_per_gpu_hour: float | None

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    def replica_of_gpu(self) -> np.ndarray:
        """Data-parallel replica of each GPU: ranks in Megatron's order (tensor-parallel
        fastest, then data-parallel, then pipeline; commsim.step.groups), placed blocked."""
        return (np.arange(self.gpus) // self.tp) % self.dp


def job_state(prediction: Prediction, setup: Setup) -> JobState:
    """The JobState of a predicted step on its setup."""
    s, strategy, mem = setup.scenario, prediction.strategy, prediction.memory
    n, dp = setup.n_gpus, setup.dp(prediction.strategy)
    node = setup.cluster.spec.node
    per_node = node.nics.bandwidth * node.nics.count
    return JobState(
        gpus=n,
        gpus_per_node=node.gpus_per_node,
        dp=dp,
        tp=strategy.tp,
        pp=strategy.pp,
        zero=strategy.zero,
        step_s=prediction.step_time_s,
        held_bytes=mem.params + mem.optimizer,
        unique_bytes=model_state_bytes(
            setup.workload.params,
            strategy.states == "fsdp",
            DTYPE_BYTES[strategy.optimizer_moments],
        ),
        pcie_Bps=node.pcie_bandwidth,
        nic_per_gpu_Bps=per_node / node.gpus_per_node,
        node_nic_Bps=per_node,
        ideal_time_s=(prediction.training or {}).get("time_to_train_s"),
        price_per_gpu_hour=s.price_per_gpu_hour,
    )


def predict_step(setup: Setup, strategy: Strategy | None = None) -> Prediction:
    """commsim's prediction of one step of the setup."""
    return predict(setup, strategy)


def with_compute_slowed(setup: Setup, factor: float) -> Setup:
    """The setup with every GPU's compute `factor` times slower: its one efficiency / factor
    when the scenario sets one, else the GPU's tensor-core peaks / factor (the roofline's
    GEMMs and attention slow; HBM-bound work, the optimizer included, does not)."""
    s = setup.scenario
    if s.compute_efficiency is not None:
        slower = s.model_copy(update={"compute_efficiency": s.compute_efficiency / factor})
        return dataclasses.replace(setup, scenario=slower)
    gpu = setup.gpu
    update = {"peak_flops": gpu.peak_flops / factor}
    if gpu.fp8_flops:
        update["fp8_flops"] = gpu.fp8_flops / factor
    return dataclasses.replace(setup, gpu=gpu.model_copy(update=update))


def with_cluster(setup: Setup, cluster: Cluster) -> Setup:
    """The setup on another built cluster (a degraded copy of its own)."""
    return dataclasses.replace(setup, cluster=cluster)


def degraded(cluster: Cluster, edges: np.ndarray, factor: float) -> Cluster:
    """A copy of the cluster whose `edges` carry 1/factor of their bandwidth, with its own
    empty routing cache (the original's solved steps stay valid for the original)."""
    capacity = cluster.capacity.copy()
    capacity[np.asarray(edges, dtype=np.int64)] /= factor
    return dataclasses.replace(cluster, capacity=capacity, solved_steps={})


def collective_time(
    cluster: Cluster, gpus: np.ndarray, op: str, algorithm: str, size: float
) -> float:
    """Seconds of one collective among `gpus` (rank order) on the graph."""
    return float(GroupCost(cluster, gpus).time(op, algorithm, size)[0])


def group_edges(cluster: Cluster, gpus: np.ndarray, op: str, algorithm: str) -> np.ndarray:
    """Directed edge ids the collective's flows cross, routed as GroupCost routes them (the
    same node structure and NIC rails)."""
    cost = GroupCost(cluster, gpus)
    gpus = np.asarray(gpus, dtype=np.int64)
    steps = build_schedule(
        op, algorithm, gpus.size, 1.0, gpus_per_node=cost.gpus_per_node, channels=cost.channels
    )
    used = []
    for step in steps:
        paths, _ = routes(cluster, gpus[step.src], gpus[step.dst], step.rail)
        used.append(paths[paths >= 0])
    return np.unique(np.concatenate(used)) if used else np.array([], dtype=np.int64)
