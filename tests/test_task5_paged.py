"""Task 5, beyond the course: the paged KV cache.

Without a GPU: the page allocator (task5.ops.PageAllocator), the layout's gather/scatter and
the float64 reference (task5.ops.reference_paged_attention), and the Python argument checks.
On a GPU (marked gpu): the check groups `python -m task5.test --paged-small --paged` runs
(task5/paged_checks.py).
"""

from __future__ import annotations

import pytest
import torch

from common.checks import assert_checks
from common.variants import Variant, reference_attention_variant
from task5.attention import PAGE_SIZES, check_paged_arguments
from task5.ops import (
    OutOfPagesError,
    PageAllocator,
    gather_pages,
    reference_paged_attention,
    scatter_to_pages,
)


def test_allocator_hands_out_pages_as_sequences_grow():
    alloc = PageAllocator(num_pages=10, page_size=16, batch=3, max_pages=4, device="cpu")
    assert alloc.free_pages == 10 and alloc.capacity == 64
    assert alloc.append(0, 5) == 0 and alloc.length(0) == 5 and len(alloc.pages(0)) == 1
    assert alloc.append(0, 11) == 5 and len(alloc.pages(0)) == 1     # 16 tokens: still one page
    assert alloc.append(0, 1) == 16 and len(alloc.pages(0)) == 2
    starts = alloc.append_many({1: 40, 2: 0})
    assert starts == {1: 0, 2: 0} and len(alloc.pages(1)) == 3 and alloc.pages(2) == []
    assert alloc.free_pages == 10 - 5
    assert alloc.seq_lens.tolist() == [17, 40, 0]
    table = alloc.block_table
    assert table[0, :2].tolist() == alloc.pages(0) and table[0, 2:].tolist() == [-1, -1]
    assert table[1, :3].tolist() == alloc.pages(1) and table[2].tolist() == [-1] * 4
    every = alloc.pages(0) + alloc.pages(1)
    assert len(set(every)) == len(every)                           # no page given twice


def test_allocator_frees_a_finished_sequence_and_reuses_its_pages():
    alloc = PageAllocator(num_pages=4, page_size=32, batch=2, max_pages=4, device="cpu")
    alloc.append(0, 100)                                           # 4 pages: all of them
    assert alloc.free_pages == 0
    with pytest.raises(OutOfPagesError, match="out of pages.*free finished sequences"):
        alloc.append(1, 1)
    assert alloc.length(1) == 0 and alloc.block_table[1].tolist() == [-1] * 4   # unchanged
    held = alloc.pages(0)
    alloc.free(0)
    assert alloc.free_pages == 4 and alloc.length(0) == 0
    assert alloc.block_table[0].tolist() == [-1] * 4 and alloc.seq_lens.tolist() == [0, 0]
    alloc.append(1, 33)
    assert set(alloc.pages(1)) <= set(held)


def test_allocator_failed_append_many_changes_nothing():
    alloc = PageAllocator(num_pages=3, page_size=16, batch=2, max_pages=3, device="cpu")
    alloc.append(0, 16)
    table, lengths, free = alloc.block_table.clone(), alloc.seq_lens.clone(), alloc.free_pages
    with pytest.raises(OutOfPagesError):
        alloc.append_many({0: 16, 1: 17})                          # needs 1 + 2 pages of 2
    assert torch.equal(alloc.block_table, table) and torch.equal(alloc.seq_lens, lengths)
    assert alloc.free_pages == free


def test_allocator_errors_are_sentences():
    with pytest.raises(ValueError, match="page_size must be one of"):
        PageAllocator(8, 24, 1, 1, device="cpu")
    with pytest.raises(ValueError, match="num_pages must be a positive int"):
        PageAllocator(0, 16, 1, 1, device="cpu")
    alloc = PageAllocator(8, 16, 2, 2, device="cpu")
    with pytest.raises(ValueError, match="longer table"):
        alloc.append(0, 33)
    with pytest.raises(ValueError, match=r"seq must be a sequence index in \[0, 2\)"):
        alloc.append(2, 1)


def test_shuffled_allocator_gives_non_adjacent_pages():
    alloc = PageAllocator(64, 16, 1, 64, device="cpu", shuffle=3)
    alloc.append(0, 64 * 16)
    pages = alloc.pages(0)
    assert sorted(pages) == list(range(64)) and pages != sorted(pages)


