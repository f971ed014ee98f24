"""The batch and layout arithmetic behind a prediction, as a reader checks it by hand: global
batch = data-parallel degree x micro-batch x micro-batches, GPUs = dp x tp x pp x cp, and
which transformer layers (and how many parameters) each pipeline rank holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from commsim.scenario import Setup
    from commsim.specs import Strategy


def stage_blocks(blocks: int, strategy: Strategy) -> list[list[int]]:
    """The transformer blocks each pipeline rank holds, in order: Megatron's chunks of
    blocks / (pp x interleave) dealt round-robin over the ranks (chunk c on rank c mod pp),
    or the uneven split's first and last stage counts with the rest even."""
    pp, v = strategy.pp, strategy.interleave
    first, last = strategy.first_stage_layers, strategy.last_stage_layers
    if first is None and last is None:
        size = blocks // (pp * v)
        ranks: list[list[int]] = [[] for _ in range(pp)]
        for c in range(pp * v):
            ranks[c % pp] += range(c * size, (c + 1) * size)
        return ranks
    ends = (first or 0) + (last or 0)
    middle_stages = pp - (first is not None) - (last is not None)
    even = (blocks - ends) // middle_stages if middle_stages else 0
    counts = [even] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    starts = [sum(counts[:k]) for k in range(pp)]
    return [list(range(a, a + n)) for a, n in zip(starts, counts, strict=True)]


def batch_arithmetic(setup: Setup, strategy: Strategy) -> dict[str, Any]:
    """Global batch, micro-batch, micro-batches per step, the parallel degrees, and the
    layers and parameters (before tensor/expert splitting) of every pipeline rank."""
    s, w = setup.scenario, setup.workload
    doc: dict[str, Any] = {
        "global_batch": s.global_batch,
        "micro_batch": s.micro_batch,
        "micro_batches": setup.micro_batches(strategy),
        "dp": setup.dp(strategy),
        "tp": strategy.tp,
        "pp": strategy.pp,
        "cp": strategy.cp,
        "ep": strategy.ep,
        "etp": strategy.expert_tp,
    }
    names = [layer.name for layer in w.layers]
    block_at = [i for i, n in enumerate(names) if n.startswith("block.")]
    if not block_at:  # not a transformer: one stage holds everything
        doc["stage_layers"] = [len(w.layers)]
        doc["stage_params"] = [w.params]
        return doc
    params = [layer.params for layer in w.layers]
    before = sum(params[: block_at[0]])  # embedding: the first rank
    after = sum(params[block_at[-1] + 1 :])  # final norm, head: the last rank
    ranks = stage_blocks(len(block_at), strategy)
    doc["stage_layers"] = [len(r) for r in ranks]
    doc["stage_params"] = [
        sum(params[block_at[b]] for b in r)
        + (before if k == 0 else 0)
        + (after if k == len(ranks) - 1 else 0)
        for k, r in enumerate(ranks)
    ]
    return doc
