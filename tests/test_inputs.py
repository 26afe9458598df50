"""Tasks 1 and 3 refuse a wrong call with one clear Python error each (common/inputs.py),
and task 3 takes keys longer than queries with bottom-right causal masking. CPU only.

The checks sit outside the solution regions, so they hold in the student skeleton too; the
tests that need the attention itself to run skip there (it is not implemented yet).
"""

from __future__ import annotations

import pytest
import torch

from common.checks import causal_keep_mask, check_relative, random_qkv, reference_attention
from task1.attention import CustomSelfAttention
from task3.attention import CustomFlashAttention, flash_attention_forward

HIDDEN, HEADS = 32, 4
MODULES = [CustomSelfAttention, CustomFlashAttention]


def _weights(hidden=HIDDEN, dtype=torch.float32):
    return [torch.randn(hidden, hidden, dtype=dtype) for _ in range(4)]


@pytest.mark.parametrize("cls", MODULES)
@pytest.mark.parametrize("heads, error, words", [
    (0, ValueError, "num_heads must be a positive integer"),
    (-2, ValueError, "num_heads must be a positive integer"),
    (5, ValueError, "not divisible by num_heads 5"),
    (2.0, TypeError, "num_heads must be an int"),
])
def test_bad_heads_are_refused(cls, heads, error, words):
    with pytest.raises(error, match=words):
        cls(*_weights(), HIDDEN, heads)


@pytest.mark.parametrize("cls", MODULES)
def test_bad_weights_are_refused(cls):
    w = _weights()
    with pytest.raises(ValueError, match=r"w_k has shape \(32, 16\)"):
        cls(w[0], w[1][:, :16], w[2], w[3], HIDDEN, HEADS)
    with pytest.raises(TypeError, match="w_o is torch.float64 but w_q is torch.float32"):
        cls(w[0], w[1], w[2], w[3].double(), HIDDEN, HEADS)
    with pytest.raises(ValueError, match="hidden_dim must be a positive integer"):
        cls(*w, 0, HEADS)


@pytest.mark.parametrize("cls", MODULES)
@pytest.mark.parametrize("x, error, words", [
    (torch.randn(10, HIDDEN), ValueError, r"3 dimensions\), got shape \(10, 32\)"),
    (torch.randn(1, 2, 10, HIDDEN), ValueError, "3 dimensions"),
    (torch.randn(2, 10, HIDDEN + 1), ValueError, "hidden size 33"),
    (torch.randn(2, 10, HIDDEN, dtype=torch.float64), TypeError, "x is torch.float64 but the weights"),
    (torch.randn(2, 10, HIDDEN, device="meta"), ValueError, "x is on meta but the weights are on cpu"),
    ([[1.0]], TypeError, "x must be a torch.Tensor"),
])
def test_bad_inputs_are_refused(cls, x, error, words):
    module = cls(*_weights(), HIDDEN, HEADS)
    with pytest.raises(error, match=words):
        module(x)


@pytest.mark.parametrize("tiles, error", [((0, 64), ValueError), ((64, -1), ValueError),
                                          ((16.5, 64), TypeError)])
def test_bad_tile_sizes_are_refused(tiles, error):
    with pytest.raises(error, match="rows_per_"):
        CustomFlashAttention(*_weights(), HIDDEN, HEADS, *tiles)
    q, k, v = random_qkv(1, 2, 8, 8, device="cpu")
    with pytest.raises(error, match="rows_per_"):
        flash_attention_forward(q, k, v, False, *tiles)


@pytest.mark.parametrize("shapes, error, words", [
    (((1, 2, 8, 8), (1, 2, 8, 16), (1, 2, 8, 16)), ValueError, "batch, heads and head_dim"),
    (((1, 2, 8, 8), (1, 2, 9, 8), (1, 2, 8, 8)), ValueError, "same shape"),
    (((2, 8, 8), (2, 8, 8), (2, 8, 8)), ValueError, "4 dimensions"),
])
def test_flash_attention_forward_checks_its_tensors(shapes, error, words):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(error, match=words):
        flash_attention_forward(q, k, v)


def test_flash_attention_forward_refuses_fewer_keys_than_queries_when_causal():
    q, _, _ = random_qkv(1, 2, 8, 8, device="cpu")
    k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="5 keys for 8 queries"):
        flash_attention_forward(q, k, v, causal=True)
    with pytest.raises(TypeError, match="one dtype"):
        flash_attention_forward(q, k.double(), v.double())


