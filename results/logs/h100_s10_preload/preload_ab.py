"""A/B (issue 32): the persistent GQA decode grid copying its next item's first kPreloadTiles
K/V tiles during each warp merge (2 at head dim 128: the warp's O staged in one stage, its
columns swizzled instead of its rows padded; the default on branch gqa-preload2) against only
the first (ATTN_GQA_PRELOAD_TILES=1, as on main), against one block per item
(ATTN_GQA_PERSISTENT=0), and cuDNN. Checks first: every arm against float64 by
FlashAttention-2's criterion on several-wave cases (variants, head dims 64/96/128/256, bf16,
the paged cache), and the arms bit for bit against each other; then CUDA-graph replays, caches
rotated beyond L2, one process, alternating rounds, fp16 D 128.
    PYTHONPATH=. python .scratch/preload_ab.py   (writes $OUT/preload_ab.json)
"""
import json, math, os, statistics, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common.graphs import graph_per_call_timer
from common.harness import env_setting
from common.timing import interleaved_samples, measure_copy_bandwidth
from common.variants import Variant, check_variant, fa2_criterion, pytorch_attention_variant
from task5 import attention as am
from task5 import ops
from task5.variants_checks import _mma_inputs, _mma_variant, _poison_unread, _run_gqa

am._ext()
OUT = os.environ.get("OUT", ".")
DEV = "cuda"
ARMS = {"preload_auto": ("ATTN_GQA_PRELOAD_TILES", "auto"), "preload_1": ("ATTN_GQA_PRELOAD_TILES", "1"),
        "per_item": ("ATTN_GQA_PERSISTENT", "0")}
t0 = time.time()
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__, "checks": {}, "shapes": {}}
ok = True
gen = torch.Generator(device=DEV).manual_seed(9)
F16, BF16 = torch.float16, torch.bfloat16
CASES = [(200, 32, 8, 1, 300, 128, "causal", "", F16),
         (160, 32, 8, 1, 257, 128, "left", "empty nan", F16),
         (150, 32, 8, 1, 400, 128, "window", "nan", BF16),
         (140, 16, 4, 1, 200, 128, "left-window", "softcap sinks scale nan", F16),
         (300, 32, 8, 1, 33, 128, "lengths", "empty", F16),
         (200, 32, 8, 1, 100, 64, "causal", "", BF16),
         (200, 16, 4, 1, 120, 96, "causal", "", F16),
         (160, 16, 4, 1, 100, 256, "causal", "sinks", BF16),
         (150, 32, 8, 3, 90, 128, "causal", "", F16),          # 12 rows
         (140, 32, 4, 4, 60, 128, "causal", "", F16)]           # 32 rows: 2 row tiles
for b, hq, hkv, sq, sk, d, pattern, options, dtype in CASES:
    q, k, v = _mma_inputs(b, hq, hkv, sq, sk, d, dtype, gen, DEV, options)
    variant = _mma_variant(pattern, options, b, hq, sq, sk, dtype, gen, DEV)
    kr, vr = _poison_unread(k, v, variant, sq) if "nan" in options else (k, v)
    outs = {}
    for name, val in ARMS.items():
        with env_setting(*val):
            label = f"{str(dtype)[6:]} B{b} {hq}/{hkv} Sq{sq} Sk{sk} D{d} {pattern} {options} [{name}]"
            c = check_variant(label, lambda out: _run_gqa(q, kr, vr, variant, out, 1), q, k, v, variant)
            outs[name] = _run_gqa(q, kr, vr, variant, None, 1).view(torch.int16)
        res["checks"][label] = {"passed": bool(c.passed), "detail": c.detail}
        ok &= bool(c.passed)
        if not c.passed:
            print("FAIL", label, c.detail, flush=True)
    same = torch.equal(outs["preload_auto"], outs["per_item"]) and torch.equal(outs["preload_1"], outs["per_item"])
    res["checks"][f"{label} bits equal"] = {"passed": bool(same)}
    ok &= same
    if not same:
        print("FAIL bits differ", label, flush=True)
