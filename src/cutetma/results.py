"""Results files: ``benchmarks/results/<name>.json`` = ``{"meta": {...}, "rows": [...]}``.

``meta`` records what a reader needs to trust or reproduce a number: device, clocks, torch
and cutlass-dsl versions, date and the command that produced it. On disk (``dumps``) the
meta is indented and each row is one compact line: the whole repository travels to the GPU
machine beside the DSL bundle (64 MiB in all), and a row per line still diffs by row.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path


def clocks() -> dict:
    """nvidia-smi's clocks, temperature and power now, as it prints them ("1935 MHz"); {}
    without a GPU."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,"
             "power.draw", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip().splitlines()[0]
        keys = ("sm_clock", "sm_clock_max", "mem_clock", "temperature", "power")
        return dict(zip(keys, (v.strip() for v in out.split(",")), strict=False))
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}


def meta(command: str | None = None) -> dict:
    import torch

    try:
        from importlib.metadata import version

        dsl_version = version("nvidia-cutlass-dsl")
    except Exception:  # the H200 bundle is on PYTHONPATH, not pip-installed
        try:
            import cutlass

            dsl_version = getattr(cutlass, "__version__", "unknown")
        except ImportError:
            dsl_version = "not installed"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {
        "device": device,
        "clocks": clocks(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cutlass_dsl": dsl_version,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def write(name: str, rows: list[dict], directory: str | Path = "benchmarks/results",
          command: str | None = None, extra_meta: dict | None = None) -> Path:
    path = Path(directory) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": {**meta(command), **(extra_meta or {})}, "rows": rows}
    path.write_text(dumps(doc))
    return path


def finish(name: str, rows: list[dict], directory: str | Path, summary: dict,
           started: float) -> Path:
    """A benchmark's last write: ``name``.json marked complete, with its ``summary`` and the
    seconds since ``started``; prints where it went and the summary's figures."""
    import time

    path = write(name, rows, directory, extra_meta={
        "summary": summary, "complete": True, "seconds": round(time.time() - started)})
    print(f"wrote {path}")
    for key, value in summary.items():
        print(f"  {key}: {value:.3f}")
    return path


def dumps(doc: dict) -> str:
    """A results document as text: ``meta`` (and any other key) indented, one line a row."""
    rows = doc.get("rows")
    per_line = isinstance(rows, list)
    parts = [f" {json.dumps(key)}: " + json.dumps(value, indent=1).replace("\n", "\n ")
             for key, value in doc.items() if not (key == "rows" and per_line)]
    if per_line:
        lines = ",\n".join(json.dumps(row, separators=(",", ":")) for row in rows)
        parts.append(f' "rows": [\n{lines}\n ]')
    return "{\n" + ",\n".join(parts) + "\n}\n"
