"""FP8's scales in the GEMM consumers, a mixin of ``HopperGemm`` (``gemm_sm90.py``).

Per-tensor and row-wise scales dequantise the finished fp32 accumulator once: a thread
loads the scales of its distinct rows and columns (``accumulator.value_offsets``) under the
tile's last WGMMAs (``_load_scales``) and multiplies its values (``_scale``). Blockwise
scales (DeepSeek-V3's) differ per 128 of K, i.e. per k-tile, and a promoted fp32 C
(``GemmConfig.promote``) sums each k-tile in full fp32: each k-tile's product comes in a
fragment of its own, which ``_promote`` adds into the accumulator (times its scales,
blockwise), loaded between the k-tile's WGMMAs and its wait.
"""

from __future__ import annotations

from cutetma import dsl

cutlass, cute = dsl.cutlass()


class Fp8Scales:
    @cute.jit
    def _load_scales(self, tCcC, offsets, mScaleA, mScaleB, m, n, k, shape_mn):
        """The scales of this thread's values in tile (m, n) (blockwise: of k-tile ``k``):
        (scale_a of each distinct row, scale_b of each distinct column), one of each for
        "tensor", one scale_b (the tile's 128-column block) for "block". Rows and columns
        past M or N take 0 (their values are never stored)."""
        cfg = self.cfg
        row0, col0 = tCcC[0]
        row0 = m * cfg.tile_m + row0
        col0 = n * cfg.tile_n + col0
        rows = offsets.rows if cutlass.const_expr(cfg.scaling != "tensor") else [0]
        cols = offsets.cols if cutlass.const_expr(cfg.scaling == "row") else [0]
        sa = cute.make_rmem_tensor((len(rows),), cutlass.Float32)
        sb = cute.make_rmem_tensor((len(cols),), cutlass.Float32)
        if cutlass.const_expr(cfg.scaling == "tensor"):
            sa[0] = mScaleA[0]
            sb[0] = mScaleB[0]
        else:
            for j in cutlass.range_constexpr(len(rows)):
                sa[j] = cutlass.Float32(0.0)
                if row0 + rows[j] < shape_mn[0]:
                    if cutlass.const_expr(cfg.scaling == "block"):
                        sa[j] = mScaleA[row0 + rows[j], k]
                    else:
                        sa[j] = mScaleA[row0 + rows[j]]
            if cutlass.const_expr(cfg.scaling == "block"):
                # the tile lies in one 128-column block of B (tile_n divides 128)
                sb[0] = mScaleB[n * cfg.tile_n // 128, k]
            else:
                for j in cutlass.range_constexpr(len(cols)):
                    sb[j] = cutlass.Float32(0.0)
                    if col0 + cols[j] < shape_mn[1]:
                        sb[j] = mScaleB[col0 + cols[j]]
        return sa, sb

    @cute.jit
    def _scale(self, acc, sa, sb, offsets):
        """FP8's dequantisation of the fp32 accumulator: value i times its row's scale_a and
        its column's scale_b (``_load_scales``: one each for "tensor")."""
        cfg = self.cfg
        for i in cutlass.range_constexpr(cute.size(acc)):
            a = sa[offsets.row_of[i]] if cutlass.const_expr(cfg.scaling == "row") else sa[0]
            b = sb[offsets.col_of[i]] if cutlass.const_expr(cfg.scaling == "row") else sb[0]
            acc[i] = acc[i] * (a * b)

    @cute.jit
    def _promote(self, acc, part, sa, sb, offsets):
        """acc += the k-tile's product ``part``, in fp32: times its scales (blockwise,
        DeepSeek-V3's: scale_a of the row's 128 of K, scale_b of the tile's 128 x 128 block
        of B), or as it is (``promote``: tensor and row scales come in the epilogue)."""
        cfg = self.cfg
        for i in cutlass.range_constexpr(cute.size(acc)):
            if cutlass.const_expr(cfg.scaling == "block"):
                acc[i] = acc[i] + part[i] * (sa[offsets.row_of[i]] * sb[0])
            else:
                acc[i] = acc[i] + part[i]
