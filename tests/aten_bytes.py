"""Bytes the ATen ops of a function read and write, as PyTorch's dispatcher sees them: the
independent count the HBM inventories (optimizer, FSDP1's cast) are checked against."""

from __future__ import annotations


def aten_bytes(step) -> float:
    """Bytes the ATen ops run by step() read and write, as the dispatcher sees them: each op's
    distinct input tensors once (an out= tensor is not read), plus the tensors it mutates or
    returns (scalars left out)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def sized(tensors):
        big = (t for t in tensors if isinstance(t, torch.Tensor) and t.numel() > 1)
        return {t.data_ptr(): t.numel() * t.element_size() for t in big}

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            named = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | kwargs
            mutated = [
                named.get(a.name)
                for a in func._schema.arguments
                if a.alias_info is not None and a.alias_info.is_write
            ]
            out = func(*args, **kwargs)
            written = sized(tree_leaves(mutated)) | sized(tree_leaves(out))
            # an out= argument (keyword-only, written) is written, not read
            outs = [a.name for a in func._schema.arguments if a.kwarg_only and a.alias_info]
            read = [v for k, v in named.items() if k not in outs]
            Count.total += sum(sized(tree_leaves(read)).values())
            Count.total += sum(written.values())
            return out

    with Count():
        step()
    return Count.total
