"""The attention operations tasks 6 and 7 run their models on: our kernels, or the same in PyTorch.

One contract, two implementations, so a model is written once against it: task 6's decoder
(task6/model.py), task 7's GPT-2 loop (task7/inference.py) and its Hugging Face attention
function (task7/hf_attention.py):

    allocate_kv_cache(batch, max_seq_len, hidden, dtype, device) -> (k_cache, v_cache)
        each [B, max_seq_len, hidden]: token-major, the heads interleaved in hidden (task 5).
    update_kv_cache(k_cache, v_cache, k, v, current_pos: int | Tensor)
        k, v [B, n_new, hidden] written at positions [current_pos, current_pos + n_new).
    flash_attention(q, k, v, causal=False) -> [B, H, S, D]          (task 4)
        q, k, v [B, H, S, D] views whose last dimension is contiguous.
    decode_attention(q, k_cache, v_cache, num_heads, seq_len) -> [B, 1, hidden]   (task 5)
        one query per sequence against cache positions [0, seq_len).
    decode_attention_bhsd(q, k, v, seq_len) -> [B, H, 1, D]         (task 5)
        the same on [B, H, S_max, D] views (Hugging Face's cache layout).
    decode_linear(x, weight, bias=None, residual=None) -> x @ weight.T (+ bias) (+ residual)
        the few-row products of a decode step (task 5's decode_linear.cu; not graded).

and the fused kernels of a decode step (task5/fused.py, not graded):

    add_norm(x, weight, bias=None, eps=1e-5, residual=None, rms=False) -> out | (out, x + residual)
        LayerNorm / RMSNorm of x's rows, after the residual add when one is given.
    rope_append(q, k, v, k_cache, v_cache, cos, sin, current_pos) -> q rotated [B, S, Hq, D]
        RoPE on q [B, S, Hq, D] and k [B, S, Hkv, D] at positions current_pos + s (fp32
        tables [max_len, D]), and the rotated k and v written into the caches.
    decode_swiglu(x, weight, bias=None, residual=None) -> silu(gate) * up (+ residual)
        [gate, up] = x @ weight.T (+ bias), weight the stacked [2 * width, K].

Grouped-query attention: the caches may hold fewer heads than q (hidden_kv = H_kv * D, with
H_q a multiple of H_kv); decode_attention and flash_attention then give query head h the KV
head h // (H_q / H_kv), as Llama, Mistral and Qwen do.

`current_pos` and `seq_len` are Python ints or CUDA int32 tensors read on the device, which
is what lets a CUDA graph replay the decode step while the position advances in place.

`kernel_ops()` imports the task 4 and task 5 extensions (built on first use). `torch_ops()`
does the same work with torch.nn.functional.scaled_dot_product_attention: it runs on a CPU,
so the loop and the mask handling are tested where there is no GPU, and it is the yardstick
the kernels must agree with.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionOps:
    name: str
    allocate_kv_cache: Callable
    update_kv_cache: Callable
    flash_attention: Callable
    decode_attention: Callable
    decode_attention_bhsd: Callable
    decode_linear: Callable
    add_norm: Callable
    rope_append: Callable
    decode_swiglu: Callable


# --- our kernels ------------------------------------------------------------------------

@cache
def kernel_ops() -> AttentionOps:
    """Task 4's flash_attention and task 5's cache, decode and decode_linear kernels (CUDA)."""
    # Imported here, not at the top: this module must import on machines without the
    # extensions (a CPU), and building them is needed only when they are used.
    task4 = importlib.import_module("task4.attention")
    task5 = importlib.import_module("task5.attention")
    fused = importlib.import_module("task5.fused")

    def decode_attention(q, k_cache, v_cache, num_heads, seq_len, causal=False, out=None,
                         num_splits=None):
        if k_cache.shape[-1] == q.shape[-1]:   # as many KV heads as query heads: the course kernel
            return task5.decode_attention(q, k_cache, v_cache, num_heads, seq_len, causal, out,
                                          num_splits)
        # Grouped-query: the per-head views of the caches, the grouped decode kernel, with the
        # length read on the device when it is a tensor (CUDA graphs).
        q_heads, k_heads, v_heads = _head_views(q, k_cache, v_cache, num_heads)
        lengths = seq_len if isinstance(seq_len, torch.Tensor) else None
        if lengths is None:
            k_heads, v_heads = k_heads[:, :, :seq_len], v_heads[:, :, :seq_len]
        o = task5.decode_attention_grouped(q_heads, k_heads, v_heads, key_lengths=lengths,
                                           num_splits=num_splits)
        return _finish(o.transpose(1, 2).reshape(q.shape), out)

    return AttentionOps("kernels", task5.allocate_kv_cache, task5.update_kv_cache,
                        task4.flash_attention, decode_attention, task5.decode_attention_bhsd,
                        task5.decode_linear, fused.add_norm, fused.rope_append,
                        fused.decode_swiglu)


def _head_views(q, k_cache, v_cache, num_heads):
    """q [B, 1, H_q * D] and the caches [B, L, H_kv * D] as [B, H, S, D] views (no copies)."""
    head_dim = q.shape[-1] // num_heads
    kv_heads = k_cache.shape[-1] // head_dim
    if num_heads <= 0 or q.shape[-1] % num_heads or k_cache.shape[-1] % head_dim \
            or num_heads % max(kv_heads, 1):
        raise ValueError(f"q has {q.shape[-1]} features for {num_heads} heads and the caches "
                         f"{k_cache.shape[-1]}: the caches must hold H_kv heads of the same "
                         "head_dim, H_kv dividing the number of query heads.")

    def heads(t, count):  # [B, S, count * D] -> [B, count, S, D], a view
        return t.view(t.shape[0], t.shape[1], count, head_dim).transpose(1, 2)

    return heads(q, num_heads), heads(k_cache, kv_heads), heads(v_cache, kv_heads)


def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """k, v [B, H_kv, S, D] repeated to q's H_q heads (query head h reads KV head h // group)."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


