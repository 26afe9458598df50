"""A/B (issue 32): the GQA decode's K/V copies with an L2 prefetch-size hint (cp.async ...
.L2::128B / .L2::256B; ATTN_GQA_L2_HINT=128/256) against none (the default), and cuDNN; outputs
compared bit for bit across the arms first; CUDA-graph replays, caches rotated beyond L2, one
process, alternating rounds, fp16 D 128.
    PYTHONPATH=. python .scratch/l2_hint_ab.py   (writes $OUT/l2_hint_ab.json)
"""
import json, math, os, statistics, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common.graphs import graph_per_call_timer
from common.harness import env_setting
from common.timing import interleaved_samples, measure_copy_bandwidth
from common.variants import Variant
from task5 import attention as am
from task5.variants_checks import _mma_inputs, _mma_variant, _run_gqa

am._ext()
OUT = os.environ.get("OUT", ".")
DEV = "cuda"
ARMS = {"none": "0", "l2_128": "128", "l2_256": "256"}
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__, "checks": {}, "shapes": {}}
ok = True
gen = torch.Generator(device=DEV).manual_seed(5)
for b, hq, hkv, sk, pattern, options, splits in ((2, 32, 4, 1000, "causal", "", 5), (4, 32, 4, 1000, "left", "empty", 7),
                                                 (1, 32, 8, 16, "causal", "", None), (2, 32, 8, 3000, "window", "", None)):
    q, k, v = _mma_inputs(b, hq, hkv, 1, sk, 128, torch.float16, gen, DEV, options)
    variant = _mma_variant(pattern, options, b, hq, 1, sk, torch.float16, gen, DEV)
    outs = {}
    for name, val in ARMS.items():
        with env_setting("ATTN_GQA_L2_HINT", val):
            outs[name] = _run_gqa(q, k, v, variant, None, splits).view(torch.int16)
    same = all(torch.equal(outs[n], outs["none"]) for n in ARMS)
    res["checks"][f"B{b} {hq}/{hkv} Sk{sk} {pattern} {options}"] = same
    ok &= same
print(f"[checks] bit-identical across arms: {ok}", flush=True)
copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


for b, hq, hkv, ctx in ((1, 32, 4, 32768), (1, 32, 8, 32768), (1, 32, 8, 4096), (64, 32, 8, 1024),
                        (8, 32, 8, 8192), (32, 32, 8, 2048), (4, 32, 8, 1152)):
    d = 128
    kv_bytes = 2 * b * hkv * ctx * d * 2
    g = torch.Generator(device=DEV).manual_seed(1)
    sets = [tuple(torch.randn(*s, device=DEV, generator=g).half()
                  for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
            for _ in range(max(2, math.ceil(256 * 2**20 / kv_bytes)))]
    timers = {}
    for name, val in ARMS.items():
        with env_setting("ATTN_GQA_L2_HINT", val):
            timers[name] = graph_per_call_timer(lambda q, k, v: am.attention(q, k, v, causal=True), sets)
    timers["cudnn"] = graph_per_call_timer(cudnn, sets)
    samples = interleaved_samples(timers, rounds=9, repeats=20)
    us = {n: statistics.median(x) * 1e3 for n, x in samples.items()}
    label = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    res["shapes"][label] = {"us": us, "us_rounds": {n: [t * 1e3 for t in x] for n, x in samples.items()},
                            "bw_fraction": {n: kv_bytes / (t * 1e-6) / 1e9 / copy_gbps for n, t in us.items()}}
    print(f"{label}: " + ", ".join(f"{n} {t:.2f} ({res['shapes'][label]['bw_fraction'][n]:.3f})" for n, t in us.items()), flush=True)
    del sets, timers
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(OUT, "l2_hint_ab.json"), "w"), indent=1)
sys.exit(0 if ok else 1)
