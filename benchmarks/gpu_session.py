"""One GPU session on the H200: checks first, then timings; everything lands under $OUT.

    source .gpu/prelude.sh && python benchmarks/gpu_session.py [--quick] [--only STEP ...]

Steps: ``hardware`` (the hardware-swizzle check -> hw_swizzle.json), ``tests`` (pytest -m gpu
in ``--shards`` child processes side by side (4; each ``pytest_gpu_<I>.txt``) with per-test
and total timeouts, so a deadlocked kernel cannot take the whole call), then any benchmark
steps (``gemm_bench``, ``gemm_tune``, ``gemm_headline``, ``gemm_widths``, ``attention_bench``,
``paper_l2``, ``tutorials``). A short
summary is printed last; logs and JSON go to $OUT (or ./gpu_out; at most 8 files return).

Session 23's calls (2 calls and a check, session 22's build; ``.gpu/run1.sh``, ``run2.sh``)::

    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16 --out $OUT   # 270 s
    python benchmarks/gemm_ab.py --dtype float16 --rounds 15 --name gemm_headline_s23_fp16 \
        --cells 4096x4096x4096 8192x8192x8192 --kernels ours ours:cluster=1x2 ours:cluster=2x1
    python benchmarks/gemm_sustained.py --dtype float16 --seconds 3 --rounds 2 \
        --name gemm_sustained_headline_fp16 --cells 4096x4096x4096 8192x8192x8192 \
        --kernels cublas ours ours:cluster=1x2                     # 45 s
    (the same three with bfloat16, then)
    python benchmarks/gemm_host_cost.py --pieces --name gemm_host_cost_pieces   # 60 s

Session 22's calls (5 calls, each started by a helper agent; an A/B of two builds: the old
``src/`` as ``git archive HEAD src`` unpacked into ``.gpu/snapA`` (it travels with ``.gpu``),
run with ``PYTHONPATH=$PWD/.gpu/snapA/src:$PYTHONPATH``, alternating with the working tree)::

    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k "programmatic or order_table"  # 12
    python benchmarks/gemm_ab.py --dtype float16 --rounds 2 --name gemm_prefetch_old_1 \
        --cells 4096x4096x4096 ... 512x32768x512 --kernels ours     # 20 s; old, new, old, new
    python benchmarks/gemm_sustained.py --seconds 2 --rounds 2 --name gemm_sustained_pdl \
        --cells 4096x4096x4096 256x6144x4096 2048x512x5120 512x4096x4096 \
        --kernels cublas ours ours:pdl=1                           # 60 s
    python benchmarks/gemm_ab.py --dtype D --rounds 3 --kernels ours ours:order_table=1 \
        --cells <the grid's 18 M = 256 cells>                      # 35 s a dtype
    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16 --out $OUT   # 350 s
    python benchmarks/gemm.py --dtypes bfloat16 --name gemm_bf16 --out $OUT  # 250 s
    python benchmarks/gemm.py --merge gemm_fp16.json gemm_bf16.json --out benchmarks/results \
        --name gemm                                                 # on the host

Session 21's calls (5 calls; ``.gpu/run1.sh`` .. ``run5.sh``, each started by a helper agent)::

    python benchmarks/gemm_ab.py --rounds 3 --dtype float16 (and bfloat16) --name \
        gemm_m512_multicast_ab_float16 --cells 512x4096x4096 512x4096x14336 \
        512x12288x5120 512x28672x8192 --kernels ours ours:cluster=1x1 \
        ours:tile=128x128,cluster=1x1 ours:tile=128x128,schedule=pingpong,cluster=1x1
    python benchmarks/gemm_ab.py --rounds 3 --name gemm_n1536_m512_ab_float16 --cells \
        512x1536x5120 --kernels ours ours:tile=64x96,cluster=2x1 ours:tile=64x96 \
        ours:tile=64x128,cluster=2x1            # and 256x1536x5120 with 64x64 (2, 4),
                                                # 64x96 split 2 alone and in (2, 1): 76 s all
    python -m pytest -m gpu tests/test_gemm_gpu.py -k "fitted_64 or reproducible or \
        small_outputs or automatic_multicast or default_order_table"   # 14 passed, 89 s
    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16                # 317 s
    python -m pytest -m gpu <the default's random shapes, N-major B, custom op, errors,
        fitted widths>                                                  # 11 passed, 61 s
    python benchmarks/gemm.py --dtypes bfloat16 --name gemm_bf16               # 300 s
    python benchmarks/gemm.py --merge gemm_fp16.json gemm_bf16.json            # no GPU
    python benchmarks/gemm_host_cost.py --attention 1x512x16x128 2x2048x16x128 \
        --name attention_host_cost                                             # 16 s
    python benchmarks/gpu_session.py --only tests --pytest tests/test_attention_gpu.py \
        --shards 4 --tests-budget 290                                  # 77 passed, 81 s
    python benchmarks/gpu_session.py --only tests --pytest tests/test_gemm_gpu.py \
        --shards 4 --tests-budget 300                                 # 135 passed, 188 s

Next: ``pytest -m gpu tests/test_gemm_gpu.py -k programmatic`` (``pdl=True``, written after
the calls), then the chain it is for: ``gemm_sustained.py --seconds 2 --rounds 2 --cells
4096x4096x4096 8192x8192x8192 256x6144x4096 2048x512x5120 --kernels cublas ours ours:pdl=1``
(phases are graphs of 20 calls, so each launch may overlap the previous kernel's tail);
M = 512 cells where a measured alternative to the (2, 1) multicast led in every round
(512x4096x4096, 512x12288x5120); the pingpong cells at M = 256 with K = 512 / 1536.

Session 20's calls (4 calls, about 1,750 s; ``.gpu/run1.sh`` .. ``run4.sh``, three of them
started by helper agents; ``CELLS``: 4096^3 and the grid's cells with M >= 256)::

    python benchmarks/gemm.py --cells 256x16384x512 256x32768x512 256x24576x1536 \
        --name gemm_pp_cells                                                   # 56 s
    python benchmarks/gemm_ab.py --rounds 3 --window-ms 25 (and 400) --name \
        gemm_window_ab_25 --cells 8192x8192x8192 4096x4096x4096 --kernels ours \
        ours:order_table=1                                                     # 12 / 20 s
    python benchmarks/gemm_sustained.py --seconds 2 --rounds 1 --grid-m 2048 8192 \
        --name gemm_sustained_grid --kernels cublas ours ours:order_table=1    # 274 s
    python benchmarks/gemm_host_cost.py --cells 256x6144x4096 4096x4096x4096  # 15 s
    python benchmarks/gpu_session.py --only tests --pytest tests/test_gemm_gpu.py \
        --shards 4 --tests-budget 330          # 131 passed, 2 failed (a test's buffer), 228 s
    python benchmarks/gemm_ab.py --rounds 2 --dtype float16 (and bfloat16) --name \
        gemm_default_ab_float16 --cells $CELLS --kernels ours                  # 47 / 51 s
    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k default_order_table  # 2 passed
    python benchmarks/gemm.py --dtypes float16 --name gemm_float16             # 340 s
    python benchmarks/gemm.py --dtypes bfloat16 --cells <4096^3 and the M = 512 / 2048 /
        8192 cells> --name gemm_bf16_table_cells
    python benchmarks/gemm.py --merge gemm.json <each of the grid files>       # no GPU

Next: the bf16 grid at M = 16 / 64 / 256 on this build (one file, one build); M = 256; the
attention launch through a pointer entry as the GEMM's (``ops.GemmLaunch``).

Session 19's calls (4 calls, 1,735 s; ``.gpu/run1.sh``, ``run2.sh`` with ``D=float16`` /
``bfloat16``)::

    python tutorials/10_where_ctas_land.py                                     # 11 s
    python benchmarks/gemm_ab.py --rounds 5 --name gemm_headline_sk_float16 --cells \
        8192x8192x8192 4096x4096x4096 --kernels ours ours:stream_k=1 ours:order_table=1 \
        ours:load=tma_multicast,cluster=2x1                                    # 17 s
    python benchmarks/gemm_sustained.py --seconds 4 --rounds 2 --name gemm_sustained_table \
        --cells 8192x8192x8192 4096x4096x4096 8192x14336x4096 --kernels cublas ours \
        ours:order_table=1 ours:load=tma_multicast,cluster=2x1 \
        ours:load=tma_multicast,cluster=2x1,order_table=1 ours:stream_k=1      # 164 s
    python benchmarks/gemm_kernel_times.py --name gemm_kernel_times_sk --shapes 4096x4096 \
        8192x8192 --ks 4096 8192 --kernels ours ours:stream_k=1 ours:order_table=1   # 19 s
    python benchmarks/gemm.py --dtypes float16 --name gemm_float16             # 381 s
    python benchmarks/gemm.py --dtypes bfloat16 --name gemm_bfloat16           # 348 s
    python benchmarks/gemm.py --merge gemm_float16.json gemm_bfloat16.json     # no GPU
    python -m pytest -v -m gpu tests/test_gemm_gpu.py    # 95 of 129 passed in 540 s

Next: the order table and (2, 1) at the cap over the grid's large cells (``gemm_sustained.py
--seconds 2 --rounds 1 --grid-m 2048 8192 --kernels cublas ours ours:order_table=1
ours:load=tma_multicast,cluster=2x1,order_table=1``), the same A/B with longer timing windows
(``gemm_ab.py --window-ms 400``), all GEMM GPU tests in one call, compiled by four pytest
processes side by side (``gpu_session.py --only tests --pytest tests/test_gemm_gpu.py
--shards 4 --tests-budget 500``; host-tested only so far).

Session 18's calls (7 calls, 1,624 s, many starts refused; ``.gpu/run1.sh`` .. ``run7.sh``;
``MC=load=tma_multicast,tile=64x128``)::

    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k multicasts_one_operand    # 10 s
    python benchmarks/gemm_profile.py --compare gemm_ncu_lrc_2048x512.json 2048x512x5120 \
        cublas ours ours:raster_swizzle=1 ours:$MC,cluster=2x1 ... ours:$MC,cluster=2x4,\
        multicast_a=0                                 # the coalescer's counters (lrc__*)
    python benchmarks/sm_placement.py --out $OUT      # where CTAs land; GPCs by clusters
    python benchmarks/gemm_profile.py --compare gemm_ncu_raster_<cell>.json <cell> cublas \
        ours ours:raster_swizzle=1 ... ours:raster_swizzle=8,raster_along_m=0   # 8 orders
    python benchmarks/gemm_kernel_times.py --name gemm_raster_gpc_k4096 --shapes 2048x6144 \
        2048x14336 8192x8192 --ks 4096 --kernels ours ours:raster_swizzle=1 ...
    python -m pytest -q -x -m gpu tests/test_gemm_gpu.py -k "order_table or placed"  # 34 s
    python benchmarks/gemm_kernel_times.py --name gemm_table_kernel_times --shapes 2048x512 \
        2048x6144 8192x8192 --ks 4096 --kernels ours ours:placed=0 ours:order_table=1
    python benchmarks/gemm_profile.py --compare gemm_ncu_table_8192x8192x4096.json \
        8192x8192x4096 cublas ours ours:order_table=1
    python benchmarks/gemm_ab.py --rounds 2 --name gemm_order_ab_float16 --cells <4096^3 and
        the 72 paper cells with M >= 256> --kernels ours ours:placed=0 ours:order_table=1
    python benchmarks/gemm_ab.py --rounds 2 --dtype bfloat16 --name gemm_placed_ab_bfloat16 \
        --cells <the same> --kernels ours ours:placed=0                          # 61 s

Next: the order table at the power cap (``gemm_sustained.py --kernels cublas ours
ours:order_table=1``), the full grid with the placed default (``gemm.py``, two calls).

Session 17's calls (6 calls, 1,414 s; ``.gpu/run1.sh`` .. ``run4.sh``; ``MC`` as below)::

    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k "clusters_of_four_and_eight or \
        wide_multicast"                                                         # 107 s
    python benchmarks/gemm_kernel_times.py --name gemm_kernel_times_narrow --shapes \
        256x1536 512x1536 2048x512 --ks 2560 5120 10240 --kernels ours \
        ours:tile=64x64,load=tma_multicast,cluster=2x4 ...                      # 30 s
    python benchmarks/gemm_profile.py --compare gemm_ncu_2048x512.json 2048x512x5120 \
        cublas ours ours:tile=64x128,$MC                                        # 40 s
    python benchmarks/gemm_profile.py --source OUT 2048x512x5120/tile=64x128,$MC
    python benchmarks/gemm_ab.py --rounds 2 --name gemm_mirror_m256_512 --cells <the 36
        M = 256 / 512 shapes> --kernels ours ours:mirror=cublas                 # 43 s
    python benchmarks/gemm_ab.py --rounds 2 --name gemm_mirror_m2048 --kernels ours \
        ours:mirror=cublas ours:$MC                                             # 90 s
    python benchmarks/gemm_kernel_times.py --name gemm_raster_k5120 --ks 5120 --shapes \
        <7 shapes> --kernels ours ours:raster_swizzle=1 --graph-rounds 2        # 30 s
    python benchmarks/gemm.py --cells 2048x5120x5120 2048x7680x5120 2048x5120x16384 \
        2048x5120x12288 --name gemm_wide_cells                                  # 93 s
    python benchmarks/gemm.py --merge gemm.json gemm_wide_cells.json            # no GPU

Next: why cuBLAS needs a third fewer L2 sectors than ours at the same tile and cluster
(PERF_NOTES, session 17).

Session 16's calls (6 calls, 1,630 s; ``MC=load=tma_multicast,cluster=2x1``)::

    python benchmarks/gemm_kernel_times.py --name gemm_kernel_times_m256 --shapes 256x6144 \
        256x5120 256x12288 2048x5120 --ks 1024 2048 4096 8192 --kernels ours \
        ours:fit=1,load=tma_multicast,cluster=1x2 ours:fit=1,$MC --reps 11     # 26 s
    python benchmarks/gemm_kernel_times.py --name gemm_kernel_times_stages <same shapes> \
        --kernels ours ours:epi_stages=2 ours:epi_n=16 ours:stages=4            # 30 s
    python benchmarks/cublas_kernels.py --dtypes float16 --name cublas_kernels_m2048 \
        --cells <the 18 paper cells at M = 2048>                                # 13 s
    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k "epilogue_buffers or out_dtypes \
        or new_tile_widths"                                                     # 192 s
    python benchmarks/gemm.py --cells 256x6144x4096 512x6144x4096 256x12288x5120 \
        2048x1536x5120 --name gemm_epi_cells                                    # 126 s
    python benchmarks/gemm.py --merge gemm.json gemm_epi_cells.json             # no GPU
    python benchmarks/gemm_kernel_times.py --name gemm_kernel_times_graph --shapes 4096x4096 \
        8192x8192 --ks 4096 --kernels ours ours:$MC --graph-rounds 2            # 25 s
    python benchmarks/gemm_host_cost.py --cells 256x6144x4096 4096x4096x4096 \
        --kernels ours ours:tile=128x96,cluster=1x1 ours:$MC                    # 25 s

Next: the cluster's extra cost in graph timing (Nsight Systems), 128 x 320 in (2, 1) at
M = 2048, N = 5120 / 7680, and the host cost of an eager call (PERF_NOTES, session 16).

Session 15's calls (4 calls, 1,599 s, as these lines in ignored ``.gpu/run*.sh`` scripts)::

    python benchmarks/gpu_session.py --only tests gemm_widths --tests-budget 150 \
        --pytest tests/test_gemm_gpu.py::test_new_tile_widths        # 274 s: WIDTH_ABS
    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k "automatic or new_tile_widths"
    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16     # 279 s
    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16_cells --cells <4 cells>
    python benchmarks/gemm.py --dtypes bfloat16 --name gemm_bf16    # 269 s
    python benchmarks/gemm.py --merge gemm_fp16.json gemm_fp16_cells.json gemm_bf16.json
    python benchmarks/gemm_ab.py --rounds 9 --dtype {float16,bfloat16} \
        --name gemm_headline_ab_{dtype} --cells 8192x8192x8192 4096x4096x4096 \
        --kernels ours ours:load=tma_multicast,cluster=2x1          # 18 s each

Session 15's next step, where a launch at M = 256 spends the ~10 us that K does not pay
for, was answered in session 16 by ``gemm_kernel_times.py``: it was the graph timing's own.

Session 14's call (``.gpu/run1.sh``; 1 call, 110 s; then no machine was lent)::

    python benchmarks/cublas_kernels.py                  # cuBLAS's kernel per cell, 12 s
    python benchmarks/gemm_ab.py --rounds 3 --name gemm_m256_wide_split --cells <12 cells at
        M = 256 / 512> --kernels ours ours:tile=128x256,split_k=2 ours:tile=128x192,split_k=2 \
        ours:tile=128x160,split_k=2 ours:load=tma_multicast,cluster=2x2,tile=128x128   # 42 s
    and, written then and run in session 15, the widths' A/Bs (``WIDTH_ABS``).

Session 13's calls (``.snapC/runN.sh`` carried with ``.gpu``; 7 calls, 1,693 s; NVIDIA's
example copied from a CUTLASS checkout into ``.snapC/nvidia/``, never into the repository)::

    python benchmarks/gemm_ab.py --nvidia-example NV --rounds 5 --name gemm_nvidia_peer \
        --cells 8192x8192x8192 4096x4096x4096 8192x6144x4096 8192x14336x4096 \
        2048x8192x8192 8192x5120x5120 --kernels ours ours:load=tma_multicast,cluster=2x1 \
        nvidia:tile=128x256,cluster=1x2 nvidia:tile=128x256,cluster=2x1 \
        nvidia:tile=128x256,cluster=1x1                                     # 25 s
    python benchmarks/gemm_sustained.py --nvidia-example NV --seconds 3 --rounds 2 \
        --cells 8192x8192x8192 8192x14336x4096 --kernels cublas ours \
        ours:load=tma_multicast,cluster=2x1 nvidia:tile=128x256,cluster=1x2   # 60 s
    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k random_shapes   # 50 passed in 240 s
        # (then its timeout; the 4 left, by node id, next call: 26 s)
    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16          # 242 s
    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k "not random_shapes"  # 37 passed, 184 s
    python benchmarks/gemm.py --dtypes bfloat16 --name gemm_bf16         # 227 s
    python benchmarks/gemm_sustained.py --seconds 3 --rounds 2 --cells 8192x8192x8192 \
        8192x14336x4096 2048x8192x8192 --kernels cublas ours \
        ours:load=tma_multicast,cluster=2x1 ours:load=tma_multicast,cluster=2x2   # 90 s
    python benchmarks/gemm_ab.py --nvidia-example NV --rounds 15 --dtype float16 \
        --cells 8192x8192x8192 4096x4096x4096 --kernels ours \
        ours:load=tma_multicast,cluster=2x1 nvidia:tile=128x256,cluster=1x2   # 12 s (+ bf16)
    python -m cutetma tour                                               # 56 s
    python benchmarks/gemm.py --dtypes float16 --cells <the 73 cells with M >= 256> \
        --name gemm_fp16_default_rounds    # the default in the rounds, 203 s

Session 13's next steps: the M = 256 / 512 rows (0.94 / 0.95x), e.g. a 256-row tile whose two
warpgroups share each B tile (session 14: its tile count and its loads per SM equal 128 x
256's, so it was not built; cuBLAS fits the width instead); 2048x5120x16384 (0.81x, split 2
where 128 x 160 unsplit measured 0.94x); the grid once with the reversed-order rounds
(``gemm.alternating_rounds``, still not run on the GPU).

Session 12's calls (``.snapC/runN.sh`` carried with ``.gpu``; 7 calls, about 1,715 s)::

    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k atomic             # 6 passed, 28 s
    python benchmarks/gemm_ab.py --cells 256x512x5120 512x512x5120 ... --rounds 5 \
        --kernels ours ours:tile=128x128,split_k=4 ours:tile=128x128,split_k=8,split_sum=atomic ...
    python benchmarks/gemm_profile.py --source OUT_DIR 256x512x5120/tile=128x128,split_k=4 \
        256x512x5120/tile=128x128,split_k=8,split_sum=atomic 512x1536x5120/tile=128x128,split_k=2
    python benchmarks/gemm_ab.py --cells ... --kernels ours \
        ours:tile=64x128,split_k=wave,split_sum=atomic ...      # small outputs
    python benchmarks/gemm_ab.py --cells ... --kernels ours \
        ours:load=tma_multicast,cluster=2x1,tile=128x128 ...    # M = 256 clusters
    python -m pytest -q -m gpu tests/test_gemm_gpu.py -k "automatic_choices or bitwise or k_cuts \
        or graph_survives or atomic or paper_shapes"                        # 27 passed, 139 s
    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16             # 214 s
    python benchmarks/gemm.py --dtypes bfloat16 --name gemm_bf16            # 196 s
    python -m pytest -q -m gpu 'tests/test_gemm_gpu.py::test_random_shapes[load=tma-float16]' ...
                                          # the default / cp_async / split_k=3 variants: 14 passed
    python benchmarks/gemm.py --merge gemm_fp16.json gemm_bf16.json   # on the host, no GPU
    python benchmarks/gemm_ab.py --cells 256x8192x8192 ... --kernels ours ours:cluster=1x1 \
        [--dtype bfloat16]                       # the automatic multicast, 17 cells, 40 s each
    python -m pytest -q -m gpu tests/test_gemm_gpu.py::test_automatic_multicast_at_small_m ...
                                                 # + paper shapes, default random: 10 passed
    python benchmarks/gemm.py --cells 256x6144x4096 512x6144x4096 ... --dtypes float16 \
        bfloat16 --name gemm_m256_512         # the grid's M = 256 / 512 rows, 315 s cold

Session 12's next steps (both ran in session 13): the whole grid with the automatic multicast
of 128 x 128 tiles at M = 129..512 (only
its M = 256 / 512 rows ran with it: ``gemm_m256_512.json``); the default
cluster at the power cap over more shapes and both dtypes
(``gemm_sustained.py --cells ... --kernels cublas ours ours:load=tma_multicast,cluster=2x1``),
where the 2 x 1 multicast has led in every sustained comparison so far while the short grids
rank it behind.

Session 11's calls (each command under a ``timeout``; ``.snapC/runN.sh`` carried with ``.gpu``)::

    python -m pytest -q -m gpu tests/test_attention_gpu.py -k exp2_fma      # 4 passed, 33 s
    python benchmarks/attention.py --head-dims 64 128 --variants tma \
        --custom f8=exp2_fma:8 f4=exp2_fma:4 f2=exp2_fma:2                  # 120 s
    python benchmarks/gemm_ab.py --kernels ours:tile=128x256 \
        ours:tile=128x256,store_under_mma=1 ... --rounds 3                  # 38 shapes, 60 s
    python benchmarks/attention.py --out DIR    # the full grid with its final rounds, 5.5 min
    python benchmarks/gemm_sustained.py --seconds 3 --rounds 2 --cells 8192x24576x1536 \
        8192x16384x512 2048x32768x512 8192x8192x8192 --kernels cublas ours ...   # 150 s
    python -m pytest -q -m gpu tests/test_gemm_gpu.py    # 78 tests, > 270 s on a cold start:
                                                         # split it over two calls (-k)
    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16             # 260 s

(Session 11's next steps, the bf16 grid and split_sum='atomic' on the GPU, ran in session 12.)

Session 10's calls (the old build as ``.snapA``, ``git archive HEAD src benchmarks``)::

    python benchmarks/attention_profile.py OUT.json --cells 64:8192 128:2048 256:4096
                                                   # + MUFU / FMA / ALU pipe counters, 30 s
    python benchmarks/gemm_sustained.py --seconds 6 --kernels cublas ours \
        ours:load=tma_multicast,cluster=2x1 ours:load=tma_multicast,cluster=1x2 \
        ours:tile=64x256,schedule=pingpong --name gemm_sustained_configs     # 140 s
    python benchmarks/attention_profile.py --source OUT_DIR :float16:4096:256 \
        :float16:8192:64 :float16:2048:128      # SASS executed counts by opcode, 40 s
    python benchmarks/gpu_session.py --only tests --pytest tests/test_attention_gpu.py \
        --test-timeout 100 --tests-budget 250   # 73 passed, 223 s
    python benchmarks/attention.py --variants tma tma_other_pv_wait --out DIR   # 84 s
    (cd .snapA && python benchmarks/attention.py --variants tma --out DIR)      # 53 s
    python benchmarks/attention.py --out DIR    # the full grid, every column, about 4 min

(Session 10's next step, FA4's exp2 on the FMA pipe, ran in session 11: slower.)

Session 9's calls (each command under a ``timeout``; a second build as ``.snapA`` beside the
working tree, as in session 8)::

    python benchmarks/gpu_session.py --only tests --pytest \
        tests/test_attention_gpu.py::test_cluster_multicast --test-timeout 120   # 6 passed
    python benchmarks/attention.py --variants tma tma_cluster2 tma_other_q --masks non-causal
    python benchmarks/attention.py --variants tma tma_cluster2 --custom hint=l2_hints:1 \
        c2hint=cluster:2,l2_hints:1 --masks non-causal          # 36 cells x 4 columns, 68 s
    python benchmarks/attention_profile.py OUT.json --cells 256:4096:cluster2 \
        64:8192:cluster2 128:2048:cluster2                      # ncu with L2 counters, 26 s
    python benchmarks/gpu_session.py --only tests --pytest tests/test_gemm_gpu.py \
        --test-timeout 120 --tests-budget 290                   # 70 tests, 200 s
    python benchmarks/gemm.py --cells 8192x14336x4096 ... --dtypes float16 \
        --mechanisms tma --name ab_B1                            # 7 cells, 15 s per build
    python benchmarks/gemm.py --dtypes float16 --name gemm_fp16  # 197 s; bf16 the same; then
    python benchmarks/gemm.py --merge gemm_fp16.json gemm_bf16.json   # on the host, no GPU
    python benchmarks/gemm_sustained.py --seconds 8             # 70 s
    python benchmarks/gpu_session.py --only tests --pytest tests/test_attention_gpu.py \
        --test-timeout 100 --tests-budget 250                   # 67 passed, 189 s

(Session 9's next step, which of our GEMM configurations spends least energy per FLOP at the
cap, ran in session 10: the 2 x 1 multicast cluster, above.)

Session 8's calls: an A/B of several builds in one call, each build a snapshot of ``src/``
(``git archive REV src``) carried beside ``.gpu`` as ``.snapA``, ``.snapB``, ...; the same
benchmark script runs from each (``cd .snapX && PYTHONPATH=$PWD/src:$PYTHONPATH``), and
every cell is a ratio to cuDNN timed beside it::

    python benchmarks/attention.py --variants tma --seqlens 1024 4096 16384 --out /tmp/r/X
    python benchmarks/attention.py --head-dims 256 --variants tma tma_overlap \
        --custom n80o=block_n:80,schedule:overlap --out /tmp/r/d256   # candidate configs
    python -m pytest -q -m gpu tests/test_attention_gpu.py        # 59 tests, about 2.3 min
    python benchmarks/attention.py --out /tmp/r/grid             # the full grid, 141 s

Session 7's GEMM calls (snapshot of the working tree carried with ``.gpu``; one tarball)::

    source .gpu/prelude.sh && python -m pytest -q -m gpu tests/test_gemm_gpu.py  # 67, ~3 min
    source .gpu/prelude.sh && python benchmarks/gemm_tune.py --out /tmp/r   # sweep + headline
    source .gpu/prelude.sh && python benchmarks/gemm.py --every --dtypes float16 \
        --tiles 128x160 128x192 --cells 512x5120x5120 ... --name gemm_narrow_every --out /tmp/r
    source .gpu/prelude.sh && python benchmarks/gemm.py --out /tmp/r   # about 8 minutes now
    # (the grid nears a call's 10-minute limit: --dtypes float16 --name gemm_fp16 and
    # --dtypes bfloat16 --name gemm_bf16 in two calls, then --merge them on the host)

Session 6's GEMM calls (same snapshot / tarball habit)::

    source .gpu/prelude.sh && python -m pytest -q -m gpu tests/test_gemm_gpu.py \
        --timeout=120 --timeout-method=thread          # 48 tests, about 3 minutes
    source .gpu/prelude.sh && python benchmarks/gemm.py --every --dtypes float16 \
        --cells 512x5120x5120 2048x5120x5120 --out /tmp/r --name gemm_split_every
    source .gpu/prelude.sh && python benchmarks/gemm.py --out /tmp/r   # about 5 minutes

Session 5's calls (each from a ``git archive HEAD`` snapshot carried with ``.gpu``; files
written under /tmp and returned as one tarball, since at most 8 files come back)::

    source .gpu/prelude.sh && python benchmarks/gpu_session.py --only tests \
        --test-timeout 90 --tests-budget 250 --pytest tests/test_attention_gpu.py
    source .gpu/prelude.sh && python benchmarks/attention.py --variants tma_serial \
        tma_overlap tma_pingpong --out /tmp/r/sched        # the schedule ablation, both dtypes
    source .gpu/prelude.sh && python benchmarks/attention_profile.py --source /tmp/r/sass overlap
    source .gpu/prelude.sh && python benchmarks/attention.py --out /tmp/r/grid
    source .gpu/prelude.sh && python benchmarks/attention_profile.py /tmp/r/attention_profile.json
    tar czf $OUT/r.tgz -C /tmp r

(57 GPU tests about 2.5 minutes; the 72-cell attention grid with its ablations under 3; the
GEMM grid (``--only gemm_bench``) about 8 minutes on its own since session 7; each ncu
profile under a minute). Results go to $OUT only: do not copy the snapshot's own results over
them. An A/B of two builds: ``benchmarks/attention.py --variants tma`` from each snapshot,
twice, interleaved.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT", "gpu_out"))
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gemm import PAPER_NK  # noqa: E402


def step_hardware(args):
    from cutetma import cli

    rc = cli.main(["swizzle", "hardware", "--out", str(OUT)] + (["--quick"] if args.quick else []))
    return f"hardware swizzle check rc={rc}"


def step_tests(args):
    """pytest -m gpu in child processes: a kernel that deadlocks then costs the per-test
    timeout (pytest-timeout's thread method ends the child with every stack dumped) or at
    most ``--tests-budget`` seconds, and the later steps still run. (In-process, a hung
    kernel blocks inside the CUDA driver where no Python timeout can interrupt it: that cost
    a whole 500-second call on 2026-11-30.) ``--shards N`` runs N children side by side,
    each every N-th test (``tests/conftest.py``'s ``--shard``): compiling the kernels, not
    running them, is most of a GPU test's time, and the machine has 16 cores."""
    targets = args.pytest or [str(ROOT / "tests")]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider",
           *targets]
    if args.quick:
        cmd.append("-x")
    try:
        import pytest_timeout  # noqa: F401

        cmd += [f"--timeout={args.test_timeout}", "--timeout-method=thread"]
    except ImportError:
        pass
    return run_shards(cmd, shards_allowed(args.shards), args.tests_budget, OUT)


def shards_allowed(requested: int) -> int:
    """``requested``, or 1 where the GPU admits one process at a time (compute mode
    Exclusive_Process, as nvidia-smi reports it: the other shards could not open it)."""
    import subprocess

    try:
        mode = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return requested
    return 1 if "exclusive" in mode.lower() else requested


def run_shards(cmd: list, shards: int, budget: float, out: Path) -> str:
    """Run pytest ``cmd`` as ``shards`` children at once (``--shard I/N`` each; one child
    without it), each writing its verbose log ``pytest_gpu_<I>.txt`` under ``out``;
    children still running after ``budget`` seconds are killed. Returns the counts of the
    logs' verdicts (a killed child's tests that never reported are ``not reached``)."""
    import re
    import signal
    import subprocess

    children = []
    for i in range(shards):
        log = out / f"pytest_gpu_{i}.txt"
        argv = list(cmd)
        if shards > 1:
            argv.append(f"--shard={i}/{shards}")
        with open(log, "w") as f:  # the child keeps its own handle
            children.append((log, subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})))  # a killed child's lines too
    deadline = time.time() + budget
    killed = 0
    for _, child in children:
        try:
            child.wait(timeout=max(deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            killed += 1
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    verdict = re.compile(r"::\S.* (PASSED|FAILED|ERROR|SKIPPED)\b")  # pytest -v's test lines
    for log, _ in children:
        for line in log.read_text(errors="replace").splitlines():
            found = verdict.search(line)
            if found:
                counts[found.group(1).lower()] += 1
                if found.group(1) in ("FAILED", "ERROR"):
                    print(line)
    summary = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    codes = sorted({child.returncode for _, child in children})
    tail = f"; {killed} of {shards} killed after {budget:.0f} s (not reached: the rest)" \
        if killed else ""
    return f"pytest -m gpu in {shards} shard(s): {summary or 'nothing ran'} (rc {codes}){tail}"


def step_gemm_bench(args):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gemm

    rc = gemm.main(["--out", str(OUT)] + (["--quick"] if args.quick else []))
    return f"gemm benchmark rc={rc}"


def step_gemm_tune(args):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gemm_tune

    return f"gemm tune rc={gemm_tune.main(['--out', str(OUT)])}"


def step_gemm_headline(args):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gemm_tune

    return f"gemm headline rc={gemm_tune.main(['--out', str(OUT), '--headline-only'])}"


# session 14's widths (steps of 16, and past 256), measured in session 15 (PERF_NOTES): the
# one- and two-wave widths at M = 256 / 512 (cuBLAS's own tiles there) with and without a
# cluster, at M = 2048 where three or four waves fit, and 128 x 320 / 384 (cuBLAS's tile at
# 8192^3) at the headline shapes, each against cuBLAS and the default in alternating rounds
WIDTH_ABS = [
    ("gemm_fitted_m256_512", 3, [(m, n, k) for m in (256, 512) for n, k in PAPER_NK if n > 1536],
     ["ours", "ours:fit=1", "ours:fit=2", "ours:fit=1,load=tma_multicast,cluster=1x2",
      "ours:fit=1,load=tma_multicast,cluster=2x1", "ours:fit=2,load=tma_multicast,cluster=1x2",
      "ours:tile=64x128,load=tma_multicast,cluster=2x1"]),
    ("gemm_fitted_m2048", 3, [(2048, 5120, 5120), (2048, 5120, 12288), (2048, 5120, 16384),
                              (2048, 4096, 14336)],
     ["ours", "ours:fit=3", "ours:fit=4", "ours:fit=3,load=tma_multicast,cluster=2x1"]),
    ("gemm_wide_tiles", 9, [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 14336, 4096),
                            (512, 10240, 8192)],
     ["ours", "ours:tile=128x320", "ours:tile=128x320,load=tma_multicast,cluster=2x1",
      "ours:tile=128x384,load=tma_multicast,cluster=2x1",
      "ours:load=tma_multicast,cluster=2x1"]),
]


def step_gemm_widths(args):
    """``WIDTH_ABS``: one interleaved A/B file each (``gemm_ab.py``), fp16."""
    import gemm_ab

    done = []
    for name, rounds, cells, kernels in WIDTH_ABS:
        cells = cells[:4] if args.quick else cells
        rc = gemm_ab.main(["--out", str(OUT), "--name", name, "--rounds", str(rounds),
                           "--cells", *("x".join(map(str, c)) for c in cells),
                           "--kernels", *kernels])
        done.append(f"{name} rc={rc}")
    return ", ".join(done)


def step_tutorials(args):
    """Run the GPU tutorials; each one's output is kept for its 'Measured on the H200' block."""
    import subprocess

    done, logs = [], []
    for script in sorted((ROOT / "tutorials").glob("0*.py")):
        try:
            proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                                  timeout=240, cwd=ROOT)
            logs.append(f"===== {script.name} rc={proc.returncode}\n{proc.stdout}{proc.stderr}")
            done.append(f"{script.stem[:2]}:rc={proc.returncode}")
        except subprocess.TimeoutExpired:
            done.append(f"{script.stem[:2]}:timeout")
    (OUT / "tutorials.log").write_text("\n".join(logs))  # one file: $OUT returns at most 8
    return " ".join(done)


