"""What the step model needs of a workload: its layers' FLOPs and parameters as blocks (the
repeated transformer layers a pipeline splits) and what comes before and after them, and
how a pipeline splits the blocks over its stages.

A model without blocks (a CNN, a custom layer list) is all "before": it runs as one stage.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from commsim.step.activations import RECOMPUTE_MODULES
from commsim.workload.model import Workload


@dataclass(frozen=True)
class Shape:
    """A workload as blocks plus the layers before (embedding) and after (final norm, head)."""

    blocks: int
    hidden: int  # 0 without a transformer
    heads: int
    seq_len: int
    block_params: float  # of a block (the mean over blocks)
    block_flops: float  # forward FLOPs per sample of a block (the mean)
    attention_core_flops: float  # the s^2 part of block_flops (recomputed by "selective")
    op_replay_flops: float  # of block_flops, the matmuls op-level checkpointing recomputes
    mla_up_flops: float  # of block_flops, MLA's up-projections (recompute_modules mla_up_proj)
    mlp_flops: float  # of block_flops, the dense blocks' MLP GEMMs (recompute_modules mlp)
    shared_flops: float  # of block_flops, the shared experts' GEMMs (shared_experts)
    pre_params: float  # embedding
    pre_flops: float
    post_params: float  # final norm, LM head
    post_flops: float
    total_params: float
    model_flops: float  # forward FLOPs per sample of the whole model
    expert_params: float  # of block_params: all experts' MLPs (0 for a dense model)
    routed: float  # top_k x capacity factor: token copies an MoE layer dispatches (0: dense)
    moe_share: float  # the blocks that are MoE (dense first layers are not)
    shared_experts: int  # always-on experts of an MoE block (run as a dense MLP over tp)

    @classmethod
    def of(cls, w: Workload) -> Shape:
        """Read the shape off a workload's layers (blocks are the layers named block.i)."""
        names = [layer.name for layer in w.layers]
        at = [i for i, n in enumerate(names) if n.startswith("block.")]
        transformer = bool(at) and w.heads is not None and w.hidden is not None
        if not transformer:
            at = []
        first, last = (at[0], at[-1] + 1) if at else (len(names), len(names))
        pre, post = w.layers[:first], w.layers[last:]
        s, h = (w.seq_len or 1, w.hidden) if transformer else (1, 0)
        blocks = [w.layers[i] for i in at]
        n = max(len(blocks), 1)
        return cls(
            blocks=len(at),
            hidden=h or 0,
            heads=w.heads or 0,
            seq_len=s,
            block_params=sum(b.params for b in blocks) / n,  # mean: MoE models may keep
            block_flops=sum(b.forward_flops for b in blocks) / n,  # dense first blocks
            attention_core_flops=w.attention_flops if transformer else 0.0,
            op_replay_flops=_op_replay_flops(w) if transformer else 0.0,
            mla_up_flops=_mla_up_flops(w) if transformer else 0.0,
            mlp_flops=_mlp_flops(w) if transformer else 0.0,
            shared_flops=_shared_flops(w) if transformer else 0.0,
            pre_params=float(sum(x.params for x in pre)),
            pre_flops=sum(x.forward_flops for x in pre),
            post_params=float(sum(x.params for x in post)),
            post_flops=sum(x.forward_flops for x in post),
            total_params=float(w.params),
            model_flops=w.forward_flops,
            expert_params=float(w.expert_params),
            routed=w.top_k * w.capacity_factor if w.moe else 0.0,
            moe_share=_moe_share(w),
            shared_experts=w.arch.shared_experts if w.moe and w.arch is not None else 0,
        )

    def module_flops(self, parts):
        """Forward FLOPs per sample of a mean block's GEMMs that the recompute_modules in
        `parts` (activations.recompute_code) replay: mla_up_proj, mlp and shared_experts;
        the others replay element-wise work or the attention core (counted as selective)."""
        bit = lambda name: (np.asarray(parts) >> RECOMPUTE_MODULES.index(name)) & 1  # noqa: E731
        flops = bit("mla_up_proj") * self.mla_up_flops + bit("mlp") * self.mlp_flops
        return flops + bit("shared_experts") * self.shared_flops

    @property
    def tp_collectives(self) -> float:
        """Tensor-parallel all-reduces (or their sequence-parallel reduce-scatter and all-
        gather) a mean block runs forward: one after attention, one after a dense MLP; an
        MoE MLP runs its routed experts on the expert grid (etp) instead, its shared experts
        on tp (Megatron-core's SharedExpertMLP gathers its input over tp)."""
        mlp = (1.0 - self.moe_share) + self.moe_share * (self.shared_experts > 0)
        return 1.0 + mlp


def _moe_share(w: Workload) -> float:
    """The share of blocks that are MoE: all but the dense first layers (1 without arch)."""
    if not w.moe:
        return 0.0
    arch = w.arch
    return (arch.layers - arch.dense_layers) / arch.layers if arch is not None else 1.0


def _op_replay_flops(w: Workload) -> float:
    """Forward FLOPs per sample of the matmuls op-level checkpointing recomputes in a dense
    block (compute._Block.op_replay): k, o, and the MLP's up (gated) or down projection."""
    c = w.arch
    if c is None:
        return 0.0
    width = c.kv_heads * c.head_width + c.heads * c.head_width + c.ffn_hidden
    return 2.0 * w.seq_len * c.hidden * width


