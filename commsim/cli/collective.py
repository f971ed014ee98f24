"""`commsim collective`: one collective over a size sweep, nccl-tests style."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli.given import (
    NCCL_FLAGS,
    blame_cluster_flags,
    blame_nccl_flags,
    input_files,
    pick,
    refuse_nccl_flags,
)
from commsim.cli.options import (
    CsvOpt,
    HtmlOpt,
    NcclAlgoOpt,
    NcclProtoOpt,
    NcclVersionOpt,
    ProfileOpt,
    check_fitted_version,
)
from commsim.collectives.algorithms import ALGORITHMS, SEARCHED
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
    args = locals()  # the flags as given
    from commsim.report import tables
    from commsim.report.rows import write_csv

    with terminal.user_errors():
        _check(op, gpus, html, csv, input_files(args))
        _check_group(args)
        lo, hi = _size_range(sizes)
        spec, carried, cost = _group(args)
        algs = SEARCHED[op] if algorithm == "all" else (algorithm,)
        with blame_nccl_flags(args):
            rows = _sweep(cost, op, gpus, algs, lo, hi, algorithm)
        doc = _document(args, spec, cost, rows)
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
    _show_choices(rows, algorithm, spec.nccl.version)


def _check(op: str, gpus: int, html: str | None, csv: str | None, inputs: tuple) -> None:
    """A known op on 2 ranks or more, and output files that can be written, none of them
    one of the `inputs` (ValueError)."""
    from commsim.files import check_outputs

    if op not in ALGORITHMS:
        raise ValueError(f"unknown op {op!r} (choose from {', '.join(ALGORITHMS)})")
    if gpus < 2:
        raise ValueError(f"--gpus {gpus}: a collective needs at least 2 ranks")
    check_outputs({"--html": html, "--csv": csv}, inputs)


def _check_group(args: dict[str, Any]) -> None:
    """--placement a known one, --ps-shards a count the parameter server can take that an
    algorithm run here uses, --profile a path if given (ValueError naming the flag)."""
    from commsim.topology.placement import PLACEMENTS

    op, algorithm, shards = args["op"], args["algorithm"], args["ps_shards"]
    if args["profile"] is not None and not args["profile"].strip():
        raise ValueError(f"--profile {args['profile']!r}: empty path: give a file name")
    if args["placement"] not in PLACEMENTS:
        raise ValueError(f"--placement {args['placement']}: choose from {', '.join(PLACEMENTS)}")
    if not 1 <= shards <= args["gpus"]:
        raise ValueError(f"--ps-shards {shards}: must be between 1 and the {args['gpus']} ranks")
    runs = SEARCHED[op] if algorithm == "all" else algorithm.split("|")
    if shards != 1 and "ps" not in runs:
        raise ValueError(
            f"--ps-shards {shards}: only the parameter server (ps) takes shards, and "
            f"--algorithm {algorithm} runs none for {op}"
        )


def _group(args: dict[str, Any]) -> tuple[Any, list[str], GroupCost]:
    """(the cluster spec with the profile, --backend and --nccl-* applied, what the profile
    carried over, the cost model of the --gpus ranks placed by --placement)."""
    from commsim.collectives.group import GroupCost
    from commsim.topology.build import build_cluster
    from commsim.topology.placement import place

    cluster, gpus, profile = args["cluster"], args["gpus"], args["profile"]
    spec, carried, fitted = _cluster(cluster, profile)
    check_fitted_version(args["nccl_version"], fitted, profile)
    nccl = {k.removeprefix("nccl_"): v for k, v in pick(args, NCCL_FLAGS).items()}
    with blame_cluster_flags(args):
        spec = _with_backend(spec, args["backend"], nccl, cluster)
        built = build_cluster(spec, gpus, cluster)
    cost = GroupCost(built, place(built, gpus, args["placement"]), ps_shards=args["ps_shards"])
    refuse_nccl_flags(args, cost.backend)
    return spec, carried, cost


def _sweep(
    cost: GroupCost, op: str, gpus: int, algs: tuple[str, ...], lo: float, hi: float, given: str
) -> list[dict[str, Any]]:
    """_rows over the sizes from `lo` to `hi` bytes, doubling; an algorithm that cannot run
    the op, or not on this group, is refused naming --algorithm as `given`."""
    import numpy as np

    from commsim.collectives.group import NcclUnavailable

    grid = lo * 2.0 ** np.arange(int(np.floor(np.log2(hi / lo) + 1e-9)) + 1)
    try:
        return _rows(cost, op, gpus, algs, grid)
    except NcclUnavailable:  # NCCL_ALGO / NCCL_PROTO's fault (blame_nccl_flags)
        raise
    except ValueError as e:
        raise ValueError(f"--algorithm {given}: {e}") from None


def _document(
    args: dict[str, Any], spec: Any, cost: GroupCost, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The sweep's JSON: the op, the cluster and group, NCCL's settings (None under gloo),
    the rows."""
    nccl = cost.backend == "nccl"
    settings = {
        k: getattr(spec.nccl, k.removeprefix("nccl_")) if nccl else None for k in NCCL_FLAGS
    }
    group = {"placement": args["placement"], "backend": cost.backend}
    return (
        {"op": args["op"], "cluster": spec.name, "gpus": args["gpus"]}
        | group
        | settings
        | {"rows": rows}
    )


def _show_choices(rows: list[dict[str, Any]], algorithm: str, version: str) -> None:
    """What NCCL runs at each size and why (its tuner's detail in the rows), or, for
    --algorithm auto or nccl, the algorithms picked."""
    from commsim.report import tables

    if rows and "protocol" in rows[0]:
        terminal.console.print(tables.nccl_choice_table(f"what NCCL {version} runs, and why", rows))
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
