"""The on-disk compile cache: every kernel is compiled once per machine and loaded afterwards.

``load_or_compile(key_parts, compile_fn)`` returns the DSL's compiled function for a key:
read from ``cache_dir()`` when an entry is there and sound, else ``compile_fn()`` (one
``cute.compile``) written there first. What is kept is the DSL's own export of the compiled
function, ``JitCompiledFunction.dump_to_object(prefix)``: one relocatable ELF object with the
host launch code and the sm_90a cubin inside, and the signature and kernel attributes as
metadata. ``cute.runtime.load_module(path)[prefix]`` turns it back into a
``CudaDialectJitCompiledFunction`` whose ``.to().run_compiled_program(args)`` takes the same
argument list as the freshly compiled one (``runtime.launch.PointerLaunch``). Exporting and
loading need no GPU: only ``.to()`` (the first launch) loads the cubin through the CUDA
driver, so a machine without one can fill a cache (``tests/test_cache.py`` checks all of it
on a CPU).

The key is a sha256 over the pieces of ``environment()`` (a fingerprint of cutetma's kernel
sources, the DSL's version, CUDA version and compile-affecting settings (``CUTE_DSL_*``: the
DSL's own cache key, less the runtime library's path), the arch, this file's entry format)
and the caller's ``key_parts`` (the kernel entry, the configuration's repr, the compile
arguments' types: ``describe_args``). Anything that changes the kernel changes the
key; an entry is never looked up under another.

Settings: ``CUTETMA_CACHE_DIR`` moves the cache (default ``$XDG_CACHE_HOME/cutetma``, else
``~/.cache/cutetma``); ``CUTETMA_CACHE=0`` turns it off (nothing is read or written).

Many processes at once: an entry is written under a per-entry ``fcntl`` lock, to a temporary
name in the same folder, then moved in place with ``os.replace`` (atomic), so a reader sees
a whole entry or none, and two processes that miss the same key compile it once. Each entry
is a header line (format, key, the key's pieces in readable JSON, the payload's length and
sha256) and the payload. A corrupt, truncated, stale or unloadable entry is removed,
rebuilt and reported in one ``CacheWarning``; a cache folder that cannot be written costs a
warning and a compile, never a crash.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import tempfile
import warnings
from pathlib import Path

FORMAT = 1
MAGIC = b"cutetma-compile-cache\n"
SUFFIX = ".entry"
# what the kernels are made of: a change to any of these files is a new key
SOURCE_DIRS = ("kernels", "copy")
SOURCE_FILES = ("dsl.py", "swizzle.py")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_WARNED: set = set()  # what _warn_once already reported in this process


class CacheWarning(UserWarning):
    """An entry of the compile cache was bad (and rebuilt), or the cache could not be used."""


# ---------------------------------------------------------------------------- settings


def enabled() -> bool:
    """False when ``CUTETMA_CACHE`` is 0 / false / no / off."""
    return os.environ.get("CUTETMA_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """``CUTETMA_CACHE_DIR``, else ``$XDG_CACHE_HOME/cutetma``, else ``~/.cache/cutetma``."""
    chosen = os.environ.get("CUTETMA_CACHE_DIR")
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "cutetma"


# ---------------------------------------------------------------------------- the key


@functools.cache
def source_fingerprint() -> str:
    """sha256 over cutetma's kernel sources (``SOURCE_DIRS``' .py files and ``SOURCE_FILES``),
    each file's path relative to the package and its bytes."""
    root = Path(__file__).resolve().parents[1]
    files = [root / name for name in SOURCE_FILES]
    for folder in SOURCE_DIRS:
        files += (root / folder).rglob("*.py")
    digest = hashlib.sha256()
    for path in sorted(set(files)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def _dsl_facts() -> dict:
    from cutetma import dsl

    cutlass, _ = dsl.cutlass()
    try:
        from cutlass.base_dsl.version_info import CUDA_VERSION

        cuda = f"{CUDA_VERSION.major}.{CUDA_VERSION.minor}"
    except Exception:  # noqa: BLE001 - a DSL without it: the version alone keys it
        cuda = "unknown"
    try:  # the DSL's settings that change what it compiles (its own cache key's), less the
        # runtime library's path (the machine's; its ABI is the version's)
        from cutlass.cutlass_dsl import CuTeDSL

        settings = ";".join(item for item in CuTeDSL._get_dsl().envar.cache_key_str().split(";")
                            if item and not item.startswith("shared_libs="))
    except Exception:  # noqa: BLE001
        settings = "unknown"
    return {"dsl": str(cutlass.__version__), "dsl_cuda": cuda, "arch": dsl._current_arch(cutlass),
            "dsl_settings": settings}


def environment() -> dict:
    """The pieces of every key that do not depend on the kernel. No Python version: an entry
    is a cubin and its launch code, with no Python ABI, and one filled under Python 3.11 on a
    machine without a GPU loaded and ran bit-identically under 3.12 on the H200
    (docs/design.md, "Compile cache")."""
    return {"format": FORMAT, "sources": source_fingerprint(), **_dsl_facts()}


def _stable(value):
    """``value``'s repr for a key, refused where it holds an address (``<X object at 0x...>``
    would make different configurations collide, or the same one miss)."""
    text = repr(value)
    if _ADDRESS.search(text):
        raise TypeError(f"compile-cache key part {text} has no stable repr: pass a string")
    return text


def describe_args(*args) -> list:
    """The compile arguments of a ``cute.compile`` call as key pieces: what the compiled code
    depends on (types, alignments, static layouts, constexpr values), never an address."""
    out = []
    for arg in args:
        kind = type(arg).__name__
        if arg is None or isinstance(arg, (bool, int, float, str)):
            out.append(arg)
        elif kind == "_Pointer":
            out.append(f"Pointer[{arg.dtype}, {arg.memspace}, align={arg._assumed_align}]")
        elif kind == "_Tensor":
            layout = _ADDRESS.sub("", repr(arg))  # Tensor<@generic o (?):(1)>: static parts
            extras = [f"{name}={getattr(arg, name, None)}" for name in (
                "_assumed_align", "leading_dim", "_use_32bit_stride", "dynamic_shapes_mask",
                "dynamic_strides_mask")]
            out.append(f"Tensor[{arg.element_type}, {arg.memspace}, {layout}, "
                       + ", ".join(extras) + "]")
        elif kind == "_FakeStream":
            out.append(f"FakeStream[env={arg.use_tvm_ffi_env_stream}]")
        else:
            out.append(f"{kind}:{_stable(arg)}")
    return out


def key_of(key_parts: dict) -> tuple[str, dict]:
    """(the sha256 key, every piece it was made of) for the caller's ``key_parts``."""
    parts = {"env": environment(), "kernel": key_parts}
    text = json.dumps(parts, sort_keys=True, default=_stable)
    return hashlib.sha256(text.encode()).hexdigest(), json.loads(text)


# ---------------------------------------------------------------------------- entries


class _Bad(Exception):
    """Why an entry cannot be used (the warning's text)."""


def _entry_path(key: str) -> Path:
    return cache_dir() / (key + SUFFIX)


def _prefix(key: str) -> str:
    return "cutetma_" + key[:32]  # the symbol prefix inside the object: one per entry


def _encode(key: str, parts: dict, payload: bytes) -> bytes:
    header = {"format": FORMAT, "key": key, "prefix": _prefix(key), "parts": parts,
              "length": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def _decode(blob: bytes, key: str) -> tuple[dict, bytes]:
    """(header, payload) of an entry's bytes, or ``_Bad`` saying what is wrong."""
    if not blob.startswith(MAGIC):
        raise _Bad("not a cutetma cache entry (corrupt)")
    end = blob.find(b"\n", len(MAGIC))
    if end < 0:
        raise _Bad("truncated in its header")
    try:
        header = json.loads(blob[len(MAGIC):end])
    except ValueError:
        raise _Bad("corrupt (unreadable header)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _Bad(f"stale (format {header.get('format') if isinstance(header, dict) else '?'}"
                   f", this cutetma writes {FORMAT})")
    if header.get("key") != key or header.get("prefix") != _prefix(key):
        raise _Bad("stale (written for another key)")
    payload = blob[end + 1:]
    if len(payload) != header.get("length"):
        raise _Bad(f"truncated ({len(payload)} of {header.get('length')} bytes)")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise _Bad("corrupt (checksum mismatch)")
    return header, payload


def _load_object(payload: bytes, prefix: str):
    """The compiled function in an exported object (no GPU needed until its first launch)."""
    from cutetma import dsl

    _, cute = dsl.cutlass()
    fd, path = tempfile.mkstemp(prefix="cutetma-", suffix=".o")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        module = cute.runtime.load_module(path)  # reads the whole file into the engine
        return module[prefix]
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _read(key: str):
    """The compiled function of a sound entry; None where there is no entry; ``_Bad``."""
    try:
        blob = _entry_path(key).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Bad(f"unreadable ({e})") from None
    header, payload = _decode(blob, key)
    try:
        return _load_object(payload, header["prefix"])
    except Exception as e:  # noqa: BLE001 - the DSL raises its own types
        raise _Bad(f"unloadable ({type(e).__name__}: {str(e).strip()[:200]})") from None


def _warn(text: str) -> None:
    warnings.warn(text, CacheWarning, stacklevel=3)  # at load_or_compile's caller


def _warn_once(what, text: str) -> None:
    """A warning about the cache as a whole (or one kernel), once per process."""
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(text, CacheWarning, stacklevel=3)


@contextlib.contextmanager
def _locked(key: str):
    """The entry's lock, held by one process at a time (released if the holder dies)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic replace alone keeps entries whole
        yield
        return
    fd = os.open(cache_dir() / (key + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write(key: str, parts: dict, payload: bytes) -> None:
    folder = cache_dir()
    fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from other users
            f.write(_encode(key, parts, payload))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, _entry_path(key))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_or_compile(key_parts: dict, compile_fn):
    """The compiled function for ``key_parts``: loaded from the cache, or ``compile_fn()``
    (once across processes) and stored.

    ``key_parts``: JSON-able pieces naming the kernel (entry, configuration, argument
    types: ``describe_args``); values that are not JSON go in by their repr, which must not
    hold an address. ``compile_fn``: returns what ``cute.compile`` returns. On a miss the
    function returned is the one loaded back from the entry just written, so a first and a
    later process run the same code.
    """
    if not enabled():
        return compile_fn()
    key, parts = key_of(key_parts)
    try:
        found = _read(key)  # no lock: entries appear whole (os.replace)
        if found is not None:
            return found
    except _Bad:
        pass  # looked at again under the lock: another process may be rebuilding it
    stack = contextlib.ExitStack()
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        stack.enter_context(_locked(key))
    except OSError as e:
        _warn_once("unwritable", f"cutetma compile cache: {cache_dir()} cannot be used ({e}); "
                                 "compiling without it (CUTETMA_CACHE_DIR moves it, "
                                 "CUTETMA_CACHE=0 turns it off)")
        return compile_fn()
    with stack:
        try:
            found = _read(key)
            if found is not None:
                return found  # another process compiled it while we waited for the lock
        except _Bad as bad:
            _warn(f"cutetma compile cache: entry {_entry_path(key)} was {bad}; removed and "
                  f"rebuilt")
            with contextlib.suppress(OSError):
                _entry_path(key).unlink()
        compiled = compile_fn()
        try:
            payload = compiled.dump_to_object(_prefix(key))
        except Exception as e:  # noqa: BLE001 - not exportable: run it uncached
            _warn_once(("export", key), f"cutetma compile cache: {key_parts!r} cannot be "
                                        f"exported ({type(e).__name__}: {e}); not cached")
            return compiled
        try:
            _write(key, parts, payload)
            return _read(key) or compiled
        except OSError as e:
            _warn_once("unwritable", f"cutetma compile cache: writing to {cache_dir()} failed "
                                     f"({e}); compiling without it")
            return compiled
        except _Bad as bad:  # what we wrote does not load back: keep nothing of it
            _warn(f"cutetma compile cache: entry {_entry_path(key)} was {bad} right after "
                  f"writing; removed, running the kernel as compiled")
            with contextlib.suppress(OSError):
                _entry_path(key).unlink()
            return compiled


# ---------------------------------------------------------------------------- maintenance


def entries() -> list[dict]:
    """The headers of the entries in the cache folder (unreadable ones as ``{"path": ...,
    "error": ...}``), for ``cutetma cache info``."""
    folder = cache_dir()
    out = []
    for path in sorted(folder.glob("*" + SUFFIX)) if folder.is_dir() else []:
        try:
            with open(path, "rb") as f:
                head = f.read(1 << 16)
            if not head.startswith(MAGIC):
                raise ValueError("not a cutetma cache entry")
            header = json.loads(head[len(MAGIC):head.index(b"\n", len(MAGIC))])
            out.append({"path": str(path), "bytes": path.stat().st_size, **header})
        except (OSError, ValueError) as e:
            out.append({"path": str(path), "error": str(e)})
    return out


def info() -> dict:
    """Where the cache is, whether it is on, how many entries and bytes it holds."""
    folder = cache_dir()
    files = list(folder.glob("*" + SUFFIX)) if folder.is_dir() else []
    total = 0
    for path in files:
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return {"dir": str(folder), "enabled": enabled(), "entries": len(files), "bytes": total}


def clear() -> int:
    """Remove every entry (and leftover lock and temporary files); the number of entries."""
    folder = cache_dir()
    if not folder.is_dir():
        return 0
    removed = 0
    for path in folder.iterdir():
        if path.suffix in (SUFFIX, ".lock", ".tmp"):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += path.suffix == SUFFIX
    return removed
