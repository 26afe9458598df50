"""task3/flash_backward.py, the backward-pass lesson (not graded): on the CPU, in seconds.

The forward's out and lse against float64; dq, dk, dv against torch autograd on the float64
formula, by FlashAttention-2's criterion (max|ours - ref64| <= 2 * max|PyTorch - ref64| + 1e-5,
PyTorch being autograd on the same formula in the input dtype); gradcheck through the
autograd Function; rows that see no key; wrong arguments. That the release turns the lesson
into a skeleton that raises NotImplementedError is checked in tests/test_release.py."""

from __future__ import annotations

import math

import pytest
import torch

from common.variants import Variant, fa2_criterion, keep_mask, reference_attention_variant
from task3.flash_backward import (FlashAttentionFunction, flash_attention, flash_attention_backward,
                                  flash_attention_forward_with_lse)

HEAD_DIM = 16


def formula(q, k, v, causal=False, scale=None, softcap=None):
    """(out, lse) of attention written out in q's dtype, differentiable: with float64 inputs
    the truth, with the input dtype PyTorch's yardstick. Rows that see no key: 0 and -inf."""
    batch, heads, seq_q, head_dim = q.shape
    group, seq_k = heads // k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim) if scale is None else scale)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    keep = keep_mask(batch, heads, seq_q, seq_k, Variant(causal=causal), device=q.device)
    # The most negative finite number, not -inf, keeps a row with no key free of NaN (in the
    # gradient too); `* keep` then zeroes it.
    probs = torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=-1) * keep
    return probs @ v, torch.logsumexp(scores.masked_fill(~keep, float("-inf")), dim=-1)