# --- the same in plain PyTorch ------------------------------------------------------------

def _torch_allocate_kv_cache(batch, max_seq_len, hidden, dtype, device):
    shape = (batch, max_seq_len, hidden)
    return (torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device))


def _torch_update_kv_cache(k_cache, v_cache, k, v, current_pos):
    n_new = k.shape[1]
    if isinstance(current_pos, torch.Tensor):
        # index_copy_ with positions computed on the device: no host sync, so it can be
        # captured in a CUDA graph like the kernel.
        rows = current_pos.reshape(()).long() + torch.arange(n_new, device=k.device)
        k_cache.index_copy_(1, rows, k)
        v_cache.index_copy_(1, rows, v)
    else:
        k_cache[:, current_pos:current_pos + n_new].copy_(k)
        v_cache[:, current_pos:current_pos + n_new].copy_(v)


def _finish(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result.contiguous()
    out.copy_(result)
    return out


def _torch_flash_attention(q, k, v, causal=False, out=None):
    k, v = _repeat_kv(q, k, v)
    return _finish(F.scaled_dot_product_attention(q, k, v, is_causal=causal), out)


def _visible_keys(seq_len, max_len: int, device) -> torch.Tensor | None:
    """Boolean [B or 1, 1, 1, max_len] mask of positions < seq_len, or None for an int."""
    if not isinstance(seq_len, torch.Tensor):
        return None
    lengths = seq_len.reshape(-1, 1).to(device)
    keep = torch.arange(max_len, device=device).unsqueeze(0) < lengths
    return keep[:, None, None, :]


def _torch_decode_attention_bhsd(q, k, v, seq_len, causal=False, out=None, num_splits=None):
    # A single query is the last position, so the causal mask hides nothing: causal is moot.
    keep = _visible_keys(seq_len, k.shape[2], k.device)
    if keep is None:
        k, v = k[:, :, :seq_len], v[:, :, :seq_len]
    k, v = _repeat_kv(q, k, v)
    return _finish(F.scaled_dot_product_attention(q, k, v, attn_mask=keep), out)


def _torch_decode_attention(q, k_cache, v_cache, num_heads, seq_len, causal=False, out=None,
                            num_splits=None):
    o = _torch_decode_attention_bhsd(*_head_views(q, k_cache, v_cache, num_heads), seq_len)
    return _finish(o.transpose(1, 2).reshape(q.shape), out)


def _torch_decode_linear(x, weight, bias=None, residual=None):
    out = F.linear(x, weight, bias)
    return out if residual is None else out + residual


def _torch_rope_append(q, k, v, k_cache, v_cache, cos, sin, current_pos):
    """RoPE in the rotate-half form (task6/rope.py) at positions current_pos + s, computed
    as task 6's apply_rope does (x * cos, then the two addcmuls), and the cache write."""
    seq, half = q.shape[1], q.shape[-1] // 2
    if isinstance(current_pos, torch.Tensor):
        rows = current_pos.reshape(()).long() + torch.arange(seq, device=cos.device)
        cos, sin = cos.index_select(0, rows), sin.index_select(0, rows)
    else:
        cos, sin = cos[current_pos:current_pos + seq], sin[current_pos:current_pos + seq]
    cos = cos.to(q.dtype)[None, :, None, :]
    sin = sin.to(q.dtype)[None, :, None, :half]

    def rotate(x):
        out = x * cos
        out[..., :half].addcmul_(x[..., half:], sin, value=-1.0)
        out[..., half:].addcmul_(x[..., :half], sin)
        return out

    _torch_update_kv_cache(k_cache, v_cache, rotate(k).flatten(2), v.flatten(2), current_pos)
    return rotate(q)


@cache
def torch_ops() -> AttentionOps:
    """The same operations with PyTorch's scaled_dot_product_attention (any device)."""
    from task5.fused import torch_add_norm, torch_swiglu

    return AttentionOps("torch", _torch_allocate_kv_cache, _torch_update_kv_cache,
                        _torch_flash_attention, _torch_decode_attention,
                        _torch_decode_attention_bhsd, _torch_decode_linear, torch_add_norm,
                        _torch_rope_append, torch_swiglu)


BACKENDS = ("auto", "kernels", "torch")


def ops_for(device: torch.device | str, backend: str = "auto") -> AttentionOps:
    """'kernels' (CUDA only), 'torch' (anywhere), or 'auto': kernels on a GPU, torch on a CPU."""
    device = torch.device(device)
    if backend not in BACKENDS:
        raise ValueError(f"Unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}.")
    if backend == "auto":
        backend = "kernels" if device.type == "cuda" else "torch"
    if backend == "kernels":
        if device.type != "cuda":
            raise ValueError("The course kernels run on a CUDA GPU only; on this device pass "
                             "--attention torch (PyTorch's SDPA) instead.")
        return kernel_ops()
    return torch_ops()
