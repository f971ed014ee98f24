"""Several jobs on one fabric: each priced alone, then with the others' traffic on its links.

A jobs file names one cluster and its jobs, each a scenario (model, GPUs, batch, strategy)
with its own nodes or a scheduler's allocation policy (topology.placement.allocate).
Each job is predicted twice by the one step model, on the whole fabric: alone, and sharing
it, when every collective step of the job competes max-min fairly with the other jobs'
gradient synchronisation (each other job's data-parallel ring all-reduce step, every
group of it, as NCCL runs it: topology.routing.Background). That is the case of
communication phases that coincide: what a planner must budget for when it cannot know
they will not. Jobs whose traffic shares no link run exactly as alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from pydantic import Field

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.group import GroupCost
from commsim.scenario import Setup, resolve
from commsim.spec_base import Spec
from commsim.spec_io import parse_spec, read_yaml
from commsim.specs import ClusterSpec, Scenario, SpecError
from commsim.step.groups import Groups
from commsim.step.predict import predict
from commsim.step.prediction import Prediction
from commsim.topology.build import Cluster, build_cluster
from commsim.topology.placement import PLACEMENTS, allocate, gpus_of_nodes, pod_of_node
from commsim.topology.routing import Background


class JobsSpec(Spec):
    """A shared cluster and the jobs on it (each a scenario without `cluster`, plus
    optional `nodes`: the node ids it runs on; the others get nodes by `allocation`)."""

    name: str = "jobs"
    description: str = ""
    cluster: str | ClusterSpec
    allocation: Literal["packed", "random", "fragmented"] = "packed"
    seed: int = Field(default=0, ge=0)  # the random allocation's
    jobs: list[dict[str, Any]] = Field(min_length=1)


@dataclass
class JobResult:
    """One job's prediction alone on the fabric and sharing it."""

    name: str
    gpus: int
    nodes: np.ndarray
    pods: int  # pods its nodes span
    alone: Prediction
    shared: Prediction
    cluster: Cluster  # the fabric as this job sees it (its allocation), for its groups

    @property
    def slowdown(self) -> float:
        """Shared step time over alone step time."""
        return self.shared.step_time_s / self.alone.step_time_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpus": self.gpus,
            "nodes": self.nodes.tolist(),
            "pods": self.pods,
            "strategy": self.alone.strategy.model_dump(),
            "alone_step_time_s": self.alone.step_time_s,
            "shared_step_time_s": self.shared.step_time_s,
            "slowdown": self.slowdown,
            "alone": self.alone.to_dict(),
            "shared": self.shared.to_dict(),
        }


def load_jobs(path: str) -> JobsSpec:
    """Read and validate a jobs file (yaml.safe_load); errors name the file and field."""
    return parse_spec(JobsSpec, read_yaml(path), path)


def job_scenarios(spec: JobsSpec, source: str) -> list[tuple[Scenario, list[int] | None]]:
    """Each job's scenario on the shared cluster, and its explicit nodes if any."""
    out = []
    for i, job in enumerate(spec.jobs):
        job = dict(job)
        nodes = job.pop("nodes", None)
        if "cluster" in job:
            raise SpecError(source, f"jobs.{i}.cluster", "jobs share the file's cluster")
        if nodes is not None and (
            not isinstance(nodes, list)
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes)  # not true
        ):
            raise SpecError(source, f"jobs.{i}.nodes", "expected a list of node ids")
        job.setdefault("name", f"job{i}")
        scenario = parse_spec(Scenario, job | {"cluster": spec.cluster}, f"{source}: jobs.{i}")
        named = [s.name for s, _ in out]
        if scenario.name in named:  # the table's rows and the JSON's jobs are told apart by it
            first = named.index(scenario.name)
            problem = f"{scenario.name!r} is job {first}'s name too: give each its own"
            raise SpecError(source, f"jobs.{i}.name", problem)
        out.append((scenario, nodes))
    return out


