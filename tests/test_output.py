"""Issue 14's output: tables that fit 120 columns (or COLUMNS), titles that say what ran, the
batch arithmetic, plan's merged rows and counts, --help, --version, the HTML report and CSV,
Megatron's flag names, --deepspeed, and plots a reader can read."""

from __future__ import annotations

import base64
import csv
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commsim.cli.app import app
from commsim.report import ranking
from commsim.report.arithmetic import batch_arithmetic, stage_blocks
from commsim.report.sweeps import coinciding
from commsim.scenario import load_scenario, resolve
from commsim.specs import Strategy
from commsim.units import fmt_duration, fmt_time

GPT3 = [
    "--model",
    "gpt3-175b",
    "--cluster",
    "dgx-a100-ib",
    "--gpus",
    "1024",
    "--global-batch",
    "1536",
    "--micro-batch",
    "1",
    "--seq-len",
    "2048",
    "--tp",
    "8",
    "--pp",
    "16",
    "--interleave",
    "2",
    "--recompute",
    "selective",
]


def run(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def cli(*args: str, columns: str | None = None) -> str:
    """The command's stdout when piped, as a user's shell runs it."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env |= {"COLUMNS": columns} if columns else {}
    cmd = [sys.executable, "-m", "commsim.cli", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _width(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


@pytest.mark.parametrize(
    "args",
    [
        ("predict", *GPT3),
        ("plan", "--top", "15"),
        ("collective", "all-reduce", "--gpus", "64", "--sizes", "1MiB:4GiB"),
    ],
)
def test_tables_fit_120_columns_without_cutting_a_word(args):
    text = run(*args).output
    assert _width(text) <= 120 and "…" not in text


def test_piped_output_honours_columns():
    wide = cli("plan", "--top", "3", columns="200")
    narrow = cli("plan", "--top", "3")
    assert _width(narrow) <= 120 < _width(wide) <= 200  # the story line fills the page


def test_plan_rows_never_wrap():
    text = run("plan", "--top", "8").output
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert len(body) == 8  # one line a row
    assert "every row: " in text and "algorithm ring" in text


def test_zero3_shows_no_ddp_bucket():
    # ZeRO-3 gathers and reduce-scatters per unit: the 25 MiB default bucket is never used
    from commsim.report.labels import describe_strategy

    z3 = Strategy(zero=3, tp=1).model_dump()
    assert "per unit" in describe_strategy(z3) and "MiB" not in describe_strategy(z3)
    assert "25 MiB" in describe_strategy(Strategy(zero=1).model_dump())
    layout = {"dp": 8, "micro_batch": 1, "micro_batches": 1}
    figures = {"step_time_s": 1.0, "exposed_comm_s": 0.1, "comm_s": 0.2, "mfu": 0.4}
    row = {"strategy": z3, "layout": layout, "memory": {"total_bytes": 1e9}} | figures
    assert ranking.merge_rows([row])[0]["shown"]["bucket MiB"] == "-"


def test_merge_rows_by_hand():
    def doc(alg, bucket, step):
        strategy = Strategy(algorithm=alg, bucket_mb=bucket, zero=1).model_dump()
        layout = {"dp": 8, "micro_batch": 1, "micro_batches": 2}
        figures = {"step_time_s": step, "exposed_comm_s": 0.1, "comm_s": 0.2, "mfu": 0.4}
        return {"strategy": strategy, "layout": layout, "memory": {"total_bytes": 1e9}} | figures

    rows = ranking.merge_rows([doc("ring", 25, 1.0), doc("tree", 25, 1.0), doc("ring", 200, 1.5)])
    assert [r["merged"] for r in rows] == [2, 1]
    assert rows[0]["shown"]["algorithm"] == "ring|tree" and rows[0]["shown"]["bucket MiB"] == "25"
    story = ranking.plan_story(100, 60, 50, 1, 2)
    assert story == (
        "100 layouts searched, 40 do not fit in GPU memory, 10 cannot run their algorithm on "
        "their groups; 50 ranked, 1 of them merged into rows with the very same figures; "
        "the best 2 shown"
    )


def test_rows_apart_in_a_layout_field_are_never_merged():
    """Rows merge only when they differ in the settings the table lists as alternatives
    (algorithm, bucket, overlap, placement, compression): a rank order, context parallelism,
    hybrid sharding, precision, TP overlap or FlashAttention keeps them apart even when the
    figures agree."""
    layout = {"dp": 4, "micro_batch": 1, "micro_batches": 2}
    figures = {"step_time_s": 1.0, "exposed_comm_s": 0.1, "comm_s": 0.2, "mfu": 0.4}

    def doc(**fields):
        strategy = Strategy(tp=2, pp=2, zero=3, **fields).model_dump()
        return {"strategy": strategy, "layout": layout, "memory": {"total_bytes": 1e9}} | figures

    base = doc()
    for other in (
        doc(order="tp-cp-ep-pp-dp"),
        doc(fsdp_shard=2),
        doc(precision="fp8"),
        doc(tp_overlap=True),
        doc(flash_attention=False),
        doc(cp=2),
    ):
        assert [r["merged"] for r in ranking.merge_rows([base, other])] == [1, 1], other
    assert [r["merged"] for r in ranking.merge_rows([base, doc(bucket_mb=200)])] == [2]
    rows = ranking.merge_rows([base, doc(tp_overlap=True)])
    table, same = ranking.plan_table("t", rows, 2)
    assert "tp overlap" in [c.header for c in table.columns]  # the rows say how they differ


def test_one_gpu_is_not_gpus():
    from commsim.units import fmt_gpus

    assert [fmt_gpus(n) for n in (1, 2, 1024)] == ["1 GPU", "2 GPUs", "1,024 GPUs"]
    text = run("predict", "--gpus", "1", "--global-batch", "8").output
    assert text.startswith("gpt2-xl on 1 GPU of aws-p4d")


def test_titles_say_what_ran():
    text = run("predict", *GPT3).output
    assert text.startswith("gpt3-175b on 1,024 GPUs of dgx-a100-ib (a100-80gb)")
    assert "gpt2-xl" not in text
    doc = json.loads(run("predict", *GPT3, "--json").stdout)
    assert doc["scenario"].endswith(
        "(changed: cluster, global_batch, gpus, interleave, "
        "micro_batch, model, pp, recompute, seq_len, tp)"
    )


def test_predict_shows_the_batch_arithmetic():
    text = run("predict", *GPT3).output
    assert "= dp 8 x micro-batch 1 x 192 micro-batches per step" in text
    assert "= dp 8 x tp 8 x pp 16" in text
    assert "encode/decode" not in text and "expert-parallel" not in text  # none here
    plain = run("predict").output
    assert "encode/decode" not in plain and "layers per GPU" in plain


def test_stage_layers_and_parameters_add_up():
    """Independent sums: every block on exactly one rank, every parameter counted once."""
    spec, source = load_scenario(
        None,
        {
            "model": "gpt3-175b",
            "gpus": 1024,
            "tp": 8,
            "pp": 16,
            "interleave": 2,
            "cluster": "dgx-a100-ib",
            "global_batch": 1536,
            "micro_batch": 1,
        },
    )
    setup = resolve(spec, source)
    ranks = stage_blocks(96, spec.strategy)
    assert ranks[0][:4] == [0, 1, 2, 48]  # chunks of 3, rank 0 holds chunks 0 and 16
    assert sorted(b for r in ranks for b in r) == list(range(96))
    doc = batch_arithmetic(setup, spec.strategy)
    assert doc["dp"] * doc["micro_batch"] * doc["micro_batches"] == 1536
    assert doc["stage_layers"] == [6] * 16
    assert sum(doc["stage_params"]) == setup.workload.params
    uneven = spec.strategy.model_copy(
        update={"interleave": 1, "first_stage_layers": 5, "last_stage_layers": 1}
    )
    assert [len(r) for r in stage_blocks(96, uneven)] == [5, *[6] * 14, 1]


def test_times_read_sensibly():
    assert fmt_time(1.11e-16) == "< 1 ns" and fmt_time(0) == "0"
    assert fmt_time(2.5e-9) == "2.5 ns" and fmt_time(0.0123) == "12.3 ms"
    assert fmt_duration(5 * 3600) == "5 h" and fmt_duration(41.3 * 86400) == "41.3 days"
    assert fmt_duration(12345.6 * 86400) == "12,346 days"
    # past a million of the unit: 3 digits, not a 296-digit number a table cuts off with ...
    assert fmt_duration(1e300) == "1.16e+295 days"
    # goodput's columns: 2 fixed decimals (what failures add shows), the same function
    from commsim.report.goodput import _duration

    assert [_duration(x * 86400) for x in (10.72, 10.7, 1e300 / 86400)] == [
        "10.72 d",
        "10.70 d",
        "1.16e+295 d",
    ]
    assert (_duration(None), _duration(0), _duration(2810.0)) == ("", "0", "46.83 min")


def test_help_lists_every_accepted_value():
    from typing import get_args

    from commsim.planner.sizing import OBJECTIVES
    from commsim.specs import Algorithm, Placement

    def words(*args):  # the help without its box and line breaks
        return "".join(c for c in run(*args).output if c not in " \n│")

    plan_help = words("plan", "--help")
    for value in (*OBJECTIVES, *get_args(Placement)):
        assert value in plan_help
    predict_help = words("predict", "--help")
    for value in (*get_args(Algorithm), "selective", "full", "--tensor-model-parallel-size"):
        assert value in predict_help


def test_version():
    from commsim import __version__

    assert run("--version").output == f"commsim {__version__}\n"


def test_megatron_flag_names_are_the_same_flags():
    short = json.loads(run("predict", *GPT3, "--json").stdout)
    long = [
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-ib",
        "--gpus",
        "1024",
        "--global-batch-size",
        "1536",
        "--micro-batch-size",
        "1",
        "--seq-length",
        "2048",
        "--tensor-model-parallel-size",
        "8",
        "--pipeline-model-parallel-size",
        "16",
        "--num-layers-per-virtual-pipeline-stage",
        "3",
        "--recompute-granularity",
        "selective",
        "--json",
    ]
    doc = json.loads(run("predict", *long).stdout)
    assert doc["strategy"]["interleave"] == 2  # 96 layers / (16 stages x 3 layers)
    assert doc["step_time_s"] == short["step_time_s"]


def test_the_deepspeed_flag_is_the_scenario_field(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}))
    base = "model: gpt2-xl\ncluster: aws-p4d\ngpus: 64\nglobal_batch: 512\n"
    plain, with_field = tmp_path / "s.yaml", tmp_path / "ds.yaml"
    plain.write_text(base)
    with_field.write_text(base + f"deepspeed: {config}\n")
    by_flag = json.loads(run("predict", str(plain), "--deepspeed", str(config), "--json").stdout)
    by_file = json.loads(run("predict", str(with_field), "--json").stdout)
    assert by_flag["strategy"]["zero"] == 2 and by_flag["strategy"]["grad_dtype"] == "bf16"
    assert by_flag["step_time_s"] == by_file["step_time_s"]
    # given by flag, the config overrides the file's own fields (default.yaml says fp32)
    over = json.loads(run("predict", "--deepspeed", str(config), "--json").stdout)
    assert over["strategy"]["grad_dtype"] == "bf16"


class _Page(HTMLParser):
    """Collects tags, checks they nest, and keeps image sources and table cells."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.open: list[str] = []
        self.tags: list[str] = []
        self.images: list[str] = []
        self.cells: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1:]}>"
        self.open.pop()

    def handle_data(self, data):
        if self.open and self.open[-1] in ("td", "th"):
            self.cells.append(data)


