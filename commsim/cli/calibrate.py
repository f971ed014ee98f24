"""`commsim calibrate`: measure real runs, import nccl-tests logs and other tools' tables,
fit a profile, carry it to a cluster, validate predictions with or without one.

Only `run` imports torch (the calibrate extra). Bad input (a malformed results line, an
nccl-tests log of another version or with errors, a profile whose link classes a cluster
lacks) prints one line naming the file and line and exits 2; outputs are written to a
temporary file and renamed, so nothing already there is lost or half-overwritten.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Annotated

import typer

from commsim.files import check_output, write_atomic
from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.specs import ClusterSpec

calibrate_app = typer.Typer(
    no_args_is_help=True,
    help="Measure torch.distributed on a real cluster, fit the model to it, check predictions.",
)


def _cluster(name: str) -> ClusterSpec:
    from commsim import catalog
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec

    return load_spec(ClusterSpec, catalog.topology_path(name, name))


def _floats(text: str, flag: str) -> tuple[float, ...]:
    from commsim.specs import SpecError

    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(flag, "", f"expected numbers separated by commas, got {text!r}") from None


ClusterOpt = Annotated[str, typer.Option(help="Topology name or cluster YAML the run used.")]
AppendOpt = Annotated[str, typer.Option(help="Results file (JSONL) to append to.")]


@calibrate_app.command("run")
def run_cmd(
    out: Annotated[str, typer.Option(help="Results file (JSONL); appended to, never truncated.")],
    backend: Annotated[str, typer.Option(help="gloo, nccl, or auto (nccl with CUDA).")] = "auto",
    sizes: Annotated[str, typer.Option(help="Size sweep LOW:HIGH, doubling.")] = "8B:256MiB",
    ops: Annotated[str, typer.Option(help="Comma-separated ops, or 'all'.")] = "all",
    bucket_mb: Annotated[
        str, typer.Option(help="DDP bucket caps in MiB, comma-separated; '' skips DDP.")
    ] = "1,5,25",
    local: Annotated[
        int | None, typer.Option(help="Start N ranks on this host instead of torchrun's.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds a rank may wait on its peers.")] = 300.0,
    warmup: Annotated[int, typer.Option(help="Untimed runs of each point.")] = 5,
    repeats: Annotated[int, typer.Option(help="Timed runs of each point (at most).")] = 20,
    groups: Annotated[
        str, typer.Option(help="'tiers': also rank 0's rack and host; 'world': all ranks only.")
    ] = "tiers",
    width: Annotated[int, typer.Option(help="DDP model width.")] = 512,
    depth: Annotated[int, typer.Option(help="DDP model blocks.")] = 4,
    batch: Annotated[int, typer.Option(help="DDP samples per rank per step.")] = 32,
    comm_hooks: Annotated[
        str, typer.Option(help="DDP comm hooks to measure: none, fp16, bf16, powersgd:R.")
    ] = "none",
    profile_dir: Annotated[
        str | None,
        typer.Option(
            help="Also profile DDP steps; each rank writes its torch.profiler trace here."
        ),
    ] = None,
) -> None:
    """Benchmark collectives and a DDP step with torch.distributed; append results to OUT.

    Under torchrun (or `commsim testbed run`) every rank runs this command; --local N
    starts N ranks here."""
    from commsim.profile import OPS
    from commsim.specs import SpecError

    with terminal.user_errors():
        # the ranks import torch; the launcher of --local N only checks that they can
        if importlib.util.find_spec("torch") is None:
            raise SpecError("torch", "", "not installed: pip install 'commsim[calibrate]'")
        from commsim.calibrate.harness.config import HarnessConfig

        cfg = HarnessConfig(
            out=out,
            backend=backend,
            sizes=sizes,
            ops=OPS if ops == "all" else tuple(o.strip() for o in ops.split(",") if o.strip()),
            bucket_mb=_floats(bucket_mb, "--bucket-mb"),
            warmup=warmup,
            repeats=repeats,
            groups=groups,
            timeout_s=timeout,
            width=width,
            depth=depth,
            batch=batch,
            comm_hooks=tuple(h.strip().lower() for h in comm_hooks.split(",") if h.strip()),
            profile_dir=profile_dir,
        )
        if local is not None:
            from commsim.calibrate.harness.local import launch_local

            check_output(out, "--out")
            code = launch_local(cfg, local)
        else:
            from commsim.calibrate.harness.launch import exit_now, run_rank

            code = run_rank(cfg)
    if code:
        raise typer.Exit(code)
    if local is not None or os.environ.get("RANK") == "0":  # the rank that wrote
        terminal.err_console.print(f"results appended to {out}")
    if local is None:  # this process is a rank
        exit_now(0)


def print_imported(added: dict, what: str, json_out: bool) -> None:
    """What an import added: its JSON document, or one line on stderr."""
    if json_out:
        terminal.print_json(added)
        return
    terminal.err_console.print(
        f"{added['measurements']} measurements in {added['runs']} {what} appended to {added['out']}"
    )


@calibrate_app.command("import-nccl-tests")
def import_cmd(
    logs: Annotated[list[str], typer.Argument(help="nccl-tests output files.")],
    out: AppendOpt,
    op: Annotated[
        str | None, typer.Option(help="The collective, when neither log nor file name says.")
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Read nccl-tests logs (all_reduce_perf and siblings) into a results file."""
    from commsim.calibrate.ncclt import parse_log
    from commsim.calibrate.records import import_runs
    from commsim.profile import OPS
    from commsim.specs import SpecError

    with terminal.user_errors():
        check_output(out, "--out")
        if op is not None and op not in OPS:
            raise SpecError("--op", "", f"unknown op {op!r} (choose from {', '.join(OPS)})")
        records = [r for log in logs for r in parse_log(log, op)]
        metas = [r for r in records if r["kind"] == "meta"]
        if len({m["run"] for m in metas}) < len(metas):
            raise SpecError(", ".join(logs), "", "the same log is given twice")
        added = import_runs(out, records)
    print_imported(added, "tests", json_out)


