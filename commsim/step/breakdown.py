"""What memory per GPU comes to, by kind, and whether it fits a GPU: its HBM less a
user-set fragmentation reserve; the reason, in one line, when it does not."""

from __future__ import annotations

from dataclasses import dataclass

from commsim.specs import GPUSpec

# HBM left free for the caching allocator's fragmentation: a user-set fraction
# (Scenario.memory_reserve), 0 by default; no measured figure for Megatron-style runs exists in
# our sources (GMLake, ASPLOS'24: the default allocator wastes 15% more than GMLake on average,
# up to 33%, over eight fine-tuning setups on A100-80GB; STWeaver, arXiv:2507.16274: up to 43%)
MEMORY_RESERVE = 0.0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the worst pipeline stage, by kind."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float  # gradient buckets, ZeRO-3 gathered layers, CUDA/cuBLAS/NCCL workspace
    workspace: float = 0.0  # of buffers: the bytes outside the tensors (step.workspace)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    def fits(self, gpu: GPUSpec, reserve_fraction: float = MEMORY_RESERVE) -> bool:
        return self.total <= usable_bytes(gpu, reserve_fraction)

    def reason(self, gpu: GPUSpec, reserve_fraction: float = MEMORY_RESERVE) -> str:
        """Why it does not fit ("" when it does): the need, the room, the parts largest first."""
        if self.fits(gpu, reserve_fraction):
            return ""
        parts = {
            "params": self.params,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "buffers": self.buffers,
        }
        listed = ", ".join(
            f"{k} {v / 1e9:.1f} GB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
        )
        usable = usable_bytes(gpu, reserve_fraction)
        need, room = self.total / 1e9, usable / 1e9
        # as many decimals as tell the need from the room: never "needs 72.0 GB of 72.0 GB"
        d = next((d for d in (1, 2, 3) if f"{need:.{d}f}" != f"{room:.{d}f}"), 6)
        less = f"less {reserve_fraction:.0%} reserve" if reserve_fraction else "no reserve"
        return (
            f"needs {need:.{d}f} GB of {room:.{d}f} GB usable on {gpu.name} "
            f"({gpu.hbm_bytes / 1e9:.0f} GB, {less}): {listed}"
        )


def usable_bytes(gpu: GPUSpec, reserve_fraction: float = MEMORY_RESERVE) -> float:
    """HBM a training process may fill: capacity less the user-set fragmentation reserve."""
    return gpu.hbm_bytes * (1.0 - reserve_fraction)
