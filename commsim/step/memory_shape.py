"""A transformer's sizes as memory needs them, read off a workload's layers: dimensions,
parameters split over tensor parallelism or replicated, what a block keeps for its backward."""

from __future__ import annotations

from dataclasses import dataclass

from commsim.step.activations import ActivationWidths
from commsim.workload.model import Workload


@dataclass(frozen=True)
class MemoryShape:
    """A transformer's sizes for memory: dimensions and parameters split or replicated over tp."""

    blocks: int
    hidden: int
    heads: int
    queries: int  # a token's query elements (heads x head width)
    keys: int  # a token's key (or value) elements (kv heads x head width)
    vocab: int
    block: tuple[float, float]  # parameters of one block (split over tp, replicated; mean)
    expert: float  # of block[0]: the experts' MLPs (split over tp and ep; mean over blocks)
    widths: ActivationWidths  # what a block keeps per token for its backward
    widths_fp8: ActivationWidths  # the same with FP8 GEMMs
    first: tuple[float, float]  # layers before the blocks: the embedding
    last: tuple[float, float]  # layers after the blocks: final norm, heads
    tied: int  # token-embedding size when the head reuses it (a copy on the last stage), else 0


def transformer_shape(workload: Workload) -> MemoryShape | None:
    """A transformer's sizes read off its layers' tensors and their shard tags (Layer.shards:
    Megatron's split); blocks averaged (MoE models may keep dense first blocks). None for
    other models."""
    names = [layer.name for layer in workload.layers]
    block_at = [i for i, n in enumerate(names) if n.startswith("block.")]
    if not block_at or names[0] != "embedding" or names[-1] != "lm_head":
        return None
    if workload.heads is None or workload.hidden is None:
        raise ValueError(f"{workload.name}: a transformer workload without its head count")
    h = workload.hidden
    vocab = workload.layers[0].tensors[0] // h

    def split(layers) -> tuple[float, float]:
        """(parameters split over tp, expert ones included; replicated ones)."""
        pairs = [(n, layer.shard(i)) for layer in layers for i, n in enumerate(layer.tensors)]
        return float(sum(n for n, s in pairs if s)), float(sum(n for n, s in pairs if not s))

    blocks = [workload.layers[i] for i in block_at]
    body = split(blocks)
    tail = workload.layers[block_at[-1] + 1 :]
    untied = any(n == vocab * h for layer in tail for n in layer.tensors)
    return MemoryShape(
        blocks=len(block_at),
        hidden=h,
        heads=workload.heads,
        queries=workload.arch.heads * workload.arch.head_width if workload.arch else h,
        keys=workload.arch.kv_heads * workload.arch.head_width if workload.arch else h,
        vocab=vocab,
        block=(body[0] / len(blocks), body[1] / len(blocks)),
        expert=workload.expert_params,
        widths=ActivationWidths.of(workload.arch) if workload.arch else ActivationWidths(),
        widths_fp8=(
            ActivationWidths.of(workload.arch, fp8=True) if workload.arch else ActivationWidths()
        ),
        first=split(workload.layers[:1]),
        last=split(tail),
        tied=0 if untied else vocab * h,
    )
