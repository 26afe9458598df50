"""Task 5: the KV cache, the decode kernel and split-KV FlashDecoding."""
