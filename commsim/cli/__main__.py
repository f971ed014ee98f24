"""`python -m commsim.cli`: the `commsim` command (benchmarks/bench_planner.py runs it so)."""

from commsim.cli.app import app

app(prog_name="commsim")