def _page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    page.close()
    assert page.open == []
    assert not {"script", "link", "iframe"} & set(page.tags)  # self-contained, nothing fetched
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    return page


@pytest.mark.parametrize(
    "args,cell",
    [
        (("predict", *GPT3), "global batch"),
        (("plan", "--cluster", "ethernet-10g", "--gpus", "128", "--plot", "{tmp}/s.png"), "step"),
        (("collective", "all-reduce", "--gpus", "16", "--sizes", "1KiB:1MiB"), "busbw"),
        (("plan", "--model", "gpt2-xl", "--tokens", "1e10", "--gpus", "64:128"), "GPUs"),
    ],
)
def test_html_report_is_one_self_contained_page(tmp_path, args, cell):
    page_path = tmp_path / "report.html"
    args = [a.format(tmp=tmp_path) for a in args]
    run(*args, "--html", str(page_path))
    page = _page(page_path)
    assert "table" in page.tags and len(page.images) >= 1
    assert any(cell in c for c in page.cells)
    text = page_path.read_text()
    assert "Inputs" in text and ("Assumptions" in text or args[0] == "plan")


def test_csv_rows_match_the_json(tmp_path):
    path = tmp_path / "rows.csv"
    args = ("collective", "all-reduce", "--gpus", "16", "--sizes", "1KiB:1MiB")
    run(*args, "--csv", str(path))
    doc = json.loads(run(*args, "--json").stdout)
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(doc["rows"])
    assert float(rows[3]["busbw_Bps"]) == pytest.approx(doc["rows"][3]["busbw_Bps"])
    plan_csv = tmp_path / "plan.csv"
    run("plan", "--csv", str(plan_csv))
    with plan_csv.open() as f:
        plan_rows = list(csv.DictReader(f))
    assert plan_rows and "strategy.zero" in plan_rows[0] and "memory.total_bytes" in plan_rows[0]
    step_csv = tmp_path / "step.csv"
    run("predict", "--csv", str(step_csv))
    with step_csv.open() as f:
        (step,) = list(csv.DictReader(f))
    step_doc = json.loads(run("predict", "--json").stdout)
    assert float(step["step_time_s"]) == pytest.approx(step_doc["step_time_s"])
    assert step["strategy.first_bucket_mb"] == "1.0" and "buckets" not in step


