"""The torch.distributed benchmark: collectives over a size sweep, then a DDP training step.

Runs one process per rank under torchrun, the testbed's runner, or `--local N` (local
spawns N processes on 127.0.0.1, each `python -m commsim.calibrate.harness CONFIG`); each
reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, and COMMSIM_HOST /
COMMSIM_RACK where the testbed sets them. gloo on CPU, nccl on CUDA. Rank 0 appends every
result to the JSONL file the moment it is measured (records.py describes the records).

config: what to measure (the `calibrate run` options); rank: one rank's run (identity,
device, the records it writes, progress and the watchdog, who ran where); collectives: the
collectives over the size sweep; ddp: the DDP step, plain and with PyTorch's comm hooks;
launch: one rank's whole run and its entry point; local: ranks started on this host (no
torch in the launcher); profiled: DDP steps under torch.profiler; commclock: the harness's
own clock of a step's exposed communication.
"""
