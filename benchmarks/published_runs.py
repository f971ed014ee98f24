"""Predicted against published measured large-model training runs (issues 3 and 10).

Each run of benchmarks/published_runs.yaml (a source's model, GPU count, cluster, batch and
parallel layout, and the throughput it reports) becomes a commsim Scenario; the step model
(commsim.step.model, through commsim.step.predict) predicts its step, and the table sets the
prediction beside the reported figure, like for like:

  counts: hardware  the source's TFLOP/s per GPU count the recomputed forward (Megatron's
                    96 B s l h^2 (...) with full recomputation); compared with commsim's
                    tflops_per_gpu, which counts recomputation the same way
  counts: model     the source reports MFU (no recomputation counted) or model TFLOP/s per
                    GPU in commsim's FLOP count; compared with commsim's MFU x the GPU's peak
  counts: tokens    the source reports training tokens per second per GPU; compared with
                    commsim's tokens_per_s / gpus (no FLOP convention involved)

Compute comes from commsim's roofline (commsim.step.compute: GEMMs at the GPU's measured
best matmul rate with tile and wave quantization, FlashAttention at its measured rate,
element-wise work at HBM bandwidth), the default for every catalog GPU: no free parameter.
The YAML's compute_efficiency (null: the roofline) or `--efficiency E` replaces it with
FLOPs at one fraction of peak, for a sensitivity run; `--scan` prints the single value that
would minimise the median error, to show how much of the error a uniform offset explains.

Rows that use a strategy field the installed commsim does not have yet (cp, precision,
flash_attention, tp_overlap, fsdp_shard: the compute-model rework adds them) run when the
field's value is what commsim already prices (cp 1, bf16, no FlashAttention, no TP overlap,
no hybrid sharding: the field is dropped) and are otherwise skipped and listed with the
reason, as are rows whose layout the installed commsim refuses; they are priced once it
accepts them.

    .venv/bin/python benchmarks/published_runs.py            # text table
    .venv/bin/python benchmarks/published_runs.py --markdown # the RESULTS.md table
    .venv/bin/python benchmarks/published_runs.py --scan     # + best single efficiency
    .venv/bin/python benchmarks/published_runs.py --implied  # + each row's matching one
    .venv/bin/python benchmarks/published_runs.py --formulas # + each source's FLOPs / token

Every run also prints a sensitivity: rows whose virtual-stage count the source does not
state, again with `alt_interleave`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from commsim.report.labels import layout_label
from commsim.scenario import Setup, resolve
from commsim.spec_io import parse_spec
from commsim.specs import Scenario, SpecError, Strategy
from commsim.step.predict import predict
from commsim.step.prediction import Prediction

HERE = Path(__file__).resolve().parent
DATA = HERE / "published_runs.yaml"
FAR_OFF = 15.0  # % error beyond which the analysis calls a row far off

# Strategy fields the compute-model rework adds, and the value each has in what the installed
# commsim prices when it lacks the field: one context-parallel rank, BF16 GEMMs, attention
# that keeps the s x s scores, TP collectives not overlapped, ZeRO-3 over all dp ranks,
# element-wise work split over tp (sequence parallelism), no per-micro-batch gradient add.
PENDING_FIELDS: dict[str, Any] = {
    "cp": 1,
    "precision": "bf16",
    "flash_attention": False,
    "tp_overlap": False,
    "fsdp_shard": None,
    "sequence_parallel": True,
    "grad_accumulation": "fused",
}
UNITS = {"hardware": "TFLOP/s", "model": "TFLOP/s", "tokens": "tokens/s"}


class Skipped(Exception):
    """A run the installed commsim cannot price yet; the message says why."""


@dataclass(frozen=True)
class Row:
    """One run compared: the reported figure and commsim's, in the same counting."""

    id: str
    source: str
    gpus: int
    gpu: str
    layout: str
    counts: str  # "hardware" (recompute counted), "model" or "tokens"
    reported: float  # per GPU, in `counts`' unit (UNITS)
    predicted: float  # per GPU, in `counts`' unit
    hardware_tflops: float  # commsim's, recomputation counted
    mfu: float  # commsim's
    tokens_per_gpu: float  # commsim's tokens per second per GPU
    step_s: float
    parts: dict[str, float]
    memory_gb: float
    fits: bool
    assumed: tuple[str, ...]
    pp: int
    zero: int

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.reported) / self.reported

    @property
    def unit(self) -> str:
        return UNITS[self.counts]


