"""step.torch_ring's eager inventories against PyTorch itself: the last rank's ring loops of
Dec 2024 (_attention.py's _templated_ring_attention with _SDPAMerger, and its backward), their
element-wise ops written out as that code runs them, under a dispatch mode that adds up the
bytes every ATen op reads and writes. The SDPA calls and the collectives are left out (their
results are made beforehand): the count is the ring's own HBM traffic."""

from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
from test_eager_torch import Traffic as StorageTraffic  # noqa: E402

from commsim.step.torch_ring import merge_bytes  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.shared]  # ATen bytes, Inductor: no timing
BF16, FP32 = torch.bfloat16, torch.float32
B, HEADS, TOKENS, WIDTH = 1, 4, 64, 16  # a rank's b, heads, s / cp, head width
# fills only write; the CPU's log_sigmoid_forward returns a full buffer, CUDA's an empty one
WRITE_ONLY = {"zero_", "fill_", "zeros_like"}


class Traffic(StorageTraffic):
    """test_eager_torch's count, each input read as its view's elements (a chunk of a
    buffer reads the chunk), fills read nothing, log_sigmoid's buffer as CUDA's (empty)."""

    def read(self, name, tensors):
        if name in WRITE_ONLY:
            return 0
        views = {(t.data_ptr(), t.shape): t for t in tensors}
        return sum(t.numel() * t.element_size() for t in views.values())

    def written(self, name, outputs):
        return super().written(name, outputs[:1] if name == "log_sigmoid_forward" else outputs)


def _heads(dtype=BF16):
    """A (b, heads, tokens, width) tensor transposed from (b, tokens, heads, width), as
    torchtitan hands SDPA its repeated K and V."""
    return torch.randn(B, TOKENS, HEADS, WIDTH, dtype=dtype).transpose(1, 2)


def _forward(cp, outs, lses, key, value):
    """The last rank's forward ring loop's own ops: K, V made contiguous, the cat for the
    rotater each step but the last, and the merge of each step's SDPA output."""
    key, value = key.contiguous(), value.contiguous()
    out = lse = None
    for i in range(cp):
        if i < cp - 1:
            torch.cat([key.flatten(), value.flatten()])
        block_out, block_lse = outs[i].to(FP32), lses[i].to(FP32).unsqueeze(-1)
        if out is None:
            out, lse = block_out, block_lse
        else:
            out = out - F.sigmoid(block_lse - lse) * (out - block_out)
            lse = lse - F.logsigmoid(lse - block_lse)
    return out.to(BF16)


def _half_add(whole, half):
    """_partial_update(whole, half, idx=0, add=True): add into the first half, cat back."""
    chunks = list(whole.chunk(2, dim=2))
    chunks[0] += half
    return torch.cat(chunks, dim=2)


def _backward(cp, grads, received, query, key, value):
    """The last rank's backward ring loop's own ops (every later step takes the first half of
    the K/V chunk pair, i <= rank): fp32 buffers, K, V made contiguous, the rotater's cats,
    the gradient adds and the sends' cats, the casts back."""
    grad_query = torch.zeros_like(query, dtype=FP32)
    grad_key = torch.zeros_like(key, dtype=FP32)
    grad_value = torch.zeros_like(value, dtype=FP32)
    key, value = key.contiguous(), value.contiguous()
    n = grad_key.numel()
    for i in range(cp):
        if i < cp - 1:
            torch.cat([key.flatten(), value.flatten()])
        dq, dk, dv = grads[i]
        if i == 0:
            grad_key += dk
            grad_value += dv
        else:
            buffer = received[i - 1]
            grad_key = _half_add(buffer[:n].reshape(grad_key.shape), dk)
            grad_value = _half_add(buffer[n:].reshape(grad_value.shape), dv)
        torch.cat([grad_key.flatten(), grad_value.flatten()])
        grad_query += dq
    grad_query.to(BF16)
    received[-1].to(BF16)


