"""How often does each fp16/bf16 backward case miss FlashAttention-2's criterion over fresh
draws, and do PyTorch's own backwards (SDPA pinned to FlashAttention-2 and to cuDNN) miss the
same criterion on the same inputs as often?

    DRAWS_TINY=1000 DRAWS_ALL=20 python results/logs/h100_s13_backward_flake/backward_flake.py

Writes $OUT/backward_flake.json; prints one line per case."""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common.variants import fa2_criterion
from task4.backward_checks import Case, _flash_gradients, _half_cases, case_inputs, formula_gradients

LABELS = ("out", "dq", "dk", "dv")


def sdpa_gradients(q, k, v, d_out, causal, backend):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal,
                                             enable_gqa=q.shape[1] != k.shape[1])
    out.backward(d_out)
    return (out.detach(), *(t.grad for t in leaves))


def judge(grads, truth, yardstick):
    """Per tensor: (passed, our error / bound)."""
    res = {}
    for label, ours, ref, pt in zip(LABELS, grads, truth, yardstick):
        ok, err, bound = fa2_criterion(ours, ref, pt)
        res[label] = (ok, err / bound)
    return res


def run_case(case: Case, draws: int, gen, device, peers: bool):
    tally = {name: {lab: [0, 0.0] for lab in LABELS} for name in ("ours", "flash", "cudnn")}
    worst_detail = None
    plain = case.extra == "" and case.seq_q == case.seq_k and case.logits == 1.0
    n_peer = {"flash": 0, "cudnn": 0}
    for _ in range(draws):
        q, k, v, d_out, variant = case_inputs(case, gen, device)
        truth = formula_gradients(q, k, v, d_out, variant, torch.float64)
        yard = formula_gradients(q, k, v, d_out, variant, q.dtype)
        runs = {"ours": _flash_gradients(q, k, v, d_out, variant)}
        if peers and plain:
            for name, be in (("flash", SDPBackend.FLASH_ATTENTION),
                             ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    runs[name] = sdpa_gradients(q, k, v, d_out.contiguous(), case.causal, be)
                    n_peer[name] += 1
                except RuntimeError:
                    pass
        for name, grads in runs.items():
            for lab, (ok, ratio) in judge(grads, truth, yard).items():
                t = tally[name][lab]
                t[0] += 0 if ok else 1
                t[1] = max(t[1], ratio)
                if name == "ours" and not ok and worst_detail is None:
                    i = LABELS.index(lab)
                    diff = (grads[i].double() - truth[i]).abs()
                    at = int(diff.argmax())
                    ref_at = truth[i].flatten()[at].item()
                    worst_detail = (f"{lab}: ours {grads[i].flatten()[at].item():.5g} "
                                    f"truth {ref_at:.5g} pt {yard[i].flatten()[at].item():.5g} "
                                    f"(|truth| max {truth[i].abs().max().item():.3g}, "
                                    f"pt max err {(yard[i].double() - truth[i]).abs().max().item():.2e})")
    return tally, n_peer, worst_detail


def main():
    device = torch.device("cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(int(os.environ.get("SEED", "12345")))
    tiny = int(os.environ.get("DRAWS_TINY", "1000"))
    every = int(os.environ.get("DRAWS_ALL", "20"))
    budget = float(os.environ.get("BUDGET_S", "200"))
    plan = []
    for dtype in (torch.float16, torch.bfloat16):
        for b, h in ((2, 4), (4, 8), (8, 16)):
            plan.append((Case(b, h, h, 7, 7, 64, True, dtype=dtype), tiny, True))
    for dtype in (torch.float16, torch.bfloat16):
        for case in _half_cases(dtype):
            if (case.seq_q, case.seq_k) == (7, 7):
                continue
            plan.append((case, every, True))
    out, start = [], time.time()
    for case, draws, peers in plan:
        if time.time() - start > budget:
            print(f"budget spent; skipped {case.label()}")
            continue
        t0 = time.time()
        tally, n_peer, detail = run_case(case, draws, gen, device, peers)
        row = {"case": case.label(), "draws": draws, "peer_draws": n_peer, "tally": tally,
               "first_fail": detail, "seconds": round(time.time() - t0, 2)}
        out.append(row)
        fails = {n: {lab: v[0] for lab, v in t.items() if v[0]}
                 for n, t in tally.items()}
        worst = {n: max(v[1] for v in t.values()) for n, t in tally.items()}
        print(f"{case.label():50s} draws {draws:4d} fails {fails} worst err/bound "
              + " ".join(f"{n} {w:.2f}" for n, w in worst.items()) + (f" | {detail}" if detail else ""),
              flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "backward_flake.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out},
                  f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
