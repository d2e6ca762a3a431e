"""CuTe layout algebra against the hardware model, byte for byte, and the unit trap.

Every mode x element width (1, 2, 4 bytes) x 2D box (8 to 256 rows, every legal inner width of the
swizzled modes; unswizzled, every width up to 128 bytes and the powers of two past it, where nothing
new can happen), every 3D grouped box and every MN-major tile: the byte address CuTe's algebra gives
each element equals the model's. CuTe evaluating the layout itself confirms our reading of its spec
on the first case of each kind, mode and width (each such check is another trace, and traces are
most of the time and memory). ``test_flipped_model_bit_is_caught`` shows the comparison can fail:
flip one bit of the model's XOR and every swizzled mode reports mismatches.
"""

import numpy as np
import pytest

from cutetma import layouts as L
from cutetma import swizzle as hw

CASES = L.sweep_cases()


def _tested(case) -> bool:
    inner = case.extent[1] * case.elem_bytes
    return case.mode != "none" or inner <= 128 or inner & (inner - 1) == 0


def test_sweep_covers_every_mode_width_and_kind():
    seen = {(c.kind, c.mode, c.elem_bytes) for c in CASES}
    for name in hw.MODE_NAMES:
        for w in L.WIDTHS:
            assert ("box", name, w) in seen
            if name != "none":
                assert ("grouped", name, w) in seen and ("mn_major", name, w) in seen
    rows = {c.extent[0] for c in CASES if c.kind == "box"}
    assert min(rows) == 8 and max(rows) == 256
    # every legal inner width of the 128B fp16 box: 16, 32, ..., 128 bytes
    assert {c.extent[1] for c in CASES if c.kind == "box" and c.mode == "128B"
            and c.elem_bytes == 2} == {8, 16, 24, 32, 40, 48, 56, 64}


@pytest.mark.parametrize("mode", hw.MODE_NAMES)
@pytest.mark.parametrize("elem_bytes", L.WIDTHS)
def test_cute_algebra_equals_hardware_model(mode, elem_bytes):
    cases = [c for c in CASES if c.mode == mode and c.elem_bytes == elem_bytes and _tested(c)]
    assert cases
    first = {}
    for c in cases:
        first.setdefault(c.kind, c)
    results = [L.compare_case(c, samples=16 if first[c.kind] is c else 0) for c in cases]
    bad = [r for r in results if not r.ok]
    assert not bad, "\n".join(f"{r.case}: {r.mismatches}/{r.elements} differ, "
                              f"self-check {r.self_check_ok}, {r.spec.text}" for r in bad[:5])


def test_flipped_model_bit_is_caught(monkeypatch):
    """Drop the lowest XOR bit of the model's swizzle: the comparison must see it."""
    real = hw.Swizzle.__call__

    def flipped(self, x):
        if not self.bits:
            return real(self, x)
        x = np.asarray(x, dtype=np.int64)
        return x ^ ((x >> self.shift) & (self.zzz_mask & ~(1 << self.base)))

    monkeypatch.setattr(hw.Swizzle, "__call__", flipped)
    for mode in ("32B", "64B", "128B"):
        for kind, extent in (("box", (8, 64 // 2 * hw.mode(mode).span // 64)),
                             ("grouped", (16, 2))):
            r = L.compare_case(L.Case(kind, mode, 2, extent))
            assert r.mismatches > 0, f"{kind} {mode}: a flipped model bit went unnoticed"


def test_hopper_atoms_are_byte_unit_swizzles():
    for kind in L.ATOM_KINDS:
        mode = hw.mode(L.MODE_OF_KIND[kind.split("_", 1)[1]])
        for w in L.WIDTHS:
            spec = L.smem_atom(kind, w)
            assert spec.swizzle == (mode.bits, 4, 3), spec.text
            width_bytes = max(mode.span, 16) if kind.startswith("K") else None
            if width_bytes:  # K-major: (8, W) with W elements = one span of bytes
                assert spec.shape == (8, width_bytes // w), spec.text


def test_unit_trap_fp16_128B():
    """CuTe's atom read as an element-offset layout misplaces half of a fp16 tile; as a
    pointer (byte) swizzle, or with the swizzle rewritten to S<3,3,3>, it is exact."""
    cmp = L.compare_units("128B", 2, 8, 64)
    assert cmp.pointer_matches and cmp.converted_matches
    assert not cmp.layout_matches
    assert cmp.misplaced_fraction == 0.5
    assert list(cmp.sector_rows("hardware")[1]) == [1, 0, 3, 2, 5, 4, 7, 6]
    assert list(cmp.sector_rows("layout")[1]) == list(range(8))  # row 1 did not move
    assert L.element_swizzle(cmp.spec, 2).swizzle == (3, 3, 3)


def test_unit_trap_vanishes_for_bytes():
    cmp = L.compare_units("128B", 1, 8, 128)
    assert cmp.layout_matches and cmp.pointer_matches


def test_layoutspec_reads_cute_hierarchical_modes():
    spec = L.cute_layout("grouped", "64B", 4, 24, 2)
    coords = [(0, 0), (23, 31), (9, 17), (16, 5)]
    ours = L.placement(spec, 1, ([c[0] for c in coords], [c[1] for c in coords]), "layout")
    assert list(ours) == L.cute_evaluate("grouped", "64B", 4, (24, 2), coords)


def test_dense_narrow_box_is_not_what_the_hardware_writes():
    """The DSL accepts a densely packed narrow swizzled box for a TMA atom; the hardware
    gives each row a whole span, so that layout misplaces bytes (the ``box`` layout does not)."""
    case = L.Case("box", "128B", 2, (16, 32))
    model = L.model_offsets(case)
    dense = L.cute_layout("box_dense", "128B", 2, 16, 32)
    pitched = L.cute_layout("box", "128B", 2, 16, 32)
    grid = L._grid(case)
    assert not np.array_equal(L.placement(dense, 2, grid), model)
    assert np.array_equal(L.placement(pitched, 2, grid), model)


@pytest.mark.parametrize("rows,cols,elem_bytes,mode", [
    (64, 128, 2, "128B"), (128, 64, 2, "128B"), (64, 64, 2, "64B"), (64, 32, 2, "32B"),
    (128, 128, 1, "128B")])
def test_transposed_view_is_the_same_bytes_as_mn_major_atoms(rows, cols, elem_bytes, mode):
    """The attention backward reads Q, dO and K both K-major and, transposed in place,
    MN-major: CuTe's composition addresses the same byte at (c, r) as the stage at (r, c),
    and every swizzle-atom block of the view is the DSL's MN-major atom."""
    from cutetma import layouts

    view = layouts.transposed_view(rows, cols, elem_bytes, mode)
    assert view.same_bytes and view.atoms_are_mn_major
    with pytest.raises(ValueError, match="swizzled"):
        layouts.transposed_view(64, 64, 2, "none")
