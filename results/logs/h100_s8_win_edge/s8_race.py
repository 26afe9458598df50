"""Racecheck of the general v5's one-sided edge masks (win-edge) and the three launches s7 left:
d128 (and d64) general v5, window narrow/wide, left padding, varlen, sinks, S_q =, <, > S_k."""
import os, sys
import torch
from common.variants import Variant, reference_attention_variant
from task4 import hopper
torch.manual_seed(1)
bad = 0
def run(name, q, k, v, causal, **kw):
    global bad
    o = hopper.flash_attention_hopper(q, k, v, causal, 5, **kw)
    ref = reference_attention_variant(q, k, v, Variant(causal=causal, **kw))
    err = (o.double() - ref).abs().max().item()
    ok = err < 3e-2
    bad += not ok
    print(name, causal, sorted(kw), f"{err:.1e}", "ok" if ok else "BAD", flush=True)
lens = torch.tensor([300, 77], dtype=torch.int32, device="cuda")
for d in (128, 64):
    for sq, sk in ((300, 170), (300, 300), (130, 300)):
        q = torch.randn(2, 4, sq, d, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(2, 2, sk, d, device="cuda", dtype=torch.float16) for _ in range(2))
        for causal in (False, True):
            kws = [{"key_lengths": lens.clamp(max=sk), "left_padding": True}, {"key_lengths": lens.clamp(max=sk)},
                   {"window": 90}, {"window": 200}, {"sinks": torch.randn(4, device="cuda")}]
            if d == 64: kws = kws[2:4]
            for kw in kws:
                run(f"d{d} sq{sq} sk{sk}", q, k, v, causal, **kw)
print("bad", bad)
