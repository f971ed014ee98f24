"""How strategies, layouts and compressors are named in tables and titles, and why the
winner won."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from commsim.units import fmt_gpus, fmt_time

if TYPE_CHECKING:
    from commsim.scenario import Setup


def run_title(setup: Setup) -> str:
    """What ran, as titles name it: the model on so many GPUs of a cluster (not the name of
    a scenario file whose model or cluster a flag replaced)."""
    return (
        f"{setup.workload.name} on {fmt_gpus(setup.n_gpus)} of {setup.cluster.spec.name} "
        f"({setup.gpu.name})"
    )


def compression_label(strategy: dict[str, Any]) -> str:
    """A compressor as a user spells it, with +EF when error feedback is on."""
    c = strategy["compression"]
    return c + (" +EF" if strategy["error_feedback"] and c != "none" else "")


def _etp(s: dict[str, Any], sep: str) -> str:
    """ "etp N" and `sep` where the expert tensor-parallel degree is set apart from tp."""
    etp = s.get("etp")
    return f"etp {etp}{sep}" if etp is not None and etp != s["tp"] else ""


def describe_strategy(strategy: dict[str, Any]) -> str:
    """One line: layout (when hybrid), algorithm, bucket, overlap, placement, compression."""
    s = strategy
    overlap = "overlap" if s["overlap"] else "no overlap"
    ep, cp = s.get("ep", 1), s.get("cp", 1)
    layout = (
        f"tp {s['tp']}, {f'cp {cp}, ' if cp > 1 else ''}pp {s['pp']}{split_label(s)}, "
        f"{f'ep {ep}, ' if ep > 1 else ''}{_etp(s, ', ')}zero {s['zero']}{_hybrid(s)}, "
        f"recompute {s['recompute']}, interleave {s['interleave']}, {_schedule(s)}{_order(s)}"
        if (s["tp"], s["pp"], ep, cp, s["zero"], s["recompute"], s["interleave"])
        != (1, 1, 1, 1, 0, "none", 1)
        else ""
    )
    return (
        f"{layout}{s['algorithm']}, {bucket_label(s)}, {overlap}, {s['placement']}, "
        f"compression {compression_label(s)}"
    )


def bucket_label(s: dict[str, Any], none: str = "per unit", unit: str = " MiB") -> str:
    """The DDP gradient bucket; `none` under ZeRO-3, which gathers and reduce-scatters per
    unit (transformer block) and has no buckets."""
    return none if s.get("zero", 0) == 3 else f"{s['bucket_mb']:g}{unit}"


def _hybrid(s: dict[str, Any]) -> str:
    kept = s.get("reshard_after_forward", True) is not True
    shard = f" sharded over {s['fsdp_shard']}" if s.get("fsdp_shard") else ""
    return shard + (f" ({reshard_label(s)})" if kept else "")


def _schedule(s: dict[str, Any]) -> str:
    """The pipeline schedule when it is not 1F1B."""
    schedule = s.get("pipeline_schedule", "1f1b")
    return "" if schedule == "1f1b" else f"{schedule}, "


def _order(s: dict[str, Any]) -> str:
    """The rank order when it is not Megatron-core's default."""
    order = s.get("order", "tp-cp-ep-dp-pp")
    return "" if order == "tp-cp-ep-dp-pp" else f"order {order}, "


def split_label(s: dict[str, Any]) -> str:
    """An uneven pipeline split as first/last stage layers, e.g. (5..5); '' when even."""
    first, last = s.get("first_stage_layers"), s.get("last_stage_layers")
    if first is None and last is None:
        return ""
    return f"({'=' if first is None else first}..{'=' if last is None else last})"


def layout_label(c: dict[str, Any]) -> str:
    """A layout in a few characters: dp64 tp8 cp2 pp16 v2 z1 sel mb1 (z3/8: ZeRO-3 sharded
    over 8 ranks, replicated across; z3nr: no reshard after forward, z3nl: all but the last
    block reshard; pp>dp: the pipeline inside each data-parallel replica;
    fp8: FP8 GEMMs; dualpipe: DeepSeek-V3's schedule)."""
    s, lay = c["strategy"], c["layout"]
    parts = [f"dp{lay['dp']}"]
    parts += [f"tp{s['tp']}"] if s["tp"] > 1 else []
    parts += [f"cp{s['cp']}"] if s.get("cp", 1) > 1 else []
    parts += [f"pp{s['pp']}{split_label(s)}"] if s["pp"] > 1 else []
    parts += [f"ep{s['ep']}"] if s.get("ep", 1) > 1 else []
    parts += [_etp(s, "").replace(" ", "")] if _etp(s, "") else []
    parts += [f"v{s['interleave']}"] if s["interleave"] > 1 else []
    parts += ["dualpipe"] if s.get("pipeline_schedule") == "dualpipe" else []
    kept = {False: "nr", "all-but-last": "nl"}.get(s.get("reshard_after_forward", True), "")
    zero = f"z{s['zero']}{kept}" + (f"/{s['fsdp_shard']}" if s.get("fsdp_shard") else "")
    parts += [zero] if s["zero"] else []
    parts += [s["recompute"][:3]] if s["recompute"] != "none" else []
    parts += ["pp>dp"] if s.get("order", "tp-cp-ep-dp-pp") != "tp-cp-ep-dp-pp" else []
    parts += ["fp8"] if s.get("precision") == "fp8" else []
    return " ".join([*parts, f"mb{lay['micro_batch']}"])


