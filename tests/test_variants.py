"""Attention variants (GQA/MQA, S_q != S_k, sliding window, stride, masks, key lengths,
softcap, attention sinks, scale).

CPU tests pin the description itself (common/variants.py): the keep mask against hand-built
truths and transformers' own definitions, the float64 reference against SDPA and against
transformers' eager formulas (Gemma-2's softcap, GPT-OSS's sinks), the CPU twin.
GPU tests wrap the groups of task4/variants_checks.py and task5/variants_checks.py, the same
checks `python -m task4.test --variants` and `python -m task5.test --gqa` run.
"""

from __future__ import annotations

import pytest
import torch

from common.checks import assert_checks
from common.variants import (
    Variant,
    fa2_criterion,
    keep_mask,
    pytorch_attention_variant,
    reference_attention_variant,
)

# --- CPU: the description ---------------------------------------------------------------


def _brute_keep(batch, seq_q, seq_k, variant):
    """The definition, one pair at a time (common/variants.py's docstring)."""
    out = torch.zeros(batch, 1, seq_q, seq_k, dtype=torch.bool)
    for b in range(batch):
        begin, end = 0, seq_k
        if variant.key_lengths is not None:
            n = int(variant.key_lengths[b])
            begin, end = (seq_k - n, seq_k) if variant.left_padding else (0, n)
        for i in range(seq_q):
            pos = i + end - seq_q
            for j in range(seq_k):
                ok = begin <= j < end
                ok &= not variant.causal or j <= pos
                if variant.window:
                    ok &= j > pos - variant.window
                    ok &= variant.causal or j < pos + variant.window
                ok &= (pos - j) % variant.stride == 0
                out[b, 0, i, j] = ok
    return out


@pytest.mark.parametrize("variant", [
    Variant(), Variant(causal=True), Variant(causal=True, window=3), Variant(window=2),
    Variant(causal=True, stride=3), Variant(stride=2),
    Variant(causal=True, key_lengths=torch.tensor([5, 2, 0], dtype=torch.int32)),
    Variant(causal=True, key_lengths=torch.tensor([5, 2, 7], dtype=torch.int32),
            left_padding=True),
    Variant(causal=True, window=2, key_lengths=torch.tensor([7, 4, 1], dtype=torch.int32),
            left_padding=True),
])
@pytest.mark.parametrize("seq_q, seq_k", [(7, 7), (3, 7), (7, 3), (1, 7)])
def test_keep_mask_is_the_definition(variant, seq_q, seq_k):
    if variant.key_lengths is not None:
        variant = Variant(variant.causal, variant.window, variant.stride, None,
                          variant.key_lengths.clamp(max=seq_k), variant.left_padding)
    got = keep_mask(3, 1, seq_q, seq_k, variant)
    assert torch.equal(got.expand(3, 1, seq_q, seq_k), _brute_keep(3, seq_q, seq_k, variant))


def test_causal_is_bottom_right_aligned():
    keep = keep_mask(1, 1, 2, 4, Variant(causal=True))[0, 0]
    assert keep.tolist() == [[True, True, True, False], [True, True, True, True]]
    # a decode query sees every key
    assert keep_mask(1, 1, 1, 5, Variant(causal=True)).all()


def test_sliding_window_matches_transformers():
    masking = pytest.importorskip("transformers.masking_utils")
    if not hasattr(masking, "sliding_window_overlay"):
        pytest.skip("this transformers has no sliding_window_overlay")
    window, seq = 4, 11
    overlay = masking.sliding_window_overlay(window)
    causal = masking.causal_mask_function
    theirs = torch.tensor([[bool(causal(0, 0, i, j)) and bool(overlay(0, 0, i, j))
                            for j in range(seq)] for i in range(seq)])
    ours = keep_mask(1, 1, seq, seq, Variant(causal=True, window=window))[0, 0]
    assert torch.equal(ours, theirs)


def test_mask_tensor_and_rows_without_keys():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    keep = torch.rand(2, 1, 5, 5, generator=g) < 0.6
    keep[:, :, 2] = False
    variant = Variant(mask=keep)
    ref = reference_attention_variant(q, k, v, variant)
    assert torch.equal(ref[:, :, 2], torch.zeros_like(ref[:, :, 2]))     # no key: zeros
    pt = pytorch_attention_variant(q, k, v, variant)
    assert fa2_criterion(pt, ref, pt)[0]
    bias = torch.randn(1, 4, 5, 5, generator=g)
    variant = Variant(causal=True, mask=bias)
    ref = reference_attention_variant(q, k, v, variant)
    scores = (q.double() @ k.double().transpose(-2, -1)) / 8 ** 0.5 + bias.double()
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    assert torch.allclose(ref, torch.softmax(scores, -1) @ v.double())


