"""``cutetma cache info | clear | warm`` (``cutetma.cli``, ``cutetma.runtime.warm``), on a
CPU: warming one small GEMM and one attention kernel compiles them into a temporary
``CUTETMA_CACHE_DIR`` through the ops' own launch functions, ``info`` counts and lists them,
a second warm in a fresh process (two spawned workers) finds both on disk, ``clear`` empties
the folder; the entries are what ``cutetma.gemm`` would launch (the order-table decision,
workspace tensors typed as CUDA tensors); every bad argument is one stderr line and exit 2.
On the GPU: a warmed problem's ``cutetma.gemm`` call in a fresh process compiles nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cutetma.cli import main

GEMM = "256x256x256"  # M >= 256, unsplit: the order table and its workspace
# d = 128 causal: one attention kernel (non-causal adds the 160-key one of short odd
# lengths, d = 64 its 192-row tiles)
WARM = ["cache", "warm", "--gemm", GEMM, "--attention", "128,causal", "--dtypes", "float16"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("CUTETMA_CACHE_DIR", str(folder))
    monkeypatch.delenv("CUTETMA_CACHE", raising=False)
    monkeypatch.delenv("CUTETMA_PLACEMENT", raising=False)
    return folder


def _progress(err: str) -> list[str]:
    return [line for line in err.splitlines() if re.match(r"\[\d+/\d+\] ", line)]


def test_warm_info_second_warm_hits_and_clear(cache_dir, capsys):
    assert main([*WARM, "--jobs", "1"]) == 0
    captured = capsys.readouterr()
    lines = _progress(captured.err)
    assert len(lines) == 2 and all(line.endswith(" compiled") for line in lines)
    assert lines[0].startswith("[1/2] gemm fp16 64x80 order table tma [256x256x256]")
    assert "no GPU here" in captured.err and f"created folder {cache_dir}" in captured.err
    assert captured.out.startswith("2 entries: 2 compiled, 0 already there;")

    assert main(["cache", "info", "--json", "--list"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["dir"], facts["enabled"], facts["entries"]) == (str(cache_dir), True, 2)
    assert facts["bytes"] == sum(p.stat().st_size for p in cache_dir.glob("*.entry"))
    assert {(row["entry"], row["dtypes"], row["current"]) for row in facts["list"]} == {
        ("HopperGemm.from_pointers", "Float16", True),
        ("FlashAttentionSm90.from_pointers", "Float16,Float32", True)}
    assert main(["cache", "info", "--list"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[1] == "enabled: yes (CUTETMA_CACHE=0 turns it off)"
    assert text[2].startswith("entries: 2, ")
    assert any("HopperGemm.from_pointers  Float16  GemmConfig(tile_m=64, tile_n=80" in line
               and "order_table=True" in line for line in text[3:])

    # a fresh process, two spawned workers: both entries load from disk, nothing compiles
    again = subprocess.run([sys.executable, "-m", "cutetma", *WARM, "--jobs", "2"],
                           capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert again.returncode == 0, again.stderr[-2000:]
    assert [line.rsplit(" ", 1)[1] for line in _progress(again.stderr)] == ["hit", "hit"]
    assert again.stdout.startswith("2 entries: 0 compiled, 2 already there;")
    assert "2 workers" in again.stdout

    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"removed 2 entries from {cache_dir}\n"
    assert main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0
    assert not list(cache_dir.glob("*.entry"))


def test_info_of_a_missing_or_disabled_cache(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "nowhere"
    monkeypatch.setenv("CUTETMA_CACHE_DIR", str(folder))
    monkeypatch.setenv("CUTETMA_CACHE", "0")
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"folder:  {folder} (CUTETMA_CACHE_DIR)" in out
    assert "enabled: no (CUTETMA_CACHE=0)" in out and "entries: 0, 0 B" in out
    assert main(["cache", "clear"]) == 0
    assert not folder.exists()  # neither looking nor clearing makes the folder


def test_entries_are_what_gemm_launches(monkeypatch):
    """The configuration ``ops.gemm`` launches without a GPU's probe: the model's choice,
    with the order table where ``order_table_pays`` and placement is on; one entry per
    distinct kernel, every problem that launches it named."""
    from cutetma.runtime import placement, warm
    from cutetma.tuning import gemm as tuning

    monkeypatch.delenv("CUTETMA_PLACEMENT", raising=False)
    table = warm.gemm_entry(4096, 4096, 4096, "bfloat16")
    chosen = tuning.select_gemm_config(4096, 4096, 4096)
    assert table.cfg == chosen.__class__(**{**vars(chosen), "order_table": True})
    assert (table.workspace, table.clusters, table.b_k_major) == ("order_table", 132, True)
    split = warm.gemm_entry(64, 256, 4096, "bfloat16")
    assert split.cfg == tuning.select_gemm_config(64, 256, 4096) and split.cfg.split_k > 1
    assert split.workspace == "split"
    pair = warm.gemm_entry(512, 4096, 4096, "bfloat16")  # (2, 1) clusters: 132 // 2 of them
    assert (pair.cfg.cluster_m, pair.clusters) == (2, 66)
    kn = warm.gemm_entry(4096, 4096, 4096, "bfloat16", b_layout="kn")
    assert not kn.b_k_major and kn.cfg == warm.gemm_entry(4096, 4096, 4096, "bfloat16").cfg
    monkeypatch.setenv("CUTETMA_PLACEMENT", "0")
    plain = warm.gemm_entry(4096, 4096, 4096, "bfloat16")
    assert plain.cfg == chosen and plain.workspace == ""

    entries = warm.gemm_entries([(4096, 4096, 4096), (8192, 8192, 8192)], ["float16"])
    assert len(entries) == 1 and entries[0].problems == ((4096, 4096, 4096), (8192, 8192, 8192))
    assert len(warm.gemm_entries(warm.GEMM_PRESET)) >= 6
    # 6 (head dim, mask) x 2 dtypes, the 160-key blocks of short odd lengths (d 64 / 128
    # non-causal, ODD_KEY_BLOCK) and d = 64 causal's 128-row tile of short walks (its long ones
    # take 192 rows, WIDE_ROWS_MIN_KEYS), each x 2 dtypes
    assert len(warm.attention_entries()) == 18
    assert warm.probe_entries([pair]) == []  # placement is off
    # the probes a GPU warm launches: the GPC finders and each placed cluster size, not the
    # split-K entries' (split-K is never placed)
    monkeypatch.delenv("CUTETMA_PLACEMENT")
    probes = warm.probe_entries([pair, split, kn])
    assert [e.cfg for e in probes] == sorted({1, 2, *placement.GPC_PROBE_CLUSTERS})
    assert probes[1].name() == "placement probe, clusters of 2"


def test_workspace_tensors_are_typed_as_cuda_tensors():
    """The workspaces ``ops.gemm`` passes are ``from_dlpack`` views of CUDA tensors, whose
    address space (``gmem``) is part of the kernel and its key; a CPU tensor's (``generic``)
    would be another key. The stand-ins describe as the CUDA tensors do."""
    import torch
    from cutlass.cute.runtime import from_dlpack

    from cutetma.runtime import cache, warm

    slots, flags = warm.workspace_tensors("split")
    assert warm.workspace_tensors("order_table")[:2] == (None, None)
    assert warm.workspace_tensors("") == ()
    on_cpu = [from_dlpack(torch.zeros(64, dtype=dtype), assumed_align=align).mark_layout_dynamic()
              for dtype, align in ((torch.float32, 16), (torch.int32, 4))]
    described = cache.describe_args(slots, flags)
    assert described == [d.replace("generic", "gmem") for d in cache.describe_args(*on_cpu)]
    assert all(d.startswith(("Tensor[Float32, gmem", "Tensor[Int32, gmem")) for d in described)


@pytest.mark.parametrize("argv, message", [
    (["cache"], "required: WHAT"),
    (["cache", "warm", "--gemm", "4096x4096"], "is not MxNxK"),
    (["cache", "warm", "--gemm", "0x1x1"], "GEMM M must be positive"),
    (["cache", "warm", "--gemm", "-8x1x1"], "GEMM M must be positive"),
    (["cache", "warm", "--gemm", "4096x4096x3000000000"], "at most 2147483647"),
    (["cache", "warm", "--attention", "96"], "head dim 96"),
    (["cache", "warm", "--attention", "128,sliding"], "is not d or d,causal"),
    (["cache", "warm", "--dtypes", "float32"], "one of float16, bfloat16"),
    (["cache", "warm", "--load", "dsm"], "one of tma, cp_async"),
    (["cache", "warm", "--jobs", "0"], "--jobs must be positive"),
    (["cache", "warm", "--jobs", "-2"], "--jobs must be positive"),
    (["cache", "warm", "--jobs", "many"], "not a whole number"),
    (["cache", "info", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_arguments_are_one_line_and_exit_2(cache_dir, capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("cutetma: error: ") and message in line
    assert not cache_dir.exists()


def test_warm_with_the_cache_off_is_a_usage_error(cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("CUTETMA_CACHE", "0")
    assert main(["cache", "warm", "--gemm", GEMM]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "the compile cache is off (CUTETMA_CACHE=0)" in line
    assert not cache_dir.exists()


def test_scaled_gemm_entries_are_what_scaled_gemm_launches(cache_dir):
    """One entry per distinct FP8 configuration, both producers, and every (problem,
    producer) runs one of those configurations (``fp8._plan``'s choice: the 16-bit model's,
    made FP8's); an entry compiles on a machine with no GPU."""
    from cutetma import fp8
    from cutetma.runtime import warm
    from cutetma.tuning import gemm as tuning

    problems = [(m, n, k) for m in (256, 2048, 8192)
                for n, k in ((4096, 4096), (8192, 8192), (28672, 8192), (5120, 16384))]
    entries = warm.scaled_gemm_entries(problems, ("tensor",), ("tma", "cp_async"))

    def config(problem, load):
        return fp8.fp8_config(tuning.select_gemm_config(*problem, load=load, sm_count=132,
                                                        b_k_major=True), "tensor")

    compiled = {e.cfg for e in entries}
    assert len(compiled) == len(entries) < 2 * len(problems)  # shared ones compile once
    assert {e.cfg.load for e in entries} == {"tma", "cp_async"}
    assert all(config(p, load) in compiled for p in problems for load in ("tma", "cp_async"))
    split = warm.scaled_gemm_entries([(16, 4096, 14336)], ("tensor",))[0]
    assert split.cfg.split_k > 1 and split.workspace == "split"
    assert split.name().startswith("gemm e4m3") and "tensor scales" in split.name()
    assert warm.compile_entry(split)[0] == "compiled", warm.compile_entry(split)


@pytest.mark.gpu
def test_a_warmed_gemm_compiles_nothing_in_a_fresh_process(cache_dir):
    """Warm as on a machine without a GPU the shapes whose tile order needs no probe (the
    order table, split-K), and with this GPU's counts and placement others (a placed band,
    (2, 1) clusters), then call ``cutetma.gemm`` on all of them in a fresh process: no entry
    is added."""
    env = dict(os.environ)
    without_gpu = [(256, 256, 256), (1024, 6144, 4096), (16, 4096, 14336)]
    with_gpu = [(4096, 4096, 4096), (512, 4096, 4096), (64, 256, 4096), (128, 4096, 4096),
                (128, 6144, 4096)]
    as_cpu = textwrap.dedent(f"""
        from cutetma.runtime import warm
        entries = warm.gemm_entries({without_gpu!r}, ["bfloat16"], gpu=False)
        assert len(entries) == 3, entries
        print([r[0] for r in warm.warm(entries, 1)])
    """)
    out = subprocess.run([sys.executable, "-c", as_cpu], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0 and "failed" not in out.stdout, out.stderr[-2000:]
    problems = ",".join("x".join(map(str, p)) for p in with_gpu)
    out = subprocess.run([sys.executable, "-m", "cutetma", "cache", "warm", "--gemm", problems,
                          "--dtypes", "bfloat16", "--jobs", "2"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    before = sorted(p.name for p in cache_dir.glob("*.entry"))
    use = textwrap.dedent(f"""
        import torch, cutetma
        for m, n, k in {without_gpu + with_gpu!r}:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            cutetma.gemm(a, b)
        torch.cuda.synchronize()
    """)
    out = subprocess.run([sys.executable, "-c", use], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    added = sorted(set(p.name for p in cache_dir.glob("*.entry")) - set(before))
    if added:  # say which kernels the warm missed, beside what it compiled
        from cutetma.runtime import cache

        parts = {Path(e["path"]).name: e.get("parts", {}).get("kernel", e.get("error"))
                 for e in cache.entries()}
        missed = [parts[name] for name in added]
        warmed = [parts[name] for name in before if name in parts]
        raise AssertionError(f"compiled in the fresh process: {missed}\nwarmed: {warmed}")


def test_paged_entries_are_what_attention_with_kvcache_launches(cache_dir, capsys):
    """``cache warm --paged``: per page size the prefill, packed, packed-and-split, split
    and varlen variants that the kernel takes (a TMA page off the swizzle atom left out),
    the split merge once per head dim; one compiled here, then a hit."""
    from cutetma.cli import main
    from cutetma.runtime import warm

    entries = warm.paged_entries([16, 12], [(128, True)], ["bfloat16"], ["tma", "cp_async"])
    paged = [e for e in entries if e.op == "paged"]
    assert len(paged) == 8 + 0 + 8 + 8  # TMA takes page 16 only; cp.async both
    assert {(e.cfg.pack_gqa, e.cfg.split_kv, e.cfg.varlen_q) for e in paged} == {
        (p, s, v) for p in (False, True) for s in (False, True) for v in (False, True)}
    assert [e.name() for e in entries if e.op == "combine"] == ["split-KV merge bf16 d=128"]
    assert [e.name() for e in entries if e.op == "append"] == [
        "new-key append bf16 d=128", "new-key append bf16 d=128, varlen"]
    assert "page 16 decode, packed and split, varlen tma" in " ".join(e.name() for e in paged)
    assert main(["cache", "warm", "--paged", "64", "--attention", "128,causal", "--dtypes",
                 "bfloat16", "--jobs", "1"]) == 0
    first = capsys.readouterr().out
    # 8 paged, the merge and the two appends compile; the dense d = 128 kernel too, unless
    # this process built it already (its in-process registry answers first)
    counts = re.search(r"12 entries: (\d+) compiled, (\d+) already there", first)
    assert counts and int(counts[1]) >= 11, first
    assert main(["cache", "warm", "--paged", "64", "--attention", "128,causal", "--dtypes",
                 "bfloat16", "--jobs", "1"]) == 0
    assert "12 already there" in capsys.readouterr().out


def test_backward_entries(cache_dir, capsys):
    """``cache warm --backward``: the backward's kernel per (head dim, causal); compiled
    once, then a hit."""
    from cutetma.cli import main
    from cutetma.runtime import warm

    entries = warm.backward_entries(warm.ATTENTION_PRESET, ["bfloat16"], ["tma"])
    assert [e.name() for e in entries] == [
        f"attention backward bf16 d={d}{c} tma" for d in (64, 128, 256)
        for c in ("", " causal")]
    args = ["cache", "warm", "--attention", "128,causal", "--backward", "--dtypes", "bfloat16",
            "--jobs", "1"]
    assert main(args) == 0
    assert re.search(r"2 entries: \d+ compiled", capsys.readouterr().out)
    assert main(args) == 0
    assert "2 already there" in capsys.readouterr().out
