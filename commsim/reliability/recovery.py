"""What a failure costs under each recovery strategy: checkpoint stalls, restart phases, and
for the strategies that keep running, the stall and the capacity lost until a replacement
joins.

  cold          every failure stops the job; it is rescheduled (a replacement node from the
                cluster's pool), re-initialised, loads the last checkpoint from storage and
                warms up; work since the last durable checkpoint is redone
  hot-spare     the same, but warm spare nodes in the allocation replace failed ones, so no
                rescheduling while a spare is free (the spare count is searched, see spares)
  in-memory     hot spares and checkpoints kept in the host memory of a peer node (Gemini,
                Wang et al. SOSP'23): a checkpoint stalls only for the GPU-to-host copy, is
                safe once sent to the peer, and is restored over the network
  per-step      per-step fault tolerance (TorchFT, pytorch/torchft): the replicas the failure
                touches drop out, the rest go on after a quorum change, losing the step in
                flight; a replacement heals from a live peer's state and rejoins
  ring-rebuild  the seed's recovery (003): the failed node is dropped and the ring rebuilt in
                place, its gradients held by its neighbours and re-sent (no step lost); a
                spare rejoins later. Needs whole replicas on every node (tp x pp within a
                node, no ZeRO sharding across nodes)

Checkpoint I/O (storage): a synchronous save stalls for the job's unique state over the
storage's write bandwidth (each data-parallel rank writes its slice, Megatron-core's fully
parallel save); an asynchronous one stalls for each GPU's share over PCIe and is durable
once written. A load reads the unique state and all-gathers each GPU's full state over the
data-parallel group (Megatron-core's fully parallel load). NCCL's initialisation takes
about 265 s at 96k GPUs (Si et al. 2025, NCCLX, arXiv:2510.20171, as summarised): scaled
linearly with the GPUs (the paper calls it super-linear, so this is a lower bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from commsim.reliability.rates import HARDWARE

if TYPE_CHECKING:  # annotations only: the adapter imports the step model
    from commsim.reliability.adapter import JobState

STRATEGIES = ("cold", "hot-spare", "in-memory", "per-step", "ring-rebuild")
RESTARTING = ("cold", "hot-spare", "in-memory")
PHASES = ("detection", "reschedule", "initialization", "checkpoint_restore", "warmup")

# The Policy fields a strategy never reads: cold keeps no spares (build_model), in-memory
# saves to a peer's host memory, never to storage (save_costs), per-step and ring-rebuild
# take no checkpoints (running_costs).
UNUSED = {"cold": ("spares", "spare_target"), "in-memory": ("async_save",)}
UNUSED |= dict.fromkeys(("per-step", "ring-rebuild"), ("interval_s", "async_save"))

NCCL_INIT_S = 265.0  # stock NCCL communicator set-up at 96k GPUs (NCCLX paper, as summarised)
NCCL_INIT_GPUS = 96_000
# TorchFT's example lighthouse waits 10 s for a quorum (--join_timeout_ms 10000,
# pytorch/torchft README); used for every strategy as the time to notice a failure.
DETECT_S = 10.0
# "detects and replaces failed GPU nodes in under 5 minutes" (Crusoe AutoClusters blog).
RESCHEDULE_S = 300.0
# Process start, CUDA context, data loaders, compilation, first slow steps: an assumption.
WARMUP_S = 60.0


def nccl_init_s(gpus: int) -> float:
    """Seconds to set up the job's communicators (linear through the NCCLX figure)."""
    return NCCL_INIT_S * gpus / NCCL_INIT_GPUS


@dataclass(frozen=True)
class Policy:
    """How a job recovers: the strategy, its checkpoint interval (None: the optimum of the
    model), synchronous or asynchronous saves, hot spares (None: as many as keep the job at
    full size with probability spare_target), and the times of the restart phases (init_s:
    the whole job's communicator set-up, scaled by ranks for smaller groups)."""

    strategy: str = "cold"
    interval_s: float | None = None
    async_save: bool = False
    spares: int | None = None
    spare_target: float = 0.999
    detect_s: float = DETECT_S
    reschedule_s: float = RESCHEDULE_S
    warmup_s: float = WARMUP_S
    init_s: float | None = None  # communicator set-up of the whole job (None: nccl_init_s)

    def init(self, ranks: int, world: int) -> float:
        """Seconds to set up communicators over `ranks` of a job of `world` GPUs."""
        if self.init_s is None:
            return nccl_init_s(ranks)
        return self.init_s * ranks / world

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown recovery {self.strategy!r} (one of {', '.join(STRATEGIES)})")
        if not 0.0 < self.spare_target < 1.0:
            raise ValueError(f"spare_target must be in (0, 1), got {self.spare_target}")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError(f"the checkpoint interval must be positive, got {self.interval_s}")
        if self.spares is not None and self.spares < 0:
            raise ValueError(f"spares must not be negative, got {self.spares}")


