"""Issue 31, branch general-v7: the general Hopper v7 (persistent, work tiles ordered on the device:
flash_attention_hopper.cuh, Tile::kVariantSchedule) against the general v5, checked, compared bit
for bit, A/B-timed.

    PYTHONPATH=. python .scratch/general_v7_ab.py        (writes $OUT/general_v7_ab.json)

(.scratch/ is git-ignored: a device run needs carry=[".scratch/general_v7_ab.py"].)

ATTN_HOPPER_GENERAL_VERSION (read by the host entry on every call) picks the kernel of a general
call of version 5, 6 or 7: unset or "5" (default), the general v5; "7", the general v7 where it
takes the call (head_dim 64, 96, 128; no mask tensor, no softcap; the aligned tiling; at most 256
batches), the general v5 elsewhere. So softcap, mask tensors, head_dim 256 and
ATTN_HOPPER_VARIANT_ALIGN=0/2 run the same kernel in both settings.

1. Correctness: small odd cases (left padding, varlen, a sequence of key length 0, S_q != S_k,
   windows narrower and wider than a tile, causal and symmetric, sinks, a scale, more work tiles
   than SMs, more batches than work tiles per head; head dims 64, 96, 128; fp16, bf16) through
   task4.hopper.flash_attention_hopper v5 against float64 by FlashAttention-2's criterion
   (common.variants.check_variant: NaN-poisoned output, two runs bit-identical), in both
   settings; the lse against float64; general v7 == general v5 bit for bit (output and lse) on
   every case; and, by the profiler, that "7" launched the Tile<., 7, true> kernel (not v5).
2. Timing, alternating rounds (common.timing.interleaved_samples, medians): task4.hopper_variants'
   cases (leftpad_b4_s4096, varlen_b4_s4096, window4096_s16384, chunk1024_after7168: the chunk
   runs the dense kernel, a control) and padded batches of shorter lengths (B 8, S 2048, key
   lengths 2048 down to 512, left-padded and right-padded; B 16, S 1024, lengths 1024 down to
   64, left-padded) through task4.attention.flash_attention as routed, v5 vs v7 beside dense
   causal (routed) of the same B, H, S_k, D; efficiency as task4.hopper_variants defines it
   (TFLOP/s on the visible pairs / dense causal TFLOP/s).
"""
import json
import os
import statistics
import sys
import time

import torch

from common.checks import poisoned_empty
from common.timing import interleaved_samples, time_cuda
from common.variants import Variant, check_variant, reference_lse_variant
from task4 import hopper, hopper_variants as hv
from task4.attention import flash_attention

ENV = "ATTN_HOPPER_GENERAL_VERSION"
MODES = ("5", "7")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
t_start = time.time()
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(31)
OUT = os.environ.get("OUT", ".")
result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
          "checks": [], "bit_identity": [], "kernel_launched": [], "timing": {}}


def set_mode(mode: str) -> None:
    os.environ[ENV] = mode


def lens(*xs):
    return torch.tensor(xs, dtype=torch.int32, device=dev)


