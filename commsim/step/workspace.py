"""Device memory a training process holds outside its tensors: the CUDA context, cuBLAS
workspaces and NCCL's communication buffers, per layout; counted from the code of each
library, one term each (step.memory adds their sum to the buffers).

Each communicator is a group kind the layout runs ring collectives on (tensor, context, data
with context), or point-to-point connections (the pipeline's sends, the expert all-to-all).
NCCL connects a ring's channels at first use, one receive connection per channel (from the
previous rank); its trees, NVLS (NVLink SHARP) and CollNet buffers are not counted
(Megatron-Bridge's performance launcher sets NCCL_NVLS_ENABLE=0 "to save memory",
scripts/performance/utils/executors.py), nor the world group's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from commsim.collectives import nccl
from commsim.step.groups import Groups, group_rows

if TYPE_CHECKING:
    from commsim.specs import GPUSpec
    from commsim.step.layouts import Layouts

MIB = 2**20
# The CUDA context once the first CUDA call creates it, with lazy module loading (CUDA 11.7+,
# the default on Linux since 12.2): "around 400MB" (ptrblck, pytorch/pytorch#109888, 2023;
# nvidia-smi's MiB). Before lazy loading every library's kernels were loaded: over 1000 MB
# (pytorch/pytorch#107667). No per-generation measurement found; kernels a run loads lazily
# later (cuDNN, Transformer Engine, NCCL) add to it, unmeasured.
CONTEXT_BYTES = 400 * MIB
# PyTorch's cuBLAS workspace, one per (handle, stream) and shared with cuBLASLt
# (aten/src/ATen/cuda/CublasHandlePool.cpp, setWorkspaceForHandle; TORCH_CUBLASLT_UNIFIED_
# WORKSPACE on by default): CUBLAS_WORKSPACE_CONFIG's default :4096:2:16:8, 2 x 4 MiB +
# 8 x 16 KiB, and 32 MiB on compute capability 9.0 (Hopper)
TORCH_BLAS_BYTES = 2 * 4096 * 1024 + 8 * 16 * 1024
TORCH_BLAS_BYTES_SM90 = 32 * MIB
# handles are per thread: the forward runs on the Python thread, the backward on autograd's
# device thread, both on the compute stream
TORCH_BLAS_HANDLES = 2
# Transformer Engine's own cuBLASLt workspace (pytorch/module/base.py, get_workspace): 32 MiB
# on compute capability 9 and later, 4 MiB before; repeated for its userbuffers streams
# (_NUM_MAX_UB_STREAMS = 3, initialize_ub) when tensor-parallel communication overlaps GEMMs
TE_BYTES, TE_BYTES_SM90, TE_UB_STREAMS = 4 * MIB, 32 * MIB, 3
# NCCL's buffers per connection and protocol (src/init.cc, DEFAULT_*_BUFFSIZE): LL 8 lines x
# 512 threads x 8 steps x 16 B; LL128 120 elements x 640 threads x 8 steps x 8 B; Simple
# NCCL_BUFFSIZE, 4 MiB. computeBuffSizes sets all three whatever the tuner enables and the P2P
# transport's receive setup allocates their sum (transport/p2p.cc, p2pRecvSetup); across the
# network the LL buffer sits in host memory (net.cc), not told apart here (0.5 of 9.2 MiB)
NCCL_LL = 8 * 512 * 8 * 16
NCCL_LL128 = 120 * 640 * 8 * 8
NCCL_SIMPLE = 4 * MIB
# Userbuffers (tp_overlap): one registered buffer per overlapped GEMM of a block, each of
# Megatron's input_shape, (seq_length x micro_batch / cp) x hidden (megatron/training/
# initialize.py, _initialize_tp_communicators; TE initialize_ub, add_ub; comm_gemm_overlap.cpp
# allocates it outside PyTorch's allocator): the 6 all-gather ones (qkv_fprop, fc1_fprop,
# proj_dgrad, fc2_dgrad, qkv_dgrad, fc1_dgrad) in FP8 (1 byte) under an FP8 recipe (fp8_buf),
# else bf16; the 4 reduce-scatter ones (proj_fprop, fc2_fprop, qkv_wgrad, fc1_wgrad) in bf16.
# the two "external" wgrad buffers of TE 2.8 on are not counted (a lower bound)
UB_GATHER_BUFFERS, UB_SCATTER_BUFFERS = 6, 4
# point-to-point connections (the pipeline's sends; all-to-all, which NCCL runs as sends
# and receives to every peer): a Simple buffer per peer and channel, one channel a peer
# (NCCL_MIN_P2P_NCHANNELS = 1; NCCL may run more, so a lower bound)


def blas_bytes(gpu: GPUSpec, te: np.ndarray, tp_overlap: np.ndarray) -> np.ndarray:
    """cuBLAS workspaces: PyTorch's per handle, and Transformer Engine's where it runs
    (FP8 layouts, or tensor-parallel overlap), times its userbuffers streams with overlap."""
    cc = gpu.compute_capability or 0.0
    torch = TORCH_BLAS_HANDLES * (TORCH_BLAS_BYTES_SM90 if cc == 9.0 else TORCH_BLAS_BYTES)
    te_one = TE_BYTES_SM90 if cc >= 9.0 else TE_BYTES
    te_streams = np.where(tp_overlap, TE_UB_STREAMS, 1)
    return torch + np.where(te | tp_overlap, te_one * te_streams, 0)


def userbuffers_bytes(L: Layouts, elements) -> np.ndarray:
    """Transformer Engine's userbuffers of each tp_overlap layout, `elements` the values of
    one (a micro-batch's tokens on a context-parallel rank x hidden); 0 without overlap."""
    gather = np.where(L.fp8, 1, 2)
    per_element = UB_GATHER_BUFFERS * gather + UB_SCATTER_BUFFERS * 2
    return np.where(L.tp_overlap, per_element * np.asarray(elements, dtype=float), 0.0)


def ring_bytes(channels: int) -> int:
    """One communicator's ring buffers: a receive connection per channel, every protocol."""
    return channels * (NCCL_LL + NCCL_LL128 + NCCL_SIMPLE)


def _communicator(groups: Groups, key: tuple) -> int:
    """Ring buffer bytes of one communicator (Groups.members' `key`; 0 for groups of one
    rank): its channels from NCCL's model of the group (ranks, nodes, GPUs a node)."""
    gpus = groups.members(*key)[0]
    if gpus.size < 2:
        return 0
    _, per_node = np.unique(groups.cluster.node_of(gpus), return_counts=True)
    comm = nccl.comm_model(groups.cluster.spec, gpus.size, per_node.size, int(per_node.max()))
    return ring_bytes(comm.graphs.comm_channels)


def nccl_bytes(groups: Groups, L: Layouts, cache: dict | None = None) -> np.ndarray:
    """NCCL buffers of each layout's communicators: tp, cp and dp (with cp) rings, and the
    point-to-point connections of the pipeline (previous and next stage) and of the expert
    all-to-all (ep - 1 peers); 0 under gloo. `cache` keeps each distinct set of groups'
    bytes between calls."""
    if groups.cluster.spec.comm_backend != "nccl":
        return np.zeros(len(L))
    cache = {} if cache is None else cache
    cols = [L.placement, L.tp, L.dp, L.pp, L.ep, L.cp, L.order, L.expert_tp]
    inverse, firsts = group_rows(cols)
    total = np.zeros(len(firsts))
    for i, row in enumerate(firsts.tolist()):
        placement, tp, dp, pp, ep, cp, order, etp = (int(c[row]) for c in cols)
        key = (placement, tp, dp, pp, ep, cp, order, etp)
        if key not in cache:
            rings = sum(  # Groups.members' arguments
                _communicator(groups, (placement, kind, tp, dp, pp, ep, cp, 1, order, etp))
                for kind in ("tp", "cp", "dp")
            )
            peers = (2 if pp > 1 else 0) + (ep - 1)
            cache[key] = rings + peers * NCCL_SIMPLE
        total[i] = cache[key]
    return total[inverse]


def workspace_bytes(
    gpu: GPUSpec, groups: Groups, L: Layouts, cache: dict | None = None, ub_elements=0.0
) -> np.ndarray:
    """Bytes each layout holds outside the caching allocator's tensors: the CUDA context,
    the cuBLAS workspaces, NCCL's buffers (`cache`: nccl_bytes') and with tp_overlap the
    userbuffers (`ub_elements` values each: userbuffers_bytes); none on CPU hosts."""
    if groups.cluster.spec.on_cpu:
        return np.zeros(len(L))
    ub = userbuffers_bytes(L, ub_elements)
    return CONTEXT_BYTES + blas_bytes(gpu, L.fp8, L.tp_overlap) + nccl_bytes(groups, L, cache) + ub