@dataclass(frozen=True)
class Costs:
    """The seconds a strategy spends: per checkpoint (stall, and the lag until it is
    durable), per restart phase and failure class, and for the strategies that keep running,
    per failure class the whole-job stall by phase and the capacity lost."""

    strategy: str
    stall_s: float = 0.0
    lag_s: float = 0.0
    restart: dict[str, dict[str, float]] = field(default_factory=dict)  # class -> phase -> s
    stall: dict[str, dict[str, float]] = field(default_factory=dict)  # class -> phase -> s
    reduced_s: dict[str, float] = field(default_factory=dict)  # class -> replicas out (s)
    rejoin_s: float = 0.0  # whole-job stall when a replacement joins
    load_s: float = 0.0


def save_costs(job: JobState, strategy: str, async_save: bool, write_Bps: float):
    """(stall, lag) seconds of one checkpoint."""
    if strategy == "in-memory":  # GPU -> host, then to one peer node's memory
        return job.held_bytes / job.pcie_Bps, job.held_bytes * job.gpus_per_node / job.node_nic_Bps
    write = job.unique_bytes / write_Bps
    if async_save:
        return job.unique_bytes / job.gpus / job.pcie_Bps, write
    return write, 0.0


def load_s(job: JobState, strategy: str, read_Bps: float) -> float:
    """Seconds to restore every GPU's state after a restart."""
    gather = job.held_bytes * (job.dp - 1) / job.dp / job.nic_per_gpu_Bps
    if strategy == "in-memory":  # from a peer's host memory
        return job.held_bytes / job.nic_per_gpu_Bps
    return job.unique_bytes / read_Bps + gather


def restart_costs(
    job: JobState, policy: Policy, p_no_spare: float, write_Bps: float, read_Bps: float
) -> Costs:
    """Checkpoint and restart costs of the restarting strategies, by failure class."""
    stall, lag = save_costs(job, policy.strategy, policy.async_save, write_Bps)
    load = load_s(job, policy.strategy, read_Bps)
    wait = policy.reschedule_s * (1.0 if policy.strategy == "cold" else p_no_spare)
    restart = {}
    for cls in (*HARDWARE, "software"):
        restart[cls] = {
            "detection": policy.detect_s,
            "reschedule": wait if cls in HARDWARE else 0.0,
            "initialization": policy.init(job.gpus, job.gpus),
            "checkpoint_restore": load,
            "warmup": policy.warmup_s,
        }
    return Costs(policy.strategy, stall, lag, restart=restart, load_s=load)


def check_replicas(job: JobState, strategy: str) -> None:
    """Per-step recovery needs data-parallel replicas that each hold the whole state."""
    if job.dp < 2:
        raise ValueError(f"{strategy} recovery needs data parallelism (dp >= 2), dp = {job.dp}")
    if job.zero != 0:
        raise ValueError(
            f"{strategy} recovery needs replicas holding the whole state; ZeRO stage "
            f"{job.zero} shards it over every replica (use zero 0, or HSDP)"
        )
    if strategy == "ring-rebuild" and job.tp * job.pp > job.gpus_per_node:
        raise ValueError(
            f"ring rebuild drops a node and goes on: every node must hold whole replicas, "
            f"but tp x pp = {job.tp * job.pp} spans more than its {job.gpus_per_node} GPUs"
        )


def running_costs(job: JobState, policy: Policy, p_no_spare: float) -> Costs:
    """Stalls and capacity loss of per-step fault tolerance and the seed's ring rebuild.

    When a failure is noticed the whole job stalls (detection, the step in flight for
    per-step, a quorum change: the communicators re-initialised at the new membership); the
    replicas it touched are out until a replacement (a spare, else one from the pool) has
    started, warmed up and copied the state from a live peer; then the job stalls again for
    the quorum change that admits it (rejoin_s)."""
    check_replicas(job, policy.strategy)
    init = policy.init(job.dp, job.gpus)  # only the data-parallel communicators change
    transfer = job.held_bytes / job.nic_per_gpu_Bps  # heal from a live peer
    lost_step = job.step_s if policy.strategy == "per-step" else 0.0
    stall, reduced = {}, {}
    for cls in (*HARDWARE, "software"):
        stall[cls] = {
            "detection": policy.detect_s,
            "lost_progress": lost_step,
            "initialization": init,
        }
        replace = policy.reschedule_s * p_no_spare if cls in HARDWARE else 0.0
        reduced[cls] = policy.detect_s + replace + policy.warmup_s + transfer
    return Costs(policy.strategy, stall=stall, reduced_s=reduced, rejoin_s=init)