def random_inputs(batch, heads, kv_heads, seq_q, seq_k, dtype=torch.float32, logits=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = randn(batch, heads, seq_q, HEAD_DIM) * logits
    k = randn(batch, kv_heads, seq_k, HEAD_DIM) * logits
    v = randn(batch, kv_heads, seq_k, HEAD_DIM)
    # d_out not contiguous: every other column of a wider tensor.
    d_out = randn(batch, heads, seq_q, 2 * HEAD_DIM)[..., ::2]
    return [t.to(dtype) for t in (q, k, v)], d_out.to(dtype)


def autograd_of(q, k, v, d_out, dtype, **settings):
    """(out, lse, dq, dk, dv) of `formula` computed in `dtype` by torch autograd."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, lse = formula(*leaves, **settings)
    out.backward(d_out.to(dtype))
    return (out.detach(), lse.detach(), *(t.grad for t in leaves))


def assert_fa2(name, ours, ref64, pytorch):
    passed, err, bound = fa2_criterion(ours, ref64, pytorch)
    assert passed, f"{name}: max error {err:.3e} > bound {bound:.3e} (2 x PyTorch + 1e-5)"


def check_against_autograd(heads, kv_heads, seq_q, seq_k, causal, tiles, *, softcap=None,
                           logits=1.0, dtype=torch.float32, scale=None):
    (q, k, v), d_out = random_inputs(2, heads, kv_heads, seq_q, seq_k, dtype, logits)
    settings = dict(causal=causal, scale=scale, softcap=softcap)
    truth = autograd_of(q, k, v, d_out, torch.float64, **settings)
    yardstick = autograd_of(q, k, v, d_out, dtype, **settings)

    out, lse = flash_attention_forward_with_lse(q, k, v, causal, *tiles, scale=scale,
                                                softcap=softcap)
    assert out.dtype == dtype
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out_autograd = flash_attention(*leaves, causal, *tiles, scale=scale, softcap=softcap)
    assert torch.equal(out_autograd, out), "flash_attention and the forward disagree"
    out_autograd.backward(d_out)
    ours = (out, lse, *(t.grad for t in leaves))
    assert all(g.dtype == dtype for g in ours[2:])

    seen = torch.isfinite(truth[1])   # rows that see a key; the others: lse -inf, out 0
    assert torch.equal(torch.isfinite(lse), seen) and bool((lse[~seen] == float("-inf")).all())
    for name, mine, ref, pt in zip(("out", "lse", "dq", "dk", "dv"), ours, truth, yardstick):
        if name == "lse":
            mine, ref, pt = mine[seen], ref[seen], pt[seen]
        assert_fa2(name, mine, ref, pt)


# (heads, kv_heads, seq_q, seq_k, causal, (rows_per_q_tile, rows_per_kv_tile)): odd lengths,
# S_q != S_k both ways (causal with S_q > S_k: the first S_q - S_k rows see no key), GQA
# ratios 1, 2, 4, 8, and tiles that do not divide the lengths.
CASES = [
    (8, 8, 1, 1, False, (16, 16)),
    (8, 4, 1, 1, True, (128, 128)),
    (8, 2, 7, 7, False, (3, 2)),
    (8, 1, 7, 7, True, (2, 3)),
    (8, 8, 77, 77, False, (16, 32)),
    (8, 2, 77, 77, True, (32, 16)),
    (8, 4, 130, 130, False, (64, 48)),
    (8, 8, 130, 130, True, (13, 7)),
    (8, 1, 77, 130, False, (16, 32)),
    (8, 4, 77, 130, True, (13, 29)),
    (8, 2, 130, 77, False, (32, 16)),
    (8, 8, 130, 77, True, (29, 13)),
    (8, 8, 1, 130, True, (16, 16)),
    (8, 2, 130, 1, True, (16, 16)),
    (8, 4, 1, 77, False, (1, 128)),
    (8, 1, 130, 7, True, (128, 5)),
]


@pytest.mark.parametrize("heads, kv_heads, seq_q, seq_k, causal, tiles", CASES,
                         ids=[f"h{h}/{kv} Sq{sq} Sk{sk} {'causal' if c else 'full'} "
                              f"tiles{t[0]}x{t[1]}" for h, kv, sq, sk, c, t in CASES])
def test_out_lse_and_gradients_match_float64(heads, kv_heads, seq_q, seq_k, causal, tiles):
    check_against_autograd(heads, kv_heads, seq_q, seq_k, causal, tiles)


@pytest.mark.parametrize("softcap", [0.5, 5.0, 30.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_and_its_derivative(softcap, causal):
    check_against_autograd(8, 2, 77, 130, causal, (16, 32), softcap=softcap, logits=3.0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [None, 20.0])
def test_large_logits(causal, softcap):
    """Inputs times 6 (scores times 36): one key dominates each row, exp underflows for most."""
    check_against_autograd(8, 4, 130, 130, causal, (32, 48), softcap=softcap, logits=6.0)


def test_a_scale_of_ones_own():
    check_against_autograd(8, 8, 77, 77, True, (16, 32), scale=0.05)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(dtype):
    check_against_autograd(4, 2, 33, 47, True, (16, 16), dtype=dtype)


def test_the_formula_is_the_repositorys_truth():
    """The test's own formula agrees with common.variants (causal bottom-right, GQA)."""
    (q, k, v), _ = random_inputs(2, 8, 2, 13, 21, torch.float64)
    for causal in (False, True):
        ref = reference_attention_variant(q, k, v, Variant(causal=causal))
        torch.testing.assert_close(formula(q, k, v, causal)[0], ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal, softcap, seq_q, seq_k", [
    (False, None, 5, 7), (True, None, 5, 7), (True, None, 7, 4),
    (False, 1.5, 7, 4), (True, 1.5, 5, 7)])