@pytest.mark.parametrize("cp", [2, 3, 5])
def test_the_eager_inventories_are_the_ring_loops_aten_bytes(cp):
    queries = B * HEADS * TOKENS * WIDTH
    rows = queries // WIDTH
    outs = [torch.randn(B, HEADS, TOKENS, WIDTH, dtype=BF16) for _ in range(cp)]
    lses = [torch.randn(B, HEADS, TOKENS, dtype=FP32) for _ in range(cp)]
    key, value, query = _heads(), _heads(), _heads()
    with Traffic() as f:
        _forward(cp, outs, lses, key, value)
    half = (B, HEADS, TOKENS // 2, WIDTH)
    grads = [(torch.randn(*key.shape, dtype=BF16),) + (torch.randn(*key.shape, dtype=BF16),) * 2]
    grads += [(torch.randn(*key.shape, dtype=BF16),) + (torch.randn(*half, dtype=BF16),) * 2] * (
        cp - 1
    )
    received = [torch.randn(2 * queries, dtype=FP32) for _ in range(cp)]
    with Traffic() as b:
        _backward(cp, grads, received, query, key, value)
    fwd, bwd = merge_bytes(cp, float(queries), float(rows), False)
    assert (f.bytes, b.bytes) == (float(fwd), float(bwd))


GROUPED = 2  # kv heads of the compiled test (HEADS_C query heads)
HEADS_C, WIDTH_C = 8, 128
SIZES = {"torch.bfloat16": 2, "torch.float32": 4}


def _compiled_ring(cp, xq, xk, xv, gather):
    """The last rank's forward ring as torchtitan's compiled block runs it: K and V repeated
    to every head (repeat_kv), made contiguous, the cat handed to the all-gather (`gather`, an
    op Inductor cannot see into, as a collective), each step's SDPA, the merges."""
    b, s, _, d = xk.shape

    def repeat(x):
        x = x.unsqueeze(3).expand(b, s, GROUPED, HEADS_C // GROUPED, d)
        return x.reshape(b, s, HEADS_C, d).transpose(1, 2)

    q, key, value = xq.transpose(1, 2), repeat(xk).contiguous(), repeat(xv).contiguous()
    step = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    outs = [step(q, key, value, is_causal=True)[:2]]
    gathered = gather(torch.cat([key.flatten(), value.flatten()]), cp)
    for i in range(1, cp):
        if i < cp - 1:
            torch.cat([key.flatten(), value.flatten()])
        pair = gathered.chunk(cp)[cp - 1 - i]
        key = pair[: key.numel()].reshape(key.shape)
        value = pair[key.numel() :].reshape(value.shape)
        outs.append(step(q, key.chunk(2, dim=2)[0], value.chunk(2, dim=2)[0])[:2])
    out = lse = None
    for block_out, block_lse in outs:
        block_out, block_lse = block_out.to(FP32), block_lse.to(FP32).unsqueeze(-1)
        if out is None:
            out, lse = block_out, block_lse
        else:
            out = out - F.sigmoid(block_lse - lse) * (out - block_out)
            lse = lse - F.logsigmoid(lse - block_lse)
    return out.to(BF16), lse.squeeze(-1)


def _kernel_bytes(code: str) -> int:
    """Bytes of the buffers Inductor's generated C++ kernels take, but the first (the repeated
    K and V for step 0's SDPA: step.eager's repeat_kv, priced with the block); a buffer a
    kernel reuses in place (Inductor's `# reuse`) is read and written."""
    size = {}
    for name, dims, dtype in re.findall(
        r"(\w+) = empty_strided_cpu\(\(([\d, ]*)\), \([\d, ]*\), (torch\.\w+)\)", code
    ):
        size[name] = math.prod(int(x) for x in dims.split(",") if x.strip()) * SIZES[dtype]
    for name, dims in re.findall(r"assert_size_stride\((\w+), \(([\d, ]*)\)", code):
        dims = [int(x) for x in dims.split(",") if x.strip()]
        size[name] = math.prod(dims) * (4 if len(dims) == 3 else 2)  # SDPA's lse is fp32
    for name, base, dims in re.findall(r"(\w+) = reinterpret_tensor\((\w+), \(([\d, ]*)\)", code):
        whole = math.prod(int(x) for x in re.findall(r"\d+", dims))  # an alias: part of base
        size[name] = size[base] * whole // _elements(code, base)
    reused = dict(re.findall(r"(\w+) = (\w+); del \w+  # reuse", code))
    calls = re.findall(r"\n\s+cpp_fused\w*\(([^)]*)\)", code)
    total = 0
    for call in calls[1:]:
        for arg in (a.strip() for a in call.split(",")):
            total += size[reused.get(arg, arg)] * (2 if arg in reused else 1)
    return total


def _elements(code: str, name: str) -> int:
    """Elements of an allocated buffer of Inductor's code."""
    dims = re.search(rf"{name} = empty_strided_cpu\(\(([\d, ]*)\)", code).group(1)
    return math.prod(int(x) for x in re.findall(r"\d+", dims))


@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_the_compiled_forward_is_inductors_kernels(cp):
    """The compiled forward inventory against the kernels Inductor generates for the loop
    (on CPU, the same scheduler and fusion as on a GPU): within the row buffers Inductor keeps
    that the inventory leaves out (under 1%)."""
    from torch._inductor.utils import run_and_get_code

    @torch.library.custom_op("commsim_test::gather", mutates_args=())
    def gather(x: torch.Tensor, n: int) -> torch.Tensor:
        return x.repeat(n)

    @gather.register_fake
    def _(x, n):
        return x.new_empty(x.numel() * n)

    torch._dynamo.reset()
    xq = torch.randn(B, TOKENS, HEADS_C, WIDTH_C, dtype=BF16)
    xk, xv = (torch.randn(B, TOKENS, GROUPED, WIDTH_C, dtype=BF16) for _ in range(2))
    ring = torch.compile(lambda q, k, v: _compiled_ring(cp, q, k, v, gather))
    _, code = run_and_get_code(ring, xq, xk, xv)
    queries = B * TOKENS * HEADS_C * WIDTH_C
    fwd, _ = merge_bytes(cp, queries, queries / WIDTH_C, True, GROUPED / HEADS_C)
    assert _kernel_bytes(code[0]) == pytest.approx(float(fwd), rel=0.01)
