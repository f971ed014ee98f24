"""Checkpoint intervals and the expected wall time of a run that checkpoints and restarts.

Work runs in segments of tau seconds, each followed by a checkpoint stall delta_s; the
checkpoint becomes durable `lag` seconds after the stall ends (0 for a synchronous save; an
asynchronous save stalls only to copy the state off the GPU and writes it in the
background, Nicolae et al. 2020 / PyTorch DCP async_save). Failures arrive as a Poisson
process of mean time M, also during restarts; a failure rolls back to the last durable
checkpoint and starts a restart of class c (probability p_c) that needs R_c seconds without
a failure.

Expected time per durable checkpoint (derivation in `commit_time`):

    E = Q e^(lag/M) (e^((tau + delta_s)/M) - 1),   Q = M / sum_c p_c e^(-R_c / M)

With one restart class and lag 0 this is Daly's complete model (Daly 2006, FGCS 22(3),
"A higher order estimate of the optimum checkpoint interval for restart dumps", eq. for
T_w: M e^(R/M) (e^((tau+delta)/M) - 1) T_s / tau); a run of W seconds of work takes W / tau
x E. Young (1974, CACM 17(9)) and Daly's perturbation solution give the interval in closed
form; `optimal_interval` minimises the model itself.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from scipy.optimize import minimize_scalar


def young_interval(delta: float, mtbf: float) -> float:
    """Young's first-order optimum: sqrt(2 delta M) (Young 1974)."""
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's higher-order optimum (Daly 2006, the perturbation solution):
    sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta for delta < 2M,
    else M."""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


EXP_MAX = math.log(sys.float_info.max)  # about 709.8


def restart_factor(mtbf: float, restarts: Sequence[tuple[float, float]]) -> float:
    """Q = M / sum_c p_c exp(-R_c / M): the expected time from a failure until the job runs
    again, plus M. `restarts` holds (probability, seconds) per restart class.

    A restart of class c succeeds with probability e^(-R_c/M); if a failure cuts it short,
    a new restart (of a class drawn afresh) begins. The expected restart phase is then
    (A / (1 - A)) M with A = sum_c p_c (1 - e^(-R_c/M)), so Q = M + that = M / (1 - A)."""
    survive = sum(p * math.exp(-r / mtbf) for p, r in restarts)
    return mtbf / survive if survive > 0 else math.inf  # no restart outlasts the MTBF


def commit_time(
    tau: float, stall: float, lag: float, mtbf: float, restarts: Sequence[tuple[float, float]]
) -> float:
    """Expected wall time per durable checkpoint (see the module docstring).

    Derivation: let L = tau + stall. From a durable checkpoint the next one is durable L
    later if no failure comes in that time (probability e^(-L/M)). Otherwise, after the
    failure at x < L and a restart, the job resumes from the previous checkpoint and needs
    L + lag seconds without a failure; with restarts each attempt costs on average
    A(W) = Q (e^(W/M) - 1) (Daly's cost of W failure-free seconds). So
    E = e^(-L/M) L + (1 - e^(-L/M)) (E[x | x < L] + (Q - M) + A(L + lag)), which simplifies
    to Q e^(lag/M) (e^(L/M) - 1)."""
    q = restart_factor(mtbf, restarts)
    return q * _exp(lag / mtbf) * _exp((tau + stall) / mtbf, minus_one=True)


def _exp(x: float, minus_one: bool = False) -> float:
    """e^x (e^x - 1 with `minus_one`), inf past the largest float instead of an
    OverflowError: failures so frequent that no interval completes."""
    if x > EXP_MAX:
        return math.inf
    return math.expm1(x) if minus_one else math.exp(x)


def goodput(
    tau: float, stall: float, lag: float, mtbf: float, restarts: Sequence[tuple[float, float]]
) -> float:
    """Useful work over wall time: tau / E."""
    return tau / commit_time(tau, stall, lag, mtbf, restarts)


def optimal_interval(
    stall: float,
    lag: float,
    mtbf: float,
    restarts: Sequence[tuple[float, float]],
    floor: float = 0.0,
) -> float:
    """The tau that maximises goodput under the model, at least `floor` (an asynchronous
    save must finish writing before the next one starts: tau + stall >= lag). Goodput is
    unimodal in tau (checkpoint cost falls as 1/tau, rework grows as e^(tau/M)), so a
    bounded scalar search in log tau finds it."""
    lo = max(floor, 1e-3, 1e-6 * mtbf)
    hi = max(50.0 * mtbf, 10.0 * lo)

    def cost(log_tau: float) -> float:
        return -goodput(math.exp(log_tau), stall, lag, mtbf, restarts)

    res = minimize_scalar(
        cost, bounds=(math.log(lo), math.log(hi)), method="bounded", options={"xatol": 1e-6}
    )
    return max(lo, math.exp(res.x))
