"""DDP's first gradient bucket by torch version (step.buckets.ddp_first_bucket_bytes): hand
cases from torch's history, and the installed torch's own setting."""

from __future__ import annotations

import pytest

from commsim.step.buckets import DDP_FIRST_BUCKET_BYTES, MIB, ddp_first_bucket_bytes


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
