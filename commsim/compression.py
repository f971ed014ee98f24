"""Gradient compressors as real numpy code: what they send, what it costs, how much they lose.

A compressor turns one worker's fp32 gradient tensor (or DDP bucket) into a payload and
back. Each one knows its exact bytes on the wire, the collectives that move its payloads
between N workers (in nccl-tests size convention, so `GroupCost.time(op, algorithm, S)`
prices them), its encode/decode work on a GPU as HBM traffic (+ matmul FLOPs for PowerSGD),
and how it aggregates: `exchange` runs one collective round for all workers at once and
returns what every worker ends up with plus what each one contributed. `ErrorFeedback`
adds the per-worker residual memory that makes biased compressors converge.

Spellings: none | fp16 | bf16 | int8 | topk:RATIO | randomk:RATIO | powersgd:RANK | sign,
and a sparsifier with quantised values, topk:RATIO+{fp16,bf16,int8} (randomk likewise).
"""

from __future__ import annotations

import math
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

SPELLINGS = (
    "none, fp16, bf16, int8, topk:RATIO, randomk:RATIO, powersgd:RANK, sign, "
    "topk:RATIO+{fp16,bf16,int8}, randomk:RATIO+{fp16,bf16,int8} "
    "(RATIO a number in (0, 1], RANK an integer >= 1)"
)
INT8_CHUNK = 2048  # elements per fp32 scale: the block size of Dettmers et al. 2022 (8-bit
# optimizers via block-wise quantization, arXiv:2110.02861)
SECTOR = 32  # bytes: the DRAM access granularity of NVIDIA GPUs (CUDA Best Practices Guide,
# "Coalesced access to global memory": accesses are serviced in 32-byte sectors)
RADIX_PASSES = 4  # torch.topk on large slices (mbtopk in aten/.../TensorTopK.cu): RADIX_BITS = 8,
# so 32-bit keys take 4 digit-histogram passes over the input

Payload = Any  # each compressor's own tuple of numpy arrays; see compress()


