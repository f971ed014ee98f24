"""The training step, one model for every layout, vectorised over many layouts at once.

Data x tensor x pipeline x context x expert parallelism with ZeRO/FSDP, sequence
parallelism and activation recomputation, as Megatron-LM lays a transformer out (Narayanan
et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21; Korthikanti et al. 2022); plain DDP is the layout with none of them.
Every quantity is a numpy array with one entry per layout, so a planner prices 100,000s of
layouts in one pass, and `predict` prices one the same way.

Per micro-batch on the slowest pipeline stage: its compute (step.compute's roofline, or
FLOPs at one efficiency), the collectives on its critical path (tensor-parallel, context-
parallel ring attention, expert all-to-alls, ZeRO-3/FSDP gathers not hidden by prefetch,
pipeline sends) make a tick; the pipeline takes (m + (p - 1) / v) ticks (DualPipe: m ticks
and its own bubble, step.dualpipe). Then the ZeRO 0-2 data-parallel sync not hidden under
the last backward (step.dpsync) and the optimizer.
Collectives are priced on the cluster graph, every concurrent group at once (step.groups).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from commsim.specs import GPUSpec
from commsim.step.activations import replays_core
from commsim.step.breakdown import MEMORY_RESERVE, usable_bytes
from commsim.step.compute import StageTimes, stage_times
from commsim.step.contention import (
    beside_sync,
    collective_hbm_bytes,
    contended_attention,
    contended_compute,
    exposed,
    slowdown,
)
from commsim.step.context import merge_bytes, replays_attention, te_ring
from commsim.step.dpsync import DataParallel
from commsim.step.dualpipe import bubble as dualpipe_bubble
from commsim.step.eager import torchtitan
from commsim.step.fsdp import fsdp_per_micro_batch
from commsim.step.gemm import Rates
from commsim.step.groups import Groups, group_rows
from commsim.step.layouts import Layouts
from commsim.step.memory import memory_per_gpu_batch
from commsim.step.optimizer import adam_step_time
from commsim.step.pipeline import schedule_group
from commsim.step.shape import Shape, slowest, stage_layers
from commsim.step.torch_ring import torch_ring
from commsim.step.tpoverlap import userbuffers
from commsim.step.workspace import workspace_bytes
from commsim.topology.build import Cluster
from commsim.workload.model import BACKWARD_FACTOR, Workload

ACT_BYTES = 2  # bf16 activations on the wire (tensor-parallel collectives, pipeline sends)
ALL_TO_ALLS_FORWARD = 2  # per MoE layer: dispatch tokens to experts, combine them back (GShard)


def tp_bytes(L: Layouts, sh: Shape) -> np.ndarray:
    """Bytes of one tensor-parallel all-reduce: a micro-batch's b s h activations (bf16)."""
    return L.micro_batch * sh.seq_len / L.cp * sh.hidden * ACT_BYTES


def ep_bytes(L: Layouts, sh: Shape) -> np.ndarray:
    """Bytes one GPU sends in an expert all-to-all (_expert_parallel's formula)."""
    return tp_bytes(L, sh) * sh.routed / L.tp


def cp_bytes(L: Layouts, sh: Shape, arch) -> np.ndarray:
    """Bytes of one ring-attention step: this rank's K and V chunk (b s / cp tokens, the kv
    heads' width split over tp, bf16) to its next context-parallel rank."""
    kv = 2 * arch.kv_heads * arch.head_width
    return L.micro_batch * sh.seq_len / L.cp * kv / L.tp * ACT_BYTES


def cp_merge_bytes(L: Layouts, sh: Shape, arch) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes of merging a layer's ring-attention steps on one GPU, forward and backward
    (step.context.merge_bytes), for this rank's queries and keys (b s / cp tokens, split
    over tp)."""
    tokens = L.micro_batch * sh.seq_len / L.cp
    keys = tokens * arch.kv_heads * arch.head_width / L.tp
    return merge_bytes(L.cp, tokens * arch.heads * arch.head_width / L.tp, keys)


def etp_bytes(L: Layouts, sh: Shape) -> np.ndarray:
    """Bytes of the expert tensor-parallel all-gather's output (and the reduce-scatter's
    input) around the experts: the etp ranks' received token copies (_expert_parallel)."""
    return ep_bytes(L, sh) * L.expert_tp


