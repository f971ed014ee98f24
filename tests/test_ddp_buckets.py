"""DDP's first gradient bucket by torch version (step.buckets.ddp_first_bucket_bytes): hand
cases from torch's history, and the installed torch's own setting."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.step.buckets import (
    DDP_FIRST_BUCKET_BYTES,
    MIB,
    ddp_first_bucket_bytes,
    first_bucket_mb,
)


@pytest.mark.parametrize(
    ("cap_mb", "given", "version", "first_mb"),
    [
        (25, True, "2.13.0+cpu", 25),  # a cap the user gives caps the first bucket too
        (100, True, "2.4.0", 100),
        (25, False, "2.13.0", 1),  # left at its default: DDP's 1 MiB first bucket
        (25, True, "2.3.1", 1),  # before pytorch#121640: always 1 MiB
        (0.5, True, "1.13.1", 1),
        (25, True, "", 25),  # no version: the newest rule
    ],
)
def test_first_bucket_by_torch_version(cap_mb, given, version, first_mb):
    assert ddp_first_bucket_bytes(cap_mb * MIB, given, version) == first_mb * MIB


def test_a_version_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        ddp_first_bucket_bytes(MIB, True, "nightly")


@pytest.mark.torch
@pytest.mark.parametrize("cap_mb", [None, 1, 25, 100])
def test_the_installed_torch_agrees(cap_mb):
    """The rule against the installed torch's own bucket settings (DDP's
    _BucketCapacityConfig, where this torch has one)."""
    torch = pytest.importorskip("torch")
    ddp = pytest.importorskip("torch.nn.parallel.distributed")
    config_cls = getattr(ddp, "_BucketCapacityConfig", None)
    if config_cls is None:
        pytest.skip(f"torch {torch.__version__} keeps no bucket config to compare with")
    config = config_cls.create(cap_mb, None, False)
    ours = ddp_first_bucket_bytes(config.bucket_bytes_cap, cap_mb is not None, torch.__version__)
    assert config.first_bucket_bytes_cap == ours
    if cap_mb is None:
        assert ours == DDP_FIRST_BUCKET_BYTES


def test_a_strategy_first_bucket_as_torch_forms_it():
    """Hand cases: DDP's default 25 MiB cap reads as no bucket_cap_mb (1 MiB first bucket),
    any other cap as passed (the cap), a first bucket the strategy sets wins."""
    got = first_bucket_mb(np.array([25.0, 100.0, 1.0, 25.0]))
    assert got.tolist() == [1.0, 100.0, 1.0, 1.0]
    assert first_bucket_mb(np.array([25.0, 100.0]), 4.0).tolist() == [4.0, 4.0]
    assert float(first_bucket_mb(50.0)) == 50.0


def test_predict_and_search_form_the_same_first_bucket():
    """The one model: a searched row and the same strategy predicted alone agree."""
    from commsim.planner.search import enumerate_layouts
    from commsim.scenario import load_scenario, resolve
    from commsim.step.layouts import Layouts

    spec, source = load_scenario(None, {"bucket_mb": 100.0})
    setup = resolve(spec, source)
    searched = enumerate_layouts(setup, {"bucket_mb": 100.0, "tp": 1, "pp": 1})
    assert set(searched.first_bucket_mb.tolist()) == {100.0}
    alone = Layouts.of([setup.scenario.strategy], 1, lambda s: 1, lambda s: 1)
    assert alone.first_bucket_mb.tolist() == [100.0]
