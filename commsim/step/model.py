"""The training step, one model for every layout, vectorised over many layouts at once.

Data x tensor x pipeline x expert parallelism with ZeRO/FSDP, sequence parallelism and
activation recomputation, as Megatron-LM lays a transformer out (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21;
Korthikanti et al. 2022); plain DDP is the layout with none of them. Every quantity is a
numpy array with one entry per layout, so a planner prices 100,000s of layouts in one pass,
and `predict` prices one the same way. Collectives are priced on the cluster graph
(step.groups); data-parallel gradients go in PyTorch DDP's buckets (step.buckets), synced
on a serial stream under the last backward (step.sync), the same schedule that
timeline.schedule_streams draws event by event.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from commsim.collectives.algorithms import ALGORITHMS as OP_ALGORITHMS
from commsim.compression import parse_compressor
from commsim.specs import GPUSpec
from commsim.step.buckets import MIB, STAGE_KINDS, BucketPlan, stage_buckets
from commsim.step.groups import Groups, _group_rows
from commsim.step.layouts import Layouts
from commsim.step.memory import memory_per_gpu_batch, usable_bytes
from commsim.step.shape import Shape, slowest, stage_layers
from commsim.step.sync import (
    BucketCosts,
    Tail,
    allreduce_costs,
    compressed_costs,
    tail,
    zero3_costs,
)
from commsim.step.timeline import adam_step_time
from commsim.topology.build import Cluster
from commsim.topology.placement import PLACEMENTS
from commsim.workload.model import BACKWARD_FACTOR, Workload

ACT_BYTES = 2  # bf16 activations on the wire (tensor-parallel collectives, pipeline sends)
TP_ALLREDUCES_FORWARD = 2  # per layer: after attention, after the MLP (Shoeybi et al. 2019)
ALL_TO_ALLS_FORWARD = 2  # per MoE layer: dispatch tokens to experts, combine them back (GShard)


def state_grad_bytes(plain, grad_bytes):
    """Gradient bytes a parameter's training state is counted with. Plain DDP under
    torch.amp keeps fp32 weights (4 B), fp32 gradients (4 B) and Adam's m and v (8 B): 16 B
    a parameter, the same total as the memory model's mixed-precision split 2 + 2 + 12, so
    that split is used with 2-byte gradients; Megatron keeps bf16 weights and fp32 main
    gradients: 2 + 4 + 12."""
    return np.where(plain, 2, grad_bytes)


@dataclass(frozen=True)
class StepBreakdown:
    """Per-layout arrays of where a step's time goes (seconds) and its figures of merit."""

    step: np.ndarray  # = compute + tp_comm + ep_comm + pp_comm + bubble + dp_exposed + optimizer
    compute: np.ndarray  # forward + backward (+ recomputation) on the slowest stage, all mb
    forward: np.ndarray  # of compute: the forwards
    backward: np.ndarray  # of compute: the backwards (recomputation included)
    bubble: np.ndarray  # pipeline fill and drain: (p - 1) / v ticks, comm included
    tp_comm: np.ndarray  # tensor-parallel collectives, on the critical path
    ep_comm: np.ndarray  # expert-parallel all-to-alls (MoE), on the critical path
    pp_comm: np.ndarray  # pipeline sends between stages, on the critical path
    dp_comm: np.ndarray  # data-parallel / ZeRO collectives in all
    dp_exposed: np.ndarray  # the data-parallel sync (and a comm hook's codec) not hidden
    codec: np.ndarray  # a comm hook's encode + decode (compute-stream seconds)
    optimizer: np.ndarray
    memory: np.ndarray  # bytes per GPU (worst stage)
    fits: np.ndarray
    mfu: np.ndarray  # model FLOP/s / peak (no recomputation counted)
    hfu: np.ndarray  # hardware FLOP/s / peak, recomputation included

    def row(self, i: int) -> dict[str, float]:
        return {f.name: getattr(self, f.name)[i].item() for f in fields(self)}

    @classmethod
    def concat(cls, parts: list[StepBreakdown]) -> StepBreakdown:
        """The breakdowns of several sets of layouts, one after another."""
        return cls(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)}
        )


@dataclass(frozen=True)
class SyncPlan:
    """One stage's data-parallel sync under one way of reducing: its buckets, their costs,
    and the closed-form schedule (ZeRO 0-2) or the per-micro-batch volume (ZeRO-3)."""

    buckets: BucketPlan
    costs: BucketCosts
    tail: Tail


