"""Attention variants: the one description every kernel family takes, and its truth.

Real models use more than "every key" or "causal". Every kernel of this repository (the
fp32 and tensor-core prefill kernels of task 4, the decode kernels of task 5) takes the same
description of which keys a query row sees, evaluates it tile by tile with one device-side
predicate (common/csrc/attention_mask.cuh), and skips only the key tiles it proves empty.
This module is that description in Python and the float64 truth the tests compare with.

Shapes: q [B, H_q, S_q, D], k and v [B, H_kv, S_k, D].

  * GQA / MQA: H_q is a multiple of H_kv; query head h reads KV head h // (H_q // H_kv).
  * S_q != S_k: the queries are the LAST S_q positions of their sequence's keys, so query i
    sits at absolute position  pos(i) = i + key_end - S_q,  where key_end is S_k (or the
    sequence's key length, below). Causal is bottom-right aligned, as in FlashAttention-2
    >= 2.1: query i sees key j iff j <= pos(i). A decode query (S_q = 1) sees every key; a
    chunk of a prefill after a cache sees the cache and its own causal triangle.
  * window w >= 1 (None = none): key j is visible iff pos(i) - w < j, exactly transformers'
    `sliding_window_overlay` for Mistral and Qwen2 (`kv_idx > q_idx - sliding_window`), on top
    of causal. Without causal the window is symmetric: |pos(i) - j| < w.
  * stride s >= 1 (1 = none): key j is visible iff (pos(i) - j) % s == 0, the strided
    (sparse) attention pattern; with causal, j <= pos(i) as well.
  * mask: a tensor broadcastable to [B, H_q, S_q, S_k] like SDPA's attn_mask: bool (True =
    keep) or an additive float (added to the scaled scores; -inf drops a key). It is read
    tile by tile where it is, through its (broadcast, possibly zero) strides, never expanded.
  * key_lengths: [B] int32, the number of valid keys of each sequence. With
    left_padding=False (varlen keys, a static cache) sequence b's keys are [0, len_b) and
    key_end = len_b; with left_padding=True (transformers' batched generation) they are the
    last len_b keys, [S_k - len_b, S_k), and key_end = S_k.

A query row that sees no key at all outputs zeros (SDPA would output NaN there); the tests
check that convention. Every condition above is AND-ed.

Beyond which keys a row sees, three arguments change the scores themselves (issue 31). For
query i of head h and a visible key j, in this order (transformers' Gemma-2 eager attention:
scale, softcap, then the mask; FlashAttention-2's `softmax_scale` and `softcap`):

    s_ij = (q_i . k_j) * scale                 scale > 0; None = 1 / sqrt(D)
    s_ij = softcap * tanh(s_ij / softcap)      softcap > 0 (Gemma-2: 50); None = no cap
    s_ij = s_ij + mask_ij                      an additive float mask (logit units)
    p_ij = exp(s_ij - M_i) / (sum_j' exp(s_ij' - M_i) + exp(sink_h - M_i)),
           M_i = max(max_j s_ij, sink_h)       sinks [H_q] (logit units); None = no sink term
    out_i = sum_j p_ij v_j

  * scale: the softmax scale (Gemma's query_pre_attn_scalar ** -0.5) instead of a rescaled q.
  * softcap: `softcap * tanh(scale * q.k / softcap)`, FlashAttention-2's definition and
    transformers' Gemma-2 `attn_weights / softcap -> tanh -> * softcap`, before the mask.
  * sinks: GPT-OSS's attention sinks (transformers' `s_aux`, `module.sinks`): one logit per
    query head joins each row's softmax as a column with no value (transformers concatenates
    it to the scores, subtracts the row max of the whole, and drops its probability), so a
    row's weights sum to less than 1. The sink takes part in the max M_i (stability); -inf is
    no sink. A row with no visible key still outputs zeros (its only weight is the sink's).
    The row's log-sum-exp, lse_i = log(sum_j exp(s_ij) + exp(sink_h)), holds the sink exactly
    once: a split of the keys whose partials are merged by their lse must add it in one split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Variant:
    """Which keys a query row sees (see the module docstring). The default is dense."""

    causal: bool = False
    window: int | None = None
    stride: int = 1
    mask: torch.Tensor | None = None
    key_lengths: torch.Tensor | None = None
    left_padding: bool = False
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    scale: float | None = None

    def kwargs(self) -> dict:
        """Keyword arguments of task4.attention.flash_attention / task5's attention and decode.

        softcap, sinks and scale only when given: task5's decode entries do not take them yet."""
        found = dict(causal=self.causal, window=self.window, stride=self.stride, mask=self.mask,
                     key_lengths=self.key_lengths, left_padding=self.left_padding)
        found.update({name: value for name, value in self.score_kwargs().items()
                      if value is not None})
        return found

    def score_kwargs(self) -> dict:
        """softcap, sinks and scale: what changes the scores, not which keys are visible."""
        return dict(softcap=self.softcap, sinks=self.sinks, scale=self.scale)

    def describe(self) -> str:
        parts = ["causal" if self.causal else "full"]
        if self.window:
            parts.append(f"window {self.window}")
        if self.stride != 1:
            parts.append(f"stride {self.stride}")
        if self.mask is not None:
            parts.append(f"{'bool' if self.mask.dtype == torch.bool else 'float'} mask "
                         f"{list(self.mask.shape)}")
        if self.key_lengths is not None:
            parts.append("left-padded" if self.left_padding else "key lengths")
        if self.softcap is not None:
            parts.append(f"softcap {self.softcap:g}")
        if self.sinks is not None:
            parts.append("sinks")
        if self.scale is not None:
            parts.append(f"scale {self.scale:g}")
        return ", ".join(parts)


