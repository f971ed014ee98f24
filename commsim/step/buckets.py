"""Gradient buckets, formed one way everywhere: PyTorch DDP's rule over the gradients one GPU
of a pipeline stage reduces, and when each bucket is ready during the last backward.

Every caller (the vectorised step model, the detailed timeline, calibration's validation)
takes its buckets from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from commsim.workload.model import Workload

MIB = 2**20
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_DEFAULT_CAP_MB = 25.0  # DDP's bucket_cap_mb when none is passed (torch's DEFAULT_BUCKET_CAP_MB)
# From torch 2.4 a bucket_cap_mb the user gives also caps the first bucket (pytorch#121640,
# "make first bucket size equal to bucket_cap_mb if it was set"; in torch 2.13 DDP's
# _BucketCapacityConfig.create); before, the first bucket was always the 1 MiB default
# (pytorch#62748 passes dist._DEFAULT_FIRST_BUCKET_BYTES to the Reducer).
FIRST_BUCKET_FOLLOWS_CAP = (2, 4)
STAGE_KINDS = ("only", "first", "middle", "last")  # a pipeline stage's place: what it holds


def ddp_first_bucket_bytes(cap_bytes: float, cap_given: bool, torch_version: str = "") -> float:
    """The first bucket's limit once DDP rebuilds its buckets: the cap itself when
    bucket_cap_mb is given and torch is 2.4 or later (FIRST_BUCKET_FOLLOWS_CAP), else DDP's
    1 MiB. torch_version as torch.__version__ spells it ("2.13.0+cpu"); "" is the newest."""
    numbers = torch_version.split("+")[0].split(".")[:2]
    try:
        version = tuple(int(x) for x in numbers) if torch_version else FIRST_BUCKET_FOLLOWS_CAP
    except ValueError:
        raise ValueError(f"torch version {torch_version!r} is not MAJOR.MINOR[.PATCH]") from None
    follows = cap_given and version >= FIRST_BUCKET_FOLLOWS_CAP
    return float(cap_bytes if follows else DDP_FIRST_BUCKET_BYTES)


def first_bucket_mb(bucket_mb: np.ndarray | float, given: float | None = None) -> np.ndarray:
    """The first bucket (MiB) of DDP with cap(s) `bucket_mb`: `given` when the strategy sets it,
    else as the newest torch forms it (ddp_first_bucket_bytes), reading DDP's default cap as
    no bucket_cap_mb passed (the 1 MiB first bucket) and any other cap as passed (the cap)."""
    caps = np.asarray(bucket_mb, dtype=float)
    if given is not None:
        return np.full_like(caps, given)
    unique, at = np.unique(caps, return_inverse=True)
    firsts = [ddp_first_bucket_bytes(c * MIB, c != DDP_DEFAULT_CAP_MB) / MIB for c in unique]
    return np.asarray(firsts, dtype=float)[at].reshape(caps.shape)


def assign_buckets(
    tensor_bytes: np.ndarray | list[float],
    cap_bytes: float,
    first_cap_bytes: float = DDP_FIRST_BUCKET_BYTES,
) -> list[list[int]]:
    """Group gradient tensors (bytes, registration order) into DDP buckets; indices per bucket.

    As torch's compute_bucket_assignment_by_size does when DDP rebuilds its buckets after the
    first iteration: tensors in gradient-ready order (reverse registration order), a bucket
    closes as soon as its size reaches its limit (the tensor that crosses it stays in, so a
    tensor over the limit ends the bucket it joins), the first bucket's limit is
    `first_cap_bytes` and later ones' `cap_bytes`. An empty tensor joins no bucket.
    """
    sizes = np.asarray(tensor_bytes, dtype=float).tolist()
    buckets: list[list[int]] = []
    current: list[int] = []
    size, limit = 0.0, first_cap_bytes
    for i in reversed(range(len(sizes))):
        nbytes = sizes[i]
        if nbytes <= 0:
            continue
        current.append(i)
        size += nbytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0.0, cap_bytes
    if current:
        buckets.append(current)
    return buckets


def stage_layer_range(workload: Workload, kind: str, blocks: int) -> range:
    """The workload layers a pipeline stage holds: all ("only"); the layers before the first
    block and `blocks` blocks ("first"); `blocks` blocks ("middle"); `blocks` blocks and the
    layers after the last ("last"). A middle stage is placed after the first's blocks."""
    names = [layer.name for layer in workload.layers]
    at = [i for i, n in enumerate(names) if n.startswith("block.")]
    if kind == "only" or not at:
        return range(len(names))
    start, end = at[0], at[-1] + 1
    if kind == "first":
        return range(0, start + blocks)
    if kind == "middle":
        return range(start + blocks, start + 2 * blocks)
    return range(end - blocks, len(names))