@calibrate_app.command("import")
def import_table_cmd(
    files: Annotated[list[str], typer.Argument(help="CSV or JSON tables of measurements.")],
    out: AppendOpt,
    backend: Annotated[
        str | None, typer.Option(help="gloo or nccl, for rows without a backend column.")
    ] = None,
    source: Annotated[str, typer.Option(help="The tool that measured (the runs' source).")] = (
        "import"
    ),
    json_out: terminal.JsonOpt = False,
) -> None:
    """Read measurements of any tool (op, bytes, world, placement, time, timing convention:
    see the README) into a results file that fit and validate read."""
    from commsim.calibrate.importer import import_table
    from commsim.calibrate.records import import_runs

    with terminal.user_errors():
        check_output(out, "--out")
        added = import_runs(out, import_table(files, backend, source))
    print_imported(added, "runs", json_out)


@calibrate_app.command("fit")
def fit_cmd(
    results: Annotated[list[str], typer.Argument(help="Results files (JSONL).")],
    cluster: ClusterOpt,
    output: Annotated[str, typer.Option("-o", "--output", help="Profile YAML to write.")],
    strict: Annotated[
        bool, typer.Option(help="Refuse (exit 2, nothing written) when the fit has warnings.")
    ] = False,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Fit the backend's model to measurements: under gloo per link tier its class (alpha,
    the share of the line rate a flow gets) and the per-call overhead, with 95% intervals
    by bootstrap and warnings where the fit is doubtful; under NCCL its per-step latencies
    per link class and its channels' bandwidth; and the compute rate."""
    from commsim.calibrate.fit import fit_profile
    from commsim.calibrate.records import read_results
    from commsim.cli.calibrate_tables import print_notes, print_profile
    from commsim.profile import profile_yaml
    from commsim.specs import SpecError

    with terminal.user_errors():
        check_output(output, "-o")
        spec = _cluster(cluster)
        profile = fit_profile(read_results(results), spec, source=", ".join(results)).profile
        if strict and profile.warnings:
            print_notes([], profile.warnings)
            n = len(profile.warnings)
            why = f"{n} warning{'s' if n > 1 else ''} and --strict: nothing written"
            raise SpecError(", ".join(results), "", why)
        write_atomic(output, profile_yaml(profile))
    if json_out:
        terminal.print_json(profile.model_dump() | {"profile_file": output})
        print_notes([], profile.warnings)
        return
    print_profile(profile, output)


