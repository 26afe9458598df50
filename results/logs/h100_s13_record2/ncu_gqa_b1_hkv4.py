"""One grouped-query decode at issue 32's b1_hq32_hkv4_ctx32768 (bf16, D 128) for ncu: three
warm-up calls, then the profiled one (ncu --launch-skip 3 --launch-count 1 -k regex:decode_gqa).
    PYTHONPATH=. ncu ... python results/logs/h100_s13_record2/ncu_gqa_b1_hkv4.py"""
import torch
import task5.attention as t5

gen = torch.Generator(device="cuda").manual_seed(3)
q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
k = torch.randn(1, 4, 32768, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
v = torch.randn(1, 4, 32768, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
for _ in range(4):
    flush.zero_()          # K and V out of L2 before each call
    out = t5.decode_attention_grouped(q, k, v)
torch.cuda.synchronize()
print("mean |out|", out.float().abs().mean().item())
