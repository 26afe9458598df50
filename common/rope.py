"""RoPE's cos/sin tables: one home for the layout that task 5's rope_append kernel reads and task 6's
model builds (task6/rope.py explains RoPE and applies it; task 5 sits below task 6 and must not
import it).

The tables are computed once, for max_seq_len positions, in float64 and stored as float32 (at
position 4000 a float32 angle would already be off by ~2e-4 rad).
"""

from __future__ import annotations

import torch


def rope_tables(head_dim: int, max_seq_len: int, base: float = 10000.0,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of p * theta_i, each [max_seq_len, head_dim] float32.

    Column i and column i + head_dim/2 hold the same angle (the two coordinates of point i),
    which is what lets `apply_rope` use one table for both halves.
    """
    if head_dim % 2 != 0:
        raise ValueError(f"RoPE rotates pairs of coordinates, so head_dim must be even (got {head_dim}).")
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)   # [D/2]
    angles = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * theta[None, :]  # [L, D/2]
    angles = torch.cat((angles, angles), dim=-1)                                       # [L, D]
    return angles.cos().float().to(device), angles.sin().float().to(device)
