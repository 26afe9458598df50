"""Rung b3 of the wgmma backward (ATTN_BWD_LAYOUT=wgmma, ATTN_BWD_WGMMA_DQ=reduce: dQ staged in
shared memory, added by a producer warp's bulk reduce-adds) against rung b2 (ATTN_BWD_WGMMA_DQ=
atomic: float2 atomics), the mma.sync 2-D backward (=2d) and SDPA's FLASH and cuDNN backends,
one process, on an H100. (A copy of .scratch/bwd_wgmma_ab.py of the b2 run, with the
early-dV arm replaced by the two dQ modes.)

    PYTHONPATH=. python .scratch/bwd_b3_ab.py       # writes $OUT/bwd_b3_ab.json (or ./)
    PYTHONPATH=. python .scratch/bwd_b3_ab.py --checks-only

1. Checks, fp16 and bf16 (task4/backward_checks.py helpers): dq, dk, dv of
   task4.attention.flash_attention with ATTN_BWD_LAYOUT=wgmma against float64 by
   FlashAttention-2's criterion, on d64 / d128 (and 96 on the 128 tile), causal and not, odd
   lengths (257; S_q 300 / S_k 170 and 170 / 300, causal bottom-right), GQA 8/2, MQA, logits
   x6, dO not contiguous (case_inputs' default: every other column); every case under both
   ATTN_BWD_WGMMA_DQ=reduce and =atomic. Each case runs twice per mode: dk
   and dv must be bit-identical (no atomics reach them). A spy on task4.backward._wgmma_backward
   asserts the wgmma kernel ran. One line per case. Timing is skipped if any check fails.
2. Timing: the backward alone (torch.autograd.grad on a retained graph) of ATTN_BWD_LAYOUT=2d,
   =wgmma with ATTN_BWD_WGMMA_DQ=atomic (b2) and =reduce (b3), SDPA FLASH and SDPA cuDNN on
   b4_h32_s4096_d128, b8_h32_s2048_d64,
   b1_h32_s16384_d128, causal and not, fp16 and bf16, alternating rounds
   (common.timing.interleaved_samples), medians; ratio_vs_sdpa_* = SDPA's time / ours. Before
   timing a shape, each wgmma mode's dq / dk / dv are compared with 2d's (max abs diff relative to the
   largest element: both are fp32-accumulated roundings of the same sums, so a mismatch beyond
   a few ulp means a bug the small cases missed).
A failing case prints its traceback and the script goes on.
"""
import json
import os
import sys
import time
import traceback

import torch

from common.timing import attention_flops, interleaved_samples, tflops, time_cuda
from task4.backward_checks import (
    Case,
    _bits,
    _criterion_details,
    _flash_gradients,
    case_inputs,
    formula_gradients,
)

started = time.time()
LAYOUT = "ATTN_BWD_LAYOUT"
DQ = "ATTN_BWD_WGMMA_DQ"
# contender -> (ATTN_BWD_LAYOUT, ATTN_BWD_WGMMA_DQ)
SETTINGS = {"2d": ("2d", None), "wgmma_atomic": ("wgmma", "atomic"), "wgmma_reduce": ("wgmma", "reduce")}
WGMMA = ("wgmma_atomic", "wgmma_reduce")


def set_layout(value):
    """value: a SETTINGS key, or None (both variables unset)."""
    layout, dq = SETTINGS[value] if value is not None else (None, None)
    for name, v in ((LAYOUT, layout), (DQ, dq)):
        if v is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = v


def install_spy():
    from task4 import backward

    calls = []
    original = backward._wgmma_backward

    def spy(*args):
        ext = original(*args)
        calls.append(ext is not None)
        return ext

    backward._wgmma_backward = spy
    return calls


