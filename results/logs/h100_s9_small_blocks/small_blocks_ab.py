"""A/B (issue 32): the GQA decode with two-warp blocks (ATTN_GQA_SMALL_BLOCKS=1: ~52 KB, four
blocks per SM, so that a block's ramp overlaps the other blocks' streaming and more, shorter
splits are dealt out by the hardware to the SMs that finish first) against the default 8-warp
blocks (one per SM), at several split counts; checks against float64 (FlashAttention-2's
criterion) first; CUDA-graph replays, caches rotated beyond L2, one process, alternating rounds.
    PYTHONPATH=. python .scratch/small_blocks_ab.py   (writes $OUT/small_blocks_ab.json)
"""
import contextlib, json, math, os, statistics, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common.graphs import graph_per_call_timer
from common.harness import env_setting
from common.timing import interleaved_samples, measure_copy_bandwidth
from common.variants import Variant, check_variant
from task5 import attention as am
from task5.variants_checks import _mma_inputs, _mma_variant, _poison_unread, _run_gqa

am._ext()
OUT = os.environ.get("OUT", ".")
DEV = "cuda"
t0 = time.time()
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
       "checks": {}, "shapes": {}}
ok = True
gen = torch.Generator(device=DEV).manual_seed(11)
F16, BF16 = torch.float16, torch.bfloat16
CASES = [(1, 32, 8, 1, 16, 128, "causal", "", (None, 3), F16),
         (2, 32, 4, 1, 1000, 128, "causal", "", (None, 5, 64), F16),
         (2, 32, 8, 1, 1000, 128, "window", "nan", (None, 7), F16),
         (4, 32, 4, 1, 1000, 128, "left", "empty nan", (None, 7), F16),
         (3, 16, 4, 1, 1000, 128, "left-window", "softcap sinks scale nan", (None, 6), F16),
         (2, 16, 4, 1, 12, 128, "causal", "softcap scale", (None,), BF16),
         (1, 32, 8, 4, 16, 128, "causal", "", (None, 2), F16),
         (1, 32, 4, 4, 300, 128, "causal", "", (None, 8), BF16),
         (1, 32, 1, 1, 3000, 128, "causal", "", (None, 100), F16)]
for small in ("1", "2", "3"):
  with env_setting("ATTN_GQA_SMALL_BLOCKS", small):
    for b, hq, hkv, sq, sk, d, pattern, options, split_list, dtype in CASES:
        q, k, v = _mma_inputs(b, hq, hkv, sq, sk, d, dtype, gen, DEV, options)
        variant = _mma_variant(pattern, options, b, hq, sq, sk, dtype, gen, DEV)
        kr, vr = _poison_unread(k, v, variant, sq) if "nan" in options else (k, v)
        for splits in split_list:
            label = f"{str(dtype)[6:]} B{b} {hq}/{hkv} Sq{sq} Sk{sk} {pattern} {options} splits {splits or 'auto'} [small {small}]"
            c = check_variant(label, lambda out: _run_gqa(q, kr, vr, variant, out, splits), q, k, v, variant)
            again = _run_gqa(q, kr, vr, variant, None, splits)
            same = torch.equal(again.view(torch.int16), _run_gqa(q, kr, vr, variant, None, splits).view(torch.int16))
            res["checks"][label] = {"passed": bool(c.passed and same), "detail": c.detail}
            ok &= bool(c.passed and same)
            if not (c.passed and same):
                print("FAIL", label, c.detail, "repeatable", same, flush=True)
print(f"[checks] {sum(c['passed'] for c in res['checks'].values())}/{len(res['checks'])} passed", flush=True)

copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps
print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


SHAPES = [((64, 32, 8, 1024), (1,), {"1": (1,), "2": (1,), "3": (1, 2)}),
          ((32, 32, 8, 2048), (1,), {"1": (1,), "2": (1,), "3": (1, 2)}),
          ((8, 32, 8, 8192), (2,), {"3": (4, 8)})]
for (b, hq, hkv, ctx), base_splits, small_splits in SHAPES:
    d = 128
    kv_bytes = 2 * b * hkv * ctx * d * 2
    g = torch.Generator(device=DEV).manual_seed(1)
    sets = [tuple(torch.randn(*s, device=DEV, generator=g).half()
                  for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
            for _ in range(max(2, math.ceil(256 * 2**20 / kv_bytes)))]
    timers = {}
    for s in base_splits:
        timers[f"base_s{s}"] = graph_per_call_timer(
            lambda q, k, v, s=s: _run_gqa(q, k, v, Variant(causal=True), None, s), sets)
    for small, split_list in small_splits.items():
        with env_setting("ATTN_GQA_SMALL_BLOCKS", small):
            for s in split_list:
                timers[f"small{small}_s{s}"] = graph_per_call_timer(
                    lambda q, k, v, s=s: _run_gqa(q, k, v, Variant(causal=True), None, s), sets)
    timers["cudnn"] = graph_per_call_timer(cudnn, sets)
    samples = interleaved_samples(timers, rounds=9, repeats=20)
    us = {n: statistics.median(v) * 1e3 for n, v in samples.items()}
    label = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    res["shapes"][label] = {"kv_bytes": kv_bytes, "us": us,
                            "us_rounds": {n: [t * 1e3 for t in v] for n, v in samples.items()},
                            "bw_fraction": {n: kv_bytes / (t * 1e-6) / 1e9 / copy_gbps for n, t in us.items()}}
    print(f"{label}: " + ", ".join(f"{n} {t:.2f} ({res['shapes'][label]['bw_fraction'][n]:.3f})"
                                   for n, t in us.items()) + f"  ({time.time() - t0:.0f} s)", flush=True)
    json.dump(res, open(os.path.join(OUT, "small_blocks_ab2.json"), "w"), indent=1)
    del sets, timers
    torch.cuda.empty_cache()
print(f"checks {'all passed' if ok else 'SOME FAILED'}; {time.time() - t0:.0f} s")
sys.exit(0 if ok else 1)
