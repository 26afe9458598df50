"""Argument checks for the attention modules: one clear Python error per mistake.

The modules of tasks 1 and 3 call these at their boundary (the constructor and the start of
forward), outside the code a student writes, so a wrong call fails with a sentence that says
what to change instead of a torch error from deep inside a matrix product (or, worse, a
silently wrong result). ValueError for a wrong value or shape, TypeError for a wrong type
or dtype.
"""

from __future__ import annotations

import torch


def check_heads(hidden_dim, num_heads) -> int:
    """hidden_dim and num_heads are positive integers and num_heads divides hidden_dim;
    returns head_dim."""
    for name, value in (("hidden_dim", hidden_dim), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
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
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int (rows per tile), got {type(value).__name__} "
                            f"{value!r}.")
        if value <= 0:
            raise ValueError(f"{name} must be a positive number of rows, got {value}.")


def check_qkv(q, k, v) -> None:
    """q [B, H, Sq, D], k and v [B, H, Sk, D]: same batch, heads, head_dim, dtype and device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [batch, heads, seq, head_dim], got "
                            f"{type(t).__name__}.")
        if t.dim() != 4:
            raise ValueError(f"{name} must be [batch, heads, seq, head_dim] (4 dimensions), got "
                             f"shape {tuple(t.shape)}.")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape.")
    if (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, heads "
                         "and head_dim (dimensions 0, 1 and 3); only the sequence lengths may differ.")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}.")
    if not q.is_floating_point():
        raise TypeError(f"q, k, v must be floating point, got {q.dtype}.")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}.")
