"""`commsim calibrate`: measure real runs, import nccl-tests logs, fit a profile, validate it.

Only `run` imports torch (the calibrate extra). Bad input (a malformed results line, an
nccl-tests log of another version or with errors, a profile for another cluster) prints
one line naming the file and line and exits 2; outputs are written to a temporary file
and renamed, so nothing already there is lost or half-overwritten.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from commsim.files import check_output, write_atomic
from commsim.report import terminal
from commsim.units import fmt_bytes, fmt_rate, fmt_time

if TYPE_CHECKING:
    from rich.table import Table

    from commsim.calibrate.hooks import HookRow
    from commsim.calibrate.validate import Validation
    from commsim.profile import Profile
    from commsim.specs import ClusterSpec

calibrate_app = typer.Typer(
    no_args_is_help=True,
    help="Measure torch.distributed on a real cluster, fit the model to it, check predictions.",
)


def _cluster(name: str) -> ClusterSpec:
    from commsim import catalog
    from commsim.specs import ClusterSpec, load_spec

    return load_spec(ClusterSpec, catalog.topology_path(name, name))


def _floats(text: str, flag: str) -> tuple[float, ...]:
    from commsim.specs import SpecError

    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(flag, "", f"expected numbers separated by commas, got {text!r}") from None


ClusterOpt = Annotated[str, typer.Option(help="Topology name or cluster YAML the run used.")]


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
        try:
            from commsim.calibrate.harness.config import HarnessConfig
            from commsim.calibrate.harness.launch import exit_now, launch_local, run_rank
        except ImportError as e:
            raise SpecError(
                "torch", "", f"not importable ({e}): pip install 'commsim[calibrate]'"
            ) from None
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
            check_output(out, "--out")
        code = launch_local(cfg, local) if local is not None else run_rank(cfg)
    if code:
        raise typer.Exit(code)
    if local is not None or os.environ.get("RANK") == "0":  # the rank that wrote
        terminal.err_console.print(f"results appended to {out}")
    if local is None:  # this process is a rank
        exit_now(0)


@calibrate_app.command("import-nccl-tests")
def import_cmd(
    logs: Annotated[list[str], typer.Argument(help="nccl-tests output files.")],
    out: Annotated[str, typer.Option(help="Results file (JSONL) to append to.")],
    op: Annotated[
        str | None, typer.Option(help="The collective, when neither log nor file name says.")
    ] = None,
) -> None:
    """Read nccl-tests logs (all_reduce_perf and siblings) into a results file."""
    from pathlib import Path

    from commsim.calibrate.ncclt import parse_log
    from commsim.calibrate.records import append_records, read_results, record_line
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
        path = Path(out)
        if path.exists():
            existing = read_results(path) if path.read_text().strip() else None
            known = set(existing.runs) if existing else set()
            again = [m for m in metas if m["run"] in known]
            if again:
                raise SpecError(
                    again[0]["file"], "", f"already imported into {out} (run {again[0]['run']})"
                )
            append_records(path, records)
        else:
            write_atomic(path, "".join(record_line(r) for r in records))
    points = len(records) - len(metas)
    terminal.err_console.print(f"{points} measurements of {len(metas)} tests appended to {out}")


def _tier_rows(profile: Profile) -> list[list[str]]:
    rows = []
    for tier, f in profile.tiers.items():
        a_ci = (
            f"{fmt_time(f.alpha_ci_s[0])} .. {fmt_time(f.alpha_ci_s[1])}" if f.alpha_ci_s else "-"
        )
        if f.bandwidth_ci_Bps:
            lo, hi = f.bandwidth_ci_Bps
            b_ci = f"{fmt_rate(lo)} .. {fmt_rate(hi) if hi != float('inf') else 'unbounded'}"
        else:
            b_ci = "-"
        rows.append(
            [tier, fmt_time(f.alpha_s), a_ci, fmt_rate(f.bandwidth_Bps), b_ci, str(f.points)]
        )
    return rows


def _nccl_table(cluster: str, profile: Profile):
    """An NCCL fit: each parameter, its value and 95% interval, or NCCL's own kept."""
    from rich.table import Table

    fit = profile.nccl
    table = Table(title=f"{cluster}: NCCL {fit.version}'s model fitted", title_justify="left")
    for col in ("parameter", "value", "95% interval"):
        table.add_column(col, justify="left" if col == "parameter" else "right")
    for cls, value in fit.latency_scale.items():
        lo, hi = fit.latency_scale_ci.get(cls, (value, value))
        table.add_row(f"latency_scale.{cls} (x NCCL's)", f"{value:.3f}", f"{lo:.3f} .. {hi:.3f}")
    for side in ("intra", "inter"):
        value = getattr(fit, f"channel_bandwidth_{side}_Bps")
        if value is not None:
            lo, hi = getattr(fit, f"channel_bandwidth_{side}_ci_Bps") or (value, value)
            table.add_row(
                f"channel_bandwidth_{side}", fmt_rate(value), f"{fmt_rate(lo)} .. {fmt_rate(hi)}"
            )
    for name in fit.not_fitted:
        table.add_row(name, "NCCL's own", "-")
    return table