@dataclass(frozen=True)
class BucketPlan:
    """The buckets one GPU of a stage reduces, in launch order.

    bytes: each bucket's gradient bytes; expert: whether it holds expert gradients (reduced
    over the expert-data-parallel group when ep > 1); ready: the fraction of the stage's
    last backward done when its last gradient exists; tensors: indices into the stage's
    tensors (layer order); layer_of: each stage tensor's layer (a workload layer index)."""

    bytes: np.ndarray
    expert: np.ndarray
    ready: np.ndarray
    tensors: tuple[tuple[int, ...], ...]
    layer_of: np.ndarray

    def __len__(self) -> int:
        return len(self.bytes)


def stage_tensor_bytes(
    workload: Workload, layers: range, tp: int, ep: int, grad_bytes: int, etp: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, expert flag, layer) of each gradient tensor one GPU of the stage holds: a
    tensor split over tp ("tp") is 1/tp of it, an expert's ("ep") 1/(etp ep) (etp 0: tp),
    others whole."""
    sizes, expert, layer_of = [], [], []
    for i in layers:
        layer = workload.layers[i]
        for j, n in enumerate(layer.tensors):
            shard = layer.shard(j)
            split = (etp or tp) * ep if shard == "ep" else tp if shard == "tp" else 1
            sizes.append(n * grad_bytes / split)
            expert.append(shard == "ep")
            layer_of.append(i)
    return np.array(sizes, dtype=float), np.array(expert, dtype=bool), np.array(layer_of)


@lru_cache(maxsize=4096)
def stage_buckets(
    workload: Workload,
    kind: str,
    blocks: int,
    tp: int,
    ep: int,
    grad_bytes: int,
    cap_bytes: float,
    first_cap_bytes: float,
    layer_weights: tuple[float, ...],
    etp: int = 0,
) -> BucketPlan:
    """The stage's buckets by PyTorch's rule, cached (a search asks for a few hundred).

    When the expert grid differs from the data-parallel one (ep > 1, or an expert tensor-
    parallel degree etp other than tp; 0: tp) expert gradients reduce over another group, so
    they fill buckets of their own (Megatron-core keeps a separate buffer for them); the two
    sets launch in ready order. layer_weights: each workload layer's share of backward time
    (any scale), which sets when a bucket is ready: when the backward of its earliest layer
    ends."""
    layers = stage_layer_range(workload, kind, blocks)
    sizes, expert, layer_of = stage_tensor_bytes(workload, layers, tp, ep, grad_bytes, etp)
    own = ep > 1 or (etp or tp) != tp
    sets = [np.nonzero(~expert)[0], np.nonzero(expert)[0]] if own else [np.arange(sizes.size)]
    weights = np.array([layer_weights[i] for i in layers], dtype=float)
    # backward runs the last layer first: layer k's ends once the layers >= k have run
    suffix = np.cumsum(weights[::-1])[::-1]
    done = suffix / max(float(suffix[0]), 1e-300)
    rows = []
    for members in sets:
        for bucket in assign_buckets(sizes[members], cap_bytes, first_cap_bytes):
            idx = members[bucket]
            first_layer = int(layer_of[idx].min()) - layers.start
            own_group = own and bool(expert[idx[0]])
            rows.append((float(done[first_layer]), float(sizes[idx].sum()), own_group, idx))
    rows.sort(key=lambda r: r[0])  # stable: dense first on ties
    return BucketPlan(
        bytes=np.array([r[1] for r in rows]),
        expert=np.array([r[2] for r in rows], dtype=bool),
        ready=np.array([r[0] for r in rows]),
        tensors=tuple(tuple(int(i) for i in r[3]) for r in rows),
        layer_of=layer_of,
    )
