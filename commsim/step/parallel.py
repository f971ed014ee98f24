"""The hybrid-parallel step, vectorised over many layouts at once.

Data x tensor x pipeline parallelism with ZeRO/FSDP, sequence parallelism and activation
recomputation, as Megatron-LM lays a transformer out (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21; Korthikanti
et al. 2022). Every quantity is a numpy array with one entry per candidate layout, so a
planner prices 100,000s of layouts in one pass. Collectives are priced on the cluster
graph: each distinct group (its size, stride and placement) is evaluated once and handed
over as intercept + slope x bytes (GroupCost.affine).

Ranks follow Megatron's order: tensor-parallel rank fastest, then data-parallel, then
pipeline stage, so a tensor-parallel group is consecutive GPUs (inside a node when tp is at
most the node's GPUs) and a data-parallel group is strided by tp. Expert parallelism (MoE)
carves its groups out of the data-parallel group: ep consecutive data-parallel ranks (stride tp)
hold different experts; the dp / ep ranks holding the same experts (stride tp x ep) reduce
their gradients (Megatron-LM / DeepSpeed-MoE, Rajbhandari et al. 2022, arXiv:2201.05596).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import numpy as np

from commsim.collectives.algorithms import SEARCHED
from commsim.collectives.backends import choices
from commsim.collectives.group import GroupCost
from commsim.specs import GPUSpec
from commsim.step.memory import RECOMPUTE, memory_per_gpu_batch, stage_layers, usable_bytes
from commsim.step.timeline import adam_step_time
from commsim.topology.build import Cluster
from commsim.topology.placement import PLACEMENT_KINDS, place
from commsim.topology.routing import step_time
from commsim.workload.model import Workload

ACT_BYTES = 2  # bf16 activations on the wire (tensor-parallel collectives, pipeline sends)
PARAM_WIRE_BYTES = 2  # bf16 parameters gathered by ZeRO-3 / FSDP
TP_ALLREDUCES_FORWARD = 2  # per layer: after attention, after the MLP (Shoeybi et al. 2019)
ALL_TO_ALLS_FORWARD = 2  # per MoE layer: dispatch tokens to experts, combine them back (GShard)


@functools.lru_cache(maxsize=256)
def balanced_ends(blocks: int, pp: int, block: float, pre: float, post: float) -> tuple[int, int]:
    """First- and last-stage layer counts that minimise the slowest stage's load when the
    first stage also carries `pre` and the last `post` (in the units of `block`, one layer's),
    the middle stages splitting the rest evenly as Megatron-core requires; ties go to the
    split closest to even. By enumeration: at most blocks^2 / 2 candidates."""
    best: tuple[float, float, int, int] | None = None
    for f in range(1, blocks):
        for k_last in range(1, blocks - f + 1):
            middle = blocks - f - k_last
            if pp == 2 and middle:
                continue
            if pp > 2 and (middle <= 0 or middle % (pp - 2)):
                continue
            mid = middle / (pp - 2) if pp > 2 else 0.0
            load = max(f * block + pre, mid * block, k_last * block + post)
            skew = abs(f - blocks / pp) + abs(k_last - blocks / pp)
            if best is None or (load, skew) < best[:2]:
                best = (load, skew, f, k_last)
    if best is None:
        raise ValueError(f"{blocks} layers cannot be split over {pp} stages")
    return best[2], best[3]


@dataclass(frozen=True)
class Layouts:
    """Candidate layouts as parallel arrays (one entry each); recompute holds RECOMPUTE codes."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray  # expert-parallel degree (divides dp)
    micro_batch: np.ndarray
    micro_batches: np.ndarray  # per step and data-parallel rank: global / (dp x micro_batch)
    zero: np.ndarray
    recompute: np.ndarray
    interleave: np.ndarray
    bucket_mb: np.ndarray
    overlap: np.ndarray
    algorithm: np.ndarray  # index into ALGORITHMS
    placement: np.ndarray  # index into PLACEMENTS
    first_layers: np.ndarray  # layers on the first pipeline stage (-1: an even split)
    last_layers: np.ndarray  # layers on the last pipeline stage (-1: an even split)

    def __len__(self) -> int:
        return len(self.dp)

    def row(self, i: int) -> dict[str, object]:
        """Layout i as plain values, names for the coded fields."""
        out = {f.name: getattr(self, f.name)[i].item() for f in fields(self)}
        out["recompute"] = RECOMPUTE[out["recompute"]]
        out["algorithm"] = ALGORITHMS[out["algorithm"]]
        out["placement"] = PLACEMENT_KINDS[out["placement"]]
        return out


# the all-reduces auto chooses among, but a parameter server: DDP's, not a Megatron layout's
ALGORITHMS = tuple(a for a in SEARCHED["all-reduce"] if a != "ps")
NCCL_ALGORITHMS = choices("nccl", "all-reduce")  # what NCCL picks between for all-reduce


@dataclass(frozen=True)
class Shape:
    """What the step model needs of a transformer workload."""

    blocks: int
    hidden: int
    heads: int
    seq_len: int
    block_params: float
    block_flops: float  # forward FLOPs per sample of one block
    attention_core_flops: float  # the s^2 part of block_flops (recomputed by "selective")
    pre_params: float  # embedding
    pre_flops: float
    post_params: float  # final norm, LM head
    post_flops: float
    total_params: float
    model_flops: float  # forward FLOPs per sample of the whole model
    expert_params: float  # of block_params: all experts' MLPs (0 for a dense model)
    routed: float  # top_k x capacity factor: token copies an MoE layer dispatches (0: dense)

    @classmethod
    def of(cls, w: Workload) -> Shape:
        """Read the shape off a transformer workload's layers (blocks named block.i)."""
        if w.heads is None or w.hidden is None or w.seq_len is None:
            raise ValueError(f"{w.name}: tensor and pipeline parallelism need a transformer")
        names = [layer.name for layer in w.layers]
        at = [i for i, n in enumerate(names) if n.startswith("block.")]
        block = w.layers[at[0]]
        pre, post = w.layers[: at[0]], w.layers[at[-1] + 1 :]
        s, h = w.seq_len, w.hidden
        return cls(
            blocks=len(at),
            hidden=h,
            heads=w.heads,
            seq_len=s,
            block_params=float(block.params),
            block_flops=block.forward_flops,
            attention_core_flops=4.0 * s * s * h,  # QK^T and AV: 2 x 2 s^2 h (Megatron)
            pre_params=float(sum(x.params for x in pre)),
            pre_flops=sum(x.forward_flops for x in pre),
            post_params=float(sum(x.params for x in post)),
            post_flops=sum(x.forward_flops for x in post),
            total_params=float(w.params),
            model_flops=w.forward_flops,
            expert_params=float(w.expert_params),
            routed=w.top_k * w.capacity_factor if w.moe else 0.0,
        )


def _slowest(k_first, k_mid, k_last, per_layer, only, whole, pre, post):
    """(layers, load) of the stage with the most load: first (+ pre), middle, last (+ post);
    one stage (only) carries `whole`."""
    loads = np.stack(
        [
            k_first * per_layer + np.where(only, whole, pre),
            k_mid * per_layer,
            k_last * per_layer + np.where(only, whole, post),
        ]
    )
    worst = np.argmax(loads, axis=0)
    layers = np.choose(worst, [k_first, k_mid, k_last])
    return layers, np.take_along_axis(loads, worst[None], axis=0)[0]


@dataclass(frozen=True)
class StepBreakdown:
    """Per-layout arrays of where a step's time goes (seconds) and its figures of merit."""

    step: np.ndarray  # = compute + tp_comm + ep_comm + pp_comm + bubble + dp_exposed + optimizer
    compute: np.ndarray  # forward + backward (+ recomputation) on the slowest stage, all mb
    bubble: np.ndarray  # pipeline fill and drain: (p - 1) / v ticks, comm included
    tp_comm: np.ndarray  # tensor-parallel collectives, on the critical path
    ep_comm: np.ndarray  # expert-parallel all-to-alls (MoE), on the critical path
    pp_comm: np.ndarray  # pipeline sends between stages, on the critical path
    dp_comm: np.ndarray  # data-parallel / ZeRO collectives in all
    dp_exposed: np.ndarray  # the part of dp_comm not hidden under compute
    optimizer: np.ndarray
    memory: np.ndarray  # bytes per GPU (worst stage)
    fits: np.ndarray
    mfu: np.ndarray  # model FLOP/s / peak (no recomputation counted)
    hfu: np.ndarray  # hardware FLOP/s / peak, recomputation included

    def row(self, i: int) -> dict[str, float]:
        return {f.name: getattr(self, f.name)[i].item() for f in fields(self)}


class HybridModel:
    """Prices layouts of one workload on one cluster: compute from FLOPs, collectives from
    the graph (one cached GroupCost per distinct group), memory from commsim.step.memory."""

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        gpu: GPUSpec,
        n_gpus: int,
        global_batch: int,
        efficiency: float,
        grad_bytes: int = 2,
    ):
        self.workload, self.cluster, self.gpu = workload, cluster, gpu
        self.shape = Shape.of(workload)
        self.n, self.global_batch, self.grad_bytes = n_gpus, global_batch, grad_bytes
        self.flop_rate = gpu.peak_flops * efficiency
        self._orders = {k: place(cluster, n_gpus, k) for k in PLACEMENT_KINDS}
        self._affine: dict[tuple, tuple[float, float]] = {}

    def _ranks(self, placement: int, tp: int, dp: int, pp: int) -> np.ndarray:
        """GPU of each rank as [stage, data-parallel index, tensor-parallel index]."""
        return self._orders[PLACEMENT_KINDS[placement]].reshape(pp, dp, tp)

    def _groups(self, placement, kind, tp, dp, pp, ep) -> np.ndarray:
        """GPUs of every group of one kind, a row each: tensor-parallel ("tp"), data-parallel
        ("dp"), expert-parallel ("ep": ep consecutive dp ranks) or expert-data-parallel
        ("edp": the dp / ep ranks holding the same experts)."""
        ranks = self._ranks(placement, tp, dp, pp).reshape(pp, dp // ep, ep, tp)
        if kind == "tp":
            return ranks.reshape(-1, tp)
        if kind == "dp":
            return ranks.transpose(0, 3, 1, 2).reshape(-1, dp)
        if kind == "ep":
            return ranks.transpose(0, 1, 3, 2).reshape(-1, ep)
        return ranks.transpose(0, 2, 3, 1).reshape(-1, dp // ep)

    def _collective(self, op, algorithm, placement, kind, tp, dp, pp, ep=1) -> tuple[float, float]:
        """(intercept, slope) of a collective run by every group of `kind` (see _groups) of
        the layout at once: concurrent groups share NICs and uplinks, and the graph prices
        that."""
        key = (op, algorithm, placement, kind, tp, dp, pp, ep)
        if key not in self._affine:
            groups = self._groups(placement, kind, tp, dp, pp, ep)
            nodes = self.cluster.node_of(groups)
            if (nodes == nodes[:, :1]).all():
                groups = groups[:1]  # each group inside its own node: they share no link
            cost = GroupCost(self.cluster, groups)
            size = groups.shape[1]
            usable = size == 1 or algorithm in cost.algorithms(op)
            self._affine[key] = (
                (cost.affine(op, algorithm) if size > 1 else (0.0, 0.0))
                if usable
                else (np.inf, np.inf)  # tree / hierarchical need whole nodes
            )
        return self._affine[key]

    def _send(self, placement, tp, dp, pp) -> tuple[float, float]:
        """(intercept, slope per byte) of every stage handing activations to the next at
        once, each rank to its peer in the next stage (1F1B's steady state)."""
        key = ("p2p", placement, tp, dp, pp)
        if pp == 1:  # one stage: nothing to send
            return 0.0, 0.0
        if key not in self._affine:
            ranks = self._ranks(placement, tp, dp, pp)
            src, dst = ranks[:-1].ravel(), ranks[1:].ravel()
            t0 = step_time(self.cluster, src, dst, np.zeros(src.size))
            t1 = step_time(self.cluster, src, dst, np.full(src.size, 2.0**24))
            self._affine[key] = (t0, (t1 - t0) / 2.0**24)
        return self._affine[key]

    def _price(self, kind, layouts: Layouts, bytes_: np.ndarray, *args) -> np.ndarray:
        """Seconds for each layout's collective of `bytes_`, via its group's affine cost."""
        cols = [np.asarray(getattr(layouts, a) if isinstance(a, str) else a) for a in args]
        code = np.zeros(len(layouts), dtype=np.int64)  # the key columns as one mixed-radix int
        for col in cols:
            code = code * (int(col.max(initial=0)) + 1) + col.astype(np.int64)
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        costs = np.array([kind(*(int(c[i]) for c in cols)) for i in first]).reshape(-1, 2)
        return costs[inverse, 0] + costs[inverse, 1] * bytes_

    def evaluate(self, L: Layouts) -> StepBreakdown:
        """Step time, its parts, memory and utilisation of every layout."""
        sh = self.shape
        tp, pp, dp, b, m, v = L.tp, L.pp, L.dp, L.micro_batch, L.micro_batches, L.interleave
        s, h = sh.seq_len, sh.hidden
        only = pp == 1
        # the slowest stage: the first (embedding), a middle or the last (head) stage, by its
        # forward FLOPs per sample; per_stage is its layer count
        k_first, k_mid, k_last = stage_layers(sh.blocks, pp, L.first_layers, L.last_layers)
        ends = (sh.pre_flops + sh.post_flops, sh.pre_flops, sh.post_flops)
        per_stage, stage_flops = _slowest(k_first, k_mid, k_last, sh.block_flops, only, *ends)
        extra = np.select(
            [L.recompute == 2, L.recompute == 1],
            [stage_flops, per_stage * sh.attention_core_flops],
            0.0,
        )  # full: the forward again; selective: the attention core again (Korthikanti 2022)
        t_fwd = stage_flops * b / (tp * self.flop_rate)
        t_bwd = (2.0 * stage_flops + extra) * b / (tp * self.flop_rate)

        # Tensor parallel: 2 all-reduces of b s h activations per layer forward, 2 backward,
        # 2 more when a full recompute replays the forward; with sequence parallelism each is a
        # reduce-scatter + all-gather of the same volume (Korthikanti Sec. 4.2.2).
        act = b * s * h * ACT_BYTES
        ar = self._price(
            lambda alg, pl, t, d, p: self._collective(
                "all-reduce", ALGORITHMS[alg], pl, "tp", t, d, p
            ),
            L,
            act,
            "algorithm",
            "placement",
            "tp",
            "dp",
            "pp",
        )
        n_fwd = TP_ALLREDUCES_FORWARD * per_stage
        tp_f = n_fwd * ar
        tp_b = n_fwd * ar * np.where(L.recompute == 2, 2.0, 1.0)
        # Expert parallel (MoE): per MoE layer and micro-batch an all-to-all dispatches tokens
        # to their experts and one combines them back, forward and again backward (again with
        # a full recompute's replayed forward). Each GPU sends b (s / tp) h x 2 bytes x top_k x
        # capacity factor in each: every expert's buffer holds capacity factor x its even share
        # of the top_k-routed tokens (GShard, Lepikhin et al. 2020, arXiv:2006.16668; DeepSpeed-
        # MoE); sequence parallelism splits the tokens over tp. ep = 1: all experts are local.
        a2a = self._price(
            lambda pl, t, d, p, e: self._collective("all-to-all", "direct", pl, "ep", t, d, p, e),
            L,
            act * sh.routed / tp,
            "placement",
            "tp",
            "dp",
            "pp",
            "ep",
        )
        ep_f = ALL_TO_ALLS_FORWARD * per_stage * a2a
        ep_b = ep_f * np.where(L.recompute == 2, 2.0, 1.0)
        # Pipeline: each micro-batch crosses a stage boundary forward and back, v times with
        # interleaving; the tp ranks split the activation (scatter-gather optimisation).
        send = self._price(self._send, L, act / tp, "placement", "tp", "dp", "pp")
        p2p = np.where(only, 0.0, send * v)
        tick = t_fwd + t_bwd + tp_f + tp_b + ep_f + ep_b + 2.0 * p2p
        # 1F1B: (m + p - 1) ticks; interleaved with v chunks: (m + (p - 1) / v) ticks
        # (Narayanan et al. 2021, Sec. 2.2); the bubble is the (p - 1) / v extra ticks.
        ticks = m + (pp - 1) / v
        pipeline = ticks * tick

        # Data parallel: gradients of the stage's parameters (split over tp); expert ones are
        # split over ep too and reduced over the dp / ep ranks holding the same experts
        ends = (sh.pre_params + sh.post_params, sh.pre_params, sh.post_params)
        held, stage_params = _slowest(k_first, k_mid, k_last, sh.block_params, only, *ends)
        sparse = held * sh.expert_params / (tp * L.ep)
        dense = (stage_params - held * sh.expert_params) / tp
        bucket = L.bucket_mb * 2.0**20
        nb_dense = np.maximum(1.0, np.ceil(dense * self.grad_bytes / bucket))
        nb_sparse = np.maximum(1.0, np.ceil(sparse * self.grad_bytes / bucket))
        n_buckets = nb_dense + (nb_sparse if sh.expert_params else 0.0)

        def on_dp(op, nbytes, kind):
            # data-parallel gradients go by the layout's algorithm; ZeRO's reduce-scatter
            # and all-gather by ring
            return self._price(
                lambda alg, pl, t, d, p, e: self._collective(
                    op, ALGORITHMS[alg] if op == "all-reduce" else "ring", pl, kind, t, d, p, e
                ),
                L,
                nbytes,
                "algorithm",
                "placement",
                "tp",
                "dp",
                "pp",
                "ep",
            )

        def both(op, per_param):
            """Bucketed `op` of `per_param` bytes a parameter: dense over dp, experts over
            the expert-data-parallel group."""
            out = nb_dense * on_dp(op, dense * per_param / nb_dense, "dp")
            if sh.expert_params:
                out = out + nb_sparse * on_dp(op, sparse * per_param / nb_sparse, "edp")
            return out

        # ZeRO-0: all-reduce the gradient buckets. ZeRO-1/2: reduce-scatter gradients, all-gather
        # updated parameters (ZeRO Sec. 7: the same volume as an all-reduce). ZeRO-3/FSDP: per
        # micro-batch, all-gather parameters for forward and again for backward, reduce-scatter
        # gradients: 1.5x the all-reduce volume at m = 1 (ZeRO Sec. 7.2.2).
        allreduce = both("all-reduce", self.grad_bytes)
        rs = both("reduce-scatter", self.grad_bytes)
        ag = both("all-gather", PARAM_WIRE_BYTES)
        z3_mb = 2.0 * ag + rs
        dp_comm = np.select([L.zero == 0, L.zero < 3], [allreduce, rs + ag], m * z3_mb)
        # Overlap: ZeRO 0-2 sync hides under the last micro-batch's backward but for its last
        # bucket; ZeRO-3 gathers are prefetched under each micro-batch's compute, but for the
        # first layer's gather.
        window = np.where(L.overlap, t_bwd, 0.0)
        last = np.where(L.overlap, dp_comm / n_buckets, dp_comm)
        sync_exposed = np.maximum(dp_comm - window, last)
        z3_exposed = m * (np.maximum(z3_mb - (t_fwd + t_bwd), 0.0) + z3_mb / (per_stage + 1))
        dp_exposed = np.where(L.zero == 3, np.where(L.overlap, z3_exposed, dp_comm), sync_exposed)

        # ZeRO shards optimizer states over dp, expert ones over the dp / ep expert replicas
        zeroed = L.zero >= 1
        local = dense / np.where(zeroed, dp, 1) + sparse / np.where(zeroed, dp // L.ep, 1)
        optimizer = adam_step_time(local, self.gpu, self.grad_bytes)
        step = pipeline + dp_exposed + optimizer

        memory = memory_per_gpu_batch(
            self.workload,
            dp,
            tp,
            pp,
            b,
            L.zero,
            L.recompute,
            tp > 1,
            v,
            seq_len=s,
            micro_batches=m,
            grad_bytes=self.grad_bytes,
            bucket_mb=L.bucket_mb,
            ep=L.ep,
            first_layers=L.first_layers,
            last_layers=L.last_layers,
        )
        peak = self.n * self.gpu.peak_flops
        model = 3.0 * sh.model_flops * self.global_batch
        recomputed = (
            np.select(
                [L.recompute == 2, L.recompute == 1],
                [sh.model_flops, sh.blocks * sh.attention_core_flops],
                0.0,
            )
            * self.global_batch
        )
        return StepBreakdown(
            step=step,
            compute=m * (t_fwd + t_bwd),
            bubble=(pp - 1) / v * tick,
            tp_comm=m * (tp_f + tp_b),
            ep_comm=m * (ep_f + ep_b),
            pp_comm=m * 2.0 * p2p,
            dp_comm=dp_comm,
            dp_exposed=dp_exposed,
            optimizer=optimizer,
            memory=memory,
            fits=memory <= usable_bytes(self.gpu),
            mfu=model / step / peak,
            hfu=(model + recomputed) / step / peak,
        )
