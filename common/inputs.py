"""Argument checks for the attention modules: one clear Python error per mistake.

The modules of tasks 1 and 3 call these at their boundary (the constructor and the start of
forward), outside the code a student writes, so a wrong call fails with a sentence that says
what to change instead of a torch error from deep inside a matrix product (or, worse, a
silently wrong result). ValueError for a wrong value or shape, TypeError for a wrong type
or dtype.
"""

from __future__ import annotations

import math
import numbers
import weakref

import torch

from common.limits import check_head_dim


def is_int(value) -> bool:
    """A Python int, and not a bool (which Python counts as an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_flag(value, name: str) -> None:
    """`value` is True or False (a flag such as causal), else a TypeError naming it."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__} {value!r}.")


def check_positive_number(value, name: str) -> None:
    """`value` is None or a positive, finite real number (not a bool), else a sentence naming
    it: TypeError for another type, ValueError for zero, a negative, inf or NaN."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number or None, not {type(value).__name__} "
                        f"{value!r}.")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive, finite number or None, got {value}.")


def check_heads(hidden_dim, num_heads) -> int:
    """hidden_dim and num_heads are positive integers and num_heads divides hidden_dim;
    returns head_dim."""
    for name, value in (("hidden_dim", hidden_dim), ("num_heads", num_heads)):
        if not is_int(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}.")
        if value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value}.")
    if hidden_dim % num_heads != 0:
        raise ValueError(f"hidden_dim {hidden_dim} is not divisible by num_heads {num_heads}: "
                         "each head takes hidden_dim / num_heads features; choose num_heads "
                         "among the divisors of hidden_dim.")
    return hidden_dim // num_heads


def check_weights(weights: dict[str, torch.Tensor], hidden_dim: int) -> None:
    """Every projection is a [hidden_dim, hidden_dim] tensor, all of one dtype on one device."""
    for name, w in weights.items():
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}.")
        if tuple(w.shape) != (hidden_dim, hidden_dim):
            raise ValueError(f"{name} has shape {tuple(w.shape)}, but the projections are "
                             f"[hidden_dim, hidden_dim] = [{hidden_dim}, {hidden_dim}].")
        if not w.is_floating_point():
            raise TypeError(f"{name} has dtype {w.dtype}; the projections must be floating point.")
    first_name, first = next(iter(weights.items()))
    for name, w in weights.items():
        if w.dtype != first.dtype:
            raise TypeError(f"{name} is {w.dtype} but {first_name} is {first.dtype}; give every "
                            "projection the same dtype.")
        if w.device != first.device:
            raise ValueError(f"{name} is on {w.device} but {first_name} is on {first.device}; "
                             "put every projection on the same device.")


def check_module_input(x, hidden_dim: int, weight: torch.Tensor) -> None:
    """x is [batch, seq, hidden_dim] with the dtype and device of the weights."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [batch, seq, hidden], got {type(x).__name__}.")
    if x.dim() != 3:
        raise ValueError(f"x must be [batch, seq, hidden] (3 dimensions), got shape "
                         f"{tuple(x.shape)}; add a batch dimension with x.unsqueeze(0).")
    if x.shape[-1] != hidden_dim:
        raise ValueError(f"x has hidden size {x.shape[-1]} (shape {tuple(x.shape)}), but the "
                         f"module was built for hidden_dim {hidden_dim}.")
    if x.dtype != weight.dtype:
        raise TypeError(f"x is {x.dtype} but the weights are {weight.dtype}; convert one, e.g. "
                        f"x.to({weight.dtype}).")
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} but the weights are on {weight.device}; move one, "
                         f"e.g. x.to('{weight.device}').")


def check_tile_sizes(**tiles) -> None:
    """Each tile size (rows per tile) is a positive integer."""
    for name, value in tiles.items():
        if not is_int(value):
            raise TypeError(f"{name} must be an int (rows per tile), got {type(value).__name__} "
                            f"{value!r}.")
        if value <= 0:
            raise ValueError(f"{name} must be a positive number of rows, got {value}.")


def check_qkv(q, k, v) -> None:
    """q [B, H, Sq, D], k and v [B, H, Sk, D]: same batch, heads, head_dim, dtype and device."""
    _check_qkv_tensors(q, k, v)
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape.")
    if (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, heads "
                         "and head_dim (dimensions 0, 1 and 3); only the sequence lengths may differ.")


