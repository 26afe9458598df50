"""Task 1: multi-head self-attention, written the naive way in PyTorch.

This is the specification every later task must match. Read it top to bottom:

    x [B, S, hidden]
      -> q, k, v = x @ w_q.T, x @ w_k.T, x @ w_v.T                  (projections)
      -> view [B, S, heads, head_dim] -> transpose [B, heads, S, head_dim]
      -> scores = q @ k^T / sqrt(head_dim)                            [B, heads, S, S]
      -> causal: scores above the diagonal set to -inf (a token never sees the future)
      -> softmax over the last dimension, then @ v                   [B, heads, S, head_dim]
      -> transpose back and merge the heads [B, S, hidden] -> @ w_o.T

It materialises the whole S x S score matrix per head: memory grows with S^2, which is
what FlashAttention (tasks 3 and 4) removes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from common.inputs import check_heads, check_module_input, check_weights


class CustomSelfAttention(nn.Module):
    """Multi-head self-attention with the weights of an nn.MultiheadAttention (no biases).

    w_q, w_k, w_v, w_o: [hidden_dim, hidden_dim] projection matrices (y = x @ w.T).
    """

    def __init__(self, w_q, w_k, w_v, w_o, hidden_dim: int, num_heads: int):
        super().__init__()
        # Wrong arguments fail here, with a sentence that says what to change (common/inputs.py).
        self.head_dim = check_heads(hidden_dim, num_heads)
        check_weights({"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o}, hidden_dim)
        self.w_q, self.w_k, self.w_v, self.w_o = w_q, w_k, w_v, w_o
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        check_module_input(x, self.hidden_dim, self.w_q)
        batch, seq, _ = x.shape
        # BEGIN SOLUTION
        # HINT: Project x to q, k, v; split the heads with view + transpose to
        # HINT: [B, heads, S, head_dim]; scores = q @ k^T / sqrt(head_dim); if causal, set the
        # HINT: cells above the diagonal (torch.triu(..., diagonal=1)) to -inf with masked_fill;
        # HINT: softmax over the last dim; @ v; transpose back, reshape to [B, S, hidden]; @ w_o.T.
        q = (x @ self.w_q.T).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = (x @ self.w_k.T).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        v = (x @ self.w_v.T).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if causal:
            future = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), diagonal=1)
            scores = scores.masked_fill(future, float("-inf"))
        attention = torch.softmax(scores, dim=-1) @ v

        merged = attention.transpose(1, 2).reshape(batch, seq, self.hidden_dim)
        return merged @ self.w_o.T
        # END SOLUTION
