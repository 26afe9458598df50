"""Our kernels as a Hugging Face attention implementation, so stock `generate` runs on them.

    from task7.hf_attention import use_course_attention
    use_course_attention(model)          # model.generate(...) now calls our kernels

transformers (4.48 and later) looks attention up by name: each attention layer calls
`ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, query, key, value,
attention_mask, scaling=..., dropout=..., **kwargs)` with query [B, H, Sq, D] and key/value
[B, H, Sk, D] (the cache already updated), and expects (output [B, Sq, H, D], weights).
`register()` adds `course_attention_forward` under the name "course_kernels".

The mask is the delicate part: attention must never silently lose causality or padding.
  * transformers >= 4.53 builds masks per implementation name (ALL_MASK_ATTENTION_FUNCTIONS)
    and, for a name it does not know, builds *no mask at all*. So `register()` also gives
    our name SDPA's mask function, and our function follows SDPA's conventions exactly:
    a mask of None means "purely causal" for several queries (is_causal, top-left aligned,
    keys past the queries cut off as transformers' SDPA path does) and "every key" for one.
  * transformers 4.48-4.52 hands every implementation but sdpa/flash a 4D float mask
    (0 = keep, a large negative = masked) that already holds causality and padding.
Whatever arrives, the fast path is taken only when the mask is provably what the kernel
computes; anything else (padding inside a prefill, a custom pattern, a bias) goes to
PyTorch's SDPA with the mask, exactly as transformers' own "sdpa" implementation would.

  | query / mask                          | runs                                              |
  |---------------------------------------|---------------------------------------------------|
  | Sq == Sk > 1, no mask (causal module) | task 4 flash_attention(causal=True)               |
  | Sq == Sk > 1, mask == lower triangle  | task 4 flash_attention(causal=True)               |
  | Sq == 1, no mask                      | task 5 decode_attention_bhsd(seq_len=Sk)          |
  | Sq == 1, mask keeps a prefix per row  | task 5 decode_attention_bhsd(seq_len=[B] lengths) |
  | anything else (padding, bias, ...)    | torch SDPA with the mask                          |

Inspecting a mask reads it on the host (one sync); transformers passes the same mask
object to every layer of a forward pass, so the verdict is cached for that object.
CPU tensors follow the same plan with the PyTorch versions of the operations (task7/ops.py).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from task7.ops import kernel_ops, torch_ops

NAME = "course_kernels"   # no "flash"/"sdpa" in it: transformers treats those names specially
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_KERNEL_HEAD_DIM = 128
# An additive float mask is a keep/drop mask when every value is 0 or hugely negative.
MASKED_BELOW = -1e4
UNSUPPORTED_KWARGS = ("softcap", "sliding_window", "s_aux", "position_bias", "head_mask")


@dataclass(frozen=True)
class Plan:
    """How one attention call runs: 'flash' (task 4), 'decode' (task 5) or 'sdpa' (fallback)."""

    kind: str
    causal: bool = False
    key_len: int | None = None                  # flash: use keys [0, key_len) only
    seq_len: int | torch.Tensor | None = None   # decode: visible cache length(s)
    reason: str = ""


def _as_keep(mask: torch.Tensor, key_len: int) -> torch.Tensor | None:
    """Boolean keep-mask from a bool or additive float mask, 4D; None if it is a real bias."""
    mask = mask[..., :key_len]   # older transformers pass masks longer than the keys
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if mask.dtype == torch.bool:
        return mask
    keep = mask == 0
    if not bool((keep | (mask <= MASKED_BELOW)).all()):
        return None
    return keep


def plan_from_mask(mask: torch.Tensor, q_len: int, k_len: int, batch: int) -> Plan:
    """Decide what a given mask allows (reads the mask on the host)."""
    if mask.shape[-1] < k_len:
        return Plan("sdpa", reason=f"mask covers {mask.shape[-1]} of {k_len} keys")
    keep = _as_keep(mask, k_len)
    if keep is None:
        return Plan("sdpa", reason="float mask with values other than 0 / -inf (a bias)")
    if q_len == 1:
        # Decode: the kernel attends to positions [0, seq_len) of each sequence, so the mask
        # must keep a non-empty prefix, the same for every head. A static cache gives that;
        # left padding does not (it masks the *first* keys) and goes to SDPA.
        lengths = keep.sum(dim=-1)                                          # [b, h, 1]
        prefix = torch.arange(k_len, device=keep.device) < lengths.unsqueeze(-1)
        ok = (keep == prefix).all() & (lengths >= 1).all() & (lengths == lengths[:, :1]).all()
        if not bool(ok):
            return Plan("sdpa", reason="decode mask is not a prefix of the cache")
        per_batch = lengths[:, 0, 0].to(torch.int32).expand(batch).contiguous()
        if bool((per_batch == k_len).all()):
            return Plan("decode", seq_len=k_len, reason="mask keeps every key")
        return Plan("decode", seq_len=per_batch, reason="mask keeps a prefix of the cache")
    if q_len == k_len:
        tril = torch.ones(q_len, k_len, dtype=torch.bool, device=keep.device).tril()
        if bool((keep == tril).all()):
            return Plan("flash", causal=True, reason="mask is exactly causal")
        if bool(keep.all()):
            return Plan("flash", causal=False, reason="mask keeps everything")
    return Plan("sdpa", reason="mask is not purely causal (padding or a custom pattern)")


def plan_attention(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                   is_causal: bool) -> Plan:
    """The plan for one call, following transformers' SDPA conventions for `attention_mask`."""
    batch, q_len, k_len = query.shape[0], query.shape[2], key.shape[2]
    if attention_mask is not None:
        return plan_from_mask(attention_mask, q_len, k_len, batch)
    if k_len < q_len:
        return Plan("sdpa", reason="fewer keys than queries")
    if q_len == 1:
        return Plan("decode", seq_len=k_len, reason="one query, no mask: every key")
    if is_causal:
        # No mask with several queries means causal, aligned top-left like SDPA's is_causal;
        # keys beyond the queries (an empty static cache's tail) are cut off, as transformers'
        # own sdpa_attention_forward does.
        return Plan("flash", causal=True, key_len=q_len if k_len > q_len else None,
                    reason="no mask: causal")
    if q_len == k_len:
        return Plan("flash", causal=False, reason="no mask, not causal")
    return Plan("sdpa", reason="no mask, not causal, fewer queries than keys")


