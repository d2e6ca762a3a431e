"""PTX fingerprints of the kernel configurations that ran on the H200, to prove a refactor
leaves their PTX alone (no GPU: the DSL compiles for sm_90a on the CPU).

    PYTHONPATH=/work/base/src python benchmarks/ptx_fingerprint.py record OUT.json [--jobs N]
    PYTHONPATH=/work/main/src python benchmarks/ptx_fingerprint.py check IN.json [--jobs N]

record (before tree) enumerates: GEMM: ``ops._gemm_config``'s automatic choice and every
candidate of benchmarks/gemm.py's tma / tma_multicast / cp_async columns over its grid and the
GPU tests' shapes, also with order_table=True where ``ops.order_table_pays`` (as
``cutetma.gemm`` runs it), fp16 and bf16, B K-major; the GPU tests' option lists, with N-major
B and fp32 out where they ran them (stream_k, load_hint, multicast_a/_b left out). Attention:
head_dim x causal x load x dtype, and the GPU tests' variants. Probes and microbenchmarks.
An entry keeps its config as the fields that differ from the dataclass defaults after
``__post_init__`` (resolved schedule / blocks / stages explicit: the configuration that ran,
not the rule that chose it; attention's ``dtype`` only picks those and is not kept). check
rebuilds each config with the current tree's classes (a field they lack: "removed option",
a failure), compiles it by the same code and compares; exit status 1 on any difference.

Compile: the library's launch helper (``[_]gemm_launch`` / ``[_]attention_launch``, found in
whichever cutetma module defines it, as the classes are) with ``cute.compile`` wrapped to keep
the PTX; where missing or taking other arguments, the call it makes (``Kernel(cfg).
from_pointers``, typed gmem pointers, 1 for sizes and strides, a fake stream, fake 1-D
workspace tensors). CUTETMA_CACHE=0: the after tree's disk cache neither answers nor grows.

Normalised before hashing: names declared by ``.entry`` / ``.func`` become KERNEL<i> / FUNC<i>
everywhere (``_param_<j>`` suffixes kept): the DSL names a kernel after its class's module
path plus a truncated mangling of its argument types, so moving a class renames it; the
argument types stay compared through the ``.param`` lines and the body. Whole-line ``//``
comments (compiler banner, ``.globl``, inline-asm markers), ``.file`` / ``.loc`` lines,
``.section .debug*`` blocks and blank lines go; all else is hashed as is (``.version``,
``.target`` too). Each run prints a raw kernel name and its normal form.
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import difflib
import functools
import hashlib
import importlib.util
import json
import multiprocessing
import os
import pkgutil
import re
import sys
import tempfile
import time
import zlib
from pathlib import Path

os.environ["CUTE_DSL_ARCH"] = "sm_90a"  # before anything imports cutlass (workers too)
os.environ["CUTETMA_CACHE"] = "0"  # the after tree's disk cache: always compile, write nothing
DELETED = ("stream_k", "load_hint", "multicast_a", "multicast_b")
KEYS = ("kind", "cls", "config", "ab", "c", "b_k_major", "clusters")
AUTO_SHAPES = [  # the shapes tests/test_gemm_gpu.py gives the automatic choice
    (2048, 5120, 1000), (2000, 5000, 777), (2048, 7680, 136), (512, 1536, 5120),
    (256, 1536, 5120), (200, 1528, 5000), (208, 432, 3000), (208, 256, 1000), (136, 520, 3000),
    (256, 7680, 5120), (250, 7000, 5000), (500, 4000, 4097), (129, 8192, 1000),
    (256, 16384, 512), (300, 17000, 500), (257, 24577, 1504), (300, 9000, 4000),
    (500, 14000, 3001), (256, 512, 5120), (512, 512, 5120), (2047, 511, 5120)]


class RemovedOption(Exception):
    pass


@functools.cache
def modules() -> list:
    """cutetma and every submodule that imports (the CLI and plotting left out)."""
    import cutetma

    names = [m.name for m in pkgutil.walk_packages(cutetma.__path__, "cutetma.", lambda _: None)
             if not re.search(r"__main__|\.cli|\.viz", m.name)]
    return [cutetma] + [m for m in map(_import, sorted(names)) if m]


def _import(name: str):
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def find(*names: str):
    """The first of ``names`` that cutetma or a submodule defines (wherever a refactor put it)."""
    return next((getattr(m, n) for n in names for m in modules() if hasattr(m, n)), None)


def load_file(relative: str):
    """A module of the tree on the path, outside the package (tests/, benchmarks/)."""
    import cutetma

    path = Path(cutetma.__file__).resolve().parents[2] / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    spec.loader.exec_module(module := importlib.util.module_from_spec(spec))
    return module


def config_dict(cfg) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if not (type(cfg).__name__ == "AttentionConfig" and f.name == "dtype")
            and (f.default is dataclasses.MISSING or getattr(cfg, f.name) != f.default)}


def build(cls_name: str, fields: dict):
    cls = find(cls_name)
    if gone := {k: v for k, v in fields.items() if k not in {f.name for f in
                                                             dataclasses.fields(cls)}}:
        raise RemovedOption(f"removed option(s) {gone}")
    return cls(**fields)


def normalise(ptx: str) -> tuple[str, list[str]]:
    head = r"^[ \t]*(?:\.(?:visible|weak|extern)\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)"
    names = list(dict.fromkeys(m.group(1, 2) for m in re.finditer(head, ptx, re.M)))
    new = {name: f"{'KERNEL' if kind == 'entry' else 'FUNC'}"
           f"{[k for k, _ in names[:i]].count(kind)}" for i, (kind, name) in enumerate(names)}
    for name in sorted(new, key=len, reverse=True):  # a name may prefix another
        ptx = re.sub(rf"(?<![\w$]){re.escape(name)}(?=_param_\d|[^\w$]|$)", new[name], ptx)
    ptx = re.sub(r"^\s*\.section\s+\.debug\w*\s*\{.*?^\s*\}", "", ptx, flags=re.M | re.S)
    keep = [ln for ln in ptx.splitlines() if ln.strip() and not re.match(
        r"\s*(//|\.file\b|\.loc\b)", ln)]
    return "\n".join(keep) + "\n", [name for _, name in names]


def compile_ptx(e: dict, cfg) -> tuple[str, str]:
    """(raw PTX, the path it took) of one entry: the same code in record and check."""
    import torch
    from cutlass.cute import runtime

    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    if e["kind"] in ("probe", "round_trip"):
        fn = find("compile_probe" if cfg else "compile_round_trip")
        return (fn(cfg) if cfg else fn(2, "128B", 64, 64)).ptx, f"{fn.__module__}.{fn.__name__}"
    if e["kind"] == "microbench":  # the PTX tests' own compile helpers
        helper = e["cls"].removesuffix("Config").lower() + "_ptx"  # latency_ptx, ...
        return getattr(load_file("tests/test_microbench_ptx.py"), helper)(cfg), helper
    ptr = lambda name, align=16: runtime.make_ptr(  # noqa: E731  (ops._typed_pointer)
        getattr(cutlass, {"float16": "Float16", "bfloat16": "BFloat16"}.get(name, "Float32")),
        16, cute.AddressSpace.gmem, assumed_align=align)
    fake1d = lambda t, align: runtime.make_fake_tensor(  # noqa: E731
        t, (cute.sym_int32(),), (1,), assumed_align=align)
    ab, stream = getattr(torch, e["ab"]), runtime.make_fake_stream()
    if e["kind"] == "gemm":
        ws = (fake1d(cutlass.Float32, 16), fake1d(cutlass.Int32, 4)) if (
            cfg.split_k > 1 or getattr(cfg, "stream_k", False)) else ()
        ws = (None, None, fake1d(cutlass.Int32, 4)) if cfg.order_table else ws
        names = ("gemm_launch", "_gemm_launch")
        args = (ab, getattr(torch, e["c"]), e["b_k_major"], cfg, e["clusters"], ws)
        direct = (find("HopperGemm")(cfg).from_pointers, ptr(e["ab"]), ptr(e["ab"]),
                  ptr(e["c"]), *(1,) * 7, e["b_k_major"], e["clusters"], stream, *ws)
    else:
        names, args = ("attention_launch", "_attention_launch"), (ab, cfg)
        direct = (find("FlashAttentionSm90")(cfg).from_pointers,
                  *(ptr(e["ab"]) for _ in range(4)), ptr("float32", 4), *(1,) * 18,
                  cutlass.Float32(1.0), cutlass.Int32(1), stream)
    captured, real, via = [], cute.compile, "from_pointers"

    def keep_ptx(fn, *a, options="", **kw):
        with tempfile.TemporaryDirectory(prefix="ptx-fingerprint-") as tmp:
            compiled = real(fn, *a, options=f"{options} --keep-ptx --dump-dir={tmp}".strip(), **kw)
            dumped = [p.read_text() for p in Path(tmp).iterdir() if p.suffix == ".ptx"]
            captured.append(getattr(compiled, "__ptx__", None) or dumped[0])
        return compiled

    cute.compile = keep_ptx
    try:
        if helper := find(*names):
            for module in modules():  # in-process caches, or nothing would compile
                getattr(module, "_COMPILED", {}).clear()
            try:
                helper(*args)
                via = f"{helper.__module__}.{helper.__name__}" if captured else via
            except Exception:
                if captured:  # the compile itself failed: report that
                    raise
        if not captured:  # no helper, or one with other arguments
            cute.compile(*direct)
    finally:
        cute.compile = real
    if ".target sm_90a" not in captured[-1]:
        raise RuntimeError("the PTX does not target sm_90a")
    return captured[-1], via


def work(e: dict) -> dict:
    t0 = time.perf_counter()
    try:
        ptx, via = compile_ptx(e, build(e["cls"], e["config"]) if e["cls"] else None)
        text, names = normalise(ptx)
        return dict(hash=hashlib.sha256(text.encode()).hexdigest()[:20], via=via, names=names,
                    ptx_z=base64.b64encode(zlib.compress(text.encode(), 9)).decode(),
                    seconds=round(time.perf_counter() - t0, 2))
    except Exception as exc:  # report, keep going
        return {"removed" if isinstance(exc, RemovedOption) else "error":
                f"{type(exc).__name__}: {exc}"[:400], "seconds": round(time.perf_counter() - t0, 2)}


def enumerate_entries() -> list[dict]:
    """The module docstring's configurations, from the tree on the path (the before)."""
    from cutetma import kernels, ops
    from cutetma.kernels import attention_sm90 as att
    from cutetma.kernels import gemm_sm90
    from cutetma.kernels import microbench as mb

    bench, tests, entries = load_file("benchmarks/gemm.py"), load_file(
        "tests/test_gemm_gpu.py"), {}

    def params(test, arg):  # a @pytest.mark.parametrize list of the GPU tests
        return next(m.args[1] for m in getattr(tests, test).pytestmark if m.args[0] == arg)

    def add(source, cfg, ab="float16", c=None, b_k_major=True, kind="gemm"):
        size = getattr(cfg, "cluster_m", 1) * getattr(cfg, "cluster_n", 1)
        e = dict(kind=kind, cls=cfg and type(cfg).__name__, config=cfg and config_dict(cfg) or {},
                 ab=ab, c=c or ab, b_k_major=b_k_major, clusters=132 // size)
        if cfg and config_dict(build(e["cls"], e["config"])) != e["config"]:
            raise AssertionError(f"{cfg} does not survive its dict {e['config']}")
        entries.setdefault(json.dumps(e, sort_keys=True), dict(e, source=source))

    def gemm(source, mnk, dtypes, b_k_major=True, pdl=False, **options):
        if any(options.get(key) for key in DELETED):
            return
        (m, n, k), opts = mnk, {key: tuple(v) if isinstance(v, list) else v
                                for key, v in options.items()}
        cfg = ops._gemm_config(m, n, opts.pop("load", "tma"), opts.pop("cluster", None),
                               opts.pop("tile", None), 132, k=k, b_k_major=b_k_major,
                               **{"split_k": None, **opts})
        cfg = dataclasses.replace(cfg, pdl=True) if pdl else cfg
        try:
            ops.check_tile_for_b(cfg, b_k_major)
        except ValueError:
            return  # refused before launch
        table = ops.order_table_pays(m, n, cfg)
        for c in [cfg, dataclasses.replace(cfg, order_table=True)] if table else [cfg]:
            for ab, out in dtypes:
                add(f"{source} {m}x{n}x{k}", c, ab, out, b_k_major)

    same = [("float16", "float16"), ("bfloat16", "bfloat16")]
    with_fp32 = same + [("float16", "float32")]
    for mnk in bench.cells(False) + AUTO_SHAPES:
        gemm("auto", mnk, same)
        for column in bench.MECHANISMS:
            for options in bench.candidates(column, *mnk):
                gemm(column, mnk, same, **options)
    for mnk in AUTO_SHAPES[:3] + [(1000, 129, 4097), (129, 1000, 64), (4097, 256, 512)]:
        for load, tile in ((ld, t) for ld in ("tma", "cp_async") for t in (None, (128, 160))):
            gemm("N-major", mnk, same + [("bfloat16", "float32")], False, load=load, tile=tile)
    for mnk, options in ((x, o) for x in tests.PAPER for o in tests.VARIANTS):
        gemm("test VARIANTS", mnk, same, **options)
    for options in tests.FITTED_WIDTHS + tests.WIDE_TILES:
        gemm("test widths", (256, 5120, 5120), with_fp32, **options)
        gemm("test widths", (256, 5120, 5120), same[:1], False, **options)
    for options, b_k_major in ((o, b) for o in tests.BIG_CLUSTERS for b in (True, False)):
        gemm("test clusters", (256, 1536, 5120), with_fp32, b_k_major, load="tma_multicast",
             **options)
    for options in params("test_programmatic_dependent_launch_chain", "options"):
        gemm("test pdl", (1000, 1032, 1032), same[:1], pdl=True, **options)
    for v in tests.EPILOGUE_BUFFERS:  # as the test builds them: a config, no order table
        cluster = v.get("cluster", (1, 1))
        cfg = ops._gemm_config(4097, 3000, "tma_multicast" if cluster != (1, 1) else "tma",
                               cluster, v["tile"], 132, v.get("schedule"), v.get("split_k", 1),
                               1000)
        for ab, out in with_fp32:
            add("test epilogue", dataclasses.replace(cfg, epi_stages=v.get("epi_stages")), ab,
                out)
    for fields in params("test_order_table", "fields"):
        add("test order_table", gemm_sm90.GemmConfig(order_table=True, **fields))

    f16, b16 = "float16", "bfloat16"
    variants = [(dt, dict(head_dim=d, causal=c, load=ld, dtype=dt)) for d in (64, 128, 256)
                for c in (False, True) for ld in ("tma", "cp_async") for dt in (f16, b16)]
    for c in (False, True):  # and test_attention_gpu.py's
        variants += [(b16, dict(head_dim=d, causal=c, schedule=s, **blocks))
                     for s in ("serial", "overlap", "pingpong")
                     for d, blocks in ((64, dict(block_m=192, block_n=96)), (128, {}))]
        variants += [(f16, dict(head_dim=d, causal=c, pv_wait=other)) for d, other in
                     ((d, {"early": "late"}.get(att.PV_WAIT[d], "early")) for d in (64, 128, 256))]
        variants += [(f16, dict(head_dim=d, causal=c, block_m=bm, block_n=bn))
                     for d, bm, bn in ((64, 192, 96), (256, 128, 64), (256, 128, 80))]
        variants += [(b16, dict(head_dim=128, causal=c, load=ld, q_stages=2))
                     for ld in ("tma", "cp_async")]
    for dtype, fields in variants:
        add("attention", att.AttentionConfig(**fields), dtype, kind="attention")
    for cfg in kernels.showcase_configs().values():
        add("probe", cfg, kind="probe")
    add("round trip", None, kind="round_trip")
    for cfg in (mb.LatencyConfig("tma", 32), mb.LatencyConfig("cp_async", 32),
                mb.StreamConfig("tma", 16), mb.StreamConfig("cp_async", 64, stages=2),
                mb.BroadcastConfig("tma_multicast", 2, 16, 64),
                mb.BroadcastConfig("dsm", 2, 56, 256)):
        add("microbench", cfg, kind="microbench")
    return list(entries.values())


def label(e: dict) -> str:
    types = f" {e['ab']}->{e['c']}" if e["kind"] in ("gemm", "attention") else ""
    major = {True: " K", False: " N"}[e["b_k_major"]] if e["kind"] == "gemm" else ""
    return f"{e['kind']}{types}{major} {' '.join(f'{k}={v}' for k, v in e['config'].items())} " \
           f"[{e['source']}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("record", "check"))
    ap.add_argument("path", type=Path)
    ap.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    ap.add_argument("--limit", type=int, help="only the first N configurations (a trial)")
    args = ap.parse_args(argv)
    import cutetma

    recorded = json.loads(args.path.read_text())["entries"] if args.mode == "check" else None
    entries = (recorded or enumerate_entries())[:args.limit]
    print(f"{args.mode}: {len(entries)} configurations, cutetma from "
          f"{Path(cutetma.__file__).parent}, {args.jobs} job(s)", flush=True)
    unpack = lambda z: zlib.decompress(base64.b64decode(z)).decode().splitlines()  # noqa: E731
    t0, failed, out, seen = time.perf_counter(), 0, [], collections.Counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=50) as pool:
        results = pool.imap(work, [{k: e[k] for k in KEYS} for e in entries])
        for i, (e, r) in enumerate(zip(entries, results, strict=True)):
            status, notes = "ok", [r.get("error") or r.get("removed")] if "hash" not in r else []
            if notes:
                status = "ERROR" if "error" in r else "REMOVED OPTION"
            elif recorded and "hash" not in e:
                status, notes = "NO RECORD", [e.get("error") or e.get("removed")]
            elif recorded and r["hash"] != e["hash"]:
                status, notes = "MISMATCH", list(difflib.unified_diff(
                    unpack(e["ptx_z"]), unpack(r["ptx_z"]), "before", "after", n=1,
                    lineterm=""))[2:16]
            seen[f"compiled through {r.get('via')}" + (f" (recorded: {e.get('via')})"
                                                       if recorded else "")] += 1
            if recorded and "hash" in r and r["names"][:1] != e.get("names", [])[:1]:
                stem = lambda name: re.sub(r"_object_at_.*", "...", name)  # noqa: E731
                seen[f"renamed (normalised away): {stem(e['names'][0])} -> "
                     f"{stem(r['names'][0])}"] += 1
            seen[f"normalised kernel name: {r.get('names', ['-'])[0]} -> KERNEL0"] += 1
            failed += status != "ok"
            print(f"[{i + 1}/{len(entries)}] {r['seconds']:6.2f}s {status:8} "
                  f"{r.get('hash', '-')} {label(e)}", flush=True)
            print("".join(f"      {note}\n" for note in notes), end="", flush=True)
            out.append(dict(e, **r))
    print("".join(f"{n} x {what}\n" for what, n in seen.items() if not what.startswith("norm")),
          next((f"e.g. {what}" for what in seen if what.startswith("norm")), ""), sep="")
    print(f"{len(entries)} configurations in {time.perf_counter() - t0:.0f} s, {failed} "
          f"{'differ or failed' if recorded else 'failed to compile'}")
    if args.mode == "record":
        meta = dict(tree=str(Path(cutetma.__file__).parent), created=time.ctime(), argv=sys.argv)
        args.path.write_text(json.dumps(dict(meta=meta, entries=out), indent=1))
        print(f"wrote {args.path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
