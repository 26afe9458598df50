"""Split-path timing, for an A/B of two builds in two processes on one machine (issue 32: did
the persistent grid's preload change, whose scratch layout the split path shares, move the
split decodes?): ours and cuDNN in alternating rounds, CUDA-graph replays, caches rotated beyond
L2; ours/cuDNN per shape is what compares across the two processes.
    PYTHONPATH=. python .scratch/split_regress.py LABEL   (appends to $OUT/split_regress.json)
"""
import json, math, os, statistics, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common.graphs import graph_per_call_timer
from common.timing import interleaved_samples
from task5 import attention as am

am._ext()
OUT = os.environ.get("OUT", ".")
label = sys.argv[1]
path = os.path.join(OUT, "split_regress.json")
res = json.load(open(path)) if os.path.exists(path) else {"device": torch.cuda.get_device_name(), "what": __doc__}
res[label] = {}


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


for dt, b, hq, hkv, ctx in ((torch.float16, 1, 32, 4, 32768), (torch.bfloat16, 1, 32, 4, 32768),
                            (torch.float16, 1, 32, 8, 4096), (torch.float16, 1, 32, 8, 32768)):
    d = 128
    kv_bytes = 2 * b * hkv * ctx * d * 2
    g = torch.Generator(device="cuda").manual_seed(1)
    sets = [tuple(torch.randn(*s, device="cuda", generator=g).to(dt)
                  for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
            for _ in range(max(2, math.ceil(256 * 2**20 / kv_bytes)))]
    timers = {"ours": graph_per_call_timer(lambda q, k, v: am.attention(q, k, v, causal=True), sets),
              "cudnn": graph_per_call_timer(cudnn, sets)}
    samples = interleaved_samples(timers, rounds=9, repeats=20)
    us = {n: statistics.median(x) * 1e3 for n, x in samples.items()}
    key = f"{str(dt)[6:]}_b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    res[label][key] = {"us": us, "cudnn_over_ours": us["cudnn"] / us["ours"],
                       "us_rounds": {n: [t * 1e3 for t in x] for n, x in samples.items()}}
    print(f"[{label}] {key}: ours {us['ours']:.2f} us, cuDNN {us['cudnn']:.2f}, cuDNN/ours {us['cudnn'] / us['ours']:.3f}", flush=True)
    del sets, timers
    torch.cuda.empty_cache()
json.dump(res, open(path, "w"), indent=1)
