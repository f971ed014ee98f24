"""How far above the mean the busiest GPU's experts are loaded when routing is uniform at
random: Megatron-core's forced load balancing (--moe-router-force-load-balancing, random
router logits), which every MoE run of Megatron-Bridge's performance pages uses. Why the
step model leaves load imbalance out for those runs (README, Limits).

Each token picks top_k distinct experts of E uniformly; a GPU holds E / ep of them, so a
token sends it a hypergeometric number of copies, variance k p (1 - p) (E - k) / (E - 1)
with p = 1 / ep. Over T tokens the ep loads are, by the central limit theorem, normal about
T k / ep with that variance times T, and sum to T k: they are iid normals less their mean,
so the busiest expects mean + sigma / sqrt(1 - 1/ep) x E[max of ep standard normals].
Monte Carlo (routing drawn token by token) checks the closed form.

    .venv/bin/python benchmarks/moe_imbalance.py          # table
    .venv/bin/python benchmarks/moe_imbalance.py --json   # rows as JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml
from scipy import integrate, stats

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import published_runs as pr  # noqa: E402  (a sibling script: the same runs, resolved alike)

DATA = pr.DATA


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals]: the integral of x n phi(x) Phi(x)^(n-1)."""
    if n == 1:
        return 0.0
    f = lambda x: x * n * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1)  # noqa: E731
    return integrate.quad(f, -12.0, 12.0)[0]


def busiest_excess(tokens: float, top_k: int, experts: int, ranks: int) -> float:
    """(E[busiest GPU's copies] - mean) / mean, the closed form of the module docstring."""
    p = 1.0 / ranks
    var = top_k * p * (1 - p) * (experts - top_k) / (experts - 1)
    sigma, mean = np.sqrt(tokens * var), tokens * top_k / ranks
    return float(expected_max_normal(ranks) * sigma / np.sqrt(1 - p) / mean)


def monte_carlo_excess(tokens, top_k, experts, ranks, trials=20, seed=0) -> tuple[float, float]:
    """(mean, standard error) of (busiest - mean) / mean over `trials` random routings."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(trials):
        keys = rng.random((tokens, experts), dtype=np.float32)
        picked = np.argpartition(keys, top_k, axis=1)[:, :top_k]  # k distinct experts
        load = np.bincount(picked.ravel() // (experts // ranks), minlength=ranks)
        out.append(load.max() / load.mean() - 1.0)
    return float(np.mean(out)), float(np.std(out, ddof=1) / np.sqrt(trials))


def moe_rows(data: dict) -> list[dict]:
    """The MoE runs (their models as published_runs resolves them): experts, top_k, ep, the
    tokens an ep group routes per layer and micro-batch (ep x etp GPUs of b s / (cp tp)
    tokens each), and whether the source forces balanced routing (Megatron-Bridge's pages)
    or the router is learned (uniform routing is then a floor on its imbalance)."""
    rows = []
    for run in data["runs"]:
        setup = pr.setup_of(run, data, None)
        w, s = setup.workload, setup.scenario.strategy
        if not w.moe:
            continue
        per_gpu = setup.scenario.micro_batch * w.seq_len // (s.cp * s.tp)
        forced = run["ref"] == "megatron-bridge-docs"
        rows.append(
            dict(
                id=run["id"],
                experts=w.experts,
                top_k=w.top_k,
                ep=s.ep,
                tokens=s.ep * s.expert_tp * per_gpu,
                routing="forced balance" if forced else "learned: a floor",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="rows as JSON")
    ap.add_argument("--trials", type=int, default=20, help="Monte Carlo routings per row")
    args = ap.parse_args(argv)
    if args.trials < 2:
        print("--trials: needs at least 2 (a standard error)", file=sys.stderr)
        return 2
    with open(DATA) as f:
        rows = moe_rows(yaml.safe_load(f))
    for r in rows:
        r["closed_form"] = busiest_excess(r["tokens"], r["top_k"], r["experts"], r["ep"])
        mc = monte_carlo_excess(r["tokens"], r["top_k"], r["experts"], r["ep"], args.trials)
        r["monte_carlo"], r["monte_carlo_se"] = mc
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("busiest GPU's routed copies above the mean, uniform random top-k routing")
    head = f"{'run':34} {'E':>4} {'k':>2} {'ep':>3} {'tokens':>7} {'closed form':>11}"
    print(f"{head} {'Monte Carlo':>14}  routing")
    for r in rows:
        mc = f"{100 * r['monte_carlo']:.2f} +- {100 * r['monte_carlo_se']:.2f}%"
        print(
            f"{r['id']:34} {r['experts']:>4} {r['top_k']:>2} {r['ep']:>3} {r['tokens']:>7} "
            f"{100 * r['closed_form']:>10.2f}% {mc:>14}  {r['routing']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
