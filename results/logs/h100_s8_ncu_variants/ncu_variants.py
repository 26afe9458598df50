"""python .scratch/ncu_variants.py dense|varlen|leftpad|window: one case of task4.hopper_variants (fp16) through
flash_attention as routed, run twice, for ncu (--launch-skip 1 on the attention kernel)."""
import sys, torch
from task4.attention import flash_attention
which = sys.argv[1]
g = torch.Generator(device="cuda").manual_seed(0)
b, s = (1, 16384) if which in ("window", "dense16k") else (4, 4096)
q, k, v = (torch.randn(b, 32, s, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
lengths = torch.tensor([4096, 3000, 2048, 1024], dtype=torch.int32, device="cuda")
full = torch.full((4,), 4096, dtype=torch.int32, device="cuda")
kw = {"dense": {}, "dense16k": {}, "varlen": {"key_lengths": lengths}, "leftpad": {"key_lengths": lengths, "left_padding": True},
      "window": {"window": 4096}, "keyfull": {"key_lengths": full}, "winfull": {"window": 4096}}[which]
flash_attention(q, k, v, True, **kw)  # the Hopper probe's small launches and warm-up
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("profile")
flash_attention(q, k, v, True, **kw)
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