@calibrate_app.command("fit")
def fit_cmd(
    results: Annotated[list[str], typer.Argument(help="Results files (JSONL).")],
    cluster: ClusterOpt,
    output: Annotated[str, typer.Option("-o", "--output", help="Profile YAML to write.")],
    json_out: terminal.JsonOpt = False,
) -> None:
    """Fit the backend's model to measurements: under NCCL its per-step latencies per link
    class and its channels' bandwidth; under gloo alpha and bandwidth per link tier; and
    the compute rate."""
    from rich.table import Table

    from commsim.calibrate.fit import fit_profile
    from commsim.calibrate.records import read_results
    from commsim.profile import profile_yaml

    with terminal.user_errors():
        check_output(output, "-o")
        spec = _cluster(cluster)
        fitted = fit_profile(read_results(results), spec, source=", ".join(results))
        write_atomic(output, profile_yaml(fitted.profile))
    profile = fitted.profile
    if json_out:
        terminal.print_json(profile.model_dump() | {"profile_file": output})
        return
    if profile.nccl is not None:
        terminal.console.print(_nccl_table(spec.name, profile))
    else:
        table = Table(
            title=f"{spec.name}, {profile.backend}: fitted link tiers", title_justify="left"
        )
        for col in ("tier", "alpha", "95% interval", "bandwidth", "95% interval", "points"):
            table.add_column(col, justify="left" if col == "tier" else "right")
        for row in _tier_rows(profile):
            table.add_row(*row)
        terminal.console.print(table)
    if profile.compute:
        c = profile.compute
        terminal.console.print(
            f"compute: {c.flops_per_s / 1e9:.3g} GFLOP/s per rank ({c.model}), "
            f"{100 * c.efficiency:.1f}% of the {c.gpu} peak"
        )
    rms = profile.provenance.rms_rel_error or 0.0
    terminal.console.print(
        f"{profile.provenance.points} points, rms relative error {100 * rms:.1f}%; "
        f"profile written to {output}"
    )
    for note in profile.notes:
        terminal.console.print(f"note: {note}", highlight=False)


@calibrate_app.command("validate")
def validate_cmd(
    results: Annotated[list[str], typer.Argument(help="Results files (JSONL).")],
    profile: Annotated[str, typer.Option(help="Profile YAML from `calibrate fit`.")],
    cluster: ClusterOpt,
    plot: Annotated[
        str | None, typer.Option(help="Draw measured vs predicted to this PNG.")
    ] = None,
    min_bytes: Annotated[
        str, typer.Option(help="Summarise collectives of at least this size, e.g. 1MiB.")
    ] = "0B",
    json_out: terminal.JsonOpt = False,
) -> None:
    """Predicted against measured for every point, with the profile applied to the cluster."""

    from commsim.calibrate.hooks import hook_speedups
    from commsim.calibrate.records import read_results
    from commsim.calibrate.validate import validate
    from commsim.profile import load_profile
    from commsim.report.plots import plot_validation
    from commsim.units import parse_bytes

    with terminal.user_errors():
        check_output(plot, "--plot", image=True)
        spec = _cluster(cluster)
        prof = load_profile(profile)
        measured = read_results(results)
        checked = validate(
            measured,
            spec,
            prof,
            min_bytes=parse_bytes(min_bytes),
            profile_source=profile,
        )
        hooked = any(d.compression != "none" for r in measured.runs.values() for d in r.ddp)
        speedups = hook_speedups(measured, spec, prof) if hooked else []
        if plot:
            plot_validation(checked, plot, f"{spec.name}, {prof.backend}: measured vs predicted")
    if json_out:
        terminal.print_json(checked.to_dict() | {"hooks": [h.to_dict() for h in speedups]})
        return
    terminal.console.print(_validation_table(checked, spec.name))
    for kind, label in (("collective", "collectives"), ("ddp-step", "DDP step time")):
        s = checked.summary(kind)
        if s["points"]:
            floor = f" of {fmt_bytes(checked.min_bytes)} and more" if kind == "collective" else ""
            terminal.console.print(
                f"{label}{floor}: median |error| {s['median_abs_pct_error']:.1f}%, worst "
                f"{s['max_abs_pct_error']:.1f}% over {s['points']} points"
            )
    if speedups:
        terminal.console.print(_hook_table(speedups))
    if plot:
        terminal.console.print(f"plot written to {plot}")


def _validation_table(checked: Validation, cluster: str) -> Table:
    """Every point: what, ranks, span, size, measured, predicted, error."""
    from rich.table import Table

    table = Table(title=f"{cluster}: predicted vs measured", title_justify="left")
    for col in ("what", "ranks", "span", "size", "measured", "predicted", "error"):
        table.add_column(col, justify="left" if col in ("what", "span") else "right")
    for r in checked.rows:
        size = fmt_bytes(r.bytes) if r.bytes else f"{r.bucket_mb:g} MiB buckets"
        what = r.op if r.kind == "collective" else f"{r.op} {r.kind.removeprefix('ddp-')}"
        table.add_row(
            what,
            str(r.group_size),
            r.span,
            size,
            fmt_time(r.measured_s),
            fmt_time(r.predicted_s),
            f"{100 * r.error:+.1f}%",
        )
    return table


def _hook_table(rows: list[HookRow]) -> Table:
    """Each comm hook's step and speedup over plain DDP of the same bucket cap."""
    from rich.table import Table

    table = Table(title="DDP comm hooks: speedup over plain all-reduce", title_justify="left")
    cols = ("run", "buckets", "hook", "measured", "speedup", "predicted", "speedup", "error")
    for col in cols:  # the hook's name on one line, whatever the page's width
        table.add_column(col, justify="left" if col in ("run", "hook") else "right", no_wrap=True)
    for h in rows:
        hook = h.compression + (" + EF" if h.error_feedback else "")
        table.add_row(
            h.run,
            f"{h.bucket_mb:g} MiB",
            hook + ("" if h.overlap else " (no overlap)"),
            fmt_time(h.measured_step_s),
            f"{h.measured_speedup:.2f}x",
            fmt_time(h.predicted_step_s),
            f"{h.predicted_speedup:.2f}x",
            f"{100 * h.error:+.1f}%",
        )
    return table


if __name__ == "__main__":
    calibrate_app()
