"""An emulated multi-rack cluster on one Linux host: network namespaces, veth links, bridges, htb.

Each host is a network namespace `{prefix}-r{R}h{H}` with one interface `eth0` at
10.77.R.(H+1)/16. The switches are Linux bridges (one ToR per rack, one core) in a switch
namespace `{prefix}-sw`, so nothing touches the root namespace's network. Every link is a
veth pair shaped with htb on the egress of both ends (one token bucket per direction, like
a full-duplex cable): host <-> ToR at host_rate, ToR <-> core at uplink_rate. Each link
shares its rate fairly between source hosts and never drops a packet (receive windows are
capped and queues hold them), like a lossless InfiniBand or RoCE fabric.

Latency is not emulated: netem, the only Linux qdisc that delays packets, is not available
here, so a non-zero `latency` is refused; calibration fits the natural latency of veth,
bridges and TCP instead (about 100 us round trip). Shaping counts Ethernet frames, so TCP
goodput is 95.6% of the shaped rate (1448 payload bytes per 1514-byte frame).

spec: the testbed's description (racks, hosts, rates), its hosts and the commsim cluster
it is; host: what this Linux host must offer (root, iproute2), its namespaces and the
state files; shaping: htb on one link end; network: bring a testbed up and down, list
them; runner: run a command once per rank in the hosts' namespaces; goodput: measure
the links with TCP streams; probe: the stream ends run inside the namespaces
(`python -m commsim.calibrate.testbed sink|source ...`).
"""