def test_curves_that_coincide_are_drawn_once():
    merged = coinciding({"none": [1, 2], "fp16": [0.5, 1], "bf16": [0.5, 1]})
    assert merged == {"none": [1, 2], "fp16 = bf16": [0.5, 1]}


def test_the_pipeline_chart_zooms_on_hundreds_of_micro_batches(tmp_path, monkeypatch):
    from commsim.report import plots

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    run("predict", *GPT3, "--plot", str(tmp_path / "p.png"))
    whole, zoom = figures[0].axes[:2]
    assert zoom.get_xlim()[1] - zoom.get_xlim()[0] < 0.2 * (whole.get_xlim()[1])
    assert "192 micro-batches" in whole.get_title() and "gpt3-175b" in whole.get_title()


def test_the_sizing_plot_marks_the_deadline_in_plain_numbers(tmp_path, monkeypatch):
    from commsim.report import sweeps

    figures = []
    monkeypatch.setattr(sweeps, "save_figure", lambda fig, path: figures.append(fig))
    run(
        "plan",
        "--model",
        "gpt2-xl",
        "--tokens",
        "1e10",
        "--gpus",
        "64:128",
        "--deadline",
        "2d",
        "--plot",
        str(tmp_path / "s.png"),
    )
    left = figures[0].axes[0]
    labels = [t.get_label() for t in left.get_legend().get_texts()] + [
        t.get_text() for t in left.get_legend().get_texts()
    ]
    assert any("deadline: 2 days" in x for x in labels)
    ticks = [left.xaxis.get_major_formatter()(v, 0) for v in (64, 128)]
    assert ticks == ["64", "128"]


