"""The `commsim` command line: the typer app and its commands, one module per group
(predict, plan, collective, claims, jobs, topo, calibrate, testbed, compression,
trace).

Every command prints a rich table, or with --json one JSON document on stdout. Bad input
prints one line naming the file and field on stderr and exits 2, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

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


class OneLineErrors(TyperGroup):
    """The command group whose usage errors (a flag that is not an integer, an unknown
    option) are one line on stderr and exit 2, as commsim's own input errors are."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        except Exception as e:  # click's ClickException family (vendored by typer)
            if not (hasattr(e, "format_message") and hasattr(e, "exit_code")):
                raise
            if type(e).__name__ == "NoArgsIsHelpError":  # no arguments: the help
                e.show()
            else:
                from commsim.report.terminal import error_line

                error_line(e.format_message())
            sys.exit(e.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
    rich_markup_mode=None,  # plain help: wraps every value, never cuts one off with …
    add_completion=False,
    no_args_is_help=True,
    help="Predict distributed-training step time and communication, and pick the strategy.",
)


def _version(value: bool) -> None:
    if value:
        from commsim import __version__

        typer.echo(f"commsim {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Predict distributed-training step time and communication, and pick the strategy."""


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
