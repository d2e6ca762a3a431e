"""FP8's scales in the GEMM consumers, a mixin of ``HopperGemm`` (``gemm_sm90.py``).

Per-tensor and row-wise scales dequantise the finished fp32 accumulator once
(``_load_scales`` under the tile's last WGMMAs, then ``_scale``). Blockwise scales
(DeepSeek-V3's) differ per 128 of K, i.e. per k-tile, and a promoted fp32 C
(``GemmConfig.promote``) sums each k-tile in full fp32, so both take every k-tile's product
in a fragment of its own and add it into the accumulator (``_promote``). Two such fragments
alternate (``HopperGemm.consume``)::

    k-tile k      wait full -> WGMMA into part[k % 2] -> load k's scales -> wait_group(1)
                  (k - 1 done) -> release k - 1's stage -> acc += part[(k - 1) % 2] x scales

so k - 1's promotion runs under k's WGMMAs instead of after a full wait: a warpgroup's tensor
core work never drains between k-tiles. The accumulator and the two fragments take 192 fp32
registers a thread at 128 x 128 (two consumer warpgroups, 64 rows each).
"""

from __future__ import annotations

from cutetma import dsl

cutlass, cute = dsl.cutlass()


class Fp8Scales:
    @cute.jit
    def _load_scales(self, sa, sb, tCcC, offsets, mScaleA, mScaleB, m, n, k, shape_mn,
                     rows: cutlass.Constexpr = True, cols: cutlass.Constexpr = True):
        """Fill ``sa`` (``rows``) and ``sb`` (``cols``) with the scales of this thread's
        values in tile (m, n) (blockwise: of k-tile ``k``): scale_a of each distinct row and
        scale_b of each distinct column, one of each for "tensor", one scale_b (the tile's
        128-column block) for "block". Rows and columns past M or N take 0 (their values are
        never stored)."""
        cfg = self.cfg
        row0, col0 = tCcC[0]
        row0 = m * cfg.tile_m + row0
        col0 = n * cfg.tile_n + col0
        if cutlass.const_expr(cfg.scaling == "tensor"):
            sa[0] = mScaleA[0]
            sb[0] = mScaleB[0]
        else:
            if cutlass.const_expr(rows):
                for j in cutlass.range_constexpr(len(offsets.rows)):
                    sa[j] = cutlass.Float32(0.0)
                    if row0 + offsets.rows[j] < shape_mn[0]:
                        if cutlass.const_expr(cfg.scaling == "block"):
                            sa[j] = mScaleA[row0 + offsets.rows[j], k]
                        else:
                            sa[j] = mScaleA[row0 + offsets.rows[j]]
            if cutlass.const_expr(cols):
                if cutlass.const_expr(cfg.scaling == "block"):
                    # the tile lies in one 128-column block of B (tile_n divides 128)
                    sb[0] = mScaleB[n * cfg.tile_n // 128, k]
                else:
                    for j in cutlass.range_constexpr(len(offsets.cols)):
                        sb[j] = cutlass.Float32(0.0)
                        if col0 + offsets.cols[j] < shape_mn[1]:
                            sb[j] = mScaleB[col0 + offsets.cols[j]]

    def _scale_fragments(self, offsets):
        """Register fragments for one set of scales (``_load_scales``'s ``sa``, ``sb``)."""
        cfg = self.cfg
        rows = len(offsets.rows) if cfg.scaling != "tensor" else 1
        cols = len(offsets.cols) if cfg.scaling == "row" else 1
        return (cute.make_rmem_tensor((rows,), cutlass.Float32),
                cute.make_rmem_tensor((cols,), cutlass.Float32))

    def _value_scale(self, sa, sb, offsets, i: int, rows: bool = True, cols: bool = True):
        """Accumulator value i's scale: its row's scale_a (``rows``) times its column's
        scale_b (``cols``); one scale_b per tile blockwise, one of each per tensor."""
        cfg = self.cfg
        a = sa[offsets.row_of[i]] if cfg.scaling in ("row", "block") else sa[0]
        b = sb[offsets.col_of[i]] if cfg.scaling == "row" else sb[0]
        return a * b if rows and cols else (a if rows else b)

    @cute.jit
    def _scale(self, acc, sa, sb, offsets, rows: cutlass.Constexpr = True):
        """FP8's dequantisation of the fp32 accumulator: each value times its scale, or
        (not ``rows``: a promoted row-wise accumulator already carries scale_a) its
        column's scale_b."""
        for i in cutlass.range_constexpr(cute.size(acc)):
            acc[i] = acc[i] * self._value_scale(sa, sb, offsets, i, rows=rows)

    @cute.jit
    def _promote(self, acc, part, sa, sb, offsets):
        """acc += a k-tile's product ``part`` times its scales, in fp32. Blockwise
        (DeepSeek-V3's): scale_a of the row's 128 of K times scale_b of the tile's 128 x 128
        block of B. A promoted fp32 C: per tensor the product of the two scalars, row-wise
        the row's scale_a only (its 32 column scales would stay live through the mainloop
        and spill; they meet the finished tile, ``_scale(rows=False)``). A bare sum would let
        ptxas fold the first promotion into a copy of the fragment, whose registers the next
        WGMMA then overwrites in flight: it serializes the WGMMAs (C7514)."""
        row_only = self.cfg.scaling == "row"
        for i in cutlass.range_constexpr(cute.size(acc)):
            acc[i] = acc[i] + part[i] * self._value_scale(sa, sb, offsets, i,
                                                          cols=not row_only)

    @cute.jit
    def _issue_part(self, tiled_mma, part, tCrA, tCrB, stage):
        """One k-tile's WGMMAs into ``part`` alone, as one committed group: the caller clears
        ``tiled_mma``'s ACCUMULATE field, so the first k-step overwrites the fragment."""
        cute.nvgpu.warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(tiled_mma, part, tCrA[(None, None, kb, stage)],
                      tCrB[(None, None, kb, stage)], part)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        cute.nvgpu.warpgroup.commit_group()

    @cute.jit
    def _promote_under(self, pipe, read, release, tiled_mma, tCrA, tCrB, acc, into, done,
                       s_into, s_done, k, scale_args):
        """k-tile ``k`` into ``into`` (its scales into ``s_into``), then the previous
        k-tile's ``done`` promoted under it and its stage released. The caller advances
        ``read`` and ``release`` (the DSL carries a loop's pipeline states only where the
        loop body itself calls their methods)."""
        self.loader.consumer_wait(pipe, read)
        self._issue_part(tiled_mma, into, tCrA, tCrB, read.index)
        tCcC, offsets, mScaleA, mScaleB, m, n, shape_mn = scale_args
        if cutlass.const_expr(self.cfg.scaling == "block"):  # else: the tile's, loaded once
            self._load_scales(s_into[0], s_into[1], tCcC, offsets, mScaleA, mScaleB, m, n, k,
                              shape_mn)
        cute.nvgpu.warpgroup.wait_group(1)
        self.loader.consumer_release(pipe, release)
        self._promote(acc, done, s_done[0], s_done[1], offsets)
