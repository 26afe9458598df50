"""Task 6: rotary position embeddings (RoPE), rotate-half form, base 10000.

A head vector x of head_dim D is read as D/2 points in the plane: point i is the pair
(x[i], x[i + D/2]). At position p, RoPE rotates point i by the angle p * theta_i, with
theta_i = base^(-2i/D) (fast rotations in the first pairs, slow ones in the last):

    rope(x, p) = x * cos(p * theta) + rotate_half(x) * sin(p * theta)
    rotate_half([x1, x2]) = [-x2, x1]                  (x1, x2: the two halves of x)

Why it is used: rotating q at position m and k at position n by their own angles makes
q . k depend only on m - n, so attention sees relative positions although every token was
encoded on its own. A key can therefore be rotated once, when it is written to the KV
cache, and never touched again: the cache holds rotated keys.

The cos/sin tables are computed once, for max_seq_len positions, by rope_tables
(common/rope.py, which says why in float64; task 5's rope_append kernel reads the same tables);
column i and column i + D/2 hold the same angle.
"""

from __future__ import annotations

import torch
from torch import nn

from common.rope import rope_tables   # the tables' layout, shared with task 5's rope_append kernel


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] on the last dimension (the textbook form, used by the tests)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, as a new contiguous tensor.

    x: [B, S, heads, head_dim], any strides (e.g. q as a view of the fused qkv output).
    cos, sin: [S, head_dim], the tables at the positions of x's S tokens, in x's dtype.
    """
    # BEGIN SOLUTION
    # HINT: Broadcast cos and sin over batch and heads ([S, D] -> [1, S, 1, D]) and return
    # HINT: x * cos + rotate_half(x) * sin, where rotate_half turns the halves [x1, x2] of the
    # HINT: last dimension into [-x2, x1]. (Fewer kernels: out = x * cos, then add -x2 * sin to
    # HINT: the first half of out and x1 * sin to the second half in place, with addcmul_.)
    half = x.shape[-1] // 2
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :half]       # both halves of the sin table are equal
    # Three kernels instead of the five of the textbook form (neg, cat, two muls, add): a
    # decode step applies RoPE 2 x num_layers times to tiny tensors, where a kernel costs
    # about its launch, so the count is what matters.
    out = x * cos                         # a new, contiguous tensor even when x is a view
    out[..., :half].addcmul_(x[..., half:], sin, value=-1.0)   # x1 cos - x2 sin
    out[..., half:].addcmul_(x[..., :half], sin)               # x2 cos + x1 sin
    return out
    # END SOLUTION


class RotaryEmbedding(nn.Module):
    """The precomputed tables, and their rows at a call's positions."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0, device=None):
        super().__init__()
        self.head_dim, self.max_seq_len, self.base = head_dim, max_seq_len, base
        cos, sin = rope_tables(head_dim, max_seq_len, base, device)
        # Not persistent: derived from (head_dim, max_seq_len, base), never saved with weights.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def at(self, current_pos: int | torch.Tensor, seq: int,
           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [seq, head_dim] in `dtype` for positions current_pos .. current_pos + seq - 1.

        current_pos is a Python int, or an integer tensor on the tables' device (a CUDA graph
        reads it on the device, so one captured decode step serves every position).
        """
        if isinstance(current_pos, int):
            cos = self.cos[current_pos:current_pos + seq]
            sin = self.sin[current_pos:current_pos + seq]
        else:
            positions = current_pos.reshape(1).long() + torch.arange(seq, device=self.cos.device)
            cos = self.cos.index_select(0, positions)
            sin = self.sin.index_select(0, positions)
        return cos.to(dtype), sin.to(dtype)
