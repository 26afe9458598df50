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

    def kwargs(self) -> dict:
        """Keyword arguments of task4.attention.flash_attention / task5's decode."""
        return dict(causal=self.causal, window=self.window, stride=self.stride, mask=self.mask,
                    key_lengths=self.key_lengths, left_padding=self.left_padding)

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


def reference_attention_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                variant: Variant = Variant(),
                                scale: float | None = None) -> torch.Tensor:
    """The truth in float64: q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D] -> [B, H_q, S_q, D].

    Rows that see no key are 0. Runs per (batch, head) group so the float64 scores of one
    query head at a time exist (a [S_q, S_k] matrix)."""
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    if heads_q % heads_kv:
        raise ValueError(f"H_q {heads_q} is not a multiple of H_kv {heads_kv}.")
    group = heads_q // heads_kv
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    keep = keep_mask(batch, heads_q, seq_q, seq_k, variant, device=q.device)
    keep = keep.expand(batch, heads_q, seq_q, seq_k)
    bias = None
    if variant.mask is not None and variant.mask.dtype != torch.bool:
        bias = variant.mask.to(q.device, torch.float64).expand(batch, heads_q, seq_q, seq_k)
    out = torch.zeros(batch, heads_q, seq_q, v.shape[-1], dtype=torch.float64, device=q.device)
    for h in range(heads_q):
        kv = h // group
        scores = (q[:, h].double() @ k[:, kv].double().transpose(-2, -1)) * scale
        if bias is not None:
            scores = scores + torch.where(keep[:, h], bias[:, h], 0.0)
        scores = scores.masked_fill(~keep[:, h], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)   # no visible key: 0
        out[:, h] = probs @ v[:, kv].double()
    return out


def pytorch_attention_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              variant: Variant = Variant()) -> torch.Tensor:
    """PyTorch's own attention in the input dtype (SDPA with the materialised mask): the
    yardstick of FlashAttention-2's error criterion. Rows with no visible key are 0."""
    import torch.nn.functional as F

    batch, heads_q, seq_q, _ = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    keep = keep_mask(batch, heads_q, seq_q, seq_k, variant, device=q.device)
    if variant.mask is not None and variant.mask.dtype != torch.bool:
        attn_mask = torch.where(keep, variant.mask.to(q.device, q.dtype),
                                torch.tensor(float("-inf"), dtype=q.dtype, device=q.device))
    else:
        attn_mask = keep
    kk = k.repeat_interleave(group, dim=1) if group > 1 else k
    vv = v.repeat_interleave(group, dim=1) if group > 1 else v
    # The math backend: PyTorch's plain formula in the input dtype (FlashAttention-2's own
    # tests use the same yardstick), and no third-party kernel that compute-sanitizer would
    # report under our tests (cuDNN's SDPA kernels show racecheck hazards of their own).
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=attn_mask)
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
