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
        tables [max_len, D] of task6/rope.py), rotated k and v written into the caches
        [B, max_len, Hkv * D]; returns the rotated q [B, S, Hq, D]. current_pos as in
        update_kv_cache: an int, or a CUDA int32 tensor read on the device (CUDA graphs).
    decode_swiglu(x, weight, bias=None, residual=None)                      task5/decode_linear.cu
        silu(x Wg^T) * (x Wu^T) for weight = [Wg; Wu] stacked [2 * width, K], in one pass
        that streams both weights (at most 8 rows of x, like decode_linear).
    norm_linear(x, norm_weight, norm_bias, eps, rms, weight, bias=None, residual=None,
                gated=False)                                              task5/decode_norm_linear.cu
        linear(norm(x)) (or, gated, SwiGLU of norm(x)) with the LayerNorm / RMSNorm folded into
        the product's pass over the weight: no norm kernel. Its per-layer constants
        (fold_norm: weight @ gamma and weight @ beta + bias, fp32) are computed once and kept
        with the weight until one of the tensors changes.

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


def fold_norm(norm_weight, norm_bias, weight, bias=None, rms=False):
    """(colsum, shift), the constants of a norm folded into the product after it, fp32
    [weight rows]: colsum = weight @ gamma (LayerNorm; None for RMSNorm, which has no mean) and
    shift = weight @ beta + bias (None when there is neither). Kept on `weight` and reused
    until one of the four tensors is replaced or changed in place (their version counters)."""
    key = tuple((id(t), t._version) for t in (norm_weight, norm_bias, weight, bias) if t is not None)
    key += (rms,)
    cached = getattr(weight, "_folded_norm", None)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    if weight.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("norm_linear's folded constants are computed outside a CUDA graph: "
                           "run one decode step eagerly before capturing (generate() does).")
    with torch.no_grad():
        w = weight.float()
        colsum = None if rms else w @ norm_weight.float()
        shift = w @ norm_bias.float() if norm_bias is not None else None
        if bias is not None:
            shift = bias.float() if shift is None else shift + bias.float()
    weight._folded_norm = (key, colsum, shift)
    return colsum, shift


def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor | None,
                eps: float, rms: bool, weight: torch.Tensor, bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, gated: bool = False) -> torch.Tensor:
    """linear(norm(x), weight, bias) (+ residual), norm a LayerNorm (or RMSNorm, rms=True) of
    x's last dimension; gated: silu(gate) * up of it, weight [2 * width, K] (decode_swiglu)."""
    if rms and norm_bias is not None:
        raise ValueError("RMSNorm has no bias (pass norm_bias=None).")
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    usable = (x.is_cuda and 1 <= rows <= DECODE_LINEAR_MAX_ROWS and x.dtype in HALF_AND_FLOAT
              and weight.dtype == x.dtype == norm_weight.dtype and weight.dim() == 2
              and weight.shape[1] == x.shape[-1] == norm_weight.numel()
              and (not gated or weight.shape[0] % 2 == 0)
              and (x.shape[-1] * x.element_size()) % 16 == 0 and _aligned(x, weight, norm_weight)
              and (residual is None or (residual.is_contiguous() and residual.dtype == x.dtype)))
    if not usable:
        return torch_norm_linear(x, norm_weight, norm_bias, eps, rms, weight, bias, residual, gated)
    colsum, shift = fold_norm(norm_weight, norm_bias, weight, bias, rms)
    return _ext().decode_norm_linear(x, norm_weight, colsum, shift, float(eps), rms, weight,
                                     residual, 0, gated)


def torch_norm_linear(x, norm_weight, norm_bias, eps, rms, weight, bias=None, residual=None,
                      gated=False):
    """The PyTorch twin of norm_linear: the norm, then the product."""
    normed = torch_add_norm(x, norm_weight, norm_bias, eps, rms=rms)
    if gated:
        return torch_swiglu(normed, weight, bias, residual)
    out = F.linear(normed, weight, bias)
    return out if residual is None else out + residual
