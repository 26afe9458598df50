"""Task 1: multi-head self-attention written naively in PyTorch."""