def small_cases(dtype):
    def case(*args, **kwargs):
        return Case(*args, dtype=dtype, **kwargs)

    return [
        case(1, 1, 1, 1, 1, 64), case(1, 1, 1, 1, 1, 128, True),
        case(2, 4, 4, 257, 257, 64), case(2, 4, 4, 257, 257, 64, True),
        case(2, 4, 4, 257, 257, 128), case(2, 4, 4, 257, 257, 128, True),
        case(1, 4, 4, 300, 170, 64, True), case(1, 4, 4, 170, 300, 64, True),      # bottom-right
        case(1, 4, 4, 300, 170, 128, True), case(1, 4, 4, 170, 300, 128, True),
        case(1, 4, 4, 300, 170, 128), case(1, 4, 4, 170, 300, 64),
        case(2, 8, 2, 333, 333, 64, True), case(2, 8, 2, 333, 333, 128),            # GQA 8/2
        case(2, 8, 2, 1000, 700, 128, True), case(2, 8, 2, 700, 1000, 64, True),
        case(2, 8, 1, 200, 300, 64, True), case(2, 8, 1, 300, 200, 128),             # MQA
        case(1, 2, 2, 1000, 1000, 64, True), case(1, 2, 2, 1000, 1000, 128, True),
        case(1, 2, 2, 2048, 2048, 128), case(1, 2, 2, 2048, 2048, 64, True),
        case(2, 2, 2, 333, 333, 96, True), case(2, 2, 2, 333, 333, 72),             # on the 128 tile
        case(2, 4, 4, 300, 300, 64, True, "scale"), case(2, 4, 2, 300, 300, 128, True, "views"),
        case(2, 4, 2, 200, 200, 128, True, "expanded"),
        case(2, 4, 2, 1000, 1000, 64, False, logits=6.0), case(2, 4, 2, 1000, 1000, 128, True, logits=6.0),
        case(2, 4, 2, 257, 257, 128, False, logits=6.0), case(2, 4, 2, 257, 257, 64, True, logits=6.0),
    ]


def small_checks(gen, device, report, calls):
    failed = 0
    for dtype in (torch.float16, torch.bfloat16):
        for case in small_cases(dtype):
            label = case.label()
            try:
                q, k, v, d_out, variant = case_inputs(case, gen, device)
                truth = formula_gradients(q, k, v, d_out, variant, torch.float64)
                yardstick = formula_gradients(q, k, v, d_out, variant, q.dtype)
                ok, details = True, []
                for which in WGMMA:
                    set_layout(which)
                    n = len(calls)
                    first = _flash_gradients(q, k, v, d_out, variant)
                    second = _flash_gradients(q, k, v, d_out, variant)
                    set_layout(None)
                    ran = len(calls) == n + 2 and all(calls[n:])
                    ok1, d1 = _criterion_details(first, truth, yardstick)
                    ok2, _ = _criterion_details(second, truth, yardstick)
                    same = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(first[2:], second[2:], strict=True))
                    finite = all(torch.isfinite(g).all().item() for g in first[1:])
                    if not same:
                        d1.append("dk/dv NOT bit-identical run to run")
                    if not ran:
                        d1.append("the wgmma backward did NOT run")
                    if not finite:
                        d1.append("non-finite gradients")
                    ok = ok and ok1 and ok2 and same and ran and finite
                    details += [f"[{which}]"] + d1
                    del first, second
                del truth, yardstick
            except Exception:
                set_layout(None)
                ok, details = False, ["raised:\n" + traceback.format_exc()]
            failed += not ok
            report["small"].append({"case": label, "pass": ok, "details": details})
            print(f"{'PASS' if ok else 'FAIL'}  {label}: {'; '.join(details)}", flush=True)
        torch.cuda.empty_cache()
    return failed


SHAPES = ("b4_h32_s4096_d128", "b8_h32_s2048_d64", "b1_h32_s16384_d128")
CONTENDERS = ("2d", "wgmma_atomic", "wgmma_reduce", "sdpa_flash", "sdpa_cudnn")
OURS = ("2d", "wgmma_atomic", "wgmma_reduce")


def sdpa_timer(backend, leaves, d_out, causal, warmup):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    if backend is None:
        return None, "this torch has no such backend"
    try:
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        torch.autograd.grad(out, leaves, d_out, retain_graph=True)
        torch.cuda.synchronize()
    except RuntimeError as err:
        return None, str(err).strip().splitlines()[0][:120]

    def run():
        torch.autograd.grad(out, leaves, d_out, retain_graph=True)

    return (lambda reps: time_cuda(run, warmup=warmup, repeats=reps).median_ms), None


def grads_of(out, leaves, d_out, layout):
    set_layout(layout)
    try:
        return torch.autograd.grad(out, leaves, d_out, retain_graph=True)
    finally:
        set_layout(None)


