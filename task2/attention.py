"""Task 2: multi-head self-attention with the attention itself in CUDA (naive, fp32).

Same module as task 1; only the middle changes. The projections stay in PyTorch (cuBLAS):

    x [B, S, hidden] -> q, k, v = x @ w_q.T, x @ w_k.T, x @ w_v.T       (torch)
      -> custom_attention(q, k, v, num_heads, causal)                   (the extension)
         splits the heads to [B*H, S, D] and runs four kernels of attention_kernel.cu:
         GEMM_NT (Q K^T) -> scale_and_causal_mask -> softmax -> GEMM_NN (P V),
         then merges the heads back to [B, S, hidden]
      -> @ w_o.T                                                        (torch)

Read attention_kernel.cu next: it is where the work is. The extension also exposes each
kernel on its own (softmax, gemm_nn, gemm_nt, scale_and_causal_mask) so the test can check
them one at a time; the thin wrappers below load the extension (building it on first use,
like `python -m task2.compile`) and call it.
"""

from __future__ import annotations

import torch
from torch import nn

from common.build import call_extension
from task2.compile import load


def _call(name: str, *args):
    """Call extension function `name`; a kernel not written yet raises NotImplementedError."""
    return call_extension(getattr(load(), name), *args)


def softmax(x: torch.Tensor, dim: int = -1, out: torch.Tensor | None = None) -> torch.Tensor:
    """Numerically stable softmax of fp32 CUDA `x` along `dim` (any rank >= 1)."""
    return _call("softmax", x, dim, out)


def gemm_nn(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a [batch, M, K] @ b [batch, K, N] (or 2-D), fp32, tiled in shared memory."""
    return _call("gemm_nn", a, b, out)


def gemm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a [batch, M, K] @ b[batch, N, K]^T (or 2-D), fp32, without transposing b in memory."""
    return _call("gemm_nt", a, b, out)


def scale_and_causal_mask(scores: torch.Tensor, scale: float, causal: bool = True) -> torch.Tensor:
    """In place on contiguous scores [batch, S, S]: *= scale, -inf above the diagonal if causal."""
    return _call("scale_and_causal_mask", scores, scale, causal)


def custom_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int,
                     causal: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) [+ causal mask]) v per head; q, k, v [B, S, hidden] fp32 CUDA."""
    return _call("custom_attention", q, k, v, num_heads, causal, out)


class CustomSelfAttention(nn.Module):
    """Multi-head self-attention with the weights of an nn.MultiheadAttention (no biases).

    w_q, w_k, w_v, w_o: [hidden_dim, hidden_dim] projection matrices (y = x @ w.T), fp32 CUDA.
    """

    def __init__(self, w_q, w_k, w_v, w_o, hidden_dim: int, num_heads: int):
        super().__init__()
        if hidden_dim % num_heads != 0:
            raise ValueError(f"hidden_dim {hidden_dim} is not divisible by num_heads {num_heads}.")
        self.w_q, self.w_k, self.w_v, self.w_o = w_q, w_k, w_v, w_o
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        # The projections are dense GEMMs that cuBLAS does best; the heads stay interleaved
        # in hidden, and custom_attention splits and merges them itself.
        q, k, v = x @ self.w_q.T, x @ self.w_k.T, x @ self.w_v.T
        out = custom_attention(q, k, v, self.num_heads, causal)
        return out @ self.w_o.T
