"""Test session setup: the DSL targets sm_90a before anything imports it, `gpu` tests are
skipped with a reason unless a Hopper GPU is present, and ``--shard I/N`` keeps every N-th
collected test from the I-th on (so N pytest processes can compile their kernels side by
side on the GPU machine's cores: ``gpu_session.py --shards N``). The on-disk compile cache
goes to a temporary folder unless ``CUTETMA_CACHE_DIR`` names one (the GPU run shares one
folder between its shards), so tests never write into the user's cache."""

import os
import tempfile

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
if "CUTETMA_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.TemporaryDirectory(prefix="cutetma-test-cache-")
    os.environ["CUTETMA_CACHE_DIR"] = _CACHE.name


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


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only the collected tests I, I + N, I + 2N, ... (0 <= I < N)")


def _shard(config, items):
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        index, count = (int(x) for x in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {spec!r}: I/N with integers, e.g. 0/4") from None
    if not 0 <= index < count:
        raise pytest.UsageError(f"--shard {spec!r}: needs 0 <= I < N")
    kept = [item for i, item in enumerate(items) if i % count == index]
    config.hook.pytest_deselected(items=[item for i, item in enumerate(items)
                                         if i % count != index])
    items[:] = kept


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected: shards of what runs
def pytest_collection_modifyitems(config, items):
    _shard(config, items)
    gpu = [item for item in items if "gpu" in item.keywords]
    reason = _hopper_reason() if gpu else None  # no GPU test: torch is not imported
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in gpu:
        item.add_marker(skip)