@calibrate_app.command("validate")
def validate_cmd(
    results: Annotated[list[str], typer.Argument(help="Results files (JSONL).")],
    cluster: ClusterOpt,
    profile: Annotated[
        str | None, typer.Option(help="Profile YAML from `calibrate fit` (default: none).")
    ] = None,
    plot: Annotated[
        str | None, typer.Option(help="Draw measured vs predicted to this PNG.")
    ] = None,
    min_bytes: Annotated[
        str, typer.Option(help="Summarise collectives of at least this size, e.g. 1MiB.")
    ] = "0B",
    json_out: terminal.JsonOpt = False,
) -> None:
    """Predicted against measured for every point: with the profile carried over to the
    cluster, or without one the cluster as it is with the runs' backend."""
    from commsim.calibrate.hooks import hook_speedups
    from commsim.calibrate.records import read_results
    from commsim.calibrate.validate import validate
    from commsim.cli.calibrate_tables import hook_table, print_validation
    from commsim.cli.reliability_flags import naming
    from commsim.profile import load_profile
    from commsim.report.plots import plot_validation
    from commsim.units import parse_bytes

    with terminal.user_errors():
        check_output(plot, "--plot", image=True)
        with naming("min_bytes", min_bytes):
            floor = parse_bytes(min_bytes)
        spec = _cluster(cluster)
        prof = load_profile(profile) if profile else None
        measured = read_results(results)
        checked = validate(measured, spec, prof, min_bytes=floor, profile_source=profile or "")
        hooked = any(d.compression != "none" for r in measured.runs.values() for d in r.ddp)
        speedups = hook_speedups(measured, spec, prof) if hooked else []
        if plot:
            title = f"{spec.name}, {checked.backend}: measured vs predicted"
            plot_validation(checked, plot, title)
    if json_out:
        terminal.print_json(checked.to_dict() | {"hooks": [h.to_dict() for h in speedups]})
        return
    print_validation(checked, spec.name)
    if speedups:
        terminal.console.print(hook_table(speedups))
    if plot:
        terminal.console.print(f"plot written to {plot}")


@calibrate_app.command("apply")
def apply_cmd(
    profile: Annotated[str, typer.Argument(help="Profile YAML from `calibrate fit`.")],
    cluster: ClusterOpt,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Write the resulting cluster YAML.")
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Carry a profile's link classes over to a cluster built from the same classes: what
    was carried over, and (with -o) the cluster with it written in."""
    import yaml

    from commsim.cli.calibrate_tables import print_notes
    from commsim.profile import carry_over, load_profile

    with terminal.user_errors():
        check_output(output, "-o")
        spec = _cluster(cluster)
        applied, notes = carry_over(spec, load_profile(profile), profile)
        if output:
            doc = applied.model_dump(mode="json", exclude_defaults=True)  # with units
            write_atomic(output, yaml.safe_dump(doc, sort_keys=False))
    if json_out:
        doc = {"cluster": spec.name, "notes": notes, "spec": applied.model_dump()}
        terminal.print_json(doc | {"output": output})
        return
    print_notes(notes)
    if output:
        terminal.console.print(f"cluster written to {output}")


if __name__ == "__main__":
    calibrate_app()
