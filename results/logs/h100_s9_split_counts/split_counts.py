"""The GQA decode at forced split counts around the automatic one (issue 32): the target shapes
at batch 1, MQA (32 query heads on 1 KV head), task 6's attention shape; D 128, fp16, against cuDNN, as
CUDA-graph replays (caches rotated beyond L2), one process, alternating rounds.
    PYTHONPATH=. python .scratch/split_counts.py   (writes $OUT/split_counts.json)
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


for b, hq, hkv, ctx, splits_list in ((1, 32, 1, 32768, (48, 63, 64)),
                                     (1, 32, 1, 8192, (31, 32)),
                                     (1, 32, 4, 8192, (31, 32)),
                                     (1, 32, 2, 32768, (32, 63, 64)),
                                     (1, 32, 4, 32768, (32,)),
                                     (1, 32, 8, 4096, (16,))):
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
json.dump(res, open(os.path.join(OUT, "split_counts.json"), "w"), indent=1)
