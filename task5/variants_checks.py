"""Attention variants in decode (task 5's grouped decode kernel): checks and benchmarks.

`decode_attention_grouped` attends one query per (batch, query head) to a cache with fewer
KV heads (GQA/MQA: each KV head's keys are read once for its whole query group) and every
pattern of common/variants.py: the query sits at the last position of its sequence, so a
causal flag hides nothing, a window keeps the last `window` keys, key lengths say where each
sequence's cache ends (or, left-padded, where it starts). Groups of `python -m task5.test`:

  gqa-small   one tiny case per pattern and dtype (compute-sanitizer)
  gqa         against float64 by FlashAttention-2's criterion: contexts 1, 7, 113, 1023,
              4097; GQA ratios 1, 2, 4, 7, 8 and MQA; head dims 64, 128 (and 8, 40);
              windows, strides, masks, varlen and left-padded lengths, logits in the
              hundreds, split counts 1 / auto / 7, strided cache views; fp32/fp16/bf16;
              bad input raises a sentence
  gqa-bench   B 1, H_q 32, H_kv 4, ctx 32768, D 128, fp16, timed as CUDA-graph replays with
              the cache rotated (bigger than L2): the fraction of copy bandwidth at which the
              KV bytes (read once) stream, and SDPA (enable_gqa=True, every backend that
              runs, the best) over ours
"""

from __future__ import annotations

import torch

from common.checks import Check, check_raises
from common.graphs import graph_time_per_call_ms
from common.harness import gpu_group
from common.timing import measure_copy_bandwidth
from common.variants import Variant, check_variant
from task5 import attention as attention_module
from task5.attention import decode_attention_grouped
from task5.manifest import GQA_CASE

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LARGE = 10.0


def _inputs(batch, heads_q, heads_kv, ctx, head_dim, dtype, gen, device, scale=1.0,
            cache_layout=False):
    """q [B, H_q, 1, D], k/v [B, H_kv, ctx, D]; cache_layout: k/v are head views of a
    [B, ctx + 3, H_kv * D] token-major cache (row stride H_kv * D, longer than ctx)."""
    def randn(*shape):
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(dtype)

    q = randn(batch, heads_q, 1, head_dim)
    if not cache_layout:
        return q, randn(batch, heads_kv, ctx, head_dim), randn(batch, heads_kv, ctx, head_dim)
    caches = [randn(batch, ctx + 3, heads_kv, head_dim)[:, :ctx].transpose(1, 2) for _ in "kv"]
    return q, caches[0], caches[1]


