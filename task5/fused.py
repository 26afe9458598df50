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
    decode_swiglu(x, weight, bias=None, residual=None, norm=None)           task5/decode_linear.cu
        silu(x Wg^T) * (x Wu^T) for weight = [Wg; Wu] stacked [2 * width, K], in one pass
        that streams both weights (at most 8 rows of x, like decode_linear).
    norm= (decode_swiglu here, task5.decode_linear too)                     task5/decode_linear_norm.cuh
        the product of norm(x) instead of x, the LayerNorm / RMSNorm folded into the product:
        no norm kernel. norm is a FoldedNorm from fold_norm(weight, bias, norm_weight,
        norm_bias, eps, rms) (the fold is computed once per weight: a model keeps it), or a
        tuple (norm_weight, norm_bias, eps, rms), folded on every call (for one-off calls).

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
                  residual: torch.Tensor | None = None, norm=None) -> torch.Tensor:
    """silu(gate) * up with [gate, up] = x @ weight.T (+ bias), weight [2 * width, K] (+ residual).
    With norm (a FoldedNorm, or (norm_weight, norm_bias, eps, rms)): of norm(x) instead of x."""
    if norm is not None:
        return decode_linear_norm(x, weight, bias, residual, norm, gated=True)
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


# ---- the norm folded into the product after it (decode_linear_norm.cuh) ----------------------

class FoldedNorm:
    """A product's weight with the LayerNorm / RMSNorm before it folded in (fold_norm):
        LayerNorm  W (gamma * (x - mean) * rstd + beta) + b = rstd * (W' x - mean * colsum) + shift
        RMSNorm    W (gamma * x * rstd) + b                 = rstd * (W' x) + shift
    with W' = W diag(gamma) (W itself, no copy, while gamma is all ones), colsum = W' summed
    along K and shift = W beta + b, both fp32 [rows of W]. It keeps the tensors it was folded
    from (their identity and version), so fresh() tells whether it still describes them."""

    def __init__(self, weight, bias, norm_weight, norm_bias, eps, rms, folded, colsum, shift):
        self.source = (weight, bias, norm_weight, norm_bias)
        self.versions = _versions(self.source)
        self.eps, self.rms = float(eps), bool(rms)
        self.weight, self.colsum, self.shift = folded, colsum, shift

    def fresh(self, weight, bias, norm_weight, norm_bias, eps, rms) -> bool:
        """Whether this fold was made from these tensors, unchanged since."""
        return (all(a is b for a, b in zip(self.source, (weight, bias, norm_weight, norm_bias)))
                and self.versions == _versions(self.source) and self.eps == float(eps)
                and self.rms == bool(rms))

    def norm_args(self):
        """(norm_weight, norm_bias, eps, rms): what the PyTorch twin takes."""
        return self.source[2], self.source[3], self.eps, self.rms


def _versions(tensors):
    return tuple(None if t is None else (t.data_ptr(), t._version) for t in tensors)


@torch.no_grad()
def fold_norm(weight: torch.Tensor, bias: torch.Tensor | None, norm_weight: torch.Tensor,
              norm_bias: torch.Tensor | None = None, eps: float = 1e-5,
              rms: bool = False) -> FoldedNorm:
    """Fold the norm (weight norm_weight, bias norm_bias; RMSNorm with rms=True) into the product
    with `weight` [rows, K] (+ `bias` [rows]) after it. Reads the weight once (a few syncs):
    compute it once per weight, not per decode step."""
    if rms and norm_bias is not None:
        raise ValueError("RMSNorm has no bias (pass norm_bias=None).")
    if weight.dim() != 2 or norm_weight.shape != (weight.shape[1],) or (
            norm_bias is not None and norm_bias.shape != (weight.shape[1],)):
        raise ValueError(f"the norm's weight and bias must be [{weight.shape[-1]}] for a product "
                         f"weight of shape {tuple(weight.shape)}; got "
                         f"{tuple(norm_weight.shape)} and "
                         f"{None if norm_bias is None else tuple(norm_bias.shape)}.")
    if bool((norm_weight == 1).all()):
        folded = weight
    else:
        folded = (weight.float() * norm_weight.float()).to(weight.dtype).contiguous()
    colsum = None if rms else folded.sum(dim=1, dtype=torch.float32).contiguous()
    shift = None
    if norm_bias is not None and bool((norm_bias != 0).any()):
        shift = torch.cat([F.linear(norm_bias.float(), rows.float())
                           for rows in weight.split(4096)]).contiguous()
    if bias is not None:
        shift = bias.float().contiguous() if shift is None else (shift + bias.float()).contiguous()
    return FoldedNorm(weight, bias, norm_weight, norm_bias, eps, rms, folded, colsum, shift)


def torch_linear_norm(x, weight, bias=None, residual=None, norm_weight=None, norm_bias=None,
                      eps=1e-5, rms=False, gated=False):
    """The PyTorch twin of the norm-folded products: the norm (as torch_add_norm), then the
    product (F.linear, or torch_swiglu when gated), then the residual."""
    normed = torch_add_norm(x, norm_weight, norm_bias, eps, rms=rms)
    if gated:
        return torch_swiglu(normed, weight, bias, residual)
    out = F.linear(normed, weight, bias)
    return out if residual is None else out + residual


def decode_linear_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       residual: torch.Tensor | None = None, norm=None,
                       gated: bool = False) -> torch.Tensor:
    """norm(x) @ weight.T (+ bias) (+ residual), silu(gate) * up when gated: the entry behind
    decode_linear's and decode_swiglu's norm= argument. norm: a FoldedNorm (from fold_norm with
    this weight and bias) or (norm_weight, norm_bias, eps, rms), folded here. Inputs the
    kernel does not take go to the PyTorch twin, torch_linear_norm."""
    if isinstance(norm, FoldedNorm):
        fold = norm
        norm_weight, norm_bias, eps, rms = fold.norm_args()
        if fold.source[0] is not weight or fold.source[1] is not bias:
            raise ValueError("norm is a FoldedNorm of another weight or bias: fold_norm it with "
                             "the weight and bias passed here.")
    else:
        try:
            norm_weight, norm_bias, eps, rms = norm
        except (TypeError, ValueError):
            raise TypeError("norm must be a FoldedNorm (fold_norm) or a tuple (norm_weight, "
                            f"norm_bias, eps, rms); got {type(norm).__name__}.") from None
        fold = None
    if rms and norm_bias is not None:
        raise ValueError("RMSNorm has no bias (pass norm_bias=None).")
    K = x.shape[-1] if x.dim() else 0
    rows = x.numel() // K if K else 0
    usable = (x.is_cuda and 1 <= rows <= DECODE_LINEAR_MAX_ROWS and x.dtype in HALF_AND_FLOAT
              and x.dtype == weight.dtype and weight.dim() == 2 and weight.shape[1] == K
              and (not gated or weight.shape[0] % 2 == 0)
              and (K * x.element_size()) % 16 == 0 and _aligned(x, weight)
              and (residual is None or residual.is_contiguous())
              and norm_weight.shape == (K,) and (norm_bias is None or norm_bias.shape == (K,))
              and (bias is None or bias.shape == (weight.shape[0],)))
    if not usable:
        return torch_linear_norm(x, weight, bias, residual, norm_weight, norm_bias, eps, rms, gated)
    if fold is None:
        fold = fold_norm(weight, bias, norm_weight, norm_bias, eps, rms)
    return _ext().decode_linear_norm(x, fold.weight, residual, fold.colsum, fold.shift, fold.eps,
                                     fold.rms, gated)