def small_cases():
    """(name, B, H_q, H_kv, S_q, S_k, variant)."""
    sinks = torch.randn(4, device=dev, generator=gen) * 2
    rand_lens = torch.randint(0, 700, (11,), generator=gen, device=dev).to(torch.int32)
    rand_lens[3] = 0
    rand_lens[7] = 700
    return [
        # key lengths
        ("leftpad causal", 4, 4, 2, 333, 333, Variant(causal=True, key_lengths=lens(333, 296, 1, 0), left_padding=True)),
        ("varlen causal", 4, 4, 2, 333, 333, Variant(causal=True, key_lengths=lens(333, 296, 1, 0))),
        ("leftpad causal long", 2, 2, 2, 1100, 1100, Variant(causal=True, key_lengths=lens(1100, 801), left_padding=True)),
        ("varlen causal long", 2, 2, 2, 1100, 1100, Variant(causal=True, key_lengths=lens(1100, 777))),
        ("leftpad causal Sq<Sk", 3, 4, 4, 77, 300, Variant(causal=True, key_lengths=lens(300, 250, 60), left_padding=True)),
        ("varlen causal Sq>Sk", 2, 4, 1, 300, 200, Variant(causal=True, key_lengths=lens(200, 129))),
        ("varlen causal Sq>Sk scale 0.3", 2, 2, 2, 900, 600, Variant(causal=True, key_lengths=lens(600, 333), scale=0.3)),
        ("non-causal leftpad", 2, 4, 2, 257, 257, Variant(key_lengths=lens(257, 100), left_padding=True)),
        ("non-causal varlen Sq<Sk", 2, 2, 2, 70, 390, Variant(key_lengths=lens(390, 5))),
        ("all rows empty", 2, 2, 2, 130, 130, Variant(causal=True, key_lengths=lens(0, 0))),
        ("11 batches random lengths leftpad (one 0, one full)", 11, 4, 2, 700, 700,
         Variant(causal=True, key_lengths=rand_lens, left_padding=True)),
        ("11 batches random lengths varlen", 11, 4, 2, 700, 700, Variant(causal=True, key_lengths=rand_lens)),
        ("more work tiles than SMs: B8 H16 S 1100 leftpad", 8, 16, 4, 1100, 1100,
         Variant(causal=True, key_lengths=lens(1100, 1000, 900, 700, 513, 300, 129, 1), left_padding=True)),
        # windows
        ("causal window 50", 1, 2, 2, 700, 700, Variant(causal=True, window=50)),
        ("causal window 100 leftpad", 2, 2, 2, 600, 600, Variant(causal=True, window=100, key_lengths=lens(600, 333), left_padding=True)),
        ("causal window 513 S 1500", 1, 2, 2, 1500, 1500, Variant(causal=True, window=513)),
        ("symmetric window 64 varlen", 2, 2, 2, 513, 513, Variant(window=64, key_lengths=lens(513, 200))),
        ("symmetric window 300 S 1000", 1, 2, 2, 1000, 1000, Variant(window=300)),
        ("causal Sq<Sk offset 257 (a long window)", 2, 4, 2, 100, 357, Variant(causal=True, window=100000)),
        # sinks, and what v7 does not take (both settings run v5: a control)
        ("sinks window 90 leftpad", 2, 4, 2, 300, 300, Variant(causal=True, window=90, key_lengths=lens(300, 171), left_padding=True, sinks=sinks)),
        ("sinks varlen causal Sq>Sk", 2, 4, 2, 200, 150, Variant(causal=True, key_lengths=lens(150, 60), sinks=sinks)),
        ("softcap window 70 (v5 in both)", 1, 2, 2, 500, 500, Variant(causal=True, softcap=30.0, window=70)),
        ("x8 logits window 60 leftpad", 2, 2, 2, 400, 400, Variant(causal=True, window=60, key_lengths=lens(400, 222), left_padding=True)),
    ]


def inputs(b, hq, hkv, sq, sk, d, dtype, big=False):
    scale = 8.0 if big else 1.0
    q = torch.randn(b, hq, sq, d, device=dev, generator=gen).mul_(scale).to(dtype)
    k = torch.randn(b, hkv, sk, d, device=dev, generator=gen).mul_(scale).to(dtype)
    v = torch.randn(b, hkv, sk, d, device=dev, generator=gen).to(dtype)
    return q, k, v


def kernel_call(variant: Variant, version: int = 5):
    kw = variant.kwargs()
    causal = kw.pop("causal")

    def run(q, k, v, out=None, lse=None):
        return hopper.flash_attention_hopper(q, k, v, causal, version, out, lse, variant.scale,
                                             window=kw["window"], mask=kw["mask"], key_lengths=kw["key_lengths"],
                                             left_padding=kw["left_padding"], softcap=variant.softcap,
                                             sinks=variant.sinks)
    return run


def out_and_lse(run, q, k, v):
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=dev)
    out = run(q, k, v, poisoned_empty(*q.shape, dtype=q.dtype, device=dev), lse)
    return out.clone(), lse


def same_bits(a, b):
    return bool(torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a.view(torch.int32),
                            b.view(torch.uint8) if b.dtype != torch.float32 else b.view(torch.int32)))


def lse_ok(lse, q, k, v, variant):
    import math
    ours, truth = lse.double() * math.log(2.0), reference_lse_variant(q, k, v, variant)
    finite = torch.isfinite(truth)
    same_inf = torch.equal(finite, torch.isfinite(ours)) and bool((ours[~finite] == float("-inf")).all())
    err = (ours[finite] - truth[finite]).abs().max().item() if finite.any() else 0.0
    return same_inf and err <= 1e-3, f"max |lse - lse64| {err:.1e}" + ("" if same_inf else "; -inf rows differ")


