"""Beyond the course (not graded): FlashAttention-2's backward pass in PyTorch, tile by tile.

Task 3 wrote the forward pass (Algorithm 1 of Dao, 2023). Training needs the gradients too:
given dO = dLoss/dO, find dQ, dK and dV. This file is task 3's counterpart for them
(Algorithm 2), tiled the same way, so that `loss.backward()` runs on the lesson version.

What the forward must save. A plain autograd of softmax(Q K^T) V keeps the S x S matrix of
probabilities P for the backward. FlashAttention never holds P, so the forward saves only
its output O and, per query row, one number: the log-sum-exp of that row's scores,

    L = m + log(l)        (m the row maximum, l the row sum of exp(score - m)),

which the online softmax has at the end of each query tile anyway. Then any entry of P can
be rebuilt from its score alone: P_ij = exp(S_ij - L_i), with no maximum or sum to redo.

The gradients, with S = Q K^T * scale and P = softmax(S) row by row:

    dV = P^T dO                  dP = dO V^T
    dS = P * (dP - D)            D_i = rowsum(dO * O)_i = dO_i . O_i
    dQ = dS K * scale            dK = dS^T Q * scale

D comes from the softmax's Jacobian: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik), and
sum_k P_ik dP_ik = sum_k P_ik (dO_i . V_k) = dO_i . O_i, one dot product per row, computed
once before the tiles from O and dO (both [S, d]).

The backward, tile by tile (Algorithm 2). The outer loop walks the key/value tiles; for one
K_j, V_j it keeps dK_j and dV_j (tile sized) and walks the query tiles: recompute
S = Q_i K_j^T * scale and P = exp(S - L_i), then

    dV_j += P^T dO_i,   dP = dO_i V_j^T,   dS = P * (dP - D_i),
    dK_j += dS^T Q_i * scale,   dQ_i += dS K_j * scale,

and write dK_j, dV_j once the query tiles are done. Nothing S x S exists at any time: what
lives between tiles is Q, K, V, O, dO, dQ, dK, dV ([S, d] each), L and D ([S] each), and one
tile of scores. Memory is O(S * d), as in the forward; the price is recomputing Q K^T (the
backward does five tile products where a stored P would need four).

Why the key/value tiles are the outer loop, and what that does to dQ. dK_j and dV_j sum
over the query rows, dQ_i over the keys: one of them must be summed across the outer loop.
With the keys outside, dK_j and dV_j stay local (on a GPU: in one thread block's registers),
and dQ_i receives a piece from every key tile. Here, in PyTorch, the loops run one after the
other, so `dq[rows] += dS K_j * scale` inside the tile loop is exact and simple: this file
accumulates dQ directly. A CUDA kernel runs the key tiles in parallel, one thread block each,
so several blocks add into the same dQ_i at once. It must then either
  * add with atomics (FlashAttention-2 does: atomicAdd into a float32 dQ buffer, converted to
    the input dtype afterwards), which is fast but makes the order of the additions, hence
    the last bits of dQ, change from run to run (not deterministic) and contends on memory;
  * or compute dQ in a separate pass with the loops swapped (query tiles outside, key tiles
    inside, dQ_i local), which is deterministic and atomic-free but recomputes S, P and dP a
    second time: 7 tile products instead of 5.
(FlashAttention-2 also has a deterministic mode that orders the atomic additions, slower.)

Conventions, as in task 3 and common/variants.py:
  * q [B, H_q, S_q, d]; k, v [B, H_kv, S_k, d]: grouped-query attention when H_kv < H_q
    (H_q % H_kv == 0); query head h reads KV head h // (H_q // H_kv), so dK and dV sum over
    the query heads of each group;
  * causal is bottom-right aligned: query i sees key j iff j <= i + S_k - S_q. When
    S_q > S_k the first S_q - S_k queries see no key: their output is 0, their L is -inf,
    and their gradients are 0;
  * `scale` defaults to 1/sqrt(d); `softcap=c` (Gemma 2, Grok) caps the scores,
    s -> c * tanh(s / c), before the mask, so the backward multiplies dS by the cap's
    derivative 1 - tanh^2(s / c);
  * fp16 and bf16 inputs are computed in float32 (L is float32), float32 in float32 and
    float64 in float64; outputs and gradients come back in the input dtype.

    out, lse = flash_attention_forward_with_lse(q, k, v, causal=True)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, causal=True)
    out = flash_attention(q, k, v, causal=True)   # autograd: out.sum().backward() works

The tiles loop in Python and everything else is vectorised over batch and heads, so this
runs on a CPU; tests/test_flash_backward.py checks it against float64 autograd.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from common.inputs import check_grouped_qkv, check_positive_number, check_tile_sizes


# --- argument checks (at the boundary, one sentence per mistake) ------------------------------

def check_arguments(q, k, v, causal, rows_per_q_tile, rows_per_kv_tile, scale, softcap) -> float:
    """q [B, H_q, S_q, d], k and v [B, H_kv, S_k, d] with H_q % H_kv == 0, one floating dtype
    and device; returns the scale (1/sqrt(d) when None). TypeError/ValueError with a sentence."""
    check_grouped_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, not {type(causal).__name__} {causal!r}.")
    check_tile_sizes(rows_per_q_tile=rows_per_q_tile, rows_per_kv_tile=rows_per_kv_tile)
    check_positive_number(scale, "scale")
    check_positive_number(softcap, "softcap")
    return 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)


def _check_saved(q, out, lse, d_out) -> None:
    """What the backward takes besides q, k, v: the forward's out and lse, and d_out."""
    for name, t, shape in (("out", out, q.shape), ("d_out", d_out, q.shape),
                           ("lse", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape {list(shape)}, got "
                            f"{type(t).__name__}.")
        if t.shape != shape:
            raise ValueError(f"{name} must have shape {list(shape)} (q is {list(q.shape)}), got "
                             f"{list(t.shape)}; pass what flash_attention_forward_with_lse "
                             "returned for these q, k, v.")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}.")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; put them on one "
                             "device.")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the tiles are computed in: float64 for float64 inputs, float32 for the rest."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def causal_keep(causal: bool, rows: range, keys: range, offset: int, device) -> torch.Tensor | None:
    """Which scores of the tile of query `rows` and `keys` (ranges of positions) are kept:
    bool [len(rows), len(keys)], key j kept for query i iff j <= i + offset; None when the
    tile needs no mask (not causal, or every key of it is visible to every row of it)."""
    if not causal or keys[-1] <= rows[0] + offset:
        return None
    return (torch.arange(keys.start, keys.stop, device=device)[None, :]
            <= torch.arange(rows.start, rows.stop, device=device)[:, None] + offset)