def _allocations(cluster: Cluster, spec: JobsSpec, jobs, source: str) -> list[np.ndarray]:
    """Node ids of every job: its own `nodes`, else the policy's pick of the free nodes."""
    gpn = cluster.gpus_per_node
    need = [math.ceil(s.gpus / gpn) for s, _ in jobs]
    taken = [np.asarray(n, dtype=np.int64) for _, n in jobs if n is not None]
    used = np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)
    for i, ((_, nodes), k) in enumerate(zip(jobs, need, strict=True)):
        if nodes is not None and len(nodes) != k:
            raise SpecError(source, f"jobs.{i}.nodes", f"{len(nodes)} nodes for {k} needed")
    bad = used[(used < 0) | (used >= cluster.n_nodes)]
    if bad.size or np.bincount(used, minlength=1).max(initial=0) > 1:
        raise SpecError(source, "jobs", "explicit nodes must be distinct ids of the cluster")
    free_need = [k for (_, n), k in zip(jobs, need, strict=True) if n is None]
    try:
        picked = iter(allocate(cluster, free_need, spec.allocation, spec.seed, exclude=used))
    except ValueError as e:
        raise SpecError(source, "jobs", str(e)) from None
    return [np.asarray(n) if n is not None else next(picked) for _, n in jobs]


def gradient_ring(setup: Setup) -> Background:
    """The flows of one step of the job's data-parallel ring all-reduce, every group at
    once, as NCCL runs it (channels over the NIC rails): its traffic while it syncs."""
    s = setup.scenario.strategy
    dp = setup.dp(s)
    groups = Groups(setup.cluster, setup.n_gpus).members(
        PLACEMENTS.index(s.placement), "dp", s.tp, dp, s.pp, s.ep, s.cp
    )
    if groups.shape[1] < 2:
        empty = np.zeros(0, dtype=np.int64)
        return Background(empty, empty, empty)
    cost = GroupCost(setup.cluster, groups)
    step = build_schedule(
        "all-reduce",
        "ring",
        cost.n,
        1.0,
        chunks=1,
        gpus_per_node=cost.gpus_per_node,
        channels=cost.channels,
        ps_shards=1,
    )[0]
    n = groups.shape[0]
    return Background(
        groups[:, step.src].ravel(), groups[:, step.dst].ravel(), np.tile(step.rail, n)
    )


def run_jobs(spec: JobsSpec, source: str, on_progress=None) -> list[JobResult]:
    """Every job predicted alone on the fabric and sharing it with the others."""
    jobs = job_scenarios(spec, source)
    alone_setups = [resolve(s, f"{source}: jobs.{i}") for i, (s, _) in enumerate(jobs)]
    cluster = build_cluster(alone_setups[0].cluster.spec, None, source)
    nodes = _allocations(cluster, spec, jobs, source)
    setups = [
        replace(setup, cluster=_view(cluster, allocation=gpus_of_nodes(cluster, mine)))
        for setup, mine in zip(alone_setups, nodes, strict=True)
    ]
    traffic = [gradient_ring(s) for s in setups]
    pods = pod_of_node(cluster)
    results = []
    for i, setup in enumerate(setups):
        alone = predict(setup)
        view = _view(setup.cluster, background=_merged(traffic[:i] + traffic[i + 1 :]))
        shared = predict(replace(setup, cluster=view))
        n_pods = int(np.unique(pods[nodes[i]]).size)
        name, gpus = setup.scenario.name, setup.n_gpus
        results.append(JobResult(name, gpus, nodes[i], n_pods, alone, shared, setup.cluster))
        if on_progress:
            on_progress()
    return results


def _view(cluster: Cluster, **changes) -> Cluster:
    """The cluster with a job's allocation or background, and a cache of its own."""
    return replace(cluster, solved_steps={}, **changes)


def _merged(parts: list[Background]) -> Background | None:
    """One background of several jobs' flows (None: no other job)."""
    if not parts:
        return None
    return Background(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in ("src", "dst", "rail"))
    )
