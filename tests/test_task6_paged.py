"""Task 6's generate on a paged KV cache (task5's decode_paged.cu, ops.PageAllocator).

Without a GPU: generate_paged on the PyTorch twins of the paged operations (task5.ops
paged_rope_append, paged_attention), in float64, gives each prompt the tokens generate()
gives it alone on the contiguous cache, and frees each sequence's pages when it stops. On a
GPU (marked gpu): the same on our kernels in bf16, as CUDA-graph replays and eagerly.
"""

from __future__ import annotations

import pytest
import torch

from task6.generate import generate, generate_paged
from task6.model import customModel


def _model(attention="torch", dtype=torch.float64, device="cpu", kv_heads=2):
    return customModel(128, 8, 2, 97, max_seq_len=128, attention=attention, dtype=dtype,
                       device=device, seed=3, style="llama", num_kv_heads=kv_heads)


def _prompts(device, lengths=(5, 23, 1, 40)):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 97, (n,), generator=gen).to(device) for n in lengths]


@pytest.mark.parametrize("page_size", [16, 32])
def test_paged_generate_equals_each_prompt_alone(page_size):
    model = _model()
    prompts, counts = _prompts("cpu"), [7, 3, 12, 1]
    got = generate_paged(model, prompts, counts, page_size=page_size, shuffle=1)
    for prompt, n, tokens in zip(prompts, counts, got, strict=True):
        alone = generate(model, prompt[None], n)[0]
        assert torch.equal(tokens, alone)


def test_paged_generate_frees_pages_as_sequences_stop():
    model = _model()
    prompts, counts = _prompts("cpu", (20, 3)), [2, 30]
    cache = model.allocate_paged_kv_cache(2, num_pages=3, page_size=16)
    # 3 pages: 2 for the first sequence (21 tokens) and 1 for the second while the first runs;
    # the second (32 tokens) then grows into a page the first gave back when it stopped.
    got = generate_paged(model, prompts, counts, cache=cache)
    assert [t.numel() for t in got] == counts
    assert cache.allocator.free_pages == 3 and cache.allocator.seq_lens.tolist() == [0, 0]
    assert torch.equal(got[1], generate(model, prompts[1][None], 30)[0])


def test_paged_generate_out_of_pages_is_a_sentence():
    from task5.ops import OutOfPagesError

    model = _model()
    cache = model.allocate_paged_kv_cache(2, num_pages=2, page_size=16)
    with pytest.raises(OutOfPagesError, match="out of pages"):
        generate_paged(model, _prompts("cpu", (20, 20)), 5, cache=cache)


def _same_greedy_tokens(got: torch.Tensor, model, prompt, n) -> None:
    """got equals generate()'s tokens for prompt alone, up to the first near-tie: where the
    contiguous cache's top two logits are within bf16 rounding of each other, either choice is
    right, and the sequences part there (later tokens follow from different inputs)."""
    want, logits = generate(model, prompt[None], n, return_logits=True)
    differ = (got != want[0]).nonzero()
    if differ.numel():
        first = int(differ[0])
        top2 = logits[0, first].float().topk(2).values
        assert float(top2[0] - top2[1]) < 0.05, f"token {first} differs without a near-tie"


@pytest.mark.gpu
@pytest.mark.parametrize("use_cuda_graph", [True, False])
def test_paged_generate_on_the_kernels_equals_the_contiguous_cache(use_cuda_graph):
    """bf16 on our kernels: head_dim 64, 4 query heads per KV head, pages shuffled; the
    graph's block table and lengths change between replays as pages are added and freed."""
    model = customModel(512, 8, 2, 97, max_seq_len=128, attention="custom", dtype=torch.bfloat16,
                        device="cuda", seed=3, style="llama", num_kv_heads=2)
    prompts, counts = _prompts("cuda"), [9, 4, 40, 2]
    got = generate_paged(model, prompts, counts, page_size=16, shuffle=2,
                         use_cuda_graph=use_cuda_graph)
    for prompt, n, tokens in zip(prompts, counts, got, strict=True):
        assert tokens.shape == (n,)
        _same_greedy_tokens(tokens, model, prompt, n)
