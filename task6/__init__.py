"""Task 6: a dummy LLM (RoPE, pre-LN, SwiGLU) whose prefill and decode run on our kernels."""
