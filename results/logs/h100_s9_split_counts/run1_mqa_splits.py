"""MQA / wide-group decode (issue 32, not a target shape): b1, 32 query heads on 1 KV head (and
2), 32768 and 8192 keys, D 128, fp16: our decode at forced split counts against cuDNN, as
CUDA-graph replays (caches rotated beyond L2), one process, alternating rounds.
    PYTHONPATH=. python .scratch/mqa_splits.py   (writes $OUT/mqa_splits.json)
"""
import json, math, os, statistics
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common.graphs import graph_per_call_timer
from common.timing import interleaved_samples, measure_copy_bandwidth
from common.variants import Variant
from task5 import attention as am
from task5.variants_checks import _run_gqa

am._ext()
OUT = os.environ.get("OUT", ".")
DEV = "cuda"
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__, "shapes": {}}
copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


for b, hq, hkv, ctx, splits_list in ((1, 32, 1, 32768, (8, 16, 24, 32, 48, 63)),
                                     (1, 32, 2, 32768, (8, 16, 24, 32)),
                                     (1, 32, 1, 8192, (4, 8, 16, 32, 63))):
    d = 128
    kv_bytes = 2 * b * hkv * ctx * d * 2
    g = torch.Generator(device=DEV).manual_seed(1)
    sets = [tuple(torch.randn(*s, device=DEV, generator=g).half()
                  for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
            for _ in range(max(2, math.ceil(256 * 2**20 / kv_bytes)))]
    q, k, v = sets[0]
    auto = am.gqa_num_splits(q, k, causal=True)
    timers = {"auto": graph_per_call_timer(lambda q, k, v: am.attention(q, k, v, causal=True), sets)}
    for s in splits_list:
        timers[f"s{s}"] = graph_per_call_timer(
            lambda q, k, v, s=s: _run_gqa(q, k, v, Variant(causal=True), None, s), sets)
    timers["cudnn"] = graph_per_call_timer(cudnn, sets)
    samples = interleaved_samples(timers, rounds=7, repeats=20)
    us = {n: statistics.median(x) * 1e3 for n, x in samples.items()}
    label = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    res["shapes"][label] = {"auto_splits": auto, "us": us}
    print(f"{label} (auto {auto} splits): " + ", ".join(f"{n} {t:.2f}" for n, t in us.items()), flush=True)
    del sets, timers
json.dump(res, open(os.path.join(OUT, "mqa_splits.json"), "w"), indent=1)
