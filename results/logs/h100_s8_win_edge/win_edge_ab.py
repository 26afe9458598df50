"""Issue 31, branch win-edge: the general Hopper v5's split key loop with one-sided masks on its
cut tiles (Tile::kEdgeMasks), checked, compared bit for bit with the two-sided mask, A/B-timed.

    PYTHONPATH=. python .scratch/win_edge_ab.py        (writes $OUT/win_edge_ab.json)

(.scratch/ is git-ignored: a device run needs carry=[".scratch/win_edge_ab.py"].)

ATTN_HOPPER_EDGE_MASK (read by the host entry on every call) picks the general v5 at head_dim 128
without softcap: unset or "one_sided" (default), the cut loops compare each score with the one end
of its row's visible keys that can cut their tiles (the top loop the upper end, the bottom loop
the lower end; the tiles a narrow window cuts at both ends, and the CTA's first tile by a uniform
test, with what they need; the rows' ends computed once per CTA); "two_sided", the split loop as
it was (every cut tile rebuilds the predicate and compares with both ends). Head dims 64 and 256,
the softcap instantiation and v2 have the one-sided masks only (no two-sided instantiation): for
them both settings run the same kernel.

1. Correctness: small odd cases (windows narrower and wider than the 128-key tile, causal and
   symmetric, left padding, varlen, S_q != S_k, sinks, softcap) through
   task4.hopper.flash_attention_hopper v5 (head dims 64, 96, 128; fp16, bf16) against float64
   by FlashAttention-2's criterion (common.variants.check_variant: NaN-poisoned output, two runs
   bit-identical), in both settings and both tilings (ATTN_HOPPER_VARIANT_ALIGN 1, the default
   aligned tiling, and 0, tiles from zero: more tiles cut at the top, and left padding's first
   key inside a tile the diagonal may cut too); plus one_sided == two_sided bit for bit (output
   and lse) where the two-sided instantiation exists (D 128 and 96 without softcap).
2. Timing, alternating rounds (common.timing.interleaved_samples, medians): task4.hopper_variants'
   cases through task4.attention.flash_attention as routed, and three more windows at S 16384
   (512 causal, 100 causal: tiles cut at both ends, 2048 symmetric: two cut tiles at the top),
   two_sided vs one_sided beside dense causal, efficiency as the bench defines it (TFLOP/s on the
   visible pairs / dense causal TFLOP/s of the same B, H, S_k, D). The block mask is a control (a
   mask tensor keeps the per-tile loop: ~1.0x expected).
"""
import json
import os
import statistics
import sys
import time

import torch

from common.checks import poisoned_empty
from common.timing import interleaved_samples, time_cuda
from common.variants import Variant, check_variant
from task4 import hopper, hopper_variants as hv
from task4.attention import flash_attention

ENV = "ATTN_HOPPER_EDGE_MASK"
ALIGN_ENV = "ATTN_HOPPER_VARIANT_ALIGN"
MODES = ("two_sided", "one_sided")
TILINGS = ("1", "0")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
t_start = time.time()
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(31)
OUT = os.environ.get("OUT", ".")
result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
          "checks": [], "bit_identity": [], "timing": {}}


def set_mode(mode: str, tiling: str = "1") -> None:
    os.environ[ENV] = mode
    os.environ[ALIGN_ENV] = tiling


def lens(*xs):
    return torch.tensor(xs, dtype=torch.int32, device=dev)


