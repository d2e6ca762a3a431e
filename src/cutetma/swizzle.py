"""The TMA hardware as a model: where every byte of a box lands in shared memory.

Pure numpy, no DSL, runs anywhere. Everything else in cutetma is checked against this file:
the CuTe layout algebra (``cutetma.layouts``) on the host, and the bytes the H200 actually
writes (``cutetma.copy`` probe kernels) on the GPU.

What flows where::

    box (rows x cols elements, dtype width w)      -- logical, row-major, inner dim = cols
      -> byte offset  o = r * pitch + c * w         -- how TMA lays a box in shared memory
      -> Swizzle<B,4,3>(base + o) - base            -- the XOR the TMA unit applies on write

``pitch`` is the inner box in bytes, except that a swizzled box narrower than its swizzle
span gets a full span per row: measured on the H200 (``benchmarks/results/hw_swizzle.json``,
the ``*-2d-8x*`` rows), the rows of such a box land ``span`` bytes apart and the rest of each
span is left untouched. A layout that packs those rows densely (which the CuTe DSL accepts
for a TMA atom, issuing one box) disagrees with what the hardware writes, and a buffer sized
for it overflows.

The four TMA swizzle modes are byte-address swizzles ``Swizzle<B, 4, 3>``: bits ``[4, 4+B)``
(the 16-byte sector inside a span) are XORed with bits ``[7, 7+B)`` (which 128-byte row of
the repeating atom). A span is ``2**B`` sixteen-byte sectors (32, 64 or 128 bytes) and the
pattern repeats every ``8 * span`` bytes: the swizzle atom is 8 rows of one span.

Box rules (``check_box``) follow ``cuTensorMapEncodeTiled``: rank 1 to 5, each box
dimension 1..256 elements, inner box bytes a multiple of 16 and at most the swizzle span,
16-byte aligned global base, global strides multiples of 16 bytes, and the shared-memory
alignment each mode needs so its pattern starts at the box origin.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

SECTOR_BYTES = 16  # one 16-byte access: 4 of the 32 four-byte banks
BANK_SECTORS = 8  # 32 banks / 4 banks per 16-byte access
ROW_BYTES = 128  # one pass over all 32 banks

DTYPE_BYTES = {
    "fp8": 1,
    "e4m3": 1,
    "e5m2": 1,
    "int8": 1,
    "uint8": 1,
    "fp16": 2,
    "bf16": 2,
    "fp32": 4,
    "tf32": 4,
    "int32": 4,
}


@dataclasses.dataclass(frozen=True)
class Swizzle:
    """CuTe's ``Swizzle<B, M, S>``: ``x ^ ((x >> S) & (((1 << B) - 1) << M))``.

    The B bits starting at bit ``M + S`` are XORed into the B bits starting at bit M.
    Units are whatever ``x`` is in; the TMA modes below are in *bytes*.
    """

    bits: int
    base: int
    shift: int

    def __post_init__(self):
        overlapping = self.bits > 0 and abs(self.shift) < self.bits
        if self.bits < 0 or self.base < 0 or overlapping:
            raise ValueError(
                f"Swizzle<{self.bits},{self.base},{self.shift}>: need B >= 0, M >= 0 and "
                f"|S| >= B so the source and destination bit ranges do not overlap"
            )

    @property
    def yyy_mask(self) -> int:
        """The source bits (the 'row' bits)."""
        return ((1 << self.bits) - 1) << (self.base + self.shift)

    @property
    def zzz_mask(self) -> int:
        """The destination bits (the 'column' bits that get XORed)."""
        return ((1 << self.bits) - 1) << self.base

    def __call__(self, x):
        x = np.asarray(x, dtype=np.int64)
        return x ^ ((x >> self.shift) & self.zzz_mask)

    def __str__(self) -> str:
        return f"Swizzle<{self.bits},{self.base},{self.shift}>"


@dataclasses.dataclass(frozen=True)
class SwizzleMode:
    """One of the four TMA swizzle modes (``CU_TENSOR_MAP_SWIZZLE_*``)."""

    name: str  # "none", "32B", "64B", "128B"
    span: int  # bytes of one swizzled row: the widest legal inner box (none: no limit)
    bits: int  # B of Swizzle<B,4,3>

    @property
    def swizzle(self) -> Swizzle:
        return Swizzle(self.bits, 4, 3)

    @property
    def atom_bytes(self) -> int:
        """Bytes after which the XOR pattern repeats: 8 rows of the span (none: 16)."""
        return 8 * self.span if self.bits else SECTOR_BYTES

    @property
    def smem_alignment(self) -> int:
        """Shared-memory alignment of a box destination.

        TMA needs 128 bytes for any destination; a swizzled box must also start on an atom
        boundary, since the hardware XORs absolute address bits: a box at a misaligned base
        would see the pattern start mid-atom (the model can show that, the kernels refuse it).
        """
        return max(128, self.atom_bytes)

    def __str__(self) -> str:
        return self.name


MODES = {
    "none": SwizzleMode("none", 0, 0),
    "32B": SwizzleMode("32B", 32, 1),
    "64B": SwizzleMode("64B", 64, 2),
    "128B": SwizzleMode("128B", 128, 3),
}
MODE_NAMES = tuple(MODES)


def mode(name: str | SwizzleMode) -> SwizzleMode:
    """Look a mode up by name (``"none"``, ``"32B"``, ``"64B"``, ``"128B"``; case-insensitive)."""
    if isinstance(name, SwizzleMode):
        return name
    for key, value in MODES.items():
        if str(name).lower() in (key.lower(), key.lower().rstrip("b"), f"sw{key.lower()}"):
            return value
    raise ValueError(f"unknown swizzle mode {name!r}: choose one of {', '.join(MODE_NAMES)}")


def dtype_bytes(dtype: str | int) -> int:
    """Element width in bytes of a dtype name (``"fp16"``) or a width given directly."""
    if isinstance(dtype, int):
        if dtype not in (1, 2, 4, 8):
            raise ValueError(f"element width {dtype} bytes: TMA moves 1, 2, 4 or 8-byte elements")
        return dtype
    try:
        return DTYPE_BYTES[str(dtype).lower()]
    except KeyError:
        raise ValueError(
            f"unknown dtype {dtype!r}: choose one of {', '.join(sorted(DTYPE_BYTES))}"
        ) from None


# --------------------------------------------------------------------------- box rules
MAX_BOX_DIM = 256
MAX_RANK = 5
GMEM_ALIGN = 16


def check_box(
    box: Sequence[int],
    elem_bytes: int,
    swizzle: str | SwizzleMode = "none",
    *,
    global_shape: Sequence[int] | None = None,
    global_strides_bytes: Sequence[int] | None = None,
    global_base: int | None = None,
    smem_base: int | None = None,
) -> None:
    """Raise ``ValueError`` naming the first TMA rule the box breaks (and its numbers).

    ``box`` and ``global_shape`` are innermost-*last* (row-major, like torch): ``box[-1]``
    is the contiguous dimension. ``global_strides_bytes`` are the strides of the outer
    dimensions (all but the innermost, which must be contiguous).
    """
    m = mode(swizzle)
    box = tuple(int(b) for b in box)
    if not 1 <= len(box) <= MAX_RANK:
        raise ValueError(f"TMA rank rule: a box has 1 to {MAX_RANK} dimensions, got {len(box)}")
    for i, b in enumerate(box):
        if not 1 <= b <= MAX_BOX_DIM:
            raise ValueError(
                f"TMA box-size rule: every box dimension is 1..{MAX_BOX_DIM} elements, "
                f"dimension {i} is {b}"
            )
    inner = box[-1] * elem_bytes
    if inner % SECTOR_BYTES:
        raise ValueError(
            f"TMA inner-box rule: the inner box must be a multiple of 16 bytes, "
            f"got {box[-1]} x {elem_bytes} B = {inner} B"
        )
    if m.bits and inner > m.span:
        raise ValueError(
            f"TMA swizzle-span rule: with {m.name} swizzle the inner box is at most {m.span} "
            f"bytes ({m.span // elem_bytes} elements of {elem_bytes} B), got {inner} B; "
            f"split the row into groups of {m.span // elem_bytes} (see group_view)"
        )
    if global_shape is not None:
        if len(global_shape) != len(box):
            raise ValueError(
                f"TMA rank rule: box rank {len(box)} != tensor rank {len(global_shape)}"
            )
        for i, g in enumerate(global_shape):
            if not 1 <= g < 2**32:
                raise ValueError(f"TMA tensor-size rule: dimension {i} is {g}, need 1..2^32-1")
    if global_strides_bytes is not None:
        for i, s in enumerate(global_strides_bytes):
            if s % GMEM_ALIGN or not 0 < s < 2**40:
                raise ValueError(
                    f"TMA stride rule: global strides are positive multiples of 16 bytes "
                    f"below 2^40, stride {i} is {s} B"
                )
    if global_base is not None and global_base % GMEM_ALIGN:
        raise ValueError(
            f"TMA alignment rule: the global base address must be 16-byte aligned, "
            f"it is {global_base} (= 16 * {global_base // 16} + {global_base % 16})"
        )
    if smem_base is not None and smem_base % m.smem_alignment:
        raise ValueError(
            f"TMA shared-memory alignment rule: a {m.name}-swizzled box starts on a "
            f"{m.smem_alignment}-byte boundary, got offset {smem_base}"
        )


# --------------------------------------------------------------------------- placement
def box_row_pitch(inner_bytes: int, swizzle: str | SwizzleMode) -> int:
    """Bytes between consecutive rows of a box in shared memory, as the hardware lays them:
    a swizzled row takes at least one whole span (measured on the H200)."""
    m = mode(swizzle)
    return max(inner_bytes, m.span) if m.bits else inner_bytes


def box_smem_bytes(box: Sequence[int], elem_bytes: int, swizzle: str | SwizzleMode) -> int:
    """Shared-memory footprint of a TMA box: every row (all outer dims) at its pitch."""
    box = tuple(box)
    return math.prod(box[:-1]) * box_row_pitch(box[-1] * elem_bytes, swizzle)


def box_byte_offsets(box: Sequence[int], elem_bytes: int) -> np.ndarray:
    """Dense (unswizzled) byte offset of every element of a box, indexed like the box."""
    box = tuple(box)
    n = math.prod(box)
    return (np.arange(n, dtype=np.int64) * elem_bytes).reshape(box)


def smem_byte_offsets(
    box: Sequence[int],
    elem_bytes: int,
    swizzle: str | SwizzleMode,
    smem_base: int = 0,
    row_pitch: int | None = None,
) -> np.ndarray:
    """Byte offset (from ``smem_base``) at which TMA writes element ``box[idx]``.

    ``smem_base`` defaults to an atom-aligned buffer. A misaligned base is allowed here, so
    the model can show what a misaligned buffer would see; ``check_box`` refuses it.
    ``row_pitch`` (bytes) overrides the hardware's row pitch (``box_row_pitch``): pass the
    inner box bytes to see the dense packing the hardware does *not* do for narrow boxes.
    """
    m = mode(swizzle)
    check_box(box, elem_bytes, m)
    dense = box_byte_offsets(box, elem_bytes)
    inner = box[-1] * elem_bytes
    pitch = box_row_pitch(inner, m) if row_pitch is None else row_pitch
    if pitch != inner:
        dense = (dense // inner) * pitch + dense % inner
    return m.swizzle(dense + smem_base) - smem_base


def smem_image(data: np.ndarray, swizzle: str | SwizzleMode, smem_base: int = 0) -> np.ndarray:
    """The raw shared-memory bytes (uint8) after TMA writes the box ``data``.

    ``data`` is the box itself (a numpy array, innermost dimension last).
    """
    data = np.ascontiguousarray(data)
    w = data.dtype.itemsize
    offsets = smem_byte_offsets(data.shape, w, swizzle, smem_base)
    out = np.zeros(box_smem_bytes(data.shape, w, swizzle), dtype=np.uint8)
    src = data.reshape(-1).view(np.uint8).reshape(-1, w)
    idx = offsets.reshape(-1, 1) + np.arange(w)
    out[idx] = src
    return out


def sector_map(
    rows: int, cols: int, elem_bytes: int, swizzle: str | SwizzleMode
) -> tuple[np.ndarray, np.ndarray]:
    """For a 2D box: physical (row, sector) of every logical 16-byte sector.

    Returns two ``(rows, cols * elem_bytes // 16)`` integer arrays. A physical row is one
    row pitch of shared memory (``box_row_pitch``: a whole span for a narrow swizzled box),
    a sector its 16-byte slot in that row.
    """
    row_bytes = box_row_pitch(cols * elem_bytes, swizzle)
    sectors = cols * elem_bytes // SECTOR_BYTES
    offs = smem_byte_offsets((rows, cols), elem_bytes, swizzle)
    # first element of every 16-byte sector
    per = SECTOR_BYTES // elem_bytes
    first = offs[:, ::per][:, :sectors]
    return first // row_bytes, (first % row_bytes) // SECTOR_BYTES


# --------------------------------------------------------------------------- 3D grouping
def group_size(elem_bytes: int, swizzle: str | SwizzleMode) -> int:
    """G: elements per swizzle span, the width of one group of a wide row."""
    m = mode(swizzle)
    if not m.bits:
        raise ValueError("the no-swizzle mode has no span to group by")
    return m.span // elem_bytes


def group_view(x: np.ndarray, elem_bytes: int, swizzle: str | SwizzleMode) -> np.ndarray:
    """The chapter's 3D view of a 2D (rows, cols) array: ``global3[j // G, row, j % G]``.

    ``global[row, j] == global3[j // G, row, j % G]`` with G = span / element size. Only the
    tensor map changes; on the GPU no byte moves. cols must be a multiple of G.
    """
    g = group_size(elem_bytes, swizzle)
    rows, cols = x.shape
    if cols % g:
        raise ValueError(f"group view: {cols} columns is not a multiple of the group width {g}")
    return x.reshape(rows, cols // g, g).transpose(1, 0, 2)


def grouped_box_offsets(
    rows: int, cols: int, elem_bytes: int, swizzle: str | SwizzleMode
) -> np.ndarray:
    """Shared-memory byte offset of element ``[row, j]`` of a (rows, cols) slice loaded as one
    3D box (groups, rows, G): group g is a dense (rows x span) block, swizzled as a whole."""
    g = group_size(elem_bytes, swizzle)
    groups = cols // g
    box = (groups, rows, g)
    offs3 = smem_byte_offsets(box, elem_bytes, swizzle)
    j = np.arange(cols)
    return offs3[j // g, :, j % g].T  # (rows, cols)


# --------------------------------------------------------------------------- banks
@dataclasses.dataclass(frozen=True)
class BankReport:
    """Which of the 8 bank sectors each 16-byte access hits, and the resulting conflict."""

    rows: tuple[int, ...]
    byte_addresses: tuple[int, ...]
    bank_sectors: tuple[int, ...]

    @property
    def distinct(self) -> int:
        return len(set(self.bank_sectors))

    @property
    def conflict_degree(self) -> int:
        """Wavefronts needed: the most accesses that share one bank sector."""
        counts = np.bincount(np.asarray(self.bank_sectors), minlength=BANK_SECTORS)
        return int(counts.max())

    def as_dict(self) -> dict:
        return {
            "accesses": [
                {"row": r, "byte_address": a, "bank_sector": s}
                for r, a, s in zip(self.rows, self.byte_addresses, self.bank_sectors, strict=True)
            ],
            "distinct_bank_sectors": self.distinct,
            "conflict_degree": self.conflict_degree,
        }


def bank_sector(byte_address) -> np.ndarray:
    """Bank sector S0..S7 of a 16-byte access: 4 adjacent banks of 4 bytes."""
    return (np.asarray(byte_address, dtype=np.int64) // SECTOR_BYTES) % BANK_SECTORS


def bank_report(byte_addresses: Sequence[int], rows: Sequence[int] | None = None) -> BankReport:
    addrs = tuple(int(a) for a in byte_addresses)
    if any(a % SECTOR_BYTES for a in addrs):
        raise ValueError("bank analysis takes 16-byte accesses: every address is 16-aligned")
    rows = tuple(rows) if rows is not None else tuple(range(len(addrs)))
    return BankReport(rows, addrs, tuple(int(s) for s in bank_sector(addrs)))


def column_access_banks(
    row_bytes: int,
    column: int,
    rows: Sequence[int],
    swizzle: str | SwizzleMode = "128B",
    *,
    grouped: bool = True,
    box_rows: int | None = None,
) -> BankReport:
    """Banks hit when a warp reads 16-byte sector ``column`` of each of ``rows``.

    The tile is ``row_bytes`` wide. ``grouped`` splits each row into span-wide groups first
    (the 3D TMA layout: group g is its own dense block of all rows); ungrouped keeps the
    full row stride, which is not a legal TMA box when ``row_bytes`` > span and exists only
    as the chapter's comparison. ``box_rows`` is the tile's height (where group 1 starts);
    by default the rows read are the top of the tile (``max(rows) + 1``).
    """
    m = mode(swizzle)
    sectors_per_row = row_bytes // SECTOR_BYTES
    if row_bytes % SECTOR_BYTES or row_bytes <= 0:
        raise ValueError(f"row bytes must be a positive multiple of 16, got {row_bytes}")
    if not 0 <= column < sectors_per_row:
        raise ValueError(f"column {column} outside the row's {sectors_per_row} 16-byte sectors")
    rows = list(rows)
    if any(r < 0 for r in rows):
        raise ValueError("rows must be non-negative")
    n_rows = box_rows if box_rows is not None else max(rows) + 1
    if n_rows <= max(rows):
        raise ValueError(f"box_rows={n_rows} does not contain row {max(rows)}")
    if grouped and m.bits and row_bytes > m.span:
        span_sectors = m.span // SECTOR_BYTES
        group, local = divmod(column, span_sectors)
        group_bytes = n_rows * m.span
        dense = [group * group_bytes + r * m.span + local * SECTOR_BYTES for r in rows]
    else:
        dense = [r * row_bytes + column * SECTOR_BYTES for r in rows]
    return bank_report([int(a) for a in m.swizzle(dense)], rows)


def model_image(box_data: np.ndarray, swizzle: str, grouped: bool = False) -> np.ndarray:
    """What the model says the shared-memory bytes of ``box_data`` are (uint8): the image a
    probe's dump is compared with (``grouped``: one 3D box of several swizzle-span groups)."""
    box_data = np.ascontiguousarray(box_data)
    if not grouped:
        return smem_image(box_data, swizzle)
    w = box_data.dtype.itemsize
    rows, cols = box_data.shape
    offsets = grouped_box_offsets(rows, cols, w, swizzle)
    out = np.zeros(box_data.size * w, dtype=np.uint8)
    src = box_data.reshape(-1).view(np.uint8).reshape(-1, w)
    out[offsets.reshape(-1, 1) + np.arange(w)] = src
    return out
