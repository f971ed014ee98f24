"""The DDP step: a small MLP (pre-norm blocks: LayerNorm, Linear 4x, GELU, Linear) trained
for several bucket caps: compute alone (no_sync: no communication) and the full step with
DDP's all-reduces overlapping the backward, once per comm hook (`comm_hooks`: PyTorch's own
fp16/bf16 compress and PowerSGD hooks; each `ddp` record names its hook), the hooks' steps
interleaved so that a shared host's load falls on all of them alike. Its layers
(parameter tensors, FLOPs, and forward/backward seconds measured by module hooks) are
recorded so commsim can rebuild it as a Workload.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from commsim.calibrate.harness.commclock import CommClock
from commsim.calibrate.harness.config import HarnessConfig
from commsim.calibrate.harness.profiled import profile_steps
from commsim.calibrate.harness.rank import Run, max_over_ranks
from commsim.step.buckets import ddp_first_bucket_bytes

MIB = 2**20
POWERSGD_START_ITER = 2  # vanilla all-reduce steps before PowerSGD (torch's minimum: 2)


def build_model(width: int, depth: int) -> nn.Sequential:
    """The DDP workload: input projection, `depth` pre-norm MLP blocks (LayerNorm, Linear
    to 4x, GELU, Linear back), a final LayerNorm and a head; one flat Sequential, so
    autograd runs its modules strictly in reverse."""
    mods: list[nn.Module] = [nn.Linear(width, width)]
    for _ in range(depth):
        mods += [nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU()]
        mods += [nn.Linear(4 * width, width)]
    mods += [nn.LayerNorm(width), nn.Linear(width, width)]
    return nn.Sequential(*mods)


def _batch(cfg: HarnessConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(cfg.batch, cfg.width, generator=g).to(device)
    y = torch.randint(0, cfg.width, (cfg.batch,), generator=g).to(device)
    return x, y


def _layer_times(model: nn.Sequential, run: Run, repeats: int) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of each module, by hooks: module i's forward runs from
    its forward pre-hook to module i+1's (the last to the end of the loss), its backward
    from its backward pre-hook to module i-1's (module 0 to the end of backward; the last
    also takes the loss's backward). Medians over repeats, slowest rank."""
    x, y = _batch(run.cfg, run.device)
    mods = list(model)
    stamps: dict[tuple[str, int], float] = {}

    def stamp(key: tuple[str, int]) -> None:
        run.sync()
        stamps[key] = time.perf_counter()

    handles = []
    for i, m in enumerate(mods):
        handles.append(m.register_forward_pre_hook(lambda *_, i=i: stamp(("f", i))))
        handles.append(m.register_full_backward_pre_hook(lambda *_, i=i: stamp(("b", i))))
    fwd, bwd = [], []
    last = len(mods) - 1
    for _ in range(repeats + 1):  # the first warms up
        model.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x), y)
        stamp(("f", last + 1))
        stamp(("b", last + 1))
        with warnings.catch_warnings():  # module 0's input needs no gradient: expected
            warnings.filterwarnings("ignore", "Full backward hook", UserWarning)
            loss.backward()
        stamp(("b", -1))
        fwd.append([stamps["f", i + 1] - stamps["f", i] for i in range(last + 1)])
        bwd.append([stamps["b", i - 1] - stamps["b", i] for i in range(last + 1)])
        bwd[-1][last] += stamps["b", last] - stamps["b", last + 1]
        run.progress.tick()
    for h in handles:
        h.remove()
    f = max_over_ranks(np.median(np.array(fwd[1:]), axis=0), run, None)
    b = max_over_ranks(np.median(np.array(bwd[1:]), axis=0), run, None)
    return f, b


def _model_record(model: nn.Sequential, fwd: np.ndarray, bwd: np.ndarray, cfg: HarnessConfig):
    """Layers as commsim sees them: each module with parameters, with the parameter-free
    modules after it (GELU) folded in; forward FLOPs per sample: 2 x in x out per Linear
    (element-wise work is not counted, as in commsim.workload)."""
    layers: list[dict[str, Any]] = []
    for i, m in enumerate(model):
        tensors = [p.numel() for p in m.parameters()]
        flops = 2.0 * m.in_features * m.out_features if isinstance(m, nn.Linear) else 0.0
        if tensors or not layers:
            layers.append(
                {
                    "name": f"{i}.{type(m).__name__}",
                    "tensors": tensors,
                    "shapes": [list(p.shape) for p in m.parameters()],
                    "forward_flops": flops,
                    "forward_s": 0.0,
                    "backward_s": 0.0,
                }
            )
        layer = layers[-1]
        layer["forward_s"] += float(fwd[i])
        layer["backward_s"] += float(bwd[i])
    return {
        "kind": "model",
        "name": f"mlp-w{cfg.width}-d{cfg.depth}",
        "batch": cfg.batch,
        "dtype": "float32",
        "layers": layers,
    }


