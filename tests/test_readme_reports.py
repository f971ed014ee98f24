"""The README's report examples run as written: the `--html`/`--csv` commands (in a scratch
folder, where they write their files) and the GPU YAML of a GPU the catalog lacks."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from commsim.spec_io import load_spec
from commsim.specs import GPUSpec

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _block(after: str, lang: str) -> str:
    """The first ```lang block after the line containing `after`."""
    rest = README.split(after, 1)[1]
    return rest.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_report_examples_run_and_write_their_files(tmp_path):
    text = _block("### Reports to hand on", "bash").replace("\\\n", " ")
    commands = [shlex.split(line) for line in text.splitlines() if line.startswith("commsim ")]
    assert len(commands) == 3
    for cmd in commands:
        done = subprocess.run(
            [sys.executable, "-m", "commsim.cli", *cmd[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        for flag in ("--html", "--csv"):
            if flag in cmd:
                written = tmp_path / cmd[cmd.index(flag) + 1]
                assert written.stat().st_size > 0


def test_the_gpu_yaml_example_loads(tmp_path):
    path = tmp_path / "gb200.yaml"
    path.write_text(_block("A GPU the catalog lacks", "yaml"))
    gpu = load_spec(GPUSpec, path)
    assert gpu.hbm_bytes == 186e9 and gpu.hbm_bandwidth == 8e12
    assert (gpu.compute_capability, gpu.nvlink_links) == (10.0, 18)  # what NCCL reads
