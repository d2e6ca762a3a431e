"""The hardware model against the TMA chapter's own numbers and the TMA box rules."""

import numpy as np
import pytest

from cutetma import swizzle as hw


def test_swizzle_formula_matches_cute_definition():
    sw = hw.Swizzle(3, 4, 3)
    x = np.arange(4096)
    expected = x ^ ((x >> 3) & (0b111 << 4))
    assert np.array_equal(sw(x), expected)
    assert str(sw) == "Swizzle<3,4,3>"


@pytest.mark.parametrize("name,bits,span,atom", [("none", 0, 0, 16), ("32B", 1, 32, 256),
                                                  ("64B", 2, 64, 512), ("128B", 3, 128, 1024)])
def test_modes(name, bits, span, atom):
    m = hw.mode(name)
    assert (m.bits, m.span, m.atom_bytes) == (bits, span, atom)
    assert m.swizzle == hw.Swizzle(bits, 4, 3)
    # the pattern repeats after one atom and is a permutation of every atom
    offs = m.swizzle(np.arange(4 * max(atom, 16)))
    assert np.array_equal(np.sort(offs[:atom]), np.arange(atom))
    assert np.array_equal(offs[atom:2 * atom] - atom, offs[:atom])


def test_chapter_8x64_fp16_128B_is_c_xor_r():
    rows, sectors = hw.sector_map(8, 64, 2, "128B")
    r, c = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    assert np.array_equal(rows, r)
    assert np.array_equal(sectors, c ^ r)
    # and without swizzle, sector c stays sector c
    assert np.array_equal(hw.sector_map(8, 64, 2, "none")[1], c)


def test_chapter_16x128_slice_is_two_groups_of_two_atoms():
    x = np.arange(16 * 256).reshape(16, 256)
    sl = x[:, 128:256]  # the second 128 columns, 'Col offset' in the chapter's figure
    g3 = hw.group_view(sl, 2, "128B")
    assert g3.shape == (2, 16, 64)
    row, j = 11, 100
    assert sl[row, j] == g3[j // 64, row, j % 64]
    offs = hw.grouped_box_offsets(16, 128, 2, "128B")
    atom = hw.mode("128B").atom_bytes
    # group g, atom a (rows 8a..8a+7) owns bytes [(2g + a) * 1024, ...+1024): four atoms
    for g in range(2):
        for a in range(2):
            block = offs[8 * a:8 * a + 8, 64 * g:64 * g + 64]
            assert block.min() == (2 * g + a) * atom and block.max() < (2 * g + a + 1) * atom
    # inside each atom: physical sector = logical sector XOR (row % 8)
    sector = (offs[:, ::8] % 128) // 16
    r = np.arange(16)[:, None] % 8
    assert np.array_equal(sector, np.tile(np.arange(8), 2)[None, :] ^ r)


def test_chapter_bank_sectors_grouped_vs_ungrouped():
    grouped = hw.column_access_banks(256, 0, range(8), "128B", grouped=True)
    assert sorted(grouped.bank_sectors) == list(range(8))
    assert grouped.conflict_degree == 1
    ungrouped = hw.column_access_banks(256, 0, range(8), "128B", grouped=False)
    assert ungrouped.distinct == 4 and ungrouped.conflict_degree == 2
    # the chapter's formula for the ungrouped case: local_col ^ ((2 * row + col // 8) % 8)
    for col in range(16):
        rep = hw.column_access_banks(256, col, range(8), "128B", grouped=False)
        assert list(rep.bank_sectors) == [(col % 8) ^ ((2 * r + col // 8) % 8) for r in range(8)]


@pytest.mark.parametrize("kwargs,rule", [
    (dict(box=(8, 128), elem_bytes=2, swizzle="128B"), "swizzle-span rule"),
    (dict(box=(8, 4), elem_bytes=2, swizzle="none"), "inner-box rule"),
    (dict(box=(300, 64), elem_bytes=2, swizzle="128B"), "box-size rule"),
    (dict(box=(1, 1, 1, 1, 1, 8), elem_bytes=2), "rank rule"),
    (dict(box=(8, 64), elem_bytes=2, global_strides_bytes=(130,)), "stride rule"),
    (dict(box=(8, 64), elem_bytes=2, global_base=8), "alignment rule"),
    (dict(box=(8, 64), elem_bytes=2, swizzle="128B", smem_base=512), "shared-memory alignment"),
])
def test_box_rules_name_rule_and_numbers(kwargs, rule):
    with pytest.raises(ValueError, match=rule):
        hw.check_box(**kwargs)


def test_box_rule_message_carries_numbers():
    with pytest.raises(ValueError, match=r"at most 128 bytes .*got 256 B"):
        hw.check_box((8, 128), 2, "128B")


def test_legal_boxes_pass():
    hw.check_box((256, 64), 2, "128B", global_strides_bytes=(4096,), global_base=0, smem_base=1024)
    hw.check_box((8, 256), 4, "none")
    hw.check_box((2, 16, 64), 2, "128B")


def test_smem_image_round_trips():
    rng = np.random.default_rng(1)
    box = rng.integers(0, 2**16, size=(16, 64), dtype=np.uint16)
    img = hw.smem_image(box, "128B")
    offs = hw.smem_byte_offsets(box.shape, 2, "128B")
    back = img.view(np.uint16)[offs // 2]
    assert np.array_equal(back, box)


def test_unknown_mode_and_dtype():
    with pytest.raises(ValueError, match="unknown swizzle mode"):
        hw.mode("96B")
    with pytest.raises(ValueError, match="unknown dtype"):
        hw.dtype_bytes("fp12")


def test_narrow_swizzled_box_rows_take_a_whole_span():
    """Measured on the H200: a 128B-swizzled box of 32-byte rows puts its rows 128 B apart."""
    offs = hw.smem_byte_offsets((8, 16), 2, "128B")
    assert hw.box_row_pitch(32, "128B") == 128
    assert hw.box_smem_bytes((8, 16), 2, "128B") == 8 * 128
    assert list(offs[:, 0]) == [r * 128 + 16 * (r % 8 & 0b111) for r in range(8)]
    assert offs.max() < 8 * 128 and offs.max() >= 8 * 32
    dense = hw.smem_byte_offsets((8, 16), 2, "128B", row_pitch=32)
    assert not np.array_equal(dense, offs)
    assert hw.box_row_pitch(32, "none") == 32  # no swizzle: rows stay packed


def test_bank_rows_of_a_taller_tile():
    """Rows 1..8 of a 16-row grouped tile: group 1 starts after all 16 rows (2048 B)."""
    rep = hw.column_access_banks(256, 9, range(1, 9), "128B", grouped=True, box_rows=16)
    assert rep.byte_addresses[0] == 2048 + 1 * 128 + 16 * (1 ^ 1)
    assert rep.distinct == 8
    with pytest.raises(ValueError, match="does not contain"):
        hw.column_access_banks(256, 0, range(8), "128B", box_rows=4)
