"""The one door to the CuTe DSL: import it for Hopper, run layout algebra on the host,
compile kernels for sm_90a on a machine with no GPU and hand back their PTX.

Two traps this module closes (both silent in the DSL itself):

* The DSL reads ``CUTE_DSL_ARCH`` once, when ``cutlass`` is first imported. Unset, on a
  machine with no GPU it targets sm_100a, and WGMMA then fails far from the cause. So
  ``cutlass()`` sets sm_90a *before* the first import and refuses to go on if someone
  imported the DSL earlier with another arch.
* ``--keep-ptx`` writes into a dump folder that must already exist; if it does not, no PTX
  appears and nothing complains. ``compile_ptx`` makes the folder and fails loudly when no
  PTX comes back.

Flow: ``cutlass()`` -> (cutlass, cute); ``on_host(fn)`` traces ``fn`` inside ``@cute.jit``
so layout algebra evaluates to Python ints; ``compile_ptx(jit_fn, *fake_args)`` ->
``CompiledKernel`` (callable + PTX text).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

ARCH = "sm_90a"


class DSLArchError(RuntimeError):
    """The DSL was imported for another architecture than Hopper's sm_90a."""


def cutlass():
    """Import the CuTe DSL configured for Hopper; returns ``(cutlass, cutlass.cute)``."""
    if "cutlass" not in sys.modules:
        os.environ.setdefault("CUTE_DSL_ARCH", ARCH)
    import cutlass as _cutlass
    import cutlass.cute as _cute

    arch = _current_arch(_cutlass)
    if arch != ARCH:
        raise DSLArchError(
            f"the CuTe DSL targets {arch!r}, cutetma needs {ARCH!r}: set CUTE_DSL_ARCH={ARCH} "
            f"before anything imports cutlass (the DSL reads it only at import)"
        )
    return _cutlass, _cute


def _current_arch(_cutlass) -> str:
    from cutlass.base_dsl.env_manager import get_str_env_var

    # The env manager resolves the arch lazily (probing the driver when unset); reading the
    # variable it was built from avoids that probe on machines with no GPU.
    value = get_str_env_var("CUTE_DSL_ARCH")
    if value:
        return value
    from cutlass.cutlass_dsl import CuTeDSL

    return CuTeDSL._get_dsl().envar.arch


def on_host(build):
    """Run ``build()`` inside a ``@cute.jit`` trace and return what it returns.

    Static layouts built there evaluate to plain Python ints, so this is how cutetma turns
    CuTe layout algebra into numpy tables without a GPU. Calling a ``@cute.jit`` function
    directly re-traces it every time, so the body is read from ``_HOST_BODY`` at trace time.
    """
    global _HOST_BODY
    _, cute = cutlass()
    result = []
    _HOST_BODY = lambda: result.append(build())  # noqa: E731
    try:
        _tracer(cute)()
    finally:
        _HOST_BODY = None
    return result[0]


_HOST_BODY = None
_TRACER = None


def _tracer(cute):
    global _TRACER
    if _TRACER is None:

        @cute.jit
        def run_on_host():
            _HOST_BODY()

        _TRACER = run_on_host
    return _TRACER


@dataclasses.dataclass
class CompiledKernel:
    """A compiled ``@cute.jit`` function and the PTX it lowered to."""

    fn: object
    ptx: str

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def count(self, needle: str) -> int:
        return self.ptx.count(needle)


def compile_ptx(jit_fn, *args, opt_level: int = 3, **kwargs) -> CompiledKernel:
    """Compile ``jit_fn(*args)`` for sm_90a and return it with its PTX.

    ``args`` are usually fake tensors (``cutlass.cute.runtime.make_fake_compact_tensor``),
    so this runs on a machine with no GPU. Raises ``RuntimeError`` if no PTX comes back.
    """
    _, cute = cutlass()
    with tempfile.TemporaryDirectory(prefix="cutetma-ptx-") as dump_dir:  # must exist first
        options = f"--keep-ptx --dump-dir={dump_dir} --opt-level {opt_level}"
        compiled = cute.compile(jit_fn, *args, options=options, **kwargs)
        ptx = getattr(compiled, "__ptx__", None)
        if not ptx:
            dumped = [f for f in os.listdir(dump_dir) if f.endswith(".ptx")]
            if dumped:
                with open(os.path.join(dump_dir, dumped[0])) as f:
                    ptx = f.read()
    if not ptx:
        raise RuntimeError(
            f"compiling {getattr(jit_fn, '__name__', jit_fn)} for {ARCH} returned no PTX "
            f"(nor did its dump folder): the kernel may not have been lowered"
        )
    if f".target {ARCH}" not in ptx:
        raise DSLArchError(f"the PTX does not target {ARCH}: {ptx.splitlines()[:12]}")
    return CompiledKernel(compiled, ptx)
