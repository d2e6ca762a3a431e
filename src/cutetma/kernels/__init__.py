"""Kernels: one family per module, each a class over a frozen config (the compile key).

* ``gemm_sm90`` (``HopperGemm``) with ``gemm_config`` (``GemmConfig``): C = A B^T, TMA or
  cp.async producer, cluster multicast, split-K, persistent tile order.
* ``attention`` (``FlashAttentionSm90``, ``AttentionConfig``): the FlashAttention-3-style
  forward, TMA or cp.async producer.
* ``tile_copy``: the probes that dump what a TMA / cp.async load writes into shared memory.
* ``microbench``: the seed paper's microbenchmarks (latency, streaming, cluster broadcast)
  and the CTA placement probe.
* helpers: ``barriers`` (named-barrier ids), ``smem`` (the DSL's shared-memory capacity),
  ``build`` (compile for sm_90a against fake tensors, ptxas / nvdisasm: the PTX tests' tools).

Importing this package imports no DSL; each kernel module does when it is imported.
"""