def _mla_up_flops(w: Workload) -> float:
    """Forward FLOPs per sample of MLA's up-projections (step.block_gemms.mla_up_gemms): Q's
    from its latent (from h without q_lora_rank), the keys' and values' from theirs."""
    c = w.arch
    if c is None or not c.mla:
        return 0.0
    hd = c.head_width
    q = (c.q_lora_rank or c.hidden) * c.heads * (hd + c.rope_head_dim)
    kv = c.kv_lora_rank * c.heads * (hd + (c.v_head_dim or hd))
    return 2.0 * w.seq_len * (q + kv)


def _mlp_flops(w: Workload) -> float:
    """Forward FLOPs per sample of the dense blocks' MLP GEMMs (step.block_gemms.mlp_gemms),
    a mean block's: up (and gate) and down projections on the dense share of blocks."""
    c = w.arch
    if c is None:
        return 0.0
    gemms = 3.0 if c.gated_mlp else 2.0
    return (1.0 - _moe_share(w)) * 2.0 * w.seq_len * c.hidden * c.ffn_hidden * gemms


def _shared_flops(w: Workload) -> float:
    """Forward FLOPs per sample of the shared experts' GEMMs (compute._Block._shared_experts),
    a mean block's: a dense MLP of shared_experts x the expert width on the MoE blocks."""
    c = w.arch
    if c is None or not w.moe or not c.shared_experts:
        return 0.0
    width = (c.moe_ffn_hidden or c.ffn_hidden) * c.shared_experts
    gemms = 3.0 if c.gated_mlp else 2.0
    return _moe_share(w) * 2.0 * w.seq_len * c.hidden * width * gemms


def expert_shards(dense_shards, tp, ep, etp):
    """Ranks sharing one expert shard's ZeRO states: the expert-data-parallel degree within
    `dense_shards` ranks that shard the dense parameters (dp x cp, or a hybrid shard group
    x cp), each holding 1 / tp of them: dense_shards x tp / (ep x etp) (etp = tp: / ep)."""
    return dense_shards * tp // (ep * etp)


def stage_layers(blocks: int, pp, first, last) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks on the first, a middle and the last pipeline stage. first / last:
    Megatron-core's --decoder-first- / --decoder-last-pipeline-num-layers (-1: not set);
    the other stages split the rest evenly (check_layout makes it divide). A middle stage
    exists when pp > 2; with pp = 1 the one stage holds every block."""
    pp, first, last = (np.asarray(x) for x in (pp, first, last))
    f_set, l_set = first >= 0, last >= 0
    pinned = np.where(f_set, first, 0) + np.where(l_set, last, 0)
    shared = np.maximum(pp - f_set - l_set, 1)  # stages splitting the rest
    rest = np.ceil((blocks - pinned) / shared)
    k_first = np.where(f_set, first, rest)
    k_last = np.where(l_set & (pp > 1), last, np.where(pp > 1, rest, k_first))
    return k_first, np.where(pp > 2, rest, 0.0), k_last


def split_problem(blocks: int, pp: int, v: int, first: int, last: int) -> str | None:
    """Why `blocks` layers cannot run as pp stages of v chunks each (None when they can).
    Even (first = last = -1): every chunk equal, so pp x v divides the layers. Uneven
    (Megatron-core's --decoder-first/last-pipeline-num-layers, or its pipeline layout
    string): the other stages split the rest evenly, at least one layer each, and with v > 1
    each of their stages splits into v equal chunks; an end stage's chunks may differ by a
    layer or hold none (Llama 3's first chunk holds only the embedding, arXiv:2407.21783
    Sec. 3.3.2)."""
    if first < 0 and last < 0:
        if blocks % (pp * v):
            return (
                f"{blocks} layers do not split evenly into pp x interleave = {pp} x {v} "
                "chunks (first_stage_layers / last_stage_layers set an uneven split)"
            )
        return None
    if pp == 1:
        return "an uneven split needs pp > 1"
    ends = [x for x in (first, last) if x >= 0]
    rest, others = blocks - sum(ends), pp - len(ends)
    if rest < others or (others == 0 and rest) or (others and rest % others):
        return (
            f"{blocks} layers minus {' + '.join(map(str, ends))} on the end stages leave "
            f"{rest} for the other {others} stages: they must split evenly, at least one each"
        )
    if others and (rest // others) % v:
        return (
            f"the other stages' {rest // others} layers each do not split into "
            f"interleave = {v} equal chunks"
        )
    return None


def slowest(k_first, k_mid, k_last, per_layer, only, whole, pre, post):
    """(stage, blocks, load) of the stage with the most load: 0 the first (+ pre), 1 a
    middle one, 2 the last (+ post); a single stage (only) carries `whole`."""
    loads = np.stack(
        [
            k_first * per_layer + np.where(only, whole, pre),
            k_mid * per_layer,
            k_last * per_layer + np.where(only, whole, post),
        ]
    )
    worst = np.argmax(loads, axis=0)
    layers = np.choose(worst, [k_first, k_mid, k_last])
    return worst, layers, np.take_along_axis(loads, worst[None], axis=0)[0]


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