def test_gradcheck_through_the_autograd_function(causal, softcap, seq_q, seq_k):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, seq_q, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, seq_k, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(1, 2, seq_k, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    def attention(q, k, v):
        return FlashAttentionFunction.apply(q, k, v, causal, 2, 3, None, softcap)

    assert torch.autograd.gradcheck(attention, (q, k, v))


def test_a_row_that_sees_no_key_gives_zeros_and_zero_gradients():
    """Causal with 9 queries and 5 keys: queries 0 to 3 come before every key."""
    (q, k, v), d_out = random_inputs(2, 4, 2, 9, 5)
    out, lse = flash_attention_forward_with_lse(q, k, v, True, 4, 2)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, True, 4, 2)
    blind = slice(0, 4)
    assert bool((out[:, :, blind] == 0).all()) and bool((lse[:, :, blind] == float("-inf")).all())
    assert bool(torch.isfinite(lse[:, :, 4:]).all())
    assert bool((dq[:, :, blind] == 0).all()) and bool((dq[:, :, 4:] != 0).any())
    assert all(bool(torch.isfinite(t).all()) for t in (out, dq, dk, dv))
    # What d_out says about those rows reaches nothing.
    other = d_out.clone()
    other[:, :, blind] = 1e3
    again = flash_attention_backward(q, k, v, out, lse, other, True, 4, 2)
    for mine, theirs in zip((dq[:, :, 4:], dk, dv), (again[0][:, :, 4:], again[1], again[2])):
        assert torch.equal(mine, theirs)


def test_tile_sizes_do_not_change_the_result_beyond_rounding():
    (q, k, v), d_out = random_inputs(1, 4, 4, 40, 40, torch.float64)
    results = []
    for tiles in ((1, 1), (7, 11), (64, 64)):
        out, lse = flash_attention_forward_with_lse(q, k, v, True, *tiles)
        grads = flash_attention_backward(q, k, v, out, lse, d_out, True, *tiles)
        results.append((out, lse, *grads))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _qkv(*shapes, dtype=torch.float32):
    return [torch.randn(*s, dtype=dtype) for s in shapes]


@pytest.mark.parametrize("call, error, words", [
    (lambda: flash_attention_forward_with_lse(*_qkv((2, 4, 8), (2, 4, 8), (2, 4, 8))),
     ValueError, "4 dimensions"),
    (lambda: flash_attention_forward_with_lse(*_qkv((1, 6, 8, 16), (1, 4, 8, 16), (1, 4, 8, 16))),
     ValueError, "multiple of the key/value heads"),
    (lambda: flash_attention_forward_with_lse(*_qkv((1, 4, 8, 16), (1, 4, 8, 8), (1, 4, 8, 8))),
     ValueError, "head_dim"),
    (lambda: flash_attention_forward_with_lse(*_qkv((1, 4, 8, 16), (1, 4, 8, 16)),
                                              torch.randn(1, 4, 8, 16, dtype=torch.float64)),
     TypeError, "share one dtype"),
    (lambda: flash_attention_forward_with_lse(*(torch.ones(1, 1, 2, 2, dtype=torch.int32),) * 3),
     TypeError, "floating point"),
    (lambda: flash_attention_forward_with_lse(*_qkv((1, 1, 0, 4), (1, 1, 3, 4), (1, 1, 3, 4))),
     ValueError, "at least one query"),
    (lambda: flash_attention_forward_with_lse(*_qkv(*[(1, 1, 4, 4)] * 3), rows_per_q_tile=0),
     ValueError, "rows_per_q_tile"),
    (lambda: flash_attention_forward_with_lse(*_qkv(*[(1, 1, 4, 4)] * 3), causal="yes"),
     TypeError, "causal must be True or False"),
    (lambda: flash_attention_forward_with_lse(*_qkv(*[(1, 1, 4, 4)] * 3), softcap=0.0),
     ValueError, "softcap must be a positive"),
    (lambda: flash_attention_forward_with_lse(*_qkv(*[(1, 1, 4, 4)] * 3), scale="1/8"),
     TypeError, "scale must be a positive number"),
    (lambda: flash_attention_backward(*_qkv(*[(1, 1, 4, 4)] * 3), torch.zeros(1, 1, 4, 4),
                                      torch.zeros(1, 1, 5), torch.zeros(1, 1, 4, 4)),
     ValueError, "lse must have shape"),
    (lambda: flash_attention_backward(*_qkv(*[(1, 1, 4, 4)] * 3), torch.zeros(1, 1, 4, 4),
                                      torch.zeros(1, 1, 4), None),
     TypeError, "d_out must be a torch.Tensor"),
])
def test_a_wrong_argument_is_one_sentence(call, error, words):
    with pytest.raises(error, match=words) as info:
        call()
    assert str(info.value).endswith(".")
