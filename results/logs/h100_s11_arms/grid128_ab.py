"""A/B (issue 32, b64_hq32_hkv8_ctx1024): the persistent grid at its default size (every resident
block: 132 on an H100, so 116 blocks walk 4 items and 16 walk 3) against 128 blocks
(ATTN_GQA_PERSISTENT_GRID=128: 4 items each, 4 SMs idle), and cuDNN; bit-identity of the arms
first; then CUDA-graph replays, caches rotated beyond L2, one process, alternating rounds, fp16.
    PYTHONPATH=. python .scratch/grid128_ab.py   (writes $OUT/grid128_ab.json)
"""
import json, math, os, statistics, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common.graphs import graph_per_call_timer
from common.harness import env_setting
from common.timing import interleaved_samples, measure_copy_bandwidth
from task5 import attention as am

am._ext()
OUT = os.environ.get("OUT", ".")
DEV = "cuda"
ARMS = {"grid_default": None, "grid_128": "128"}
t0 = time.time()
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__, "shapes": {}}
copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps
print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def with_grid(val, fn):
    def run(*a):
        if val is None:
            return fn(*a)
        with env_setting("ATTN_GQA_PERSISTENT_GRID", val):
            return fn(*a)
    return run


ok = True
for b, hq, hkv, ctx in ((64, 32, 8, 1024), (128, 32, 8, 512)):
    d = 128
    kv_bytes = 2 * b * hkv * ctx * d * 2
    g = torch.Generator(device=DEV).manual_seed(1)
    sets = [tuple(torch.randn(*s, device=DEV, generator=g).half()
                  for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
            for _ in range(max(2, math.ceil(256 * 2**20 / kv_bytes)))]
    outs = [with_grid(v, lambda q, k, v_: am.attention(q, k, v_, causal=True))(*sets[0]) for v in ARMS.values()]
    same = torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    ok &= same
    timers = {}
    for name, val in ARMS.items():
        with (env_setting("ATTN_GQA_PERSISTENT_GRID", val) if val else env_setting("ATTN_GQA_PERSISTENT", "1")):
            timers[name] = graph_per_call_timer(lambda q, k, v: am.attention(q, k, v, causal=True), sets)
    timers["cudnn"] = graph_per_call_timer(cudnn, sets)
    samples = interleaved_samples(timers, rounds=11, repeats=20)
    us = {n: statistics.median(x) * 1e3 for n, x in samples.items()}
    label = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    res["shapes"][label] = {"bits_equal": same, "us": us,
                            "us_rounds": {n: [t * 1e3 for t in x] for n, x in samples.items()},
                            "bw_fraction": {n: kv_bytes / (t * 1e-6) / 1e9 / copy_gbps for n, t in us.items()},
                            "ratio_vs_cudnn": {n: us["cudnn"] / t for n, t in us.items()}}
    print(f"{label} (bits equal {same}): " + ", ".join(
        f"{n} {t:.2f} us (bw {res['shapes'][label]['bw_fraction'][n]:.3f}, cuDNN/this {us['cudnn'] / t:.3f})"
        for n, t in us.items()), flush=True)
    del sets, timers
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(OUT, "grid128_ab.json"), "w"), indent=1)
print(f"{'ok' if ok else 'BITS DIFFER'}; {time.time() - t0:.0f} s")
