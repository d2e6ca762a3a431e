"""``cutetma cache info | clear | warm``: the on-disk compile cache, and the argparse types
of ``cache warm`` (GEMM problems, attention specs, dtypes, loads, B layouts, jobs).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from cutetma.cli.args import UsageError, _argument_type, _integer, _say, _shown, writing

GEMM_SIZE_WHY = " (the GEMM takes sizes as Int32)"


def _gemm_problems(value: str) -> list[tuple[int, int, int]]:
    """``MxNxK[,MxNxK...]`` (or ``preset``) as a list of (M, N, K)."""
    from cutetma.runtime import warm

    if value.strip().lower() == "preset":
        return list(warm.GEMM_PRESET)
    problems = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*([+-]?\d+)\s*[xX]\s*([+-]?\d+)\s*[xX]\s*([+-]?\d+)\s*", part)
        if not match:
            raise ValueError(f"GEMM problem {_shown(part)!r} is not MxNxK, e.g. 4096x4096x4096")
        problems.append(tuple(_gemm_size(match[i], name)
                              for i, name in ((1, "M"), (2, "N"), (3, "K"))))
    return problems


def _gemm_size(digits: str, name: str) -> int:
    """A GEMM size in 1..2^31 - 1 (``_integer`` reads at most 9 digits, below that bound)."""
    magnitude = digits.lstrip("+-").lstrip("0") or "0"
    if len(magnitude) > 9 and not digits.startswith("-"):
        value = int(magnitude) if len(magnitude) <= 10 else 2**31
        if value > 2**31 - 1:
            raise ValueError(f"GEMM {name} must be at most {2**31 - 1}{GEMM_SIZE_WHY}, got "
                             f"{_shown(digits)}")
        return value
    return _integer(digits, f"GEMM {name}", 1, 2**31 - 1, GEMM_SIZE_WHY)


def _attention_spec(value: str) -> list[tuple[int, bool]]:
    """``d`` or ``d,causal`` (or ``preset``) as a list of (head dim, causal)."""
    from cutetma.runtime import warm

    if value.strip().lower() == "preset":
        return list(warm.ATTENTION_PRESET)
    match = re.fullmatch(r"\s*([+-]?\d+)\s*(?:,\s*(causal)\s*)?", value, re.IGNORECASE)
    if not match:
        raise ValueError(f"attention spec {_shown(value)!r} is not d or d,causal, e.g. "
                         "128,causal")
    d = _integer(match[1], "head dim", 1, 256)
    if d not in (64, 128, 256):
        raise ValueError(f"head dim {d}: the attention kernel takes 64, 128 or 256")
    return [(d, bool(match[2]))]


def _choices(allowed: tuple, aliases: dict, what: str):
    """A parser of ``a,b,...`` over ``allowed`` (and ``aliases``), repeats dropped."""

    def parse(value: str) -> list[str]:
        chosen = []
        for part in value.split(","):
            name = aliases.get(part.strip().lower(), part.strip().lower())
            if name not in allowed:
                raise ValueError(f"{what} {_shown(part.strip())!r}: one of {', '.join(allowed)}")
            if name not in chosen:
                chosen.append(name)
        return chosen

    return parse


def _jobs(value: str) -> int:
    if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        raise ValueError(f"--jobs {_shown(value)!r} is not a whole number of processes")
    return _integer(value.strip(), "--jobs", 1, 64)


def _page_sizes(value: str) -> list[int]:
    """``16,64,...``: page sizes of a paged KV cache, in keys."""
    return [_integer(part, "page size", 1, 1 << 20) for part in value.split(",")]


GEMM_PROBLEMS = _argument_type(_gemm_problems, "GEMM problems")
PAGE_SIZES = _argument_type(_page_sizes, "page sizes")
ATTENTION_SPEC = _argument_type(_attention_spec, "attention spec")
CACHE_DTYPES = _argument_type(_choices(("float16", "bfloat16"), {
    "fp16": "float16", "half": "float16", "bf16": "bfloat16"}, "dtype"), "dtypes")
CACHE_LOADS = _argument_type(_choices(("tma", "cp_async"), {"cp.async": "cp_async"}, "load"),
                             "loads")
B_LAYOUTS = _argument_type(_choices(("nk", "kn"), {}, "B layout"), "B layouts")
JOBS = _argument_type(_jobs, "jobs")


def _default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _cache():
    from cutetma.runtime import cache

    return cache


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _entry_dtypes(parts: dict) -> str:
    """The distinct element types of an entry's pointer arguments, in order (A, B, C)."""
    names = []
    for arg in parts.get("kernel", {}).get("args", []):
        match = re.match(r"Pointer\[(\w+)", arg) if isinstance(arg, str) else None
        if match and match[1] not in names:
            names.append(match[1])
    return ",".join(names) or "-"


