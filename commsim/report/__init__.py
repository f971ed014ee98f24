"""What the user sees: rich tables, one JSON document for scripts, matplotlib figures.

terminal: consoles, --json, user errors and progress bars; tables: rich tables; plots: matplotlib
figures; labels: how strategies and layouts are named.

Metrics, as every table and JSON key here uses them:
  step time          wall time of one optimizer step (all micro-batches, sync, optimizer)
  exposed comm       step time - compute time: time the GPUs wait on the network
  overlap ratio      1 - exposed / comm: share of communication hidden under compute
  overlap efficiency T_compute / max(T_compute, T_comm)
  scaling efficiency throughput(N) / (N * throughput(1))
  MFU                model FLOP/s / (N * peak FLOP/s)
  algbw, busbw       S / t, and algbw * factor (all-reduce 2(N-1)/N, all-gather and
                     reduce-scatter (N-1)/N, broadcast 1, all-to-all (N-1)/N), as nccl-tests
"""
