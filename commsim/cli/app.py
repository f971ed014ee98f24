"""The `commsim` command line: the typer app and its commands, one module per group
(predict, plan, collective, claims, jobs, topo, calibrate, testbed, compression,
trace).

Every command prints a rich table, or with --json one JSON document on stdout. Bad input
prints one line naming the file and field on stderr and exits 2, never a traceback.
"""

from __future__ import annotations

import typer

from commsim.cli import goodput
from commsim.cli.calibrate import calibrate_app
from commsim.cli.claims import claims_cmd
from commsim.cli.collective import collective_cmd
from commsim.cli.compression import compression_app
from commsim.cli.jobs import jobs_cmd
from commsim.cli.plan import plan_cmd
from commsim.cli.predict import predict_cmd
from commsim.cli.testbed import testbed_app
from commsim.cli.topo import topo_app
from commsim.cli.trace import trace_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Predict distributed-training step time and communication, and pick the strategy.",
)
app.command("predict")(predict_cmd)
app.command("plan")(plan_cmd)
app.command("collective")(collective_cmd)
app.command("claims")(claims_cmd)
app.command("jobs")(jobs_cmd)
app.add_typer(topo_app, name="topo")
app.add_typer(calibrate_app, name="calibrate")
app.add_typer(testbed_app, name="testbed")
goodput.register(app)  # commsim goodput, commsim stragglers
app.add_typer(compression_app, name="compression")
app.add_typer(trace_app, name="trace")

if __name__ == "__main__":
    app()