def test_reference_gqa_repeats_kv_heads():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 8, 6, 16, generator=g)
    k, v = torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    ref = reference_attention_variant(q, k, v, Variant(causal=True))
    repeated = reference_attention_variant(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                           Variant(causal=True))
    assert torch.allclose(ref, repeated)


def test_cpu_twin_takes_every_variant():
    from task5.attention import attention

    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(3, 4, 6, 16, generator=g), *(torch.randn(3, 2, 10, 16, generator=g)
                                                       for _ in range(2))
    variant = Variant(causal=True, window=4, stride=2,
                      key_lengths=torch.tensor([10, 7, 3], dtype=torch.int32), left_padding=True)
    out = attention(q, k, v, **variant.kwargs())
    assert fa2_criterion(out, reference_attention_variant(q, k, v, variant), out)[0]


# --- CPU: softcap, sinks and scale (issue 31) ----------------------------------------------


def _transformers_eager(q, k, v, scaling, softcap=None, sinks=None, mask=None):
    """transformers' eager attention, written out in float64: Gemma-2's (scores * scaling,
    / softcap, tanh, * softcap, + mask, softmax) and GPT-OSS's sinks (+ mask, the sinks as a
    last column, minus the row max, softmax, the sink's column dropped)."""
    groups = q.shape[1] // k.shape[1]
    key = k.double().repeat_interleave(groups, 1)
    value = v.double().repeat_interleave(groups, 1)
    weights = torch.matmul(q.double(), key.transpose(2, 3)) * scaling
    if softcap is not None:
        weights = weights / softcap
        weights = torch.tanh(weights)
        weights = weights * softcap
    if mask is not None:
        weights = weights + mask
    if sinks is not None:
        column = sinks.double().reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)
        combined = torch.cat([weights, column], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(weights, dim=-1)
    return torch.matmul(probs, value)


def _score_inputs(seed, batch=2, heads_q=4, heads_kv=2, seq_q=6, seq_k=9, head_dim=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads_q, seq_q, head_dim, generator=g) * 3
    k, v = (torch.randn(batch, heads_kv, seq_k, head_dim, generator=g) for _ in range(2))
    return q, k, v, g


@pytest.mark.parametrize("softcap, use_sinks, scale", [
    (5.0, False, None), (None, True, None), (None, False, 0.05), (2.0, True, 0.3),
    (50.0, True, None)])
@pytest.mark.parametrize("causal", [False, True])
def test_score_transforms_are_transformers_eager(softcap, use_sinks, scale, causal):
    q, k, v, g = _score_inputs(5)
    sinks = torch.randn(4, generator=g) * 2 if use_sinks else None
    bias = torch.randn(1, 4, 6, 9, generator=g)
    keep = keep_mask(1, 1, 6, 9, Variant(causal=causal))
    variant = Variant(causal=causal, mask=bias, softcap=softcap, sinks=sinks, scale=scale)
    ref = reference_attention_variant(q, k, v, variant)
    theirs = _transformers_eager(q, k, v, scale or 16 ** -0.5, softcap, sinks,
                                 bias.double().masked_fill(~keep, float("-inf")))
    assert torch.allclose(ref, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant_args", [
    dict(softcap=4.0), dict(scale=0.4), dict(causal=True, softcap=3.0, scale=0.2),
    dict(causal=True, window=3, softcap=10.0), dict(stride=2, scale=0.1),
    dict(causal=True, key_lengths=torch.tensor([9, 2], dtype=torch.int32), left_padding=True,
         softcap=7.0)])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_cpu_twin_computes_the_truth(variant_args, with_sinks):
    """PyTorch's twin in float64 is the float64 truth (the same formula, another code path);
    in float32 and bfloat16 it is the truth up to that dtype's rounding."""
    q, k, v, g = _score_inputs(6)
    sinks = torch.randn(4, generator=g) if with_sinks else None
    variant = Variant(**variant_args, sinks=sinks)
    ref = reference_attention_variant(q, k, v, variant)
    twin64 = pytorch_attention_variant(q.double(), k.double(), v.double(), variant)
    assert torch.allclose(twin64, ref, rtol=1e-10, atol=1e-12)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        twin = pytorch_attention_variant(q.to(dtype), k.to(dtype), v.to(dtype), variant)
        assert twin.dtype == dtype
        exact = reference_attention_variant(q.to(dtype), k.to(dtype), v.to(dtype), variant)
        assert (twin.double() - exact).abs().max().item() < tolerance


