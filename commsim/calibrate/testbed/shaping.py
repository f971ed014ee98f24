"""htb on one end of a link: its rate, shared fairly between source hosts, lossless."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from commsim.calibrate.testbed.host import TestbedError
from commsim.calibrate.testbed.spec import Host

GSO_BYTES = 16384  # largest packet the veths hand on: smaller costs CPU, larger costs precision
TCP_RMEM_MAX = 4194304  # receive buffer cap in every host: bounds each stream's bytes in flight


def shape(ns: str, dev: str, rate: float, sources: Sequence[Host], streams: int) -> dict[str, Any]:
    """Shape one device's egress to `rate` with htb; returns the record for the state file.

    Packets under 128 bytes (TCP ACKs, ARP, tiny messages) go first, so a bulk stream does
    not starve the opposite direction's ACKs; the rest is shared fairly between source
    hosts, each in its own FIFO, deep enough for the receive windows of `streams` TCP
    streams: the fabric is lossless, like InfiniBand or RoCE with PFC (a drop-tail FIFO
    splits bandwidth unevenly between TCP streams, and fair queues are not available here).
    Buckets hold 1 ms, and at least 1.5 GSO packets so htb never waits on a partial one."""
    burst = max(GSO_BYTES * 3 // 2, int(rate * 1e-3))
    queue_bytes = TCP_RMEM_MAX * streams

    def bits(r: float) -> str:
        return f"{int(r * 8)}bit"

    common = f"ceil {bits(rate)} burst {burst} cburst {burst} quantum {2 * GSO_BYTES}"
    batch = [
        f"qdisc replace dev {dev} root handle 1: htb default 10",
        f"class add dev {dev} parent 1: classid 1:1 htb rate {bits(rate)} {common}",
        f"class add dev {dev} parent 1:1 classid 1:10 htb rate {bits(rate / 20)} {common} prio 0",
        f"filter add dev {dev} parent 1: protocol ip prio 1 u32 "
        "match u16 0x0000 0xff80 at 2 flowid 1:10",  # IP total length < 128
    ]
    share = rate * 19 / 20 / len(sources)
    for i, src in enumerate(sources):
        cls = f"1:{0x100 + i:x}"
        batch += [
            f"class add dev {dev} parent 1:1 classid {cls} htb rate {bits(share)} {common} prio 1",
            f"qdisc add dev {dev} parent {cls} bfifo limit {queue_bytes}",
            f"filter add dev {dev} parent 1: protocol ip prio 2 u32 "
            f"match ip src {src.address}/32 flowid {cls}",
        ]
    done = subprocess.run(
        ["tc", "-n", ns, "-batch", "-"],
        input="\n".join(batch) + "\n",
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise TestbedError(f"`tc -n {ns}` shaping {dev} failed: {done.stderr.strip()}")
    return {
        "netns": ns,
        "dev": dev,
        "rate_Bps": rate,
        "burst_bytes": burst,
        "queue_bytes_per_source": queue_bytes,
        "sources": [h.name for h in sources],
    }
