"""What one kernel reading the same bytes achieves, as CUDA-graph replays of 32 calls with the
inputs rotated beyond L2 (issue 32, b1 hkv4 ctx32768: 64 MiB of K+V per decode), beside the GQA
decode itself with and without its overlapped launch / L2 prefetch, in alternating rounds.
    PYTHONPATH=. python .scratch/stream_refs.py   (writes $OUT/stream_refs.json)
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
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__, "shapes": {}}
copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps
print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)


for b, hq, hkv, ctx in ((1, 32, 4, 32768), (1, 32, 8, 32768)):
    d = 128
    kv_bytes = 2 * b * hkv * ctx * d * 2
    n = max(2, math.ceil(256 * 2**20 / kv_bytes))
    g = torch.Generator(device=DEV).manual_seed(1)
    sets = [tuple(torch.randn(*s, device=DEV, generator=g).half()
                  for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d))) for _ in range(n)]
    flat = [(torch.randn(kv_bytes // 2, device=DEV, generator=g).half(),) for _ in range(n)]
    halves = [(torch.randn(kv_bytes // 4, device=DEV, generator=g).half(),
               torch.empty(kv_bytes // 4, device=DEV, dtype=torch.half)) for _ in range(n)]
    ours = lambda q, k, v: am.attention(q, k, v, causal=True)
    timers = {}
    timers["ours"] = graph_per_call_timer(ours, sets)
    for name, env in (("ours_no_overlap", ("ATTN_GQA_OVERLAP", "0")), ("ours_no_prefetch", ("ATTN_GQA_PREFETCH", "0")),
                      ("ours_1_merger_no_overlap", None)):
        if env is None:
            with env_setting("ATTN_GQA_OVERLAP", "0"), env_setting("ATTN_GQA_MERGE_BLOCKS", "1"):
                timers[name] = graph_per_call_timer(ours, sets)
        else:
            with env_setting(*env):
                timers[name] = graph_per_call_timer(ours, sets)

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    timers["cudnn"] = graph_per_call_timer(cudnn, sets)
    timers["sum_all_bytes"] = graph_per_call_timer(lambda x: x.sum(dtype=torch.float32), flat)
    timers["amax_all_bytes"] = graph_per_call_timer(lambda x: x.amax(), flat)
    timers["copy_half_to_half"] = graph_per_call_timer(lambda s, t: t.copy_(s), halves)
    samples = interleaved_samples(timers, rounds=7, repeats=20)
    us = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    label = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    res["shapes"][label] = {"kv_bytes": kv_bytes, "us": us,
                            "us_rounds": {k: [t * 1e3 for t in v] for k, v in samples.items()},
                            "bw_fraction": {k: kv_bytes / (t * 1e-6) / 1e9 / copy_gbps for k, t in us.items()}}
    print(f"\n{label}: {kv_bytes / 2**20:.0f} MiB per call; us (bytes / time / copy bandwidth)")
    for k, t in us.items():
        print(f"  {k:28s} {t:8.2f}  ({res['shapes'][label]['bw_fraction'][k]:.3f})", flush=True)
    del sets, flat, halves, timers
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(OUT, "stream_refs.json"), "w"), indent=1)
