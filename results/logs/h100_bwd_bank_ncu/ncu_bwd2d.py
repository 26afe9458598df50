"""python .scratch/ncu_bwd2d.py ours|fa2 D [causal]: backwards (B4 H32 S4096 at D128, B8 H32 S2048 at D64; fp16) for ncu."""
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
who, d = sys.argv[1], int(sys.argv[2]); causal = len(sys.argv) > 3
g = torch.Generator(device="cuda").manual_seed(0)
b, s = (4, 4096) if d == 128 else (8, 2048)
q, k, v, do = (torch.randn(b, 32, s, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
for t in (q, k, v): t.requires_grad_(True)
for _ in range(2):
    if who == "fa2":
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        import os
        if who == "rows": os.environ["ATTN_BWD_LAYOUT"] = "rows"
        from task4.attention import flash_attention
        out = flash_attention(q, k, v, causal)
    torch.autograd.grad(out, (q, k, v), do)
torch.cuda.synchronize()
