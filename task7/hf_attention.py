"""Our kernels as a Hugging Face attention implementation, so stock `generate` runs on them.

    from task7.hf_attention import use_course_attention
    use_course_attention(model)          # model.generate(...) now calls our kernels

transformers (4.48 and later) looks attention up by name: each attention layer calls
`ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, query, key, value,
attention_mask, scaling=..., dropout=..., **kwargs)` with query [B, H_q, Sq, D] and key/value
[B, H_kv, Sk, D] (the cache already updated, H_kv < H_q under grouped-query attention), and
expects (output [B, Sq, H_q, D], weights). `register()` adds `course_attention_forward` under
the name "course_kernels". Every call that the kernels can take runs on one entry,
`task5.attention.attention` (common/variants.py describes what it computes): GQA/MQA with the
KV heads as they are (never repeated), Sq != Sk with bottom-right causal (a continuation after
a cache, chunked prefill, decode), sliding windows, left-padded batches, and any mask tensor.

The mask is the delicate part: attention must never silently lose causality or padding.
  * transformers >= 4.53 builds masks per implementation name (ALL_MASK_ATTENTION_FUNCTIONS)
    and, for a name it does not know, builds *no mask at all*. So `register()` gives our name
    SDPA's mask function (`sdpa_mask`: a bool [B, 1, Sq, Sk] mask, True = keep, or None), and
    our function follows SDPA's conventions exactly: a mask of None means "purely causal" for
    several queries (is_causal; transformers returns None only where top-left and bottom-right
    agree, or for an empty static cache, whose tail keys it cuts off as its SDPA path does) and
    "every key" for one query. The window of a sliding layer (Mistral; Qwen2's sliding layers:
    key j visible iff j > i - sliding_window, transformers' `sliding_window_overlay`) is inside
    the mask whenever it matters; with no mask the `sliding_window` kwarg is applied as
    FlashAttention-2's integration applies it.
  * transformers 4.48-4.52 hands every implementation but sdpa/flash a 4D additive float mask
    (0 = keep, dtype minimum = masked) that already holds causality, window and padding.

How a call runs (the "plan"; `plan_attention` returns it):

  | query / mask                                   | runs                                          |
  |------------------------------------------------|-----------------------------------------------|
  | no mask, Sq == 1 (decode)                      | kernels: every key (+ sliding_window kwarg)   |
  | no mask, Sq > 1, causal module                 | kernels: causal (+ window); keys past Sq of an|
  |                                                | empty static cache cut off, as sdpa does      |
  | no mask, not causal                            | kernels: every key                            |
  | mask == causal/non-causal + window + per-      | kernels, structured: causal, window,          |
  |   sequence key range (left padding, or a       |   key_lengths (left_padding=True/False); key  |
  |   static cache's filled prefix), GQA, Sq != Sk |   tiles outside the pattern are skipped       |
  | any other keep/drop mask (bool, or float 0 /   | kernels with the bool mask tensor, read tile  |
  |   very negative), e.g. static cache + padding  |   by tile (plus the causal/key range it lies  |
  |                                                |   in, so empty tiles are still skipped)       |
  | a float mask that is a real bias               | kernels with the additive float mask          |
  | `position_bias` (T5-style, 5.x)                | kernels with bias merged into a float mask    |
  | softcap (Gemma 2), attention sinks (s_aux,     | kernels, with softcap= / sinks= / scale= on   |
  |   GPT-OSS), a scaling other than 1/sqrt(D)     |   whichever plan the mask gives               |
  |   (Gemma's query_pre_attn_scalar)              |                                               |
  | dropout > 0 while training                     | fallback: SDPA with dropout_p                 |
  | head_dim > 256 or not a multiple of 8 (> 128   | fallback: SDPA                                |
  |   where autograd needs a gradient), key /      |                                               |
  |   value head dims differ, dtype not fp32/fp16/ |                                               |
  |   bf16 or q/k/v dtypes differ                  |                                               |
  | head_mask; sinks that require grad while grad  | fallback: the eager formula (with softcap and |
  |   is enabled (the kernels' backward has none)  |   sinks, as transformers' eager)              |

Every fallback is counted with its reason: `fallback_counts()`, `reset_counters()`,
`call_counts()` (calls per route); `python -m task7.models` prints and records them.

A structured plan is found by reading the mask once: the range of keys each sequence ever sees
and its widest row give the only candidates (causal or not, left-padded or prefix key range,
no window or the widest row as the window); the candidate whose keep-mask equals the given
mask exactly is used, else the mask itself goes to the kernel. A decode step's mask (one query
row) is asked less: whether each row is one run of kept keys ending at the last key or starting
at the first. The verdict needs one host read (a sync; two for a decode mask with no single key
range); transformers passes the same mask object to every layer of a forward pass (two for a
hybrid sliding/full model), so verdicts are cached per mask object.
CPU tensors follow the same plan; `task5.attention.attention` runs its PyTorch twin there.
"""