def small_cases():
    """(name, B, H_q, H_kv, S_q, S_k, variant)."""
    sinks = torch.randn(4, device=dev, generator=gen) * 2
    return [
        # windows narrower than a tile: tiles cut at both ends
        ("causal window 50", 1, 2, 2, 700, 700, Variant(causal=True, window=50)),
        ("causal window 77 Sq>Sk", 1, 4, 4, 500, 300, Variant(causal=True, window=77)),
        ("causal window 100 leftpad", 2, 2, 2, 600, 600, Variant(causal=True, window=100, key_lengths=lens(600, 333), left_padding=True)),
        ("causal window 1", 1, 2, 2, 300, 300, Variant(causal=True, window=1)),
        ("symmetric window 64 varlen", 2, 2, 2, 513, 513, Variant(window=64, key_lengths=lens(513, 200))),
        ("symmetric window 50 Sq<Sk", 1, 2, 2, 90, 400, Variant(window=50)),
        # windows wider than a tile
        ("causal window 129", 1, 2, 2, 1000, 1000, Variant(causal=True, window=129)),
        ("causal window 300 leftpad", 2, 2, 2, 700, 700, Variant(causal=True, window=300, key_lengths=lens(700, 451), left_padding=True)),
        ("causal window 513 S 1500", 1, 2, 2, 1500, 1500, Variant(causal=True, window=513)),
        ("causal window 200 varlen Sq<Sk", 2, 2, 1, 333, 900, Variant(causal=True, window=200, key_lengths=lens(900, 411))),
        ("symmetric window 300 S 1000", 1, 2, 2, 1000, 1000, Variant(window=300)),
        ("symmetric window 190 leftpad", 2, 2, 2, 650, 650, Variant(window=190, key_lengths=lens(650, 377), left_padding=True)),
        ("causal Sq<Sk offset 257 (a long window)", 2, 4, 2, 100, 357, Variant(causal=True, window=100000)),
        # key lengths without a window
        ("leftpad causal", 4, 4, 2, 333, 333, Variant(causal=True, key_lengths=lens(333, 296, 1, 0), left_padding=True)),
        ("varlen causal", 4, 4, 2, 333, 333, Variant(causal=True, key_lengths=lens(333, 296, 1, 0))),
        ("leftpad causal long", 2, 2, 2, 1100, 1100, Variant(causal=True, key_lengths=lens(1100, 801), left_padding=True)),
        ("leftpad causal Sq<Sk", 3, 4, 4, 77, 300, Variant(causal=True, key_lengths=lens(300, 250, 60), left_padding=True)),
        ("varlen causal Sq>Sk", 2, 4, 1, 300, 200, Variant(causal=True, key_lengths=lens(200, 129))),
        ("non-causal leftpad", 2, 4, 2, 257, 257, Variant(key_lengths=lens(257, 100), left_padding=True)),
        ("non-causal varlen Sq<Sk", 2, 2, 2, 70, 390, Variant(key_lengths=lens(390, 5))),
        # sinks, softcap, scale
        ("sinks window 90 leftpad", 2, 4, 2, 300, 300, Variant(causal=True, window=90, key_lengths=lens(300, 171), left_padding=True, sinks=sinks)),
        ("sinks varlen causal Sq>Sk", 2, 4, 2, 200, 150, Variant(causal=True, key_lengths=lens(150, 60), sinks=sinks)),
        ("softcap window 70", 1, 2, 2, 500, 500, Variant(causal=True, softcap=30.0, window=70)),
        ("softcap symmetric window 200", 1, 2, 2, 700, 700, Variant(softcap=20.0, window=200)),
        ("scale 0.3 window 256", 1, 2, 2, 900, 900, Variant(causal=True, window=256, scale=0.3)),
        ("x8 logits window 60 leftpad", 2, 2, 2, 400, 400, Variant(causal=True, window=60, key_lengths=lens(400, 222), left_padding=True)),
        ("all rows empty", 2, 2, 2, 130, 130, Variant(causal=True, key_lengths=lens(0, 0))),
        ("one query row, leftpad window 3", 2, 2, 2, 1, 200, Variant(causal=True, window=3, key_lengths=lens(200, 1), left_padding=True)),
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


# ---- 1. correctness, and one_sided == two_sided bit for bit ----
failures = 0
for cname, b, hq, hkv, sq, sk, variant in small_cases():
    for d in (64, 128, 96):
        for dname, dtype in DTYPES.items():
            q, k, v = inputs(b, hq, hkv, sq, sk, d, dtype, big=cname.startswith("x8"))
            if not hopper.supports(q, k, v, None, mask=variant.mask):
                continue
            run = kernel_call(variant)
            for tiling in TILINGS:
                outs = {}
                for mode in MODES:
                    set_mode(mode, tiling)
                    # (The two-sided kernel from zero is compared bit for bit only: time.)
                    if mode == "one_sided" or tiling == "1":
                        name = (f"{dname} D{d} v5 {mode} align={tiling}: {cname} (B{b} Hq{hq}/Hkv{hkv} Sq{sq} "
                                f"Sk{sk}; {variant.describe()})")
                        chk = check_variant(name, lambda out: run(q, k, v, out), q, k, v, variant)
                        result["checks"].append({"name": name, "passed": chk.passed, "detail": chk.detail})
                        if not chk.passed:
                            failures += 1
                            print("FAIL", name, chk.detail, flush=True)
                    outs[mode] = out_and_lse(run, q, k, v)
                # A two-sided instantiation exists for D 128 (and 96, on 128's tile) without softcap.
                has_two = d in (96, 128) and not variant.softcap
                same = (same_bits(outs["two_sided"][0], outs["one_sided"][0])
                        and same_bits(outs["two_sided"][1], outs["one_sided"][1]))
                entry = {"name": f"{dname} D{d} align={tiling}: {cname}", "two_sided_instantiation": has_two,
                         "bit_identical": same}
                result["bit_identity"].append(entry)
                if has_two and not same:
                    failures += 1
                    print("NOT BIT-IDENTICAL", entry, flush=True)
set_mode("one_sided")
os.environ.pop(ALIGN_ENV, None)
n = len(result["checks"])
nb = sum(e["two_sided_instantiation"] for e in result["bit_identity"])
nb_same = sum(e["two_sided_instantiation"] and e["bit_identical"] for e in result["bit_identity"])
print(f"correctness: {sum(c['passed'] for c in result['checks'])}/{n} passed; one_sided == two_sided bit for "
      f"bit on {nb_same}/{nb} cases with a two-sided instantiation ({time.time() - t_start:.0f} s)", flush=True)
result["checks_passed"] = sum(c["passed"] for c in result["checks"])
result["checks_total"] = n
result["bit_identical"], result["bit_identity_total"] = nb_same, nb


def mode_timer(fn, mode, inputs_):
    def t(reps):
        set_mode(mode)
        return time_cuda(fn, inputs=inputs_, warmup=3, repeats=reps).median_ms
    return t


# ---- 2. timing: task4.hopper_variants' cases as routed, and three more windows ----
bench = dict(hv.cases(gen, dev))
bench["window512_s16384"] = (1, 16384, 16384, Variant(causal=True, window=512))
bench["window100_s16384"] = (1, 16384, 16384, Variant(causal=True, window=100))
bench["symwindow2048_s16384"] = (1, 16384, 16384, Variant(window=2048))
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
            chk[mode] = hv._check(f"{dname} {case} {mode}", routed, *sets[0], variant)
            print(f"{chk[mode].name}: {chk[mode].passed} {chk[mode].detail}", flush=True)
            if not chk[mode].passed:
                failures += 1
        timers = {mode: mode_timer(routed, mode, sets) for mode in MODES}
        timers["dense_causal"] = lambda reps, inputs_=dense_sets: time_cuda(
            lambda q, k, v: flash_attention(q, k, v, True), inputs=inputs_, repeats=reps).median_ms
        rounds = interleaved_samples(timers, rounds=7, repeats=10)
        set_mode("one_sided")
        ms = {n_: statistics.median(r) for n_, r in rounds.items()}
        pairs = hv.visible_pairs(batch, sq, sk, variant, dev)
        dense_pairs = batch * hv.HEADS * sk * (sk + 1) / 2
        dense_tflops = 4 * dense_pairs * hv.HEAD_DIM / (ms["dense_causal"] * 1e-3) / 1e12
        eff = {mode: 4 * pairs * hv.HEAD_DIM / (ms[mode] * 1e-3) / 1e12 / dense_tflops for mode in MODES}
        result["timing"][f"{dname}.{case}"] = {
            "ms": ms, "rounds_ms": rounds, "efficiency_vs_dense": eff,
            "fa2_ok": {mode: c.passed for mode, c in chk.items()},
            "speedup_one_vs_two_sided": ms["two_sided"] / ms["one_sided"]}
        print(f"{dname} {case}: ms " + ", ".join(f"{m} {t:.4f}" for m, t in ms.items())
              + " | efficiency " + ", ".join(f"{m} {e:.3f}" for m, e in eff.items())
              + f" | one/two-sided speedup {ms['two_sided'] / ms['one_sided']:.3f}", flush=True)
        del sets, dense_sets
        torch.cuda.empty_cache()

result["seconds"] = time.time() - t_start
result["failures"] = failures
with open(os.path.join(OUT, "win_edge_ab.json"), "w") as f:
    json.dump(result, f, indent=1)
print(f"done in {result['seconds']:.0f} s, {failures} failures; wrote {os.path.join(OUT, 'win_edge_ab.json')}")
sys.exit(1 if failures else 0)
