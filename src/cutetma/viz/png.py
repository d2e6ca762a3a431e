"""The chapter's three TMA figures as small PNGs, drawn from the numpy model.

Flow: ``cutetma.swizzle`` says where every 16-byte sector lands (``sector_map``,
``grouped_box_offsets``) and which bank sectors an access pattern hits (``BankReport``);
the functions here turn those arrays into cell grids, one cell per 16-byte sector, and write
them with matplotlib's Agg backend. Nothing here computes a placement itself, so a picture
can never disagree with the model the tests and the GPU probes check.

* ``plot_swizzle_map``  -- source box | shared-memory image, coloured by logical sector
* ``plot_grouped_box``  -- wide global matrix with the slice | its groups g0, g1, ... in smem
* ``plot_bank_sectors`` -- which bank sectors S0..S7 eight accesses hit, grouped vs ungrouped

matplotlib is imported inside the functions so that importing this module (the CLI does)
costs nothing until a picture is actually asked for.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from cutetma import swizzle
from cutetma.viz.text import conflict_summary

DPI = 80  # with the modest figure sizes below this keeps every PNG at a few tens of KiB
EMPTY_RGB = (0.93, 0.93, 0.93)  # cells outside the box or slice: light grey, unlabelled
MAX_CELL_INCHES = 0.38
MIN_WIDTH_INCHES = 6.5  # narrow boxes still need room for the panel titles
MIN_LABEL_POINTS = 4.5  # below this a sector number is unreadable; leave cells bare


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI or on the GPU machine
    import matplotlib.pyplot as plt

    return plt


def _sector_colours(sector_index: np.ndarray, n_colours: int) -> np.ndarray:
    """RGB per cell from a qualitative colormap; index -1 means 'no sector here'.

    ``n_colours`` (not the array's own maximum) picks the colormap, so two panels of one
    figure colour the same logical sector the same way even if one of them is partial.
    """
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n_colours <= 10 else "tab20"]
    rgb = np.array(cmap(np.mod(sector_index, cmap.N)))[..., :3]
    rgb[sector_index < 0] = EMPTY_RGB
    return rgb


def _label_points(cell_inches: float) -> float:
    return min(9.0, cell_inches * 72 * 0.42)


def _tick_step(cell_inches: float) -> int:
    """Label every k-th cell so tick labels stay at least a fifth of an inch apart."""
    return max(1, math.ceil(0.2 / cell_inches))


def _draw_sectors(
    ax,
    sector_index,
    n_colours,
    cell_inches,
    *,
    title,
    xlabel,
    ylabel,
    title_pad=6.0,
    numbered=True,
):
    """One grid of 16-byte sectors: colour and number = logical sector, -1 = empty."""
    rows, cols = sector_index.shape
    rgb = _sector_colours(sector_index, n_colours)
    ax.imshow(rgb, interpolation="nearest")
    ax.set_xticks(np.arange(cols + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(rows + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="both", length=0, labelsize=7)
    ax.set_xticks(np.arange(0, cols, _tick_step(cell_inches)))
    ax.set_yticks(np.arange(0, rows, _tick_step(cell_inches)))
    ax.set_title(title, fontsize=9, pad=title_pad)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    points = _label_points(cell_inches)
    if numbered and points >= MIN_LABEL_POINTS:
        dark = rgb @ np.array([0.299, 0.587, 0.114]) < 0.5  # white digits on dark cells
        for (r, c), sector in np.ndenumerate(sector_index):
            if sector >= 0:
                ax.text(
                    c,
                    r,
                    str(sector),
                    ha="center",
                    va="center",
                    fontsize=points,
                    color="white" if dark[r, c] else "black",
                )


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return path


def plot_swizzle_map(mode, dtype, rows: int, cols: int, path) -> Path:
    """Left: the (rows x cols) box, one cell per logical 16-byte sector. Right: the same
    cells where TMA writes them in shared memory. Colour and number = logical sector column,
    so a colour's path from left to right is the swizzle."""
    plt = _pyplot()
    m = swizzle.mode(mode)
    elem_bytes = swizzle.dtype_bytes(dtype)
    physical_row, physical_sector = swizzle.sector_map(rows, cols, elem_bytes, m)
    sectors = physical_sector.shape[1]
    logical = np.broadcast_to(np.arange(sectors), (rows, sectors))
    # A box narrower than the swizzle span still takes a whole span per row in shared memory.
    image_rows = max(rows, int(physical_row.max()) + 1)
    image_sectors = max(sectors, int(physical_sector.max()) + 1)
    image = np.full((image_rows, image_sectors), -1)
    image[physical_row, physical_sector] = logical

    cell = min(MAX_CELL_INCHES, 5.5 / image_rows, 5.0 / image_sectors)
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(
            max(MIN_WIDTH_INCHES, (sectors + image_sectors) * cell + 1.6),
            image_rows * cell + 1.5,
        ),
        layout="constrained",
    )
    per_sector = swizzle.SECTOR_BYTES // elem_bytes
    _draw_sectors(
        left,
        logical,
        sectors,
        cell,
        title="source box (logical)",
        xlabel=f"logical 16-B sector ({per_sector} {dtype} each)",
        ylabel="row",
    )
    _draw_sectors(
        right,
        image,
        sectors,  # colours follow the logical sector, as on the left
        cell,
        title="shared memory (as TMA writes it)",
        xlabel="physical 16-B sector",
        ylabel="physical row",
    )
    rule = f" = {m.swizzle} on byte addresses" if m.bits else " (linear)"
    fig.suptitle(f"TMA swizzle {m.name}{rule}: {dtype} box {rows}x{cols}", fontsize=10)
    return _save(fig, path)