def load(path: Path = DATA) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def _cluster(name: str) -> str:
    """A built-in topology name, or a YAML file next to the data file."""
    local = HERE / name
    return str(local) if local.suffix in (".yaml", ".yml") else name


def known_strategy(strategy: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The strategy without the pending fields the installed Strategy lacks: dropped where
    their value is what commsim prices anyway, a Skipped naming the field otherwise."""
    out = {}
    for key, value in strategy.items():
        if key in PENDING_FIELDS and key not in Strategy.model_fields:
            if value != PENDING_FIELDS[key]:
                raise Skipped(
                    f"strategy.{key} = {value!r}: not a field of the installed "
                    "commsim.specs.Strategy yet"
                )
            continue
        out[key] = value
    return out


def scenario(
    run: dict[str, Any],
    data: dict[str, Any],
    efficiency: float | None,
    strategy_overrides: dict[str, Any] | None = None,
) -> Scenario:
    """The commsim Scenario of one published run (its framework's gradient handling, then
    its layout, then any overrides a sensitivity run makes)."""
    d = data.get("defaults", {})
    strategy = (
        {"algorithm": d.get("algorithm", "ring"), "placement": d.get("placement", "blocked")}
        | data["frameworks"][run["framework"]]
        | run["strategy"]
        | (strategy_overrides or {})
    )
    model = {"name": run["model"]} | (data["models"][run["model"]] or {})
    return parse_spec(
        Scenario,
        {
            "name": run["id"],
            "description": run["source"],
            "model": model,
            "cluster": _cluster(run["cluster"]),
            "gpus": run["gpus"],
            "global_batch": run["global_batch"],
            "micro_batch": run["micro_batch"],
            "seq_len": run.get("seq_len", d.get("seq_len")),
            "compute_efficiency": efficiency or data["compute_efficiency"],
            "strategy": known_strategy(strategy, run["id"]),
        },
        f"{DATA.name}: {run['id']}",
    )


def setup_of(
    run: dict[str, Any],
    data: dict[str, Any],
    efficiency: float | None,
    strategy_overrides: dict[str, Any] | None = None,
) -> Setup:
    """Resolve a run (its layout checked as `commsim predict` checks one); a layout the
    installed commsim refuses is Skipped with its one-line reason."""
    try:
        s = scenario(run, data, efficiency, strategy_overrides)
        return resolve(s, s.name)
    except SpecError as e:
        raise Skipped(str(e).removeprefix(f"{run['id']}: ")) from None


def layout(s: Strategy, dp: int, micro_batch: int, micro_batches: int) -> str:
    """The layout as commsim's tables label it, with the micro-batch count and recompute."""
    doc = {"strategy": s.model_dump(), "layout": {"dp": dp, "micro_batch": micro_batch}}
    label = f"{layout_label(doc)}x{micro_batches} {s.recompute}"
    return label.replace(f" {s.recompute[:3]} ", " ", 1) if s.recompute != "none" else label


def compare(
    run: dict[str, Any],
    data: dict[str, Any],
    efficiency: float | None = None,
    strategy_overrides: dict[str, Any] | None = None,
) -> Row:
    setup = setup_of(run, data, efficiency, strategy_overrides)
    p = predict(setup, setup.scenario.strategy)
    return _row(run, setup, p)


def _figures(run: dict[str, Any], setup: Setup, p: Prediction) -> tuple[float, float]:
    """(reported, predicted) per GPU in the unit the run's `counts` names."""
    peak = setup.gpu.peak_flops / 1e12
    rep = run["reported"]
    counts = rep["counts"]
    if counts == "hardware":
        return rep["tflops_per_gpu"], p.tflops_per_gpu
    if counts == "model":
        reported = rep["mfu"] * peak if "mfu" in rep else rep["model_tflops_per_gpu"]
        return reported, p.mfu * peak
    if counts == "tokens":
        return rep["tokens_per_s_per_gpu"], (p.tokens_per_s or 0.0) / setup.n_gpus
    raise ValueError(f"{run['id']}: reported.counts must be hardware, model or tokens")


def _row(run: dict[str, Any], setup: Setup, p: Prediction) -> Row:
    reported, predicted = _figures(run, setup, p)
    lay = p.layout or {}
    return Row(
        id=run["id"],
        source=run["source"],
        gpus=run["gpus"],
        gpu=setup.gpu.name,
        layout=layout(p.strategy, lay["dp"], lay["micro_batch"], lay["micro_batches"]),
        counts=run["reported"]["counts"],
        reported=float(reported),
        predicted=float(predicted),
        hardware_tflops=p.tflops_per_gpu,
        mfu=p.mfu,
        tokens_per_gpu=(p.tokens_per_s or 0.0) / setup.n_gpus,
        step_s=p.step_time_s,
        parts=dict(p.parts),
        memory_gb=p.memory.total / 1e9,
        fits=p.fits,
        assumed=tuple(run.get("assumed", ())),
        pp=p.strategy.pp,
        zero=p.strategy.zero,
    )


def compare_all(
    data: dict[str, Any], efficiency: float | None = None
) -> tuple[list[Row], dict[str, str]]:
    """Every run the installed commsim can price, and the others: id -> why not."""
    rows, skipped = [], {}
    for run in data["runs"]:
        try:
            rows.append(compare(run, data, efficiency))
        except Skipped as e:
            skipped[run["id"]] = str(e)
    return rows, skipped


def summary(rows: list[Row]) -> tuple[float, Row]:
    """Median absolute error (%) and the worst row."""
    errors = [abs(r.error_pct) for r in rows]
    worst = max(rows, key=lambda r: abs(r.error_pct))
    return statistics.median(errors), worst


def subsets(rows: list[Row]) -> dict[str, list[Row]]:
    """The row families the analysis talks about (empty ones left out)."""
    families = {
        "all rows": rows,
        "without DeepSpeed's 2021 ZeRO-3 rows": [r for r in rows if "-zero3-" not in r.id],
        "Megatron PTD-P with pp > 1 (Narayanan Tables 1-2)": [
            r for r in rows if r.id.startswith("sc21") and r.pp > 1
        ],
        "H100-era rows (Hopper)": [r for r in rows if r.gpu.startswith(("h100", "h200", "h800"))],
    }
    return {name: sub for name, sub in families.items() if sub}


def summary_lines(rows: list[Row]) -> list[str]:
    out = []
    for name, sub in subsets(rows).items():
        med, worst = summary(sub)
        out.append(
            f"{name} ({len(sub)}): median |error| {med:.1f}%, worst {worst.error_pct:+.1f}%"
            f" ({worst.id})"
        )
    return out


def best_single_efficiency(data: dict[str, Any]) -> tuple[float, float, float]:
    """The one compute_efficiency (0.40-0.80 by 0.01) with the least median |error|:
    (efficiency, median, worst). A diagnostic, not what the table uses."""
    best = None
    for e in [x / 100 for x in range(40, 81)]:
        med, worst = summary(compare_all(data, e)[0])
        if best is None or med < best[1]:
            best = (e, med, abs(worst.error_pct))
    assert best is not None
    return best


def implied_efficiency(run: dict[str, Any], data: dict[str, Any]) -> float:
    """The compute_efficiency at which commsim would match this row (bisection; predicted
    throughput rises with efficiency). A diagnostic of what the one value misses per row,
    never fed back into the table."""
    base = setup_of(run, data, None)

    def predicted(e: float) -> float:
        s = dataclasses.replace(
            base, scenario=base.scenario.model_copy(update={"compute_efficiency": e})
        )
        return _row(run, s, predict(s, s.scenario.strategy)).predicted

    reported = _row(run, base, predict(base, base.scenario.strategy)).reported
    lo, hi = 0.05, 1.0
    if predicted(hi) < reported:
        return float("nan")  # unreachable even at peak
    for _ in range(20):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if predicted(mid) < reported else (lo, mid)
    return 0.5 * (lo + hi)


def flop_ratios(data: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    """For runs that report both tokens/s and model TFLOP/s per GPU: (id, the source's FLOPs
    per token, commsim's, their ratio). 1.00 means the source counts FLOPs as commsim does
    (full attention); below 1, it counts less (a causal discount, say). Needs no layout, so
    it covers skipped rows too."""
    from commsim.workload.presets import build_workload

    out = []
    for run in data["runs"]:
        rep = run["reported"]
        if "model_tflops_per_gpu" not in rep or "tokens_per_s_per_gpu" not in rep:
            continue
        model = {"name": run["model"]} | (data["models"][run["model"]] or {})
        spec = parse_spec(
            Scenario, {"model": model, "cluster": "x", "gpus": 1, "global_batch": 1}, run["id"]
        ).model
        seq = run.get("seq_len", data.get("defaults", {}).get("seq_len"))
        workload = build_workload(spec, seq, run["id"])
        ours = workload.train_flops / seq
        theirs = rep["model_tflops_per_gpu"] * 1e12 / rep["tokens_per_s_per_gpu"]
        out.append((run["id"], theirs, ours, theirs / ours))
    return out


def interleave_sensitivity(data: dict[str, Any]) -> list[tuple[Row, Row]]:
    """Rows whose virtual-stage count the source does not state, predicted again with the
    `alt_interleave` the YAML names: (as in the table, alternative)."""
    pairs = []
    for run in data["runs"]:
        if "alt_interleave" in run:
            try:
                alt = compare(run, data, strategy_overrides={"interleave": run["alt_interleave"]})
                pairs.append((compare(run, data), alt))
            except Skipped:
                continue
    return pairs


def _share(r: Row, key: str) -> float:
    return 100.0 * r.parts.get(key, 0.0) / r.step_s


def breakdown(r: Row) -> dict[str, float]:
    """Where the predicted step goes, % of the step."""
    compute = r.parts["compute_s"] - r.parts["optimizer_s"]
    return {
        "compute": 100.0 * compute / r.step_s,
        "bubble": _share(r, "bubble_s"),
        "tp": _share(r, "tp_comm_s"),
        "pp": _share(r, "pp_comm_s"),
        "dp": _share(r, "dp_exposed_s"),
        "opt": _share(r, "optimizer_s"),
    }


def _flags(r: Row) -> str:
    marks = []
    if r.assumed:
        marks.append("assumed " + ", ".join(r.assumed))
    if not r.fits:
        marks.append("memory model says it does not fit")
    return "; ".join(marks)


def _kind(r: Row) -> str:
    return {"hardware": "HW TF/s", "model": "model TF/s", "tokens": "tok/s"}[r.counts]


def text_table(rows: list[Row], efficiency: float) -> str:
    out = [
        ("compute: the roofline" if efficiency is None else f"compute_efficiency = {efficiency:g}")
        + " for every row; error = (predicted - reported)"
        " / reported, in the unit the source reports (per GPU)",
        f"{'run':<32} {'GPUs':>5}  {'layout':<40} {'kind':<10} {'reported':>9} "
        f"{'predicted':>9} {'HW TF/s':>7} {'MFU':>6} {'error':>7}  step  split of the "
        "predicted step (%): compute/bubble/tp/pp/dp/opt",
    ]
    for r in rows:
        b = breakdown(r)
        split = "/".join(f"{b[k]:.0f}" for k in ("compute", "bubble", "tp", "pp", "dp", "opt"))
        out.append(
            f"{r.id:<32} {r.gpus:>5}  {r.layout:<40} {_kind(r):<10} {r.reported:>9.1f} "
            f"{r.predicted:>9.1f} {r.hardware_tflops:>7.1f} {r.mfu:>6.1%} "
            f"{r.error_pct:>+6.1f}%  {r.step_s:6.2f}s  {split}"
            + (f"   [{_flags(r)}]" if _flags(r) else "")
        )
    return "\n".join(out + summary_lines(rows))


def markdown_table(rows: list[Row], implied: list[float]) -> str:
    out = [
        "| run | GPUs | layout | reported | predicted | predicted HW TFLOP/s "
        "| predicted MFU | error | predicted step: compute / bubble / tp / pp / dp / opt % "
        "| efficiency that would match |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r, e in zip(rows, implied, strict=True):
        b = breakdown(r)
        split = " / ".join(f"{b[k]:.0f}" for k in ("compute", "bubble", "tp", "pp", "dp", "opt"))
        mark = "*" if r.assumed else ""
        out.append(
            f"| {r.id}{mark} | {r.gpus:,} | {r.layout} | {r.reported:,.1f} ({_kind(r)}) "
            f"| {r.predicted:,.1f} | {r.hardware_tflops:.1f} | {r.mfu:.1%} "
            f"| {r.error_pct:+.1f}% | {split} | {e:.2f} |"
        )
    return "\n".join(out)


def skipped_lines(skipped: dict[str, str]) -> list[str]:
    if not skipped:
        return []
    head = (
        f"not priced by the installed commsim ({len(skipped)} rows; priced once it accepts "
        "their fields and layouts):"
    )
    return [head] + [f"  {rid:<32} {why}" for rid, why in skipped.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--efficiency", type=float, help="override compute_efficiency (sensitivity)")
    ap.add_argument("--markdown", action="store_true", help="print the RESULTS.md table")
    ap.add_argument("--scan", action="store_true", help="also find the best single efficiency")
    ap.add_argument(
        "--implied", action="store_true", help="also the efficiency at which each row matches"
    )
    ap.add_argument(
        "--formulas", action="store_true", help="also each source's FLOPs per token vs commsim's"
    )
    ap.add_argument("--json", action="store_true", help="rows as JSON")
    args = ap.parse_args(argv)
    data = load(args.data)
    efficiency = args.efficiency or data["compute_efficiency"]
    rows, skipped = compare_all(data, args.efficiency)
    priced = {r.id for r in rows}
    if args.json:
        doc = {
            "rows": [
                r.__dict__ | {"error_pct": r.error_pct, "unit": r.unit, "breakdown": breakdown(r)}
                for r in rows
            ],
            "skipped": skipped,
        }
        print(json.dumps(doc, indent=1))
        return 0
    if args.markdown:
        runs = [run for run in data["runs"] if run["id"] in priced]
        print(markdown_table(rows, [implied_efficiency(run, data) for run in runs]))
        print("\n" + "\n".join(summary_lines(rows)))
    else:
        print(text_table(rows, efficiency))
    far = [r for r in rows if abs(r.error_pct) > FAR_OFF]
    if far:
        print(
            f"far off (> {FAR_OFF:.0f}%): " + ", ".join(f"{r.id} {r.error_pct:+.0f}%" for r in far)
        )
    print("\n".join(skipped_lines(skipped)))
    pairs = interleave_sensitivity(data)
    if pairs:
        print("virtual stages not stated (table: v = 1); with the alternative v:")
        for base, alt in pairs:
            print(
                f"  {base.id:<24} v1 {base.predicted:6.1f} ({base.error_pct:+.1f}%)"
                f"  ->  {alt.layout.split()[3]} {alt.predicted:6.1f} ({alt.error_pct:+.1f}%)"
            )
    if args.formulas:
        print("each source's model FLOPs per token against commsim's (full attention):")
        for rid, theirs, ours, ratio in flop_ratios(data):
            print(f"  {rid:<32} {theirs / 1e9:9.2f} GFLOP  commsim {ours / 1e9:9.2f}  x{ratio:.3f}")
    if args.implied:
        print("compute_efficiency at which each row would match (diagnostic, not used):")
        for run in data["runs"]:
            if run["id"] in priced:
                print(f"  {run['id']:<32} {implied_efficiency(run, data):.3f}")
    if args.scan:
        e, med, worst = best_single_efficiency(data)
        print(
            f"best single compute_efficiency {e:.2f}: median |error| {med:.1f}%, worst {worst:.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
