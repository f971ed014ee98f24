"""The ends of a TCP stream, run inside a namespace: a sink that samples what each sender
delivered, and a source. Imports only the standard library: it starts in every namespace
for every measurement."""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time
from collections.abc import Sequence

PROBE_PORT = 5201


def probe(argv: Sequence[str]) -> None:
    """Inside a namespace: `sink PORT N` receives N streams and prints, per sender address,
    (time, bytes so far) samples from the first byte on; `source ADDR PORT SECONDS`
    connects, says ready, and streams for SECONDS once a line arrives on stdin."""
    if argv[0] == "sink":
        port, n = int(argv[1]), int(argv[2])
        server = socket.create_server(("0.0.0.0", port), backlog=n)
        print("ready", flush=True)
        sel = selectors.DefaultSelector()
        sel.register(server, selectors.EVENT_READ, None)
        samples: dict[str, list[tuple[float, int]]] = {}
        totals: dict[str, int] = {}
        done = 0
        while done < n:
            events = sel.select(timeout=15)
            if not events:
                sys.exit("sink: no data for 15 s")
            for key, _ in events:
                if key.data is None:
                    conn, (addr, _) = server.accept()
                    sel.register(conn, selectors.EVENT_READ, addr)
                    samples[addr], totals[addr] = [], 0
                    continue
                addr = key.data
                got = len(key.fileobj.recv(1 << 20))
                now = time.monotonic()
                totals[addr] += got
                if not got:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    done += 1
                if not got or not samples[addr] or now - samples[addr][-1][0] >= 0.005:
                    samples[addr].append((now, totals[addr]))
        print(json.dumps(samples), flush=True)
    else:
        addr, port, seconds = argv[1], int(argv[2]), float(argv[3])
        chunk = bytes(256 * 1024)
        with socket.create_connection((addr, port), timeout=15) as s:
            print("ready", flush=True)
            sys.stdin.readline()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                s.sendall(chunk)
