"""`commsim collective`: one collective over a size sweep, nccl-tests style."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli.options import (
    CsvOpt,
    HtmlOpt,
    NcclAlgoOpt,
    NcclProtoOpt,
    NcclVersionOpt,
    ProfileOpt,
    check_fitted_version,
)
from commsim.collectives.algorithms import ALGORITHMS
from commsim.report import terminal

if TYPE_CHECKING:
    import numpy as np

    from commsim.collectives.group import GroupCost


def collective_cmd(
    op: Annotated[str, typer.Argument(help=", ".join(ALGORITHMS))],
    cluster: Annotated[str, typer.Option(help="Topology name or YAML path.")] = "dgx-h100-ib",
    gpus: Annotated[int, typer.Option(help="Ranks in the group.")] = 64,
    sizes: Annotated[
        str, typer.Option(help="Size sweep LOW:HIGH, doubling (nccl-tests -b/-e/-f 2).")
    ] = "8B:4GiB",
    algorithm: Annotated[
        str,
        typer.Option(
            help="'all' (commsim's algorithms side by side), 'auto' (what the backend runs: "
            "NCCL's choice, gloo's own), 'nccl' (NCCL's pick), 'a|b' (the faster) or one of "
            "the op's: " + "; ".join(f"{op}: {', '.join(algs)}" for op, algs in ALGORITHMS.items())
        ),
    ] = "all",
    placement: Annotated[
        str, typer.Option(help="blocked, interleaved or topology-aware.")
    ] = "blocked",
    ps_shards: Annotated[int, typer.Option(help="Parameter-server shards.")] = 1,
    backend: Annotated[
        str | None,
        typer.Option(help="nccl or gloo (default: the cluster's; nccl on GPUs)."),
    ] = None,
    nccl_version: NcclVersionOpt = None,
    nccl_algo: NcclAlgoOpt = None,
    nccl_proto: NcclProtoOpt = None,
    profile: ProfileOpt = None,
    html: HtmlOpt = None,
    csv: CsvOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Time one collective over a size sweep, nccl-tests style (time, algbw, busbw); under
    NCCL, per size the algorithm, protocol and channels its tuner chooses and the runner-up."""
    import numpy as np

    from commsim.collectives.algorithms import SEARCHED
    from commsim.collectives.group import GroupCost
    from commsim.files import check_output
    from commsim.report import tables
    from commsim.report.rows import write_csv
    from commsim.topology.build import build_cluster
    from commsim.topology.placement import place

    with terminal.user_errors():
        if op not in ALGORITHMS:
            raise ValueError(f"unknown op {op!r} (choose from {', '.join(ALGORITHMS)})")
        if gpus < 2:
            raise ValueError(f"--gpus {gpus}: a collective needs at least 2 ranks")
        check_output(html, "--html")
        check_output(csv, "--csv")
        lo, hi = _size_range(sizes)
        spec, carried, fitted = _cluster(cluster, profile)
        check_fitted_version(nccl_version, fitted, profile)
        nccl = {"version": nccl_version, "algo": nccl_algo, "proto": nccl_proto}
        spec = _with_backend(spec, backend, nccl, cluster)
        built = build_cluster(spec, gpus, cluster)
        cost = GroupCost(built, place(built, gpus, placement), ps_shards=ps_shards)
        grid = lo * 2.0 ** np.arange(int(np.floor(np.log2(hi / lo) + 1e-9)) + 1)
        algs = SEARCHED[op] if algorithm == "all" else (algorithm,)
        try:
            rows = _rows(cost, op, gpus, algs, grid)
        except ValueError as e:  # the algorithm cannot run this op, or not on this group
            raise ValueError(f"--algorithm {algorithm}: {e}") from None
        doc = {
            "op": op,
            "cluster": spec.name,
            "gpus": gpus,
            "placement": placement,
            "backend": cost.backend,
            "nccl_version": spec.nccl.version if cost.backend == "nccl" else None,
            "nccl_algo": spec.nccl.algo if cost.backend == "nccl" else None,
            "nccl_proto": spec.nccl.proto if cost.backend == "nccl" else None,
            "rows": rows,
        }
        terminal.require_finite(doc, "--sizes")
        shown = [r | {"algorithm": r["requested"]} for r in rows]
        title = f"{op}: {gpus} GPUs of {spec.name}, {placement} placement, {cost.backend}"
        table = tables.collective_table(title, shown, algs)
        if csv:
            write_csv(csv, rows)
        if html:
            _html(table, spec, doc, html)
    for note in carried:
        terminal.err_console.print(f"note: {note}", highlight=False)
    if json_out:
        terminal.print_json(doc)
        return
    terminal.console.print(table)
    for path, what in ((csv, "rows"), (html, "report")):
        if path:
            terminal.console.print(f"{what} written to {path}", highlight=False)
    if rows and "protocol" in rows[0]:
        terminal.console.print(
            tables.nccl_choice_table(f"what NCCL {spec.nccl.version} runs, and why", rows)
        )
    elif algorithm in ("auto", "nccl"):
        picks = sorted({r["algorithm"] for r in rows})
        terminal.console.print(f"{algorithm} picked: {', '.join(picks)}")


