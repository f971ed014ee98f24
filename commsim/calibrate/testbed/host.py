"""What this Linux host must offer (root, iproute2's ip and tc), the commands run on it,
the namespaces a testbed owns (found by name), and the state files under STATE_DIR."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from commsim.calibrate.testbed.spec import TestbedSpec
from commsim.specs import SpecError

STATE_DIR = Path("/run/commsim-testbed")
ETC_NETNS = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*

NS_RE = re.compile(r"^([a-z][a-z0-9]*)-(sw|r\d+h\d+)$")


class TestbedError(SpecError):
    """The host cannot run the testbed (not root, no iproute2, not up, a command failed)."""

    __test__ = False  # not a pytest class

    def __init__(self, message: str):
        super().__init__("commsim testbed", "", message)
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]


def require_root() -> None:
    """Refuse clearly unless this is root with iproute2's `ip` and `tc` on PATH."""
    if os.geteuid() != 0:
        raise TestbedError(
            "commsim testbed needs root: it creates network namespaces, veth links and tc "
            f"qdiscs; this process runs as uid {os.geteuid()} (try sudo)"
        )
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise TestbedError(
            f"commsim testbed needs iproute2: {' and '.join(missing)} not found on PATH"
        )


def sh(*cmd: str) -> str:
    """Run one iproute2 command; a failure is a TestbedError quoting it and its stderr."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit code {done.returncode}"
        raise TestbedError(f"`{' '.join(cmd)}` failed: {why}")
    return done.stdout


def namespaces() -> list[str]:
    """Names of all network namespaces (`ip netns list` prints 'name (id: N)')."""
    if shutil.which("ip") is None:
        raise TestbedError("commsim testbed needs iproute2: ip not found on PATH")
    return [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]


def owned_namespaces(prefix: str) -> list[str]:
    """Namespaces a testbed with this prefix makes, found by name (no state file needed)."""
    return [ns for ns in namespaces() if (m := NS_RE.match(ns)) and m.group(1) == prefix]


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One up or down at a time on this host (each takes well under a second)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def state_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


def require_up(spec: TestbedSpec) -> None:
    """Refuse unless this testbed is up, complete, and built from the same description."""
    path = state_path(spec.prefix)
    if not path.exists():
        raise TestbedError(
            f"testbed {spec.prefix!r} is not up: run `commsim testbed up` with this file first"
        )
    state = json.loads(path.read_text())
    if state["spec"] != spec.model_dump():
        raise TestbedError(
            f"testbed {spec.prefix!r} is up with a different description "
            f"({state['spec']['name']!r}): run `commsim testbed up` with this file again"
        )
    missing = set(state["namespaces"]) - set(owned_namespaces(spec.prefix))
    if missing:
        raise TestbedError(
            f"testbed {spec.prefix!r} is broken (missing {', '.join(sorted(missing))}): "
            "run `commsim testbed up` again"
        )
