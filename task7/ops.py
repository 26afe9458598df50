"""Moved: the attention operations (our kernels, or the same in PyTorch) live in task5/ops.py,
shared by tasks 6 and 7. This name is kept so that `import task7.ops` keeps working."""

from task5.ops import BACKENDS, AttentionOps, kernel_ops, ops_for, torch_ops

__all__ = ["BACKENDS", "AttentionOps", "kernel_ops", "ops_for", "torch_ops"]
