"""What an HTML report (report.html) says besides the tables and plots: the inputs that
produced them, as YAML a reader can rerun, and the modelling assumptions behind them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

from commsim.report.html import Report

if TYPE_CHECKING:
    from commsim.scenario import Setup


def _yaml(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)


def assumptions(setup: Setup) -> list[str]:
    """The modelling choices a prediction rests on, with the constants the model uses."""
    from commsim.step.states import OPTIMIZER_BYTES, PARAM_BYTES
    from commsim.step.workspace import CONTEXT_BYTES, NCCL_SIMPLE, TE_BYTES_SM90

    s, gpu = setup.scenario, setup.gpu
    compute = (
        f"compute at {s.compute_efficiency:.0%} of the {gpu.name}'s peak for every FLOP"
        if s.compute_efficiency
        else f"compute by the {gpu.name}'s roofline: GEMMs at its measured best rate, "
        "attention at FlashAttention's, element-wise work at HBM bandwidth"
    )
    return [
        compute,
        "collectives priced on the cluster graph (alpha-beta per link tier, flows shared "
        "max-min on contended links)",
        f"memory: {PARAM_BYTES} B weights, the gradients, {OPTIMIZER_BYTES} B of fp32 master "
        "weights and Adam moments per parameter (ZeRO, Rajbhandari et al. 2020), "
        "activations per Korthikanti et al. 2022",
        f"usable HBM: {1 - s.memory_reserve:.0%} of {gpu.hbm_bytes / 1e9:.0f} GB "
        f"(a {s.memory_reserve:.0%} reserve for the allocator's fragmentation, user-set: "
        "memory_reserve); outside the tensors, counted from each library's code: the CUDA "
        f"context ({CONTEXT_BYTES / 2**20:.0f} MiB, lazy loading), cuBLAS workspaces (PyTorch's "
        f"per handle, Transformer Engine's {TE_BYTES_SM90 / 2**20:.0f} MiB on Hopper) and NCCL "
        f"ring buffers per communicator and channel ({NCCL_SIMPLE / 2**20:.0f} MiB Simple, "
        "LL, LL128) and a Simple buffer per point-to-point peer (pipeline, expert all-to-all)",
        "an error-feedback residual is one gradient-sized buffer per GPU",
    ]


def inputs(report: Report, setup: Setup, flags: dict[str, object]) -> None:
    """The flags given, the scenario after them, the cluster and the GPU, as YAML."""
    given = {k: v for k, v in flags.items() if v not in (None, False)}
    report.heading("Inputs")
    report.lines([f"scenario file: {setup.source}"])
    if given:
        report.code(_yaml({"flags": given}))
    scenario = setup.scenario.model_dump(mode="json", exclude_none=True)
    scenario.pop("cluster", None)
    report.code(_yaml({"scenario": scenario}))
    report.code(_yaml({"cluster": setup.cluster.spec.model_dump(mode="json", exclude_none=True)}))
    report.code(_yaml({"gpu": setup.gpu.model_dump(mode="json", exclude_none=True)}))
    report.heading("Assumptions")
    report.lines(assumptions(setup))
