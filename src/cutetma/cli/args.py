"""The CLI's shared pieces: argparse types that validate with the model's own lookups
(``--mode``, ``--dtype``, ``--box``, ``--rows``, ...), the size bounds, the one-line
``UsageError`` and its parser, the output-path checks (``output_file``, ``output_folder``,
``writing``) and ``_say``. It imports none of the command modules.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path

from cutetma import swizzle

USAGE_ERROR = 2
# Bounds that keep every answer small: a TMA box dimension holds at most MAX_BOX_DIM (256)
# elements, so the bank analysis reads at most that many rows of at most MAX_ROW_BYTES (the
# widest grouped tile: 256 groups of a 128-B span).
MAX_ROWS = swizzle.MAX_BOX_DIM
MAX_ROW_BYTES = swizzle.MAX_BOX_DIM * swizzle.mode("128B").span
# options whose value may start with '-' (argparse would take "-8x64" for an option)
VALUE_OPTIONS = ("--box", "--rows", "--row-bytes", "--column", "--gemm", "--jobs")


class UsageError(Exception):
    """A command line argparse refused; reported like any other user mistake."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would print the whole usage block and exit; one line is easier to read
        # (and to test), and main() decides the exit code.
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _argument_type(convert, name):
    """Wrap a model lookup so argparse reports the model's own message, not 'invalid value'."""

    def parse(value):
        try:
            return convert(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _shown(value: str, limit: int = 24) -> str:
    """A user's value, shortened if huge, for a one-line message."""
    return value if len(value) <= limit else f"{value[:12]}...({len(value)} characters)"


def _integer(digits: str, what: str, low: int, high: int, why: str = "") -> int:
    """``digits`` as an int in ``low..high``; the message names ``what`` and the bound."""
    sign = -1 if digits.startswith("-") else 1
    magnitude = digits.lstrip("+-")
    value = sign * int(magnitude) if len(magnitude) <= 9 else sign * 10**9  # no 10^5000
    if value < low:
        bound = {0: "non-negative", 1: "positive"}.get(low, f"at least {low}")
        raise ValueError(f"{what} must be {bound}, got {_shown(digits)}")
    if value > high:
        raise ValueError(f"{what} must be at most {high}{why}, got {_shown(digits)}")
    return value


_BOX_WHY = f" (a TMA box dimension holds 1..{swizzle.MAX_BOX_DIM} elements)"


def _box(value: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*([+-]?\d+)\s*[xX]\s*([+-]?\d+)\s*", value)
    if not match:
        raise ValueError(f"box {_shown(value)!r} is not ROWSxCOLS, e.g. 8x64")
    return (_integer(match[1], "box rows", 1, swizzle.MAX_BOX_DIM, _BOX_WHY),
            _integer(match[2], "box columns", 1, swizzle.MAX_BOX_DIM, _BOX_WHY))


def _row_range(value: str) -> range:
    match = re.fullmatch(r"\s*([+-]?\d+)\s*(?:-\s*([+-]?\d+)\s*)?", value)
    if not match:
        raise ValueError(f"rows {_shown(value)!r} is not A-B, e.g. 0-7")
    why = f" (the rows of one TMA box: {MAX_ROWS} at most, 0-{MAX_ROWS - 1})"
    first = _integer(match[1], "first row", 0, MAX_ROWS - 1, why)
    last = _integer(match[2] or match[1], "last row", 0, MAX_ROWS - 1, why)
    if first > last:
        raise ValueError(f"rows {_shown(value)!r} is not A-B with A <= B, e.g. 0-7")
    return range(first, last + 1)


def _row_bytes(value: str) -> int:
    if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        raise ValueError(f"row bytes {_shown(value)!r} is not a whole number of bytes, e.g. 256")
    why = " (256 groups of a 128-B swizzle span, the widest grouped TMA tile)"
    n = _integer(value.strip(), "row bytes", 1, MAX_ROW_BYTES, why)
    if n % swizzle.SECTOR_BYTES:
        raise ValueError(f"row bytes must be a multiple of 16 (whole 16-byte sectors), got {n}")
    return n


def _column(value: str) -> int:
    if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        raise ValueError(f"column {_shown(value)!r} is not a 16-byte sector index, e.g. 0")
    return _integer(value.strip(), "column", 0, MAX_ROW_BYTES // swizzle.SECTOR_BYTES - 1)


def _dtype(value: str) -> str:
    swizzle.dtype_bytes(value)  # raises on unknown names
    return value.lower()


MODE = _argument_type(swizzle.mode, "mode")
DTYPE = _argument_type(_dtype, "dtype")
BOX = _argument_type(_box, "box")
ROWS = _argument_type(_row_range, "rows")
ROW_BYTES = _argument_type(_row_bytes, "row bytes")
COLUMN = _argument_type(_column, "column")


# --------------------------------------------------------------------------- output paths
def _path_error(option: str, value, problem: str) -> UsageError:
    return UsageError(f"{option} {value}: {problem}")


def _check_folder(folder: Path, option: str, value) -> None:
    """``folder`` must already exist and take new files: cutetma creates no parents."""
    if not folder.exists():
        raise _path_error(option, value, f"folder {folder} does not exist (cutetma creates "
                                         f"no folders on the way; make it first)")
    if not folder.is_dir():
        raise _path_error(option, value, f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _path_error(option, value, f"cannot write into {folder} (permission denied)")


def output_file(value: str, option: str, suffix: str | None = None,
                example: str = "out.html") -> Path:
    """The file ``option`` names, checked before anything is computed: a name (not a folder)
    in a folder that exists and is writable, ending in ``suffix`` if one is required (the
    PNG writer would otherwise add or follow its own)."""
    if not value or not value.strip():
        raise _path_error(option, repr(value), "empty file name")
    path = Path(value)
    example = f"{value.rstrip('/' + os.sep)}/{'out' + suffix if suffix else example}"
    if path.is_dir() or value.endswith(("/", os.sep)):
        raise _path_error(option, value, f"is a folder; name a file in it, e.g. {example}")
    if suffix and path.suffix.lower() != suffix:
        raise _path_error(option, value, f"the file name must end in {suffix}")
    _check_folder(path.parent, option, value)
    if path.exists() and not os.access(path, os.W_OK):
        raise _path_error(option, value, "the file exists and cannot be overwritten")
    return path


def output_folder(value: str, option: str) -> tuple[Path, bool]:
    """The folder ``option`` names and whether this call created it. Only that folder itself
    may be created (its parent must exist); callers announce a creation."""
    if not value or not value.strip():
        raise _path_error(option, repr(value), "empty folder name")
    path = Path(value)
    if path.exists():
        if not path.is_dir():
            raise _path_error(option, value, "exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise _path_error(option, value, "cannot write into it (permission denied)")
        return path, False
    _check_folder(path.parent, option, value)
    with writing(option, path):
        path.mkdir()
    return path, True


@contextlib.contextmanager
def writing(option: str, path):
    """Report a write the operating system refuses (``/proc``, a full disk) as a user error."""
    try:
        yield
    except BrokenPipeError:
        raise  # stdout's reader left (main handles it); not the file's fault
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise _path_error(option, path, f"cannot write: {reason}") from None


def _say(message: str, *, to_stderr: bool = False) -> None:
    print(message, file=sys.stderr if to_stderr else sys.stdout)


def _announce_folder(path: Path, created: bool) -> None:
    if created:
        print(f"created folder {path}")
