"""One loader interface over TMA and cp.async, so a kernel takes the mechanism as a parameter.

A stage of shared memory is handed from producer to consumer through an mbarrier. The two
mechanisms complete that barrier differently, and this is the *only* difference a kernel
sees (the precedent: one ``TileLoader`` with a TMA and a cp.async implementation)::

                  barrier  arm(bar, bytes)            load(src, dst, bar)         commit(bar)
                  count
    TMA           1        one thread: arrive +       one warp: cp.async.bulk     --
                           expect_tx(bytes)           .tensor ...complete_tx
    TMA multicast 1        same (the whole box lands  each CTA its 1/N slice,     --
                           in every CTA)              .multicast::cluster
    cp.async      threads  --                         every thread: cp.async.cg   cp.async.mbarrier
                                                      16 B into the swizzled dst  .arrive.noinc

Consumers wait on the barrier's phase the same way in every case.
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


@dataclasses.dataclass(frozen=True)
class TmaLoader:
    """TMA: one elected thread arms the barrier with the stage's bytes, one warp issues."""

    multicast: int = 1

    @property
    def mechanism(self) -> str:
        return "tma_multicast" if self.multicast > 1 else "tma"

    def barrier_count(self, producer_threads: int) -> int:
        return 1

    def arm(self, bar, nbytes):
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(bar, nbytes)

    def load(self, atom, src, dst, bar, mcast_mask=None):
        if self.multicast > 1:
            cute.copy(atom, src, dst, tma_bar_ptr=bar, mcast_mask=mcast_mask)
        else:
            cute.copy(atom, src, dst, tma_bar_ptr=bar)

    def commit(self, bar):
        pass


@dataclasses.dataclass(frozen=True)
class CpAsyncLoader:
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


def make_loader(load: str, multicast: int = 1):
    check_mechanism(load)
    if load == "cp_async":
        return CpAsyncLoader()
    return TmaLoader(multicast if load == "tma_multicast" else 1)


__all__ = ["TmaLoader", "CpAsyncLoader", "make_loader", "check_mechanism", "tma", "cpa"]