# One mask object serves every layer of a forward pass: remember the last verdict.
_last: dict = {}


def _cached_plan(query, key, attention_mask, is_causal) -> Plan:
    if attention_mask is None:
        return plan_attention(query, key, None, is_causal)
    sig = (query.shape[0], query.shape[2], key.shape[2], is_causal, attention_mask._version)
    ref = _last.get("mask")
    if ref is not None and ref() is attention_mask and _last.get("sig") == sig:
        return _last["plan"]
    plan = plan_attention(query, key, attention_mask, is_causal)
    _last.update(mask=weakref.ref(attention_mask), sig=sig, plan=plan)
    return plan


def _kernel_can_run(query, key, value, dropout: float) -> str | None:
    """Why the kernels cannot take these tensors, or None if they can."""
    if query.dtype not in KERNEL_DTYPES:
        return f"dtype {query.dtype}"
    if not query.dtype == key.dtype == value.dtype:
        return "query, key and value dtypes differ"
    head_dim = query.shape[-1]
    if head_dim % 8 or head_dim > MAX_KERNEL_HEAD_DIM or value.shape[-1] != head_dim:
        return f"head_dim {head_dim} (the kernels take multiples of 8 up to 128)"
    if query.shape[1] != key.shape[1]:
        return "grouped-query attention (fewer key heads than query heads)"
    if any(t.stride(-1) != 1 for t in (query, key, value)):
        return "a last dimension that is not contiguous"
    if dropout > 0:
        return "dropout"
    return None


def sdpa_fallback(query, key, value, attention_mask, scaling, dropout, is_causal) -> torch.Tensor:
    """Exactly what transformers' sdpa_attention_forward computes, [B, H, Sq, D]."""
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is not None:
        attention_mask = attention_mask[..., :k_len]
    if query.shape[1] != key.shape[1]:
        repeat = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    causal = q_len > 1 and attention_mask is None and is_causal
    if causal and k_len > q_len:
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                          dropout_p=dropout, scale=scaling, is_causal=causal)


def course_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None,
                             scaling: float | None = None, dropout: float = 0.0,
                             is_causal: bool | None = None, **kwargs):
    """The attention function registered as "course_kernels" -> (output [B, Sq, H, D], None)."""
    for name in UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(f"attn_implementation={NAME!r} does not support {name}; load the "
                             "model with attn_implementation='eager' or 'sdpa' instead.")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"query, key and value must be [B, H, S, D]; got {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}.")
    if key.shape[:3] != value.shape[:3] or query.shape[0] != key.shape[0]:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} do not match "
                         f"each other or the query {tuple(query.shape)}.")
    if key.shape[2] < 1:
        raise ValueError("key and value are empty; attention needs at least one key.")

    head_dim = query.shape[-1]
    default_scale = 1.0 / math.sqrt(head_dim)
    scaling = default_scale if scaling is None else float(scaling)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    dropout = dropout if getattr(module, "training", False) else 0.0

    plan = None
    if _kernel_can_run(query, key, value, dropout) is None:
        plan = _cached_plan(query, key, attention_mask, is_causal)
    if plan is None or plan.kind == "sdpa":
        out = sdpa_fallback(query, key, value, attention_mask, scaling, dropout, is_causal)
        return out.transpose(1, 2).contiguous(), None

    # The kernels scale by 1/sqrt(D); another scale (e.g. GPT-2's scale_attn_by_inverse_layer_idx)
    # is applied to q first, which multiplies every score by the same factor.
    if not math.isclose(scaling, default_scale, rel_tol=1e-9):
        query = query * (scaling / default_scale)
    ops = kernel_ops() if query.is_cuda else torch_ops()
    if plan.kind == "flash":
        if plan.key_len is not None:
            key, value = key[:, :, :plan.key_len], value[:, :, :plan.key_len]
        out = ops.flash_attention(query, key, value, causal=plan.causal)
    else:  # decode
        seq_len = plan.seq_len
        if isinstance(seq_len, torch.Tensor) and seq_len.device != query.device:
            seq_len = seq_len.to(query.device)
        out = ops.decode_attention_bhsd(query, key, value, seq_len)
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
