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

Inputs a kernel does not take (a CPU tensor, more rows than a decode step, an odd size) go
to the PyTorch twin, so a caller never has to check; bad input (wrong shapes, dtypes, a
position outside the cache) raises a ValueError or TypeError with a sentence either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from common.limits import DECODE_LINEAR_MAX_ROWS, NORM_MAX_PIECES, NORM_STATS_SHAPE
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


# --- a norm folded into the products around it (decode_linear.cu, NormFold) ----------------------
#
# norm(h) @ W.T + bias, for LayerNorm's norm(h) = (h - mean) * rstd * gamma + beta, is
#     rstd * (h @ W'.T - mean * colsum) + shift,  W' = W * gamma, colsum = W' summed along K,
#                                                  shift = W @ beta + bias
# (RMSNorm: mean = 0, no beta). So a product can take the raw h and normalise in its epilogue,
# given each row's mean and rstd; and the product that wrote h can add up each row's sums of h and
# h^2 as it writes them (into fp64 slots, stats [NORM_STATS_SHAPE]). The norm kernel between them
# is gone. fold_norm computes W', colsum and shift once per weight; stats are zeroed every step.

@dataclass(frozen=True)
class FoldedProduct:
    """A product with the norm before it folded in: weight W * gamma, bias W @ beta + bias,
    colsum the sums of weight's rows in fp32 (None for RMSNorm), and the norm's eps."""
    weight: torch.Tensor
    bias: torch.Tensor | None
    colsum: torch.Tensor | None
    eps: float
    rms: bool


@torch.no_grad()
def fold_norm(norm_weight: torch.Tensor, norm_bias: torch.Tensor | None, weight: torch.Tensor,
              bias: torch.Tensor | None, eps: float, rms: bool, *, gamma_is_one: bool = False,
              beta_is_zero: bool = False) -> FoldedProduct:
    """The constants of a product with its norm folded in. gamma_is_one / beta_is_zero (the
    caller knows: a norm at its initial value) keep weight and bias themselves, no copies."""
    if rms and norm_bias is not None:
        raise ValueError("RMSNorm has no bias (pass norm_bias=None).")
    if norm_weight.shape != (weight.shape[-1],):
        raise ValueError(f"the norm has {tuple(norm_weight.shape)} weights but the product "
                         f"takes {weight.shape[-1]} features.")
    folded = weight if gamma_is_one else (weight * norm_weight).contiguous()
    shift = bias
    if norm_bias is not None and not beta_is_zero:
        moved = F.linear(norm_bias.float(), weight.float())
        shift = (moved if bias is None else moved + bias.float()).to(weight.dtype)
    colsum = None if rms else folded.double().sum(-1).float()
    return FoldedProduct(folded, shift, colsum, float(eps), bool(rms))


def norm_stats(count: int, device) -> torch.Tensor:
    """Zeroed fp64 sums for `count` folded norms: [count, *NORM_STATS_SHAPE]."""
    return torch.zeros(count, *NORM_STATS_SHAPE, dtype=torch.float64, device=device)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0


def _stats_usable(x, weight, *stats) -> bool:
    return (x.is_cuda and 1 <= _rows(x) <= DECODE_LINEAR_MAX_ROWS and x.dtype in HALF_AND_FLOAT
            and x.dtype == weight.dtype and weight.dim() == 2
            and (x.shape[-1] * x.element_size()) % 16 == 0 and _aligned(x, weight)
            and all(s.is_cuda and s.is_contiguous() for s in stats))


def linear_with_stats(x, weight, bias, residual, stats_out):
    """x @ weight.T (+ bias) (+ residual), and each output row's sums of h and h^2 added into
    stats_out [NORM_STATS_SHAPE] (fp64), for the folded norm that reads this output next."""
    if _stats_usable(x, weight, stats_out) and (residual is None or residual.is_contiguous()):
        return _ext().decode_linear(x, weight, bias, residual, stats_out=stats_out)
    return torch_linear_with_stats(x, weight, bias, residual, stats_out)


def folded_linear(x, product: FoldedProduct, stats_in, residual=None, gated=False):
    """norm(x) @ W.T + bias (+ residual), the norm folded in (product = fold_norm(...)), from the
    sums of x's rows in stats_in; gated: SwiGLU's silu(gate) * up over stacked weights."""
    if _stats_usable(x, product.weight, stats_in) and (residual is None or residual.is_contiguous()):
        entry = _ext().decode_swiglu if gated else _ext().decode_linear
        return entry(x, product.weight, product.bias, residual, stats_in=stats_in,
                     colsum=product.colsum, eps=product.eps, rms=product.rms)
    return torch_folded_linear(x, product, stats_in, residual, gated)


def torch_linear_with_stats(x, weight, bias, residual, stats_out):
    """The PyTorch twin of linear_with_stats (its sums go into slot 0)."""
    out = F.linear(x, weight, bias)
    out = out if residual is None else out + residual
    h = out.reshape(-1, out.shape[-1]).double()
    stats_out[0, :h.shape[0], 0] += h.sum(-1)
    stats_out[0, :h.shape[0], 1] += (h * h).sum(-1)
    return out


def torch_folded_linear(x, product: FoldedProduct, stats_in, residual=None, gated=False):
    """The PyTorch twin of folded_linear: the same algebra, fp32."""
    rows, features = _rows(x), x.shape[-1]
    sums = stats_in[:, :rows].sum(0)
    mean = torch.zeros_like(sums[:, 0]) if product.rms else sums[:, 0] / features
    rstd = torch.rsqrt((sums[:, 1] / features - mean * mean).clamp_min(0) + product.eps)
    acc = F.linear(x.reshape(rows, features).float(), product.weight.float())
    if product.colsum is not None:
        acc = acc - mean[:, None].float() * product.colsum[None]
    y = rstd[:, None].float() * acc
    if product.bias is not None:
        y = y + product.bias.float()
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    out = y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])
    return out if residual is None else out + residual
