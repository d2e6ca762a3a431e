"""One loader interface over TMA and cp.async, so a kernel takes the mechanism as a parameter.

A stage of shared memory is handed from producer to consumer through an mbarrier. The two
mechanisms complete that barrier differently, and this is the *only* difference a kernel
sees (the precedent: one ``TileLoader`` with a TMA and a cp.async implementation)::

                  barrier  arm(bar, bytes)            load(src, dst, bar)         commit(bar)
                  count
    TMA           1        one thread: arrive +       one warp: cp.async.bulk     --
                           expect_tx(bytes)           .tensor ...complete_tx
    TMA, with a   1        same (the whole box lands  each CTA its 1/N slice,     --
    cluster mask           in every CTA)              .multicast::cluster
    cp.async      threads  --                         every thread: cp.async.cg   cp.async.mbarrier
                                                      16 B into the swizzled dst  .arrive.noinc

Consumers wait on the barrier's phase the same way in every case. The mechanism is named
``"tma"`` or ``"cp_async"`` (``LOAD_MECHANISMS``); multicast is not a mechanism but a
cluster: a TMA load given a CTA mask lands in every CTA of the mask.
"""

import dataclasses

from cutetma import dsl
from cutetma.copy import LOAD_MECHANISMS, tma
from cutetma.copy import cpasync as cpa

cutlass, cute = dsl.cutlass()


def check_mechanism(load: str) -> str:
    if load not in LOAD_MECHANISMS:
        raise ValueError(f"load={load!r}: choose one of {', '.join(LOAD_MECHANISMS)}")
    return load


class _Loader:
    """What TMA and cp.async share: the consumer side of a multistage pipeline.

    A pipeline is a ring of (full, empty) mbarrier pairs. The loader picks the DSL pipeline
    whose *producer* side matches the mechanism; consumers wait and release the same way in
    every kernel. Arrivals per stage::

                   full barrier                      empty barrier
        TMA        1 (arrive.expect_tx) + tx bytes   consumer warps x multicast partners
        cp.async   producer threads (noinc)          consumer warps (lane 0 of each)
    """

    mechanism = ""

    def make_pipeline(self, barriers, stages, producer_threads, consumer_warps, tx_bytes,
                      cta_layout_vmnk=None, mcast_size=1, mcast_mode_mn=(1, 1)):
        """``mcast_mode_mn``: which operands the cluster multicasts (the DSL's order: the one
        shared along N first), so a consumer releases a stage only to the CTAs whose
        multicasts fill it; ``mcast_size`` of them, itself included."""
        from cutlass import pipeline as pl

        if self.mechanism == "cp_async":
            return pl.PipelineCpAsync.create(
                barrier_storage=barriers, num_stages=stages,
                producer_group=pl.CooperativeGroup(pl.Agent.Thread, producer_threads),
                consumer_group=pl.CooperativeGroup(pl.Agent.Thread, consumer_warps),
                defer_sync=True,
            )
        return pl.PipelineTmaAsync.create(
            barrier_storage=barriers, num_stages=stages,
            producer_group=pl.CooperativeGroup(pl.Agent.Thread),
            consumer_group=pl.CooperativeGroup(pl.Agent.Thread, consumer_warps * mcast_size),
            tx_count=tx_bytes, cta_layout_vmnk=cta_layout_vmnk, mcast_mode_mn=mcast_mode_mn,
            defer_sync=True,
        )

    @cute.jit
    def consumer_wait(self, pipe, state):
        pipe.consumer_wait(state)
        if cutlass.const_expr(self.mechanism == "cp_async"):
            # cp.async writes through the generic proxy, WGMMA reads through the async one
            cute.arch.fence_view_async_shared()

    @cute.jit
    def consumer_release(self, pipe, state):
        if cutlass.const_expr(self.mechanism == "cp_async"):
            if cute.arch.lane_idx() == 0:
                pipe.consumer_release(state)
        else:  # PipelineTmaAsync signals its multicast partners from the low lanes itself
            pipe.consumer_release(state)


@dataclasses.dataclass(frozen=True)
class TmaLoader(_Loader):
    """TMA: one elected thread arms the barrier with the stage's bytes, one warp issues."""

    @property
    def mechanism(self) -> str:
        return "tma"

    def barrier_count(self, producer_threads: int) -> int:
        return 1

    def arm(self, bar, nbytes):
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(bar, nbytes)

    def load(self, atom, src, dst, bar, mcast_mask=None):
        """Issue one box (or this CTA's slice of it); with ``mcast_mask`` (a trace-time
        choice: None or a CTA mask) it lands in every CTA of the mask."""
        if mcast_mask is None:
            cute.copy(atom, src, dst, tma_bar_ptr=bar)
        else:
            cute.copy(atom, src, dst, tma_bar_ptr=bar, mcast_mask=mcast_mask)

    def commit(self, bar):
        pass


@dataclasses.dataclass(frozen=True)
class CpAsyncLoader(_Loader):
    """cp.async: every producer thread copies its 16-byte vectors, then arrives on the
    barrier when they land (``noinc``: the arrival was counted in the barrier's init)."""

    @property
    def mechanism(self) -> str:
        return "cp_async"

    def barrier_count(self, producer_threads: int) -> int:
        return producer_threads

    def arm(self, bar, nbytes):
        pass

    def load(self, tiled_copy, src, dst, bar=None, pred=None):
        cute.copy(tiled_copy, src, dst, pred=pred)

    def commit(self, bar):
        cute.arch.cp_async_mbarrier_arrive_noinc(bar)


def make_loader(load: str):
    """The loader of mechanism ``load`` (``"tma"`` or ``"cp_async"``)."""
    check_mechanism(load)
    return CpAsyncLoader() if load == "cp_async" else TmaLoader()


__all__ = ["TmaLoader", "CpAsyncLoader", "make_loader", "check_mechanism", "tma", "cpa"]