def key_range(batch: int, seq_k: int, key_lengths: torch.Tensor | None, left_padding: bool,
              device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_begin, key_end), each [B] int64: sequence b's valid keys are [begin_b, end_b)."""
    if key_lengths is None:
        begin = torch.zeros(batch, dtype=torch.int64, device=device)
        return begin, torch.full((batch,), seq_k, dtype=torch.int64, device=device)
    lengths = key_lengths.to(device=device, dtype=torch.int64).reshape(-1).expand(batch)
    lengths = lengths.clamp(0, seq_k)
    if left_padding:
        return seq_k - lengths, torch.full_like(lengths, seq_k)
    return torch.zeros_like(lengths), lengths


def keep_mask(batch: int, heads: int, seq_q: int, seq_k: int, variant: Variant,
              device=None) -> torch.Tensor:
    """Boolean [B, H_q or 1, S_q, S_k]: True where query i may attend key j.

    The additive part of a float mask is not included (see `additive_bias`)."""
    begin, end = key_range(batch, seq_k, variant.key_lengths, variant.left_padding, device)
    rows = torch.arange(seq_q, device=device).view(1, 1, seq_q, 1)
    cols = torch.arange(seq_k, device=device).view(1, 1, 1, seq_k)
    pos = rows + (end - seq_q).view(batch, 1, 1, 1)            # absolute query positions
    keep = (cols >= begin.view(batch, 1, 1, 1)) & (cols < end.view(batch, 1, 1, 1))
    if variant.causal:
        keep = keep & (cols <= pos)
    if variant.window:
        keep = keep & (cols > pos - variant.window)
        if not variant.causal:
            keep = keep & (cols < pos + variant.window)
    if variant.stride != 1:
        keep = keep & ((pos - cols) % variant.stride == 0)
    if variant.mask is not None:
        m = variant.mask.to(device)
        keep = keep & (m if m.dtype == torch.bool else m != float("-inf"))
    return keep


def softmax_scale(head_dim: int, variant: Variant = Variant()) -> float:
    """The variant's scale, or 1 / sqrt(head_dim) when it gives none."""
    return 1.0 / math.sqrt(head_dim) if variant.scale is None else float(variant.scale)


