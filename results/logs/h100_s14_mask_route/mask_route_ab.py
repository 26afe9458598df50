"""What a left-padded decode costs on the mask route instead of the structured one: the question
behind a decode plan with no host read (task 7 would then hand the kernel transformers' bool mask
and the key lengths it implies, computed on the GPU, instead of first asking the host whether the
mask is one key range). task5.attention.attention with key_lengths + left_padding (structured)
against the same call with the equal bool mask [B, 1, 1, S_k] added (the mask route), fp16,
CUDA-graph replays (32 calls per graph over 2 input sets), 7 interleaved rounds, one process.
    PYTHONPATH=. python results/logs/h100_s14_mask_route/mask_route_ab.py   (writes $OUT/mask_route_ab.json)
"""
import json, os, time
import torch
from common.graphs import graph_per_call_timer
from common.harness import env_setting
from common.timing import interleaved_medians
from task5.attention import attention

OUT = os.environ.get("OUT", ".")
# MASK_ROUTE_VOTE_ARM=1: the mask route with and without decode_gqa.cu's mask vote (branch
# gqa-mask-vote); without it, the first run's two arms.
VOTE_ARM = os.environ.get("MASK_ROUTE_VOTE_ARM") == "1"
SHAPES = [  # (batch, query heads, KV heads, keys, head_dim)
    (8, 32, 8, 8192, 128), (4, 32, 8, 1074, 128), (1, 32, 8, 32768, 128), (64, 32, 8, 1024, 128),
    (3, 14, 2, 88, 64), (3, 8, 2, 88, 32)]
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
       "commit": os.environ.get("ATTN_COMMIT"), "what": __doc__, "shapes": {}}
gen = torch.Generator(device="cuda").manual_seed(0)
t0 = time.time()
for b, hq, hkv, sk, d in SHAPES:
    sets = []
    for _ in range(2):
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.float16, generator=gen)
        k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16, generator=gen)
        v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16, generator=gen)
        pads = torch.randint(0, max(1, sk // 4), (b,), device="cuda", generator=gen)
        pads[0] = 0
        lengths = (sk - pads).to(torch.int32)
        mask = (torch.arange(sk, device="cuda")[None, :] >= pads[:, None])[:, None, None, :]
        sets.append((q, k, v, lengths, mask))

    def structured(q, k, v, lengths, mask):
        return attention(q, k, v, causal=True, key_lengths=lengths, left_padding=True)

    def mask_route(q, k, v, lengths, mask):
        return attention(q, k, v, causal=True, key_lengths=lengths, left_padding=True, mask=mask)

    def mask_elementwise(*inputs):  # the mask route without the mask vote (read at capture)
        with env_setting("ATTN_GQA_MASK_VOTE", "0"):
            return mask_route(*inputs)

    same = all(torch.equal(structured(*s), mask_route(*s)) and torch.equal(structured(*s), mask_elementwise(*s))
               for s in sets)
    diff = max((structured(*s).float() - mask_route(*s).float()).abs().max().item() for s in sets)
    timers = {"structured": graph_per_call_timer(structured, sets),
              "mask": graph_per_call_timer(mask_route, sets)}
    if VOTE_ARM:
        timers["mask_elementwise"] = graph_per_call_timer(mask_elementwise, sets)
    med = interleaved_medians(timers, rounds=7, repeats=20)
    name = f"b{b}_hq{hq}_hkv{hkv}_ctx{sk}_d{d}"
    res["shapes"][name] = {f"{arm}_us": t * 1e3 for arm, t in med.items()}
    res["shapes"][name].update(bit_equal=same, max_abs_diff=diff)
    line = "   ".join(f"{arm} {t * 1e3:8.2f} us ({t / med['structured']:.3f})" for arm, t in med.items())
    print(f"{name:28s} {line}   outputs bit-equal {same} (max diff {diff:.2e})", flush=True)
print(f"{time.time() - t0:.0f} s")
json.dump(res, open(os.path.join(OUT, "mask_route_ab.json"), "w"), indent=1)