def step_attention_bench(args):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import attention

    rc = attention.main(["--out", str(OUT)] + (["--quick"] if args.quick else []))
    return f"attention rc={rc}"


def step_paper_l2(args):
    """Figure 6 (b): L2 read sectors through Nsight Compute (benchmarks/paper/fig6_l2.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "paper"))
    import fig6_l2

    return f"fig6_l2 rc={fig6_l2.main(['--out', str(OUT)] + (['--quick'] if args.quick else []))}"


STEPS = {"hardware": step_hardware, "tests": step_tests, "gemm_bench": step_gemm_bench,
         "gemm_tune": step_gemm_tune, "gemm_headline": step_gemm_headline,
         "gemm_widths": step_gemm_widths,
         "tutorials": step_tutorials, "attention_bench": step_attention_bench,
         "paper_l2": step_paper_l2}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", default=list(STEPS))
    ap.add_argument("--pytest", nargs="*", default=None, help="pytest targets for the tests step")
    ap.add_argument("--test-timeout", type=int, default=120, help="seconds per GPU test")
    ap.add_argument("--tests-budget", type=int, default=400,
                    help="seconds for the whole tests step")
    ap.add_argument("--shards", type=int, default=4,
                    help="pytest processes side by side in the tests step")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    summary = []
    for name in args.only:
        t0 = time.time()
        print(f"\n===== {name}", flush=True)
        try:
            summary.append(f"{name}: {STEPS[name](args)} ({time.time() - t0:.0f} s)")
        except Exception as exc:  # keep going: one broken step must not cost the others
            import traceback

            traceback.print_exc()
            summary.append(f"{name}: FAILED {type(exc).__name__}: {exc} ({time.time() - t0:.0f} s)")
    print("\n===== summary")
    print("\n".join(summary))


if __name__ == "__main__":
    sys.exit(main())