class StepModel:
    """Prices layouts of one workload on one cluster: compute from FLOPs, collectives from
    the graph (one cached GroupCost per distinct group), memory from step.memory."""

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        gpu: GPUSpec,
        n_gpus: int,
        global_batch: int,
        efficiency: float,
    ):
        self.workload, self.cluster, self.gpu = workload, cluster, gpu
        self.shape = Shape.of(workload)
        self.n, self.global_batch = n_gpus, global_batch
        self.flop_rate = gpu.peak_flops * efficiency
        self.usable = usable_bytes(gpu)  # bytes of HBM a training process may fill
        self.groups = Groups(cluster, n_gpus)
        self._sync: dict[tuple, SyncPlan] = {}

    def evaluate(self, L: Layouts) -> StepBreakdown:
        """Step time, its parts, memory and utilisation of every layout."""
        sh = self.shape
        pp, m, v = L.pp, L.micro_batches, L.interleave
        per_stage, t_fwd, t_bwd = self._compute(L)
        tp_f, tp_b = self._tensor_parallel(L, per_stage)
        ep_f, ep_b = self._expert_parallel(L, per_stage)
        p2p = np.where(pp == 1, 0.0, self._sends(L) * v)
        tick = t_fwd + t_bwd + tp_f + tp_b + ep_f + ep_b + 2.0 * p2p
        # 1F1B: (m + p - 1) ticks; interleaved with v chunks: (m + (p - 1) / v) ticks
        # (Narayanan et al. 2021, Sec. 2.2); the bubble is the (p - 1) / v extra ticks.
        pipeline = (m + (pp - 1) / v) * tick
        # the sync hides under the last micro-batch's backward, its collectives included
        dp_comm, dp_exposed, codec, local_params = self._data_parallel(
            L, t_fwd, t_bwd, t_bwd + tp_b + ep_b, per_stage
        )
        optimizer = adam_step_time(local_params, self.gpu, L.grad_bytes)
        step = pipeline + dp_exposed + optimizer
        memory = self.memory(L)
        peak = self.n * self.gpu.peak_flops
        model = 3.0 * sh.model_flops * self.global_batch
        recomputed = np.select(
            [L.recompute == 2, L.recompute == 1],
            [sh.model_flops, sh.blocks * sh.attention_core_flops],
            0.0,
        )
        return StepBreakdown(
            step=step,
            compute=m * (t_fwd + t_bwd),
            forward=m * t_fwd,
            backward=m * t_bwd,
            bubble=(pp - 1) / v * tick,
            tp_comm=m * (tp_f + tp_b),
            ep_comm=m * (ep_f + ep_b),
            pp_comm=m * 2.0 * p2p,
            dp_comm=dp_comm,
            dp_exposed=dp_exposed,
            codec=codec,
            optimizer=optimizer,
            memory=memory,
            fits=memory <= self.usable,
            mfu=model / step / peak,
            hfu=(model + recomputed * self.global_batch) / step / peak,
        )

    def _compute(self, L: Layouts):
        """(blocks on the slowest stage, its forward and backward seconds per micro-batch).
        The slowest stage is the first (embedding), a middle or the last (head) one, by its
        forward FLOPs per sample."""
        sh = self.shape
        k_first, k_mid, k_last = stage_layers(sh.blocks, L.pp, L.first_layers, L.last_layers)
        ends = (sh.pre_flops + sh.post_flops, sh.pre_flops, sh.post_flops)
        _, per_stage, flops = slowest(k_first, k_mid, k_last, sh.block_flops, L.pp == 1, *ends)
        # full: the forward again; selective: the attention core again (Korthikanti 2022)
        extra = np.select(
            [L.recompute == 2, L.recompute == 1],
            [flops, per_stage * sh.attention_core_flops],
            0.0,
        )
        rate = L.tp * self.flop_rate / L.micro_batch
        return per_stage, flops / rate, (BACKWARD_FACTOR * flops + extra) / rate

    def _tensor_parallel(self, L: Layouts, per_stage: np.ndarray):
        """Seconds of tensor-parallel collectives per micro-batch, forward and backward: 2
        all-reduces of b s h activations per layer forward, 2 backward, 2 more when a full
        recompute replays the forward; with sequence parallelism each is a reduce-scatter +
        all-gather of the same volume (Korthikanti Sec. 4.2.2)."""
        act = L.micro_batch * self.shape.seq_len * self.shape.hidden * ACT_BYTES
        ar = self.groups.price("all-reduce", "tp", L, act)
        forward = TP_ALLREDUCES_FORWARD * per_stage * ar
        return forward, forward * np.where(L.recompute == 2, 2.0, 1.0)

    def _expert_parallel(self, L: Layouts, per_stage: np.ndarray):
        """Seconds of expert-parallel all-to-alls per micro-batch, forward and backward: per
        MoE layer one dispatches tokens to their experts and one combines them back, again
        backward (and with a full recompute's replayed forward). Each GPU sends b (s / tp) h
        x 2 bytes x top_k x capacity factor in each: every expert's buffer holds capacity
        factor x its even share of the top_k-routed tokens (GShard, Lepikhin et al. 2020,
        arXiv:2006.16668; DeepSpeed-MoE); sequence parallelism splits the tokens over tp.
        ep = 1: all experts are local."""
        sh = self.shape
        if not sh.routed:
            zero = np.zeros(len(L))
            return zero, zero
        act = L.micro_batch * sh.seq_len * sh.hidden * ACT_BYTES * sh.routed / L.tp
        a2a = self.groups.price("all-to-all", "ep", L, act)
        forward = ALL_TO_ALLS_FORWARD * per_stage * a2a
        return forward, forward * np.where(L.recompute == 2, 2.0, 1.0)

    def _sends(self, L: Layouts) -> np.ndarray:
        """Seconds of one activation hand-off between neighbouring stages: each micro-batch
        crosses a stage boundary forward and back, v times with interleaving; the tp ranks
        split the activation (scatter-gather optimisation)."""
        act = L.micro_batch * self.shape.seq_len * self.shape.hidden * ACT_BYTES / L.tp
        inverse, firsts = _group_rows([L.placement, L.tp, L.dp, L.pp])
        line = np.array(
            [
                self.groups.send(*(int(c[i]) for c in (L.placement, L.tp, L.dp, L.pp)))
                for i in firsts.tolist()
            ]
        ).reshape(-1, 2)
        return line[inverse, 0] + line[inverse, 1] * act

    def _data_parallel(self, L: Layouts, t_fwd, t_bwd, span, per_stage):
        """(network seconds, exposed seconds, codec seconds, parameters the optimizer steps)
        of each layout's data-parallel sync, on the stage with the most parameters.

        ZeRO 0-2: the buckets' serial stream under the last backward (sync.Tail), a comm
        hook's encodes stretching it. ZeRO-3 / FSDP: per micro-batch, gathers prefetched
        under the compute but for the first layer's, the reduce-scatter hidden likewise."""
        sh = self.shape
        ends = (sh.pre_params + sh.post_params, sh.pre_params, sh.post_params)
        which, held, params = slowest(
            *stage_layers(sh.blocks, L.pp, L.first_layers, L.last_layers),
            sh.block_params,
            L.pp == 1,
            *ends,
        )
        kind = np.where(L.pp == 1, 0, which + 1)  # STAGE_KINDS
        inverse, firsts = _group_rows(_sync_columns(L, kind, held))
        plans = [self._sync_plan(L, int(i), int(kind[i]), int(held[i])) for i in firsts]
        network = np.array([p.tail.network for p in plans])[inverse]
        encode = np.array([p.tail.encode for p in plans])[inverse]
        codec = np.array([p.tail.codec for p in plans])[inverse]
        width = max((len(p.tail.slopes) for p in plans), default=1)
        slopes = np.zeros((len(plans), width))
        cuts = np.full((len(plans), width), -np.inf)
        for k, p in enumerate(plans):
            slopes[k, : len(p.tail.slopes)] = p.tail.slopes
            cuts[k, : len(p.tail.intercepts)] = p.tail.intercepts
        hidden = np.max(cuts[inverse] + slopes[inverse] * span[:, None], axis=1)
        serial = np.array([p.tail.serial for p in plans])[inverse]
        sync_exposed = encode + np.where(L.overlap, hidden, serial)
        m = L.micro_batches
        z3_hidden = m * (np.maximum(network - (t_fwd + t_bwd), 0.0) + network / (per_stage + 1))
        z3_exposed = np.where(L.overlap, z3_hidden, m * network)
        zero3 = L.zero == 3
        # ZeRO shards optimizer states over dp, expert ones over the dp / ep expert replicas
        sparse = held * sh.expert_params / (L.tp * L.ep)
        dense = (params - held * sh.expert_params) / L.tp
        zeroed = L.zero >= 1
        local = dense / np.where(zeroed, L.dp, 1) + sparse / np.where(zeroed, L.dp // L.ep, 1)
        return (
            np.where(zero3, m * network, network),
            np.where(zero3, z3_exposed, sync_exposed),
            codec,
            local,
        )

    def sync_plan(self, L: Layouts, i: int) -> SyncPlan:
        """Layout i's data-parallel sync (for drawing its buckets)."""
        sh = self.shape
        stages = stage_layers(sh.blocks, L.pp[i], L.first_layers[i], L.last_layers[i])
        ends = (sh.pre_params + sh.post_params, sh.pre_params, sh.post_params)
        which, held, _ = slowest(*stages, sh.block_params, L.pp[i] == 1, *ends)
        kind = 0 if L.pp[i] == 1 else int(which) + 1
        return self._sync_plan(L, i, kind, int(held))

    def _sync_plan(self, L: Layouts, i: int, kind: int, blocks: int) -> SyncPlan:
        """The sync of layout i's stage (STAGE_KINDS[kind], `blocks` blocks), cached: a
        search meets each a few hundred times."""
        r = L.row(i)
        key = (kind, blocks, *(r[c] for c in _SYNC_KEY))
        if key in self._sync:
            return self._sync[key]
        g = int(L.grad_bytes[i])
        buckets = stage_buckets(
            self.workload,
            STAGE_KINDS[kind],
            blocks,
            r["tp"],
            r["ep"],
            g,
            r["bucket_mb"] * MIB,
            r["first_bucket_mb"] * MIB,
            self._layer_weights(r["recompute"] == "selective"),
        )
        costs = self.bucket_costs(r, buckets.bytes, buckets.expert, g)
        self._sync[key] = plan = SyncPlan(buckets, costs, tail(costs, buckets.ready))
        return plan

    def bucket_costs(
        self, r: dict, nbytes: np.ndarray, expert: np.ndarray, grad_bytes: int
    ) -> BucketCosts:
        """Network and codec seconds of buckets of `nbytes` (expert: on the expert-data-
        parallel group) under one layout (a Layouts.row)."""
        dp, ep = r["dp"], r["ep"]
        shape = (r["tp"], dp, r["pp"], ep, r["ps_shards"])
        placement = PLACEMENTS.index(r["placement"])

        def price(op, algorithm, sizes, expert):
            kind = "edp" if expert else "dp"
            return self.groups.time(op, algorithm, sizes, placement, kind, *shape)

        none = np.zeros(len(nbytes))
        if dp == 1:
            return BucketCosts(none, none, none)
        alg = r["algorithm"]
        if r["compression"] != "none":
            return compressed_costs(
                price,
                alg,
                lambda op: OP_ALGORITHMS[op],
                parse_compressor(r["compression"]),
                np.rint(nbytes / grad_bytes),
                dp,
                self.gpu,
                r["error_feedback"],
            )
        if r["zero"] == 3:
            network = zero3_costs(price, alg, nbytes, expert, grad_bytes)
        else:
            network = allreduce_costs(price, alg, nbytes, expert, r["zero"], grad_bytes)
        return BucketCosts(network, none, none)

    def _layer_weights(self, selective: bool) -> tuple[float, ...]:
        """Each workload layer's share of a backward (any scale): 2x its forward FLOPs, and
        selective recomputation's attention replay in the blocks."""
        core = self.shape.attention_core_flops if selective else 0.0
        return tuple(
            BACKWARD_FACTOR * layer.forward_flops
            + (core if layer.name.startswith("block.") else 0.0)
            for layer in self.workload.layers
        )

    def memory(self, L: Layouts) -> np.ndarray:
        """Bytes per GPU on the fullest stage (step.memory)."""
        return memory_per_gpu_batch(
            self.workload,
            L.dp,
            L.tp,
            L.pp,
            L.micro_batch,
            L.zero,
            L.recompute,
            L.tp > 1,
            L.interleave,
            seq_len=self.shape.seq_len if self.shape.hidden else None,
            micro_batches=L.micro_batches,
            grad_bytes=state_grad_bytes(L.plain, L.grad_bytes),
            bucket_mb=L.bucket_mb,
            ep=L.ep,
            first_layers=L.first_layers,
            last_layers=L.last_layers,
        )


# what a data-parallel sync depends on besides its stage: a Layouts.row's fields
_SYNC_KEY = (
    "tp",
    "ep",
    "dp",
    "pp",
    "grad_dtype",
    "bucket_mb",
    "first_bucket_mb",
    "recompute",
    "zero",
    "algorithm",
    "placement",
    "ps_shards",
    "compression",
    "error_feedback",
)


def _sync_columns(L: Layouts, kind: np.ndarray, held: np.ndarray) -> list[np.ndarray]:
    """The columns _SYNC_KEY names, as integer codes, with the stage's kind and blocks."""
    cols = [kind, held.astype(np.int64)]
    for name in _SYNC_KEY:
        col = getattr(L, name)
        if col.dtype.kind == "f":
            col = np.unique(col, return_inverse=True)[1]
        cols.append(col)
    return cols
