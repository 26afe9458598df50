"""Task 2: naive multi-head attention in CUDA (softmax, tiled GEMMs, scale/mask, host pipeline)."""