from __future__ import annotations

import importlib
import math
import weakref
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from common import limits

NAME = "course_kernels"   # no "flash"/"sdpa" in it: transformers treats those names specially
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# An additive float mask is a keep/drop mask when every value is 0 or at most this (transformers
# uses the dtype's minimum, -inf, or -1e4 in old code); anything else is a bias.
MASKED_BELOW = -1e4


# --- counters ---------------------------------------------------------------------------------

_FALLBACKS: Counter = Counter()     # reason -> calls that ran on the fallback
_ROUTES: Counter = Counter()        # "structured" / "mask" / "fallback" -> calls


def reset_counters() -> None:
    """Zero the fallback and route counters (call before the run you want to count)."""
    _FALLBACKS.clear()
    _ROUTES.clear()


def fallback_counts() -> dict[str, int]:
    """{reason: calls} of the attention calls that did not run on our kernels since the reset."""
    return dict(_FALLBACKS)


def fallback_total() -> int:
    return sum(_FALLBACKS.values())


def call_counts() -> dict[str, int]:
    """{route: calls} since the reset: 'structured' and 'mask' ran on the kernels."""
    return dict(_ROUTES)


def _count_fallback(reason: str) -> None:
    _FALLBACKS[reason] += 1
    _ROUTES["fallback"] += 1