def plot_grouped_box(dtype, rows: int, cols: int, col_offset: int, path, mode="128B") -> Path:
    """Left: a (rows x 2*cols) global matrix with the (rows x cols) slice starting at column
    ``col_offset`` outlined. Right: the groups g0, g1, ... one 3D TMA box writes, each a
    dense block of ``rows`` span-wide rows, with a line between swizzle atoms (8 rows).

    Colour and number = logical sector inside its group, the index the XOR permutes.
    """
    plt = _pyplot()
    m = swizzle.mode(mode)
    elem_bytes = swizzle.dtype_bytes(dtype)
    group_width = swizzle.group_size(elem_bytes, m)  # elements per group; refuses "none"
    per_sector = swizzle.SECTOR_BYTES // elem_bytes
    if cols % group_width:
        raise ValueError(f"slice width {cols} is not a multiple of the group width {group_width}")
    if col_offset % per_sector or not 0 <= col_offset <= cols:
        raise ValueError(
            f"column offset {col_offset} must be a multiple of {per_sector} in 0..{cols} "
            f"so the {cols}-wide slice fits the {2 * cols}-wide matrix"
        )
    span_sectors = m.span // swizzle.SECTOR_BYTES
    slice_sectors = cols // per_sector
    n_groups = cols // group_width
    local = np.broadcast_to(np.arange(slice_sectors) % span_sectors, (rows, slice_sectors))

    matrix = np.full((rows, 2 * slice_sectors), -1)
    first = col_offset // per_sector
    matrix[:, first : first + slice_sectors] = local

    # Byte offset of each sector's first element -> (group, row in group, sector in row).
    offsets = swizzle.grouped_box_offsets(rows, cols, elem_bytes, m)[:, ::per_sector]
    group, in_group = np.divmod(offsets, rows * m.span)
    groups = np.full((n_groups, rows, span_sectors), -1)
    groups[group, in_group // m.span, (in_group % m.span) // swizzle.SECTOR_BYTES] = local

    cell = min(0.2, 3.6 / rows)
    widths = [2 * slice_sectors] + [span_sectors] * n_groups
    fig, axes = plt.subplots(
        1,
        1 + n_groups,
        figsize=(sum(widths) * cell + 1.2 * (1 + n_groups), rows * cell + 1.7),
        gridspec_kw={"width_ratios": widths},
        layout="constrained",
    )
    _draw_sectors(
        axes[0],
        matrix,
        span_sectors,
        cell,
        title=f"global {rows}x{2 * cols} {dtype}, slice at column {col_offset}",
        xlabel="column (elements); one cell = 16 B",
        ylabel="row",
        title_pad=16,  # room for the g0, g1 labels above the slice
        numbered=False,  # colours alone identify sectors here; the smem panels carry numbers
    )
    # Element-column ticks at group boundaries tell where each group starts in the matrix.
    boundaries = np.arange(0, 2 * slice_sectors + 1, span_sectors)
    axes[0].set_xticks(boundaries - 0.5, [str(b * per_sector) for b in boundaries])
    axes[0].add_patch(
        plt.Rectangle(
            (first - 0.5, -0.5),
            slice_sectors,
            rows,
            fill=False,
            edgecolor="black",
            linewidth=3,
            zorder=3,
            clip_on=False,
        )
    )
    for g in range(n_groups):
        x = first + g * span_sectors
        if g:
            axes[0].axvline(x - 0.5, color="black", linestyle="--", linewidth=2, zorder=3)
        axes[0].text(
            x + span_sectors / 2 - 0.5,
            -0.7,
            f"g{g}",
            ha="center",
            va="bottom",
            fontsize=8,
            fontweight="bold",
        )

    atom_rows = m.atom_bytes // m.span
    for g, ax in enumerate(axes[1:]):
        _draw_sectors(
            ax,
            groups[g],
            span_sectors,
            cell,
            title=f"smem g{g}",
            xlabel="16-B sector",
            ylabel="row" if g == 0 else "",
        )
        for boundary in range(atom_rows, rows, atom_rows):
            ax.axhline(boundary - 0.5, color="black", linewidth=2)
    fig.suptitle(
        f"One 3D TMA box ({n_groups}, {rows}, {group_width}): each {m.span}-B group is its own "
        f"block, {m.name} swizzle within each {atom_rows}-row atom",
        fontsize=10,
    )
    return _save(fig, path)


def plot_bank_sectors(
    report_grouped: swizzle.BankReport, report_ungrouped: swizzle.BankReport, path, title: str
) -> Path:
    """For each report a grid: one line per access, a filled cell on the bank sector
    S0..S7 it hits, coloured by how many accesses share that bank sector (green alone,
    orange 2, red 3+), and a bottom line with the count per bank sector."""
    plt = _pyplot()
    from matplotlib.colors import BoundaryNorm, ListedColormap

    sharing = ListedColormap(["white", "#a6d96a", "#fdae61", "#d7191c"])
    norm = BoundaryNorm([-0.5, 0.5, 1.5, 2.5, 1e9], sharing.N)
    panels = (
        ("grouped (3D box of span-wide groups)", report_grouped),
        ("ungrouped (full row stride, comparison)", report_ungrouped),
    )
    n_access = max(len(report.rows) for _, report in panels)
    cell = 0.32
    fig, axes = plt.subplots(
        1,
        2,
        figsize=(2 * swizzle.BANK_SECTORS * cell + 2.6, (n_access + 1) * cell + 1.9),
        layout="constrained",
    )
    for ax, (name, report) in zip(axes, panels, strict=True):
        counts = np.bincount(report.bank_sectors, minlength=swizzle.BANK_SECTORS)
        n = len(report.rows)
        heat = np.zeros((n + 1, swizzle.BANK_SECTORS))
        for i, s in enumerate(report.bank_sectors):
            heat[i, s] = counts[s]
            ax.add_patch(plt.Rectangle((s - 0.5, i - 0.5), 1, 1, fill=False, linewidth=1.5))
        heat[n] = counts
        ax.imshow(heat, cmap=sharing, norm=norm, interpolation="nearest")
        for s, count in enumerate(counts):
            ax.text(s, n, str(count), ha="center", va="center", fontsize=8)
        ax.axhline(n - 0.5, color="black", linewidth=1.5)  # accesses above, totals below
        ax.set_xticks(np.arange(swizzle.BANK_SECTORS + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(n + 2) - 0.5, minor=True)
        ax.grid(which="minor", color="0.8", linewidth=0.6)
        ax.tick_params(which="both", length=0, labelsize=7)
        ax.set_xticks(range(swizzle.BANK_SECTORS), [f"S{s}" for s in range(swizzle.BANK_SECTORS)])
        ax.set_yticks(range(n + 1), [f"row {r}" for r in report.rows] + ["count"])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(conflict_summary(report).replace(", ", ",\n", 1), fontsize=8)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)