# the paged cache, several waves
for d, dtype in ((128, F16), (64, BF16)):
    b, hq, hkv, page = 150, 32, 8, 16
    lens = torch.randint(0, 200, (b,), generator=torch.Generator().manual_seed(3)).tolist()
    max_pages = math.ceil(max(lens) / page) + 1
    k_pages, v_pages = ops.allocate_paged_kv_cache(b * max_pages, page, hkv, d, dtype, DEV)
    k_pages.normal_(generator=gen)
    v_pages.normal_(generator=gen)
    table = torch.randperm(b * max_pages, device=DEV, generator=gen).view(b, max_pages).int()
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(b, hq, 1, d, device=DEV, generator=gen).to(dtype)
    outs = {}
    for name, val in ARMS.items():
        with env_setting(*val):
            outs[name] = am.paged_decode_attention(q, k_pages, v_pages, table, seq_lens, num_splits=1)
    ref = ops.reference_paged_attention(q, k_pages, v_pages, table, seq_lens)
    kc = ops.gather_pages(k_pages, table, seq_lens)
    vc = ops.gather_pages(v_pages, table, seq_lens)
    yard = pytorch_attention_variant(q, kc, vc, Variant(causal=True, key_lengths=seq_lens))
    passed, err, bound = fa2_criterion(outs["preload_auto"], ref, yard)
    same = all(torch.equal(outs[a].view(torch.int16), outs["per_item"].view(torch.int16)) for a in ("preload_auto", "preload_1"))
    label = f"paged B{b} D{d} {str(dtype)[6:]}"
    res["checks"][label] = {"passed": bool(passed and same), "detail": f"max err {err:.2e} <= {bound:.2e}; bits equal {same}"}
    ok &= bool(passed and same)
    if not (passed and same):
        print("FAIL", label, err, bound, same, flush=True)
print(f"[checks] {sum(c['passed'] for c in res['checks'].values())}/{len(res['checks'])} passed ({time.time() - t0:.0f} s)", flush=True)
copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


for b, hq, hkv, ctx in ((64, 32, 8, 1024), (128, 32, 8, 512), (32, 32, 8, 2048), (64, 32, 4, 2048),
                        (256, 32, 8, 256)):
    d = 128
    kv_bytes = 2 * b * hkv * ctx * d * 2
    g = torch.Generator(device=DEV).manual_seed(1)
    sets = [tuple(torch.randn(*s, device=DEV, generator=g).half()
                  for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
            for _ in range(max(2, math.ceil(256 * 2**20 / kv_bytes)))]
    timers = {}
    for name, val in ARMS.items():
        with env_setting(*val):
            timers[name] = graph_per_call_timer(lambda q, k, v: am.attention(q, k, v, causal=True), sets)
    timers["cudnn"] = graph_per_call_timer(cudnn, sets)
    samples = interleaved_samples(timers, rounds=11, repeats=20)
    us = {n: statistics.median(x) * 1e3 for n, x in samples.items()}
    label = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    res["shapes"][label] = {"us": us, "us_rounds": {n: [t * 1e3 for t in x] for n, x in samples.items()},
                            "bw_fraction": {n: kv_bytes / (t * 1e-6) / 1e9 / copy_gbps for n, t in us.items()}}
    print(f"{label}: " + ", ".join(f"{n} {t:.2f} ({res['shapes'][label]['bw_fraction'][n]:.3f}, cuDNN/this {us['cudnn'] / t:.3f})" for n, t in us.items()), flush=True)
    del sets, timers
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(OUT, "preload_ab.json"), "w"), indent=1)
print(f"checks {'all passed' if ok else 'SOME FAILED'}; {time.time() - t0:.0f} s")
sys.exit(0 if ok else 1)
