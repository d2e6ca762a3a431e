"""``attention_with_kvcache(..., k=, v=)``: the step's new keys and values written into a paged
cache at each sequence's end (``kvcache.append_to_cache``), on CPU tensors: every new key
lands in its page and slot, nothing else in the pool changes, and bad arguments are refused
before anything is written. The GPU test of the whole call is in test_paged_gpu.py."""

import pytest


def pool(page_size, lengths, extra, h_kv=2, d=8, dtype=None, seed=0):
    """A shuffled pool with room for ``extra`` more keys a sequence, its table (-1 past each
    sequence's pages) and lengths."""
    import torch

    g = torch.Generator().manual_seed(seed)
    need = [(n + x + page_size - 1) // page_size for n, x in zip(lengths, extra, strict=True)]
    pages = sum(need) + 2
    order = torch.randperm(pages, generator=g)
    table = torch.full((len(lengths), max(need) + 1), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        table[i, :n] = order[used:used + n].int()
        used += n
    k = torch.randn(pages, page_size, h_kv, d, generator=g)
    v = torch.randn(pages, page_size, h_kv, d, generator=g)
    if dtype is not None:
        k, v = k.to(dtype), v.to(dtype)
    return k, v, table, torch.tensor(lengths, dtype=torch.int32)


def keys_of(cache, table, length, i):
    """Sequence i's first ``length`` keys, in order (the reference's gather)."""
    page_size = cache.shape[1]
    pages = table[i, :(length + page_size - 1) // page_size].long()
    return cache[pages].flatten(0, 1)[:length]


def as_bits(x):
    import torch

    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_append_puts_each_new_key_at_its_sequences_end(page_size):
    import torch

    from cutetma.kvcache import append_to_cache, new_key_counts

    lengths, s_new = [5, 0, 16, 33], 3
    k_cache, v_cache, table, lens = pool(page_size, lengths, [s_new] * 4)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    k_new, v_new = torch.randn(4, s_new, 2, 8), torch.randn(4, s_new, 2, 8)
    append_to_cache(k_cache, v_cache, k_new, v_new, lens, table)
    after = lens + new_key_counts(k_new, lens)
    assert after.tolist() == [n + s_new for n in lengths] and after.dtype == torch.int32
    for i, n in enumerate(lengths):
        for cache, old, new in ((k_cache, before_k, k_new), (v_cache, before_v, v_new)):
            assert torch.equal(keys_of(cache, table, n, i), keys_of(old, table, n, i))
            assert torch.equal(keys_of(cache, table, n + s_new, i)[n:], new[i])
    # nothing but the new slots changed
    changed = (k_cache != before_k).flatten(2).any(-1)
    assert int(changed.sum()) == 4 * s_new


def test_append_varlen_takes_each_sequences_rows():
    """(total_q, h_kv, d) new keys with the queries' offsets: sequence i's rows
    cu[i] .. cu[i + 1] - 1, one sequence with none."""
    import torch

    from cutetma.kvcache import append_to_cache, new_key_counts

    lengths, cu = [7, 2, 0], torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    counts = [4, 0, 5]
    k_cache, v_cache, table, lens = pool(4, lengths, counts)
    before = k_cache.clone()
    k_new, v_new = torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    append_to_cache(k_cache, v_cache, k_new, v_new, lens, table, cu)
    assert new_key_counts(k_new, lens, cu).tolist() == counts
    for i, (n, c) in enumerate(zip(lengths, counts, strict=True)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        assert torch.equal(keys_of(k_cache, table, n + c, i)[n:], k_new[rows])
        assert torch.equal(keys_of(v_cache, table, n + c, i)[n:], v_new[rows])
        assert torch.equal(keys_of(k_cache, table, n, i), keys_of(before, table, n, i))


def test_append_writes_fp8_as_bytes():
    import torch

    from cutetma.kvcache import append_to_cache

    fp8 = torch.float8_e4m3fn
    k_cache, v_cache, table, lens = pool(16, [20, 3], [2, 2], dtype=fp8)
    k_new = torch.randn(2, 2, 2, 8).to(fp8)
    v_new = torch.randn(2, 2, 2, 8).to(fp8)
    append_to_cache(k_cache, v_cache, k_new, v_new, lens, table)
    for i, n in enumerate([20, 3]):
        got = keys_of(as_bits(k_cache), table, n + 2, i)[n:]
        assert torch.equal(got, as_bits(k_new[i]))


def test_bad_new_keys_are_refused_before_anything_is_written():
    """k without v, a shape or dtype that is not the cache's, and (the kernel needs CUDA)
    a CPU call: each raises with the cache untouched."""
    import torch

    import cutetma

    k_cache, v_cache, table, lens = pool(16, [20, 3], [2, 2], d=64)
    before = k_cache.clone(), v_cache.clone()
    q = torch.randn(2, 2, 4, 64)
    new = torch.randn(2, 2, 2, 64)

    def call(**kw):
        return cutetma.attention_with_kvcache(q, k_cache, v_cache, lens, table, **kw)

    with pytest.raises(ValueError, match="k and v go together"):
        call(k=new)
    with pytest.raises(ValueError, match=r"must both be \(b, s_new, h_kv, d\)"):
        call(k=new, v=new[:, :1])
    with pytest.raises(ValueError, match=r"must both be \(b, s_new, h_kv, d\)"):
        call(k=new[:1], v=new[:1])
    with pytest.raises(TypeError, match="is torch.float16 on cpu, the cache torch.float32"):
        call(k=new.half(), v=new.half())
    with pytest.raises(ValueError, match=r"\(total_q, h_kv, d\)"):
        cutetma.attention_with_kvcache(q[0], k_cache, v_cache, lens, table, k=new, v=new,
                                       cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="CUDA"):
        call(k=new, v=new)
    # check_contents reads the lengths after the append: 20 + 30 keys are past the table's
    # 3 pages of 16
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 50: outside \[0, 48\]"):
        cutetma.attention_with_kvcache(q, k_cache, v_cache, lens, table, check_contents=True,
                                       k=torch.randn(2, 30, 2, 64), v=torch.randn(2, 30, 2, 64))
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_append_to_cache_alone_checks_what_it_copies():
    """``append_to_cache`` called by itself (not through the attention call, whose checks
    come first): new keys of another dtype, head count, head dim or batch, or tables that
    are not int32, are refused before anything is written (the kernel copies bytes, so a
    wrong dtype would write past the slot)."""
    import torch

    from cutetma.kvcache import append_to_cache

    k_cache, v_cache, table, lens = pool(16, [20, 3], [2, 2], d=64)
    before = k_cache.clone()
    new = torch.randn(2, 1, 2, 64)
    for k, v, match in ((new.double(), new.double(), "is torch.float64"),
                        (new[..., :32], new[..., :32], r"\(h_kv, d\) = \(2, 64\)"),
                        (new, new[:, :, :1], "one shape"),
                        (new[:1], new[:1], "k has 1 sequences"),
                        (new[0], new[0], r"must be \(b, s_new, h_kv, d\)")):
        with pytest.raises((ValueError, TypeError), match=match):
            append_to_cache(k_cache, v_cache, k, v, lens, table)
    with pytest.raises(ValueError, match="page_table must be a 2-D int32"):
        append_to_cache(k_cache, v_cache, new, new, lens, table.long())
    assert torch.equal(k_cache, before)
