"""Small launches of the general Hopper v7 (ATTN_HOPPER_GENERAL_VERSION=7; Tile::kVariantSchedule)
for compute-sanitizer (memcheck, racecheck, synccheck): left padding, varlen (a sequence of key
length 0), S_q =, <, > S_k, windows narrow and wide, causal and symmetric, sinks, more work
tiles than SMs, head dims 64 and 128 (96 on 128's), fp16. Each compared bit for bit with the
general v5 (ATTN_HOPPER_GENERAL_VERSION=5, the same inputs) and loosely with float64 (the tool,
not the criterion, is the point here).

    PYTHONPATH=. compute-sanitizer --tool racecheck python .scratch/general_v7_sanitize.py
(.scratch/ is git-ignored: carry=[".scratch/general_v7_sanitize.py"].)
"""
import os
import torch
from common.variants import Variant, reference_attention_variant
from task4 import hopper
torch.manual_seed(7)
bad = 0


def call(q, k, v, causal, mode, **kw):
    os.environ["ATTN_HOPPER_GENERAL_VERSION"] = mode
    lse = torch.empty(q.shape[:3], device="cuda")
    o = hopper.flash_attention_hopper(q, k, v, causal, 5, None, lse, **kw)
    torch.cuda.synchronize()
    return o, lse


SKIP = int(os.environ.get("SAN_SKIP", "0"))  # cases already run under a tool (a resumed racecheck)
done = 0


def run(name, q, k, v, causal, **kw):
    global bad, done
    done += 1
    if done <= SKIP:
        return
    o7, l7 = call(q, k, v, causal, "7", **kw)
    o5, l5 = call(q, k, v, causal, "5", **kw)
    same = torch.equal(o7.view(torch.int16), o5.view(torch.int16)) and torch.equal(l7.view(torch.int32), l5.view(torch.int32))
    ref = reference_attention_variant(q, k, v, Variant(causal=causal, **kw))
    err = (o7.double() - ref).abs().max().item()
    ok = err < 3e-2 and same
    bad += not ok
    print(name, causal, sorted(kw), f"{err:.1e}", "v7==v5" if same else "v7!=v5", "ok" if ok else "BAD", flush=True)


lens = torch.tensor([300, 77, 0], dtype=torch.int32, device="cuda")
for d in (128, 64):
    for sq, sk in ((300, 170), (300, 300), (130, 300)):
        q = torch.randn(3, 4, sq, d, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(3, 2, sk, d, device="cuda", dtype=torch.float16) for _ in range(2))
        for causal in (False, True):
            kws = [{"key_lengths": lens.clamp(max=sk), "left_padding": True}, {"key_lengths": lens.clamp(max=sk)},
                   {"window": 90}, {"window": 200}, {"sinks": torch.randn(4, device="cuda"), "key_lengths": lens.clamp(max=sk)}]
            if d == 64 or sq != 300 or sk != 300:
                kws = kws[:3]
            for kw in kws:
                run(f"d{d} sq{sq} sk{sk}", q, k, v, causal, **kw)
# More work tiles than SMs (B 6, H 8: up to 6 * 8 * 6 = 288 tiles), and zero chunks from every batch.
q = torch.randn(6, 8, 700, 128, device="cuda", dtype=torch.float16)
k, v = (torch.randn(6, 4, 700, 128, device="cuda", dtype=torch.float16) for _ in range(2))
many = torch.tensor([700, 650, 400, 129, 1, 0], dtype=torch.int32, device="cuda")
run("many tiles leftpad", q, k, v, True, key_lengths=many, left_padding=True)
run("many tiles varlen", q, k, v, True, key_lengths=many)
print("bad", bad)
