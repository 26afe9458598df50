"""The baseline every test compares against: torch.nn.MultiheadAttention.

As the course fixes it: `nn.MultiheadAttention(hidden, heads, bias=False, batch_first=True)`
in eval mode under no_grad, called `(x, x, x, need_weights=False, attn_mask=mask)` with a
boolean upper-triangular mask when causal. The custom modules take their weights from
`in_proj_weight.chunk(3)` and `out_proj.weight`.
"""

from __future__ import annotations

import torch
from torch import nn


def causal_attn_mask(seq: int, device) -> torch.Tensor:
    """nn.MultiheadAttention's boolean mask: True above the diagonal = not allowed."""
    return torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), diagonal=1)


def make_mha(hidden_dim: int, num_heads: int, *, device="cuda", dtype=torch.float32,
             seed: int | None = None, bias: bool = False) -> nn.MultiheadAttention:
    """A seeded nn.MultiheadAttention in eval mode (weights drawn on the CPU, so the same seed
    gives the same weights on every device)."""
    if seed is not None:
        torch.manual_seed(seed)
    mha = nn.MultiheadAttention(hidden_dim, num_heads, bias=bias, batch_first=True)
    return mha.to(device=device, dtype=dtype).eval()


def mha_weights(mha: nn.MultiheadAttention) -> tuple[torch.Tensor, ...]:
    """(w_q, w_k, w_v, w_o), each [hidden, hidden], as the custom modules take them."""
    w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3)
    return w_q, w_k, w_v, mha.out_proj.weight.detach()


def mha_biases(mha: nn.MultiheadAttention) -> tuple[torch.Tensor, ...]:
    """(b_q, b_k, b_v, b_o) of a biased nn.MultiheadAttention."""
    assert mha.in_proj_bias is not None, "this nn.MultiheadAttention was built with bias=False"
    b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
    return b_q, b_k, b_v, mha.out_proj.bias.detach()


@torch.no_grad()
def mha_forward(mha: nn.MultiheadAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    mask = causal_attn_mask(x.shape[1], x.device) if causal else None
    out, _ = mha(x, x, x, need_weights=False, attn_mask=mask)
    return out


def split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, S, hidden] -> [B, heads, S, head_dim]."""
    b, s, hidden = t.shape
    return t.view(b, s, num_heads, hidden // num_heads).transpose(1, 2)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """[B, heads, S, head_dim] -> [B, S, hidden]."""
    b, h, s, d = t.shape
    return t.transpose(1, 2).reshape(b, s, h * d)


@torch.no_grad()
def reference_module_output(x: torch.Tensor, weights, num_heads: int, causal: bool) -> torch.Tensor:
    """The whole module (projections, attention, output projection) in float64: the truth."""
    from common.checks import reference_attention

    w_q, w_k, w_v, w_o = (w.double() for w in weights)
    x64 = x.double()
    q, k, v = (split_heads(x64 @ w.T, num_heads) for w in (w_q, w_k, w_v))
    return merge_heads(reference_attention(q, k, v, causal)) @ w_o.T
