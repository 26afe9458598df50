"""One backward call (fp16 B4 H32 S4096 D128, not causal) under an NVTX range, for ncu.
    ATTN_BWD_LAYOUT=wgmma|2d PYTHONPATH=. python .scratch/ncu_bwdw.py [causal]"""
import sys, torch
from task4.attention import flash_attention
causal = "causal" in sys.argv
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.float16, generator=g).requires_grad_() for _ in range(3))
do = torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.float16, generator=g)
out = flash_attention(q, k, v, causal)
torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("profile")
torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
