"""Issue 31: what the general instantiation costs on tiles that need no predicate. B4 H32 S4096
D128 causal fp16/bf16, one process, alternating rounds: dense v5; general v5 with key lengths all
4096 (no key masked: the general kernel's own cost); with a window of 4096 (likewise); then
leftpad with the bench's lengths 4096/3000/2048/1024, and each length alone as dense causal
(B1, so that its efficiency enters the intrinsic bound).  PYTHONPATH=. python .scratch/general_overhead.py"""
import torch
from common.timing import time_cuda, interleaved_medians
from task4 import hopper
for dtype in (torch.float16, torch.bfloat16):
    q, k, v = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=dtype) for _ in range(3))
    full = torch.full((4,), 4096, dtype=torch.int32, device="cuda")
    lens = torch.tensor([4096, 3000, 2048, 1024], dtype=torch.int32, device="cuda")
    fns = {"dense_v5": lambda: hopper.flash_attention_hopper(q, k, v, True, 5),
           "general_full_lengths": lambda: hopper.flash_attention_hopper(q, k, v, True, 5, key_lengths=full),
           "general_window4096": lambda: hopper.flash_attention_hopper(q, k, v, True, 5, window=4096),
           "leftpad": lambda: hopper.flash_attention_hopper(q, k, v, True, 5, key_lengths=lens, left_padding=True),
           "varlen": lambda: hopper.flash_attention_hopper(q, k, v, True, 5, key_lengths=lens)}
    for L in (3000, 2048, 1024):
        qq, kk, vv = (t[:1, :, :L].contiguous() for t in (q, k, v))
        fns[f"dense_b1_s{L}"] = (lambda qq=qq, kk=kk, vv=vv: hopper.flash_attention_hopper(qq, kk, vv, True, 5))
    fns["dense_b1_s4096"] = lambda: hopper.flash_attention_hopper(q[:1], k[:1], v[:1], True, 5)
    ms = interleaved_medians({n: (lambda reps, fn=fn: time_cuda(fn, warmup=3, repeats=reps).median_ms) for n, fn in fns.items()}, rounds=5, repeats=10)
    pairs = {L: 32 * L * (L + 1) / 2 for L in (4096, 3000, 2048, 1024)}
    dense_rate = 4 * pairs[4096] / ms["dense_v5"]
    print(dtype, {n: round(t, 4) for n, t in ms.items()})
    print("  rate vs dense_v5:", {n: round((4 * pairs[4096] if n.startswith("general") else sum(pairs.values()) if n in ("leftpad", "varlen") else pairs[int(n.split("_s")[1])]) / ms[n] / dense_rate, 3)
                                 for n in ms if n != "dense_v5"}, flush=True)
    t_ideal = sum(pairs[L] / (pairs[L] / ms[f"dense_b1_s{L}"]) for L in pairs)
    print("  leftpad efficiency if each sequence ran as its own dense causal:", round(sum(pairs.values()) / t_ideal / dense_rate, 3))
