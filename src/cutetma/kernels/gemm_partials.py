"""Split-K's and stream-K's hand-over of fp32 partial tiles, a mixin of ``HopperGemm``
(``gemm_sm90.py``): a unit stores its accumulator in a workspace slot (16-byte vectors in
the MMA's thread order) or adds it into one with vector atomics; the finishing unit sums
the slots (slot order) or takes the atomic sum and zeroes it; stream-K's owners wait on
their peers' flags. Nobody waits in split-K (tickets), so no CTA order can stall it.
"""

from __future__ import annotations

from cutetma import dsl

cutlass, cute = dsl.cutlass()


class PartialSums:
    @staticmethod
    def _partial_views(acc, mPartials, tid, threads):
        """The accumulator and the workspace's tile slots as matching views: value ``4 i + e``
        of thread ``tid`` at offset ``4 (i threads + tid) + e`` of a slot, so each thread
        moves 16 bytes at a time, a warp whole 512-byte runs, and the thread ``tid`` of any
        CTA holds the same tile positions. ``slots[(None, i, slot)]``: 4 values."""
        n4 = cute.size(acc) // 4
        tile = cute.size(acc) * threads
        regs = cute.make_tensor(acc.iterator, cute.make_layout((4, n4)))
        slots = cute.make_tensor(mPartials.iterator, cute.make_layout(
            (4, threads, n4, cute.size(mPartials) // tile), stride=(1, 4, 4 * threads, tile)))
        return regs, slots[(None, tid, None, None)]

    @cute.jit
    def _store_partial(self, acc, mPartials, slot, tid, threads):
        regs, slots = self._partial_views(acc, mPartials, tid, threads)
        for i in cutlass.range_constexpr(cute.size(regs, mode=[1])):
            cute.autovec_copy(regs[(None, i)], slots[(None, i, slot)])

    @cute.jit
    def _add_partial(self, acc, mPartials, slot, tid, threads):
        regs, slots = self._partial_views(acc, mPartials, tid, threads)
        part = cute.make_rmem_tensor((4,), cutlass.Float32)
        for i in cutlass.range_constexpr(cute.size(regs, mode=[1])):
            cute.autovec_copy(slots[(None, i, slot)], part)
            for e in cutlass.range_constexpr(4):
                regs[e, i] = regs[e, i] + part[e]

    @cute.jit
    def _reduce_partial(self, acc, mPartials, slot, tid, threads):
        """``split_sum="atomic"``: the accumulator added into workspace slot ``slot``, 16 bytes
        per atomic (red.global.add.v4.f32: L2 does the adds, nothing comes back)."""
        regs, slots = self._partial_views(acc, mPartials, tid, threads)
        for i in cutlass.range_constexpr(cute.size(regs, mode=[1])):
            cute.arch.red(slots[(None, i, slot)].iterator, regs[(None, i)].load().ir_value(),
                          op="add", dtype="f32", sem="relaxed", scope="gpu")

    @cute.jit
    def _take_sum(self, acc, mPartials, slot, tid, threads):
        """``split_sum="atomic"``, the tile's last unit: the accumulator becomes the slot's sum
        of every unit's partial, and the slot goes back to zero for the next launch."""
        regs, slots = self._partial_views(acc, mPartials, tid, threads)
        zeros = cute.make_rmem_tensor((4,), cutlass.Float32)
        zeros.fill(0.0)
        for i in cutlass.range_constexpr(cute.size(regs, mode=[1])):
            cute.autovec_copy(slots[(None, i, slot)], regs[(None, i)])
            cute.autovec_copy(zeros, slots[(None, i, slot)])

    @cute.jit
    def _sum_partials(self, acc, mPartials, first_slot, tid, threads):
        """The accumulator becomes the sum of the tile's ``split_k`` slots in slot order, its
        own slot included. No branch on which slice this is: every load sits in one basic
        block, so ptxas can keep them in flight together (skipping the own slot took a
        branch per slice, and each slice's loads became a round trip of their own), and the
        sum is the same whichever slice arrived last (bitwise reproducible)."""
        regs, slots = self._partial_views(acc, mPartials, tid, threads)
        part = cute.make_rmem_tensor((4,), cutlass.Float32)
        for i in cutlass.range_constexpr(cute.size(regs, mode=[1])):
            for s in cutlass.range_constexpr(self.cfg.split_k):
                cute.autovec_copy(slots[(None, i, first_slot + s)], part)
                for e in cutlass.range_constexpr(4):
                    if cutlass.const_expr(s == 0):
                        regs[e, i] = part[e]
                    else:
                        regs[e, i] = regs[e, i] + part[e]

    @cute.jit
    def _leave_partial(self, acc, mPartials, mFlags, tid, threads, sync):
        """A stream-K writer: the accumulator into workspace slot ``blockIdx.x``, then the
        slot's flag (release, after every consumer thread's stores)."""
        cta = cute.arch.block_idx()[0]
        self._store_partial(acc, mPartials, cta, tid, threads)
        sync.arrive_and_wait()
        if tid == 0:
            cute.arch.fence_acq_rel_gpu()
            cute.arch.store(mFlags.iterator + cta, cutlass.Int32(1), sem="release", scope="gpu")

    @cute.jit
    def _take_partial(self, acc, mPartials, mFlags, peer, tid, threads, sync):
        """A stream-K owner: wait for ``peer``'s flag (acquire), reset it for the next
        launch, and add the peer's partial into the accumulator."""
        if tid == 0:
            flag = cute.arch.load(mFlags.iterator + peer, cutlass.Int32, sem="acquire",
                                  scope="gpu")
            while flag == 0:
                flag = cute.arch.load(mFlags.iterator + peer, cutlass.Int32, sem="acquire",
                                      scope="gpu")
            mFlags[peer] = cutlass.Int32(0)
        sync.arrive_and_wait()
        self._add_partial(acc, mPartials, peer, tid, threads)

    @cute.jit
    def _split_k_finish(self, acc, mPartials, mCounters, sTickets, tile, split, team, tid,
                        threads, sync):
        """Split-K after a unit's mainloop: store the partial in slot ``tile * split_k +
        split`` (``split_sum="atomic"``: add it into slot ``tile``), then (one thread, after
        everyone's stores, acq_rel) take a ticket from the tile's counter. The unit with the
        last ticket sums every slice's partial (its own included, in slot order:
        ``_sum_partials``; atomic: reads the one slot and zeroes it, ``_take_sum``) and
        returns True (it stores the tile), resetting the counter for the next launch; the
        others return False. No unit waits for another, so no order of CTAs on the SMs (a
        later wave, another kernel beside this one) can stall it."""
        slices = self.cfg.split_k
        atomic = self.cfg.split_sum == "atomic"
        if cutlass.const_expr(atomic):
            self._reduce_partial(acc, mPartials, tile, tid, threads)
        else:
            self._store_partial(acc, mPartials, tile * slices + split, tid, threads)
        sync.arrive_and_wait()
        if tid == 0:
            cute.arch.fence_acq_rel_gpu()
            ticket = cute.arch.atomic_add(mCounters.iterator + tile, cutlass.Int32(1),
                                          sem="acq_rel", scope="gpu")
            if ticket == slices - 1:
                mCounters[tile] = cutlass.Int32(0)
            sTickets[team] = ticket
        sync.arrive_and_wait()
        last = sTickets[team] == slices - 1
        if last:
            if cutlass.const_expr(atomic):
                self._take_sum(acc, mPartials, tile, tid, threads)
            else:
                self._sum_partials(acc, mPartials, tile * slices, tid, threads)
        return last