def _reference_rows(q, k, v, variant: Variant, with_output: bool = True):
    """The float64 truth, per query head: yields (h, out [B, S_q, D] or None, lse [B, S_q])."""
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    if heads_q % heads_kv:
        raise ValueError(f"H_q {heads_q} is not a multiple of H_kv {heads_kv}.")
    group = heads_q // heads_kv
    scale = softmax_scale(head_dim, variant)
    keep = keep_mask(batch, heads_q, seq_q, seq_k, variant, device=q.device)
    keep = keep.expand(batch, heads_q, seq_q, seq_k)
    bias = None
    if variant.mask is not None and variant.mask.dtype != torch.bool:
        bias = variant.mask.to(q.device, torch.float64).expand(batch, heads_q, seq_q, seq_k)
    sinks = None if variant.sinks is None else variant.sinks.to(q.device, torch.float64)
    for h in range(heads_q):
        kv = h // group
        scores = (q[:, h].double() @ k[:, kv].double().transpose(-2, -1)) * scale
        if variant.softcap is not None:
            scores = variant.softcap * torch.tanh(scores / variant.softcap)
        if bias is not None:
            scores = scores + torch.where(keep[:, h], bias[:, h], 0.0)
        scores = scores.masked_fill(~keep[:, h], float("-inf"))
        top = scores.amax(dim=-1, keepdim=True)
        if sinks is not None:                  # the sink takes part in the max
            top = top.clamp(min=sinks[h])
        top = torch.where(torch.isfinite(top), top, 0.0)   # no key (and no sink): stays 0
        weights = torch.exp(scores - top)
        total = weights.sum(dim=-1, keepdim=True)
        if sinks is not None:
            total = total + torch.exp(sinks[h] - top)
        lse = (torch.log(total) + top).squeeze(-1)          # -inf: no key and no sink
        out = None
        if with_output:
            out = ((weights / total).nan_to_num(0.0) @ v[:, kv].double())   # no key: 0
        yield h, out, lse


def reference_attention_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                variant: Variant = Variant()) -> torch.Tensor:
    """The truth in float64: q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D] -> [B, H_q, S_q, D].

    The formula of the module docstring (scale, softcap, mask, sinks). Rows that see no key are
    0. Runs per query head so that the float64 scores of one head at a time exist (a
    [B, S_q, S_k] tensor)."""
    batch, heads_q, seq_q, _ = q.shape
    out = torch.zeros(batch, heads_q, seq_q, v.shape[-1], dtype=torch.float64, device=q.device)
    for h, rows, _ in _reference_rows(q, k, v, variant):
        out[:, h] = rows
    return out


def reference_lse_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          variant: Variant = Variant()) -> torch.Tensor:
    """Each row's natural log-sum-exp in float64, [B, H_q, S_q]: log(sum_j exp(s_ij) +
    exp(sink_h)) over the visible keys (the sink once); -inf for a row with neither."""
    batch, heads_q, seq_q, _ = q.shape
    lse = torch.empty(batch, heads_q, seq_q, dtype=torch.float64, device=q.device)
    for h, _, rows in _reference_rows(q, k, v, variant, with_output=False):
        lse[:, h] = rows
    return lse