# --- the tiles ----------------------------------------------------------------------------

def score_tile(q_tile: torch.Tensor, k_tile: torch.Tensor, scale: float, softcap: float | None,
               keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One tile of scores, as both passes need them: (scores, softcap derivative).

    q_tile [..., rows, d] and k_tile [..., keys, d] (already in the accumulation dtype);
    scores = q_tile k_tile^T * scale, capped to c * tanh(scores / c) when softcap = c, then
    -inf where `keep` is False. The derivative of the cap with respect to the uncapped
    scores, 1 - tanh^2(scores / c), is returned for the backward (None without softcap)."""
    # BEGIN SOLUTION
    # HINT: scores = q_tile @ k_tile^T * scale. With a softcap c: t = tanh(scores / c),
    # HINT: scores = c * t, and the derivative is 1 - t * t (without one it is None).
    # HINT: Then, if keep is not None, set the scores where keep is False to -inf.
    scores = (q_tile @ k_tile.transpose(-2, -1)) * scale
    cap_derivative = None
    if softcap is not None:
        capped = torch.tanh(scores / softcap)
        scores = softcap * capped
        cap_derivative = 1.0 - capped * capped
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores, cap_derivative
    # END SOLUTION


def flash_attention_forward_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     causal: bool = False, rows_per_q_tile: int = 128,
                                     rows_per_kv_tile: int = 128, *, scale: float | None = None,
                                     softcap: float | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Task 3's forward (Algorithm 1) that also returns the log-sum-exp of each query row.

    q [B, H_q, S_q, d], k and v [B, H_kv, S_k, d]. Returns (out [B, H_q, S_q, d] in q's
    dtype, lse [B, H_q, S_q] in the accumulation dtype): lse = m + log(l) of the scores a row
    sees, -inf (and out 0) for a row that sees no key."""
    scale = check_arguments(q, k, v, causal, rows_per_q_tile, rows_per_kv_tile, scale, softcap)
    heads, seq_q = q.shape[1], q.shape[2]
    kv_heads, seq_k = k.shape[1], k.shape[2]
    offset = seq_k - seq_q          # causal: query i sees key j iff j <= i + offset
    acc = accumulation_dtype(q.dtype)
    # Grouped-query attention without copying K and V: query head h = kv * group + g becomes
    # [B, H_kv, group, S_q, d], and K, V [B, H_kv, 1, S_k, d] broadcast over the group.
    q5 = q.unflatten(1, (kv_heads, heads // kv_heads))
    k5, v5 = k.unsqueeze(2), v.unsqueeze(2)
    out = torch.empty(q5.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q5.shape[:-1], dtype=acc, device=q.device)
    # BEGIN SOLUTION
    # HINT: Task 3's loops, on q5, k5, v5 (tiles cast to acc): for each query tile start
    # HINT: m = -inf, l = 0, O = 0; for each key tile (causal: stop after the key at the
    # HINT: tile's last row + offset) get the scores from score_tile(..., causal_keep(...)),
    # HINT: m_new = max(m, rowmax S). A row that has seen no key yet has m_new = -inf: use 0
    # HINT: in its place in P = exp(S - m_new) and in exp(m - m_new), so that no -inf - -inf
    # HINT: makes a NaN. l = exp(m - m_new) * l + rowsum P, O = exp(m - m_new) * O + P V.
    # HINT: At the end write O / l into out and m + log(l) into lse, or 0 and -inf where l == 0.
    for q_start in range(0, seq_q, rows_per_q_tile):
        q_end = min(q_start + rows_per_q_tile, seq_q)
        q_tile = q5[..., q_start:q_end, :].to(acc)                    # [B, H_kv, G, Br, d]
        row_max = torch.full(q_tile.shape[:-1] + (1,), float("-inf"), dtype=acc, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc_out = torch.zeros_like(q_tile)
        kv_stop = q_end + offset if causal else seq_k
        for kv_start in range(0, kv_stop, rows_per_kv_tile):
            kv_end = min(kv_start + rows_per_kv_tile, seq_k)
            keep = causal_keep(causal, range(q_start, q_end), range(kv_start, kv_end), offset,
                               q.device)
            k_tile = k5[..., kv_start:kv_end, :].to(acc)              # [B, H_kv, 1, Bc, d]
            scores, _ = score_tile(q_tile, k_tile, scale, softcap, keep)
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            # A row with no key so far (causal: one that sees none at all) has -inf here.
            safe_max = new_max.masked_fill(new_max == float("-inf"), 0.0)
            probs = torch.exp(scores - safe_max)
            rescale = torch.exp(row_max - safe_max)
            row_sum = rescale * row_sum + probs.sum(dim=-1, keepdim=True)
            acc_out = rescale * acc_out + probs @ v5[..., kv_start:kv_end, :].to(acc)
            row_max = new_max
        seen = row_sum > 0
        out[..., q_start:q_end, :] = torch.where(seen, acc_out / row_sum, 0.0).to(q.dtype)
        lse[..., q_start:q_end] = torch.where(seen, row_max + torch.log(row_sum),
                                              float("-inf")).squeeze(-1)
    # END SOLUTION
    return out.flatten(1, 2), lse.flatten(1, 2)


def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, d_out: torch.Tensor, causal: bool = False,
                             rows_per_q_tile: int = 128, rows_per_kv_tile: int = 128, *,
                             scale: float | None = None, softcap: float | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm 2: (dq, dk, dv) of attention from the forward's out and lse, tile by tile.

    q, k, v and the settings as given to flash_attention_forward_with_lse, which returned
    out [B, H_q, S_q, d] and lse [B, H_q, S_q]; d_out = dLoss/d(out), any strides. Returns the
    gradients in the dtypes of q, k, v; dk and dv sum over the query heads of each KV group."""
    scale = check_arguments(q, k, v, causal, rows_per_q_tile, rows_per_kv_tile, scale, softcap)
    _check_saved(q, out, lse, d_out)
    heads, seq_q = q.shape[1], q.shape[2]
    kv_heads, seq_k = k.shape[1], k.shape[2]
    offset = seq_k - seq_q
    acc = accumulation_dtype(q.dtype)
    group = (kv_heads, heads // kv_heads)      # the same [B, H_kv, G, S, d] views as the forward
    q5, out5, d_out5 = q.unflatten(1, group), out.unflatten(1, group), d_out.unflatten(1, group)
    lse5 = lse.unflatten(1, group)
    k5, v5 = k.unsqueeze(2), v.unsqueeze(2)
    dq = torch.zeros(q5.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k5.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v5.shape, dtype=acc, device=q.device)
    # BEGIN SOLUTION
    # HINT: First D = rowsum(d_out5 * out5) (keepdim), in acc. A row that saw no key has
    # HINT: lse -inf: put +inf there, so that its P = exp(S - lse) is 0 instead of NaN.
    # HINT: For each key tile (K_j, V_j in acc; dK_j = dV_j = 0, shaped [B, H_kv, 1, Bc, d]):
    # HINT: for each query tile (causal: start at the tile holding row kv_start - offset, the
    # HINT: first that sees key kv_start): S, cap' = score_tile(Q_i, K_j, ..., causal_keep(...)),
    # HINT: P = exp(S - lse_i), dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D_i)
    # HINT: (times cap' with a softcap), dQ_i += dS K_j * scale, dK_j += dS^T Q_i * scale;
    # HINT: sum dK_j's and dV_j's products over the group dimension (2, keepdim). Write dK_j
    # HINT: and dV_j into dk and dv after the query tiles; add into dq directly.
    delta = (d_out5.to(acc) * out5.to(acc)).sum(dim=-1, keepdim=True)    # D: [B, H_kv, G, S_q, 1]
    lse_for_exp = lse5.to(acc).unsqueeze(-1)
    lse_for_exp = lse_for_exp.masked_fill(lse_for_exp == float("-inf"), float("inf"))
    for kv_start in range(0, seq_k, rows_per_kv_tile):
        kv_end = min(kv_start + rows_per_kv_tile, seq_k)
        k_tile = k5[..., kv_start:kv_end, :].to(acc)                  # [B, H_kv, 1, Bc, d]
        v_tile = v5[..., kv_start:kv_end, :].to(acc)
        dk_tile = torch.zeros_like(k_tile)
        dv_tile = torch.zeros_like(v_tile)
        # Causal: the query rows before kv_start - offset see none of these keys.
        first_row = max(0, kv_start - offset) if causal else 0
        for q_start in range(first_row - first_row % rows_per_q_tile, seq_q, rows_per_q_tile):
            q_end = min(q_start + rows_per_q_tile, seq_q)
            q_tile = q5[..., q_start:q_end, :].to(acc)                # [B, H_kv, G, Br, d]
            d_out_tile = d_out5[..., q_start:q_end, :].to(acc)
            keep = causal_keep(causal, range(q_start, q_end), range(kv_start, kv_end), offset,
                               q.device)
            scores, cap_derivative = score_tile(q_tile, k_tile, scale, softcap, keep)
            probs = torch.exp(scores - lse_for_exp[..., q_start:q_end, :])   # P, recomputed
            dv_tile += (probs.transpose(-2, -1) @ d_out_tile).sum(dim=2, keepdim=True)
            d_probs = d_out_tile @ v_tile.transpose(-2, -1)
            d_scores = probs * (d_probs - delta[..., q_start:q_end, :])
            if cap_derivative is not None:
                d_scores = d_scores * cap_derivative
            dq[..., q_start:q_end, :] += (d_scores @ k_tile) * scale
            dk_tile += (d_scores.transpose(-2, -1) @ q_tile).sum(dim=2, keepdim=True) * scale
        dk[..., kv_start:kv_end, :] = dk_tile
        dv[..., kv_start:kv_end, :] = dv_tile
    # END SOLUTION
    return dq.flatten(1, 2).to(q.dtype), dk.squeeze(2).to(k.dtype), dv.squeeze(2).to(v.dtype)


# --- autograd: the two passes as one differentiable operation ------------------------------

class FlashAttentionFunction(torch.autograd.Function):
    """attention(q, k, v) whose forward saves (q, k, v, out, lse), never P, and whose backward
    is flash_attention_backward. Arguments after v as flash_attention_forward_with_lse's,
    positional: (q, k, v, causal, rows_per_q_tile, rows_per_kv_tile, scale, softcap)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, rows_per_q_tile=128, rows_per_kv_tile=128,
                scale=None, softcap=None):
        settings = dict(causal=causal, rows_per_q_tile=rows_per_q_tile,
                        rows_per_kv_tile=rows_per_kv_tile, scale=scale, softcap=softcap)
        out, lse = flash_attention_forward_with_lse(q, k, v, **settings)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = settings
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, **ctx.settings)
        return dq, dk, dv, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    rows_per_q_tile: int = 128, rows_per_kv_tile: int = 128, *,
                    scale: float | None = None, softcap: float | None = None) -> torch.Tensor:
    """Differentiable FlashAttention-2 in PyTorch: out [B, H_q, S_q, d]; out.backward() runs
    flash_attention_backward. Arguments as flash_attention_forward_with_lse's."""
    return FlashAttentionFunction.apply(q, k, v, causal, rows_per_q_tile, rows_per_kv_tile,
                                        scale, softcap)