def launched_kernels(run, q, k, v):
    """Names of the CUDA kernels one call launches (the profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(q, k, v)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if "flash_attention_hopper_kernel" in e.name})


# ---- 1. correctness, v7 == v5 bit for bit, and which kernel ran ----
failures = 0
for cname, b, hq, hkv, sq, sk, variant in small_cases():
    for d in (128, 64, 96):
        for dname, dtype in DTYPES.items():
            q, k, v = inputs(b, hq, hkv, sq, sk, d, dtype, big=cname.startswith("x8"))
            if not hopper.supports(q, k, v, None, mask=variant.mask):
                continue
            run = kernel_call(variant)
            outs = {}
            for mode in MODES:
                set_mode(mode)
                name = f"{dname} D{d} general v{mode}: {cname} (B{b} Hq{hq}/Hkv{hkv} Sq{sq} Sk{sk}; {variant.describe()})"
                chk = check_variant(name, lambda out: run(q, k, v, out), q, k, v, variant)
                outs[mode] = out_and_lse(run, q, k, v)
                ok_lse, lse_detail = lse_ok(outs[mode][1], q, k, v, variant)
                passed = chk.passed and ok_lse
                result["checks"].append({"name": name, "passed": passed, "detail": f"{chk.detail}; {lse_detail}"})
                if not passed:
                    failures += 1
                    print("FAIL", name, chk.detail, lse_detail, flush=True)
            same = same_bits(outs["5"][0], outs["7"][0]) and same_bits(outs["5"][1], outs["7"][1])
            entry = {"name": f"{dname} D{d}: {cname}", "bit_identical": same}
            result["bit_identity"].append(entry)
            if not same:
                failures += 1
                print("NOT BIT-IDENTICAL", entry, flush=True)
set_mode("5")
n = len(result["checks"])
nb = len(result["bit_identity"])
nb_same = sum(e["bit_identical"] for e in result["bit_identity"])
print(f"correctness: {sum(c['passed'] for c in result['checks'])}/{n} passed; general v7 == v5 bit for bit on "
      f"{nb_same}/{nb} cases ({time.time() - t_start:.0f} s)", flush=True)
result["checks_passed"] = sum(c["passed"] for c in result["checks"])
result["checks_total"] = n
result["bit_identical"], result["bit_identity_total"] = nb_same, nb

# Which kernel each setting launched (the mangled name holds the Tile's version: ...Li7ELb1... is
# Tile<D, 7, true>).
for d in (128, 64):
    q, k, v = inputs(4, 4, 2, 333, 333, d, torch.float16)
    variant = Variant(causal=True, key_lengths=lens(333, 296, 1, 0), left_padding=True)
    for mode in MODES:
        set_mode(mode)
        try:
            names = launched_kernels(kernel_call(variant), q, k, v)
        except Exception as e:  # (no profiler here: say so, and go on)
            print(f"D{d} {ENV}={mode}: the profiler failed ({e!r}); kernel not checked", flush=True)
            result["kernel_launched"].append({"d": d, "mode": mode, "error": repr(e)})
            continue
        want = ("ILi%dELi%dELb1" % (d, int(mode)), "Tile<%d, %d, true" % (d, int(mode)))  # mangled, demangled
        ok = len(names) == 1 and any(w in names[0] for w in want)
        result["kernel_launched"].append({"d": d, "mode": mode, "kernels": names, "expected": want, "ok": ok})
        print(f"D{d} {ENV}={mode}: launched {names} ({'ok' if ok else 'NOT THE EXPECTED KERNEL'})", flush=True)
        failures += not ok
set_mode("5")


def mode_timer(fn, mode, inputs_):
    def t(reps):
        set_mode(mode)
        return time_cuda(fn, inputs=inputs_, warmup=3, repeats=reps).median_ms
    return t


# ---- 2. timing: task4.hopper_variants' cases and shorter padded batches, as routed ----
bench = dict(hv.cases(gen, dev))
bench.pop("blockmask_s8192")  # a mask tensor: v5 in both settings
bench["leftpad_b8_s2048"] = (8, 2048, 2048, Variant(causal=True, key_lengths=lens(2048, 1792, 1536, 1280, 1024, 768, 640, 512), left_padding=True))
bench["varlen_b8_s2048"] = (8, 2048, 2048, Variant(causal=True, key_lengths=lens(2048, 1792, 1536, 1280, 1024, 768, 640, 512)))
bench["leftpad_b16_s1024"] = (16, 1024, 1024, Variant(causal=True, key_lengths=torch.linspace(1024, 64, 16, device=dev).to(torch.int32), left_padding=True))
for dname in DTYPES:
    dtype = hv.DTYPES[dname]
    for case, (batch, sq, sk, variant) in bench.items():
        shape = (batch, hv.HEADS)
        sets = [tuple(torch.randn(*shape, s, hv.HEAD_DIM, device=dev, dtype=dtype, generator=gen)
                      for s in (sq, sk, sk)) for _ in range(2)]
        dense_sets = [tuple(torch.randn(*shape, sk, hv.HEAD_DIM, device=dev, dtype=dtype, generator=gen)
                            for _ in range(3)) for _ in range(2)]
        kw = variant.kwargs()
        causal = kw.pop("causal")

        def routed(q, k, v, causal=causal, kw=kw):
            return flash_attention(q, k, v, causal, **kw)

        chk = {}
        for mode in MODES:
            set_mode(mode)
            chk[mode] = hv._check(f"{dname} {case} v{mode}", routed, *sets[0], variant)
            print(f"{chk[mode].name}: {chk[mode].passed} {chk[mode].detail}", flush=True)
            if not chk[mode].passed:
                failures += 1
        set_mode("5")
        o5 = routed(*sets[0]).clone()
        set_mode("7")
        o7 = routed(*sets[0]).clone()
        bits = same_bits(o5, o7)
        timers = {f"v{mode}": mode_timer(routed, mode, sets) for mode in MODES}
        timers["dense_causal"] = lambda reps, inputs_=dense_sets: time_cuda(
            lambda q, k, v: flash_attention(q, k, v, True), inputs=inputs_, repeats=reps).median_ms
        rounds = interleaved_samples(timers, rounds=7, repeats=10)
        set_mode("5")
        ms = {n_: statistics.median(r) for n_, r in rounds.items()}
        pairs = hv.visible_pairs(batch, sq, sk, variant, dev)
        dense_pairs = batch * hv.HEADS * sk * (sk + 1) / 2
        dense_tflops = 4 * dense_pairs * hv.HEAD_DIM / (ms["dense_causal"] * 1e-3) / 1e12
        eff = {f"v{mode}": 4 * pairs * hv.HEAD_DIM / (ms[f"v{mode}"] * 1e-3) / 1e12 / dense_tflops for mode in MODES}
        result["timing"][f"{dname}.{case}"] = {
            "ms": ms, "rounds_ms": rounds, "efficiency_vs_dense": eff, "dense_causal_tflops": dense_tflops,
            "fa2_ok": {mode: c.passed for mode, c in chk.items()}, "v7_equals_v5_bitwise": bits,
            "speedup_v7_vs_v5": ms["v5"] / ms["v7"]}
        print(f"{dname} {case}: ms " + ", ".join(f"{m} {t:.4f}" for m, t in ms.items())
              + " | efficiency " + ", ".join(f"{m} {e:.3f}" for m, e in eff.items())
              + f" | v7/v5 speedup {ms['v5'] / ms['v7']:.3f} | bitwise {bits}", flush=True)
        del sets, dense_sets
        torch.cuda.empty_cache()

print("\n| dtype | case | v5 ms | v7 ms | dense causal ms | eff v5 | eff v7 | v7/v5 speedup |")
print("|---|---|---|---|---|---|---|---|")
for key, r in result["timing"].items():
    dname, case = key.split(".", 1)
    print(f"| {dname} | {case} | {r['ms']['v5']:.4f} | {r['ms']['v7']:.4f} | {r['ms']['dense_causal']:.4f} | "
          f"{r['efficiency_vs_dense']['v5']:.3f} | {r['efficiency_vs_dense']['v7']:.3f} | {r['speedup_v7_vs_v5']:.3f} |")

result["seconds"] = time.time() - t_start
result["failures"] = failures
with open(os.path.join(OUT, "general_v7_ab.json"), "w") as f:
    json.dump(result, f, indent=1)
print(f"done in {result['seconds']:.0f} s, {failures} failures; wrote {os.path.join(OUT, 'general_v7_ab.json')}")
sys.exit(1 if failures else 0)
