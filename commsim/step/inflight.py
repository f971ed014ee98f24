"""How many micro-batches' activations a pipeline rank holds at its peak, by schedule: what
the memory model multiplies a layer's activations by."""

from __future__ import annotations

import numpy as np


def in_flight(stage, pp, interleave=1, micro_batches=np.inf, schedule="1f1b"):
    """Micro-batches whose activations pipeline rank `stage` holds at its peak, in whole passes
    over the rank's layers; capped by the `micro_batches` there are."""
    # 1F1B (Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2): rank r holds pp - r. Interleaved,
    # v chunks a rank: Megatron's schedules.py warms up 2(pp - r - 1) + (v - 1)pp chunk passes and
    # holds one more, /v in whole passes; on rank 0 pp(1 + (pp - 1)/(pp v)) (Korthikanti Sec. 4.2).
    # GPipe (Huang et al. 2019, arXiv:1811.06965) holds all of a step's micro-batches if pp > 1.
    stage, pp, v = np.asarray(stage), np.asarray(pp), np.asarray(interleave)
    if schedule == "gpipe":
        if np.any(v > 1):
            raise ValueError("the GPipe schedule has no interleaving")
        if np.any((pp > 1) & np.isinf(micro_batches)):
            raise ValueError("the GPipe schedule needs micro_batches")
        return np.where(pp > 1, micro_batches, 1.0)
    if schedule != "1f1b":
        raise ValueError(f"schedule must be '1f1b' or 'gpipe', got {schedule!r}")
    plain = np.minimum(pp - stage, micro_batches)
    chunks = np.minimum(2 * (pp - stage - 1) + (v - 1) * pp + 1, micro_batches * v)
    return np.where(v > 1, chunks / v, plain)
