"""Tuning: a problem -> the configuration to run, on the host only.

* ``gemm``      -- the H200 wave model and ``select_gemm_config``.
* ``attention`` -- the producer for paged K/V (``paged_load``).
* ``placement`` -- the L2 model of a tile order over the card's GPCs (``choose_raster``,
                   ``order_table``).

Pure functions of their arguments (the one exception: torch's deterministic mode, a host
flag, keeps split-K's sums ordered); no GPU, testable anywhere. Each default cites its
evidence in ``docs/design.md``.
"""

from cutetma.tuning.gemm import select_gemm_config

__all__ = ["select_gemm_config"]