# --- the attention entries of tasks 4 and 5 (flash_attention, the decode, the HF entry) -----

ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_attention_arguments(q, k, v, causal=False, out=None, *, window=None, stride=1,
                              mask=None, key_lengths=None, left_padding=False, softcap=None,
                              sinks=None, scale=None, kernel: bool = True) -> None:
    """Every argument of an attention call, checked once, before any kernel is chosen.

    q [B, H_q, S_q, D], k and v [B, H_kv, S_k, D]; the variant arguments as in
    common/variants.py: softcap and scale None or a positive finite number, sinks None or a
    float [H_q] tensor on q's device (its values are not read: a sink may be -inf, no sink). Raises TypeError (a wrong type or dtype) or ValueError (a wrong value,
    shape or device) with a sentence that says what to change. Whatever path then runs (the
    fp32 course kernel, the mma.sync or Hopper kernel, the strided classes, a decode kernel,
    PyTorch's twin on a CPU), it runs on arguments that passed here, so no path can skip a
    check. `kernel=False` (PyTorch's twin on a CPU) leaves out the layout the kernels need
    (a contiguous last dimension). That the tensors are on a CUDA GPU is the extensions' own
    first check, in the same words on every entry; they also check the rest again in C++,
    since their entries can be called directly."""
    check_grouped_qkv(q, k, v)
    if q.dtype not in ATTENTION_DTYPES:
        raise TypeError(f"q, k, v have dtype {q.dtype}, but the kernels take float32, float16 "
                        "or bfloat16; convert them with .to(...).")
    check_head_dim(q.shape[3])
    if kernel and not (q.stride(3) == k.stride(3) == v.stride(3) == 1):
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.stride(3) != 1:
                raise ValueError(f"{name}'s last dimension (head_dim) must be contiguous (stride 1) "
                                 f"but its strides are {t.stride()}; call .contiguous() first.")
    check_flag(causal, "causal")
    check_flag(left_padding, "left_padding")
    if window is not None:
        if not is_int(window):
            raise TypeError(f"window must be an int (or None for no window), not "
                            f"{type(window).__name__} {window!r}.")
        if window < 1:
            raise ValueError(f"window must be at least 1 (a query sees itself) but is {window}; "
                             "pass None for no window.")
    if not is_int(stride):
        raise TypeError(f"stride must be an int (1 = every key), not {type(stride).__name__} "
                        f"{stride!r}.")
    if stride < 1:
        raise ValueError(f"stride must be at least 1 (1 = every key) but is {stride}.")
    check_positive_number(softcap, "softcap")
    check_positive_number(scale, "scale")
    if sinks is not None:
        _check_sinks(sinks, q)
    if out is not None:
        _check_out(out, q, kernel)
    if mask is not None:
        _check_mask(mask, q, k)
    if key_lengths is not None:
        _check_key_lengths_tensor(key_lengths, q)
        check_key_lengths(key_lengths, k.shape[2])
    elif left_padding:
        raise ValueError("left_padding needs key_lengths (how many keys of each sequence are "
                         "real); pass key_lengths or left_padding=False.")


