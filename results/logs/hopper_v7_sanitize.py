"""Small v7 launches (the persistent kernel) for compute-sanitizer: more work tiles than SMs so
each CTA takes several (the work-tile slot is reused), head dims 64/96/128, causal and not, GQA;
each compared with float64 (loose bound: the tool is the point)."""
import torch
from common.variants import Variant, reference_attention_variant
from task4 import hopper
torch.manual_seed(0)
bad = 0
for d in (64, 96, 128):
    for causal in (False, True):
        q = torch.randn(4, 16, 520, d, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(4, 8, 520, d, device="cuda", dtype=torch.float16) for _ in range(2))
        o = hopper.flash_attention_hopper(q, k, v, causal, 7)
        ref = reference_attention_variant(q, k, v, Variant(causal=causal))
        err = (o.double() - ref).abs().max().item()
        bad += not err < 3e-2
        print(d, causal, f"{err:.1e}", "ok" if err < 3e-2 else "BAD", flush=True)
print("bad", bad)