def pytorch_attention_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              variant: Variant = Variant()) -> torch.Tensor:
    """PyTorch's own attention in the input dtype: the yardstick of FlashAttention-2's error
    criterion, and task5.attention.attention on a CPU. Rows with no visible key are 0.

    Without softcap and sinks: SDPA with the materialised mask (and the variant's scale).
    With either, SDPA has no argument for them, so it is transformers' eager formula
    (Gemma-2's, GPT-OSS's): scores, scale and softcap in the input dtype, the mask added, the
    sinks concatenated as a last column, softmax in float32 or wider (Gemma-2 upcasts;
    GPT-OSS's own softmax stays in the input dtype, which would only loosen the yardstick),
    P V in the input dtype."""
    import torch.nn.functional as F

    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    keep = keep_mask(batch, heads_q, seq_q, seq_k, variant, device=q.device)
    minus_inf = torch.tensor(float("-inf"), dtype=q.dtype, device=q.device)
    if variant.mask is not None and variant.mask.dtype != torch.bool:
        attn_mask = torch.where(keep, variant.mask.to(q.device, q.dtype), minus_inf)
    else:
        attn_mask = keep
    kk = k.repeat_interleave(group, dim=1) if group > 1 else k
    vv = v.repeat_interleave(group, dim=1) if group > 1 else v
    if variant.softcap is None and variant.sinks is None:
        # The math backend: PyTorch's plain formula in the input dtype (FlashAttention-2's own
        # tests use the same yardstick), and no third-party kernel that compute-sanitizer would
        # report under our tests (cuDNN's SDPA kernels show racecheck hazards of their own).
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=attn_mask,
                                                 scale=variant.scale)
    else:
        scores = torch.matmul(q, kk.transpose(-2, -1)) * softmax_scale(head_dim, variant)
        if variant.softcap is not None:
            scores = torch.tanh(scores / variant.softcap) * variant.softcap
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
        upcast = torch.promote_types(q.dtype, torch.float32)
        if variant.sinks is not None:
            sinks = variant.sinks.to(q.device, q.dtype).reshape(1, heads_q, 1, 1)
            scores = torch.cat([scores, sinks.expand(batch, heads_q, seq_q, 1)], dim=-1)
            scores = scores - scores.amax(dim=-1, keepdim=True)
            probs = torch.softmax(scores, dim=-1, dtype=upcast)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1, dtype=upcast)
        out = torch.matmul(probs.nan_to_num(0.0).to(q.dtype), vv)
    any_key = keep.expand(batch, heads_q, seq_q, seq_k).any(dim=-1, keepdim=True)
    return torch.where(any_key, out.nan_to_num(0.0), torch.zeros((), dtype=q.dtype,
                                                                  device=q.device))


def fa2_criterion(out: torch.Tensor, ref64: torch.Tensor, pytorch_out: torch.Tensor
                  ) -> tuple[bool, float, float]:
    """FlashAttention-2's test: max|out - ref| <= 2 * max|pytorch - ref| + 1e-5.

    Returns (passed, our max error, the bound). NaN/Inf in `out` fails."""
    ours = (out.double() - ref64).abs().max().item() if out.numel() else 0.0
    theirs = (pytorch_out.double() - ref64).abs().max().item() if out.numel() else 0.0
    bound = 2.0 * theirs + 1e-5
    passed = math.isfinite(ours) and bool(torch.isfinite(out).all()) and ours <= bound
    return passed, ours, bound


def check_variant(name: str, run, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  variant: Variant = Variant()):
    """One case against float64 by FlashAttention-2's criterion, run twice.

    `run(out)` computes attention of q, k, v under `variant` into the NaN-poisoned `out`
    (shape and dtype of q) and returns it. Passes when the first result meets
    `fa2_criterion` against `reference_attention_variant`, wrote every element (no NaN left)
    and the second run matches the first bit for bit (a difference is a race)."""
    from common.checks import Check, poisoned_empty

    ref = reference_attention_variant(q, k, v, variant)
    yardstick = pytorch_attention_variant(q, k, v, variant)
    try:
        first = run(poisoned_empty(*q.shape, dtype=q.dtype, device=q.device)).clone()
        second = run(poisoned_empty(*q.shape, dtype=q.dtype, device=q.device))
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
        return Check(name, False, f"raised {type(err).__name__}: {str(err).splitlines()[0][:160]}")
    passed, ours, bound = fa2_criterion(first, ref, yardstick)
    same = bool(torch.equal(first.view(torch.uint8) if first.dtype != torch.float32
                            else first.view(torch.int32),
                            second.view(torch.uint8) if second.dtype != torch.float32
                            else second.view(torch.int32)))
    detail = f"max err {ours:.2e} <= {bound:.2e} (2 x PyTorch {q.dtype} + 1e-5)"
    if not same:
        detail += "; two runs differ (a race?)"
    return Check(name, passed and same, detail if passed else detail.replace("<=", "> bound"))
