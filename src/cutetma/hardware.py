"""The hardware-swizzle check: what the H200 writes into shared memory, against the model
and the CuTe algebra, byte for byte, for every mode x element width x 2D/3D box x mechanism.

Each case loads box (1, 1) of a random tensor whose shape is not a multiple of the box
(so the descriptor's extents are real), through ``cutetma.smem_image``, and compares:

* ``model``:   ``cutetma.swizzle`` placing the same box bytes (``swizzle.model_image``);
* ``algebra``: the CuTe layout from ``cutetma.layouts`` placing them (pointer swizzle);
* every CTA of a multicast / DSM cluster holds the same bytes.

A zero-fill case loads a box that hangs over the tensor's edge: the model image of the box
with zeros outside the tensor must come back.

A paged case (``row_offset``) lands a box that many rows into a larger buffer, as a paged
K/V stage's later boxes do (one box per page). Two readings are compared: the swizzle phase
of the buffer (the stage's image, rows ``row_offset ..``: ``matches_model``) and a phase
that restarts at the box (``matches_box_phase``). Which one holds, and whether a box that
starts or ends inside the 8-row atom is taken at all, says which page sizes a TMA-paged
stage can use byte-exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cutetma import layouts as L
from cutetma import swizzle as hw

NP_DTYPE = {1: np.uint8, 2: np.uint16, 4: np.uint32}


@dataclasses.dataclass(frozen=True)
class HwCase:
    mode: str
    elem_bytes: int
    rows: int
    cols: int
    grouped: bool
    load: str
    cluster: int = 1
    overhang: bool = False  # the box hangs over the tensor edge (TMA zero fill)
    row_offset: int = 0  # the box lands this many rows into a larger buffer (paged)

    @property
    def name(self) -> str:
        kind = "3d" if self.grouped else "2d"
        tail = f"-c{self.cluster}" if self.cluster > 1 else ""
        tail += "-oob" if self.overhang else ""
        tail += f"-at{self.row_offset}" if self.row_offset else ""
        box = f"{self.rows}x{self.cols}"
        return f"{self.mode}-{8 * self.elem_bytes}bit-{kind}-{box}-{self.load}{tail}"


def hardware_cases(quick: bool = False) -> list[HwCase]:
    cases = []
    for mode, m in hw.MODES.items():
        for w in (1, 2, 4):
            span = m.span if m.bits else 128
            boxes = [(8, 16 // w), (64, span // w), (256, span // w)]
            if not m.bits:
                boxes.append((16, 256))  # widest legal inner box without swizzle
            if quick:
                boxes = boxes[1:2]
            for rows, cols in boxes:
                for load in ("tma", "cp_async"):
                    cases.append(HwCase(mode, w, rows, cols, False, load))
                cases.append(HwCase(mode, w, rows, cols, False, "tma", overhang=True))
            if m.bits:
                g = m.span // w
                for rows, groups in ([(16, 2)] if quick else [(16, 2), (64, 4)]):
                    for load in ("tma", "cp_async"):
                        cases.append(HwCase(mode, w, rows, groups * g, True, load))
            if w == 2 or not quick:
                for cluster in (2, 4):
                    cases.append(HwCase(mode, w, 64, span // w, False, "tma", cluster))  # multicast
                    cases.append(HwCase(mode, w, 64, span // w, False, "dsm", cluster))
    cases += paged_cases(quick)
    return cases


def paged_cases(quick: bool = False) -> list[HwCase]:
    """Boxes of a paged K/V stage (128-byte swizzle, 16-bit, one span wide): whole 8-row
    atoms at an atom's start (pages that are multiples of 8 keys, the TMA-paged kernel's),
    and boxes that start or end inside an atom (pages of 4 or 12 keys)."""
    boxes = [(8, 8), (16, 16), (8, 24), (4, 0), (4, 4), (12, 4), (4, 12)]
    if quick:
        boxes = [(8, 8), (4, 4)]
    return [HwCase("128B", 2, rows, 64, False, "tma", row_offset=at) for rows, at in boxes]


POISON = 0xA5  # what the probe writes into shared memory before the load


def model_offsets(case: HwCase) -> np.ndarray:
    """Where the model (``cutetma.swizzle``) puts each box element, in bytes from the buffer's
    start (paged: in the stage's swizzle phase)."""
    w = case.elem_bytes
    if case.grouped:
        return hw.grouped_box_offsets(case.rows, case.cols, w, case.mode)
    base = case.row_offset * hw.box_row_pitch(case.cols * w, case.mode)
    # the buffer's swizzle phase: where the stage's model puts these rows
    return hw.smem_byte_offsets((case.rows, case.cols), w, case.mode, smem_base=base) + base


def box_phase_offsets(case: HwCase) -> np.ndarray:
    """A paged box read with its swizzle phase restarting at the box's first row."""
    base = case.row_offset * hw.box_row_pitch(case.cols * case.elem_bytes, case.mode)
    return hw.smem_byte_offsets((case.rows, case.cols), case.elem_bytes, case.mode) + base


def algebra_offsets(case: HwCase) -> np.ndarray:
    """Where the CuTe layout puts each box element (pointer reading of the swizzle)."""
    w = case.elem_bytes
    if case.grouped:
        g = hw.group_size(w, case.mode)
        spec = L.cute_layout("grouped", case.mode, w, case.rows, case.cols // g)
    else:  # paged: the stage's layout, rows row_offset ..
        spec = L.cute_layout("box", case.mode, w, case.rows + case.row_offset, case.cols)
    r, c = np.meshgrid(np.arange(case.rows) + case.row_offset, np.arange(case.cols),
                       indexing="ij")
    return L.placement(spec, w, (r, c), "pointer")


def run_case(case: HwCase, seed: int = 0) -> dict:
    import torch

    from cutetma import ops

    w = case.elem_bytes
    gen = torch.Generator().manual_seed(seed)
    # 2 full boxes + a remainder each way, so tile (1, 1) is inside; the row stride is padded
    # to 16 bytes, as TMA needs
    rows_total = 2 * case.rows + 3
    cols_total = 2 * case.cols + 16 // w
    if case.overhang:
        rows_total = case.rows + case.rows // 2 + 1
        cols_total = case.cols + max(16 // w, case.cols // 2)
    pitch = -(-cols_total * w // 16) * 16 // w
    raw = torch.randint(0, 256, (rows_total, pitch * w), generator=gen, dtype=torch.uint8)
    host = raw.view({1: torch.uint8, 2: torch.float16, 4: torch.float32}[w])[:, :cols_total]
    x = host.cuda()
    image = ops.smem_image(x, (case.rows, case.cols), swizzle=case.mode, load=case.load,
                           tile=(1, 1), grouped=case.grouped, cluster=case.cluster,
                           row_offset=case.row_offset)
    images = image.reshape(-1, image.shape[-1]).cpu().numpy()

    box = np.zeros((case.rows, case.cols), dtype=NP_DTYPE[w])
    src = host.numpy().view(NP_DTYPE[w])[case.rows:2 * case.rows, case.cols:2 * case.cols]
    box[:src.shape[0], :src.shape[1]] = src  # zeros where the box hangs over the edge

    def holds(offsets) -> bool:
        """Every CTA's image has the box's bytes at ``offsets`` and poison everywhere else."""
        want = np.full(images.shape[1], POISON, dtype=np.uint8)
        want[offsets.reshape(-1, 1) + np.arange(w)] = box.reshape(-1).view(np.uint8).reshape(-1, w)
        return bool(all(np.array_equal(im, want) for im in images))

    m = hw.mode(case.mode)
    row = dataclasses.asdict(case)
    row.update(
        name=case.name,
        smem_bytes=int(images.shape[1]),
        matches_model=holds(model_offsets(case)),
        matches_algebra=holds(algebra_offsets(case)),
        ctas_identical=bool(all(np.array_equal(im, images[0]) for im in images)),
    )
    if case.row_offset:
        row["matches_box_phase"] = holds(box_phase_offsets(case))
    if m.bits and not case.grouped and case.cols * w < m.span:
        # a swizzled box narrower than its span: dense rows, or rows a span apart?
        row["matches_dense_rows"] = holds(hw.smem_byte_offsets(box.shape, w, m))
        row["matches_span_pitch_rows"] = holds(hw.smem_byte_offsets(box.shape, w, m,
                                                                    row_pitch=m.span))
    row["match"] = row["matches_model"] and row["matches_algebra"] and row["ctas_identical"]
    return row


def run(cases=None, progress=None) -> list[dict]:
    cases = cases if cases is not None else hardware_cases()
    rows = []
    for i, case in enumerate(cases):
        try:
            rows.append(run_case(case, seed=i))
        except Exception as exc:  # a case that cannot run is a failed case, with its reason
            row = dataclasses.asdict(case)
            row.update(name=case.name, match=False, error=f"{type(exc).__name__}: {exc}"[:500])
            rows.append(row)
        if progress:
            progress(i + 1, len(cases), rows[-1])
    return rows
