"""A scenario resolved: its model and cluster names looked up, the graph built, the layout
checked against the GPUs, the batch and the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from commsim import catalog
from commsim.deepspeed import DeepSpeedSettings, read_deepspeed
from commsim.profile import apply_profile, compute_efficiency, load_profile
from commsim.spec_io import load_spec, parse_spec, read_yaml
from commsim.specs import ClusterSpec, GPUSpec, Scenario, SpecError, Strategy
from commsim.step.dualpipe import problem as dualpipe_problem
from commsim.step.shape import split_problem
from commsim.topology.build import Cluster, build_cluster
from commsim.topology.placement import PLACEMENT_KINDS
from commsim.workload.model import Workload
from commsim.workload.presets import build_workload

STRATEGY_FIELDS = set(Strategy.model_fields)


@dataclass(frozen=True)
class Setup:
    """A scenario with every name resolved and its cluster built for its GPU count."""

    scenario: Scenario
    source: str
    cluster: Cluster
    gpu: GPUSpec
    workload: Workload

    @property
    def n_gpus(self) -> int:
        return self.scenario.gpus

    def micro_batches(self, strategy: Strategy) -> int:
        """Micro-batches per step on each data-parallel rank: global / (dp x micro_batch)."""
        return self.scenario.global_batch // (self.dp(strategy) * self.scenario.micro_batch)

    def dp(self, strategy: Strategy) -> int:
        """Data-parallel replicas: the GPUs over tp x pp x cp (context-parallel ranks hold
        the same weights but different tokens)."""
        return self.n_gpus // (strategy.tp * strategy.pp * strategy.cp)


def load_scenario(path: str | None, overrides: dict[str, Any]) -> tuple[Scenario, str]:
    """Read a scenario file (the built-in default when None) and apply CLI overrides."""
    source = str(catalog.DEFAULT_SCENARIO if path is None else path)  # "" is refused
    data = read_yaml(source)
    if not isinstance(data, dict):
        raise SpecError(source, "", "expected a mapping of scenario fields")
    return with_overrides(data, overrides, source), source


def with_overrides(
    data: dict[str, Any], overrides: dict[str, Any], source: str, units: bool = True
) -> Scenario:
    """A scenario from plain data with fields replaced (None leaves a field alone).

    Overrides are merged into the plain data before validation, so a bad value is
    reported like a bad field. Strategy fields (bucket_mb, algorithm, ...) go under
    `strategy`. A `deepspeed` config fills the strategy and batch fields it sets (see
    _with_deepspeed). `units`: sizes, rates and times must say their unit (parse_spec)."""
    data = dict(data)
    strategy = data.get("strategy")
    if not isinstance(strategy, dict | None):  # `strategy: ring` would fail in dict()
        got = type(strategy).__name__
        raise SpecError(source, "strategy", f"expected a mapping of strategy fields, got {got}")
    strategy = dict(strategy or {})
    given = {key for key, value in overrides.items() if value is not None}
    if given & {"model", "cluster", "gpus"}:  # what it names is no longer what runs
        data["name"] = f"{data.get('name', 'scenario')} (changed: {', '.join(sorted(given))})"
    for key in given:
        if key in STRATEGY_FIELDS:
            strategy[key] = overrides[key]
        else:
            data[key] = overrides[key]
    settings = _with_deepspeed(data, strategy, given, source)
    data["strategy"] = strategy
    scenario = parse_spec(Scenario, data, source, units)
    if settings is not None:
        s = scenario.strategy
        if scenario.gpus % (s.tp * s.pp) == 0:  # otherwise check_layout says why
            settings.check_batch(
                scenario.global_batch, scenario.micro_batch, scenario.gpus // (s.tp * s.pp)
            )
    return scenario


def _with_deepspeed(
    data: dict[str, Any], strategy: dict[str, Any], given: set[str], source: str
) -> DeepSpeedSettings | None:
    """Merge a scenario's DeepSpeed config (commsim.deepspeed) into its plain data: the
    fields it sets fill what the scenario leaves out; a flag (or what-if change) overrides
    it; a scenario field that says otherwise is a SpecError naming that field, unless the
    config itself came by flag (--deepspeed), which then overrides the file."""
    path = data.get("deepspeed")
    if not path:
        return None
    if not isinstance(path, str):
        raise SpecError(source, "deepspeed", "expected a path to a ds_config.json")
    settings = read_deepspeed(path)
    batch = {"micro_batch": settings.micro_batch, "global_batch": settings.global_batch}
    for target, values in ((strategy, settings.strategy), (data, batch)):
        for key, value in values.items():
            if value is None or key in given:
                continue
            if key in target and target[key] != value and "deepspeed" not in given:
                field = f"strategy.{key}" if target is strategy else key
                raise SpecError(source, field, f"{target[key]!r}, but {path} makes it {value!r}")
            target[key] = value
    return settings


def _cluster_spec(scenario: Scenario, source: str) -> ClusterSpec:
    if isinstance(scenario.cluster, ClusterSpec):
        return scenario.cluster
    return load_spec(ClusterSpec, catalog.topology_path(scenario.cluster, source))


def _with_profile(spec: ClusterSpec, scenario: Scenario) -> tuple[ClusterSpec, Scenario]:
    """The cluster with a calibration profile's fitted links, and the scenario with its
    measured compute efficiency (on the cluster's GPU) unless the scenario sets one."""
    profile = load_profile(scenario.profile)
    efficiency = compute_efficiency(spec, profile)
    spec = apply_profile(spec, profile, scenario.profile)
    if efficiency is not None and "compute_efficiency" not in scenario.model_fields_set:
        scenario = scenario.model_copy(update={"compute_efficiency": min(1.0, efficiency)})
    return spec, scenario


def resolve(scenario: Scenario, source: str = "scenario", check: bool = True) -> Setup:
    """Resolve the model and cluster names, build the graph, and (unless a planner will
    search the layout itself) check the scenario's layout against GPUs, batch and model."""
    spec = _cluster_spec(scenario, source)
    if scenario.profile:
        spec, scenario = _with_profile(spec, scenario)
    gpu = catalog.gpu(spec.node.gpu, spec.name, "node.gpu")
    cluster = build_cluster(spec, scenario.gpus, source)
    workload = build_workload(scenario.model, scenario.seq_len, source)
    setup = Setup(scenario, source, cluster, gpu, workload)
    _check_tokens(setup)
    if check:
        check_layout(setup, scenario.strategy)
    return setup


def _check_tokens(setup: Setup) -> None:
    """Training tokens, when given, are at least one step's (global batch x sequence): fewer
    would print a time to train shorter than one step (SpecError)."""
    s, seq = setup.scenario, setup.workload.seq_len
    if s.tokens is not None and seq and s.tokens < s.global_batch * seq:
        raise SpecError(
            setup.source,
            "tokens",
            f"{s.tokens:g} is less than one step's {s.global_batch * seq:,} tokens "
            "(global batch x sequence length)",
        )


def check_layout(setup: Setup, strategy: Strategy) -> None:
    """The strategy's degrees must fit the GPU count, the batch and the model (SpecError)."""
    s, w, src = setup.scenario, setup.workload, setup.source
    if setup.n_gpus % (strategy.tp * strategy.pp * strategy.cp):
        raise SpecError(
            src,
            "strategy",
            f"tp x pp x cp = {strategy.tp} x {strategy.pp} x {strategy.cp} does not "
            f"divide the {setup.n_gpus} GPUs into data-parallel replicas",
        )
    _check_kernels(setup, strategy)
    _check_recompute_modules(w, strategy, src)
    per_step = setup.dp(strategy) * s.micro_batch
    if s.global_batch % per_step:
        raise SpecError(
            src,
            "global_batch",
            f"{s.global_batch} is not a multiple of "
            f"data-parallel degree x micro_batch = {per_step}",
        )
    if strategy.states == "fsdp" and strategy.zero != 3:
        raise SpecError(
            src, "strategy.states", f"fsdp describes ZeRO-3's shards; zero is {strategy.zero}"
        )
    _check_reshard(strategy, src)
    _check_schedule(setup, strategy)  # before the plain-DDP shortcut: pp 1 is plain
    if strategy.etp is not None and not w.moe:  # before the plain-DDP shortcut: etp 1 is plain
        raise SpecError(
            src, "strategy.etp", f"expert tensor parallelism needs experts; {w.name} has none"
        )
    if strategy.data_parallel_only:
        return
    _check_cp_chunks(w, strategy.cp, src)
    _check_hybrid(w, strategy, src)
    _check_stages(setup, strategy)
    _check_experts(setup, strategy)
    if strategy.placement not in PLACEMENT_KINDS:
        raise SpecError(
            src, "strategy.placement", f"hybrid layouts take {' or '.join(PLACEMENT_KINDS)}"
        )


def _check_hybrid(w: Workload, strategy: Strategy, src: str) -> None:
    """A layout beyond plain data parallelism: no DDP comm hook, a transformer whose axes
    the degrees split (check_model_axes), op-level checkpointing on dense attention only."""
    if strategy.compression != "none":
        raise SpecError(
            src,
            "strategy.compression",
            "a DDP comm hook compresses plain data parallelism only (tp = pp = ep = 1, "
            "zero 0, no recomputation)",
        )
    if w.heads is None:
        raise SpecError(
            src,
            "strategy",
            f"{w.name} is not a transformer: only data "
            "parallelism (tp = pp = 1, zero 0, no recompute) applies",
        )
    check_model_axes(w, strategy, src)
    if strategy.recompute == "op" and (w.arch is None or w.arch.mla or w.arch.experts > 1):
        has = "no transformer layers" if w.arch is None else "MLA or experts"
        raise SpecError(
            src,
            "strategy.recompute",
            f"op-level checkpointing is modelled for dense attention blocks (torchtitan's "
            f"Llama); {w.name} has {has}",
        )


def _check_stages(setup: Setup, strategy: Strategy) -> None:
    """The blocks split over the pipeline's stages as given (split_problem); interleaving
    with pp > 1 and at least pp micro-batches a step."""
    src = setup.source
    blocks = setup.workload.blocks
    first, last = strategy.first_stage_layers, strategy.last_stage_layers
    uneven = first is not None or last is not None
    problem = split_problem(
        blocks,
        strategy.pp,
        strategy.interleave,
        -1 if first is None else first,
        -1 if last is None else last,
    )
    if problem:
        raise SpecError(src, "strategy.first_stage_layers" if uneven else "strategy.pp", problem)
    if strategy.interleave > 1 and strategy.pp == 1:
        raise SpecError(src, "strategy.interleave", "interleaving needs pp > 1")
    if strategy.interleave > 1 and setup.micro_batches(strategy) < strategy.pp:
        raise SpecError(
            src,
            "strategy.interleave",
            f"the interleaved schedule runs micro-batches in groups of pp = {strategy.pp}: "
            f"it needs at least {strategy.pp} per step, this layout has "
            f"{setup.micro_batches(strategy)} (global_batch / (dp x micro_batch))",
        )


def _check_schedule(setup: Setup, strategy: Strategy) -> None:
    """DualPipe where it can run (step.dualpipe.problem), else a SpecError."""
    if strategy.pipeline_schedule == "dualpipe":
        m = setup.micro_batches(strategy)
        bad = dualpipe_problem(strategy.pp, strategy.interleave, m)
        if bad:
            raise SpecError(setup.source, "strategy.pipeline_schedule", bad)


def _check_experts(setup: Setup, strategy: Strategy) -> None:
    """MoE parallel folding (Megatron-core, arXiv:2504.14960): the expert grid etp x ep x
    edp covers each stage's tp x cp x dp ranks; with the pipeline inside data parallelism
    (tp-cp-ep-pp-dp) Megatron-core needs the two grids' data-parallel degrees equal (etp x
    ep = tp x cp) so that both keep the same pipeline groups (a dense model has no expert
    grid; check_model_axes says so)."""
    src, w = setup.source, setup.workload
    if not w.moe:
        return
    ep, etp = strategy.ep, strategy.expert_tp
    ranks = strategy.tp * strategy.cp * setup.dp(strategy)
    if ranks % (ep * etp):
        raise SpecError(
            src,
            "strategy.ep",
            f"ep x etp = {ep} x {etp} does not divide a stage's tp x cp x dp = {ranks} ranks "
            "(the expert grid folds over them)",
        )
    if (
        strategy.order == "tp-cp-ep-pp-dp"
        and strategy.pp > 1
        and ep * etp != strategy.tp * strategy.cp
    ):
        raise SpecError(
            src,
            "strategy.order",
            f"tp-cp-ep-pp-dp with pp > 1 needs ep x etp = tp x cp ({ep} x {etp} is not "
            f"{strategy.tp} x {strategy.cp}): Megatron-core keeps one pipeline grid for both",
        )


def check_pins(w: Workload, strategy: Strategy, pins: set[str], src: str) -> None:
    """The strategy fields a search holds (`pins`) against the model's own limits
    (check_model_axes) and its sequence (a pinned cp must split it), the other fields at
    their defaults: a pin no layout can take."""
    pinned = {k: getattr(strategy, k) for k in pins if k in Strategy.model_fields}
    stack = {"sequence_parallel": strategy.sequence_parallel}  # never searched: as given
    check_model_axes(w, Strategy(**(stack | pinned)), src)
    _check_param_gather(strategy, pinned.get("zero", 1), pinned.get("overlap", True), src)
    _check_cp_chunks(w, pinned.get("cp", 1), src)  # the search tries only degrees that split
    _check_recompute_modules(w, strategy, src)
    _check_reshard(strategy, src, pinned=False)


def _check_recompute_modules(w: Workload, strategy: Strategy, src: str) -> None:
    """A module recomputed must be one the model has (SpecError): else it saves nothing."""
    c = w.arch
    dense = c is not None and (not w.moe or c.dense_layers > 0)  # "mlp": dense blocks' MLPs
    for module, has, what in (
        ("mla_up_proj", c is not None and c.mla, "MLA's up-projections"),
        ("moe_act", w.moe, "routed experts"),
        ("core_attn", c is not None, "transformer blocks"),
        ("mlp", dense, "dense MLP blocks"),
        ("shared_experts", w.moe and c is not None and c.shared_experts > 0, "shared experts"),
    ):
        if module in strategy.recompute_modules and not has:
            raise SpecError(src, "strategy.recompute_modules", f"{module}: {w.name} has no {what}")


def _check_param_gather(strategy: Strategy, zero: int, overlap: bool, src: str) -> None:
    """overlap_param_gather false places ZeRO 1-2's overlapped gathers: with neither it
    would change nothing, so it is refused (a search: unless zero and overlap are free)."""
    if not strategy.overlap_param_gather and (zero not in (1, 2) or not overlap):
        raise SpecError(
            src,
            "strategy.overlap_param_gather",
            "false moves ZeRO 1-2's overlapped parameter all-gathers after the optimizer: it "
            f"needs zero 1 or 2 and overlap on (zero {zero}, overlap {str(overlap).lower()})",
        )


def check_model_axes(w: Workload, strategy: Strategy, src: str) -> None:
    """The model's own limits on the degrees, whatever the GPU count: tp divides the attention
    heads, pp at most the layers, ep divides the experts, expert flags need experts
    (SpecError)."""
    blocks = w.blocks
    if w.heads is not None and w.heads % strategy.tp:
        raise SpecError(
            src,
            "strategy.tp",
            f"{strategy.tp} does not divide the model's {w.heads} attention heads",
        )
    if strategy.pp > max(blocks, 1):
        raise SpecError(src, "strategy.pp", f"{strategy.pp} pipeline stages for {blocks} layers")
    if strategy.ep > 1 and not w.moe:
        raise SpecError(src, "strategy.ep", f"expert parallelism needs experts; {w.name} has none")
    if w.moe and strategy.tp > 1 and not strategy.sequence_parallel:  # as Megatron-core's
        # model_parallel_config.py: "... tensor parallelism, sequence parallelism must be used"
        why = "MoE with tp > 1 needs sequence parallelism (Megatron-core)"
        raise SpecError(src, "strategy.sequence_parallel", why)
    if strategy.ep_overlap and not w.moe:
        raise SpecError(src, "strategy.ep_overlap", f"needs expert all-to-alls; {w.name} has none")
    if strategy.ep > 1 and w.experts % strategy.ep:
        raise SpecError(
            src, "strategy.ep", f"{strategy.ep} does not divide the model's {w.experts} experts"
        )


def _check_kernels(setup: Setup, strategy: Strategy) -> None:
    """FP8 needs a GPU with FP8 tensor cores; overlapping tensor-parallel collectives needs
    a tensor-parallel group; hybrid sharding needs ZeRO-3 and shard groups that divide dp;
    per-parameter issuance needs ZeRO-3 without hybrid sharding."""
    src = setup.source
    if strategy.precision == "fp8" and not setup.gpu.fp8_flops:
        raise SpecError(src, "strategy.precision", f"{setup.gpu.name} has no FP8 tensor cores")
    for field in ("fp8_param", "fp8_cache"):
        if getattr(strategy, field) and strategy.precision != "fp8":
            raise SpecError(src, f"strategy.{field}", "applies to FP8 training (precision fp8)")
    if strategy.tp_overlap and strategy.tp == 1:
        raise SpecError(src, "strategy.tp_overlap", "needs tensor parallelism (tp > 1)")
    if strategy.tp_overlap and not strategy.sequence_parallel:  # Megatron-LM arguments.py
        raise SpecError(
            src, "strategy.sequence_parallel", "tp_overlap needs sequence parallelism (Megatron-LM)"
        )
    if strategy.ep_overlap and strategy.ep == 1:
        raise SpecError(src, "strategy.ep_overlap", "needs expert parallelism (ep > 1)")
    if strategy.fsdp_shard is not None:
        if strategy.zero != 3:
            raise SpecError(src, "strategy.fsdp_shard", "hybrid sharding is ZeRO-3 (FSDP)")
        if setup.dp(strategy) % strategy.fsdp_shard:
            raise SpecError(
                src,
                "strategy.fsdp_shard",
                f"{strategy.fsdp_shard} does not divide the data-parallel degree "
                f"{setup.dp(strategy)}",
            )
        held = strategy.fsdp_shard * strategy.cp * strategy.tp
        if held % (strategy.ep * strategy.expert_tp):
            raise SpecError(
                src,
                "strategy.fsdp_shard",
                f"a shard group's {held} ranks (fsdp_shard x cp x tp) do not hold whole expert "
                f"grids of ep x etp = {strategy.ep} x {strategy.expert_tp}",
            )
    _check_param_gather(strategy, strategy.zero, strategy.overlap, src)
    if strategy.zero3_issue != "unit" and (strategy.zero != 3 or strategy.fsdp_shard):
        raise SpecError(
            src,
            "strategy.zero3_issue",
            f"{strategy.zero3_issue!r} is how DeepSpeed's ZeRO-3 over all data-parallel ranks "
            "issued its collectives: it needs zero 3 and no fsdp_shard",
        )


def _check_reshard(strategy: Strategy, src: str, pinned: bool = True) -> None:
    """reshard_after_forward other than true: FSDP units (zero 3, issued per unit) without a
    pipeline, whose schedules decide when units reshard (not modelled); an int (FSDP2's
    reshard to a smaller group) is not priced. `pinned` false (a search's base strategy):
    the int only, the search placing the rest."""
    value = strategy.reshard_after_forward
    problem = ""
    if not isinstance(value, bool) and isinstance(value, int):
        problem = f"{value}: resharding to a smaller group is not priced (give true or false)"
    elif value is True or not pinned:
        return
    elif strategy.zero != 3 or strategy.zero3_issue != "unit":
        problem = f"{value}: applies to FSDP units (zero 3, zero3_issue unit)"
    elif strategy.pp > 1:
        problem = f"{value}: with pp > 1 the pipeline schedule decides when units reshard"
    if problem:
        raise SpecError(src, "strategy.reshard_after_forward", problem)


def cp_split_problem(seq_len: int, cp: int) -> str:
    """Why `cp` context-parallel ranks cannot split a `seq_len`-token sequence, or "" when
    they can: each rank takes 2 of 2 cp equal chunks (Megatron-core's load-balanced causal
    split pairs chunk i with chunk 2 cp - 1 - i), so seq_len must divide by 2 cp. The one
    statement of the rule: the search filters its degrees with it, a layout is checked by it."""
    if cp > 1 and seq_len % (2 * cp):
        return f"sequence length {seq_len} does not split into 2 x cp = {2 * cp} chunks"
    return ""


def _check_cp_chunks(w: Workload, cp: int, src: str) -> None:
    """The sequence splits into 2 cp chunks (cp_split_problem), else a SpecError on cp (a
    flag that set the sequence length is named with it: cli.given.blame_flags)."""
    problem = cp_split_problem(w.seq_len or 0, cp)  # no sequence: not a transformer (_check_hybrid)
    if problem:
        raise SpecError(src, "strategy.cp", problem)
