"""A few tiny launches of the wgmma backward, for compute-sanitizer (memcheck, racecheck,
synccheck; initcheck too if wanted):

    ATTN_BWD_LAYOUT=wgmma PYTHONPATH=. compute-sanitizer --tool memcheck python .scratch/bwd_wgmma_sanitize.py
    ... --tool racecheck ...   ... --tool synccheck ...

(build the extensions first, outside the sanitizer: PYTHONPATH=. python .scratch/bwd_wgmma_sanitize.py)
d64 and d128, fp16 (and one bf16), causal and not, GQA, odd lengths (S_q != S_k both ways),
each through task4.attention.flash_attention's autograd with the wgmma backward; prints the
max error against float64 per case (not the criterion: the sanitizer is the check here) and
asserts the wgmma kernel ran.
"""
import os
import sys

import torch

from task4 import backward
from task4.attention import flash_attention

os.environ["ATTN_BWD_LAYOUT"] = "wgmma"
calls = []
_original = backward._wgmma_backward


def _spy(*args):
    ext = _original(*args)
    calls.append(ext is not None)
    return ext


backward._wgmma_backward = _spy

CASES = [  # (B, H_q, H_kv, S_q, S_k, D, causal, dtype)
    (1, 2, 2, 130, 130, 64, False, torch.float16),
    (1, 2, 2, 130, 130, 128, True, torch.float16),
    (1, 4, 2, 77, 200, 64, True, torch.float16),     # GQA, S_q < S_k
    (1, 4, 1, 200, 77, 128, True, torch.float16),    # MQA, S_q > S_k (rows that see no key)
    (1, 2, 2, 257, 129, 128, False, torch.bfloat16),
    (1, 2, 2, 5, 300, 96, True, torch.float16),      # padded head dim
]


def reference(q, k, v, d_out, causal):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    (p @ vv).backward(d_out.double())
    return q.grad, k.grad, v.grad


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    for b, hq, hkv, sq, sk, d, causal, dtype in CASES:
        q = torch.randn(b, hq, sq, d, device="cuda", generator=g, dtype=dtype).requires_grad_()
        k = torch.randn(b, hkv, sk, d, device="cuda", generator=g, dtype=dtype).requires_grad_()
        v = torch.randn(b, hkv, sk, d, device="cuda", generator=g, dtype=dtype).requires_grad_()
        d_out = torch.randn(b, hq, sq, d, device="cuda", generator=g, dtype=dtype)
        n = len(calls)
        flash_attention(q, k, v, causal=causal).backward(d_out)
        torch.cuda.synchronize()
        assert calls[n:] == [True], f"the wgmma backward did not run: {calls[n:]}"
        ref = reference(q, k, v, d_out, causal)
        errs = [(a.double() - r).abs().max().item() for a, r in zip((q.grad, k.grad, v.grad), ref)]
        print(f"B{b} H{hq}/{hkv} Sq{sq} Sk{sk} D{d} {'causal' if causal else 'full'} {dtype}: "
              f"max err dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e}", flush=True)
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