def _flat(g: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(g, dtype=np.float32).reshape(-1)


def _size(n_elements: int, shape: Sequence[int] | None) -> int:
    return math.prod(shape) if shape is not None else int(n_elements)


def _scatter_bytes(updates: float, n: int) -> float:
    """HBM bytes of `updates` random read-modify-writes into an n-element fp32 array: one
    sector read and written each, at most a full read and write of the array."""
    return min(updates * 2 * SECTOR, 8.0 * n)


class Compressor(ABC):
    """One compression scheme; `spec` is its canonical spelling."""

    spec: str
    collective: str  # "all-reduce": summed in the network; "all-gather": each rank gets all

    def __repr__(self) -> str:
        return f"<compressor {self.spec}>"

    @abstractmethod
    def compress(self, g: np.ndarray, key: int = 0) -> Payload:
        """One worker's payload for tensor `g`; `key` names the tensor/bucket (shared state)."""

    @abstractmethod
    def decompress(self, payload: Payload, shape: Sequence[int]) -> np.ndarray:
        """The fp32 tensor of `shape` that `payload` stands for."""

    @abstractmethod
    def wire_bytes(self, n_elements: int, shape: Sequence[int] | None = None) -> int:
        """Exact bytes one worker sends for a tensor of `n_elements` (or `shape`)."""

    @abstractmethod
    def hbm_bytes(self, n: int, workers: int) -> tuple[float, float]:
        """HBM bytes moved to encode, and to decode what `workers` workers sent, for n fp32s."""

    def flops(self, n: int) -> tuple[float, float]:
        """Matmul FLOPs of encode and decode (only low-rank compressors have any)."""
        return 0.0, 0.0

    def collectives(self, n: int, workers: int) -> list[tuple[str, int]]:
        """(op, S) to run for a bucket of n fp32s; all-gather's S is its output, N payloads."""
        wire = self.wire_bytes(n)
        return [(self.collective, wire if self.collective == "all-reduce" else workers * wire)]

    def tensor_collectives(
        self, shapes: Sequence[Sequence[int]], workers: int
    ) -> list[tuple[str, int]]:
        """(op, S) for a bucket of fp32 parameter gradients of these shapes: the flat bucket's,
        but where a comm hook treats tensors one by one (PowerSGD)."""
        return self.collectives(sum(math.prod(s) for s in shapes), workers)

    def exchange(
        self, inputs: Sequence[np.ndarray], key: int = 0
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One round among len(inputs) workers: (what every worker receives, the average
        gradient; each worker's own contribution, decompressed). Advances shared state."""
        shape = inputs[0].shape
        sent = [self.decompress(self.compress(x, key), shape) for x in inputs]
        return self._combine(sent), sent

    def _combine(self, sent: list[np.ndarray]) -> np.ndarray:
        """The average the collective produces from the decompressed contributions."""
        return np.mean(sent, axis=0, dtype=np.float32)


class Identity(Compressor):
    """No compression: fp32 all-reduce, as DDP does by default."""

    spec, collective = "none", "all-reduce"

    def compress(self, g: np.ndarray, key: int = 0) -> np.ndarray:
        return _flat(g).copy()

    def decompress(self, payload: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        return payload.reshape(shape)

    def wire_bytes(self, n_elements: int, shape: Sequence[int] | None = None) -> int:
        return 4 * _size(n_elements, shape)

    def hbm_bytes(self, n: int, workers: int) -> tuple[float, float]:
        return 0.0, 0.0  # the collective reads and writes the bucket in place


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even; NaN -> quiet NaN (as c10::BFloat16's
    round_to_nearest_even: add 0x7FFF plus the lowest kept bit, then drop 16 bits)."""
    u = x.view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16  # wraps only for NaNs
    return np.where(np.isnan(x), np.uint32(0x7FC0), rounded).astype(np.uint16)


def _from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Cast16(Compressor):
    """fp16 or bf16 values, summed in that format (torch's fp16/bf16_compress_hook)."""

    collective = "all-reduce"

    def __init__(self, fmt: str):
        self.spec = fmt

    def compress(self, g: np.ndarray, key: int = 0) -> np.ndarray:
        x = _flat(g)
        return x.astype(np.float16) if self.spec == "fp16" else _bf16_bits(x)

    def decompress(self, payload: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        x = payload.astype(np.float32) if self.spec == "fp16" else _from_bf16(payload)
        return x.reshape(shape)

    def _to_format(self, x: np.ndarray) -> np.ndarray:
        return self.decompress(self.compress(x), x.shape)

    def _combine(self, sent: list[np.ndarray]) -> np.ndarray:
        # NCCL reduces a 16-bit buffer in that format: one rounding per ring hop.
        acc = sent[0]
        for s in sent[1:]:
            acc = self._to_format(acc + s)
        return acc / np.float32(len(sent))

    def wire_bytes(self, n_elements: int, shape: Sequence[int] | None = None) -> int:
        return 2 * _size(n_elements, shape)

    def hbm_bytes(self, n: int, workers: int) -> tuple[float, float]:
        return 6.0 * n, 6.0 * n  # cast: read 4 + write 2 bytes/elt; back: read 2 + write 4


class Int8(Compressor):
    """Symmetric int8 with one fp32 scale (absmax / 127) per INT8_CHUNK elements.

    NCCL cannot sum int8 payloads whose scales differ per worker, and requantising at every
    ring hop would compound the error, so the reduction runs as ZeRO++'s qgZ does (Wang et
    al. 2023, arXiv:2306.10209, sec. 3.3): all-to-all of the quantised shards, each rank
    dequantises, sums and requantises its shard, then an all-gather. Per-rank traffic is
    2(N-1)/N of the payload, as a ring all-reduce's, so `collective` is "all-reduce".
    """

    spec, collective = "int8", "all-reduce"

    def compress(self, g: np.ndarray, key: int = 0) -> tuple[np.ndarray, np.ndarray]:
        x = _flat(g)
        chunks = -(-x.size // INT8_CHUNK)
        blocks = np.zeros(chunks * INT8_CHUNK, np.float32)
        blocks[: x.size] = x
        blocks = blocks.reshape(chunks, INT8_CHUNK)
        scale = (np.abs(blocks).max(axis=1) / np.float32(127)).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1))[:, None]
        q = np.clip(np.rint(blocks / safe), -127, 127).astype(np.int8)
        return q.reshape(-1)[: x.size], scale

    def decompress(
        self, payload: tuple[np.ndarray, np.ndarray], shape: Sequence[int]
    ) -> np.ndarray:
        q, scale = payload
        x = q.astype(np.float32) * np.repeat(scale, INT8_CHUNK)[: q.size]
        return x.reshape(shape)

    def _combine(self, sent: list[np.ndarray]) -> np.ndarray:
        mean = super()._combine(sent)
        if len(sent) == 1:
            return mean
        return self.decompress(self.compress(mean), mean.shape)  # qgZ requantises the sum

    def wire_bytes(self, n_elements: int, shape: Sequence[int] | None = None) -> int:
        n = _size(n_elements, shape)
        return n + 4 * -(-n // INT8_CHUNK)  # 1 byte/value + one fp32 scale per chunk

    def collectives(self, n: int, workers: int) -> list[tuple[str, int]]:
        wire = self.wire_bytes(n)
        return [("all-to-all", wire), ("all-gather", wire)]

    def hbm_bytes(self, n: int, workers: int) -> tuple[float, float]:
        s = 4.0 * -(-n // INT8_CHUNK)  # scale bytes
        enc = 4.0 * n + 4.0 * n + n + s  # absmax pass; scale-and-round pass (read 4, write 1)
        # qgZ's fused kernel reads N shards (n bytes in all) and writes its requantised
        # shard (a chunk fits one thread block); then dequantise everything: read 1, write 4.
        dec = (n + s) * (1 + 1 / workers) + n + s + 4.0 * n
        return enc, dec


class Sparse(Compressor):
    """k = ceil(ratio * n) coordinates: the largest |g| (top-k) or a random set (random-k),
    values in fp32 or through a dense value codec (fp16, bf16, int8); no rescaling, so
    C is a delta-contraction (Stich et al. 2018, arXiv:1809.07599)."""

    def __init__(self, kind: str, ratio: float, values: Compressor, seed: int = 0):
        self.kind, self.ratio, self.values, self.seed = kind, ratio, values, seed
        codec = "" if isinstance(values, Identity) else f"+{values.spec}"
        self.spec = f"{kind}:{ratio:g}{codec}"
        # top-k indices differ per worker: all-gather the (index, value) pairs. random-k
        # indices come from a seed every worker derives from (key, round), as GRACE's
        # RandomKCompressor seeds with hash(name) + step: they coincide, so the values are
        # summed in place by the value codec's collective and no index crosses the wire.
        self.collective = "all-gather" if kind == "topk" else values.collective
        self._round: dict[int, int] = {}

    def k(self, n: int) -> int:
        """ceil(ratio * n), rounded to 1e-9 first so that 0.07 * 100 gives 7, not 8."""
        return min(n, math.ceil(round(self.ratio * n, 9)))

    def _random_indices(self, n: int, key: int, round_: int) -> np.ndarray:
        """k distinct indices (a*j + b) mod n with gcd(a, n) = 1 and b uniform: every index is
        kept with probability k/n, and a GPU computes them in registers from (a, b)."""
        rng = np.random.default_rng([self.seed, key, round_])
        a = 1
        if n > 2:
            a = int(rng.integers(1, n))
            while math.gcd(a, n) != 1:
                a = int(rng.integers(1, n))
        b = int(rng.integers(0, max(n, 1)))
        return (a * np.arange(self.k(n), dtype=np.int64) + b) % n

    def compress(self, g: np.ndarray, key: int = 0) -> tuple[Any, Any]:
        x = _flat(g)
        k = self.k(x.size)
        if self.kind == "topk":
            idx = np.argpartition(np.abs(x), x.size - k)[x.size - k :].astype(np.uint32)
            return idx, self.values.compress(x[idx])
        round_ = self._round.get(key, 0)
        idx = self._random_indices(x.size, key, round_)
        return (key, round_), self.values.compress(x[idx])  # (key, round): shared, not sent

    def _indices(self, head: Any, n: int) -> np.ndarray:
        return head if self.kind == "topk" else self._random_indices(n, *head)

    def decompress(self, payload: tuple[Any, Any], shape: Sequence[int]) -> np.ndarray:
        head, vals = payload
        n = math.prod(shape)
        idx = self._indices(head, n)
        out = np.zeros(n, np.float32)
        out[idx] = self.values.decompress(vals, (idx.size,))
        return out.reshape(shape)

    def exchange(
        self, inputs: Sequence[np.ndarray], key: int = 0
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        if self.kind == "topk":
            return super().exchange(inputs, key)
        shape, n = inputs[0].shape, inputs[0].size
        idx = self._random_indices(n, key, self._round.get(key, 0))
        mean_vals, sent_vals = self.values.exchange([_flat(x)[idx] for x in inputs], key)
        self._round[key] = self._round.get(key, 0) + 1

        def dense(v: np.ndarray) -> np.ndarray:
            out = np.zeros(n, np.float32)
            out[idx] = v
            return out.reshape(shape)

        return dense(mean_vals), [dense(v) for v in sent_vals]

    def wire_bytes(self, n_elements: int, shape: Sequence[int] | None = None) -> int:
        k = self.k(_size(n_elements, shape))
        index_bytes = 4 * k if self.kind == "topk" else 0  # uint32 indices
        return self.values.wire_bytes(k) + index_bytes

    def collectives(self, n: int, workers: int) -> list[tuple[str, int]]:
        if self.kind == "topk":
            return super().collectives(n, workers)
        return self.values.collectives(self.k(n), workers)

    def hbm_bytes(self, n: int, workers: int) -> tuple[float, float]:
        k = self.k(n)
        val_enc, val_dec = self.values.hbm_bytes(k, workers)
        zero_fill = 4.0 * n  # the dense output starts at zero
        if self.kind == "topk":
            # RADIX_PASSES histogram passes + one gather pass, each reading the fp32 input;
            # then the k values and uint32 indices are written.
            enc = (RADIX_PASSES + 1) * 4.0 * n + 8.0 * k + val_enc
            # read every worker's pairs, scatter-add them (value decode in registers)
            dec = zero_fill + workers * self.wire_bytes(n) + _scatter_bytes(workers * k, n)
            return enc, dec
        enc = min(k * SECTOR, 4.0 * n) + 4.0 * k + val_enc  # gather by sector; write values
        dec = zero_fill + val_dec + 4.0 * k + _scatter_bytes(k, n)  # read values, scatter
        return enc, dec


def matrix_view(shape: Sequence[int]) -> tuple[int, int]:
    """The n x m matrix PowerSGD compresses: (shape[0], rest) for a >=2-D tensor as torch's
    powerSGD_hook; a flat bucket zero-padded to the square ceil(sqrt(L))^2 as
    batched_powerSGD_hook."""
    if len(shape) >= 2:
        return int(shape[0]), math.prod(shape[1:])
    side = math.ceil(math.sqrt(math.prod(shape)))
    return side, side


MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default: compress a tensor only if 2x smaller


class PowerSGD(Compressor):
    """Rank-r approximation P Q^T by one power iteration from a warm-started Q (Vogels et
    al. 2019, arXiv:1905.13727, Algorithm 1). Both factors sum in place: two all-reduces."""

    collective = "all-reduce"

    def __init__(self, rank: int, seed: int = 0):
        self.rank, self.seed = rank, seed
        self.spec = f"powersgd:{rank}"
        self._q: dict[int, np.ndarray] = {}

    def _matrix(self, g: np.ndarray) -> np.ndarray:
        n, m = matrix_view(g.shape)
        x = _flat(g)
        if x.size == n * m:
            return x.reshape(n, m)
        padded = np.zeros(n * m, np.float32)
        padded[: x.size] = x
        return padded.reshape(n, m)

    def _warm_q(self, key: int, n: int, m: int) -> np.ndarray:
        r = min(n, m, self.rank)  # torch clips the rank the same way
        q = self._q.get(key)
        if q is None or q.shape != (m, r):  # torch: seeded standard normal, orthogonalised
            rng = np.random.default_rng([self.seed, key])
            q = _orthonormal(rng.standard_normal((m, r)).astype(np.float32))
        return q

    def compress(self, g: np.ndarray, key: int = 0) -> tuple[np.ndarray, np.ndarray]:
        m_ = self._matrix(g)
        p = _orthonormal(m_ @ self._warm_q(key, *m_.shape))
        return p, m_.T @ p

    def decompress(
        self, payload: tuple[np.ndarray, np.ndarray], shape: Sequence[int]
    ) -> np.ndarray:
        p, q = payload
        return (p @ q.T).reshape(-1)[: math.prod(shape)].reshape(shape)

    def exchange(
        self, inputs: Sequence[np.ndarray], key: int = 0
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        shape = inputs[0].shape
        mats = [self._matrix(x) for x in inputs]
        q = self._warm_q(key, *mats[0].shape)
        p = _orthonormal(np.mean([m_ @ q for m_ in mats], axis=0))  # all-reduce P, then orth
        qs = [m_.T @ p for m_ in mats]
        q_mean = np.mean(qs, axis=0)  # all-reduce Q
        self._q[key] = q_mean  # the warm start of the next round
        return self.decompress((p, q_mean), shape), [self.decompress((p, q), shape) for q in qs]

    def wire_bytes(self, n_elements: int, shape: Sequence[int] | None = None) -> int:
        n, m = matrix_view(shape if shape is not None else (n_elements,))
        return 4 * (n + m) * min(n, m, self.rank)

    def collectives(self, n: int, workers: int) -> list[tuple[str, int]]:
        rows, cols = matrix_view((n,))
        r = min(rows, cols, self.rank)
        return [("all-reduce", 4 * rows * r), ("all-reduce", 4 * cols * r)]

    def tensor_collectives(
        self, shapes: Sequence[Sequence[int]], workers: int
    ) -> list[tuple[str, int]]:
        """As torch's per-tensor powerSGD_hook sends a bucket: each tensor viewed as
        (shape[0], rest) is compressed when (n + m) r x MIN_COMPRESSION_RATE < n m (so 1-D
        tensors never are); one all-reduce of the others uncompressed, then one of all Ps
        (n x r each), then one of all Qs (m x r each)."""
        plain = ps = qs = 0
        for shape in shapes:
            n, m = int(shape[0]), math.prod(shape[1:])
            r = min(n, m, self.rank)
            if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
                ps, qs = ps + n * r, qs + m * r
            else:
                plain += n * m
        return [("all-reduce", 4 * plain), ("all-reduce", 4 * ps), ("all-reduce", 4 * qs)]

    def hbm_bytes(self, n: int, workers: int) -> tuple[float, float]:
        rows, cols = matrix_view((n,))
        factors = 4.0 * (rows + cols) * min(rows, cols, self.rank)
        # encode: read M for M Q and again for M^T P; write P and Q and read them back once
        # decode: read P and Q, write the rows x cols approximation
        return 8.0 * rows * cols + 2 * factors, factors + 4.0 * rows * cols

    def flops(self, n: int) -> tuple[float, float]:
        rows, cols = matrix_view((n,))
        one = 2.0 * rows * cols * min(rows, cols, self.rank)  # one (rows x cols) x r matmul
        return 2 * one, one  # encode: M Q and M^T P; decode: P Q^T


def _orthonormal(a: np.ndarray) -> np.ndarray:
    """Orthonormal columns spanning `a` (Householder QR; torch's hook uses Gram-Schmidt)."""
    return np.linalg.qr(a)[0].astype(np.float32)


class ScaledSign(Compressor):
    """1 bit per value plus one fp32 scale ||g||_1 / n (EF-SignSGD, Karimireddy et al. 2019,
    arXiv:1901.09847; signSGD, Bernstein et al. 2018). A sum of N signs needs log2(N+1)
    bits and each worker has its own scale, so the 1-bit form cannot be reduced in place:
    every worker all-gathers the N payloads and averages them."""

    spec, collective = "sign", "all-gather"

    def compress(self, g: np.ndarray, key: int = 0) -> tuple[np.ndarray, np.float32]:
        x = _flat(g)
        scale = np.float32(np.abs(x).sum(dtype=np.float64) / max(x.size, 1))
        return np.packbits(x >= 0), scale  # bit 1: +scale (zero counts as positive)

    def decompress(
        self, payload: tuple[np.ndarray, np.float32], shape: Sequence[int]
    ) -> np.ndarray:
        bits, scale = payload
        signs = np.unpackbits(bits, count=math.prod(shape)).astype(np.float32) * 2 - 1
        return (signs * scale).reshape(shape)

    def wire_bytes(self, n_elements: int, shape: Sequence[int] | None = None) -> int:
        return -(-_size(n_elements, shape) // 8) + 4  # packed bits + fp32 scale

    def hbm_bytes(self, n: int, workers: int) -> tuple[float, float]:
        # encode: an L1-norm pass (read 4) and a pack pass (read 4, write 1/8) per element;
        # decode: read all N packed payloads, write the fp32 average once (fused)
        return 8.0 * n + n / 8 + 4, workers * self.wire_bytes(n) + 4.0 * n


def _parse_ratio(text: str, spec: str) -> float:
    try:
        ratio = float(text)
    except ValueError:
        ratio = math.nan
    if not 0 < ratio <= 1:
        raise ValueError(f"compressor {spec!r}: RATIO must be a number in (0, 1], got {text!r}")
    return ratio


def parse_compressor(spec: str, seed: int = 0) -> Compressor:
    """A compressor from its spelling; a ValueError names the valid spellings."""
    text = spec.strip().lower()
    dense = {"none": Identity, "int8": Int8, "sign": ScaledSign}
    if text in dense:
        return dense[text]()
    if text in ("fp16", "bf16"):
        return Cast16(text)
    name, _, arg = text.partition(":")
    if name in ("topk", "randomk") and arg:
        ratio_text, plus, codec = arg.partition("+")
        if plus and codec not in ("fp16", "bf16", "int8"):
            raise ValueError(f"compressor {spec!r}: values codec must be fp16, bf16 or int8")
        values = parse_compressor(codec) if plus else Identity()
        return Sparse(name, _parse_ratio(ratio_text, spec), values, seed)
    if name == "powersgd" and arg:
        if not arg.isdigit() or int(arg) < 1:
            raise ValueError(f"compressor {spec!r}: RANK must be an integer >= 1, got {arg!r}")
        return PowerSGD(int(arg), seed)
    raise ValueError(f"unknown compressor {spec!r}; valid spellings: {SPELLINGS}")


def as_compressor(c: Compressor | str) -> Compressor:
    return parse_compressor(c) if isinstance(c, str) else c


def collective(compressor: Compressor | str) -> str:
    """'all-reduce' when payloads sum inside the collective (per-rank bytes flat in N),
    'all-gather' when every worker must receive every payload (bytes grow with N)."""
    return as_compressor(compressor).collective


def bucket_collectives(
    compressor: Compressor | str, bucket_bytes: float, n_workers: int
) -> list[tuple[str, int]]:
    """The collectives for one bucket of `bucket_bytes` fp32 gradients among `n_workers`:
    [(op, S)] with S in nccl-tests convention (all-gather: output = N x per-rank payload)."""
    n = math.ceil(bucket_bytes / 4)
    return as_compressor(compressor).collectives(n, n_workers)


class ErrorFeedback:
    """Per-worker, per-bucket residual memory: compress g + e, keep e = (g + e) - sent, so
    nothing is lost, only delayed (Seide et al. 2014; Stich et al. 2018)."""

    def __init__(self, compressor: Compressor | str):
        self.compressor = as_compressor(compressor)
        self.residuals: dict[tuple[int, int], np.ndarray] = {}

    def _apply(
        self, bucket_id: int, grads: Sequence[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        acc = [
            np.asarray(g, np.float32) + self.residuals.get((bucket_id, w), np.float32(0))
            for w, g in enumerate(grads)
        ]
        mean, sent = self.compressor.exchange(acc, bucket_id)
        for w, (a, s) in enumerate(zip(acc, sent, strict=True)):
            self.residuals[(bucket_id, w)] = a - s
        return mean, sent

    def exchange(self, bucket_id: int, grads: Sequence[np.ndarray]) -> np.ndarray:
        """One round for all workers (worker w's residual is grads[w]'s); the average."""
        return self._apply(bucket_id, grads)[0]

    def step(self, bucket_id: int, g: np.ndarray) -> np.ndarray:
        """One worker alone: what it sends (decompressed) for gradient g of this bucket."""
        return self._apply(bucket_id, [g])[1][0]


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(compressor: Compressor | str, g: np.ndarray, repeats: int = 5) -> dict[str, Any]:
    """Wire ratio, contraction delta = 1 - ||C(g) - g||^2 / ||g||^2, and this machine's
    encode/decode seconds per MB (1e6 bytes) of fp32 input, median of `repeats`. Uses a
    fresh instance, so PowerSGD runs its single power iteration from a random Q."""
    c = parse_compressor(as_compressor(compressor).spec)
    g = np.asarray(g, np.float32)
    payload = c.compress(g)
    err = c.decompress(payload, g.shape).astype(np.float64) - g
    delta = 1.0 - float(np.sum(err**2) / np.sum(g.astype(np.float64) ** 2))
    mb = g.nbytes / 1e6
    return {
        "compressor": c.spec,
        "wire_ratio": c.wire_bytes(g.size, g.shape) / g.nbytes,
        "delta": delta,
        "encode_s_per_MB": _median_seconds(lambda: c.compress(g), repeats) / mb,
        "decode_s_per_MB": _median_seconds(lambda: c.decompress(payload, g.shape), repeats) / mb,
    }


def synthetic_gradients(
    shapes: Sequence[Sequence[int]], batch: int = 64, df: float = 3.0, seed: int = 0
) -> list[np.ndarray]:
    """Gradient-like fp32 tensors, one per shape: a matrix is a sum of `batch` outer products
    d_b x_b^T (a linear layer's weight gradient is exactly that) with Student-t(df) factors,
    for heavy tails (Simsekli et al. 2019, arXiv:1901.06053); a vector is Student-t. Each
    tensor gets a log-normal(0, 1) scale: per-layer gradient norms differ by orders of
    magnitude (You et al. 2017, LARS, arXiv:1708.03888)."""
    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        scale = rng.lognormal(0.0, 1.0)
        if len(shape) >= 2:
            n, m = shape[0], math.prod(shape[1:])
            d = rng.standard_t(df, (n, batch))
            x = rng.standard_t(df, (batch, m))
            g = (d @ x / batch).reshape(shape)
        else:
            g = rng.standard_t(df, tuple(shape))
        out.append((scale * g).astype(np.float32))
    return out