def _check_qkv_tensors(q, k, v) -> None:
    """Three [batch, heads, seq, head_dim] tensors of one floating dtype on one device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [batch, heads, seq, head_dim], got "
                            f"{type(t).__name__}.")
        if t.dim() != 4:
            raise ValueError(f"{name} must be [batch, heads, seq, head_dim] (4 dimensions), got "
                             f"shape {tuple(t.shape)}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}.")
    if not q.is_floating_point():
        raise TypeError(f"q, k, v must be floating point, got {q.dtype}.")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}.")


def check_grouped_qkv(q, k, v) -> None:
    """q [B, H_q, S_q, D], k and v [B, H_kv, S_k, D] with H_q a multiple of H_kv (grouped-query
    attention; H_kv = H_q is plain attention): one floating dtype, one device, none empty."""
    _check_qkv_tensors(q, k, v)
    q_shape, k_shape = q.shape, k.shape  # read once: each .shape builds a new torch.Size
    if k_shape != v.shape or k_shape[0] != q_shape[0] or k_shape[3] != q_shape[3]:
        raise ValueError(f"k and v must both be [batch, kv_heads, seq_k, head_dim] with q's batch "
                         f"and head_dim, q being [batch, heads, seq_q, head_dim]; got q "
                         f"{tuple(q_shape)}, k {tuple(k_shape)} and v {tuple(v.shape)}.")
    if k_shape[1] < 1 or q_shape[1] % k_shape[1]:
        raise ValueError(f"q has {q_shape[1]} heads and k/v {k_shape[1]}: grouped-query attention "
                         "needs the query heads to be a multiple of the key/value heads (query "
                         "head h reads KV head h // (H_q // H_kv)).")
    for name, shape in (("q", q_shape), ("k", k_shape)):
        if 0 in shape:
            raise ValueError(f"{name} is empty (shape {tuple(shape)}); attention needs at least "
                             "one query and one key.")


def _check_on_q_device(t: torch.Tensor, name: str, q: torch.Tensor) -> None:
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}; put them on the same "
                         "device.")


def _check_out(out, q, kernel: bool) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor shaped like q or None, not {type(out).__name__}.")
    if out.shape != q.shape:
        raise ValueError(f"out must have the shape of q {tuple(q.shape)} but has {tuple(out.shape)}.")
    if out.dtype != q.dtype:
        raise TypeError(f"out has dtype {out.dtype} but q has {q.dtype}; use one dtype.")
    _check_on_q_device(out, "out", q)
    if kernel and out.stride(3) != 1:
        raise ValueError(f"out's last dimension must be contiguous (stride 1) but its strides are "
                         f"{out.stride()}.")


def _check_mask(mask, q, k) -> None:
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a tensor broadcastable to [batch, heads, seq_q, seq_k] = "
                        f"{list(full)} (bool: True = keep, or an additive float) or None, not "
                        f"{type(mask).__name__}.")
    _check_on_q_device(mask, "mask", q)
    if mask.dtype not in (torch.bool, torch.float32, q.dtype):
        raise TypeError(f"mask has dtype {mask.dtype} but must be bool (True = keep) or an "
                        f"additive float mask of dtype float32 or {q.dtype} (q's dtype).")
    if not 1 <= mask.dim() <= 4:
        raise ValueError(f"mask must have 1 to 4 dimensions, broadcastable to [batch, heads, seq_q, "
                         f"seq_k] = {list(full)}, but has shape {tuple(mask.shape)}.")
    for size, want in zip(reversed(mask.shape), reversed(full)):
        if size not in (1, want):
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to [batch, "
                             f"heads, seq_q, seq_k] = {list(full)}: each dimension must be 1 or "
                             "the full size.")


def _check_sinks(sinks, q) -> None:
    heads = q.shape[1]
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a float tensor of shape [{heads}] (one logit per query "
                        f"head) or None, not {type(sinks).__name__}.")
    if sinks.dtype not in ATTENTION_DTYPES:
        raise TypeError(f"sinks has dtype {sinks.dtype} but must be float32, float16 or bfloat16 "
                        "(one logit per query head); convert it with .float().")
    _check_on_q_device(sinks, "sinks", q)
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks must have shape [{heads}] (one logit per query head, q having "
                         f"{heads} heads) but has shape {tuple(sinks.shape)}.")


def _check_key_lengths_tensor(key_lengths, q) -> None:
    if not isinstance(key_lengths, torch.Tensor):
        raise TypeError(f"key_lengths must be an int32 tensor of shape [batch], not "
                        f"{type(key_lengths).__name__}.")
    if key_lengths.dtype != torch.int32:
        raise TypeError(f"key_lengths must be an int32 tensor but has dtype {key_lengths.dtype}; "
                        "create it with dtype=torch.int32.")
    _check_on_q_device(key_lengths, "key_lengths", q)
    one = key_lengths.dim() == 0 or tuple(key_lengths.shape) == (1,)
    if not one and tuple(key_lengths.shape) != (q.shape[0],):
        raise ValueError(f"key_lengths must have shape [{q.shape[0]}] (one length per sequence) "
                         f"but has shape {tuple(key_lengths.shape)}.")


def check_key_lengths(key_lengths: torch.Tensor, seq_k: int) -> None:
    """Lengths must lie in [0, seq_k]. Checked on the host (one read, which waits for the
    GPU) except while a CUDA graph is being captured, where the kernels clamp them on the
    device instead; a tensor already checked (same tensor, unchanged, same seq_k: what every
    layer of a model forward passes) is not read again."""
    global _last_checked_lengths
    if key_lengths.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    signature = (key_lengths.data_ptr(), key_lengths._version, tuple(key_lengths.shape), seq_k)
    if (_last_checked_lengths is not None and _last_checked_lengths[1] == signature
            and _last_checked_lengths[0]() is key_lengths):
        return
    low, high = (int(x) for x in torch.aminmax(key_lengths.reshape(-1)))
    if low < 0 or high > seq_k:
        raise ValueError(f"key_lengths must lie in [0, {seq_k}] (the number of keys) but "
                         f"range over [{low}, {high}].")
    _last_checked_lengths = (weakref.ref(key_lengths), signature)


_last_checked_lengths = None