# --- the plan ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """How one attention call runs.

    kind: 'structured' (kernels; causal / window / key_lengths describe the mask exactly),
          'mask' (kernels; `mask` is passed as well: bool keep-mask or additive float), or
          'fallback' (SDPA or the eager formula; `reason` says why).
    key_len: use keys [0, key_len) only (an empty static cache's tail, as transformers' sdpa).
    """

    kind: str
    causal: bool = False
    window: int = 0                             # 0: no window
    key_lengths: torch.Tensor | None = None     # [B] int32 on the query's device
    left_padding: bool = False
    mask: torch.Tensor | None = None
    key_len: int | None = None
    reason: str = ""

    def kernel_kwargs(self) -> dict:
        """Keyword arguments of task5.attention.attention (window None = no window)."""
        return dict(causal=self.causal, window=self.window or None, mask=self.mask,
                    key_lengths=self.key_lengths, left_padding=self.left_padding)

    def describe(self) -> str:
        parts = [self.kind, "causal" if self.causal else "full"]
        if self.window:
            parts.append(f"window {self.window}")
        if self.key_lengths is not None:
            parts.append("left-padded keys" if self.left_padding else "key prefix lengths")
        if self.mask is not None:
            parts.append(f"{'bool' if self.mask.dtype == torch.bool else 'float'} mask")
        if self.key_len is not None:
            parts.append(f"keys [0, {self.key_len})")
        return ", ".join(parts) + (f" ({self.reason})" if self.reason else "")


def _as_4d(mask: torch.Tensor) -> torch.Tensor:
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask


def _keep_candidates(batch: int, seq_q: int, seq_k: int, begin: torch.Tensor, end: torch.Tensor,
                     width: torch.Tensor):
    """The structured patterns a mask can be: yields (causal, left_padding, windowed, keep).

    begin/end [b]: first visible key / one past the last of each sequence; width: the widest
    row (a 0-d tensor, the window candidate). keep is [b, 1, Sq, Sk] bool, common/variants.py's
    keep_mask for that description (written here with a tensor window, so no host read)."""
    b = begin.shape[0]
    rows = torch.arange(seq_q, device=begin.device).view(1, 1, seq_q, 1)
    cols = torch.arange(seq_k, device=begin.device).view(1, 1, 1, seq_k)
    begin4, end4 = begin.view(b, 1, 1, 1), end.view(b, 1, 1, 1)
    for left_padding in (True, False):
        # left padding: keys [begin, Sk), queries the last Sq of Sk; else keys [0, end).
        lo = begin4 if left_padding else torch.zeros_like(begin4)
        hi = torch.full_like(end4, seq_k) if left_padding else end4
        in_range = (cols >= lo) & (cols < hi)
        pos = rows + (hi - seq_q)                     # absolute query positions
        causal = in_range & (cols <= pos)
        yield True, left_padding, False, causal
        yield True, left_padding, True, causal & (cols > pos - width)
        yield False, left_padding, False, in_range.expand(b, 1, seq_q, seq_k)


def _seen_keys(keep: torch.Tensor, seq_k: int):
    """keep [b, h, Sq, Sk] -> (seen [b, Sk]: the keys some row of b sees, any_seen [b], begin
    [b]: the first of them, or Sk where none is)."""
    seen = keep.any(dim=2).any(dim=1)
    any_seen = seen.any(dim=-1)
    return seen, any_seen, torch.where(any_seen, seen.to(torch.uint8).argmax(dim=-1), seq_k)


def _plan_decode(keep: torch.Tensor, batch: int, seq_k: int) -> Plan:
    """One query row per sequence (a decode step), bool mask [b, h, 1, Sk]. The row is
    structured iff its visible keys are one contiguous range ending at the last key (left
    padding; causal and any window only shorten the range) or starting at key 0 (a static
    cache's filled prefix), the same for every head. A range ending at the last key is a row
    that never goes from True to False (non-decreasing; an empty row is one too), one starting
    at key 0 a row that never goes from False to True and keeps key 0; either way its length is
    its count of True. This runs once per decode step, so it asks the GPU as little as it can:
    about ten small ops and one host read (two where there is no single key range)."""
    row = keep[:, :1, 0, :]                           # [b, 1, Sk]: the first head's row
    earlier, later = row[..., :-1], row[..., 1:]
    checks = [(earlier <= later).all(), (earlier >= later).all(),
              row[..., 0].all(), row[..., -1].all()]
    if keep.shape[1] > 1:
        checks.append((keep == keep[:, :1]).all())
    flags = torch.stack(checks).tolist()              # the one host read
    left_ok, prefix_rows, first_kept, last_kept = flags[:4]
    right_ok = prefix_rows and first_kept             # a prefix in every row, none empty
    if all(flags[4:]) and (left_ok or right_ok):
        every_key = first_kept if left_ok else last_kept
        kl = (None if every_key
              else row.sum(dim=-1).reshape(-1).to(torch.int32).expand(batch).contiguous())
        return Plan("structured", causal=True, key_lengths=kl,
                    left_padding=bool(left_ok) and kl is not None,
                    reason="decode mask is one key range")
    # No single key range (or heads that differ): the mask itself, and the first key any head
    # sees as a left-padded key range, so that the kernel skips the tiles before it.
    _, _, begin = _seen_keys(keep, seq_k)
    lengths = (None if bool((begin == 0).all())
               else (seq_k - begin).to(torch.int32).expand(batch).contiguous())
    return Plan("mask", causal=True, mask=keep, key_lengths=lengths,
                left_padding=lengths is not None, reason="keep/drop mask with no structured pattern")


def plan_from_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> Plan:
    """What a given mask allows (one host read; two for a decode mask with no single key
    range). mask: bool or float, broadcastable to [B, H_q, Sq, Sk] after its last dimension is
    cut to Sk (older transformers pass longer)."""
    batch, heads, seq_q = query.shape[:3]
    seq_k = key.shape[2]
    if mask.shape[-1] < seq_k:
        return Plan("fallback", reason="mask shape")
    mask = _as_4d(mask[..., :seq_k])
    try:
        torch.broadcast_shapes(mask.shape, (batch, heads, seq_q, seq_k))
    except RuntimeError:
        return Plan("fallback", reason="mask shape")
    if mask.shape[0] not in (1, batch) or mask.shape[2] not in (1, seq_q):
        return Plan("fallback", reason="mask shape")
    if mask.dtype == torch.bool:
        keep, keep_drop = mask, None
    elif mask.is_floating_point():
        keep = mask == 0
        keep_drop = (keep | (mask <= MASKED_BELOW)).all()
    else:
        return Plan("fallback", reason=f"mask dtype {str(mask.dtype).replace('torch.', '')}")

    if seq_q == 1 and keep_drop is None:
        return _plan_decode(keep, batch, seq_k)
    b = keep.shape[0]
    seen, any_seen, begin = _seen_keys(keep, seq_k)
    end = torch.where(any_seen, seq_k - seen.flip(-1).to(torch.uint8).argmax(dim=-1), 0)
    width = keep.sum(dim=-1).amax()
    candidates = list(_keep_candidates(b, seq_q, seq_k, begin, end, width))
    flags = [(cand == keep).all() for *_, cand in candidates]
    # Which causal/key-range the mask at least lies within, for the mask route's tile skipping.
    causal_left = candidates[0][3]
    within_causal = ~(keep & ~causal_left).any()
    full_left = (begin == 0).all()
    full_right = (end == seq_k).all()
    extra = [within_causal, full_left, full_right, width]
    if keep_drop is not None:
        extra.append(keep_drop)
    verdict = torch.stack([f.to(torch.int64) for f in flags] + [e.to(torch.int64) for e in extra])
    verdict = verdict.tolist()                        # the one host read
    n = len(flags)
    within, all_begin0, all_end_sk, widest = verdict[n:n + 4]
    is_keep_drop = bool(verdict[n + 4]) if keep_drop is not None else True

    def lengths(left: bool) -> torch.Tensor | None:
        if (all_begin0 if left else all_end_sk):
            return None
        values = (seq_k - begin) if left else end
        return values.to(torch.int32).expand(batch).contiguous()

    if is_keep_drop:
        for ok, (causal, left, windowed, _) in zip(verdict[:n], candidates, strict=True):
            if not ok:
                continue
            window = int(widest) if windowed else 0
            if windowed and (window < 1 or window >= seq_k):
                continue       # the window hides nothing the other candidates would not
            kl = lengths(left)
            return Plan("structured", causal=causal, window=window, key_lengths=kl,
                        left_padding=left and kl is not None,
                        reason="mask is exactly this pattern")
        # The kernel ANDs everything it is given: the causal triangle and the key range the
        # mask lies in are exact, and let it skip the tiles the mask leaves empty.
        kl = lengths(True)
        return Plan("mask", causal=bool(within), mask=keep, key_lengths=kl,
                    left_padding=kl is not None,
                    reason="keep/drop mask with no structured pattern")
    # A real bias: the kernel adds it to the scaled scores (-inf drops a key).
    bias = mask if mask.dtype in (torch.float32, query.dtype) else mask.float()
    return Plan("mask", mask=bias, reason="additive float bias")


def plan_attention(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                   is_causal: bool, sliding_window: int | None = None) -> Plan:
    """The plan for one call, following transformers' SDPA conventions for `attention_mask`."""
    seq_q, seq_k = query.shape[2], key.shape[2]
    if attention_mask is not None:
        return plan_from_mask(attention_mask, query, key)
    window = int(sliding_window or 0)
    if seq_q == 1:
        return Plan("structured", causal=bool(is_causal), window=window if is_causal else 0,
                    reason="one query, no mask: every key")
    if not is_causal:
        return Plan("structured", causal=False, reason="no mask, not causal: every key")
    if seq_k >= seq_q:
        # No mask with several queries means causal, aligned top-left like SDPA's is_causal;
        # keys beyond the queries (an empty static cache's tail) are cut off, as transformers'
        # own sdpa_attention_forward does. Then top-left = bottom-right.
        return Plan("structured", causal=True, window=window,
                    key_len=seq_q if seq_k > seq_q else None, reason="no mask: causal")
    # Fewer keys than queries under SDPA's top-left is_causal: that triangle as a mask.
    tril = torch.ones(seq_q, seq_k, dtype=torch.bool, device=query.device).tril()
    if window:
        tril &= ~torch.ones(seq_q, seq_k, dtype=torch.bool, device=query.device).tril(-window)
    return Plan("mask", mask=tril[None, None], reason="no mask, causal top-left, Sk < Sq")


# Verdicts per mask object (one forward pass uses one or two masks: full and sliding layers).
_CACHE_SIZE = 4
_cache: list[tuple[weakref.ref, tuple, Plan]] = []


def _cached_plan(query, key, attention_mask, is_causal, sliding_window) -> Plan:
    if attention_mask is None:
        return plan_attention(query, key, None, is_causal, sliding_window)
    sig = (tuple(query.shape[:3]), key.shape[2], query.dtype, query.device,
           attention_mask._version, tuple(attention_mask.shape), attention_mask.stride())
    for ref, cached_sig, plan in _cache:
        if ref() is attention_mask and cached_sig == sig:
            return plan
    plan = plan_attention(query, key, attention_mask, is_causal, sliding_window)
    _cache.insert(0, (weakref.ref(attention_mask), sig, plan))
    del _cache[_CACHE_SIZE:]
    return plan


def _kernel_refusal(query, key, value) -> str | None:
    """Why the kernels cannot take these tensors (a fallback reason), or None if they can."""
    if query.dtype not in KERNEL_DTYPES:
        return f"dtype {str(query.dtype).replace('torch.', '')}"
    if not query.dtype == key.dtype == value.dtype:
        return "query, key and value dtypes differ"
    head_dim = query.shape[-1]
    if not limits.supports(head_dim):
        return f"head_dim {head_dim} (kernels: {limits.describe()})"
    if key.shape[-1] != head_dim or value.shape[-1] != head_dim:
        return "key/value head_dim differs from the query's"
    if head_dim > limits.BACKWARD_MAX_HEAD_DIM and torch.is_grad_enabled() and any(
            t.requires_grad for t in (query, key, value)):
        return f"head_dim {head_dim} with a gradient (backward: up to {limits.BACKWARD_MAX_HEAD_DIM})"
    return None


# --- fallbacks --------------------------------------------------------------------------------

def _repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def sdpa_fallback(query, key, value, attention_mask, scaling, dropout, is_causal) -> torch.Tensor:
    """Exactly what transformers' sdpa_attention_forward computes, [B, H_q, Sq, D]."""
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is not None:
        attention_mask = attention_mask[..., :k_len]
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    causal = q_len > 1 and attention_mask is None and is_causal
    if causal and k_len > q_len:
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                          dropout_p=dropout, scale=scaling, is_causal=causal)


