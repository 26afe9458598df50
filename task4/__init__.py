"""Task 4: the fused FlashAttention-2 CUDA kernel (fp32, the course's), and a tensor-core one (fp16/bf16)."""
