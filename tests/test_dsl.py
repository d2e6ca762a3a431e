"""The compile harness: sm_90a on a machine with no GPU, PTX returned, failures loud."""

import pytest

from cutetma import dsl

cutlass, cute = dsl.cutlass()


@cute.kernel
def _double_kernel(x: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    x[tidx] = x[tidx] * 2.0


@cute.jit
def _double(x: cute.Tensor):
    _double_kernel(x).launch(grid=(1, 1, 1), block=(32, 1, 1))


def _fake():
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(cutlass.Float32, (32,))


def test_trivial_kernel_compiles_for_sm90a():
    k = dsl.compile_ptx(_double, _fake())
    assert ".target sm_90a" in k.ptx
    assert ".visible .entry" in k.ptx and "_double_kernel" in k.ptx
    assert "mul.f32" in k.ptx or "add.f32" in k.ptx  # x * 2.0 survived lowering


def test_missing_ptx_fails_loudly(monkeypatch):
    class NoPtx:
        __ptx__ = None

    monkeypatch.setattr(cute, "compile", lambda *a, **k: NoPtx())
    with pytest.raises(RuntimeError, match="returned no PTX"):
        dsl.compile_ptx(_double, _fake())


def test_layout_algebra_runs_on_the_host():
    value = dsl.on_host(lambda: cute.make_layout((4, 8), stride=(8, 1))((2, 3)))
    assert value == 19 and isinstance(value, int)