def _implemented() -> bool:
    q, k, v = random_qkv(1, 1, 2, 8, device="cpu")
    try:
        flash_attention_forward(q, k, v)
    except NotImplementedError:
        return False
    return True


@pytest.mark.skipif(not _implemented(), reason="task 3 is not implemented yet (student skeleton)")
@pytest.mark.parametrize("seq_q, seq_k, br, bc", [(5, 17, 2, 4), (1, 33, 16, 8), (7, 100, 3, 16),
                                                  (64, 130, 32, 64), (20, 7, 4, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_keys_longer_than_queries_are_bottom_right_aligned(seq_q, seq_k, br, bc, causal):
    if causal and seq_k < seq_q:
        pytest.skip("refused: fewer keys than queries when causal")
    gen = torch.Generator().manual_seed(seq_q * 1000 + seq_k)
    q = torch.randn(2, 3, seq_q, 16, generator=gen)
    k, v = torch.randn(2, 3, seq_k, 16, generator=gen), torch.randn(2, 3, seq_k, 16, generator=gen)
    out = flash_attention_forward(q, k, v, causal, rows_per_q_tile=br, rows_per_kv_tile=bc)
    truth = reference_attention(q, k, v, causal)
    assert check_relative("Sq != Sk", out, truth, q.dtype).passed
    if causal:   # the reference's mask is the bottom-right one: query i sees key j <= i + Sk - Sq
        keep = causal_keep_mask(seq_q, seq_k)
        assert keep[0, seq_k - seq_q] and (seq_k - seq_q + 1 >= seq_k or not keep[0, seq_k - seq_q + 1])


# --- softcap, sinks and scale of the attention entries (common.inputs.check_attention_arguments)

def _qkv(dtype=torch.float16):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 16, generator=gen).to(dtype)
    k, v = (torch.randn(2, 2, 7, 16, generator=gen).to(dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("arguments, error, words", [
    (dict(softcap=0.0), ValueError, "softcap must be a positive, finite number or None, got 0.0"),
    (dict(softcap=-50.0), ValueError, "softcap must be a positive, finite number"),
    (dict(softcap=float("inf")), ValueError, "softcap must be a positive, finite number"),
    (dict(softcap=float("nan")), ValueError, "softcap must be a positive, finite number"),
    (dict(softcap="50"), TypeError, "softcap must be a positive number or None, not str"),
    (dict(softcap=True), TypeError, "softcap must be a positive number or None, not bool"),
    (dict(scale=0), ValueError, "scale must be a positive, finite number or None, got 0"),
    (dict(scale=float("-inf")), ValueError, "scale must be a positive, finite number"),
    (dict(scale=torch.tensor(0.1)), TypeError, "scale must be a positive number or None, not Tensor"),
    (dict(sinks=[0.0] * 4), TypeError, r"sinks must be a float tensor of shape \[4\]"),
    (dict(sinks=torch.zeros(4, dtype=torch.int32)), TypeError, "sinks has dtype torch.int32"),
    (dict(sinks=torch.zeros(4, dtype=torch.float64)), TypeError, "sinks has dtype torch.float64"),
    (dict(sinks=torch.zeros(2)), ValueError, r"sinks must have shape \[4\] .* has shape \(2,\)"),
    (dict(sinks=torch.zeros(1, 4)), ValueError, r"sinks must have shape \[4\]"),
    (dict(sinks=torch.zeros(4, device="meta")), ValueError, "sinks is on meta but q is on cpu"),
])
def test_attention_score_arguments_are_checked(arguments, error, words):
    from common.inputs import check_attention_arguments

    q, k, v = _qkv()
    with pytest.raises(error, match=words):
        check_attention_arguments(q, k, v, kernel=False, **arguments)


@pytest.mark.parametrize("arguments", [
    dict(softcap=50), dict(softcap=30.0, scale=0.0625), dict(sinks=torch.zeros(4)),
    dict(sinks=torch.full((4,), float("-inf"), dtype=torch.float16)),
    dict(sinks=torch.zeros(4, dtype=torch.bfloat16), softcap=1e-3, scale=1e3)])
def test_attention_score_arguments_that_are_fine(arguments):
    from common.inputs import check_attention_arguments

    check_attention_arguments(*_qkv(), kernel=False, **arguments)


def test_attention_score_arguments_are_checked_before_routing():
    """task5.attention.attention refuses them before it picks a path (here, PyTorch's twin)."""
    from task5.attention import attention

    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match="softcap"):
        attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="sinks"):
        attention(q[:, :, :1], k, v, sinks=torch.zeros(3))
