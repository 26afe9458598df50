"""One left-padded decode at b8, 32/8 heads, 8192 keys, D 128, fp16, structured then on the mask
route (the same call with the equal bool mask), for ncu:
    ncu --launch-skip 2 --launch-count 2 -k regex:decode_gqa --section SpeedOfLight \
        --section WarpStateStats --section MemoryWorkloadAnalysis python ncu_mask_route.py"""
import torch
from task5.attention import attention

g = torch.Generator(device="cuda").manual_seed(0)
b, hq, hkv, sk, d = 8, 32, 8, 8192, 128
q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.float16, generator=g)
k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16, generator=g)
v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16, generator=g)
pads = torch.randint(0, sk // 4, (b,), device="cuda", generator=g)
lengths = (sk - pads).to(torch.int32)
mask = (torch.arange(sk, device="cuda")[None, :] >= pads[:, None])[:, None, None, :]
for with_mask in (False, True):   # warm-up of both
    attention(q, k, v, causal=True, key_lengths=lengths, left_padding=True, mask=mask if with_mask else None)
torch.cuda.synchronize()
attention(q, k, v, causal=True, key_lengths=lengths, left_padding=True)              # profiled: structured
attention(q, k, v, causal=True, key_lengths=lengths, left_padding=True, mask=mask)   # profiled: mask route
torch.cuda.synchronize()
