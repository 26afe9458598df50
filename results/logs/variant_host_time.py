"""Issue 31: how much of a variant's measured time is host time on the routed path.
For leftpad/varlen/chunk/window (task4.hopper_variants' cases): per-call host time (perf_counter
over many calls without sync) and event-timed ms, interleaved, of flash_attention (routed), the
Python wrapper hopper.flash_attention_hopper(version 5) and the extension entry; then cProfile of
the routed call.   PYTHONPATH=. python .scratch/var_host.py"""
import cProfile, pstats, time
import torch
from common.timing import time_cuda, interleaved_medians
from task4 import attention, hopper, hopper_variants

gen = torch.Generator(device="cuda"); gen.manual_seed(0)
for case, (b, sq, sk, variant) in hopper_variants.cases(gen, "cuda").items():
    if case == "blockmask_s8192":
        continue
    q = torch.randn(b, 32, sq, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, 32, sk, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    kw = variant.kwargs(); causal = kw.pop("causal")
    fns = {"routed": lambda: attention.flash_attention(q, k, v, causal, **kw),
           "hopper_v5": lambda: hopper.flash_attention_hopper(q, k, v, causal, 5, **kw)}
    for name, fn in fns.items():
        for _ in range(5): fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50): fn()
        host = (time.perf_counter() - t0) / 50
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20): fn(); torch.cuda.synchronize()
        synced = (time.perf_counter() - t0) / 20
        print(f"{case:22s} {name:10s} host {host * 1e6:7.1f} us/call (queue-limited if ~GPU time), synced {synced*1e3:.4f} ms", flush=True)
    ms = interleaved_medians({n: (lambda reps, fn=fn: time_cuda(fn, warmup=3, repeats=reps).median_ms) for n, fn in fns.items()}, rounds=5, repeats=10)
    print("   event-timed ms:", {n: round(t, 4) for n, t in ms.items()}, flush=True)
    prof = cProfile.Profile(); prof.enable()
    for _ in range(50): fns["routed"]()
    prof.disable(); torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(8)
