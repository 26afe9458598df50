"""A/B (issue 32): in a GQA decode grid of several waves, each block asks L2 for the first tiles
of the block one wave ahead (the default on this branch) against not (ATTN_GQA_PREFETCH_NEXT=0),
and cuDNN; outputs compared bit for bit across the arms first; CUDA-graph replays, caches
rotated beyond L2, one process, alternating rounds, fp16 D 128.
    PYTHONPATH=. python .scratch/prefetch_next_ab.py   (writes $OUT/prefetch_next_ab.json)
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
ARMS = {"next": "1", "off": "0"}
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__, "checks": {}, "shapes": {}}
ok = True
gen = torch.Generator(device=DEV).manual_seed(5)
for b, hq, hkv, sk, pattern, options, splits in ((64, 32, 8, 1000, "causal", "", None), (80, 32, 4, 700, "left", "empty", None),
                                                 (100, 32, 8, 300, "window", "", None), (40, 32, 8, 1000, "causal", "", 5)):
    q, k, v = _mma_inputs(b, hq, hkv, 1, sk, 128, torch.float16, gen, DEV, options)
    variant = _mma_variant(pattern, options, b, hq, 1, sk, torch.float16, gen, DEV)
    outs = {}
    for name, val in ARMS.items():
        with env_setting("ATTN_GQA_PREFETCH_NEXT", val):
            outs[name] = _run_gqa(q, k, v, variant, None, splits).view(torch.int16)
    same = all(torch.equal(outs[n], outs["next"]) for n in ARMS)
    res["checks"][f"B{b} {hq}/{hkv} Sk{sk} {pattern} {options}"] = same
    ok &= same
print(f"[checks] bit-identical across arms: {ok}", flush=True)
copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


for b, hq, hkv, ctx in ((64, 32, 8, 1024), (32, 32, 8, 2048), (128, 32, 8, 512), (64, 32, 4, 2048),
                        (1, 32, 4, 32768)):
    d = 128
    kv_bytes = 2 * b * hkv * ctx * d * 2
    g = torch.Generator(device=DEV).manual_seed(1)
    sets = [tuple(torch.randn(*s, device=DEV, generator=g).half()
                  for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
            for _ in range(max(2, math.ceil(256 * 2**20 / kv_bytes)))]
    timers = {}
    for name, val in ARMS.items():
        with env_setting("ATTN_GQA_PREFETCH_NEXT", val):
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
json.dump(res, open(os.path.join(OUT, "prefetch_next_ab.json"), "w"), indent=1)
sys.exit(0 if ok else 1)
