"""A model as schedulable layers: parameter tensors and forward FLOPs per sample, and
their compute time."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from commsim.specs import GPUSpec

BACKWARD_FACTOR = 2.0  # backward FLOPs / forward FLOPs


@dataclass(frozen=True)
class Layer:
    """One schedulable layer: its parameter tensors and forward FLOPs per sample."""

    name: str
    tensors: tuple[int, ...]  # parameters per tensor, registration order; () without parameters
    forward_flops: float
    # how each tensor splits over model parallelism (Megatron-LM, Shoeybi et al. 2019): "tp"
    # split over the tensor-parallel ranks, "ep" an expert's (split over tp and the expert-
    # parallel ranks), "" replicated; () for a layer that cannot be split (all replicated)
    shards: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.shards and len(self.shards) != len(self.tensors):
            raise ValueError(f"{self.name}: {len(self.shards)} shard tags for {len(self.tensors)}")

    @property
    def params(self) -> int:
        return sum(self.tensors)

    def shard(self, i: int) -> str:
        """How tensor i splits: "tp", "ep" or "" (replicated)."""
        return self.shards[i] if self.shards else ""


@dataclass(frozen=True)
class Workload:
    """A model as layers in forward (= parameter registration) order."""

    name: str
    layers: tuple[Layer, ...]
    seq_len: int | None  # tokens per sample; None for models without a sequence (CNNs)
    heads: int | None = None  # attention heads of a transformer (activation memory needs them)
    hidden: int | None = None  # a transformer's hidden size (activation sizes need it)
    experts: int = 1  # experts per MoE block (1: a dense model)
    top_k: int = 1  # experts each token is routed to
    capacity_factor: float = 1.0  # expert buffer / even share of the routed tokens
    expert_params: float = 0  # all experts' MLPs' parameters in a block (mean over blocks)
    attention_flops: float = 0.0  # forward FLOPs per sample of a block's attention core (mean)
    arch: Any = None  # a transformer's TransformerShape (workload.transformer); None otherwise

    @property
    def layer_params(self) -> np.ndarray:
        return np.array([layer.params for layer in self.layers], dtype=np.int64)

    @cached_property
    def tensor_params(self) -> np.ndarray:
        """Parameters per tensor, all layers' tensors in registration order (what DDP buckets)."""
        return np.array([n for layer in self.layers for n in layer.tensors], dtype=np.int64)

    @cached_property
    def tensor_shards(self) -> tuple[str, ...]:
        """Each tensor's split over model parallelism (Layer.shards), registration order."""
        return tuple(layer.shard(i) for layer in self.layers for i in range(len(layer.tensors)))

    @cached_property
    def tensor_layer(self) -> np.ndarray:
        """Index of the layer each tensor of `tensor_params` belongs to (non-decreasing)."""
        counts = [len(layer.tensors) for layer in self.layers]
        return np.repeat(np.arange(len(self.layers)), counts)

    @property
    def layer_flops(self) -> np.ndarray:
        """Forward FLOPs per sample, per layer."""
        return np.array([layer.forward_flops for layer in self.layers], dtype=float)

    @property
    def params(self) -> int:
        return int(self.tensor_params.sum())

    @property
    def forward_flops(self) -> float:
        """Forward FLOPs per sample."""
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def moe(self) -> bool:
        return self.experts > 1

    @property
    def blocks(self) -> int:
        """Transformer blocks: the layers named block.* (0 for a model without them)."""
        return sum(layer.name.startswith("block.") for layer in self.layers)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: all but the unrouted experts' MLPs."""
        idle = self.expert_params * (self.experts - self.top_k) / self.experts
        return int(round(self.params - self.blocks * idle))

    @property
    def train_flops(self) -> float:
        """Forward + backward FLOPs per sample (what MFU counts)."""
        return (1.0 + BACKWARD_FACTOR) * self.forward_flops


def layer_times(
    workload: Workload, gpu: GPUSpec, efficiency: float, micro_batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds per layer for one micro-batch: FLOPs / (peak * efficiency)."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency:g}")
    forward = workload.layer_flops * micro_batch / (gpu.peak_flops * efficiency)
    return forward, BACKWARD_FACTOR * forward
