"""step.eager's op inventories against PyTorch itself: the same math run under a dispatch mode
that adds up, for every ATen op autograd and the forward issue, the bytes of the tensors it
reads and writes (views launch nothing and are left out). An independent count of what the
hand-written inventories list op by op."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from commsim.step import eager  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.shared]  # ATen byte counts: no timing
BF16 = torch.bfloat16
# ops that index their tensor inputs rather than stream them: nll_loss reads one log-probability
# a row, and its backward takes the log-probabilities for their shape only, writing the
# zero-filled gradient (aten/src/ATen/native/cuda/Loss.cu): their outputs alone count
GATHERS = {"nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward"}
# a reshape of a fresh copy relabels its storage (no alias annotation, no kernel)
NO_KERNEL = {"_unsafe_view"}


class Traffic(TorchDispatchMode):
    """Bytes read (each distinct input storage once) and written (outputs) by the ops run."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        if func.is_view or name in NO_KERNEL:
            return out
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        written = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.bytes += self.read(name, tensors) + self.written(name, written)
        return out

    def read(self, name: str, tensors) -> int:
        """Bytes an op reads of its input tensors: each distinct storage once, whole."""
        if name in GATHERS:
            return 0
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in tensors}
        return sum(s.nbytes() for s in storages.values())

    def written(self, name: str, outputs) -> int:
        """Bytes an op writes: its outputs."""
        return sum(t.numel() * t.element_size() for t in outputs)


def _per_element(make, forward, elements: int) -> tuple[float, float]:
    """(forward, backward) bytes an element of `forward` on the inputs `make` returns."""
    inputs = make()
    with Traffic() as f:
        y = forward(*inputs)
    grad = torch.randn_like(y)
    with Traffic() as b:
        y.backward(grad)
    return f.bytes / elements, b.bytes / elements


def test_rmsnorm_as_torchtitan_writes_it():
    """torchtitan's RMSNorm math on 1,024 rows of 4,096 bf16 values: 36 and 92 bytes an
    element, as RMSNORM_FORWARD / _BACKWARD list them (row-sized and weight terms < 0.3%)."""
    n, h = 1024, 4096

    def make():
        x = torch.randn(n, h, dtype=BF16, requires_grad=True)
        return x, torch.ones(h, dtype=BF16, requires_grad=True)

    def norm(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w

    fwd, bwd = _per_element(make, norm, n * h)
    assert fwd == pytest.approx(eager.total(eager.RMSNORM_FORWARD), rel=3e-3)
    assert bwd == pytest.approx(eager.total(eager.RMSNORM_BACKWARD), rel=3e-3)


def test_swiglu_and_rotary():
    """silu(gate) * up on 256 x 2,048 values: 10 and 18 bytes an element; the complex rotary
    product on 256 tokens of 256 heads of 128 (the frequencies, broadcast over the heads and
    made resolved once backward, < 0.4%): 20 and 20."""
    n, f = 256, 2048

    def gates():
        return tuple(torch.randn(n, f, dtype=BF16, requires_grad=True) for _ in range(2))

    fwd, bwd = _per_element(gates, lambda a, b: F.silu(a) * b, n * f)
    assert (fwd, bwd) == (eager.total(eager.SWIGLU_FORWARD), eager.total(eager.SWIGLU_BACKWARD))
    heads, hd = 256, 128

    def rope_inputs():
        q = torch.randn(n, heads, hd, dtype=BF16, requires_grad=True)
        angles = torch.randn(n, 1, hd // 2)
        return q, torch.polar(torch.ones_like(angles), angles)

    def rope(q, freqs):
        qc = torch.view_as_complex(q.float().reshape(n, heads, hd // 2, 2))
        return torch.view_as_real(qc * freqs).flatten(2).type_as(q)

    fwd, bwd = _per_element(rope_inputs, rope, n * heads * hd)
    assert fwd == pytest.approx(eager.total(eager.ROPE_FORWARD), rel=4e-3)
    assert bwd == pytest.approx(eager.total(eager.ROPE_BACKWARD), rel=4e-3)


def test_loss_and_repeat_kv():
    """cross_entropy(logits.float()) over 512 x 8,192 bf16 logits: 14 and 22 bytes a logit;
    K repeated from 8 to 32 heads of 128 on 512 tokens: half of repeat_kv_bytes (K alone)."""
    n, v = 512, 8192

    def logits():
        return torch.randn(n, v, dtype=BF16, requires_grad=True), torch.randint(v, (n,))

    fwd, bwd = _per_element(logits, lambda x, t: F.cross_entropy(x.float(), t), n * v)
    assert fwd == pytest.approx(eager.total(eager.TORCH_CE_FORWARD), rel=1e-3)
    assert bwd == pytest.approx(eager.total(eager.TORCH_CE_BACKWARD), rel=1e-3)

    def keys():
        return (torch.randn(n, 8, 128, dtype=BF16, requires_grad=True),)

    def repeat(k):
        return k.unsqueeze(2).expand(n, 8, 4, 128).reshape(n, 32, 128)

    fwd, bwd = _per_element(keys, repeat, n)
    assert (fwd, bwd) == tuple(x / 2 for x in eager.repeat_kv_bytes(32, 8, 128))
