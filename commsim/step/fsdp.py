"""ZeRO-3 / FSDP as it runs: every transformer block is a unit whose parameters are gathered
before its forward and again before its backward (resharded after the forward), and whose
gradients are reduce-scattered after its backward (Zhao et al. 2023, "PyTorch FSDP",
arXiv:2304.11277; ZeRO-3, Rajbhandari et al. 2020). The next unit's gather is prefetched
under the current unit's compute, so per micro-batch only the first gather and whatever a
unit's collectives take beyond its neighbour's compute stand on the critical path. Hybrid
sharding (HSDP, fsdp_shard) gathers and reduce-scatters within groups of fsdp_shard data-
parallel ranks and all-reduces each shard's gradients across the groups.
"""

from __future__ import annotations

import numpy as np

from commsim.step.sync import PARAM_WIRE_BYTES


def fsdp_per_micro_batch(model, L, c) -> tuple[np.ndarray, np.ndarray]:
    """(network seconds, seconds on the critical path) per micro-batch of each layout's
    ZeRO-3 traffic on its slowest stage (0 for other ZeRO stages).

    With k units of gather g, reduce-scatter r (plus the HSDP all-reduce), forward f and
    backward b each (the end layers' parameters join the first unit):
        forward:  g_first + (k - 1) max(0, g - f)
        backward: g_first + (k - 1) max(0, g + r - b) + r
    and everything (k (2 g + r)) without overlap."""
    network, exposed = np.zeros(len(L)), np.zeros(len(L))
    rows = np.nonzero(L.zero == 3)[0]
    if rows.size == 0:
        return network, exposed
    sh = model.shape
    Z = L.take(rows)
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
    net = k * (2 * g + r) + 2 * (g_first - g)
    hidden = 2 * g_first + (k - 1) * (np.maximum(g - f, 0) + np.maximum(g + r - b, 0)) + r
    network[rows] = net
    exposed[rows] = np.where(Z.overlap, np.minimum(hidden, net), net)
    return network, exposed


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
