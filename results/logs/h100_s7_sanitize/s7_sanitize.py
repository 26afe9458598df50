"""Small launches of this session's new Hopper paths for compute-sanitizer: head_dim 256's 80-key
tile (dense v5 -> v4 schedule, and v5 on 80 via ATTN_HOPPER_D256_TILE=80), the general v5's split
key loop and the aligned variant tiling (left padding, varlen, window, S_q < S_k, S_q > S_k,
sinks) at head dims 64 and 128; each against float64 (loose bound: the tool is the point)."""
import os
import torch
from common.variants import Variant, reference_attention_variant
from task4 import hopper
torch.manual_seed(0)
bad = 0
def run(name, q, k, v, causal, **kw):
    global bad
    o = hopper.flash_attention_hopper(q, k, v, causal, 5, **kw)
    ref = reference_attention_variant(q, k, v, Variant(causal=causal, **kw))
    err = (o.double() - ref).abs().max().item()
    ok = err < 3e-2
    bad += not ok
    print(name, causal, sorted(kw), f"{err:.1e}", "ok" if ok else "BAD", flush=True)
for tile in ("80fa3", "80"):
    os.environ["ATTN_HOPPER_D256_TILE"] = tile
    for causal in (False, True):
        q = torch.randn(1, 2, 200, 256, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, 1, 241, 256, device="cuda", dtype=torch.float16) for _ in range(2))
        run(f"d256 tile {tile}", q, k, v, causal)
os.environ.pop("ATTN_HOPPER_D256_TILE")
lens = torch.tensor([300, 77], dtype=torch.int32, device="cuda")
for d in (64, 128):
    for sq, sk in ((300, 300), (130, 300), (300, 170)):
        q = torch.randn(2, 4, sq, d, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(2, 2, sk, d, device="cuda", dtype=torch.float16) for _ in range(2))
        for causal in (True, False):
            for kw in ({"key_lengths": lens.clamp(max=sk), "left_padding": True}, {"key_lengths": lens.clamp(max=sk)},
                       {"window": 90}, {"sinks": torch.randn(4, device="cuda")}):
                run(f"d{d} sq{sq} sk{sk}", q, k, v, causal, **kw)
print("bad", bad)