def eager_fallback(query, key, value, attention_mask, scaling, dropout, is_causal, *,
                   softcap=None, s_aux=None, head_mask=None, training=False) -> torch.Tensor:
    """transformers' eager formula with softcap (Gemma 2), sinks (GPT-OSS) and head_mask."""
    q_len, k_len = query.shape[2], key.shape[2]
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        m = attention_mask[..., :k_len]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m
    elif is_causal and q_len > 1:       # SDPA's top-left is_causal
        keep = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if s_aux is not None:
        sinks = s_aux.reshape(1, -1, 1, 1).to(scores.dtype).expand(scores.shape[0], -1, q_len, 1)
        scores = torch.cat([scores, sinks], dim=-1)
        scores = scores - scores.max(dim=-1, keepdim=True).values
        probs = torch.softmax(scores, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    probs = probs.nan_to_num(0.0)
    if head_mask is not None:
        probs = probs * head_mask
    probs = F.dropout(probs, p=dropout, training=training and dropout > 0)
    return torch.matmul(probs.to(value.dtype), value)


def _position_bias_mask(position_bias, attention_mask, is_causal, query, key) -> torch.Tensor:
    """transformers' create_position_bias_mask (5.x): the bias and the mask as one float mask."""
    if attention_mask is None:
        if is_causal and query.shape[2] > 1:
            q_len, k_len = query.shape[2], key.shape[2]
            keep = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril()
            return torch.where(keep, position_bias, float("-inf"))
        return position_bias
    attention_mask = attention_mask[..., :key.shape[2]]
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, position_bias, float("-inf"))
    return position_bias + attention_mask