def timing(gen, device, report):
    from torch.nn.attention import SDPBackend

    from task4.attention import flash_attention

    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                "sdpa_cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}
    print(f"\n{'case':36s} " + " ".join(f"{n[:10]:>10s}" for n in CONTENDERS)
          + "   red/flash red/cudnn atom/flash  2d/flash red/atom   (ms; ratio = SDPA's time / ours;"
          + " red/atom = atomic's time / reduce's; red = wgmma_reduce (b3), atom = wgmma_atomic (b2))",
          flush=True)
    for dtype_name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        for shape in SHAPES:
            b, h, s, d = (int(x[1:]) for x in shape.split("_"))
            warmup, rounds, repeats = (2, 4, 6) if s <= 4096 else (1, 3, 3)
            q, k, v, d_out = (torch.randn(b, h, s, d, device=device, generator=gen, dtype=dtype)
                              for _ in range(4))
            for causal in (False, True):
                name = f"{dtype_name}.{shape}.{'causal' if causal else 'noncausal'}"
                try:
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                    out = flash_attention(*leaves, causal=causal)
                    # Each wgmma mode's dq / dk / dv beside 2d's (a sanity check at the timed size).
                    g2 = grads_of(out, leaves, d_out, "2d")
                    rel = {}
                    for which in WGMMA:
                        gw = grads_of(out, leaves, d_out, which)
                        rel[which] = [((a.float() - b_.float()).abs().max()
                                       / b_.float().abs().max().clamp_min(1e-30)).item()
                                      for a, b_ in zip(gw, g2, strict=True)]
                        del gw
                    del g2

                    def ours(layout, out=out, leaves=leaves, d_out=d_out, warmup=warmup):
                        def run():
                            torch.autograd.grad(out, leaves, d_out, retain_graph=True)

                        def timer(reps):
                            set_layout(layout)
                            try:
                                return time_cuda(run, warmup=warmup, repeats=reps).median_ms
                            finally:
                                set_layout(None)
                        return timer

                    timers, refused = {n: ours(n) for n in OURS}, {}
                    for peer, backend in backends.items():
                        timer, why = sdpa_timer(backend, leaves, d_out, causal, warmup)
                        if timer is None:
                            refused[peer] = why
                        else:
                            timers[peer] = timer
                    samples = interleaved_samples(timers, rounds=rounds, repeats=repeats)
                    ms = {n: sorted(v_)[len(v_) // 2] for n, v_ in samples.items()}
                    flops = 2.5 * attention_flops(b, h, s, s, d, causal)
                    entry = {"ms": ms, "samples_ms": samples, "refused": refused,
                             "tflops": {n: tflops(flops, t) for n, t in ms.items()},
                             "wgmma_vs_2d_max_rel_diff": {w: dict(zip(("dq", "dk", "dv"), r, strict=True))
                                                          for w, r in rel.items()}}
                    for peer in ("sdpa_flash", "sdpa_cudnn"):
                        if peer in ms:
                            entry[f"ratio_vs_{peer}"] = {n: ms[peer] / ms[n] for n in OURS if n in ms}
                    report["timing"][name] = entry

                    def ratio(n, peer):
                        return f"{ms[peer] / ms[n]:11.3f}" if peer in ms and n in ms else f"{'-':>11s}"

                    print(f"{name:36s} " + " ".join(f"{ms[n]:10.3f}" if n in ms else f"{'-':>10s}"
                                                    for n in CONTENDERS)
                          + f"   {ratio('wgmma_reduce', 'sdpa_flash')} {ratio('wgmma_reduce', 'sdpa_cudnn')}"
                          + f" {ratio('wgmma_atomic', 'sdpa_flash')} {ratio('2d', 'sdpa_flash')}"
                          + f" {ratio('wgmma_reduce', 'wgmma_atomic')}"
                          + "   rel diff vs 2d " + "; ".join(
                              f"{w[6:]} dq {r[0]:.1e} dk {r[1]:.1e} dv {r[2]:.1e}" for w, r in rel.items()),
                          flush=True)
                    del out, leaves, timers
                except Exception:
                    set_layout(None)
                    report["timing"][name] = {"error": traceback.format_exc()}
                    print(f"FAIL  {name}:\n{traceback.format_exc()}", flush=True)
                torch.cuda.empty_cache()
            del q, k, v, d_out
            torch.cuda.empty_cache()


def main():
    assert torch.cuda.is_available(), "this A/B needs a GPU"
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "small": [], "timing": {}}
    path = os.path.join(os.environ.get("OUT", "."), "bwd_b3_ab.json")
    try:
        from task4 import hopper
        from task4.attention import _extension

        _extension()   # the builds, outside the timings
        hopper.load()
        print(f"built/loaded in {time.time() - started:.0f} s; {report['device']}", flush=True)
        calls = install_spy()
        failed = small_checks(gen, device, report, calls)
        report["failed"] = failed
        print(f"checks: {failed} failure(s) ({time.time() - started:.0f} s)", flush=True)
        if failed:
            print("timing skipped: a check failed", flush=True)
        elif "--checks-only" not in sys.argv:
            timing(gen, device, report)
    except Exception:
        report["error"] = traceback.format_exc()
        print(report["error"], flush=True)
    finally:
        set_layout(None)
        report["seconds"] = time.time() - started
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {path} ({report['seconds']:.0f} s)", flush=True)
    return 1 if report.get("error") or report.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
