"""What both fits (link tiers, NCCL's model) share: robust least squares on log residuals,
its noise scale, and intervals by bootstrap.

Residuals are log(predicted / measured): timing noise is multiplicative, sizes span
decades, and a stalled process (a point 40x too slow) must look as wrong as it is. No point
is cut: the soft-L1 loss (rho(z) = 2 (sqrt(1 + z) - 1) of z = (r / s)^2, scipy's
least_squares) weighs a residual r like least squares within the scale s and like its
absolute value beyond, so a few wild points pull little and none is dropped by a threshold
(a hard cut flips with noise: which points it drops decides the fit). Two passes: the first
at s = 10% finds the bulk; the second at the bulk's own robust standard deviation
(1.4826 x the median absolute deviation, Rousseeuw & Croux 1993; at least 1%).

Intervals: a case bootstrap (Efron & Tibshirani 1993, ch. 9): each replicate draws the
points with replacement and, for a point with its repeats recorded, its median over its
repeats drawn with replacement, and refits; the 2.5th and 97.5th percentiles of a quantity
over the replicates are its 95% interval. Refits use the model linearised at the estimate,
log t(x) = log t(x*) + J (x - x*): the models are piecewise linear in their parameters
(calibrate.fit), so this is exact while a replicate stays on the estimate's piece, and it
costs no model evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import optimize

FIRST_SCALE = 0.1  # the first pass's soft-L1 scale (log residual: ~10%)
MIN_SCALE = 0.01  # the second pass assumes at least 1% noise
REPLICATES = 300
SEED = 20260  # fixed: the same data give the same intervals
LEVEL = (2.5, 97.5)  # percentiles of a 95% interval


def robust_sd(resid: np.ndarray) -> float:
    """1.4826 x the median absolute deviation: the standard deviation of normal noise,
    unmoved by a few wild points."""
    resid = np.asarray(resid, dtype=float)
    return float(1.4826 * np.median(np.abs(resid - np.median(resid))))


def solve(
    resid: Callable[[np.ndarray], np.ndarray],
    x0: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    diff_step: float = 1e-5,
) -> tuple[np.ndarray, float]:
    """Minimise the soft-L1 loss of resid(x) within bounds, in two passes (module
    docstring); the solution and the noise scale of the second pass."""
    x = np.clip(x0, lower, upper)
    scale = FIRST_SCALE
    for _ in range(2):
        x = optimize.least_squares(
            resid,
            x,
            bounds=(lower, upper),
            diff_step=diff_step,
            method="trf",
            x_scale="jac",
            loss="soft_l1",
            f_scale=scale,
        ).x
        scale = max(robust_sd(resid(x)), MIN_SCALE)
    return x, scale


def bootstrap(
    log_predicted: np.ndarray,
    jac: np.ndarray,
    x: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    measured: np.ndarray,
    repeats: Sequence[Sequence[float]],
    scale: float,
) -> np.ndarray:
    """Replicates of the solution x (one row each) by the case bootstrap of the module
    docstring. jac: d log(predicted) / dx at x; repeats: each point's repeat times (empty
    where not recorded: its measured value is taken as is)."""
    rng = np.random.default_rng(SEED)
    m = measured.size
    log_measured = np.log(measured)
    draws = [np.asarray(r, dtype=float) for r in repeats]
    out = np.empty((REPLICATES, x.size))
    for b in range(REPLICATES):
        rows = rng.integers(0, m, m)
        y = np.array(
            [
                np.log(np.median(rng.choice(draws[i], draws[i].size)))
                if draws[i].size >= 3
                else log_measured[i]
                for i in rows
            ]
        )
        base, j = log_predicted[rows] - jac[rows] @ x, jac[rows]
        out[b] = optimize.least_squares(
            lambda v, base=base, j=j, y=y: base + j @ v - y,
            x,
            jac=lambda v, j=j: j,
            bounds=(lower, upper),
            method="trf",
            x_scale="jac",
            loss="soft_l1",
            f_scale=scale,
        ).x
    return out


def tangled(jac: np.ndarray) -> np.ndarray:
    """Parameters the points cannot tell apart (the columns of a near-null direction of the
    column-normalised Jacobian), as a boolean mask; all False when they can."""
    norms = np.linalg.norm(jac, axis=0)
    _, sv, vt = np.linalg.svd(jac / norms, full_matrices=False)
    if sv[-1] >= 1e-9 * sv[0]:
        return np.zeros(jac.shape[1], dtype=bool)
    return np.abs(vt[-1]) > 0.1


def interval(values: np.ndarray) -> tuple[float, float]:
    """The 95% interval of a quantity over the bootstrap replicates."""
    lo, hi = np.percentile(np.asarray(values, dtype=float), LEVEL)
    return float(lo), float(hi)
