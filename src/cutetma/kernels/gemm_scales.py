"""FP8's scales in the GEMM consumers, a mixin of ``HopperGemm`` (``gemm_sm90.py``).

Per-tensor and row-wise scales dequantise the finished fp32 accumulator once
(``_load_scales`` under the tile's last WGMMAs, then ``_scale``). Blockwise scales
(DeepSeek-V3's) differ per 128 of K, i.e. per k-tile, and a promoted fp32 C
(``GemmConfig.promote``) sums each k-tile in full fp32, so both take every k-tile's product
in a fragment of its own and add it into the accumulator once it is complete
(``HopperGemm.consume``)::

    k-tile k      wait full -> WGMMA into part -> k's scales (blockwise: scale_a from the
                  stage, which the producer filled with A and B; scale_b loaded a k-tile
                  ahead) -> wait_group(0) -> release k's stage -> acc += part x scales

The accumulator and the fragment take 128 fp32 registers a thread at 128 x 128 (two
consumer warpgroups, 64 rows each). A 256 x 128 tile (fp32 C and blockwise, where the model
chose 128 x 256) gives each warpgroup 128 rows, taken as two 64-row waves through the one
fragment (DeepGEMM's shape; accumulator 128 + fragment 64 registers): a stage of 1.5x a
128 x 128 tile's bytes feeds twice its WGMMAs::

    k-tile k      wait full -> [WGMMA rows 0..63 into part -> (blockwise: k's scales)
                  -> wait_group(0) -> acc[wave 0] += part x scales] -> [the same for rows
                  64..127, releasing k's stage before its promotion]

Alternating two fragments, so that k - 1's promotion ran under k's WGMMAs, measured slower
(``docs/perf-log.md``).
"""

from __future__ import annotations

from cutetma import dsl

cutlass, cute = dsl.cutlass()


class Fp8Scales:
    @cute.jit
    def _load_scales(self, sa, sb, tCcC, offsets, mScaleA, mScaleB, m, n, shape_mn,
                     rows: cutlass.Constexpr = True, cols: cutlass.Constexpr = True):
        """Per tensor and row-wise: fill ``sa`` (``rows``) and ``sb`` (``cols``) with the
        scales of this thread's values in tile (m, n): scale_a of each distinct row and
        scale_b of each distinct column, one of each for "tensor". Rows and columns past M
        or N take 0 (their values are never stored). Blockwise scales come from the stage
        (``_stage_block_scales``) and a k-tile ahead (``HopperGemm.consume``)."""
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
                        sa[j] = mScaleA[row0 + offsets.rows[j]]
            if cutlass.const_expr(cols):
                for j in cutlass.range_constexpr(len(offsets.cols)):
                    sb[j] = cutlass.Float32(0.0)
                    if col0 + offsets.cols[j] < shape_mn[1]:
                        sb[j] = mScaleB[col0 + offsets.cols[j]]

    @cute.jit
    def _stage_block_scales(self, sa, tCcC, offsets, sS, stage):
        """Blockwise: ``sa`` from the stage's scale_a (the producer loaded the k-tile's
        rows with A and B)."""
        row0 = tCcC[0][0]
        for j in cutlass.range_constexpr(len(offsets.rows)):
            sa[j] = sS[row0 + offsets.rows[j], 0, stage]

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
    def _stage_column_scales(self, sScales, mScaleB, n, buf, tid, threads, n_size):
        """Row-wise, before a tile's last wait: its ``tile_n`` column scales into column
        ``buf`` of ``sScales`` (tile_n, 2), a coalesced load and store per thread (columns
        past N take 0). Two buffers by tile parity: a thread writes tile t + 2's only after
        the barrier of tile t + 1, which every thread passes only after reading tile t's."""
        tile_n = self.cfg.tile_n
        for c in cutlass.range_constexpr((tile_n + threads - 1) // threads):
            col = c * threads + tid
            if col < tile_n:
                value = cutlass.Float32(0.0)
                if n * tile_n + col < n_size:
                    value = mScaleB[n * tile_n + col]
                sScales[col, buf] = value

    @cute.jit
    def _scale_with_staged_columns(self, acc, sa, sScales, buf, tCcC, offsets):
        """Row-wise dequantisation with the column scales from shared memory
        (``_stage_column_scales``), one column at a time: a 128 x 256 tile's 64 column scales
        a thread held in registers beside its 128 accumulator values spilled."""
        col0 = tCcC[0][1]
        for j in cutlass.range_constexpr(len(offsets.cols)):
            b = sScales[col0 + offsets.cols[j], buf]
            for i in cutlass.range_constexpr(len(offsets.values_of[j])):
                v = offsets.values_of[j][i]
                acc[v] = acc[v] * (sa[offsets.row_of[v]] * b)

    @cute.jit
    def _promote(self, acc, part, sa, sb, offsets, wave: cutlass.Constexpr = 0):
        """acc += a k-tile's product ``part`` times its scales, in fp32. Blockwise
        (DeepSeek-V3's): scale_a of the row's 128 of K times scale_b of the tile's 128 x 128
        block of B. A promoted fp32 C: per tensor the product of the two scalars, row-wise
        the row's scale_a only (its 32 column scales would stay live through the mainloop
        and spill; they meet the finished tile, ``_scale(rows=False)``). A bare sum would let
        ptxas fold the first promotion into a copy of the fragment, whose registers the next
        WGMMA then overwrites in flight: it serializes the WGMMAs (C7514). ``part`` holds one
        64-row block of the warpgroup's rows, ``wave`` (the accumulator's M mode; N is one
        WGMMA wide), so its value v is the accumulator's value ``wave * size(part) + v``."""
        row_only = self.cfg.scaling == "row"
        size = cute.size(part)
        for v in cutlass.range_constexpr(size):
            i = wave * size + v
            acc[i] = acc[i] + part[v] * self._value_scale(sa, sb, offsets, i,
                                                          cols=not row_only)

    @cute.jit
    def _issue_part(self, tiled_mma, part, tCrA, tCrB, stage, wave: cutlass.Constexpr = 0):
        """One k-tile's WGMMAs for the warpgroup's 64-row block ``wave`` into ``part`` alone,
        as one committed group: the caller clears ``tiled_mma``'s ACCUMULATE field, so the
        first k-step overwrites the fragment. A's M mode is divided into blocks of one, so
        block ``wave`` keeps its rank: (V, 1) x (V, N) -> (V, 1, N) per k-step."""
        cute.nvgpu.warpgroup.fence()
        blocks_a = cute.logical_divide(tCrA, (None, 1, None, None))
        for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.gemm(tiled_mma, part, blocks_a[(None, (None, wave), kb, stage)],
                      tCrB[(None, None, kb, stage)], part)
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        cute.nvgpu.warpgroup.commit_group()
