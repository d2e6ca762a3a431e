"""The on-disk compile cache (``cutetma.runtime.cache``), on a CPU: a miss compiles and
stores, a hit (also in a fresh process) loads without compiling, processes that miss the
same entry at once compile it once, a bad entry is rebuilt with one warning, a changed
source fingerprint is a new key, ``CUTETMA_CACHE=0`` writes nothing, ``CUTETMA_CACHE_DIR``
moves it. The kernel is a tiny ``@cute.jit`` fill (a pointer, a size, a value, a stream: the
shape of the ``from_pointers`` entries ``runtime.launch`` compiles), about 0.2 s to compile.
"""

import ctypes
import functools
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from cutetma.runtime import cache

KEY = {"entry": "test_cache.fill", "config": "block=128", "args": ["Pointer[Float32]"]}


@functools.cache
def _fill():
    """``fill(p, n, value, stream)``: ``p[i] = value`` for ``i < n``. (The DSL evaluates
    the annotations in this module's globals at compile time: no ``from __future__ import
    annotations`` here.)"""
    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    import cuda.bindings.driver as cuda

    @cute.kernel
    def fill_kernel(t: cute.Tensor, n: cutlass.Int32, value: cutlass.Float32):
        bidx, _, _ = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        i = bidx * 128 + tidx
        if i < n:
            t[i] = value

    @cute.jit
    def fill(p: cute.Pointer, n: cutlass.Int32, value: cutlass.Float32, stream: cuda.CUstream):
        t = cute.make_tensor(p, cute.make_layout(n))
        fill_kernel(t, n, value).launch(grid=((n + 127) // 128, 1, 1), block=(128, 1, 1),
                                        stream=stream)

    return fill


def _fill_args():
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    return (make_ptr(cutlass.Float32, 16, cute.AddressSpace.gmem, assumed_align=16), 1,
            cutlass.Float32(0.0), make_fake_stream())


def compile_fill():
    from cutetma import dsl

    _, cute = dsl.cutlass()
    return cute.compile(_fill(), *_fill_args())


@functools.cache
def _compiled_once():
    return compile_fill()


class Counting:
    """A compile function that counts its calls (and compiles only once per test session)."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return _compiled_once()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("CUTETMA_CACHE_DIR", str(folder))
    monkeypatch.delenv("CUTETMA_CACHE", raising=False)
    return folder


def _entry(folder):
    (path,) = folder.glob("*" + cache.SUFFIX)
    return path


def _cache_warnings(record):
    return [w for w in record if issubclass(w.category, cache.CacheWarning)]


def _argument_values(fn):
    """What the compiled program is handed for one call: the value behind each address."""
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import make_ptr

    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    args = (make_ptr(cutlass.Float32, 0x7F0000000000, cute.AddressSpace.gmem, assumed_align=16),
            1000, cutlass.Float32(2.5), cuda.CUstream(0xABC))
    exe_args, _ = fn.generate_execution_args(*args)
    return [ctypes.c_uint64.from_address(p.value if isinstance(p, ctypes.c_void_p) else int(p))
            .value for p in exe_args]


# ---------------------------------------------------------------------------- hit and miss


def test_miss_compiles_and_stores_then_hit_loads_without_compiling(cache_dir):
    compile_fn = Counting()
    first = cache.load_or_compile(KEY, compile_fn)
    assert compile_fn.calls == 1
    entry = _entry(cache_dir)
    assert cache.info() == {"dir": str(cache_dir), "enabled": True, "entries": 1,
                            "bytes": entry.stat().st_size}
    (header,) = cache.entries()
    assert header["key"] == entry.stem and header["parts"]["kernel"] == KEY
    assert header["parts"]["env"]["arch"] == "sm_90a"

    second = cache.load_or_compile(KEY, compile_fn)
    assert compile_fn.calls == 1  # the hit did not compile
    # both are the DSL's compiled function, loaded back from the exported object
    for fn in (first, second):
        assert type(fn).__name__ == "CudaDialectJitCompiledFunction" and fn.load_from_binary
        assert fn.kernel_info.keys() == _compiled_once().kernel_info.keys()
        assert str(fn.execution_args.signature) == str(
            _compiled_once().execution_args.signature)


def test_loaded_function_takes_the_dsls_argument_list(cache_dir):
    """``PointerLaunch`` hands ``.to().run_compiled_program`` the argument list the DSL
    builds: a loaded entry builds the same one as the freshly compiled function."""
    cache.load_or_compile(KEY, Counting())
    loaded = cache.load_or_compile(KEY, Counting())
    assert _argument_values(loaded) == _argument_values(_compiled_once())
    assert len(_argument_values(loaded)) == 4


def test_a_fresh_process_loads_the_entry_without_compiling(cache_dir):
    cache.load_or_compile(KEY, Counting())
    script = textwrap.dedent(f"""
        from cutetma.runtime import cache

        def refuse():
            raise SystemExit("compiled although the entry is on disk")

        fn = cache.load_or_compile({KEY!r}, refuse)
        print("loaded", type(fn).__name__, fn.load_from_binary)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, CUTETMA_CACHE_DIR=str(cache_dir)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "loaded CudaDialectJitCompiledFunction True" in out.stdout


# ---------------------------------------------------------------------------- processes


def _racer(folder: str, go: str, log: str, results) -> None:
    """One of several processes asking for the same entry at once."""
    os.environ["CUTETMA_CACHE_DIR"] = folder
    from cutetma.runtime import cache as process_cache

    def compile_logged():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # hold the lock a while: the others are waiting on it
        return compile_fill()

    process_cache.environment()  # imports done before the start signal
    open(f"{go}.ready.{os.getpid()}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    fn = process_cache.load_or_compile(KEY, compile_logged)
    results.put((os.getpid(), fn.function_name))


def test_processes_missing_the_same_entry_compile_it_once(cache_dir, tmp_path):
    """Two processes miss the same entry at the same moment: one compiles under the entry's
    lock, the other waits and loads what it wrote; nothing half-written is ever seen."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    go, log = tmp_path / "go", tmp_path / "compiles.log"
    racers = [context.Process(target=_racer, args=(str(cache_dir), str(go), str(log), results))
              for _ in range(2)]
    for p in racers:
        p.start()
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("go.ready.*"))) < len(racers) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # both imported and waiting: they ask for the entry within milliseconds
    for p in racers:
        p.join(timeout=300)
    assert [p.exitcode for p in racers] == [0, 0]
    names = {results.get(timeout=10)[1] for _ in racers}
    assert len(names) == 1  # every process got the same kernel
    assert len(log.read_text().split()) == 1  # compiled once, by whoever took the lock first
    entry = _entry(cache_dir)
    assert not list(cache_dir.glob("*.tmp"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", cache.CacheWarning)
        compile_fn = Counting()
        cache.load_or_compile(KEY, compile_fn)  # whole and sound
    assert compile_fn.calls == 0 and entry.exists()


# ---------------------------------------------------------------------------- bad entries


def _flip_payload_byte(blob: bytes) -> bytes:
    i = len(blob) - 200
    return blob[:i] + bytes([blob[i] ^ 0xFF]) + blob[i + 1:]


def _stale_format(blob: bytes) -> bytes:
    magic, header, payload = blob.split(b"\n", 2)
    header = json.loads(header)
    header["format"] = cache.FORMAT - 1
    return magic + b"\n" + json.dumps(header).encode() + b"\n" + payload


def _not_an_object(blob: bytes) -> bytes:
    """A well-formed entry whose payload is no object file (sums match: only loading fails)."""
    header = json.loads(blob.split(b"\n", 2)[1])
    return cache._encode(header["key"], header["parts"], b"not an ELF object" * 10)


BAD = {
    "corrupt": (_flip_payload_byte, "corrupt (checksum mismatch)"),
    "truncated": (lambda blob: blob[: len(blob) // 2], "truncated"),
    "truncated_header": (lambda blob: blob[:40], "truncated in its header"),
    "garbage": (lambda blob: b"\0" * 64, "not a cutetma cache entry"),
    "empty": (lambda blob: b"", "not a cutetma cache entry"),
    "stale": (_stale_format, "stale (format"),
    "unloadable": (_not_an_object, "unloadable"),
}


@pytest.mark.parametrize("damage", list(BAD))
def test_a_bad_entry_is_rebuilt_with_one_warning(cache_dir, damage):
    spoil, reason = BAD[damage]
    cache.load_or_compile(KEY, Counting())
    entry = _entry(cache_dir)
    entry.write_bytes(spoil(entry.read_bytes()))

    compile_fn = Counting()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = cache.load_or_compile(KEY, compile_fn)
    (warned,) = _cache_warnings(record)
    assert reason in str(warned.message) and "rebuilt" in str(warned.message)
    assert compile_fn.calls == 1
    assert fn.load_from_binary and fn.kernel_info.keys() == _compiled_once().kernel_info.keys()

    with warnings.catch_warnings():  # rebuilt sound: a quiet hit
        warnings.simplefilter("error", cache.CacheWarning)
        again = Counting()
        cache.load_or_compile(KEY, again)
    assert again.calls == 0


def test_an_unusable_cache_folder_warns_and_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CUTETMA_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("CUTETMA_CACHE", raising=False)
    monkeypatch.setattr(cache, "_WARNED", set())
    compile_fn = Counting()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = cache.load_or_compile(KEY, compile_fn)
        cache.load_or_compile(KEY, compile_fn)
    assert fn is _compiled_once() and compile_fn.calls == 2
    assert len(_cache_warnings(record)) == 1  # once per process


# ---------------------------------------------------------------------------- the key


def test_a_changed_source_fingerprint_is_a_new_key(cache_dir, monkeypatch):
    compile_fn = Counting()
    cache.load_or_compile(KEY, compile_fn)
    before = cache.key_of(KEY)[0]
    monkeypatch.setattr(cache, "source_fingerprint", lambda: "0" * 64)
    after = cache.key_of(KEY)[0]
    assert after != before
    cache.load_or_compile(KEY, compile_fn)
    assert compile_fn.calls == 2
    assert {p.stem for p in cache_dir.glob("*" + cache.SUFFIX)} == {before, after}


def test_the_key_covers_sources_dsl_arch_and_the_callers_parts():
    key, parts = cache.key_of(KEY)
    env = parts["env"]
    assert set(env) == {"format", "sources", "dsl", "dsl_cuda", "dsl_settings", "arch"}
    assert "lineinfo=False" in env["dsl_settings"] and "shared_libs" not in env["dsl_settings"]
    assert len(env["sources"]) == 64 and env["sources"] == cache.source_fingerprint()
    assert env["arch"] == "sm_90a" and env["dsl"] == "4.8.1"
    assert parts["kernel"] == KEY
    assert cache.key_of(dict(KEY, config="block=256"))[0] != key
    assert cache.key_of(dict(KEY))[0] == key


def test_key_parts_by_repr_never_by_address():
    import torch

    from cutetma.kernels.gemm_config import GemmConfig

    key, parts = cache.key_of({"dtype": torch.bfloat16, "config": GemmConfig()})
    assert parts["kernel"]["dtype"] == "torch.bfloat16"
    assert parts["kernel"]["config"].startswith("GemmConfig(tile_m=128")
    assert cache.key_of({"config": GemmConfig(tile_n=128)})[0] != cache.key_of(
        {"config": GemmConfig()})[0]
    with pytest.raises(TypeError, match="no stable repr"):
        cache.key_of({"thing": object()})


def test_describe_args_names_types_not_addresses():
    import torch
    from cutlass.cute.runtime import from_dlpack, make_fake_stream

    from cutetma.runtime.launch import typed_pointer

    workspace = from_dlpack(torch.zeros(64), assumed_align=16).mark_layout_dynamic()
    described = cache.describe_args(typed_pointer(torch.bfloat16), typed_pointer(torch.float32, 4),
                                    1, True, 132, None, make_fake_stream(), workspace)
    assert described[:6] == ["Pointer[BFloat16, gmem, align=16]",
                             "Pointer[Float32, gmem, align=4]", 1, True, 132, None]
    assert described[6] == "FakeStream[env=False]"
    assert described[7].startswith("Tensor[Float32, ") and "0x" not in described[7]
    other = from_dlpack(torch.zeros(64, dtype=torch.int32), assumed_align=4).mark_layout_dynamic()
    assert cache.describe_args(other) != described[7:]
    assert cache.describe_args(typed_pointer(torch.float16)) != described[:1]


# ---------------------------------------------------------------------------- settings


def test_cache_off_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("CUTETMA_CACHE", "0")
    assert not cache.enabled()
    compile_fn = Counting()
    cache.load_or_compile(KEY, compile_fn)
    cache.load_or_compile(KEY, compile_fn)
    assert compile_fn.calls == 2
    assert not cache_dir.exists()
    assert cache.info()["enabled"] is False and cache.info()["entries"] == 0


def test_cache_dir_default_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv("CUTETMA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "cutetma"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "cutetma"
    monkeypatch.setenv("CUTETMA_CACHE_DIR", str(tmp_path / "moved"))
    assert cache.cache_dir() == tmp_path / "moved"
    compile_fn = Counting()
    cache.load_or_compile(KEY, compile_fn)
    assert len(list((tmp_path / "moved").glob("*" + cache.SUFFIX))) == 1
    assert not (tmp_path / "home").exists()


def test_info_and_clear(cache_dir):
    assert cache.info()["entries"] == 0 and cache.clear() == 0
    cache.load_or_compile(KEY, Counting())
    cache.load_or_compile(dict(KEY, config="other"), Counting())
    assert cache.info()["entries"] == 2 and cache.info()["bytes"] > 0
    assert cache.clear() == 2
    assert cache.info()["entries"] == 0 and not list(cache_dir.iterdir())


# ---------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_an_entry_runs_on_the_gpu_in_a_fresh_process(cache_dir):
    """Compile and store here, then launch the stored kernel in a fresh process through
    ``.to().run_compiled_program`` (the ``PointerLaunch`` path) and read the result."""
    cache.load_or_compile(KEY, compile_fill)
    script = textwrap.dedent(f"""
        import ctypes, torch
        from cutetma.runtime import cache

        def refuse():
            raise SystemExit("compiled although the entry is on disk")

        fn = cache.load_or_compile({KEY!r}, refuse)
        x = torch.zeros(1000, device="cuda")
        slots = [ctypes.c_void_p(x.data_ptr()), ctypes.c_int32(1000), ctypes.c_float(2.5),
                 ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)]
        fn.to().run_compiled_program([ctypes.addressof(s) for s in slots])
        torch.cuda.synchronize()
        print("ok", bool((x == 2.5).all()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, CUTETMA_CACHE_DIR=str(cache_dir)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok True" in out.stdout