def _random_paged(batch=3, heads_kv=2, head_dim=8, page_size=16, max_pages=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([70, 1, 33][:batch], dtype=torch.int32)
    alloc = PageAllocator(batch * max_pages + 2, page_size, batch, max_pages, device="cpu",
                          shuffle=seed)
    alloc.append_many({b: int(n) for b, n in enumerate(lengths.tolist())})
    capacity = max_pages * page_size
    k = torch.randn(batch, heads_kv, capacity, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads_kv, capacity, head_dim, generator=gen, dtype=torch.float64)
    k_pages = torch.full((alloc.num_pages, page_size, heads_kv, head_dim), float("nan"),
                         dtype=torch.float64)
    v_pages = k_pages.clone()
    scatter_to_pages(k, k_pages, alloc.block_table)
    scatter_to_pages(v, v_pages, alloc.block_table)
    return alloc, lengths, k, v, k_pages, v_pages


def test_gather_pages_inverts_scatter_and_zeros_past_the_lengths():
    alloc, lengths, k, _, k_pages, _ = _random_paged()
    gathered = gather_pages(k_pages, alloc.block_table, lengths)
    assert gathered.shape == k.shape
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(gathered[b, :, :n], k[b, :, :n])
        assert not gathered[b, :, n:].any()                        # zeros, no NaN of unused pages
    # key t of sequence b is row t % page_size of page block_table[b, t // page_size]
    page = int(alloc.block_table[0, 2])
    assert torch.equal(k_pages[page, 5], k[0, :, 2 * 16 + 5])


@pytest.mark.parametrize("variant", [Variant(causal=True), Variant(causal=True, window=20),
                                     Variant(causal=False, softcap=5.0, scale=0.5)])
@pytest.mark.parametrize("seq_q", [1, 4])
def test_reference_is_the_contiguous_reference(variant, seq_q):
    alloc, lengths, k, v, k_pages, v_pages = _random_paged()
    q = torch.randn(3, 4, seq_q, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ours = reference_paged_attention(q, k_pages, v_pages, alloc.block_table, lengths, variant)
    from dataclasses import replace

    truth = reference_attention_variant(q, k, v, replace(variant, key_lengths=lengths))
    assert torch.isfinite(ours).all()                             # no NaN of an unused page
    assert torch.allclose(ours, truth, rtol=0, atol=1e-12)


def test_argument_checks_are_sentences():
    alloc = PageAllocator(8, 16, 2, 2, device="cpu")
    alloc.append_many({0: 20, 1: 3})
    q = torch.zeros(2, 4, 1, 64, dtype=torch.float16)
    pages = torch.zeros(8, 16, 2, 64, dtype=torch.float16)
    table, lengths = alloc.block_table, alloc.seq_lens

    def check(q=q, k=pages, v=pages, table=table, lengths=lengths, **kw):
        check_paged_arguments(q, k, v, table, lengths, **kw)

    check()                                                        # fine as it is
    with pytest.raises(ValueError, match="page_size"):
        check(k=pages[:, :8], v=pages[:, :8])
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        check(q=q.float(), k=pages.float(), v=pages.float())
    with pytest.raises(TypeError, match="int32"):
        check(table=table.long())
    with pytest.raises(ValueError, match="too short"):
        check(lengths=torch.tensor([20, 33], dtype=torch.int32))
    bad = table.clone()
    bad[1, 0] = 99
    with pytest.raises(ValueError, match="not a page"):
        check(table=bad)
    with pytest.raises(ValueError, match="query rows"):
        check(q=torch.zeros(2, 4, 17, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="head_dim"):
        check(q=torch.zeros(2, 4, 1, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="multiple"):
        check(q=torch.zeros(2, 3, 1, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        check(k=pages.transpose(0, 1).contiguous().transpose(0, 1))
    check(table=bad, validate=False)                               # device values: not read
    assert PAGE_SIZES == (16, 32, 64, 128, 256)


# --- GPU: the kernels ---------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("group", ["paged-small", "paged"])
def test_paged_groups(group):
    from task5.paged_checks import GROUPS

    checks, _ = GROUPS[group](None)
    assert_checks(checks)