def send_bytes(L: Layouts, sh: Shape) -> np.ndarray:
    """Bytes of one stage hand-off: the activations split over the tp ranks."""
    return tp_bytes(L, sh) / L.tp


def state_grad_bytes(plain, grad_bytes, fp32_buffer=False):
    """Gradient bytes a parameter's training state is counted with. Plain DDP under
    torch.amp keeps fp32 weights (4 B), fp32 gradients (4 B) and Adam's m and v (8 B): 16 B
    a parameter, the same total as the memory model's mixed-precision split 2 + 2 + 12, so
    that split is used with 2-byte gradients; Megatron keeps bf16 weights and fp32 main
    gradients: 2 + 4 + 12. Gradients accumulated in an fp32 buffer (grad_accumulation
    "fp32": Megatron's fp32 main_grad, DeepSpeed's BF16_Optimizer fp32 gradients of the
    whole model, step.compute's FP32_GRAD_ADD) take 4 B whatever dtype goes on the wire."""
    return np.where(plain, 2, np.where(fp32_buffer, np.maximum(grad_bytes, 4), grad_bytes))


def schedule_groups(pp: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Micro-batches in the first and the last group of each layout's interleaved schedule
    (pipeline.schedule_group): how many forwards of chunk c precede chunk c + 1's on the
    first stage, and backwards of chunk c + 1 its last of chunk c in the cool-down."""
    pp, m = np.asarray(pp, dtype=np.int64), np.asarray(m, dtype=np.int64)
    keys, inverse = np.unique(pp * (int(m.max(initial=0)) + 1) + m, return_inverse=True)
    firsts = np.zeros(len(keys), dtype=np.int64)
    firsts[inverse] = np.arange(len(pp))  # a row of each pair
    p_, m_ = pp[firsts], m[firsts]
    size = np.array([schedule_group(int(a), int(b)) for a, b in zip(p_, m_, strict=True)])
    first = np.minimum(size, m_)[inverse]
    last = ((m_ - 1) % size + 1)[inverse]
    return first.astype(float), last.astype(float)


@dataclass(frozen=True)
class StepBreakdown:
    """Per-layout arrays of where a step's time goes (seconds) and its figures of merit."""

    step: np.ndarray  # = compute + tp + cp + ep + pp comm + bubble + dp_exposed + optimizer
    compute: np.ndarray  # forward + backward (+ recomputation) on the slowest stage, all mb
    forward: np.ndarray  # of compute: the forwards
    backward: np.ndarray  # of compute: the backwards (recomputation included)
    bubble: np.ndarray  # pipeline fill and drain: (p - 1) / v ticks (DualPipe's), comm included
    tp_comm: np.ndarray  # tensor-parallel collectives on the critical path (after overlap)
    cp_comm: np.ndarray  # context-parallel K/V exchange not hidden under attention
    ep_comm: np.ndarray  # expert all-to-alls and etp gathers (MoE), on the critical path
    pp_comm: np.ndarray  # pipeline sends between stages, on the critical path
    comm_forward: np.ndarray  # of tp + cp + ep comm: the forwards' share
    dp_comm: np.ndarray  # data-parallel / ZeRO collectives in all
    dp_exposed: np.ndarray  # the data-parallel sync (and a comm hook's codec) not hidden
    codec: np.ndarray  # a comm hook's encode + decode (compute-stream seconds)
    sync_rate: np.ndarray  # the backward's rate beside the ZeRO 0-2 reductions (contention)
    optimizer: np.ndarray
    memory: np.ndarray  # bytes per GPU (worst stage)
    fits: np.ndarray
    mfu: np.ndarray  # model FLOP/s / peak (no recomputation counted)
    hfu: np.ndarray  # hardware FLOP/s / peak, recomputation included
    wgrad: np.ndarray  # of backward: the weight-gradient part (compute.weight_gradient)

    def row(self, i: int) -> dict[str, float]:
        return {f.name: getattr(self, f.name)[i].item() for f in fields(self)}

    @classmethod
    def concat(cls, parts: list[StepBreakdown]) -> StepBreakdown:
        """The breakdowns of several sets of layouts, one after another."""
        columns = {f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)}
        return cls(**columns)


