"""`commsim collective`: one collective over a size sweep, nccl-tests style."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli.options import NcclVersionOpt, ProfileOpt
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
    profile: ProfileOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Time one collective over a size sweep, nccl-tests style (time, algbw, busbw); under
    NCCL, per size the algorithm, protocol and channels its tuner chooses and the runner-up."""
    import numpy as np

    from commsim.collectives.algorithms import SEARCHED
    from commsim.collectives.group import GroupCost
    from commsim.report import tables
    from commsim.topology.build import build_cluster
    from commsim.topology.placement import place
    from commsim.units import parse_size_range

    with terminal.user_errors():
        if op not in ALGORITHMS:
            raise ValueError(f"unknown op {op!r} (choose from {', '.join(ALGORITHMS)})")
        spec, carried = _cluster(cluster, profile)
        spec = _with_backend(spec, backend, nccl_version, cluster)
        built = build_cluster(spec, gpus, cluster)
        cost = GroupCost(built, place(built, gpus, placement), ps_shards=ps_shards)
        lo, hi = parse_size_range(sizes)
        grid = lo * 2.0 ** np.arange(int(np.floor(np.log2(hi / lo) + 1e-9)) + 1)
        algs = SEARCHED[op] if algorithm == "all" else (algorithm,)
        rows = _rows(cost, op, gpus, algs, grid)
    for note in carried:
        terminal.err_console.print(f"note: {note}", highlight=False)
    if json_out:
        terminal.print_json(
            {
                "op": op,
                "cluster": spec.name,
                "gpus": gpus,
                "placement": placement,
                "backend": cost.backend,
                "nccl_version": spec.nccl.version if cost.backend == "nccl" else None,
                "rows": rows,
            }
        )
        return
    shown = [r | {"algorithm": r["requested"]} for r in rows]
    terminal.console.print(
        tables.collective_table(
            f"{op}: {gpus} GPUs of {spec.name}, {placement} placement, {cost.backend}", shown, algs
        )
    )
    if rows and "protocol" in rows[0]:
        terminal.console.print(
            tables.nccl_choice_table(f"what NCCL {spec.nccl.version} runs, and why", rows)
        )
    elif algorithm in ("auto", "nccl"):
        picks = sorted({r["algorithm"] for r in rows})
        terminal.console.print(f"{algorithm} picked: {', '.join(picks)}")


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
    """The cluster, with a profile carried over if given, and what it carried over."""
    from commsim import catalog
    from commsim.profile import carry_over, load_profile
    from commsim.specs import ClusterSpec, load_spec

    spec = load_spec(ClusterSpec, catalog.topology_path(name, name))
    return carry_over(spec, load_profile(profile), profile) if profile else (spec, [])


def _with_backend(spec, backend: str | None, version: str | None, source: str):
    """The spec with --backend and --nccl-version applied (validated as spec fields); a
    per-call overhead a profile fitted under another backend is dropped."""
    from commsim.profile import switch_backend
    from commsim.specs import ClusterSpec, parse_spec

    if backend is None and version is None:
        return spec
    data = (spec if backend is None else switch_backend(spec, backend)).model_dump()
    if version is not None:
        data["nccl"]["version"] = version
    return parse_spec(ClusterSpec, data, source)