def _ddp_step(run: Run, ddp, opt, x, y, *, sync: bool, scope=contextlib.nullcontext, clock=None):
    """One training step after a world barrier: (whole step, optimizer) seconds. Without
    sync, under no_sync: DDP launches no all-reduce, so this is compute alone. `scope()`
    is entered around the timed part (a profiler's step annotation); a `clock`
    (commclock.CommClock) is told when the backward returned."""
    opt.zero_grad(set_to_none=False)
    dist.barrier()
    run.progress.tick()
    with scope():
        t0 = time.perf_counter()
        if sync:
            nn.functional.cross_entropy(ddp(x), y).backward()
        else:
            with ddp.no_sync():
                nn.functional.cross_entropy(ddp(x), y).backward()
        run.sync()
        t1 = time.perf_counter()
        if clock is not None:
            clock.returned(t1)
        opt.step()
        run.sync()
        t2 = time.perf_counter()
    return t2 - t0, t2 - t1


def _one_bucket_at_a_time(hook):
    """`hook`, waited for before the next bucket's starts (no overlap with the backward)."""

    def blocking(state, bucket):
        done = torch.futures.Future()
        done.set_result(hook(state, bucket).wait())
        return done

    return blocking


def _register_hook(ddp, name: str, backend: str) -> tuple[int, bool]:
    """Register PyTorch's own comm hook `name` on `ddp`: the extra warm-up steps it needs
    (PowerSGD all-reduces uncompressed until start_powerSGD_iter), and whether it overlaps.

    PowerSGD launches its later all-reduces from future callbacks; on gloo those of several
    buckets in flight interleave differently on each rank and deadlock, so there it runs
    one bucket at a time."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name in ("fp16", "bf16"):
        ddp.register_comm_hook(None, getattr(default_hooks, f"{name}_compress_hook"))
        return 0, True
    if name.startswith("powersgd:"):
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(name.partition(":")[2]),
            start_powerSGD_iter=POWERSGD_START_ITER,
        )  # error feedback and warm start on, as by default
        hook = powerSGD_hook.powerSGD_hook
        overlap = backend != "gloo"
        ddp.register_comm_hook(state, hook if overlap else _one_bucket_at_a_time(hook))
        return POWERSGD_START_ITER, overlap
    return 0, True


@dataclass
class _Setup:
    """One (bucket cap, comm hook): its DDP model and optimizer, whether the hook overlaps,
    the warm-up steps it needs, its clock of exposed communication (CPU only), and the
    seconds measured: compute alone, the optimizer, the full step, exposed communication."""

    cap: float
    hook: str
    batch: tuple
    extra: int
    overlap: bool
    clock: CommClock | None
    compute: list[float] = field(default_factory=list)
    optimizer: list[float] = field(default_factory=list)
    step: list[float] = field(default_factory=list)
    exposed: list[float] = field(default_factory=list)


def _setup(run: Run, cap: float, hook: str, x, y) -> _Setup:
    """A fresh model (same seed for every setup) under DDP with `hook`, warmed up."""
    torch.manual_seed(0)
    model = build_model(run.cfg.width, run.cfg.depth).to(run.device)
    ids = [run.device.index] if run.device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cap)
    extra, overlap = _register_hook(ddp, hook, run.backend)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    batch = (ddp, opt, x, y)
    for _ in range(3 + extra):  # DDP rebuilds its buckets in gradient order after step one
        _ddp_step(run, *batch, sync=True)
    clock = CommClock(ddp) if run.device.type == "cpu" else None
    return _Setup(cap, hook, batch, extra, overlap, clock)


def _timed(run: Run, setups: list[_Setup]) -> None:
    """`ddp_repeats` rounds; in each, every setup's no_sync step and full step, the setups
    in an order rotated by one each round (ABC, BCA, CAB...): a spell of load on a shared
    host falls on every configuration alike instead of on the one measured then."""
    for k in range(run.cfg.ddp_repeats):
        for s in setups[k % len(setups) :] + setups[: k % len(setups)]:
            total, optimizer = _ddp_step(run, *s.batch, sync=False)
            s.compute.append(total)
            s.optimizer.append(optimizer)
            if s.clock is not None:
                s.clock.start()
            s.step.append(_ddp_step(run, *s.batch, sync=True, clock=s.clock)[0])
            if s.clock is not None:
                s.exposed.append(s.clock.exposed_s())


def measure_ddp(run: Run) -> None:
    """Per bucket cap, every comm hook's steps measured interleaved (_timed); SGD."""
    cfg = run.cfg
    torch.manual_seed(0)
    plain = build_model(cfg.width, cfg.depth).to(run.device)
    run.progress.tick("profiling the DDP model's layers")
    fwd, bwd = _layer_times(plain, run, max(3, cfg.ddp_repeats // 2))
    run.emit(_model_record(plain, fwd, bwd, cfg))
    x, y = _batch(cfg, run.device)
    for cap in cfg.bucket_mb:
        run.progress.tick(
            f"DDP steps with {cap:g} MiB buckets, comm hooks {', '.join(cfg.comm_hooks)}"
        )
        setups = [_setup(run, cap, hook, x, y) for hook in cfg.comm_hooks]
        _timed(run, setups)
        for s in setups:
            if s.clock is not None:
                s.clock.remove()
            if cfg.profile_dir:
                profile_steps(run, s.batch, _ddp_step, f"bucket{cap:g}mb-{s.hook.replace(':', '')}")
            run.emit(_ddp_record(run, s))


def _ddp_record(run: Run, s: _Setup) -> dict[str, Any]:
    """The `ddp` record of one setup: medians and p10/p90 over repeats of the slowest rank.
    Exposed communication is the commclock's (the profiled steps' and the trace summary's
    quantity) where the host computes; on CUDA, where it would time kernel launches, the
    full step less compute alone."""
    c = max_over_ranks(s.compute, run, None)
    o = max_over_ranks(s.optimizer, run, None)
    t = max_over_ranks(s.step, run, None)
    if s.clock is not None:
        exposed, by = float(np.median(max_over_ranks(s.exposed, run, None))), "commclock"
    else:
        exposed, by = float(np.median(t) - np.median(c)), "step-minus-compute"
    ddp = s.batch[0]
    return {
        "kind": "ddp",
        "bucket_mb": s.cap,
        "compression": s.hook,  # absent in older files: none
        "error_feedback": s.hook.startswith("powersgd:"),
        "overlap": s.overlap,
        "first_bucket_mb": _first_bucket_bytes(ddp, s.cap) / MIB,
        "compute_s": float(np.median(c)),
        "compute_p10_s": float(np.percentile(c, 10)),
        "compute_p90_s": float(np.percentile(c, 90)),
        "optimizer_s": float(np.median(o)),
        "step_s": float(np.median(t)),
        "step_p10_s": float(np.percentile(t, 10)),
        "step_p90_s": float(np.percentile(t, 90)),
        "exposed_comm_s": exposed,
        "exposed_by": by,
        "repeats": run.cfg.ddp_repeats,
    } | _bucket_layout(ddp)


def _first_bucket_bytes(ddp, cap_mb: float) -> float:
    """The first bucket's limit this torch's DDP uses: its own setting where it keeps one
    (_bucket_config, in recent torch), else the rule for its version (commsim.step.buckets)."""
    config = getattr(ddp, "_bucket_config", None)
    if config is not None:
        return float(config.first_bucket_bytes_cap)
    return ddp_first_bucket_bytes(cap_mb * MIB, True, torch.__version__)


def _bucket_layout(ddp) -> dict[str, Any]:
    """The buckets DDP rebuilt after its first step, as its logger reports them: their
    bytes and their parameters (indices in registration order), in launch order."""
    logged = ddp._get_ddp_logging_data()
    sizes = [int(v) for v in str(logged.get("rebuilt_bucket_sizes", "")).split(",") if v.strip()]
    params = [
        [int(i) for i in bucket.split()]
        for bucket in str(logged.get("rebuilt_per_bucket_param_indices", "")).split(",")
        if bucket.strip()
    ]
    return {"buckets_bytes": sizes or None, "buckets_params": params or None}
