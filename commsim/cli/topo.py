"""`commsim topo`: the built-in cluster topologies."""

from __future__ import annotations

from typing import Annotated

import typer

from commsim.report import terminal

topo_app = typer.Typer(no_args_is_help=True, help="Built-in cluster topologies.")


@topo_app.command("list")
def topo_list(json_out: terminal.JsonOpt = False) -> None:
    """The built-in cluster files."""
    from rich.table import Table

    from commsim import catalog
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec

    with terminal.user_errors():
        specs = [load_spec(ClusterSpec, catalog.topology_path(n)) for n in catalog.topology_names()]
    if json_out:
        terminal.print_json(
            {
                "topologies": [
                    {
                        "name": s.name,
                        "description": s.description,
                        "nodes": s.nodes,
                        "gpus": s.total_gpus,
                        "gpu": s.node.gpu,
                    }
                    for s in specs
                ]
            }
        )
        return
    table = Table(title="built-in topologies", title_justify="left")
    for col in ("name", "GPUs", "GPU", "description"):
        table.add_column(col)
    for s in specs:
        table.add_row(s.name, str(s.total_gpus), s.node.gpu, s.description)
    terminal.console.print(table)


@topo_app.command("show")
def topo_show(
    name: Annotated[str, typer.Argument(help="Topology name or YAML path.")],
    gpus: Annotated[
        int | None, typer.Option(help="Build only the nodes this many GPUs need.")
    ] = None,
    plot: Annotated[str | None, typer.Option(help="Draw the graph to this PNG.")] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """A topology's summary: nodes, NICs, tiers, bandwidths, switch counts; --plot draws it."""
    from commsim import catalog
    from commsim.cli.given import blame_cluster_flags
    from commsim.files import check_output
    from commsim.report import plots, tables
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec
    from commsim.topology.build import build_cluster

    with terminal.user_errors():
        check_output(plot, "--plot", image=True)
        spec = load_spec(ClusterSpec, catalog.topology_path(name, name))
        with blame_cluster_flags({"gpus": gpus}):
            built = build_cluster(spec, gpus, name)
        summary = built.summary()
        if plot:  # building and drawing the graph: ~20 s at 131,072 GPUs
            with terminal.progress(1, f"drawing {built.n_gpus:,} GPUs") as bar:
                plots.plot_topology(built.graph, plot, f"{spec.name} ({built.n_gpus} GPUs)")
                bar.advance(0)
    if json_out:
        terminal.print_json(summary)
        return
    terminal.console.print(tables.topology_table(summary))
    if spec.source:
        terminal.console.print(f"[dim]source: {spec.source.strip()}[/dim]")
    if plot:
        terminal.console.print(f"graph drawn to {plot}")
