"""Test session setup: the DSL targets sm_90a before anything imports it, and `gpu` tests
are skipped with a reason unless a Hopper GPU is present."""

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def _hopper_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"needs a Hopper GPU (sm_90), found sm_{major}{minor}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _hopper_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
