"""Stopping `calibrate run --local N` (SIGTERM or Ctrl-C to its launcher) ends every rank at
once and closes the run with an `interrupted` end record; what was measured stays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
from test_calibrate_harness import _kill_quietly, _wait_for  # noqa: E402

from commsim.calibrate.records import read_results  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_ends_its_ranks_and_the_run(tmp_path, sig):
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "commsim.cli.calibrate", "run", "--out", str(out)]
    cmd += ["--local", "2", "--sizes", "8B:8KiB", "--ops", "all-reduce,broadcast"]
    cmd += ["--repeats", "400", "--warmup", "1", "--bucket-mb", "", "--timeout", "30"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        records = _wait_for(out, 2, time.monotonic() + 60)
        pids = [r["pid"] for r in records[0]["ranks"]]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        gone_by = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < gone_by:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "a rank outlived its launcher"
    finally:
        for pid in pids:
            _kill_quietly(pid)
        proc.kill()
    assert proc.returncode == 128 + sig
    assert f"interrupted by {signal.Signals(sig).name}" in err and "Traceback" not in err
    size = out.stat().st_size
    time.sleep(1.0)
    assert out.stat().st_size == size  # nothing appends any more
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[: len(records)] == records  # what was measured before is intact
    run = next(iter(read_results(out).runs.values()))
    assert run.end is not None and run.end.status == "interrupted"
    assert len(run.collectives) >= 2
