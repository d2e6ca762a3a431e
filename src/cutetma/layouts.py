"""The bridge from CuTe DSL layout algebra to numpy, and the unit trap it exposes.

What flows where::

    CuTe algebra on the host (inside a @cute.jit trace, dsl.on_host)
      make_smem_layout_atom / tile_to_shape / make_composed_layout / recast_layout
        -> LayoutSpec: the static shape, stride and Swizzle<B,M,S> CuTe computed
        -> numpy tables (every element), spot-checked against CuTe evaluating itself
        -> compared with cutetma.swizzle (the hardware model) byte for byte

**Units.** The DSL's Hopper shared-memory atoms (``warpgroup.make_smem_layout_atom``) are
``Swizzle<B,4,3> o 0 o (8, W):(W, 1)``: an *element*-unit layout with a *byte*-unit swizzle,
meant to be attached to the pointer (``recast_ptr`` / ``get_tensor(outer, swizzle=inner)``),
exactly as the TMA unit and WGMMA see shared memory. Evaluate the same composed layout as
an element-offset layout (what ``L(coord)`` does) and the XOR lands on element bits: for
16-bit data, row 1 of a 128B-swizzled tile stays in place instead of moving one 16-byte
sector. Two conversions make CuTe agree with the hardware:

* ``pointer``: apply the swizzle to byte offsets, ``Swizzle<B,4,3>(w * outer(c))``
  (the DSL's ``recast_layout`` to bytes, then the swizzle): the placement TMA writes.
* ``element_swizzle(spec, w)``: rewrite the swizzle in element units, ``Swizzle<B, 4 -
  log2 w, 3>``, which is equivalent as long as ``w <= 16``.

``placement(spec, "layout")`` shows the wrong one, so the difference stays visible.

The same trap in a kernel: ``cute.recast_tensor`` of a tensor whose swizzle sits in its
pointer (8-bit stages read as 4-byte words) computes addresses from the outer layout alone,
without the XOR. A word view is built instead over a plain pointer with the swizzle in its
layout, ``recast_layout(32, 8, composed)``, which scales the swizzle with the element
(``Swizzle<3,4,3>`` on bytes is ``Swizzle<3,2,3>`` on words; FP8 attention's V transposer,
``kernels/attention/transposer.stage_words``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from cutetma import dsl
from cutetma import swizzle as hw

ATOM_KINDS = tuple(f"{major}_{kind}" for major in ("K", "MN")
                   for kind in ("INTER", "SW32", "SW64", "SW128"))
MODE_OF_KIND = {"INTER": "none", "SW32": "32B", "SW64": "64B", "SW128": "128B"}


def _flatten(t):
    if isinstance(t, tuple):
        for x in t:
            yield from _flatten(x)
    else:
        yield t


@dataclasses.dataclass(frozen=True)
class LayoutSpec:
    """A static CuTe layout as CuTe computed it: ``swizzle o offset o shape:stride``.

    ``swizzle`` is ``(B, M, S)`` or None; ``shape``/``stride`` are CuTe's nested tuples,
    in the layout's own units (elements for the DSL's atoms); ``swizzle_units`` says whether
    CuTe meant the swizzle for byte addresses (``"byte"``, the pointer convention of the
    Hopper atoms) or for the layout's own offsets.
    """

    shape: tuple
    stride: tuple
    swizzle: tuple[int, int, int] | None = None
    offset: int = 0
    swizzle_units: str = "byte"
    text: str = ""

    @property
    def rank(self) -> int:
        return len(self.shape)

    def outer(self, coords: Sequence[np.ndarray]) -> np.ndarray:
        """Offsets of the unswizzled layout at (broadcast) integer coordinates, one per mode.

        A mode coordinate is a flat index into that mode, unpacked colexicographically
        into its nested shape (CuTe's ``crd2idx`` convention).
        """
        if len(coords) != self.rank:
            raise ValueError(f"layout of rank {self.rank} needs {self.rank} coordinates")
        total = np.asarray(self.offset, dtype=np.int64)
        for crd, shp, std in zip(coords, self.shape, self.stride, strict=True):
            crd = np.asarray(crd, dtype=np.int64)
            leaves = list(zip(_flatten(shp), _flatten(std), strict=True))
            rest = crd
            for s, d in leaves:
                total = total + (rest % s) * d
                rest = rest // s
        return total


def _spec_from_cute(layout, swizzle_units="byte") -> LayoutSpec:
    """Capture a static CuTe layout or composed layout (call inside a trace)."""
    if hasattr(layout, "inner"):
        inner, outer = layout.inner, layout.outer
        return LayoutSpec(
            tuple(outer.shape),
            tuple(outer.stride),
            (inner.num_bits, inner.num_base, inner.num_shift),
            int(layout.offset),
            swizzle_units,
            str(layout),
        )
    return LayoutSpec(
        tuple(layout.shape), tuple(layout.stride), None, 0, swizzle_units, str(layout)
    )


def _cute_swizzle(bms: tuple[int, int, int] | None):
    """CuTe's Swizzle<B,M,S> as CuTe defines it (``cute/swizzle.hpp``). Written here on
    purpose, not borrowed from ``cutetma.swizzle``: the two sides of the comparison must
    not share the code under test."""
    if not bms:
        return None
    b, m, s = bms
    mask = ((1 << b) - 1) << m
    return lambda x: np.asarray(x, dtype=np.int64) ^ ((np.asarray(x, dtype=np.int64) >> s) & mask)


def placement(spec: LayoutSpec, elem_bytes: int, coords, how: str = "pointer") -> np.ndarray:
    """Byte offset of each element at ``coords`` under one of the two readings of ``spec``.

    ``pointer``: the swizzle acts on byte addresses (TMA, WGMMA, the DSL's pointer swizzle).
    ``layout``: the swizzle acts on the layout's element offsets (``L(coord)``), then bytes.
    """
    elems = spec.outer(coords)
    sw = _cute_swizzle(spec.swizzle)
    if sw is None:
        return elems * elem_bytes
    if how == "pointer":
        return sw(elems * elem_bytes)
    if how == "layout":
        return sw(elems) * elem_bytes
    raise ValueError(f"placement is 'pointer' or 'layout', not {how!r}")


def element_swizzle(spec: LayoutSpec, elem_bytes: int) -> LayoutSpec:
    """The same placement with the byte swizzle rewritten for element offsets.

    ``Swizzle<B,M,S>`` on bytes equals ``Swizzle<B, M - log2 w, S>`` on element offsets when
    elements are ``w = 2**k`` bytes and ``k <= M`` (the XOR never touches bits inside one
    element).
    """
    if spec.swizzle is None:
        return spec
    b, m, s = spec.swizzle
    k = int(math.log2(elem_bytes))
    if 2**k != elem_bytes or k > m:
        raise ValueError(f"a {elem_bytes}-byte element cannot carry Swizzle<{b},{m},{s}>")
    return dataclasses.replace(spec, swizzle=(b, m - k, s), swizzle_units="element")


# --------------------------------------------------------------------------- DSL side
def _cute_dtype(elem_bytes: int):
    cutlass, _ = dsl.cutlass()
    return {1: cutlass.Uint8, 2: cutlass.Float16, 4: cutlass.Float32}[elem_bytes]


def _atom(kind: str, elem_bytes: int):
    from cutlass.cute.nvgpu import warpgroup

    return warpgroup.make_smem_layout_atom(
        getattr(warpgroup.SmemLayoutAtomKind, kind), _cute_dtype(elem_bytes)
    )


def smem_atom(kind: str, elem_bytes: int) -> LayoutSpec:
    """The DSL's Hopper shared-memory layout atom ``kind`` for ``elem_bytes``-byte data."""
    if kind not in ATOM_KINDS:
        raise ValueError(f"unknown atom kind {kind!r}: one of {', '.join(ATOM_KINDS)}")
    return dsl.on_host(lambda: _spec_from_cute(_atom(kind, elem_bytes)))


def atom_kind(swizzle_mode: str, major: str = "K") -> str:
    """The atom kind whose swizzle is a TMA mode: ('128B', 'K') -> 'K_SW128'."""
    name = hw.mode(swizzle_mode).name
    tag = {"none": "INTER", "32B": "SW32", "64B": "SW64", "128B": "SW128"}[name]
    return f"{major}_{tag}"


def _tma_box_cute(m: hw.SwizzleMode, elem_bytes: int, rows: int, cols: int):
    _, cute = dsl.cutlass()
    if m.bits and cols * elem_bytes == m.span:
        return cute.tile_to_shape(_atom(atom_kind(m.name), elem_bytes), (rows, cols), (0, 1))
    if not m.bits:
        return cute.make_ordered_layout((rows, cols), order=(1, 0))
    # narrower than the span: the hardware gives every row a whole span (measured)
    pitched = cute.make_layout((rows, cols), stride=(m.span // elem_bytes, 1))
    return cute.make_composed_layout(cute.make_swizzle(m.bits, 4, 3), 0, pitched)


def _dense_box_cute(m: hw.SwizzleMode, elem_bytes: int, rows: int, cols: int):
    """Row-major, rows packed densely, with the mode's swizzle: the layout the DSL accepts for
    a narrow TMA box (and issues as one box) but the hardware does not write."""
    _, cute = dsl.cutlass()
    row_major = cute.make_ordered_layout((rows, cols), order=(1, 0))
    return cute.make_composed_layout(cute.make_swizzle(m.bits, 4, 3), 0, row_major)


def _grouped_cute(m: hw.SwizzleMode, elem_bytes: int, rows: int, groups: int):
    _, cute = dsl.cutlass()
    g = hw.group_size(elem_bytes, m)
    return cute.tile_to_shape(_atom(atom_kind(m.name), elem_bytes), (rows, groups * g), (0, 1))


def _mn_major_cute(m: hw.SwizzleMode, elem_bytes: int, mn: int, k: int):
    _, cute = dsl.cutlass()
    return cute.tile_to_shape(_atom(atom_kind(m.name, "MN"), elem_bytes), (mn, k), (0, 1))


LAYOUT_BUILDERS = {
    "box": _tma_box_cute,
    "box_dense": _dense_box_cute,
    "grouped": _grouped_cute,
    "mn_major": _mn_major_cute,
}


def cute_layout(kind: str, swizzle_mode: str, elem_bytes: int, *extent: int) -> LayoutSpec:
    """Build one of the TMA layouts with CuTe's algebra and capture it.

    * ``box`` (rows, cols): a 2D TMA box, cols contiguous. A box as wide as the swizzle span
      is the DSL's K-major atom tiled down the rows (``tile_to_shape``), the layout the GEMM
      stages use; a narrower legal box is rows one span apart composed with the mode's byte
      swizzle (what the hardware writes); no swizzle is plain row-major.
    * ``box_dense``: a narrow swizzled box packed densely: what the DSL accepts, not what
      the hardware writes (kept to show the difference).
    * ``grouped`` (rows, groups): a (rows, groups * G) slice loaded as one 3D box
      (groups, rows, G): the K-major atom tiled rows first, then groups, so each span-wide
      group is a dense block of all rows, the chapter's 3D TMA.
    * ``mn_major`` (mn, k): the MN-major atom tiled to (mn, k), element (m, k) with m
      contiguous; its TMA box is (k rows, mn cols).
    """
    m = hw.mode(swizzle_mode)
    if kind in ("box", "box_dense"):
        hw.check_box(extent, elem_bytes, m)
    builder = LAYOUT_BUILDERS[kind]
    return dsl.on_host(lambda: _spec_from_cute(builder(m, elem_bytes, *extent)))


def cute_evaluate(kind: str, swizzle_mode: str, elem_bytes: int, extent, coords) -> list[int]:
    """Let CuTe evaluate the same layout itself at ``coords`` (``L(coord)``, the
    element-offset reading): the check that ``LayoutSpec.outer`` reads CuTe right."""
    m = hw.mode(swizzle_mode)
    builder = LAYOUT_BUILDERS[kind]

    def build():
        layout = builder(m, elem_bytes, *extent)
        return [int(layout(tuple(int(x) for x in c))) for c in coords]

    return dsl.on_host(build)


def box_table(spec: LayoutSpec, elem_bytes: int, rows: int, cols: int, how="pointer") -> np.ndarray:
    """Byte offset of every element of a (rows, cols) box: ``table[r, c]``."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return placement(spec, elem_bytes, (r, c), how)


@dataclasses.dataclass(frozen=True)
class UnitComparison:
    """One box, three placements: hardware model, CuTe as a pointer swizzle, CuTe as a
    layout swizzle. The headline of the project in one object."""

    mode: str
    elem_bytes: int
    rows: int
    cols: int
    hardware: np.ndarray
    pointer: np.ndarray
    layout: np.ndarray
    element_converted: np.ndarray
    spec: LayoutSpec

    @property
    def pointer_matches(self) -> bool:
        return bool(np.array_equal(self.hardware, self.pointer))

    @property
    def layout_matches(self) -> bool:
        return bool(np.array_equal(self.hardware, self.layout))

    @property
    def converted_matches(self) -> bool:
        return bool(np.array_equal(self.hardware, self.element_converted))

    @property
    def misplaced_fraction(self) -> float:
        return float(np.mean(self.hardware != self.layout))

    def sector_rows(self, which: str, nrows: int = 8) -> np.ndarray:
        """Physical 16-byte sector (within its row) of each logical sector, first rows."""
        table = getattr(self, which)
        per = hw.SECTOR_BYTES // self.elem_bytes
        row_bytes = self.cols * self.elem_bytes
        return (table[:nrows, ::per] % row_bytes) // hw.SECTOR_BYTES


def compare_units(swizzle_mode: str, elem_bytes: int, rows: int, cols: int) -> UnitComparison:
    """Place a TMA box by the hardware model and by both readings of CuTe's layout."""
    spec = cute_layout("box", swizzle_mode, elem_bytes, rows, cols)
    hardware = hw.smem_byte_offsets((rows, cols), elem_bytes, swizzle_mode)
    converted = element_swizzle(spec, elem_bytes)
    return UnitComparison(
        hw.mode(swizzle_mode).name,
        elem_bytes,
        rows,
        cols,
        hardware,
        box_table(spec, elem_bytes, rows, cols, "pointer"),
        box_table(spec, elem_bytes, rows, cols, "layout"),
        box_table(converted, elem_bytes, rows, cols, "layout"),
        spec,
    )


# --------------------------------------------------------------------------- the comparison
BOX_ROWS = (8, 16, 40, 64, 128, 256)
GROUPS = (1, 2, 4)
WIDTHS = (1, 2, 4)


@dataclasses.dataclass(frozen=True)
class Case:
    """One layout to hold against the hardware model."""

    kind: str  # "box", "grouped" or "mn_major"
    mode: str
    elem_bytes: int
    extent: tuple[int, int]  # box: (rows, cols); grouped: (rows, groups); mn_major: (mn, k)

    def __str__(self) -> str:
        return f"{self.kind}-{self.mode}-{8 * self.elem_bytes}bit-{'x'.join(map(str, self.extent))}"


def sweep_cases(rows=BOX_ROWS, widths=WIDTHS) -> list[Case]:
    """Every mode x element width x box of ``rows`` rows with every legal inner width, every
    3D grouped box (1, 2, 4 groups) and every MN-major tile, as the tests and the tour run."""
    cases = []
    for name, m in hw.MODES.items():
        for w in widths:
            max_inner = m.span if m.bits else hw.MAX_BOX_DIM * w
            for r in rows:
                for inner in range(hw.SECTOR_BYTES, max_inner + 1, hw.SECTOR_BYTES):
                    cases.append(Case("box", name, w, (r, inner // w)))
                if m.bits:
                    cases += [Case("grouped", name, w, (r, g)) for g in GROUPS]
                    cases.append(Case("mn_major", name, w, (m.span // w, r)))
    return cases


def model_offsets(case: Case) -> np.ndarray:
    """The hardware model's byte offsets, indexed like the case's CuTe layout."""
    w = case.elem_bytes
    if case.kind == "box":
        return hw.smem_byte_offsets(case.extent, w, case.mode)
    if case.kind == "grouped":
        rows, groups = case.extent
        return hw.grouped_box_offsets(rows, groups * hw.group_size(w, case.mode), w, case.mode)
    if case.kind == "mn_major":
        mn, k = case.extent  # the TMA box is (k rows, mn contiguous columns)
        return hw.smem_byte_offsets((k, mn), w, case.mode).T
    raise ValueError(f"unknown case kind {case.kind!r}")


def _grid(case: Case) -> tuple[np.ndarray, np.ndarray]:
    a, b = case.extent
    if case.kind == "grouped":
        b = b * hw.group_size(case.elem_bytes, case.mode)
    return np.meshgrid(np.arange(a), np.arange(b), indexing="ij")


@dataclasses.dataclass(frozen=True)
class CaseResult:
    case: Case
    spec: LayoutSpec
    mismatches: int  # elements whose CuTe byte address differs from the model's
    elements: int
    self_check_ok: bool  # CuTe evaluating itself agrees with our reading of its spec

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.self_check_ok


def compare_case(case: Case, samples: int = 16, seed: int = 0) -> CaseResult:
    """CuTe's layout for ``case``, evaluated for every element, against the model; plus
    ``samples`` coordinates evaluated by CuTe itself to confirm the reading of its spec
    (0: not re-checked; each check is one more trace of the layout)."""
    spec = cute_layout(case.kind, case.mode, case.elem_bytes, *case.extent)
    grid = _grid(case)
    algebra = placement(spec, case.elem_bytes, grid, "pointer")
    model = model_offsets(case)
    self_check = True  # samples=0: the spec's reading is not re-checked (one trace less)
    if samples:
        rng = np.random.default_rng(seed)
        flat = rng.choice(grid[0].size, size=min(samples, grid[0].size), replace=False)
        coords = [(int(grid[0].flat[i]), int(grid[1].flat[i])) for i in flat]
        ours = placement(spec, 1, ([c[0] for c in coords], [c[1] for c in coords]), "layout")
        theirs = cute_evaluate(case.kind, case.mode, case.elem_bytes, case.extent, coords)
        self_check = bool(np.array_equal(ours, theirs))
    return CaseResult(
        case,
        spec,
        int(np.count_nonzero(algebra != model)),
        int(model.size),
        self_check,
    )


@dataclasses.dataclass
class TransposedView:
    """``transposed_view``'s answer: the K-major stage, its transposed view, and the two
    checks (the same bytes; every atom-sized block of the view laid out as the MN-major
    atom, which is what a WGMMA descriptor for an MN-major operand describes)."""

    stage: LayoutSpec
    view: LayoutSpec
    same_bytes: bool
    atoms_are_mn_major: bool


def transposed_view(rows: int, cols: int, elem_bytes: int = 2,
                    swizzle_mode: str = "128B") -> TransposedView:
    """The attention backward's reading of one stage two ways, checked with CuTe's algebra:
    a (rows, cols) stage, cols contiguous (the DSL's K-major atom tiled rows first: Q, dO or
    K as a TMA box lands), and its transposed view ``composition(stage, (cols, rows) ordered
    (1, 0))``, the MN-major operand (cols, rows) of the same bytes (Q^T for dK = dS^T Q).
    The view must address, at (c, r), the byte the stage addresses at (r, c), and each of its
    span x 8 blocks must be the MN-major atom's image (so a WGMMA descriptor covers it)."""
    m = hw.mode(swizzle_mode)
    if not m.bits:
        raise ValueError("transposed_view compares swizzled stages: 32B, 64B or 128B")

    def build():
        _, cute = dsl.cutlass()
        stage = cute.tile_to_shape(_atom(atom_kind(m.name, "K"), elem_bytes), (rows, cols),
                                   (0, 1))
        view = cute.composition(stage, cute.make_ordered_layout((cols, rows), order=(1, 0)))
        return _spec_from_cute(stage), _spec_from_cute(view)

    stage, view = dsl.on_host(build)
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    at_stage = placement(stage, elem_bytes, (r, c))
    at_view = placement(view, elem_bytes, (c, r))
    span = m.span // elem_bytes  # elements of one swizzled row
    atom = smem_atom(atom_kind(m.name, "MN"), elem_bytes)
    n_in, k_in = np.meshgrid(np.arange(span), np.arange(8), indexing="ij")
    want = placement(atom, elem_bytes, (n_in, k_in))
    atoms_ok = True
    for n0 in range(0, cols, span):
        for k0 in range(0, rows, 8):
            block = placement(view, elem_bytes, (n0 + n_in, k0 + k_in))
            atoms_ok &= bool((block - block[0, 0] == want - want[0, 0]).all())
    return TransposedView(stage, view, bool((at_stage == at_view).all()), atoms_ok)
