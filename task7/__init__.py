"""Task 7: GPT-2 generating with our kernels (task 4 prefill, task 5 decode), checked against Hugging Face."""
