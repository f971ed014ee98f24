"""HBM bytes, and so seconds, of the optimizer step per stack (Strategy.kernels): Megatron-core's
mixed-precision optimizer with Apex's FusedAdam, torch.optim.AdamW's foreach path (torchtitan)
and Composer's DecoupledAdamW (llm-foundry), each counted kernel by kernel from the code."""

from __future__ import annotations

import numpy as np

from commsim.specs import GPUSpec
from commsim.step.eager import KERNELS

# Every stack first takes the gradient norm (reads the fp32 gradient: 4) and clips (scales it
# by a clamped tensor coefficient every step, read and write: 8): Megatron-core's
# multi_tensor_l2norm and clip_grad_by_total_norm_fp32 (megatron/core/optimizer/clip_grads.py
# at 0293807), torchtitan's clip_grad_norm_ (foreach norm, _foreach_mul_; utils.py at 9dec370),
# Composer's GradientClipping under FSDP1 (torch 2.1 FullyShardedDataParallel.clip_grad_norm_:
# vector_norm a tensor, then grad.mul_).
CLIP_HBM_BYTES = 4 + 8
# Megatron-core's MixedPrecisionOptimizer.step and DistributedOptimizer
# (megatron/core/optimizer/optimizer.py at 0011998): after the update, the copy back to the
# 16-bit parameters (_copy_main_params_to_model_params: read 4, write 2); then the next step's
# zeroing of the gradient buffer (param_and_grad_buffer's grad_data.zero_(): the gradient's
# bytes). A 16-bit gradient buffer adds its cast to fp32 main gradients
# (_copy_model_grads_to_main_grads, main_grad.float(): read 2, write 4); an fp32 one is used
# as it is. The torch stacks have neither: FSDP casts the fp32 shard to bf16 when it gathers
# it, and zero_grad sets the gradients to None (set_to_none, the default since torch 2.0).
COPY_BACK = 4 + 2
MAIN_GRAD_CAST = 2 + 4

# The update, its kernels as (tensors read, tensors written), an element each: g the fp32
# gradient, p the fp32 parameter, m and v the moments, t a temporary of v's width. The two
# eager AdamWs end alike: v * beta2, addcmul(g, g) (g read once: one tensor), sqrt, / the
# bias correction, + eps, then p's addcdiv by m and that denominator.
EAGER_TAIL = (
    (("v",), ("v",)),
    (("v", "g"), ("v",)),
    (("v",), ("t",)),
    (("t",), ("t",)),
    (("t",), ("t",)),
    (("p", "m", "t"), ("p",)),
)
ADAM_UPDATE = {
    # Apex FusedAdam (csrc/multi_tensor_adam.cu): one kernel reads g, p, m, v and writes p, m, v
    "megatron": ((("g", "p", "m", "v"), ("p", "m", "v")),),
    # torch.optim.AdamW(foreach=True, fused=False): torchtitan's build_optimizers at 9dec370
    # passes fused = job.optimizer.fused (default False) and foreach = not fused, weight decay
    # 0.1; torch/optim/adamw.py _multi_tensor_adamw (torch 2.6, not capturable): p's decay, the
    # lerp of m towards g, then the tail
    "torchtitan": ((("p",), ("p",)), (("m", "g"), ("m",)), *EAGER_TAIL),
    # Composer's DecoupledAdamW.adamw (composer/optim/decoupled_weight_decay.py at 2deccf2c8),
    # eager, one tensor at a time: m.mul_(beta1).add_(g), then the tail; its param.mul_ decay
    # is skipped, as llm-foundry's MPT yamls set weight_decay 0.0 (scripts/train/yamls/pretrain
    # at 5e85bd62d)
    "llm-foundry": ((("m",), ("m",)), (("m", "g"), ("m",)), *EAGER_TAIL),
}
ADAM_UPDATE["torchtitan-compile"] = ADAM_UPDATE["torchtitan"]  # the optimizer is not compiled


def update_bytes(stack: str, moment_bytes=4.0):
    """HBM bytes a parameter of `stack`'s Adam update with moments `moment_bytes` wide (g and
    p are fp32; m, v and t are moment-wide)."""
    names = [x for read, written in ADAM_UPDATE[stack] for x in read + written]
    fp32 = sum(x in ("g", "p") for x in names)
    return 4.0 * fp32 + (len(names) - fp32) * np.asarray(moment_bytes, dtype=float)


def adam_step_time(params, gpu: GPUSpec, grad_bytes=4, moment_bytes=4, kernels=0):
    """Seconds of a memory-bound mixed-precision Adam step over `params` parameters whose
    gradients are `grad_bytes` wide and moments `moment_bytes`, as the stack `kernels` (codes
    into KERNELS) runs it: the clip, the update, and for Megatron-core the copy back, the
    buffer's zeroing and a 16-bit buffer's cast, at the HBM bandwidth streaming kernels reach."""
    grad_bytes = np.asarray(grad_bytes, dtype=float)
    moment_bytes = np.asarray(moment_bytes, dtype=float)
    kernels = np.asarray(kernels)
    update = np.select(
        [kernels == i for i in range(len(KERNELS))],
        [update_bytes(name, moment_bytes) for name in KERNELS],
    )
    cast = np.where(grad_bytes < 4, MAIN_GRAD_CAST, 0.0)
    megatron = np.where(kernels == KERNELS.index("megatron"), COPY_BACK + grad_bytes + cast, 0.0)
    per_param = CLIP_HBM_BYTES + update + megatron
    return params * per_param / gpu.stream_bandwidth
