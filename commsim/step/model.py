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
pipeline sends) make a tick; the pipeline takes (m + (p - 1) / v) ticks. Then the ZeRO 0-2
data-parallel sync not hidden under the last backward (step.dpsync) and the optimizer.
Collectives are priced on the cluster graph, every concurrent group at once (step.groups).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from commsim.specs import GPUSpec
from commsim.step.compute import StageTimes, stage_times
from commsim.step.dpsync import DataParallel
from commsim.step.fsdp import fsdp_per_micro_batch
from commsim.step.groups import Groups, _group_rows
from commsim.step.layouts import Layouts
from commsim.step.memory import memory_per_gpu_batch, usable_bytes
from commsim.step.shape import Shape, slowest, stage_layers
from commsim.step.timeline import adam_step_time
from commsim.topology.build import Cluster
from commsim.workload.model import BACKWARD_FACTOR, Workload

ACT_BYTES = 2  # bf16 activations on the wire (tensor-parallel collectives, pipeline sends)
TP_ALLREDUCES_FORWARD = 2  # per layer: after attention, after the MLP (Shoeybi et al. 2019)
ALL_TO_ALLS_FORWARD = 2  # per MoE layer: dispatch tokens to experts, combine them back (GShard)


def tp_bytes(L: Layouts, sh: Shape) -> np.ndarray:
    """Bytes of one tensor-parallel all-reduce: a micro-batch's b s h activations (bf16)."""
    return L.micro_batch * sh.seq_len / L.cp * sh.hidden * ACT_BYTES


def ep_bytes(L: Layouts, sh: Shape) -> np.ndarray:
    """Bytes one GPU sends in an expert all-to-all (_expert_parallel's formula)."""
    return tp_bytes(L, sh) * sh.routed / L.tp


def send_bytes(L: Layouts, sh: Shape) -> np.ndarray:
    """Bytes of one stage hand-off: the activations split over the tp ranks."""
    return tp_bytes(L, sh) / L.tp


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

    step: np.ndarray  # = compute + tp + cp + ep + pp comm + bubble + dp_exposed + optimizer
    compute: np.ndarray  # forward + backward (+ recomputation) on the slowest stage, all mb
    forward: np.ndarray  # of compute: the forwards
    backward: np.ndarray  # of compute: the backwards (recomputation included)
    bubble: np.ndarray  # pipeline fill and drain: (p - 1) / v ticks, comm included
    tp_comm: np.ndarray  # tensor-parallel collectives on the critical path (after overlap)
    cp_comm: np.ndarray  # context-parallel K/V exchange not hidden under attention
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
        columns = {f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)}
        return cls(**columns)