def test_progress_never_counts_past_its_total(monkeypatch):
    from commsim.report import terminal

    seen = []

    class Bar:
        def __init__(self, total, label):
            self.total, self.done = total, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, _, completed=None, total=None):
            self.done, self.total = completed, total or self.total
            seen.append((self.done, self.total))

        def advance(self, _):
            self.done += 1
            seen.append((self.done, self.total))

    monkeypatch.setattr(terminal, "progress", Bar)
    run("plan", "--top", "1")
    run("plan", "--model", "gpt2-xl", "--tokens", "1e10", "--gpus", "64:128")
    assert seen and all(done <= total for done, total in seen)


def test_the_sizing_table_fits_one_line_a_row():
    args = ("plan", "--model", "gpt2-xl", "--tokens", "3e10", "--gpus", "32:256")
    text = run(*args, "--price-per-gpu-hour", "2").output
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert len(body) == 4 and _width(text) <= 120
    assert "30B tokens" in text and "Pareto, pick" in text and "h │" in text  # hours, not 0.4 d


def test_plan_plot_sweeps_the_best_plain_ddp_layout(tmp_path, monkeypatch):
    """The winner is ZeRO-3: --plot drew nothing and said so; now the best plain-DDP
    layout's sweep, the cluster's own bandwidth named in the legend."""
    from commsim.report import sweeps

    figures = []
    monkeypatch.setattr(sweeps, "save_figure", lambda fig, path: figures.append(fig))
    text = run("plan", "--plot", str(tmp_path / "bw.png")).output
    assert "the sweep is of the best plain-DDP layout" in " ".join(text.split())
    legend = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert "this cluster: 100 Gb/s per NIC" in legend and "none" in legend


def test_a_long_layout_folds_and_no_figure_is_cut():
    """Llama 3 405B's layouts label themselves in over 40 characters: at 120 columns the
    layout column folds onto a second line and every figure stays whole."""
    from rich.console import Console

    layout = {"dp": 64, "micro_batch": 1, "micro_batches": 16}

    def doc(bucket, step, recompute, k):
        strategy = Strategy(
            tp=8,
            cp=2,
            pp=16,
            interleave=4,
            zero=1,
            first_stage_layers=7,
            last_stage_layers=7,
            recompute=recompute,
            precision="fp8",
            order="tp-cp-ep-pp-dp",
            bucket_mb=bucket,
            tp_overlap=True,
            sequence_parallel=True,
        ).model_dump()
        figures = {
            "step_time_s": step,
            "exposed_comm_s": k * 1.043,
            "comm_s": 2.1,
            "mfu": 0.715 / k,
        }
        memory = {"memory": {"total_bytes": k * 62.7e9}, "bubble_s": k * 0.3456}
        return {"strategy": strategy, "layout": layout} | memory | figures

    rows = ranking.merge_rows([doc(200, 3.801, "none", 1), doc(25, 3.877, "selective", 1.1)])
    table, _ = ranking.plan_table("t", rows, 2)
    console = Console(width=120, record=True)
    console.print(table)
    text = console.export_text()
    assert _width(text) <= 120 and "…" not in text
    assert "3.801 s" in text and "345.6 ms" in text and "62.7 GB" in text and "71.5%" in text
