"""Per-rank compute jitter: a synchronous step waits for the slowest of N ranks.

Each rank's compute time in a step is the healthy time times a factor X with mean 1 and
coefficient of variation cv, independent across ranks and steps. The step's compute then
lasts E[max of N draws of X]. With local SGD over H steps (Lin et al. 2020, "Don't use large
mini-batches, use local SGD"; seed 000's H local steps) ranks meet once every H steps, so
they wait for the largest of N sums of H draws: E[max_N (X_1 + ... + X_H) / H] per step.

E[max] of N independent draws from a distribution F (order statistics; David & Nagaraja,
"Order Statistics", 2003, Sec. 3.1): E[max] = integral of x N f(x) F(x)^(N-1) dx, computed
here by quadrature; for a non-negative X it is the integral of 1 - F(x)^N. Closed forms and
approximations checked against it in the tests:
  exponential (shifted: X = 1 - cv + cv E, E ~ Exp(1)): E[max E] = H_N, the N-th harmonic
      number (Renyi's representation of exponential order statistics, 1953);
  normal: Blom's approximation E[max Z] ~ Phi^-1((N - 0.375) / (N + 0.25)) (Blom 1958);
      it grows like sqrt(2 ln N).
Sums of H draws: a normal stays normal (cv / sqrt H); a shifted exponential becomes a
shifted gamma of shape H; a lognormal's sum is matched by a lognormal of the same mean and
variance (Fenton 1960).

Hybrid layouts: a tensor/pipeline group of g ranks meets every step, so a replica's step
factor R is the largest of its g draws; local SGD decouples only the replicas. With H = 1
every rank meets every step (the largest of all N draws). With H > 1 the mean of H draws of
R is taken as normal (central limit theorem) with R's mean and standard deviation (both by
quadrature), and the replicas wait for the largest of those.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
from scipy import integrate, stats

DISTRIBUTIONS = ("normal", "lognormal", "exponential")
# A normal X ~ N(1, cv^2) is a compute time only while it is almost never negative: refused
# when P(X < 0) = Phi(-1/cv) exceeds 1e-4 (a rank computes a negative time once in 10^4
# steps), i.e. cv > 1 / Phi^-1(1 - 1e-4) = 0.26889. At the bound the negative tail holds
# E[X^-] = cv phi(1/cv) - Phi(-1/cv) = 6.4e-6 of the mean, what a clip at 0 would add: two
# orders below the 3 significant figures printed, so the normal is priced as drawn, unclipped.
NEGATIVE_BOUND = 1e-4
MAX_NORMAL_CV = float(1.0 / stats.norm.isf(NEGATIVE_BOUND))
# the bound as messages state it, rounded down so that the figure shown is accepted
SHOWN_NORMAL_CV = math.floor(MAX_NORMAL_CV * 1e4) / 1e4  # 0.2688


def _frozen(dist: str, cv: float, local_steps: int = 1):
    """The distribution of the mean of `local_steps` draws of X (mean 1, c.v. cv), as a
    frozen scipy distribution."""
    h = local_steps
    if dist == "normal":
        return stats.norm(loc=1.0, scale=cv / math.sqrt(h))
    if dist == "exponential":  # 1 - cv + cv * Gamma(h, 1) / h
        return stats.gamma(a=h, loc=1.0 - cv, scale=cv / h)
    if dist == "lognormal":  # Fenton-Wilkinson: mean 1, variance cv^2 / h
        sigma2 = math.log(1.0 + cv * cv / h)
        return stats.lognorm(s=math.sqrt(sigma2), scale=math.exp(-sigma2 / 2.0))
    raise ValueError(f"unknown distribution {dist!r} (one of {', '.join(DISTRIBUTIONS)})")


def spread_problem(dist: str, cv: float) -> str:
    """Why jitter drawn from `dist` with coefficient of variation `cv` cannot be priced, or
    "" when it can."""
    if dist not in DISTRIBUTIONS:
        return f"unknown distribution {dist!r} (one of {', '.join(DISTRIBUTIONS)})"
    if not 0.0 <= cv < math.inf:
        return f"the coefficient of variation must be finite and not negative, got {cv}"
    if dist == "exponential" and cv > 1.0:  # X = 1 - cv + cv E reaches 1 - cv < 0
        return f"a shifted exponential with cv {cv} > 1 draws negative times"
    negative = float(stats.norm.cdf(-1.0 / cv)) if dist == "normal" and cv > 0 else 0.0
    if negative > NEGATIVE_BOUND:  # P(X < 0) for X ~ N(1, cv^2)
        return (
            f"a normal with cv {cv:g} draws a negative time with probability {negative:.3g}, "
            f"over {NEGATIVE_BOUND:g} (cv at most {SHOWN_NORMAL_CV:g}); lognormal:{cv:g} has "
            "the same mean and cv and stays positive"
        )
    return ""


def expected_max(n: int, dist: str, cv: float, local_steps: int = 1) -> float:
    """E[max over n ranks] of the per-step compute factor (1 without jitter)."""
    if n < 1 or local_steps < 1:
        raise ValueError("ranks and local steps must be at least 1")
    problem = spread_problem(dist, cv)
    if problem:
        raise ValueError(problem)
    if cv == 0 or n == 1:
        return 1.0
    return _mean_max(n, _frozen(dist, cv, local_steps))


def _mean_max(n: int, d) -> float:
    """E[max of n draws] of the frozen scipy distribution d, by quadrature."""
    lo, hi = d.ppf(1e-12), d.isf(1e-12 / n)

    def density(x: float) -> float:
        return x * n * d.pdf(x) * d.cdf(x) ** (n - 1)

    # the integrand lives near the top quantiles: split there for the quadrature
    knots = sorted({lo, *(float(d.ppf(q)) for q in (0.5, 1 - 1 / n, 1 - 0.1 / n)), hi})
    return float(sum(integrate.quad(density, a, b, limit=200)[0] for a, b in pairwise(knots)))


def _max_moments(n: int, dist: str, cv: float) -> tuple[float, float]:
    """Mean and standard deviation of the largest of n draws of X."""
    d = _frozen(dist, cv)
    lo, hi = d.ppf(1e-12), d.isf(1e-12 / n)
    knots = sorted({lo, *(float(d.ppf(q)) for q in (0.5, 1 - 1 / n, 1 - 0.1 / n)), hi})

    def moment(k: int) -> float:
        def f(x: float) -> float:
            return x**k * n * d.pdf(x) * d.cdf(x) ** (n - 1)

        return sum(integrate.quad(f, a, b, limit=200)[0] for a, b in pairwise(knots))

    mean = moment(1)
    return mean, math.sqrt(max(moment(2) - mean * mean, 0.0))


def expected_max_grouped(
    replicas: int, group: int, dist: str, cv: float, local_steps: int = 1
) -> float:
    """E[step factor] when groups of `group` ranks meet every step and `replicas` groups
    meet every `local_steps` steps (module docstring)."""
    if group == 1:
        return expected_max(replicas, dist, cv, local_steps)
    if local_steps == 1 or replicas == 1 or cv == 0:
        return (
            expected_max(replicas * group, dist, cv)
            if local_steps == 1
            else (expected_max(group, dist, cv) if replicas == 1 else 1.0)
        )
    mean, sd = _max_moments(group, dist, cv)
    normal_max = _mean_max(replicas, stats.norm())  # E[max of standard normals]
    return mean + sd / math.sqrt(local_steps) * normal_max


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n."""
    return float(np.sum(1.0 / np.arange(1, n + 1)))


def blom_normal_max(n: int) -> float:
    """Blom's approximation of E[max of n standard normals]."""
    return float(stats.norm.ppf((n - 0.375) / (n + 0.25)))


def expected_max_mc(
    n: int,
    dist: str,
    cv: float,
    local_steps: int = 1,
    draws: int = 2000,
    seed: int = 0,
    group: int = 1,
) -> float:
    """The same expectation by simulation: `draws` syncs of n replicas of `group` ranks,
    each replica's step the slowest of its ranks, averaged over local_steps steps (no
    moment matching, no normal approximation)."""
    rng = np.random.default_rng(seed)
    shape = (draws, n, local_steps, group)
    if dist == "normal":
        x = rng.normal(1.0, cv, shape)
    elif dist == "exponential":
        x = 1.0 - cv + cv * rng.exponential(1.0, shape)
    elif dist == "lognormal":
        sigma2 = math.log(1.0 + cv * cv)
        x = rng.lognormal(-sigma2 / 2.0, math.sqrt(sigma2), shape)
    else:
        raise ValueError(f"unknown distribution {dist!r}")
    return float(x.max(axis=3).mean(axis=2).max(axis=1).mean())
