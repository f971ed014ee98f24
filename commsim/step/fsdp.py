"""ZeRO-3 / FSDP as it runs: every transformer block is a unit whose parameters are gathered
before its forward and again before its backward (resharded after the forward), and whose
gradients are reduce-scattered after its backward (Zhao et al. 2023, "PyTorch FSDP",
arXiv:2304.11277; ZeRO-3, Rajbhandari et al. 2020). The next unit's gather is prefetched
under the current unit's compute, so per micro-batch only the first gather and whatever a
unit's collectives take beyond its neighbour's compute stand on the critical path. Hybrid
sharding (HSDP, fsdp_shard) gathers and reduce-scatters within groups of fsdp_shard data-
parallel ranks and all-reduces each shard's gradients across the groups.

DeepSpeed's ZeRO-3 before 0.6 (2021: the runs of Narayanan et al. 2021, Table 2) issued them
another way, priced by _per_parameter (the layout's zero3_issue "parameter").
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from commsim.step.contention import (
    collective_hbm_bytes,
    contended_compute,
    exposed,
    mean_rate,
    slowdown,
)
from commsim.step.eager import KERNELS
from commsim.step.states import FP32_BYTES
from commsim.step.sync import PARAM_WIRE_BYTES

# DeepSpeed's stage3_param_persistence_threshold default (deepspeed/runtime/zero/constants.py,
# 0.3.12 to 0.5.x): parameters of fewer elements stay whole on every rank, never gathered
PERSISTENCE_THRESHOLD = 100_000
# CPU seconds of one eager ATen op issued from Python that launches nothing (a view: narrow,
# view): PyTorch's operator micro-benchmark, `split` (views only, the same on CPU and CUDA
# tensors of any size), 2.26 us a call (pytorch/pytorch PR #32194, 2020, before torch 1.8)
EAGER_OP_S = 2.26e-6
# CPU seconds of submitting one cudaMemcpyAsync of a small chunk: 5-7 us measured a call
# (Wu et al. 2026, "DualPath", arXiv:2602.21548 section 5.2: KV-cache blocks between host
# buffers and HBM; a device-to-device copy is taken to cost the same); the midpoint
MEMCPY_SUBMIT_S = 6e-6


def fsdp1_pre_reduce_bytes(kernels, grad_bytes) -> np.ndarray:
    """HBM bytes a parameter of a unit that FSDP1 (llm-foundry's Composer; torch 2.1
    torch/distributed/fsdp/_runtime_utils.py) moves before each reduce-scatter, on the
    post-backward stream beside the compute: _post_backward_hook casts the bf16 gradient to
    the reduce dtype where it differs (grad.to: read 2, write the gradient's width), then
    _reduce_grad's _div_if_needed divides the whole padded gradient in place by the
    pre-divide factor (above 1 on 2 or more ranks: read and write it); 14 in fp32. Left out:
    the post-divide and accumulation on the shard (1 / n of that)."""
    grad_bytes = np.asarray(grad_bytes, dtype=float)
    cast = np.where(grad_bytes > PARAM_WIRE_BYTES, PARAM_WIRE_BYTES + grad_bytes, 0.0)
    fsdp1 = np.asarray(kernels) == KERNELS.index("llm-foundry")
    return np.where(fsdp1, cast + 2 * grad_bytes, 0.0)


def fsdp2_reduce_bytes(kernels, grad_bytes, ranks, micro_batches) -> np.ndarray:
    """HBM bytes a parameter of a unit that FSDP2 (torchtitan's fully_shard) moves around each
    reduce-scatter, a micro-batch's mean, on its reduce-scatter stream beside the compute
    (torch of Dec 2024, torch/distributed/_composable/fsdp/_fsdp_collectives.py
    foreach_reduce): foreach_reduce_scatter_copy_in's torch._chunk_cat copies every bf16
    unsharded gradient into one buffer of the reduce dtype (read 2, write its width; no
    pre-divide in fp32 or bf16: _fsdp_param_group.py _init_grad_divide_factors leaves it to
    NCCL's AVG); then, on the 1 / n shard, _to_dtype_if_needed casts the output to the fp32
    parameters' dtype where it differs (read the reduce width, write 4) and the view-out
    sets it as the sharded gradient on the first micro-batch, adds it on the others
    (`sharded_param.grad += `: read 4 + 4, write 4). 6 bytes in fp32 on one micro-batch."""
    g = np.asarray(grad_bytes, dtype=float)
    n = np.maximum(np.asarray(ranks, dtype=float), 1.0)
    m = np.maximum(np.asarray(micro_batches, dtype=float), 1.0)
    copy_in = PARAM_WIRE_BYTES + g
    cast = np.where(g != FP32_BYTES, g + FP32_BYTES, 0.0)
    accumulate = 3 * FP32_BYTES * (m - 1) / m
    titan = np.isin(kernels, [KERNELS.index("torchtitan"), KERNELS.index("torchtitan-compile")])
    return np.where(titan, copy_in + (cast + accumulate) / n, 0.0)


def reduce_copy_bytes(kernels, grad_bytes, ranks, micro_batches) -> np.ndarray:
    """HBM bytes a unit's parameter moves beside the backward around its reduce-scatter, by
    the stack's FSDP: FSDP1's cast and divide (llm-foundry), FSDP2's copies (torchtitan)."""
    fsdp2 = fsdp2_reduce_bytes(kernels, grad_bytes, ranks, micro_batches)
    return fsdp1_pre_reduce_bytes(kernels, grad_bytes) + fsdp2


def fsdp_per_micro_batch(model, L, c) -> tuple[np.ndarray, np.ndarray]:
    """(network seconds, seconds on the critical path) per micro-batch of each layout's
    ZeRO-3 traffic on its slowest stage (0 for other ZeRO stages).

    With k units of gather g, reduce-scatter r (plus the HSDP all-reduce), forward f and
    backward b each (the end layers' parameters join the first unit):
        forward:  g_first + (k - 1) max(0, g - f)
        backward: g_first + (k - 1) max(0, g + r - b) + r
    and everything (k (2 g + r)) without overlap; reshard_after_forward (backward_gathers)
    takes gathers out of the backward."""
    network, exposed = np.zeros(len(L)), np.zeros(len(L))
    for issue, price in ((0, _per_unit), (1, _per_parameter)):
        rows = np.nonzero((L.zero == 3) & (L.zero3_issue == issue))[0]
        if rows.size:
            network[rows], exposed[rows] = price(model, L.take(rows), c, rows)
    return network, exposed


def _per_unit(model, Z, c, rows) -> tuple[np.ndarray, np.ndarray]:
    """(network, critical-path) seconds per micro-batch of FSDP units (see above)."""
    sh = model.shape
    k = np.maximum(c.blocks[rows], 1.0)
    dense = (sh.block_params - sh.expert_params) / Z.tp
    sparse = sh.expert_params / (Z.expert_tp * Z.ep)
    # one stage holds the embedding and head too (their gather joins the first unit's);
    # across a pipeline they sit on the end stages, left out of the slowest stage's units
    ends = np.where(Z.pp == 1, (sh.pre_params + sh.post_params) / Z.tp, 0.0)
    g_dense, r_dense = _unit(model, Z, dense, "dense")
    g_sparse, r_sparse = _unit(model, Z, sparse, "expert") if sh.expert_params else (0.0, 0.0)
    g, r = g_dense + g_sparse, r_dense + r_sparse
    g_first = g + np.where(ends > 0, _unit(model, Z, ends, "dense")[0], 0.0)
    f, b = c.block_fwd[rows], c.block_bwd[rows]
    parts = [(dense, g_dense, r_dense, False)]
    parts += [(sparse, g_sparse, r_sparse, True)] if sh.expert_params else []
    f_slow, b_slow = beside_units(model, Z, c, rows, parts)
    first_b, later_b = backward_gathers(Z.reshard, g, np.where(Z.fsdp_states, g, g_first))
    net = k * (g + r) + (g_first - g) + first_b + (k - 1) * later_b
    ahead = (k - 1) * (exposed(f, f_slow, g) + exposed(b, b_slow, later_b + r))
    hidden = g_first + first_b + ahead + r
    return net, np.where(Z.overlap, np.minimum(hidden, net), net)


def backward_gathers(reshard, g, g_first):
    """(the backward's first unit's gather seconds, each later unit's) by
    reshard_after_forward (layouts.RESHARDS). True: every unit is gathered again, the first
    with the end layers where they were freed (g_first). PyTorch's FSDP never frees the root
    module's (the end layers') after the forward, so its callers pass g there: FSDP2 sets the
    root's post_forward_mesh_info to None in FSDPState._lazy_init (pytorch 005da465,
    torch/distributed/_composable/fsdp/_fsdp_state.py), FSDP1's _post_forward_reshard frees
    only `not state._is_root` handles (torch 2.1 fsdp/_runtime_utils.py). DeepSpeed's ZeRO-3
    (states zero) has no root unit, only its persistence threshold: its end layers are
    gathered again. False: none (FSDP2 keeps the unsharded parameters and "avoids the
    all-gather in backward", pytorch 012c62d fully_shard.py; FSDP1's _post_forward_reshard
    frees them only under FULL_SHARD and HYBRID_SHARD, not SHARD_GRAD_OP). "all-but-last"
    (torchtitan 004b314 parallelize_llama.py apply_fsdp without pp): the backward starts on
    the kept last block, the k - 1 others gathered under their neighbour's backward."""
    return np.where(reshard == 0, g_first, 0.0), _later_gathers(reshard, g)


def _later_gathers(reshard, g):
    """Each later unit's backward gather, `g` (seconds or bytes): none where
    reshard_after_forward is False (code 1) keeps the units gathered (backward_gathers)."""
    return np.where(reshard == 1, 0.0, g)


def beside_units(model, Z, c, rows, parts):
    """A block's forward and backward seconds beside its neighbour's collectives
    (step.contention): the forward beside a unit's all-gathers, the backward beside its
    gathers, reduce-scatters and FSDP's copies around them (_unit_traffic); `parts` the
    unit's dense and expert parameters, (parameters, gather seconds, reduce-scatter seconds,
    expert), each on its own groups (the sharding group; the expert-data-parallel one), the
    rates beside them weighted by their seconds (mean_rate). Every part's forward and
    backward is priced in one roofline pass, one copy of the layouts each; the block's own
    times where the model prices compute at one efficiency or a layout does not overlap
    (its compute never runs beside the collectives)."""
    f, b = c.block_fwd[rows], c.block_bwd[rows]
    hide = np.nonzero(Z.overlap)[0]
    if not hide.size:
        return f, b
    sides = [side for part in parts for side in _unit_traffic(Z, *part)]
    kinds, moved, seconds = (
        np.stack([np.broadcast_to(side[i], f.shape)[hide] for side in sides]) for i in range(3)
    )
    copies = Z.take(np.tile(hide, len(sides)))
    slow = contended_compute(model, copies, kinds.ravel(), moved.ravel(), seconds.ravel())
    if slow is None:
        return None, None
    fwd = slow.block_fwd.reshape(kinds.shape)[0::2]  # each part's forward, then backward
    bwd = slow.block_bwd.reshape(kinds.shape)[1::2]
    return _slowed(f, hide, fwd, seconds[0::2]), _slowed(b, hide, bwd, seconds[1::2])


def _slowed(alone, hide, contended, seconds):
    """The seconds `alone`, those at `hide` slowed to the rate (mean_rate) that the parts'
    `contended` seconds there give over their collectives' `seconds` (one row a part)."""
    rates = [slowdown(alone[hide], t) for t in contended]
    out = alone.copy()
    out[hide] = alone[hide] / mean_rate(rates, list(seconds))
    return out


def _unit_traffic(Z, params, gather_s, scatter_s, expert):
    """((group kind, HBM bytes, seconds) of the collectives beside a block's forward, the
    same beside its backward) of a unit's `params` parameters: its all-gather forward; its
    backward's gather (_later_gathers), reduce-scatter and FSDP's copies around it
    (reduce_copy_bytes) backward; on the sharding group, or the expert-data-parallel one."""
    shard = Z.edp if expert else np.where(Z.fsdp_shard > 0, Z.fsdp_shard, Z.dp) * Z.cp
    kinds = "edp" if expert else np.where(Z.fsdp_shard > 0, "shard", "dp")
    gather = collective_hbm_bytes("all-gather", params * PARAM_WIRE_BYTES, shard)
    scatter = collective_hbm_bytes("reduce-scatter", params * Z.grad_bytes, shard)
    copies = reduce_copy_bytes(Z.kernels, Z.grad_bytes, shard, Z.micro_batches)
    scatter = scatter + params * copies
    back = _later_gathers(Z.reshard, gather) + scatter
    back_s = _later_gathers(Z.reshard, gather_s) + scatter_s
    return (kinds, gather, gather_s), (kinds, back, back_s)


def _per_parameter(model, Z, c, rows) -> tuple[np.ndarray, np.ndarray]:
    """(network, critical-path) seconds per micro-batch of DeepSpeed's ZeRO-3 before 0.6.

    Every parameter of at least PERSISTENCE_THRESHOLD elements is gathered by its own
    all-gather before each use: forward, the recomputed forward of a full recompute, and
    backward (DeepSpeed 0.3.13 partition_parameters.py _allgather_param, one
    torch.distributed.all_gather per parameter). Each starts after torch.cuda.synchronize(),
    so none overlaps compute or another (as DeepSpeed PR #1188, in 0.5.5, notes of the
    "async" gathers it made synchronous). Every
    gradient, the persistent ones too, is reduce-scattered by its own reduce-scatter
    (stage3.py _reduce_scatter_gradients, one per parameter of a bucket; coalesced only in
    0.6.0, PR #1453), and the next gather's synchronize waits for it. The persistent
    parameters are gathered once a step, in one call, after the optimizer
    (_allgather_params), then copied out rank by rank. Each call's per-rank CPU work is in
    _tensor_costs. Not modelled:
    the reuse cache (stage3_max_reuse_distance) that may keep a block's last tensor between
    its recomputed forward and its backward (one gather of twelve fewer on a GPT block)."""
    w = model.workload
    k = np.maximum(c.blocks[rows], 1.0)
    passes = 2.0 + (Z.recompute == 2)
    blocks = [layer for layer in w.layers if layer.name.startswith("block.")]
    ends = [layer for layer in w.layers if not layer.name.startswith("block.")]
    per_block = _tensor_costs(model, Z, blocks, passes)
    at_ends = _tensor_costs(model, Z, ends, np.full(len(Z), 2.0))  # outside the checkpoints
    on_stage = Z.pp == 1  # a pipeline puts the end layers on the end stages (see _per_unit)
    share = k / max(len(blocks), 1)  # of all blocks' tensors, the stage's
    net, persistent, unflatten = (
        share * b + np.where(on_stage, e, 0.0) for b, e in zip(per_block, at_ends, strict=True)
    )
    gather = _unit(model, Z, persistent, "dense")[0]
    once = gather + _gather_issue(Z.dp, gather) + unflatten  # once a step
    net = net + np.where(persistent > 0, once / Z.micro_batches, 0.0)
    return net, net


def _tensor_costs(model, Z, layers, passes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds, persistent parameters, seconds copying them out) of `layers`' tensors
    issued one by one: each gathered tensor `passes` times, each gradient reduce-scattered
    once; tensors split over tp (and an expert's over ep) as the layer tags them. Each call
    also streams the whole tensor through HBM on the same stream: a gather zero-fills its
    buffer (torch.zeros) and torch.distributed.all_gather copies the result out of its flat
    buffer into the rank list, 3 S; reduce_scatter copies the rank list into one, 2 S
    (torch 1.8 ProcessGroupNCCL allgather / reduce_scatter, flatten_for_scatter_gather),
    at the HBM bandwidth streaming kernels reach (GPUSpec.stream_bandwidth).
    And each call does CPU work per rank of its group (_gather_issue, _scatter_issue), as
    does the copy-out of each persistent parameter after the step's one gather
    (_allgather_params: for every rank holding part of it, narrow, view, narrow and a
    copy_ from Python, 4 ops and a cudaMemcpyAsync)."""
    seconds, persistent, unflatten = np.zeros(len(Z)), np.zeros(len(Z)), np.zeros(len(Z))
    tensors = [(n, layer.shard(i)) for layer in layers for i, n in enumerate(layer.tensors)]
    for (n, tag), count in Counter(tensors).items():
        local = n / (Z.tp * Z.ep if tag == "ep" else Z.tp if tag == "tp" else np.ones(len(Z)))
        part = "expert" if tag == "ep" else "dense"
        ranks = Z.edp if tag == "ep" else Z.dp
        gather, scatter = _unit(model, Z, local, part)
        gather = gather + _gather_issue(ranks, gather)
        gather = gather + 3.0 * local * PARAM_WIRE_BYTES / model.gpu.stream_bandwidth
        scatter = scatter + _scatter_issue(ranks)
        scatter = scatter + 2.0 * local * Z.grad_bytes / model.gpu.stream_bandwidth
        whole = local < PERSISTENCE_THRESHOLD
        seconds += count * (np.where(whole, 0.0, passes * gather) + scatter)
        persistent += count * np.where(whole, local, 0.0)
        holders = np.ceil(local / np.ceil(local / ranks))  # ranks whose part is not all padding
        unflatten += count * np.where(whole, holders * (4 * EAGER_OP_S + MEMCPY_SUBMIT_S), 0.0)
    return seconds, persistent, unflatten


def _scatter_issue(ranks):
    """CPU seconds a list reduce-scatter adds, all before NCCL starts: DeepSpeed 0.3.13
    _reduce_scatter_gradient builds the rank list with grad.view(-1).narrow(...) per rank (2
    eager ops), then torch 1.8 ProcessGroupNCCL::reduce_scatter copies each into its flat
    input (flatten_for_scatter_gather: one copy_, a cudaMemcpyAsync, per rank)."""
    return ranks * (2 * EAGER_OP_S + MEMCPY_SUBMIT_S)


def _gather_issue(ranks, collective):
    """CPU seconds a list all-gather adds to its `collective` seconds: DeepSpeed 0.3.13
    _allgather_param narrows its flat buffer once per rank after the synchronize, before
    NCCL starts (one eager op each, serial); torch 1.8 ProcessGroupNCCL::allgather then
    copies the flat result into the list, one copy_ (a cudaMemcpyAsync) per rank, submitted
    while NCCL runs: only what outlasts the collective adds."""
    return ranks * EAGER_OP_S + np.maximum(ranks * MEMCPY_SUBMIT_S - collective, 0.0)


def _unit(model, Z, params, part: str):
    """(all-gather, reduce-scatter [+ HSDP all-reduce]) seconds of a unit of `params`
    parameters per GPU: bf16 parameters gathered, gradients reduce-scattered in the
    layouts' gradient dtype, over the sharding group (expert parameters: the dp / ep ranks
    holding the same expert shard, step.groups)."""
    params = np.broadcast_to(np.asarray(params, dtype=float), Z.dp.shape)
    sharded = np.where(Z.fsdp_shard > 0, "shard", "dp")
    kind = np.full(len(Z), "edp") if part == "expert" else sharded
    gather, scatter = np.zeros(len(Z)), np.zeros(len(Z))
    for name in np.unique(kind):
        sel = np.nonzero(kind == name)[0]
        S = Z.take(sel)
        p = params[sel]
        gather[sel] = model.groups.price("all-gather", str(name), S, p * PARAM_WIRE_BYTES)
        grads = p * S.grad_bytes
        scatter[sel] = model.groups.price("reduce-scatter", str(name), S, grads)
        if name == "shard":  # each shard's gradient summed across the replica groups
            shard = grads / (S.fsdp_shard * S.cp)
            scatter[sel] += model.groups.price("all-reduce", "replica", S, shard)
    return gather, scatter
