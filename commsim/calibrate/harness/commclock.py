"""The harness's own clock of a DDP step's exposed communication: the time the rank's main
thread spends on DDP's communication instead of computing, read in the step itself (not
from a separate no_sync step, whose compute runs without the peers' gloo threads and
packet forwarding sharing the cores).

Marks, by hooks (perf_counter):
- each parameter's gradient produced: its post-accumulate-grad hook, which AccumulateGrad
  runs before the node's post hooks, so before DDP's reducer hook;
- DDP done with that gradient: a post hook on the same AccumulateGrad node, registered
  after DDP's (hooks run in order), so after the reducer copied it into its bucket and,
  for a bucket's last gradient, launched the bucket's all-reduce;
- backward's return, read by the step (ddp._ddp_step): DDP's final callback has waited for
  every all-reduce and copied the buckets back.

exposed = sum over gradients of (DDP done - produced) + (backward's return - last DDP
done): the bucket copies and launches, then the wait (and the copies back) after the
backward's compute ends. commsim.traces.summary's exposed communication is the same
quantity read from the profiler (the main thread's launch calls, DDP's bucket copies, its
waits); the clocks differ by the hooks' own cost (0.15-0.3 ms a step, what this clock reads
in no_sync steps) and where a preemption lands at a bracket's edge (RESULTS.md). Meaningful
where the host thread computes (CPU, gloo): on CUDA it would time kernel launches.
"""

from __future__ import annotations

import time

from torch import nn


class CommClock:
    """Hooks on `ddp`'s parameters; `start()` before a step, `returned(t)` when its backward
    has returned, `exposed_s()` after."""

    def __init__(self, ddp: nn.Module) -> None:
        self.handles = []
        for p in ddp.parameters():
            if not p.requires_grad:
                continue
            self.handles.append(p.register_post_accumulate_grad_hook(self._produced))
            node = p.view_as(p).grad_fn.next_functions[0][0]  # p's AccumulateGrad (DDP's too)
            self.handles.append(node.register_hook(self._handled))
        self.start()

    def _produced(self, _param) -> None:
        self.produced = time.perf_counter()

    def _handled(self, *_) -> None:
        now = time.perf_counter()
        self.launching += now - self.produced
        self.handled = now

    def start(self) -> None:
        self.launching, self.produced, self.handled, self.end = 0.0, 0.0, None, None

    def returned(self, t: float) -> None:
        self.end = t

    def exposed_s(self) -> float:
        if self.handled is None or self.end is None:
            raise RuntimeError("the step produced no gradient or its backward did not return")
        return self.launching + self.end - self.handled

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
