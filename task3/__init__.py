"""Task 3: FlashAttention-2 (Algorithm 1, forward) in PyTorch."""