@dataclass(frozen=True)
class Compute:
    """Per micro-batch compute of each layout's slowest stage: its blocks, forward and
    backward seconds (recomputation included), and one block's forward, backward and
    linear-layer GEMM seconds (what collectives overlap with)."""

    blocks: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    block_fwd: np.ndarray
    block_bwd: np.ndarray
    core_fwd: np.ndarray


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
    ):
        self.workload, self.cluster, self.gpu = workload, cluster, gpu
        self.shape = Shape.of(workload)
        self.n, self.global_batch = n_gpus, global_batch
        self.efficiency = efficiency
        self.usable = usable_bytes(gpu)  # bytes of HBM a training process may fill
        self.groups = Groups(cluster, n_gpus)
        self.dp = DataParallel(workload, self.shape, gpu, self.groups)

    @staticmethod
    def _pipeline(L: Layouts, tick: np.ndarray) -> np.ndarray:
        """1F1B: (m + p - 1) ticks; interleaved with v chunks: (m + (p - 1) / v) ticks
        (Narayanan et al. 2021, Sec. 2.2); the bubble is the (p - 1) / v extra ticks."""
        return (L.micro_batches + (L.pp - 1) / L.interleave) * tick

    def step_bound(self, L: Layouts) -> np.ndarray:
        """A lower bound on each layout's step (evaluate's), priced with no network: its
        pipeline of compute-only ticks; communication, the sync's tail and the optimizer
        only add to it. A planner after the best layout skips those whose bound passes it."""
        c = self.compute(L)
        return self._pipeline(L, c.forward + c.backward)

    def evaluate(self, L: Layouts) -> StepBreakdown:
        """Step time, its parts, memory and utilisation of every layout."""
        sh = self.shape
        pp, m, v = L.pp, L.micro_batches, L.interleave
        c = self.compute(L)
        tp_f, tp_b = self._tensor_parallel(L, c)
        cp_f, cp_b = self._context_parallel(L, c)
        ep_f, ep_b = self._expert_parallel(L, c.blocks)
        z3_net, z3_exposed = fsdp_per_micro_batch(self, L, c)
        p2p = np.where(pp == 1, 0.0, self._sends(L) * v)
        comm = tp_f + tp_b + cp_f + cp_b + ep_f + ep_b + z3_exposed
        tick = c.forward + c.backward + comm + 2.0 * p2p
        pipeline = self._pipeline(L, tick)
        # the ZeRO 0-2 sync hides under the last micro-batch's backward, its collectives too
        span = c.backward + tp_b + cp_b + ep_b
        dp_comm, tail, codec, local_params = self.dp.sync(L, span)
        zero3 = L.zero == 3
        optimizer = adam_step_time(local_params, self.gpu, L.grad_bytes)
        step = pipeline + tail + optimizer
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
            compute=m * (c.forward + c.backward),
            forward=m * c.forward,
            backward=m * c.backward,
            bubble=(pp - 1) / v * tick,
            tp_comm=m * (tp_f + tp_b),
            cp_comm=m * (cp_f + cp_b),
            ep_comm=m * (ep_f + ep_b),
            pp_comm=m * 2.0 * p2p,
            dp_comm=np.where(zero3, m * z3_net, dp_comm),
            dp_exposed=np.where(zero3, m * z3_exposed, tail),
            codec=codec,
            optimizer=optimizer,
            memory=memory,
            fits=memory <= self.usable,
            mfu=model / step / peak,
            hfu=(model + recomputed * self.global_batch) / step / peak,
        )

    def compute(self, L: Layouts) -> Compute:
        """Each layout's slowest stage (the first, with the embedding; a middle one; the
        last, with the head and loss: by compute time) and its compute per micro-batch."""
        sh = self.shape
        t = self._stage_times(L)
        k = stage_layers(sh.blocks, L.pp, L.first_layers, L.last_layers)
        per_block = t.block_fwd + t.block_bwd
        pre, post = t.pre_fwd + t.pre_bwd, t.post_fwd + t.post_bwd
        which, blocks, _ = slowest(*k, per_block, L.pp == 1, pre + post, pre, post)
        pre_on = (which == 0) | (L.pp == 1)
        post_on = (which == 2) | (L.pp == 1)
        forward = blocks * t.block_fwd + pre_on * t.pre_fwd + post_on * t.post_fwd
        backward = blocks * t.block_bwd + pre_on * t.pre_bwd + post_on * t.post_bwd
        # full: the forward again; selective: the attention core again (Korthikanti 2022)
        extra = np.select([L.recompute == 2, L.recompute == 1], [forward, blocks * t.core_fwd])
        return Compute(blocks, forward, backward + extra, t.block_fwd, t.block_bwd, t.core_fwd)

    def single_gpu_step(self, L: Layouts) -> np.ndarray:
        """Seconds one GPU takes for the global batch, by accumulation at each layout's
        micro-batch and kernels, with no communication or recomputation: the reference of
        scaling efficiency."""
        one = Layouts.build(
            micro_batch=L.micro_batch, fp8=L.fp8, flash=L.flash, grad_dtype=L.grad_dtype
        )
        c = self.compute(one)
        steps = self.global_batch / L.micro_batch
        return steps * (c.forward + c.backward) + adam_step_time(
            self.shape.total_params, self.gpu, L.grad_bytes
        )

    def _stage_times(self, L: Layouts) -> StageTimes:
        """The roofline's per-block and end-layer times, or, with one efficiency, FLOPs /
        (peak x efficiency) for everything (a calibration profile's measured rate); FP8
        layouts run the blocks' linear layers at the FP8 peak, attention at BF16's."""
        if self.efficiency is None:
            return stage_times(self.workload, self.gpu, L)
        sh = self.shape
        rate = L.tp * L.cp * self.gpu.peak_flops * self.efficiency / L.micro_batch
        fp8_speedup = (self.gpu.fp8_flops or self.gpu.peak_flops) / self.gpu.peak_flops
        linear_rate = rate * np.where(L.fp8, fp8_speedup, 1.0)
        core = sh.attention_core_flops / rate
        block = (sh.block_flops - sh.attention_core_flops) / linear_rate + core
        pre, post = sh.pre_flops / rate, sh.post_flops / rate
        b = BACKWARD_FACTOR
        if not sh.blocks:  # no blocks: the whole model as the layers before them
            pre = sh.model_flops / rate
        return StageTimes(block, b * block, core, pre, b * pre, post, b * post)

    def _tensor_parallel(self, L: Layouts, c: Compute):
        """Seconds of tensor-parallel collectives on the critical path per micro-batch,
        forward and backward: 2 all-reduces of b s h activations per layer forward, 2
        backward, 2 more when a full recompute replays the forward; with sequence
        parallelism each is a reduce-scatter + all-gather of the same volume (Korthikanti
        Sec. 4.2.2). With tp_overlap (Transformer Engine's userbuffers, Megatron-core
        --tp-comm-overlap) they run under the block's compute: only what exceeds it shows."""
        ar = self.groups.price("all-reduce", "tp", L, tp_bytes(L, self.shape))
        fwd = TP_ALLREDUCES_FORWARD * ar
        bwd = fwd * np.where(L.recompute == 2, 2.0, 1.0)
        fwd = np.where(L.tp_overlap, np.maximum(fwd - c.block_fwd, 0.0), fwd)
        bwd = np.where(L.tp_overlap, np.maximum(bwd - c.block_bwd, 0.0), bwd)
        return c.blocks * fwd, c.blocks * bwd

    def _context_parallel(self, L: Layouts, c: Compute):
        """Seconds of ring attention's K/V exchange not hidden under attention, per micro-
        batch (Megatron-core / Transformer Engine context parallelism, Liu et al. 2023 ring
        attention): cp - 1 steps a layer, each passing this rank's K and V chunk (b s/cp
        x kv width / tp, 2 bytes) to the next rank while attending to the one it holds;
        backward passes K, V and their gradients. A step shows when its transfer outlasts a
        1/cp share of the attention core."""
        arch = self.workload.arch
        if arch is None:
            zero = np.zeros(len(L))
            return zero, zero
        kv = 2 * arch.kv_heads * arch.head_width
        chunk = L.micro_batch * self.shape.seq_len / L.cp * kv / L.tp * ACT_BYTES
        step = self.groups.price("send-recv", "cp", L, chunk)  # ring neighbours: direct
        core = c.core_fwd / L.cp
        fwd = (L.cp - 1) * np.maximum(step - core, 0.0)
        bwd = (L.cp - 1) * np.maximum(2.0 * step - 2.5 * core, 0.0)
        return c.blocks * fwd, c.blocks * bwd * np.where(L.recompute == 2, 1.5, 1.0)

    def _expert_parallel(self, L: Layouts, blocks: np.ndarray):
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
        arch = self.workload.arch
        moe = (arch.layers - arch.dense_layers) / arch.layers if arch is not None else 1.0
        a2a = self.groups.price("all-to-all", "ep", L, ep_bytes(L, sh))
        forward = ALL_TO_ALLS_FORWARD * moe * blocks * a2a
        return forward, forward * np.where(L.recompute == 2, 2.0, 1.0)

    def _sends(self, L: Layouts) -> np.ndarray:
        """Seconds of one activation hand-off between neighbouring stages: each micro-batch
        crosses a stage boundary forward and back, v times with interleaving; the tp ranks
        split the activation (scatter-gather optimisation)."""
        act = send_bytes(L, self.shape)
        cols = (L.placement, L.tp, L.dp, L.pp, L.cp, L.order)
        inverse, firsts = _group_rows(list(cols))
        line = np.array(
            [self.groups.send(*(int(col[i]) for col in cols)) for i in firsts.tolist()]
        ).reshape(-1, 2)
        return line[inverse, 0] + line[inverse, 1] * act

    def memory(self, L: Layouts) -> np.ndarray:
        """Bytes per GPU on the fullest stage (step.memory); error feedback with a lossy
        compressor (code 0 is "none") keeps a residual in the gradients' dtype."""
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
            cp=L.cp,
            flash=L.flash,
            shard=L.fsdp_shard,
            residual_bytes=np.where(L.error_feedback & (L.compression != 0), L.grad_bytes, 0),
        )
