"""``GemmConfig``: the static choices of one compiled Hopper GEMM (``kernels.gemm_sm90``).

A frozen dataclass with no device code, so the tuning layer (``cutetma.tuning``) can build,
compare and cache configurations on any machine; its checks refuse, before anything is
compiled, a combination the kernel cannot run. Why each default is what it is:
``docs/design.md``.
"""

from __future__ import annotations

import dataclasses

from cutetma.kernels.smem import smem_capacity

WARPGROUP = 128



@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Static choices; hashable, so it keys the compile cache."""

    tile_m: int = 128
    tile_n: int = 256
    # a k-tile is one 128-byte swizzle span of a row: 64 16-bit elements, or 128 8-bit
    # ones (FP8); ``ab_bytes`` follows from it
    tile_k: int = 64
    cluster_m: int = 1
    cluster_n: int = 1
    load: str = "tma"  # "tma" or "cp_async"; clusters > 1 multicast (TMA only)
    stages: int | None = None  # None: as many as shared memory holds
    raster_swizzle: int = 8  # clusters per rasterization band (L2 reuse)
    # the band's direction: True walks a band of ``raster_swizzle`` clusters along N, then
    # the next M (consecutive clusters share A); False a band along M, then the next N
    raster_along_m: bool = True
    # epilogue sub-tile width; None: 32, or 16 where the tile's width is an odd multiple of 16
    epi_n: int | None = None
    # shared-memory buffers of epilogue sub-tiles (pingpong: half for each warpgroup); None:
    # 4, or 2 where that leaves room for one more mainloop stage (``epi_buffers``)
    epi_stages: int | None = None
    # "cooperative": both consumer warpgroups share each tile (64 rows each; a promoted
    # 256-row FP8 tile 128 each, ``waves``);
    # "pingpong": each owns whole tiles (64 or 128 rows, at most 128x128 or 64x256 for its
    # registers), alternately, so one's epilogue hides under
    # the other's WGMMAs (named barriers hand the tensor cores back and forth)
    schedule: str = "cooperative"
    # split-K: each output tile's K range is cut into this many slices, each a work unit of
    # its own (more units in flight when M x N has too few tiles). Every unit leaves its fp32
    # partial in a workspace slot and takes a ticket from its tile's counter; the last to
    # arrive sums all the partials and stores the tile (nobody waits, so no unit can
    # block another: see ``_split_k_finish``).
    split_k: int = 1
    # how split-K's partials meet. "ordered": each unit stores its fp32 partial in a slot of
    # its own and the last to arrive reads every slot and sums them in slot order (the same
    # bits whichever unit arrives last; the last unit reads split_k tiles through one SM).
    # "atomic": every unit adds its partial into the tile's one fp32 slot with vector
    # atomic adds (red.global.add.v4.f32, summed in L2), so the last unit reads one tile
    # whatever split_k is, and puts zeros back for the next launch; the fp32 sum's order,
    # and so its last bits, depend on the arrival order (docs/design.md, "Split sum")
    split_sum: str = "ordered"
    # EXPERIMENTAL (tutorial 09's comparison; slower than split-K on the H200, so
    # ``select_gemm_config`` never picks it: docs/perf-log.md). Stream-K: the last waves'
    # k-tiles are shared out evenly between all CTAs, so no SM idles in a partial last wave;
    # a tile cut between CTAs is finished by the CTA that has its first k-tile, after adding
    # the fp32 partials the others left in a workspace (``stream_k_unit``). Cooperative,
    # cluster (1, 1), no split-K. Owners spin on later CTAs, so the grid is one CTA per SM
    # and relies on all of them being resident; split-K never waits.
    stream_k: bool = False
    # cooperative, whole tiles (no split_k / stream_k), 16-bit C: the epilogue's stores run
    # under the next tile's WGMMAs. The accumulator is converted to C's type into registers
    # of its own (64 a thread for 128 x 256), freed for the next tile, and the held tile goes
    # out (stmatrix, TMA store) once that tile's first two k-tiles are issued, so the tensor
    # pipe is not idle while it does; the CTA's last tile is stored after its loop. Serial
    # (False): the tensor pipe waits for every tile's epilogue, which is a tenth of a tile's
    # time where K is 1536. ``cutetma.gemm`` turns it on wherever it applies
    # (docs/design.md, "Store under MMA")
    store_under_mma: bool = False
    # the tile order comes from a table (``mOrder``: work index -> cluster (m, n), packed
    # m | n << 16) that the host builds for the card's CTA placement
    # (``cutetma.tuning.placement.order_table``: each wave the default band's tiles, dealt
    # so that one GPC's CTAs get a compact block, whose loads the L2 coalescer merges).
    # Whole tiles only (no split-K or stream-K): the table lists clusters, not work units
    order_table: bool = False
    # programmatic dependent launch: the kernel is launched so that it may start while the
    # kernel before it in the stream is finishing; every thread waits for that kernel's
    # completion (griddepcontrol.wait) after the prologue (shared-memory barriers, the
    # cluster's handshake, the TMA descriptors' prefetch, none of which touches memory a
    # kernel writes) and before any global access, then lets the next such kernel start
    # (launch_dependents). A chain of them overlaps each launch and prologue with the
    # previous kernel's tail. Off by default (docs/design.md, "Programmatic dependent
    # launch (off)")
    pdl: bool = False
    # the FP8 scales (e4m3 A and B, ``cutetma.scaled_gemm``): "" none; "tensor": C =
    # scale_a scale_b (A B^T), two fp32 scalars; "row": C[m, n] = scale_a[m] scale_b[n]
    # (A B^T)[m, n], fp32 vectors of M and N (both on the fp32 accumulator before C's
    # conversion; split-K's partials are scaled alike, the sum is linear); "block":
    # DeepSeek-V3's, scale_a per (row, 128 of K), scale_b per (128 of N, 128 of K): each
    # k-tile's product is promoted into the accumulator with its own scales
    scaling: str = ""
    # FP8: each k-tile's product summed into the fp32 accumulator by ordinary fp32 adds (a
    # second accumulator, each k-tile's WGMMAs waited for). FP8 WGMMA's own accumulation is
    # narrower than fp32: over K = 1024 its error was 7x cuBLAS's (which promotes unless
    # use_fast_accum), invisible under a 16-bit C's rounding but not in fp32 C. Blockwise
    # scaling promotes anyway (docs/design.md, "FP8: promotion")
    promote: bool = False

    def __post_init__(self):
        if self.tile_m not in (64, 128, 256):
            raise ValueError(f"tile_m={self.tile_m}: 64 or 128 (256: a promoted FP8 tile)")
        if self.tile_m == 256 and not (
                (self.scaling == "block" or self.promote) and self.tile_n <= 128
                and not (self.store_under_mma or self.split_k > 1 or self.stream_k)):
            # two consumer warpgroups of 128 rows, each taking its rows as two 64-row waves
            # through ONE k-tile fragment: accumulator 128 + fragment 64 registers a thread.
            # An unpromoted tile has no fragment to reuse (128 x 256 holds as much), and a
            # held epilogue tile or split-K's views would spill past setmaxnreg's 232
            raise ValueError(f"tile_m=256 is a promoted FP8 tile (scaling='block' or "
                             f"promote) at most 128 wide, cooperative, whole K, serial "
                             f"epilogue: got tile_n={self.tile_n}, scaling={self.scaling!r}, "
                             f"promote={self.promote}")
        if self.tile_n % 16 or not 64 <= self.tile_n <= 384:
            # one m64nNk16 WGMMA per warpgroup and k-step spans the tile's N up to 256, two of
            # N / 2 beyond (``mma_n``). Widths between the powers of two exist to fit a
            # shape's tiles to the SMs' waves: 512 x 5120 is 80 tiles of 128 x 256 on 132 SMs
            # but 128 of 128 x 160, and 256 x 5120 is 128 tiles of 128 x 80; wider than 256,
            # each k-tile does more WGMMA work per byte loaded (128 x 320: cuBLAS's tile at
            # 8192^3, benchmarks/results/cublas_kernels.json). 384: 192 fp32 accumulators a
            # consumer thread and no spills; at 416 ptxas spills 2 KiB and serializes the
            # WGMMAs (C7512)
            raise ValueError(f"tile_n={self.tile_n}: a multiple of 16 from 64 to 384")
        if self.epi_n is None:  # the widest sub-tile that divides the tile: 32 or 16 columns
            object.__setattr__(self, "epi_n", 32 if self.tile_n % 32 == 0 else 16)
        if self.tile_n % self.epi_n:
            raise ValueError(f"epi_n={self.epi_n} must divide tile_n={self.tile_n}")
        if self.epi_stages is not None and (
                self.epi_stages < 1 or (self.schedule == "pingpong" and self.epi_stages % 2)):
            raise ValueError(f"epi_stages={self.epi_stages}: at least 1 (pingpong: an even "
                             "count, half for each warpgroup)")
        if self.tile_k not in (64, 128):
            raise ValueError("tile_k is one 128-byte swizzle span: 64 (16-bit A and B) or "
                             "128 (8-bit)")
        if self.scaling not in ("", "tensor", "row", "block"):
            raise ValueError(f"scaling={self.scaling!r}: '', 'tensor', 'row' or 'block'")
        if self.scaling == "block" and (128 % self.tile_n or self.stream_k
                                        or self.schedule != "cooperative"):
            raise ValueError("scaling='block': a tile within one 128-column scale block "
                             "(tile_n 64 or 128), cooperative, no stream-K")
        if self.promote and not self.scaling:
            raise ValueError("promote is FP8's: it needs scaling")
        if self.promote and (self.stream_k or self.schedule != "cooperative"):
            raise ValueError("promote: cooperative, no stream-K (as blockwise scaling)")
        if self.scaling and self.tile_k != 128:
            raise ValueError("scaling is the FP8 epilogue: it needs 8-bit A and B "
                             "(tile_k=128)")
        if (self.cluster_m not in (1, 2, 4) or self.cluster_n not in (1, 2, 4)
                or self.cluster_m * self.cluster_n > 8):
            # 8 CTAs is the portable cluster size; cuBLAS runs (2, 4) in our terms at
            # 256 x 1536 x 5120 (64 x 64 tiles: A shared by 4 CTAs, B by 2)
            raise ValueError(f"cluster ({self.cluster_m}, {self.cluster_n}): each of 1, 2 or "
                             "4, at most 8 CTAs")
        for rows, sharers, what in ((self.tile_m, self.a_sharers, "tile_m / cluster_n"),
                                    (self.mma_n, self.b_sharers, "tile_n / cluster_m")):
            # each sharer issues 1/sharers of the operand's box (past 256 columns B's box is
            # one WGMMA's width): whole 8-row swizzle atoms, or the slices would overlap
            if rows % (8 * sharers):
                raise ValueError(f"{what}: {rows} rows in {sharers} multicast slices are not "
                                 "whole 8-row swizzle atoms")
        if self.load not in ("tma", "cp_async"):
            raise ValueError(f"load={self.load!r}: 'tma' or 'cp_async'")
        if self.load == "cp_async" and self.cluster_m * self.cluster_n > 1:
            raise ValueError("cp.async cannot multicast: use cluster (1, 1) with load='cp_async'")
        if self.schedule not in ("cooperative", "pingpong"):
            raise ValueError(f"schedule={self.schedule!r}: 'cooperative' or 'pingpong'")
        if self.split_k < 1:
            raise ValueError(f"split_k={self.split_k}: at least 1")
        if self.split_sum not in ("ordered", "atomic"):
            raise ValueError(f"split_sum={self.split_sum!r}: 'ordered' or 'atomic'")
        if self.split_sum == "atomic" and self.split_k == 1:
            raise ValueError("split_sum='atomic' sums split-K's partials: it needs split_k > 1")
        if self.stream_k and (self.pingpong or self.multicast or self.split_k > 1):
            raise ValueError("stream_k runs the cooperative schedule with cluster (1, 1) and "
                             "no split_k")
        if self.order_table and (self.split_k > 1 or self.stream_k):
            raise ValueError("order_table orders whole tiles: no split_k or stream_k")
        if self.store_under_mma and (self.pingpong or self.split_k > 1 or self.stream_k):
            raise ValueError("store_under_mma is for whole cooperative tiles: pingpong hides "
                             "the epilogue already, and split_k / stream_k hand partials over")
        if self.tile_n > 256 and (self.store_under_mma or self.split_k > 1):
            # ptxas (CUDA 13.0) spills the held tile (268 bytes at 128 x 320) and split-K's
            # partial views (4 bytes): past 256 columns the accumulator alone takes
            # tile_n / 2 registers of each consumer thread
            raise ValueError(f"tile_n={self.tile_n} > 256 keeps the serial epilogue and K "
                             "whole: no store_under_mma, no split_k")
        if self.schedule == "pingpong" and self.tile_m * self.tile_n > 128 * 128:
            # one warpgroup holds the whole tile's fp32 accumulator: 128 x 256 would be 256
            # registers a thread, past setmaxnreg's 240
            raise ValueError(f"pingpong gives one warpgroup the whole {self.tile_m}x"
                             f"{self.tile_n} accumulator: at most 128x128 (or 64x256)")

    @property
    def pingpong(self) -> bool:
        return self.schedule == "pingpong"

    @property
    def consumer_groups(self) -> int:
        return 2 if self.pingpong else min(self.tile_m // 64, 2)

    @property
    def waves(self) -> int:
        """64-row WGMMA blocks a consumer warpgroup takes one after another through one
        k-tile fragment (a promoted 256-row tile: 2; otherwise 1)."""
        return 1 if self.pingpong else self.tile_m // 64 // self.consumer_groups

    @property
    def mma_groups(self) -> int:
        """Warpgroups that share one tile's WGMMAs (and so consume each stage)."""
        return 1 if self.pingpong else self.consumer_groups

    @property
    def threads(self) -> int:
        return WARPGROUP * (1 + self.consumer_groups)

    @property
    def mma_n(self) -> int:
        return mma_n(self.tile_n)

    @property
    def multicast(self) -> bool:
        return self.cluster_m * self.cluster_n > 1

    @property
    def a_sharers(self) -> int:
        """CTAs that receive each A box (the cluster's row, where A is multicast)."""
        return self.cluster_n

    @property
    def b_sharers(self) -> int:
        """CTAs that receive each B box (the cluster's column)."""
        return self.cluster_m

    @property
    def ab_bytes(self) -> int:
        """Bytes of an A or B element: 128 bytes per k-tile row."""
        return 128 // self.tile_k

    def stage_bytes(self, elem_bytes: int | None = None) -> int:
        """A and B of one k-tile (blockwise FP8: and the tile's rows' fp32 scale_a)."""
        return ((self.tile_m + self.tile_n) * self.tile_k * (elem_bytes or self.ab_bytes)
                + self.stage_scale_bytes)

    @property
    def stages_scale_a(self) -> bool:
        """Blockwise FP8: the stages carry scale_a (``stage_scale_bytes``)."""
        return self.scaling == "block"

    @property
    def scale_a_align(self) -> int:
        """The byte alignment scale_a's base is declared with: 16 where the stages load it
        (TMA boxes, 16-byte cp.async), else 4."""
        return 16 if self.stages_scale_a else 4

    @property
    def stage_scale_bytes(self) -> int:
        """Blockwise FP8: each stage carries its k-tile's scale_a of the tile's rows (fp32),
        loaded with A and B and counted by the same full barrier."""
        return self.tile_m * 4 if self.stages_scale_a else 0

    def epi_bytes(self, out_bytes: int, buffers: int | None = None) -> int:
        return self.tile_m * self.epi_n * out_bytes * (buffers or self.epi_buffers(out_bytes))

    @property
    def stages_column_scales(self) -> bool:
        """Row-wise FP8 scaling of a finished accumulator: the tile's column scales go
        through shared memory (two tiles' worth), not registers (``gemm_scales.py``)."""
        return self.scaling == "row" and not self.promote

    def scale_bytes(self) -> int:
        return 2 * self.tile_n * 4 if self.stages_column_scales else 0

    def smem_bytes(self, stages: int, out_bytes: int, buffers: int) -> int:
        """The kernel's shared memory (``HopperGemm``'s ``Storage``, field by field): the
        barriers and tickets, padded to the 1024-byte alignment of A's stages; A, B and C's
        buffers (each a multiple of 1024 bytes); then the FP8 scales (row-wise column
        scales, blockwise each stage's scale_a at 128-byte alignment, a word each where
        unused), the whole rounded up to its 1024-byte alignment."""
        def up(x, to):
            return -(-x // to) * to

        head = up(stages * 2 * 8 + 4 * 4, 1024)
        tail = max(self.scale_bytes(), 4)
        tail = up(tail, 128) + stages * self.stage_scale_bytes if self.stages_scale_a \
            else tail + 4
        ab = self.stage_bytes() - self.stage_scale_bytes  # the stage's A and B
        return head + stages * ab + self.epi_bytes(out_bytes, buffers) + up(tail, 1024)

    def _stages_fit(self, out_bytes: int, buffers: int) -> int:
        """The most stages whose ``smem_bytes`` fit in the CTA's shared memory."""
        stages = (smem_capacity() - self.epi_bytes(out_bytes, buffers)) // self.stage_bytes()
        while stages > 0 and self.smem_bytes(stages, out_bytes, buffers) > smem_capacity():
            stages -= 1
        return stages

    def epi_buffers(self, out_bytes: int = 2) -> int:
        """Epilogue sub-tile buffers: ``epi_stages`` if given; else 4, or 2 where the
        buffers freed make room for one more mainloop stage in a pipeline under
        ``DEEP_ENOUGH`` stages (cooperative 128 x 96 and 128 x 192 with 16-bit C: 6 -> 7
        and 4 -> 5; most widths with fp32 C). Where the operands stream from DRAM (M = 256
        / 512) a stage is worth more than two buffers (docs/design.md, "Stages and
        epilogue buffers")."""
        if self.epi_stages is not None:
            return self.epi_stages
        fits_4 = self._stages_fit(out_bytes, 4)
        if self.pingpong or fits_4 >= DEEP_ENOUGH:
            return 4
        if self.stages is not None:
            return 4 if self.stages <= fits_4 else 2
        return 2 if self._stages_fit(out_bytes, 2) > fits_4 else 4

    def num_stages(self, out_bytes: int = 2) -> int:
        """Pipeline depth: ``stages`` if given, else as many as shared memory holds."""
        fit = self._stages_fit(out_bytes, self.epi_buffers(out_bytes))
        stages = self.stages or fit
        if stages < 2:
            raise ValueError(f"{stages} stage(s): the consumer keeps one WGMMA group in flight "
                             f"while it waits for the next stage, so at least 2 are needed")
        if stages > fit:
            raise ValueError(f"{stages} stages of {self.stage_bytes() // 1024} KiB do not fit in "
                             f"shared memory beside the epilogue: at most {fit} for this tile")
        return stages


DEEP_ENOUGH = 8  # stages past which one more did not pay for halving the epilogue's buffers


def mma_n(tile_n: int) -> int:
    """The N of each WGMMA: the tile's width, or half of it past 256 (two per k-step)."""
    return tile_n // -(-tile_n // 256)