# --- the attention function -------------------------------------------------------------------

def _attention_entry():
    # Imported when first used: this module must import where the extensions are absent.
    return importlib.import_module("task5.attention").attention


def course_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None,
                             scaling: float | None = None, dropout: float = 0.0,
                             is_causal: bool | None = None, **kwargs):
    """The attention function registered as "course_kernels" -> (output [B, Sq, H_q, D], None)."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"query, key and value must be [B, H, S, D]; got {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}.")
    if key.shape[:3] != value.shape[:3] or query.shape[0] != key.shape[0]:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} do not match "
                         f"each other or the query {tuple(query.shape)}.")
    if key.shape[2] < 1:
        raise ValueError("key and value are empty; attention needs at least one key.")
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads are not a multiple of {key.shape[1]} "
                         "key/value heads.")

    head_dim = query.shape[-1]
    default_scale = 1.0 / math.sqrt(head_dim)
    scaling = default_scale if scaling is None else float(scaling)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    training = bool(getattr(module, "training", False))
    dropout = float(dropout or 0.0) if training else 0.0
    softcap, s_aux = kwargs.get("softcap"), kwargs.get("s_aux")
    if "softcap" not in kwargs:     # a model that keeps it in its config only
        softcap = getattr(getattr(module, "config", None), "attn_logit_softcapping", None)
    head_mask = kwargs.get("head_mask")
    position_bias = kwargs.get("position_bias")

    reason = None
    if s_aux is not None and s_aux.requires_grad and torch.is_grad_enabled():
        reason = "attention sinks (s_aux) that require grad"
    elif head_mask is not None:
        reason = "head_mask"
    elif dropout > 0:
        reason = "dropout in training"
    else:
        reason = _kernel_refusal(query, key, value)
    plan = None
    if reason is None:
        if position_bias is not None:
            merged = _position_bias_mask(position_bias, attention_mask, is_causal, query, key)
            plan = Plan("mask", mask=merged if merged.dtype in (torch.float32, query.dtype)
                        else merged.float(), reason="position_bias")
        else:
            plan = _cached_plan(query, key, attention_mask, is_causal,
                                kwargs.get("sliding_window"))
        if plan.kind == "fallback":
            reason = plan.reason

    if reason is not None:
        _count_fallback(reason)
        if softcap is not None or s_aux is not None or head_mask is not None:
            out = eager_fallback(query, key, value, attention_mask, scaling, dropout, is_causal,
                                 softcap=softcap, s_aux=s_aux, head_mask=head_mask,
                                 training=training)
        else:
            if position_bias is not None:
                attention_mask = _position_bias_mask(position_bias, attention_mask, is_causal,
                                                     query, key)
            out = sdpa_fallback(query, key, value, attention_mask, scaling, dropout, is_causal)
        return out.transpose(1, 2).contiguous(), None

    _ROUTES[plan.kind] += 1
    # The kernels scale by 1/sqrt(D) unless given another scale (Gemma's query_pre_attn_scalar,
    # GPT-2's scale_attn_by_inverse_layer_idx or scale_attn_weights=False): scale= then, so
    # that q is not rounded once more. Softcap (Gemma 2: the scaled scores -> c * tanh(s / c))
    # and sinks (GPT-OSS's s_aux, [H_q]: exp(sink) joins each row's denominator) go to the
    # kernels as they are.
    scores = {}
    if not math.isclose(scaling, default_scale, rel_tol=1e-9):
        scores["scale"] = scaling
    if softcap is not None:
        scores["softcap"] = float(softcap)
    if s_aux is not None:
        scores["sinks"] = s_aux.detach().reshape(-1)
    if plan.key_len is not None:
        key, value = key[:, :, :plan.key_len], value[:, :, :plan.key_len]
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    out = _attention_entry()(query, key, value, **plan.kernel_kwargs(), **scores)
    return out.transpose(1, 2).contiguous(), None


# --- registration -----------------------------------------------------------------------------

def register(name: str = NAME) -> str:
    """Register our attention (and SDPA's mask semantics) under `name`; returns the name."""
    import transformers
    from transformers import modeling_utils

    interface = getattr(modeling_utils, "AttentionInterface", None)
    if interface is not None and hasattr(interface, "register"):     # transformers >= 4.50
        interface.register(name, course_attention_forward)
    else:                                                            # 4.48, 4.49: a dict
        modeling_utils.ALL_ATTENTION_FUNCTIONS[name] = course_attention_forward
    try:                                                             # transformers >= 4.53
        import transformers.masking_utils as masking
    except ImportError:
        return name  # 4.48-4.52: models build a full 4D mask for every other implementation name
    interface = getattr(masking, "AttentionMaskInterface", None)
    functions = getattr(masking, "ALL_MASK_ATTENTION_FUNCTIONS", None)
    if interface is None or functions is None or "sdpa" not in functions:
        # This version builds masks by implementation name in a way we do not know: refuse
        # rather than risk transformers passing no mask at all.
        raise RuntimeError(f"transformers {getattr(transformers, '__version__', '?')} builds masks "
                           "without an AttentionMaskInterface that task7 knows; use "
                           "attn_implementation='sdpa' with this version.")
    # Without this, create_causal_mask() returns None for an unknown name: the causal and
    # padding masks would be dropped without a word.
    interface.register(name, functions["sdpa"])
    return name


def set_attention(model, name: str) -> None:
    """Switch a loaded model's attention implementation ("eager", "sdpa", NAME, ...)."""
    if hasattr(model, "set_attn_implementation"):                   # transformers >= 4.56
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    if model.config._attn_implementation != name:
        raise RuntimeError(f"Could not switch {type(model).__name__} to attention {name!r} "
                           f"(it reports {model.config._attn_implementation!r}); this "
                           "transformers version may not dispatch it through ALL_ATTENTION_FUNCTIONS.")


def use_course_attention(model) -> None:
    """Register our kernels and switch `model` to them: stock generate() now runs on them."""
    set_attention(model, register())