@dataclass(frozen=True)
class Compute:
    """Per micro-batch compute of each layout's slowest stage: its blocks, forward and
    backward seconds (recomputation included), and one block's forward, backward and
    linear-layer GEMM seconds (what collectives overlap with), and of the backward the
    weight-gradient part (DualPipe's W)."""

    blocks: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    block_fwd: np.ndarray
    block_bwd: np.ndarray
    core_fwd: np.ndarray
    wgrad: np.ndarray


class StepModel:
    """Prices layouts of one workload on one cluster: compute by the roofline of
    step.compute (or FLOPs at one `efficiency`), collectives from the graph (one cached
    GroupCost per distinct group), memory from step.memory."""

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        gpu: GPUSpec,
        n_gpus: int,
        global_batch: int,
        efficiency: float | None,
        reserve: float = MEMORY_RESERVE,
    ):
        self.workload, self.cluster, self.gpu = workload, cluster, gpu
        self.shape = Shape.of(workload)
        self.n, self.global_batch = n_gpus, global_batch
        self.efficiency = efficiency
        self.usable = usable_bytes(gpu, reserve)  # bytes of HBM a training process may fill
        self.groups = Groups(cluster, n_gpus)
        self._nccl: dict[tuple, float] = {}  # NCCL buffer bytes of each set of groups
        self.dp = DataParallel(workload, self.shape, gpu, self.groups)

    @staticmethod
    def _pipeline(L: Layouts, tick, back, wgrad) -> tuple[np.ndarray, np.ndarray]:
        """(pipeline seconds, bubble seconds): m ticks and the bubble. 1F1B's is p - 1
        ticks; interleaved with v chunks (p - 1) / v (Narayanan et al. 2021, Sec. 2.2);
        DualPipe's (p / 2 - 1)(F&B + B - 3W) (step.dualpipe), F&B a tick, B a backward
        `back`, W its weight-gradient part `wgrad`."""
        dual = dualpipe_bubble(L.pp, tick, back, wgrad)
        bubble = np.where(L.schedule == 1, dual, (L.pp - 1) / L.interleave * tick)
        return L.micro_batches * tick + bubble, bubble

    def step_bound(self, L: Layouts) -> np.ndarray:
        """A lower bound on each layout's step (evaluate's), priced with no network: its
        pipeline of compute-only ticks; communication, the sync's tail and the optimizer
        only add to it. A planner after the best layout skips those whose bound passes it."""
        c = self.compute(L)
        return self._pipeline(L, c.forward + c.backward, c.backward, c.wgrad)[0]

    def evaluate(self, L: Layouts) -> StepBreakdown:
        """Step time, its parts, memory and utilisation of every layout."""
        sh = self.shape
        pp, m, v = L.pp, L.micro_batches, L.interleave
        c = self.compute(L)
        tp_f, tp_b = self._tensor_parallel(L, c)
        cp_f, cp_b = self._context_parallel(L, c)
        ep_f, ep_b = self._expert_parallel(L, c)
        z3_net, z3_exposed = fsdp_per_micro_batch(self, L, c)
        send = np.where(pp == 1, 0.0, self._sends(L))  # one hand-off
        p2p = send * v
        comm = tp_f + tp_b + cp_f + cp_b + ep_f + ep_b + z3_exposed
        tick = c.forward + c.backward + comm + 2.0 * p2p
        back = c.backward + tp_b + cp_b + ep_b + p2p  # DualPipe's B: a backward, its sends
        pipeline, bubble = self._pipeline(L, tick, back, c.wgrad)
        # the ZeRO 0-2 sync (step.dpsync): under the last backward of the stage, or with v
        # chunks under the cool-down's g chunk backwards a chunk (each with its send); the
        # parameter gathers under the first forward, or the first group's chunk forwards
        span_b, span_f = c.backward + tp_b + cp_b + ep_b, c.forward + tp_f + cp_f + ep_f
        first, last = schedule_groups(pp, m)
        x_b = np.where(v > 1, last * (span_b / v + send), span_b)
        x_f = np.where(v > 1, first * (span_f / v + send), span_f)
        slowed = beside_sync(self, L, c)
        dp_comm, tail, codec, local_params, sync_rate = self.dp.sync(L, x_b, x_f, slowed)
        zero3 = L.zero == 3
        optimizer = adam_step_time(local_params, self.gpu, L.grad_bytes, L.moment_bytes, L.kernels)
        step = pipeline + tail + optimizer
        memory = self.memory(L)
        peak = self.n * self.gpu.peak_flops
        model = 3.0 * sh.model_flops * self.global_batch
        recomputed = np.select(
            [L.recompute == 2, replays_core(L.recompute, L.recompute_parts), L.recompute == 3],
            [sh.model_flops, sh.blocks * sh.attention_core_flops, sh.blocks * sh.op_replay_flops],
            0.0,
        )
        gemms = self._module_replay(L) * sh.module_flops(L.recompute_parts)
        recomputed = recomputed + sh.blocks * gemms
        return StepBreakdown(
            step=step,
            compute=m * (c.forward + c.backward),
            forward=m * c.forward,
            backward=m * c.backward,
            bubble=bubble,
            tp_comm=m * (tp_f + tp_b),
            cp_comm=m * (cp_f + cp_b),
            ep_comm=m * (ep_f + ep_b),
            pp_comm=m * 2.0 * p2p,
            comm_forward=m * (tp_f + cp_f + ep_f),
            dp_comm=np.where(zero3, m * z3_net, dp_comm),
            dp_exposed=np.where(zero3, m * z3_exposed, tail),
            codec=codec,
            sync_rate=sync_rate,
            optimizer=optimizer,
            memory=memory,
            fits=memory <= self.usable,
            mfu=model / step / peak,
            hfu=(model + recomputed * self.global_batch) / step / peak,
            wgrad=m * c.wgrad,
        )

    @staticmethod
    def _module_replay(L: Layouts) -> np.ndarray:
        """1 where a layout recomputes any of the RECOMPUTE_MODULES and no full or op-level
        recomputation replays the forward anyway (the modules free nothing there:
        step.activations), else 0."""
        free = np.isin(L.recompute, (0, 1))
        return np.where(free & (L.recompute_parts > 0), 1.0, 0.0)

    def compute(self, L: Layouts, rates: Rates | None = None) -> Compute:
        """Each layout's slowest stage (the first, with the embedding; a middle one; the
        last, with the head and loss: by compute time) and its compute per micro-batch, at
        the roofline's `rates` where given (step.contention)."""
        sh = self.shape
        t = self._stage_times(L, rates)
        first, mid, last = stage_layers(sh.blocks, L.pp, L.first_layers, L.last_layers)
        per_block = t.block_fwd + t.block_bwd
        pre, post = t.pre_fwd + t.pre_bwd, t.post_fwd + t.post_bwd
        # DualPipe: the end ranks run the first and the last stage by turns, a middle rank
        # two middle stages: per micro-batch, the mean of the first's and the last's
        dual = L.schedule == 1
        ends, pair = (first + last) / 2, (pre + post) / 2
        first, last = np.where(dual, ends, first), np.where(dual, ends, last)
        pre, post = np.where(dual, pair, pre), np.where(dual, pair, post)
        which, blocks, _ = slowest(first, mid, last, per_block, L.pp == 1, pre + post, pre, post)
        pre_on = np.where(dual, 0.5 * (which != 1), (which == 0) | (L.pp == 1))
        post_on = np.where(dual, 0.5 * (which != 1), (which == 2) | (L.pp == 1))
        forward = blocks * t.block_fwd + pre_on * t.pre_fwd + post_on * t.post_fwd
        backward = blocks * t.block_bwd + pre_on * t.pre_bwd + post_on * t.post_bwd
        wgrad = blocks * t.block_wgrad + pre_on * t.pre_wgrad + post_on * t.post_wgrad
        # full: the forward again; selective: the attention core again (Korthikanti 2022);
        # op: the matmuls and element-wise work op-level checkpointing did not keep; the
        # recompute_modules' forward beside none or selective
        extra = np.select(
            [L.recompute == 2, replays_core(L.recompute, L.recompute_parts), L.recompute == 3],
            [forward, blocks * t.core_fwd, blocks * t.op_replay],
        )
        extra = extra + self._module_replay(L) * blocks * t.module_replay
        backward = backward + extra
        return Compute(blocks, forward, backward, t.block_fwd, t.block_bwd, t.core_fwd, wgrad)

    def single_gpu_step(self, L: Layouts) -> np.ndarray:
        """Seconds one GPU takes for the global batch, by accumulation at each layout's
        micro-batch and kernels, with no communication or recomputation: the reference of
        scaling efficiency."""
        one = Layouts.build(
            micro_batch=L.micro_batch,
            fp8=L.fp8,
            flash=L.flash,
            grad_dtype=L.grad_dtype,
            kernels=L.kernels,  # the stack's element-wise kernels, as the layout runs them
            norm_backward=L.norm_backward,
        )
        c = self.compute(one)
        steps = self.global_batch / L.micro_batch
        return steps * (c.forward + c.backward) + adam_step_time(
            self.shape.total_params, self.gpu, L.grad_bytes, L.moment_bytes, L.kernels
        )

    def linear_flops(self, fp8) -> np.ndarray:
        """FLOP/s a GPU runs the blocks' linear layers at under one efficiency: FP8 layouts
        (`fp8`) at the FP8 peak's, the rest at the BF16 peak's."""
        fp8_speedup = (self.gpu.fp8_flops or self.gpu.peak_flops) / self.gpu.peak_flops
        return self.gpu.peak_flops * self.efficiency * np.where(fp8, fp8_speedup, 1.0)

    def _stage_times(self, L: Layouts, rates: Rates | None = None) -> StageTimes:
        """The roofline's per-block and end-layer times, or, with one efficiency, FLOPs /
        (peak x efficiency) for everything (a calibration profile's measured rate); FP8
        layouts run the blocks' linear layers at the FP8 peak, attention at BF16's."""
        if self.efficiency is None:
            return stage_times(self.workload, self.gpu, L, rates)
        sh = self.shape
        rate = L.tp * L.cp * self.gpu.peak_flops * self.efficiency / L.micro_batch
        linear_rate = L.tp * L.cp * self.linear_flops(L.fp8) / L.micro_batch
        core = sh.attention_core_flops / rate
        linear = (sh.block_flops - sh.attention_core_flops) / linear_rate
        block = linear + core
        replay = sh.op_replay_flops / linear_rate
        modules = sh.module_flops(L.recompute_parts) / linear_rate
        pre, post = sh.pre_flops / rate, sh.post_flops / rate
        b = BACKWARD_FACTOR
        if not sh.blocks:  # no blocks: the whole model as the layers before them
            pre = sh.model_flops / rate
        times = (block, b * block, core, replay, pre, b * pre, post, b * post, modules)
        # W: the linear layers' weight-gradient GEMMs, a forward's FLOPs (weight_gradient)
        return StageTimes(*times, block_wgrad=linear, pre_wgrad=pre, post_wgrad=post)

    def _tensor_parallel(self, L: Layouts, c: Compute):
        """Seconds of tensor-parallel collectives on the critical path per micro-batch,
        forward and backward: 2 all-reduces of b s h activations per layer forward, 2
        backward, 2 more when a full recompute replays the forward; with sequence
        parallelism each is a reduce-scatter + all-gather of the same volume (Korthikanti
        Sec. 4.2.2). With tp_overlap (Transformer Engine's userbuffers, Megatron-core
        --tp-comm-overlap) each runs under its GEMM, chunked: what the pair takes beyond the
        GEMM alone (step.tpoverlap), again where a full recompute replays the forward."""
        nbytes = tp_bytes(L, self.shape)
        ar = self.groups.price("all-reduce", "tp", L, nbytes)
        full = np.where(L.recompute == 2, 1.0, 0.0)
        fwd = self.shape.tp_collectives * ar
        bwd = fwd * (1.0 + full)
        if L.tp_overlap.any() and self.workload.arch is not None:
            ub_f, ub_b = userbuffers(self, L, nbytes)
            fwd = np.where(L.tp_overlap, ub_f, fwd)
            bwd = np.where(L.tp_overlap, ub_b + full * ub_f, bwd)
        return c.blocks * fwd, c.blocks * bwd

    def _context_parallel(self, L: Layouts, c: Compute):
        """Seconds of ring attention per micro-batch beyond its share of the compute, forward
        and backward: each layer's ring (rings) summed."""
        if self.workload.arch is None:
            zero = np.zeros(len(L))
            return zero, zero
        titan, te, torch = self.rings(L, c)
        fwd, bwd = te.per_layer()
        if torch is not None:
            torch_f, torch_b = torch.per_layer()
            fwd, bwd = np.where(titan, torch_f, fwd), np.where(titan, torch_b, bwd)
        return c.blocks * fwd, c.blocks * bwd

    def rings(self, L: Layouts, c: Compute):
        """(which layouts run PyTorch's ring, Transformer Engine's ring, PyTorch's or None)
        of one layer as their steps (step.ringsteps), what _context_parallel sums and the
        Chakra export writes: TE's K/V transfers beside attention on the SMs NCCL's p2p
        channels leave and its merges (step.context), torchtitan's stacks' (step.torch_ring);
        recomputation that replays attention (selective or full) replays the ring too."""
        nbytes = cp_bytes(L, self.shape, self.workload.arch)
        step = self.groups.price("send-recv", "cp", L, nbytes)
        merge = cp_merge_bytes(L, self.shape, self.workload.arch)
        slow = contended_attention(self, L, "cp", step, c.core_fwd, p2p=True)
        again = replays_attention(L.recompute, L.recompute_parts)
        hbm = self.gpu.stream_bandwidth
        te = te_ring(L.cp, step, c.core_fwd, merge, hbm, slow, nbytes, again)
        titan = torchtitan(L.kernels) & (L.cp > 1)  # PyTorch's context_parallel
        return titan, te, torch_ring(self, L, c, again) if titan.any() else None

    def _expert_parallel(self, L: Layouts, c: Compute):
        """Seconds of the expert layers' collectives per micro-batch, forward and backward:
        per MoE layer one all-to-all dispatches tokens to their experts and one combines
        them back, again backward (and with a full recompute's replayed forward). Each GPU
        sends b (s / cp / tp) h x 2 bytes x top_k x capacity factor in each: every expert's
        buffer holds capacity factor x its even share of the top_k-routed tokens (GShard,
        Lepikhin et al. 2020, arXiv:2006.16668; DeepSpeed-MoE); sequence parallelism splits
        the tokens over tp. With expert tensor parallelism (etp > 1) the received copies are
        all-gathered over the etp group before the experts and reduce-scattered after them
        (Megatron-core's all-to-all dispatcher), priced as an all-reduce of the gathered
        bytes as tensor parallelism's are. ep = etp = 1: all experts are local. With
        ep_overlap, a micro-batch's all-to-alls run under another's compute (Megatron-core's
        1F1B A2A overlap merges one micro-batch's forward with another's backward; DeepSeek-V3's
        DualPipe, arXiv:2412.19437 Sec. 3.2.1, pairs chunks the same way): only what outlasts
        a micro-batch's forward and backward shows, and only with two micro-batches or more."""
        sh = self.shape
        if not sh.routed:
            zero = np.zeros(len(L))
            return zero, zero
        a2a = self.groups.price("all-to-all", "ep", L, ep_bytes(L, sh))
        gather = self.groups.price("all-reduce", "etp", L, etp_bytes(L, sh))
        forward = sh.moe_share * c.blocks * ALL_TO_ALLS_FORWARD * a2a
        backward = forward * np.where(L.recompute == 2, 2.0, 1.0)
        both = forward + backward
        hides = L.ep_overlap & (L.micro_batches > 1)
        moved = collective_hbm_bytes("all-to-all", ep_bytes(L, sh), L.ep)
        slow = contended_compute(self, L, "ep", moved, a2a) if hides.any() else None
        both_c = c.forward + c.backward  # beside the all-to-alls at its blocks' rate
        slow = None if slow is None else slow.block_fwd + slow.block_bwd
        rate = slowdown(c.block_fwd + c.block_bwd, slow)
        beyond = exposed(both_c, both_c / rate, both)
        with np.errstate(divide="ignore", invalid="ignore"):
            shown = np.where(hides, beyond / both, 1.0)
        shown = np.where(both > 0, shown, 1.0)
        etp = sh.moe_share * c.blocks * gather
        return forward * shown + etp, backward * shown + etp * np.where(L.recompute == 2, 2, 1)

    def _sends(self, L: Layouts) -> np.ndarray:
        """Seconds of one activation hand-off between neighbouring stages: each micro-batch
        crosses a stage boundary forward and back, v times with interleaving; the tp ranks
        split the activation (scatter-gather optimisation)."""
        act = send_bytes(L, self.shape)
        cols = (L.placement, L.tp, L.dp, L.pp, L.cp, L.order)
        inverse, firsts = group_rows(list(cols))
        line = np.array(
            [self.groups.send(*(int(col[i]) for col in cols)) for i in firsts.tolist()]
        ).reshape(-1, 2)
        return line[inverse, 0] + line[inverse, 1] * act

    def workspace(self, L: Layouts) -> np.ndarray:
        """Bytes each layout holds outside its tensors (step.workspace), the userbuffers of
        a micro-batch's activations (tp_bytes' values) with tp_overlap."""
        values = tp_bytes(L, self.shape) / ACT_BYTES
        return workspace_bytes(self.gpu, self.groups, L, self._nccl, values)

    def memory(self, L: Layouts) -> np.ndarray:
        """Bytes per GPU on the fullest stage (step.memory) with the workspace; error feedback
        with a lossy compressor (code 0 is "none") keeps a residual in the gradients' dtype."""
        return memory_per_gpu_batch(
            self.workload,
            L.dp,
            L.tp,
            L.pp,
            L.micro_batch,
            L.zero,
            L.recompute,
            L.sequence_parallel & (L.tp > 1),
            L.interleave,
            seq_len=self.shape.seq_len if self.shape.hidden else None,
            micro_batches=L.micro_batches,
            grad_bytes=state_grad_bytes(L.plain, L.grad_bytes, L.grad_accumulation == 2),
            bucket_mb=L.bucket_mb,
            ep=L.ep,
            etp=L.etp,
            first_layers=L.first_layers,
            last_layers=L.last_layers,
            cp=L.cp,
            flash=L.flash,
            shard=L.fsdp_shard,
            fsdp_states=L.fsdp_states,
            fp8=L.fp8,
            moment_bytes=L.moment_bytes,
            recompute_parts=L.recompute_parts,
            fp8_param=L.fp8_param,
            fp8_cache=L.fp8_cache,
            dualpipe=L.schedule == 1,
            reshard=L.reshard,
            kv_gather=torchtitan(L.kernels) & (L.cp > 1),
            residual_bytes=np.where(L.error_feedback & (L.compression != 0), L.grad_bytes, 0),
            workspace=self.workspace(L),
        )
