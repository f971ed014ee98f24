"""Real workloads in and out: PyTorch profiler (Kineto) traces read per rank and summarised,
turned into a dependency graph that commsim's cost model replays on any cluster (and at
another scale), and MLCommons Chakra execution traces read and written.

- kineto.py: one rank's chrome-trace JSON: steps, compute, collectives with their metadata;
- summary.py: per step compute, communication, exposed communication, algbw and busbw;
- graph.py, replay.py: the step as nodes and dependencies, replayed (longest path, groups
  meeting at each collective) with recorded or commsim-priced durations;
- imported.py: a Kineto trace as such a graph (dependencies inferred from waits);
- pricing.py, retarget.py: collectives priced on a cluster, at the traced or another scale;
- protowire.py, chakra.py: the Chakra .et wire format, read and written by hand;
- export.py: the Chakra graph of any commsim layout, from the step model's own schedule.
"""