def reshard_label(s: dict[str, Any]) -> str:
    """FSDP's reshard_after_forward in words (Strategy.reshard_after_forward)."""
    value = s.get("reshard_after_forward", True)
    if value == "all-but-last":
        return "all but the last unit resharded after the forward"
    if value:
        return "units resharded after the forward, gathered again for the backward"
    return "units kept from forward to backward"


# The dimensions a plan explains: label, the strategy keys that change together, the value.
_DIMENSIONS = (
    ("tensor parallelism", ("tp",), lambda s: f"tp {s['tp']}"),
    ("context parallelism", ("cp",), lambda s: f"cp {s.get('cp', 1)}"),
    ("pipeline depth", ("pp",), lambda s: f"pp {s['pp']}"),
    ("expert parallelism", ("ep",), lambda s: f"ep {s.get('ep', 1)}"),
    ("expert tensor parallelism", ("etp",), lambda s: f"etp {s.get('etp') or s['tp']}"),
    ("rank order", ("order",), lambda s: s.get("order", "tp-cp-ep-dp-pp")),
    ("hybrid sharding", ("fsdp_shard",), lambda s: f"shard over {s.get('fsdp_shard') or 'all'}"),
    ("ZeRO stage", ("zero",), lambda s: f"ZeRO {s['zero']}"),
    ("reshard after forward", ("reshard_after_forward",), reshard_label),
    ("recomputation", ("recompute",), lambda s: s["recompute"]),
    ("interleaving", ("interleave",), lambda s: f"v {s['interleave']}"),
    ("pipeline schedule", ("pipeline_schedule",), lambda s: s.get("pipeline_schedule", "1f1b")),
    ("algorithm", ("algorithm",), lambda s: s["algorithm"]),
    ("bucket size", ("bucket_mb",), lambda s: f"{s['bucket_mb']:g} MiB"),
    ("overlap", ("overlap",), lambda s: "overlap on" if s["overlap"] else "overlap off"),
    ("placement", ("placement",), lambda s: s["placement"]),
    ("compression", ("compression", "error_feedback"), compression_label),
)


def explain_winner(candidates: Sequence[dict[str, Any]]) -> list[str]:
    """Plain sentences on why the best candidate wins: what each alternative dimension costs."""
    best = candidates[0]
    s = best["strategy"]
    lines = [
        f"Best: {describe_strategy(s)}: step {fmt_time(best['step_time_s'])}, compute "
        f"{fmt_time(best['compute_s'])}, communication {fmt_time(best['comm_s'])}"
        + (f" + {fmt_time(best['codec_s'])} encode/decode" if best["codec_s"] else "")
        + f", of which {fmt_time(best['exposed_comm_s'])} exposed "
        f"({pct(best['overlap_ratio'])} hidden).",
        "  where the step goes: "
        + ", ".join(
            f"{label} {fmt_time(best[key])}"
            for key, label in (
                ("compute_s", "compute"),
                ("bubble_s", "pipeline bubble"),
                ("tp_comm_s", "tensor-parallel comm"),
                ("ep_comm_s", "expert-parallel comm"),
                ("pp_comm_s", "pipeline sends"),
                ("dp_exposed_s", "exposed data-parallel comm"),
                ("exposed_comm_s", "exposed comm"),
                ("codec_s", "encode/decode"),
            )
            if best.get(key) and not (key == "exposed_comm_s" and "dp_exposed_s" in best)
        ),
    ]
    for alt in alternatives(candidates):
        label, value, delta = alt["dimension"], alt["choice"], alt["delta_s"]
        if delta <= 0:
            lines.append(f"  {label} makes no difference here ({value}: the same step).")
            continue
        lines.append(
            f"  best other {label} ({value}): +{fmt_time(delta)} per step, exposed comm "
            f"{fmt_time(alt['exposed_comm_s'])}."
        )
    return lines


def alternatives(candidates: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Along each dimension the best candidate could change alone (tp, cp, pp, ..., the
    rest held), the fastest candidate that changes it: what it picks and what it costs."""
    best = candidates[0]
    s = best["strategy"]
    out = []
    for label, keys, show in _DIMENSIONS:
        others = [
            c
            for c in candidates
            if c["strategy"].get(keys[0]) != s.get(keys[0])
            and all(c["strategy"][k] == s[k] for k in s if k not in keys)
        ]
        if not others:
            continue
        alt = min(others, key=lambda c: c["step_time_s"])
        out.append(
            {
                "dimension": label,
                "choice": show(alt["strategy"]),
                "step_time_s": alt["step_time_s"],
                "delta_s": alt["step_time_s"] - best["step_time_s"],
                "exposed_comm_s": alt["exposed_comm_s"],
            }
        )
    return out


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"
