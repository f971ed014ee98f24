"""step_setup, the one build of a cluster predict and plan share: the flags' setup, a flag
the step model would ignore refused, --trace applied, the scenario's strategy checked only
when asked; the same setup as setup_from_flags where nothing is refused or traced."""

from __future__ import annotations

import pytest
from test_traces_workload import _scenario, _traces

from commsim.cli.given import blame_flags
from commsim.cli.options import setup_from_flags
from commsim.cli.step_setup import step_setup
from commsim.specs import SpecError

NONE = dict.fromkeys(("scenario", "layers_per_virtual_stage", "backend", "trace"))
NONE |= dict.fromkeys(("nccl_version", "nccl_algo", "nccl_proto"))
NONE |= dict.fromkeys(("trace_tp", "trace_pp", "trace_micro_batch"))


def _args(**kw):
    """A command's locals(): every flag step_setup reads, not given unless named."""
    return NONE | {"fsdp": False} | kw


def test_the_flags_setup_as_setup_from_flags_builds_it():
    given = {"model": "llama2-7b", "cluster": "dgx-h100-ib", "gpus": 256, "tp": 2}
    for flags in ({"nccl_version": "2.18.3"}, {"backend": "gloo"}):  # NCCL's: not under gloo
        setup, traced = step_setup(_args(**flags), given)
        by_hand = setup_from_flags(None, **flags, **given)
        assert traced is None
        assert setup.scenario == by_hand.scenario and setup.cluster.spec == by_hand.cluster.spec
        assert (setup.scenario.strategy.tp, setup.n_gpus) == (2, 256)
    assert setup.cluster.spec.comm_backend == "gloo"
    assert step_setup(_args(nccl_version="2.18.3"), given)[0].cluster.spec.nccl.version == "2.18.3"


def test_fsdp_and_virtual_stages_come_from_args():
    given = {"model": "gpt3-175b", "cluster": "dgx-a100-ib", "gpus": 1024, "tp": 8, "pp": 16}
    given |= {"global_batch": 1536, "seq_len": 2048}
    setup, _ = step_setup(_args(layers_per_virtual_stage=3), given)
    assert setup.scenario.strategy.interleave == 96 // (16 * 3)
    setup, _ = step_setup(_args(fsdp=True), {})
    assert (setup.scenario.strategy.zero, setup.scenario.strategy.states) == (3, "fsdp")


def test_a_flag_the_step_model_would_ignore_is_refused():
    with pytest.raises(SpecError, match="^--error-feedback: keeps what a lossy"):
        step_setup(_args(), {"error_feedback": True})
    with pytest.raises(SpecError, match="^--trace-tp: needs --trace"):
        step_setup(_args(trace_tp=2), {})


def test_the_scenarios_strategy_is_checked_only_when_asked():
    # gpt2-xl's 25 heads on 64 GPUs: tp 3 divides neither; plan (check=False) checks its pins
    setup, _ = step_setup(_args(), {"tp": 3}, check=False)
    assert setup.scenario.strategy.tp == 3
    with pytest.raises(SpecError), blame_flags(None, {"tp": 3}):
        step_setup(_args(), {"tp": 3})


def test_blame_flags_around_it_names_the_flag():
    with pytest.raises(SpecError, match="^--tp -2: "), blame_flags(None, {"tp": -2}):
        step_setup(_args(), {"tp": -2})


def test_the_trace_replaces_the_compute(tmp_path):
    _traces(tmp_path)
    args = _args(scenario=_scenario(tmp_path), trace=[str(tmp_path / "r*.json")])
    setup, traced = step_setup(args, {})
    plain, none = step_setup(args | {"trace": None}, {})
    assert none is None and traced["compute_efficiency"] != plain.scenario.compute_efficiency
    assert setup.scenario.compute_efficiency == pytest.approx(traced["compute_efficiency"])
