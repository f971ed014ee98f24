"""The harness's clock of exposed communication (calibrate.harness.commclock): what it
brackets. A hook registered on a gradient's AccumulateGrad node before the clock's (as DDP
registers its reducer hook when it wraps the model) is inside the bracket; the forward and
the backward's compute are outside. Sleeps make the bounds certain: no timed assertion."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from commsim.calibrate.harness.commclock import CommClock  # noqa: E402

LAUNCH_S = 0.02  # a stand-in for DDP's bucket copy and launch, in its hook
FORWARD_S = 0.05  # compute the clock must not count


@pytest.mark.torch
def test_clock_brackets_the_reducer_hook_and_not_compute():
    model = torch.nn.Linear(8, 8)
    node = model.weight.view_as(model.weight).grad_fn.next_functions[0][0]
    node.register_hook(lambda *_: time.sleep(LAUNCH_S))
    model.register_forward_pre_hook(lambda *_: time.sleep(FORWARD_S))
    clock = CommClock(model)
    x = torch.ones(4, 8)
    for _ in range(2):
        clock.start()
        t0 = time.perf_counter()
        model(x).sum().backward()
        t1 = time.perf_counter()
        clock.returned(t1)
        assert LAUNCH_S <= clock.exposed_s() <= t1 - t0 - FORWARD_S
    clock.remove()
    clock.start()
    model(x).sum().backward()
    with pytest.raises(RuntimeError, match="no gradient"):
        clock.exposed_s()  # hooks removed: nothing marked
