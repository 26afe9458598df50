"""Task 6's GQA course model (issue 32: hidden 4096, 32 query heads, 8 KV heads, 24 layers,
B 4, prompt 1024), bf16, CUDA-graph TBT over 100 new tokens with one kind of kernel of the fused
decode step skipped (its output replaced by its input or a static buffer: NOT a result, the
tokens are wrong; the difference to `base` is what that kind costs inside the step, boundaries
included); `attn_16_keys` runs the same attention over its first 16 keys only (its fixed cost
inside the step), alone and with the norms and RoPE skipped. One process, interleaved rounds, medians.
    PYTHONPATH=. python .scratch/t6_gqa_whatif.py   (writes $OUT/t6_gqa_whatif2.json)
"""
import dataclasses, json, os, statistics, time
import torch
from common.timing import measure_copy_bandwidth
from task6 import model as tm
from task6.generate import generate
from task6.test import GQA_COURSE, decode_kv_bytes, decode_weight_bytes

OUT = os.environ.get("OUT", ".")
t0 = time.time()
cfg = GQA_COURSE
dev = "cuda"
model = cfg.build(torch.bfloat16, dev)
prompt = cfg.prompt_tokens(torch.Generator(device=dev).manual_seed(1), dev)
base_ops = tm.kernels()
orig_kernels, orig_norm = tm.kernels, tm.norm
static = {}
q_shape = (cfg.batch, 1, cfg.heads, cfg.hidden // cfg.heads)   # a decode step's rotated q
static[(q_shape, torch.bfloat16)] = torch.randn(q_shape, device=dev).to(torch.bfloat16)


def buffer_like(q):
    key = (tuple(q.shape), q.dtype)
    if key not in static:
        static[key] = torch.randn(q.shape, device=q.device).to(q.dtype)
    return static[key]


def no_rope(q, k, v, k_cache, v_cache, cos, sin, pos):
    if q.shape[1] > 1:   # the prefill keeps its RoPE and cache write
        return base_ops.rope_append(q, k, v, k_cache, v_cache, cos, sin, pos)
    return buffer_like(q)


def no_attn(q, k_cache, v_cache, num_heads, seq_len, *a, **kw):
    return q


def splits(n):
    def attend(q, k_cache, v_cache, num_heads, seq_len, causal=False, out=None, num_splits=None):
        return base_ops.decode_attention(q, k_cache, v_cache, num_heads, seq_len, causal, out, n)
    return attend


def no_norm(layer, x, step):
    return x if step.fused else orig_norm(layer, x, step)


def floor_keys(q, k_cache, v_cache, num_heads, seq_len, causal=False, out=None, num_splits=None):
    # the same call over the first 16 keys only: the attention's fixed cost inside the step
    return base_ops.decode_attention(q, k_cache, v_cache, num_heads, 16, causal, out, num_splits)


VARIANTS = {"base": ({}, False), "no_norm": ({}, True),
            "no_norm_rope": ({"rope_append": no_rope}, True),
            "attn_16_keys": ({"decode_attention": floor_keys}, False),
            "no_norm_rope_attn16": ({"rope_append": no_rope, "decode_attention": floor_keys}, True),
            "no_attn": ({"decode_attention": no_attn}, False),
            "no_norm_rope_attn": ({"rope_append": no_rope, "decode_attention": no_attn}, True)}


def tbt(name, tokens=100):
    changes, skip_norm = VARIANTS[name]
    ops = dataclasses.replace(base_ops, **changes)
    tm.kernels = lambda: ops
    tm.norm = no_norm if skip_norm else orig_norm
    try:
        timings = {}
        generate(model, prompt, tokens, use_cuda_graph=True, timings=timings)
        return timings["tbt_ms"]
    finally:
        tm.kernels, tm.norm = orig_kernels, orig_norm


for name in VARIANTS:   # warm-up: kernels loaded, graphs captured once
    tbt(name, 4)
copy_gbps = measure_copy_bandwidth()
weights = decode_weight_bytes(model)
kv = decode_kv_bytes(cfg, 2)
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
       "commit": os.environ.get("ATTN_COMMIT"), "copy_gbps": copy_gbps,
       "weights_ms": weights / copy_gbps / 1e6, "bytes_ms": (weights + kv) / copy_gbps / 1e6,
       "tbt_ms": {n: [] for n in VARIANTS}}
for _ in range(3):
    for name in VARIANTS:
        res["tbt_ms"][name].append(tbt(name))
med = {n: statistics.median(v) for n, v in res["tbt_ms"].items()}
res["median_ms"] = med
print(f"[whatif] {res['device']}; copy {copy_gbps:.0f} GB/s; weights {res['weights_ms']:.3f} ms, "
      f"weights + KV {res['bytes_ms']:.3f} ms; {time.time() - t0:.0f} s")
for n, t in med.items():
    print(f"  {n:20s} {t:.3f} ms  ({t / res['bytes_ms']:.3f}x bytes; {1e3 * (med['base'] - t):+.0f} us vs base)"
          f"  rounds {', '.join(f'{x:.3f}' for x in res['tbt_ms'][n])}")
json.dump(res, open(os.path.join(OUT, "t6_gqa_whatif2.json"), "w"), indent=1)
