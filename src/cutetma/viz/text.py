"""Plain-text renderings of the TMA model, shared by the CLI's output and the PNG labels.

``cutetma.swizzle`` computes placements and bank reports; this module only words them:
``sector_grid`` -> the table ``cutetma swizzle map`` prints, ``conflict_summary`` -> the
one-line verdict on a ``BankReport`` that both the ``banks`` command and the bank figure show.
"""

from __future__ import annotations

import numpy as np

from cutetma import swizzle


def conflict_summary(report: swizzle.BankReport) -> str:
    """'8 distinct bank sectors, conflict degree 1 (conflict-free)' and the like."""
    degree = report.conflict_degree
    verdict = "conflict-free" if degree == 1 else f"{degree}-way bank conflict"
    return f"{report.distinct} distinct bank sectors, conflict degree {degree} ({verdict})"


def sector_grid(physical_rows: np.ndarray, physical_sectors: np.ndarray) -> str:
    """A table with one line per box row: where each logical 16-byte sector lands.

    A cell is the physical sector when the sector stays in its row (every TMA box: the
    hardware gives a narrow swizzled row a whole span) and ``row:sector`` when a placement
    moved it to another row.
    """
    rows, sectors = physical_sectors.shape
    logical_rows = np.arange(rows)[:, None]
    cells = np.where(
        physical_rows == logical_rows,
        physical_sectors.astype(str),
        np.char.add(np.char.add(physical_rows.astype(str), ":"), physical_sectors.astype(str)),
    )
    width = max(max(len(c) for c in cells.ravel()), len(f"c{sectors - 1}"))
    row_label = len(f"row {rows - 1}")
    header = " " * row_label + " " + " ".join(f"c{c}".rjust(width) for c in range(sectors))
    lines = [header]
    for r in range(rows):
        lines.append(f"row {r}".ljust(row_label) + " " + " ".join(c.rjust(width) for c in cells[r]))
    return "\n".join(lines)