def run_cache_info(args) -> int:
    """Where the compile cache is, whether it is on, what it holds (``--list``: each entry)."""
    cache = _cache()
    facts = cache.info()
    listed = cache.entries() if args.list else []
    current = cache.environment() if any("parts" in e for e in listed) else None
    rows = [{"key": e.get("key", Path(e["path"]).stem), "bytes": e.get("bytes", 0),
             "entry": e.get("parts", {}).get("kernel", {}).get("entry", "?"),
             "dtypes": _entry_dtypes(e.get("parts", {})),
             "config": e.get("parts", {}).get("kernel", {}).get("config", "?"),
             "current": e.get("parts", {}).get("env") == current,
             **({"error": e["error"]} if "error" in e else {})} for e in listed]
    if args.json:
        print(json.dumps({**facts, **({"list": rows} if args.list else {})}))
        return 0
    where = ("CUTETMA_CACHE_DIR" if os.environ.get("CUTETMA_CACHE_DIR")
             else "default; CUTETMA_CACHE_DIR moves it")
    print(f"folder:  {facts['dir']} ({where})")
    print("enabled: " + ("yes (CUTETMA_CACHE=0 turns it off)" if facts["enabled"]
                         else f"no (CUTETMA_CACHE={os.environ.get('CUTETMA_CACHE', '')})"))
    print(f"entries: {facts['entries']}, {_size(facts['bytes'])}")
    for row in rows:
        if "error" in row:
            print(f"{row['key'][:12]}  unreadable: {row['error']}")
            continue
        other = "" if row["current"] else "  (another build: never loaded by this one)"
        print(f"{row['key'][:12]}  {_size(row['bytes']):>8}  {row['entry']}  {row['dtypes']}  "
              f"{row['config']}{other}")
    return 0


def run_cache_clear(args) -> int:
    cache = _cache()
    removed = cache.clear()
    print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {cache.cache_dir()}")
    return 0


def run_cache_warm(args) -> int:
    """Compile what ``cutetma.gemm`` / ``cutetma.attention`` would launch for the given
    problems (``runtime.warm``), in worker processes, into the compile cache."""
    cache = _cache()
    if not cache.enabled():
        raise UsageError(f"the compile cache is off (CUTETMA_CACHE="
                         f"{os.environ.get('CUTETMA_CACHE', '')}): nothing would be kept; "
                         "unset CUTETMA_CACHE to warm it")
    from cutetma.runtime import warm

    folder = cache.cache_dir()
    created = not folder.exists()
    with writing("cache folder", folder):
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")
    if created:
        _say(f"created folder {folder}", to_stderr=True)
    neither = args.gemm is None and args.attention is None and args.paged is None
    gpu = warm.gpu_present()
    entries = []
    if args.gemm is not None or neither:
        gemms = warm.gemm_entries(args.gemm or warm.GEMM_PRESET, args.dtypes, args.load,
                                  args.b_layout, gpu)
        entries += gemms + (warm.probe_entries(gemms) if gpu else [])
    specs = [spec for group in args.attention or () for spec in group]
    if args.attention is not None or neither:
        entries += warm.attention_entries(specs or warm.ATTENTION_PRESET, args.dtypes,
                                          args.load)
    if args.paged is not None:  # the head dims and masks of --attention, else the preset's
        entries += warm.paged_entries(args.paged, specs or warm.ATTENTION_PRESET, args.dtypes,
                                      args.load)
    if args.backward:
        entries += warm.backward_entries(specs or warm.ATTENTION_PRESET, args.dtypes,
                                         args.load)
    jobs = min(args.jobs, len(entries)) if entries else 1
    machine = ("this GPU's SM count, cluster occupancy and probed tile order" if gpu else
               f"no GPU here: GEMMs as on an H200 ({warm.H200_SMS} SMs, {warm.H200_SMS} // "
               "cluster size clusters, the default raster band below M = 256)")
    _say(f"warming {len(entries)} entries into {folder} with {jobs} worker"
         f"{'s' if jobs > 1 else ''} ({machine})", to_stderr=True)
    width = max((len(e.name()) for e in entries), default=0)
    counts = {"compiled": 0, "hit": 0, "failed": 0}

    def progress(done, total, entry, result):
        status, seconds, error = result
        counts[status] += 1
        shown = {"hit": "hit", "compiled": "compiled"}.get(status, f"FAILED: {error}")
        _say(f"[{done:>{len(str(total))}}/{total}] {entry.name():<{width}} {seconds:6.1f} s "
             f"{shown}", to_stderr=True)

    start = time.perf_counter()
    warm.warm(entries, jobs, progress)
    seconds = time.perf_counter() - start
    failed = f", {counts['failed']} FAILED" if counts["failed"] else ""
    print(f"{len(entries)} entries: {counts['compiled']} compiled, {counts['hit']} already "
          f"there{failed}; {seconds:.1f} s with {jobs} worker{'s' if jobs > 1 else ''} "
          f"({folder})")
    return 1 if counts["failed"] else 0
