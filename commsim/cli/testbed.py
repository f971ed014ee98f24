"""`commsim testbed`: bring an emulated multi-rack cluster up and down, check it, run ranks on
it, and write the commsim cluster it emulates.

Errors (bad file, not root, testbed not up) print one line on stderr and exit 2. `run`
exits with the worst failing rank's code (124 on timeout); `check` exits 1 when a link is
more than 15% off its shaped rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.calibrate.testbed.spec import Host

testbed_app = typer.Typer(
    no_args_is_help=True,
    help="An emulated multi-rack cluster on this host: namespaces, bridges, shaped links "
    "(needs root).",
)

FileArg = Annotated[
    Path, typer.Argument(help="Testbed YAML (racks, hosts, rates), e.g. testbeds/2x2-oversub.yaml.")
]
TOLERANCE = 0.15


def _mbit(bps: float) -> str:
    return f"{bps * 8 / 1e6:.1f}"


ClusterOut = Annotated[
    str | None,
    typer.Option("--cluster-out", help="Also write the commsim cluster it emulates (YAML)."),
]


def _write_cluster(spec, path: str, flag: str) -> None:
    """The cluster a testbed emulates, as a cluster YAML that --cluster reads (a path that
    cannot be written is refused naming `flag`)."""
    import yaml

    from commsim.calibrate.testbed.spec import cluster_spec
    from commsim.files import check_output, write_atomic

    check_output(path, flag)
    doc = cluster_spec(spec).model_dump(mode="json", exclude_defaults=True)  # with units
    write_atomic(path, yaml.safe_dump(doc, sort_keys=False))


@testbed_app.command()
def cluster(
    file: FileArg,
    output: Annotated[str, typer.Option("-o", "--output", help="Cluster YAML to write.")],
    json: terminal.JsonOpt = False,
) -> None:
    """Write the commsim cluster a testbed emulates (one 'GPU' a host, its racks, rates and
    oversubscription), for `--cluster` of calibrate, collective, predict and plan."""
    from commsim.calibrate.testbed.spec import cluster_spec, load_testbed

    with terminal.user_errors():
        spec = load_testbed(file)
        _write_cluster(spec, output, "-o")
    if json:
        doc = {"testbed": spec.name, "output": output, "cluster": cluster_spec(spec).model_dump()}
        terminal.print_json(doc)
        return
    terminal.console.print(f"cluster {spec.name!r} written to {output}", highlight=False)


@testbed_app.command()
def up(file: FileArg, cluster_out: ClusterOut = None, json: terminal.JsonOpt = False) -> None:
    """Build the testbed (removing leftovers of an earlier one with the same prefix)."""
    from commsim.calibrate.testbed import network
    from commsim.calibrate.testbed.spec import load_testbed

    with terminal.user_errors():
        spec = load_testbed(file)
        if cluster_out:
            _write_cluster(spec, cluster_out, "--cluster-out")
        state = network.up(spec)
    if json:
        terminal.print_json(state)
        return
    terminal.console.print(
        f"testbed [bold]{spec.name}[/bold] is up: {spec.racks} racks x {spec.hosts_per_rack} "
        f"hosts, host links {_mbit(spec.host_rate)} Mbit/s, rack uplinks "
        f"{_mbit(spec.uplink_rate)} Mbit/s ({spec.oversubscription:g}:1), namespaces "
        f"{spec.prefix}-r<R>h<H> and {spec.prefix}-sw; latency not emulated",
        highlight=False,
    )
    for warning in state["warnings"]:
        terminal.err_console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


@testbed_app.command()
def down(
    prefix: Annotated[str, typer.Option(help="Prefix of the testbed to remove.")] = "cs",
) -> None:
    """Remove every namespace, bridge and link of a testbed, also after a crash."""
    from commsim.calibrate.testbed import network

    with terminal.user_errors():
        removed = network.down(prefix)
    what = ", ".join(removed) if removed else "nothing was there"
    terminal.console.print(f"testbed {prefix!r} removed: {what}", highlight=False)


@testbed_app.command()
def status(json: terminal.JsonOpt = False) -> None:
    """List the testbeds on this host: up, broken (namespaces missing) or leftover."""
    from rich.table import Table

    from commsim.calibrate.testbed import network

    with terminal.user_errors():
        rows = network.status()
    if json:
        terminal.print_json({"testbeds": rows})
        return
    if not rows:
        terminal.console.print("no testbed is up")
        return
    table = Table(title="testbeds", title_justify="left")
    for col in ("prefix", "name", "state", "hosts", "host link", "uplink", "namespaces"):
        table.add_column(col)
    for row in rows:
        spec = row["spec"] or {}
        table.add_row(
            row["prefix"],
            spec.get("name", "?"),
            row["state"] + (f" (missing {', '.join(row['missing'])})" if row["missing"] else ""),
            f"{spec['racks']} x {spec['hosts_per_rack']}" if spec else "?",
            f"{_mbit(spec['host_rate'])} Mbit/s" if spec else "?",
            f"{_mbit(spec['uplink_rate'])} Mbit/s" if spec else "?",
            str(len(row["namespaces"])),
        )
    terminal.console.print(table)


@testbed_app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    file: FileArg,
    placement: Annotated[
        str,
        typer.Option(
            help="blocked, interleaved, topology-aware, or hosts one per rank: r0h0,r1h0,..."
        ),
    ] = "blocked",
    world_size: Annotated[
        int | None, typer.Option(help="Ranks (default: every host); the first N hosts.")
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Kill every rank after S seconds.")] = None,
    port: Annotated[int, typer.Option(help="MASTER_PORT.")] = 29500,
) -> None:
    """Run `-- COMMAND...` once per rank, each in its host's namespace, torchrun-style
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, COMMSIM_HOST, COMMSIM_RACK)."""
    from commsim.calibrate.testbed import runner
    from commsim.calibrate.testbed.spec import load_testbed
    from commsim.specs import SpecError

    with terminal.user_errors():
        spec = load_testbed(file)
        if not ctx.args:
            raise SpecError("testbed run", "COMMAND", "give the command after --")

        def show(rank: int, host: Host, line: str) -> None:
            print(f"[{rank} {host.name}] {line}", flush=True)

        result = runner.run(spec, ctx.args, placement, world_size, timeout, port, show)
    for rank in result.failed:
        terminal.err_console.print(
            f"[red]rank {rank} ({result.hosts[rank]}) exited with code "
            f"{result.codes[rank]}[/red]"
            + (f"; killed ranks {result.killed}" if result.killed else ""),
            highlight=False,
        )
    if result.timed_out and not result.failed:
        terminal.err_console.print(
            f"[red]timed out after {timeout:g} s; killed ranks {result.killed}[/red]",
            highlight=False,
        )
    raise typer.Exit(result.returncode)


@testbed_app.command()
def check(
    file: FileArg,
    seconds: Annotated[float, typer.Option(help="Length of each TCP stream.")] = 1.5,
    out: Annotated[
        str | None,
        typer.Option(help="Append the check to this results file (a fit compares with it)."),
    ] = None,
    json: terminal.JsonOpt = False,
) -> None:
    """Measure each link class with TCP streams between namespaces: measured vs shaped."""
    import datetime as dt

    from rich.table import Table

    from commsim.calibrate.records import append_records
    from commsim.calibrate.testbed import goodput
    from commsim.calibrate.testbed.spec import load_testbed

    with terminal.user_errors():
        spec = load_testbed(file)
        rows = goodput.check(spec, seconds)
        if out:
            stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S.%fZ}"
            record = {"kind": "link-check", "run": f"check-{stamp}", "testbed": spec.name}
            append_records(out, [record | {"links": rows}])
    bad = [r for r in rows if abs(r["ratio"] - 1) > TOLERANCE]
    if json:
        terminal.print_json({"testbed": spec.name, "tolerance": TOLERANCE, "links": rows})
    else:
        table = Table(title=f"testbed {spec.name}: per-flow rates (Mbit/s)", title_justify="left")
        for col in ("link", "flows", "shaped", "goodput\nexpected", "measured", "ratio", "CPU"):
            table.add_column(col, justify="left" if col in ("link", "flows") else "right")
        for r in rows:
            table.add_row(
                r["link"],
                str(len(r["flows"])),
                _mbit(r["shaped_Bps"]),
                _mbit(r["expected_goodput_Bps"]),
                " ".join(_mbit(m) for m in r["measured_Bps"]),
                f"{r['ratio']:.3f}",
                f"{100 * r['cpu_busy']:.0f}%",
            )
        terminal.console.print(table)
    for r in rows:
        if r["cpu_bound"]:
            terminal.err_console.print(
                f"[yellow]warning:[/yellow] {r['link']}: the CPU was {100 * r['cpu_busy']:.0f}% "
                "busy and the links ran slow: the CPU, not the links, is the bottleneck; "
                "lower the rates",
                highlight=False,
            )
    if bad:
        raise typer.Exit(1)