def _size_range(text: str) -> tuple[float, float]:
    """--sizes as (low, high) bytes; a bad one names the flag."""
    from commsim.units import UnitError, parse_size_range

    try:
        return parse_size_range(text)
    except UnitError as e:
        raise UnitError(f"--sizes: {e}") from None


def _html(table: Any, spec: Any, doc: dict[str, Any], path: str) -> None:
    """The sweep as one HTML page: the table, busbw against size, the cluster."""
    import yaml

    from commsim.report.html import Report, figure_png
    from commsim.report.sweeps import plot_busbw

    report = Report(f"commsim collective: {table.title}")
    report.table(table)
    report.figure(figure_png(lambda p: plot_busbw(doc, p)), "bus bandwidth against size")
    report.heading("Inputs")
    inputs = {k: v for k, v in doc.items() if k != "rows"}
    report.code(yaml.safe_dump(inputs, sort_keys=False))
    report.code(yaml.safe_dump({"cluster": spec.model_dump(mode="json")}, sort_keys=False))
    report.heading("Assumptions")
    report.lines(
        [
            "busbw = algbw x the nccl-tests factor: 2(N-1)/N all-reduce, (N-1)/N all-gather, "
            "reduce-scatter, all-to-all; 1 broadcast, send-recv",
            "each algorithm priced on the cluster graph: alpha-beta per link tier, flows shared "
            "max-min on contended links",
        ]
    )
    report.write(path)


def _rows(
    cost: GroupCost, op: str, gpus: int, algs: tuple[str, ...], grid: np.ndarray
) -> list[dict[str, Any]]:
    """Time, algbw and busbw of each algorithm at each size; `algorithm` is what ran."""
    from commsim.collectives.algorithms import bus_factor

    rows = []
    with terminal.progress(len(algs), f"{op} on {gpus} GPUs") as bar:
        for alg in algs:
            times, chosen = cost.time_and_choice(op, alg, grid)
            detail = cost.nccl_detail(op, alg, grid) if len(algs) == 1 else None
            for i, (size, t, name) in enumerate(zip(grid, times, chosen, strict=True)):
                algbw = size / t if t > 0 else float("inf")
                row = {
                    "bytes": float(size),
                    "time_s": float(t),
                    "algbw_Bps": algbw,
                    "busbw_Bps": algbw * bus_factor(op, gpus),
                    "algorithm": name,
                    "requested": alg,
                }
                rows.append(row | ({k: v[i] for k, v in detail.items()} if detail else {}))
            bar.advance(0)
    return rows


def _cluster(name: str, profile: str | None):
    """The cluster, with a profile carried over if given, what it carried over, and the
    NCCL version the profile's NCCL fit ran at (None without one)."""
    from commsim import catalog
    from commsim.profile import carry_over, load_profile
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec

    spec = load_spec(ClusterSpec, catalog.topology_path(name, "--cluster", ""))
    if not profile:
        return spec, [], None
    fit = load_profile(profile)
    spec, carried = carry_over(spec, fit, profile)
    return spec, carried, fit.nccl.version if fit.nccl else None


def _with_backend(spec, backend: str | None, nccl: dict[str, str | None], source: str):
    """The spec with --backend and --nccl-version / --nccl-algo / --nccl-proto applied
    (validated as spec fields); a per-call overhead a profile fitted under another backend
    is dropped."""
    from commsim.profile import switch_backend
    from commsim.spec_io import parse_spec
    from commsim.specs import ClusterSpec

    given = {k: v for k, v in nccl.items() if v is not None}
    if backend is None and not given:
        return spec
    data = (spec if backend is None else switch_backend(spec, backend)).model_dump()
    data["nccl"] |= given
    return parse_spec(ClusterSpec, data, source, units=False)  # a dumped spec is in SI
