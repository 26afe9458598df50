"""Task 6's GQA decode attention alone (issue 32's task 6 configuration: B 4, 32 query heads,
8 KV heads, D 128, bf16, the cache [B, 1124, 8 * 128] as task 6 keeps it, 1074 keys, the length a
device tensor as in the captured step), as CUDA-graph replays of 32 calls over caches rotated
beyond L2, in alternating rounds: ours as task 6 calls it (task5.ops decode_attention), ours on a
[B, H_kv, S, D] cache of exactly 1074 keys, and cuDNN (SDPA, enable_gqa) on that cache; against
the bytes at the copy bandwidth. The step's what-if (t6_gqa_whatif) puts the attention's cost
inside the step at ~450 us / 24 layers.
    PYTHONPATH=. python .scratch/t6_attn_alone.py   (writes $OUT/t6_attn_alone.json)
"""
import json, os, statistics
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common.graphs import graph_per_call_timer
from common.timing import interleaved_samples, measure_copy_bandwidth
from task5 import attention as am
from task5.ops import kernel_ops

OUT = os.environ.get("OUT", ".")
dev, bf16 = "cuda", torch.bfloat16
B, HQ, HKV, D, CAP, L = 4, 32, 8, 128, 1124, 1074
ops = kernel_ops()
g = torch.Generator(device=dev).manual_seed(3)
length = torch.tensor(L, dtype=torch.int32, device=dev)
task6_sets, bhsd_sets = [], []
for _ in range(4):
    q = torch.randn(B, 1, HQ * D, device=dev, generator=g).to(bf16)
    kc = torch.randn(B, CAP, HKV * D, device=dev, generator=g).to(bf16)
    vc = torch.randn(B, CAP, HKV * D, device=dev, generator=g).to(bf16)
    task6_sets.append((q, kc, vc))
    heads = lambda t: t[:, :L].view(B, L, HKV, D).transpose(1, 2).contiguous()
    bhsd_sets.append((q.view(B, 1, HQ, D).transpose(1, 2).contiguous(), heads(kc), heads(vc)))
ours_t6 = ops.decode_attention(*task6_sets[0], HQ, length).view(B, HQ, D).float()
ours_bhsd = am.attention(*bhsd_sets[0], causal=True).view(B, HQ, D).float()
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    ref = F.scaled_dot_product_attention(*bhsd_sets[0], enable_gqa=True).view(B, HQ, D).float()
print(f"max |ours (task 6 cache) - cuDNN| {(ours_t6 - ref).abs().max().item():.2e}, "
      f"|ours (BHSD) - cuDNN| {(ours_bhsd - ref).abs().max().item():.2e}")


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


timers = {"ours_task6_cache": graph_per_call_timer(lambda q, k, v: ops.decode_attention(q, k, v, HQ, length), task6_sets),
          "ours_bhsd": graph_per_call_timer(lambda q, k, v: am.attention(q, k, v, causal=True), bhsd_sets),
          "cudnn_bhsd": graph_per_call_timer(cudnn, bhsd_sets)}
from common.harness import env_setting
for m in ("1", "4"):
    with env_setting("ATTN_GQA_MERGE_BLOCKS", m):
        timers[f"ours_task6_cache_mergers{m}"] = graph_per_call_timer(
            lambda q, k, v: ops.decode_attention(q, k, v, HQ, length), task6_sets)
for n in (2, 3, 4):
    timers[f"ours_task6_cache_splits{n}"] = graph_per_call_timer(
        lambda q, k, v, n=n: ops.decode_attention(q, k, v, HQ, length, num_splits=n), task6_sets)
copy_gbps = measure_copy_bandwidth()
samples = interleaved_samples(timers, rounds=9, repeats=20)
us = {n: statistics.median(x) * 1e3 for n, x in samples.items()}
kv_bytes = 2 * B * HKV * L * D * 2
bytes_us = kv_bytes / (copy_gbps * 1e3)
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
       "commit": os.environ.get("ATTN_COMMIT"), "copy_gbps": copy_gbps, "bytes_us": bytes_us, "us": us,
       "us_rounds": {n: [t * 1e3 for t in x] for n, x in samples.items()}}
print(f"[t6 attention alone] copy {copy_gbps:.0f} GB/s; {kv_bytes / 1e6:.1f} MB of K+V: {bytes_us:.2f} us at it")
for n, t in us.items():
    print(f"  {n:28s} {t:7.2f} us  ({bytes_us / t:.3f} of the copy bandwidth)")
json.dump(res, open(os.path.join(OUT, "t6_attn_alone.json"), "w"), indent=1)