def _variant(pattern, batch, heads_q, ctx, dtype, gen, device) -> Variant:
    lengths = None
    if pattern in ("lengths", "left", "left-window"):
        lengths = torch.randint(1, ctx + 1, (batch,), device=device, generator=gen,
                                dtype=torch.int32)
        lengths[0] = ctx
    mask = None
    if pattern == "mask-bool":
        mask = torch.rand(batch, heads_q, 1, ctx, device=device, generator=gen) < 0.6
        mask[0, 0] = False                                   # a head that sees nothing
    elif pattern == "mask-float":
        mask = (torch.randn(1, 1, 1, ctx, device=device, generator=gen) * 2).to(dtype)
    return Variant(causal=pattern != "full",
                   window=max(1, ctx // 3) if "window" in pattern else None,
                   stride=3 if pattern == "stride" else 1, mask=mask, key_lengths=lengths,
                   left_padding=pattern.startswith("left"))


# (B, H_q, H_kv, ctx, D, pattern, options)
SWEEP = [
    (2, 8, 8, 1, 64, "causal", ""), (2, 8, 8, 7, 64, "full", ""),
    (3, 8, 4, 113, 128, "causal", ""), (2, 32, 4, 1023, 128, "causal", ""),
    (1, 32, 8, 4097, 128, "causal", ""), (2, 14, 2, 1023, 64, "causal", ""),
    (2, 8, 1, 1023, 128, "causal", ""), (2, 32, 1, 500, 64, "causal", ""),
    (2, 6, 3, 300, 8, "causal", ""), (2, 4, 2, 300, 40, "causal", ""),
    (2, 16, 2, 1023, 128, "window", ""), (2, 8, 4, 1023, 64, "stride", ""),
    (2, 8, 2, 513, 64, "mask-bool", ""), (2, 8, 4, 300, 128, "mask-float", ""),
    (4, 8, 2, 1023, 128, "lengths", ""), (4, 8, 2, 1023, 64, "left", ""),
    (4, 16, 2, 700, 128, "left-window", ""),
    (2, 16, 4, 1023, 128, "causal", "large"), (2, 8, 2, 1023, 64, "causal", "cache"),
    (2, 8, 8, 4097, 128, "lengths", "cache"),
]
SPLITS = (None, 1, 7)


def _sweep(cases, gen, device, splits=SPLITS) -> list[Check]:
    checks = []
    for b, hq, hkv, ctx, d, pattern, options in cases:
        for dname, dtype in DTYPES.items():
            q, k, v = _inputs(b, hq, hkv, ctx, d, dtype, gen, device,
                              scale=LARGE if options == "large" else 1.0,
                              cache_layout=options == "cache")
            variant = _variant(pattern, b, hq, ctx, dtype, gen, device)
            for num_splits in splits:
                def run(out, q=q, k=k, v=v, variant=variant, num_splits=num_splits):
                    return decode_attention_grouped(q, k, v, out=out, num_splits=num_splits,
                                                    **variant.kwargs())
                name = (f"{dname} decode B{b} Hq{hq}/Hkv{hkv} ctx{ctx} D{d}: "
                        f"{variant.describe()}{f' ({options})' if options else ''}, "
                        f"splits {num_splits or 'auto'}")
                checks.append(check_variant(name, run, q, k, v, variant))
    return checks


def gqa_small_group(args=None):
    device, gen, failed = gpu_group("gqa-small", args)
    if failed:
        return failed, {}
    small = [(2, 4, 2, 37, 64, p, "") for p in ("causal", "window", "stride", "mask-bool",
                                                 "mask-float", "lengths", "left")]
    return _sweep(small + [(1, 8, 1, 5, 128, "full", "")], gen, device, splits=(1, 3)), {}


def gqa_group(args=None):
    device, gen, failed = gpu_group("gqa", args)
    if failed:
        return failed, {}
    checks = _sweep(SWEEP, gen, device)
    strict = (ValueError, TypeError)
    q, k, v = _inputs(2, 8, 4, 64, 64, torch.float16, gen, device)
    lengths = torch.tensor([64, 3], dtype=torch.int32, device=device)

    def raises(name, fn, mention):
        return check_raises(f"decode input: {name}", fn, exc_types=strict, must_mention=mention)

    checks += [
        raises("H_q 8 over H_kv 3", lambda: decode_attention_grouped(q, k[:, :3], v[:, :3]),
               "multiple"),
        raises("two queries", lambda: decode_attention_grouped(q.expand(2, 8, 2, 64), k, v),
               "one new query"),
        raises("window 0", lambda: decode_attention_grouped(q, k, v, window=0), "window"),
        raises("stride 0", lambda: decode_attention_grouped(q, k, v, stride=0), "stride"),
        raises("mask of the wrong shape", lambda: decode_attention_grouped(
            q, k, v, mask=torch.ones(2, 8, 1, 63, dtype=torch.bool, device=device)), "broadcast"),
        raises("key_lengths of dtype int64",
               lambda: decode_attention_grouped(q, k, v, key_lengths=lengths.long()), "int32"),
        raises("key_lengths beyond the cache",
               lambda: decode_attention_grouped(q, k, v, key_lengths=lengths + 1), "[0, 64]"),
        raises("head_dim 136", lambda: decode_attention_grouped(
            *_inputs(1, 2, 1, 8, 136, torch.float16, gen, device)), "head_dim"),
        raises("float64", lambda: decode_attention_grouped(q.double(), k.double(), v.double()),
               "dtype"),
    ]
    return checks, {}


GQA_BENCH = (1, 32, 4, 32768, 128)   # (B, H_q, H_kv, ctx, D), fp16
ROTATE_BYTES = 200 * 2**20          # several caches, together far bigger than L2
BW_TARGET = 0.85
SDPA_TARGET = 1.0


def gqa_bench_group(args=None):
    import math

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device, gen, failed = gpu_group("gqa-bench", args)
    if failed:
        return failed, {}
    b, hq, hkv, ctx, d = GQA_BENCH
    dtype = torch.float16
    kv_bytes = 2 * b * hkv * ctx * d * 2
    sets = [_inputs(b, hq, hkv, ctx, d, dtype, gen, device)
            for _ in range(max(2, math.ceil(ROTATE_BYTES / kv_bytes)))]
    copy_gbps = measure_copy_bandwidth()
    ours_ms = graph_time_per_call_ms(lambda q, k, v: decode_attention_grouped(q, k, v), sets)
    gbps = kv_bytes / (ours_ms * 1e-3) / 1e9
    key = GQA_CASE
    assert key.endswith(f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}_d{d}"), "GQA_BENCH and the manifest agree"
    metrics = {f"{key}.us": ours_ms * 1e3, f"{key}.gbps": gbps, f"{key}.copy_gbps": copy_gbps,
               f"{key}.bw_fraction": gbps / copy_gbps}
    checks = [Check(f"GQA decode {key.split('.')[-1]}: bw_fraction >= {BW_TARGET}",
                    gbps / copy_gbps >= BW_TARGET,
                    f"{ours_ms * 1e3:.1f} us, {gbps:.0f} GB/s of K+V read once = "
                    f"{gbps / copy_gbps:.2f} of the copy bandwidth ({copy_gbps:.0f} GB/s)",
                    target=True)]
    # The CUDA-core grouped kernel on the same inputs, for comparison (Results.md shows both).
    attention_module.TENSOR_CORE_DECODE = False
    try:
        cuda_core_ms = graph_time_per_call_ms(lambda q, k, v: decode_attention_grouped(q, k, v), sets)
    finally:
        attention_module.TENSOR_CORE_DECODE = True
    metrics[f"{key}.cuda_core_us"] = cuda_core_ms * 1e3
    sdpa = {}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel(backend):
                def peer(q, k, v):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                q, k, v = sets[0]
                err = (peer(q, k, v).float() - decode_attention_grouped(q, k, v).float()).abs().max()
                if not bool(err < 1e-2):
                    print(f"[task5] SDPA {name} disagrees with ours by {float(err):.1e}: left out")
                    continue
                sdpa[name.lower()] = graph_time_per_call_ms(peer, sets)
        except RuntimeError as err:
            print(f"[task5] SDPA {name} refuses GQA decode: {str(err).splitlines()[0][:100]}")
    for name, ms in sdpa.items():
        metrics[f"{key}.sdpa_{name}_us"] = ms * 1e3
    if sdpa:
        best = min(sdpa, key=sdpa.get)
        ratio = sdpa[best] / ours_ms
        metrics[f"{key}.ratio_vs_sdpa_best"] = ratio
        metrics[f"{key}.sdpa_best_us"] = sdpa[best] * 1e3
        checks.append(Check(f"GQA decode: best SDPA / ours >= {SDPA_TARGET}", ratio >= SDPA_TARGET,
                            f"best SDPA ({best}, enable_gqa) {sdpa[best] * 1e3:.1f} us, ours "
                            f"{ours_ms * 1e3:.1f} us: {ratio:.2f}", target=True))
    return checks, metrics


GROUPS = {"gqa-small": gqa_small_group, "gqa": gqa_group, "gqa-bench": gqa_bench_group}
