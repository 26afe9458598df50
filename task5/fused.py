"""Fused kernels for a decode step (not graded): normalisation, RoPE + cache append, SwiGLU.

A decode step must read every weight and the KV cache once; what it spends beyond that is
the fixed cost of its small kernels (a layer of task 6's model launched a dozen: two
LayerNorms, RoPE on q and k, the cache write, SiLU, the gate * up product, residual adds).
These entries do the same work in fewer launches, each the counterpart of a PyTorch twin in
task5/ops.py that the tests compare them with:

    add_norm(x, weight, bias=None, eps=1e-5, residual=None, rms=False)     task5/norm.cu
        LayerNorm (or RMSNorm, rms=True) of x's rows in fp32, x read once; with a residual,
        of h = x + residual, and h is returned too: (out, h).
    rope_append(q, k, v, k_cache, v_cache, cos, sin, current_pos)           task5/rope_append.cu
        q [B, S, Hq, D] and k [B, S, Hkv, D] rotated at positions current_pos + s (the fp32
        tables [max_len, D] of common/rope.py), rotated k and v written into the caches
        [B, max_len, Hkv * D]; returns the rotated q [B, S, Hq, D]. current_pos as in
        update_kv_cache: an int, or a CUDA int32 tensor read on the device (CUDA graphs).
    decode_swiglu(x, weight, bias=None, residual=None)                      task5/decode_linear.cu
        silu(x Wg^T) * (x Wu^T) for weight = [Wg; Wu] stacked [2 * width, K], in one pass
        that streams both weights (at most 8 rows of x, like decode_linear).

Inputs a kernel does not take (a CPU tensor, more rows than a decode step, an odd size) go
to the PyTorch twin, so a caller never has to check; bad input (wrong shapes, dtypes, a
position outside the cache) raises a ValueError or TypeError with a sentence either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from common.limits import DECODE_LINEAR_MAX_ROWS, NORM_MAX_PIECES
from task5.attention import _ext, _int_or_tensor

HALF_AND_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def _aligned(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0) for t in tensors)


def torch_add_norm(x, weight, bias=None, eps=1e-5, residual=None, rms=False):
    """The PyTorch twin of add_norm."""
    h = x if residual is None else x + residual
    shape = (x.shape[-1],)
    out = F.rms_norm(h, shape, weight, eps) if rms else F.layer_norm(h, shape, weight, bias, eps)
    return out if residual is None else (out, h)


def add_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             eps: float = 1e-5, residual: torch.Tensor | None = None, rms: bool = False):
    """LayerNorm / RMSNorm over x's last dimension (after adding `residual`, if given).
    Returns out, or (out, x + residual) with a residual."""
    if rms and bias is not None:
        raise ValueError("RMSNorm has no bias (pass bias=None).")
    piece = 16 // x.element_size() if x.dtype in HALF_AND_FLOAT else 0
    usable = (x.is_cuda and x.dtype in HALF_AND_FLOAT and x.dim() >= 1 and x.numel() > 0
              and x.shape[-1] % piece == 0 and x.shape[-1] // piece <= NORM_MAX_PIECES
              and weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype)
              and (residual is None or (residual.dtype == x.dtype and residual.shape == x.shape))
              and _aligned(x, weight, bias, residual))
    if not usable:
        return torch_add_norm(x, weight, bias, eps, residual, rms)
    found = _ext().add_norm(x, residual, weight, bias, float(eps), rms)
    return found[0] if residual is None else (found[0], found[1])


def rope_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                current_pos) -> torch.Tensor:
    """RoPE on q and k, k and v appended to the caches; returns q rotated, [B, S, Hq, D]."""
    value, tensor = _int_or_tensor(current_pos, "current_pos")
    return _ext().rope_append(q, k, v, k_cache, v_cache, cos, sin, value, tensor)


def rope_append_paged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pages: torch.Tensor,
                      v_pages: torch.Tensor, block_table: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor, current_pos) -> torch.Tensor:
    """rope_append into a paged cache: k_pages, v_pages [num_pages, page_size, Hkv, D],
    block_table [B, max_pages] int32. Token s of sequence b goes to position current_pos + s
    (current_pos: the sequence's length before the append, an int or a CUDA int32 tensor, 0-d
    or [B]), whose page the table must already list (task5.ops.PageAllocator.reserve); a
    position without a page writes nothing. Returns q rotated, [B, S, Hq, D]."""
    value, tensor = _int_or_tensor(current_pos, "current_pos")
    return _ext().rope_append_paged(q, k, v, k_pages, v_pages, block_table, cos, sin, value,
                                    tensor)


def decode_swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up with [gate, up] = x @ weight.T (+ bias), weight [2 * width, K] (+ residual)."""
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    usable = (x.is_cuda and 1 <= rows <= DECODE_LINEAR_MAX_ROWS and x.dtype in HALF_AND_FLOAT
              and x.dtype == weight.dtype and weight.dim() == 2 and weight.shape[0] % 2 == 0
              and (x.shape[-1] * x.element_size()) % 16 == 0 and _aligned(x, weight)
              and (residual is None or residual.is_contiguous()))
    if not usable:
        return torch_swiglu(x, weight, bias, residual)
    return _ext().decode_swiglu(x, weight, bias, residual)


def torch_swiglu(x, weight, bias=None, residual=None):
    """The PyTorch twin of decode_swiglu."""
    gate, up = F.linear(x, weight, bias).chunk(2, dim=-1)
    out = F.silu(gate) * up
    return out if residual is None else out + residual