def test_sinks_rows_without_keys_and_the_lse():
    from common.variants import reference_lse_variant

    q, k, v, g = _score_inputs(7)
    keep = torch.rand(2, 1, 6, 9, generator=g) < 0.6
    keep[:, :, 2] = False                                  # a row that sees no key
    sinks = torch.tensor([0.5, -1.0, float("-inf"), 3.0])  # head 2: no sink
    variant = Variant(mask=keep, sinks=sinks)
    ref = reference_attention_variant(q, k, v, variant)
    assert torch.equal(ref[:, :, 2], torch.zeros_like(ref[:, :, 2]))   # only the sink: zeros
    lse = reference_lse_variant(q, k, v, variant)
    scores = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-2, -1)) / 4
    scores = scores.masked_fill(~keep, float("-inf"))
    column = sinks.double().reshape(1, 4, 1, 1).expand(2, 4, 6, 1)
    assert torch.allclose(lse, torch.logsumexp(torch.cat([scores, column], -1), -1))
    assert torch.equal(lse[:, [0, 1, 3], 2], sinks[[0, 1, 3]].double().expand(2, 3))
    assert torch.isneginf(lse[:, 2, 2]).all()           # no key, no sink
    # A -inf sink is no sink; every sink takes weight from the keys (rows sum to less than 1).
    plain = reference_attention_variant(q, k, v, Variant(mask=keep))
    assert torch.allclose(ref[:, 2], plain[:, 2])
    ones = reference_attention_variant(q, k, torch.ones_like(v), variant)
    assert (ones[:, [0, 1, 3]] < 1).all()
    assert torch.allclose(ones[:, 2][keep.any(-1)[:, 0]], torch.ones((), dtype=torch.float64))


def test_scale_and_softcap_limits():
    q, k, v, _ = _score_inputs(8)
    # a scale is the same as rescaling q
    scaled = reference_attention_variant(q, k, v, Variant(causal=True, scale=0.07))
    rescaled = reference_attention_variant(q * (0.07 * 4), k, v, Variant(causal=True))
    assert torch.allclose(scaled, rescaled)
    # a cap far above every score changes nothing; a small one flattens the weights
    capped = reference_attention_variant(q, k, v, Variant(softcap=1e6))
    assert torch.allclose(capped, reference_attention_variant(q, k, v, Variant()), atol=1e-9)
    flat = reference_attention_variant(q, k, v, Variant(softcap=1e-6))
    mean = v.double().repeat_interleave(2, 1).mean(dim=2, keepdim=True)
    assert torch.allclose(flat, mean.expand_as(flat), atol=1e-5)


def test_variant_kwargs_and_describe_the_score_arguments():
    sinks = torch.zeros(4)
    assert "softcap" not in Variant(causal=True).kwargs()      # the decode entries' keywords
    full = Variant(causal=True, softcap=30.0, sinks=sinks, scale=0.125)
    assert full.kwargs()["softcap"] == 30.0 and full.kwargs()["sinks"] is sinks
    assert full.kwargs()["scale"] == 0.125
    assert full.describe() == "causal, softcap 30, sinks, scale 0.125"


@pytest.mark.parametrize("seq_q", [1, 6])
def test_cpu_attention_takes_softcap_sinks_scale(seq_q):
    from task5.attention import attention

    q, k, v, g = _score_inputs(9, seq_q=seq_q)
    variant = Variant(causal=True, window=5, softcap=8.0, sinks=torch.randn(4, generator=g),
                      scale=0.2)
    out = attention(q, k, v, **variant.kwargs())
    assert torch.equal(out, pytorch_attention_variant(q, k, v, variant))
    assert fa2_criterion(out, reference_attention_variant(q, k, v, variant), out)[0]


def test_naive_strided_reference():
    from task4.variants_checks import naive_strided_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out = naive_strided_attention(q, k, v, stride=3)
    assert torch.allclose(out, reference_attention_variant(q, k, v, Variant(causal=True, stride=3)))


def test_sweeps_name_valid_patterns():
    from task4.variants_checks import SWEEP, score_options, sweep_variant

    g = torch.Generator().manual_seed(4)
    for b, hq, _, sq, sk, _, pattern, options in SWEEP:
        variant = sweep_variant(pattern, b, hq, sq, sk, torch.float32, g, "cpu")
        assert variant.stride >= 1 and (variant.window is None or variant.window >= 1)
        scores = score_options(options, hq, sk, torch.float16, g, "cpu")   # raises if unknown
        assert scores.get("sinks") is None or scores["sinks"].shape == (hq,)
    assert any("softcap" in case[-1] for case in SWEEP) and any("sinks" in case[-1] for case in SWEEP)


# --- GPU: the kernels ---------------------------------------------------------------------

gpu = pytest.mark.gpu


@gpu
@pytest.mark.slow
@pytest.mark.parametrize("group", ["variants-small", "variants", "variants-inputs", "strided"])
def test_prefill_variants(group):
    from task4.variants_checks import GROUPS

    checks, _ = GROUPS[group](None)
    assert_checks(checks)


@gpu
@pytest.mark.slow
@pytest.mark.parametrize("group", ["gqa-small", "gqa", "gqa-mma"])
def test_decode_variants(group):
    from task5.variants_checks import GROUPS

    checks, _ = GROUPS[group](None)
    assert_checks(checks)
