"""Task 3: FlashAttention-2 forward (Algorithm 1 of Dao, 2023) written in PyTorch.

The idea: never hold the S x S score matrix. Split the queries into tiles of
`rows_per_q_tile` rows and the keys/values into tiles of `rows_per_kv_tile` rows. For one
query tile, walk over the key/value tiles and keep, per query row, only

    m  the running maximum of the scores seen so far,
    l  the running sum of exp(score - m),
    O  the running, *unnormalised* output sum of exp(score - m) * v.

When a new tile raises the maximum from m_old to m_new, everything accumulated so far was
scaled by exp(-m_old) and must now be scaled by exp(-m_new): multiply l and O by
exp(m_old - m_new). Divide O by l once, at the end. Memory is O(S * head_dim), not O(S^2).

Two fixes to the paper's Algorithm 1 as printed:
  * line 10 rescales the old output by diag(exp(m_old - m_new)), not by its inverse;
  * the scores are scaled by 1/sqrt(head_dim), which the algorithm leaves out.
The logsumexp L (needed only for the backward pass) is not computed.

Keys may outnumber queries (Sk >= Sq, as when a few new tokens attend to a longer cache):
the queries are then the last Sq positions, and causal masking is aligned bottom-right, as
in FlashAttention-2 >= 2.1: query i sees key j iff j <= i + (Sk - Sq).

Here the tiles loop in Python and everything else is vectorised over batch and heads, so
the (16, 4096) test finishes in seconds on a CPU. Task 4 turns the same loop into one
CUDA kernel.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from common.inputs import check_heads, check_module_input, check_qkv, check_tile_sizes, check_weights


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                            rows_per_q_tile: int = 128, rows_per_kv_tile: int = 128) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) [+ causal mask]) v, tile by tile.

    q: [B, heads, Sq, head_dim]; k, v: [B, heads, Sk, head_dim] with Sk >= Sq when causal (the
    queries are the last Sq positions: query i sees key j iff j <= i + Sk - Sq). Returns
    [B, heads, Sq, head_dim].
    """
    check_qkv(q, k, v)
    check_tile_sizes(rows_per_q_tile=rows_per_q_tile, rows_per_kv_tile=rows_per_kv_tile)
    batch, heads, seq, head_dim = q.shape
    seq_k = k.shape[2]
    if seq > 0 and (seq_k == 0 or (causal and seq_k < seq)):
        raise ValueError(f"{seq_k} keys for {seq} queries: the first queries would see no key "
                         "at all; pass at least as many keys as queries (Sk >= Sq) when causal, "
                         "and at least one key.")
    offset = seq_k - seq   # causal: query row i sees key j iff j <= i + offset
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.empty_like(q)
    # BEGIN SOLUTION
    # HINT: For each query tile (rows_per_q_tile rows): start m = -inf, l = 0, O = 0 (one per row);
    # HINT: for each key/value tile of the seq_k keys (when causal, stop after the tile that
    # HINT: holds the key at the query tile's last row + offset): S = Q K^T * scale; when causal,
    # HINT: mask key j for query row i where j > i + offset (offset = seq_k - seq: 0 when the
    # HINT: lengths are equal, as in the course);
    # HINT: m_new = max(m, rowmax S), P = exp(S - m_new),
    # HINT: l = exp(m - m_new) * l + rowsum P, O = exp(m - m_new) * O + P V, m = m_new.
    # HINT: Finally write O / l into out. Vectorise over batch and heads; loop over tiles only.
    for q_start in range(0, seq, rows_per_q_tile):
        q_end = min(q_start + rows_per_q_tile, seq)
        q_tile = q[:, :, q_start:q_end]                                   # [B, h, Br, d]
        row_max = torch.full((batch, heads, q_end - q_start, 1), float("-inf"),
                             dtype=q.dtype, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros_like(q_tile)

        # Causal: key tiles that start after this query tile's last row (shifted by offset)
        # are all future.
        kv_stop = q_end + offset if causal else seq_k
        for kv_start in range(0, kv_stop, rows_per_kv_tile):
            kv_end = min(kv_start + rows_per_kv_tile, seq_k)
            scores = (q_tile @ k[:, :, kv_start:kv_end].transpose(-2, -1)) * scale
            if causal and kv_end > q_start + offset:  # the tile reaches the diagonal: mask the future
                rows = torch.arange(q_start, q_end, device=q.device).unsqueeze(1)
                cols = torch.arange(kv_start, kv_end, device=q.device).unsqueeze(0)
                scores = scores.masked_fill(cols > rows + offset, float("-inf"))

            # The first key tile always holds key 0, visible to every row, so new_max is
            # finite from the first tile on and exp(row_max - new_max) is never exp(nan).
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            probs = torch.exp(scores - new_max)
            rescale = torch.exp(row_max - new_max)       # corrected line 10: exp(m_old - m_new)
            row_sum = rescale * row_sum + probs.sum(dim=-1, keepdim=True)
            acc = rescale * acc + probs @ v[:, :, kv_start:kv_end]
            row_max = new_max

        out[:, :, q_start:q_end] = acc / row_sum
    # END SOLUTION
    return out


class CustomFlashAttention(nn.Module):
    """Multi-head self-attention whose core is `flash_attention_forward` (same interface as task 1)."""

    def __init__(self, w_q, w_k, w_v, w_o, hidden_dim: int, num_heads: int,
                 rows_per_q_tile: int = 128, rows_per_kv_tile: int = 128):
        super().__init__()
        # Wrong arguments fail here, with a sentence that says what to change (common/inputs.py).
        self.head_dim = check_heads(hidden_dim, num_heads)
        check_weights({"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o}, hidden_dim)
        check_tile_sizes(rows_per_q_tile=rows_per_q_tile, rows_per_kv_tile=rows_per_kv_tile)
        self.w_q, self.w_k, self.w_v, self.w_o = w_q, w_k, w_v, w_o
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.rows_per_q_tile = rows_per_q_tile
        self.rows_per_kv_tile = rows_per_kv_tile

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        check_module_input(x, self.hidden_dim, self.w_q)
        batch, seq, _ = x.shape

        def heads(w):
            return (x @ w.T).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

        out = flash_attention_forward(heads(self.w_q), heads(self.w_k), heads(self.w_v), causal,
                                      self.rows_per_q_tile, self.rows_per_kv_tile)
        return out.transpose(1, 2).reshape(batch, seq, self.hidden_dim) @ self.w_o.T
