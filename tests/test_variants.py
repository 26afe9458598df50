"""Attention variants (GQA/MQA, S_q != S_k, sliding window, stride, masks, key lengths).

CPU tests pin the description itself (common/variants.py): the keep mask against hand-built
truths and transformers' own definitions, the float64 reference against SDPA, the CPU twin.
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


def test_naive_strided_reference():
    from task4.variants_checks import naive_strided_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out = naive_strided_attention(q, k, v, stride=3)
    assert torch.allclose(out, reference_attention_variant(q, k, v, Variant(causal=True, stride=3)))


def test_sweeps_name_valid_patterns():
    from task4.variants_checks import SWEEP, sweep_variant

    g = torch.Generator().manual_seed(4)
    for b, hq, _, sq, sk, _, pattern, _ in SWEEP:
        variant = sweep_variant(pattern, b, hq, sq, sk, torch.float32, g, "cpu")
        assert variant.stride >= 1 and (variant.window is None or variant.window >= 1)


# --- GPU: the kernels ---------------------------------------------------------------------

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("group", ["variants-small", "variants", "variants-inputs", "strided"])
def test_prefill_variants(group):
    from task4.variants_checks import GROUPS

    checks, _ = GROUPS[group](None)
    assert_checks(checks)


@gpu
@pytest.mark.parametrize("group", ["gqa-small", "gqa"])
def test_decode_variants(group):
    from task5.variants_checks import GROUPS

    checks, _ = GROUPS[group](None)
    assert_checks(checks)
