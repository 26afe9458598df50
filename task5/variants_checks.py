"""Attention variants in decode (task 5's grouped decode kernel): checks and benchmarks.

`decode_attention_grouped` attends one query per (batch, query head) to a cache with fewer
KV heads (GQA/MQA: each KV head's keys are read once for its whole query group) and every
pattern of common/variants.py: the query sits at the last position of its sequence, so a
causal flag hides nothing, a window keeps the last `window` keys, key lengths say where each
sequence's cache ends (or, left-padded, where it starts). Groups of `python -m task5.test`:

  gqa-small   one tiny case per pattern and dtype (compute-sanitizer), and a few of the
              tensor-core kernel's own (several query rows, softcap, sinks, scale, empty)
  gqa         against float64 by FlashAttention-2's criterion: contexts 1, 7, 113, 1023,
              4097; GQA ratios 1, 2, 4, 7, 8 and MQA; head dims 64, 128 (and 8, 40; 96,
              136, 160, 192, 200, 256);
              windows, strides, masks, varlen and left-padded lengths, logits in the
              hundreds, split counts 1 / auto / 7, strided cache views; fp32/fp16/bf16 (the
              fp16/bf16 grouped cases run decode_gqa.cu, and once more on CUDA cores);
              bad input raises a sentence
  gqa-mma     decode_gqa.cu itself (grouped-query decode on tensor cores), fp16 and bf16,
              against float64 by FlashAttention-2's criterion: GQA ratios 1..8 and MQA, head
              dims 64, 96, 128, 256 (and 40, 136, 160, 192, 200: padded tiles), contexts 1 .. 4097 off the
              tile sizes and one of 131072, 1..16 query rows (bottom-right causal), every
              variant (window, stride, bool/additive masks, varlen and left-padded lengths
              with empty sequences, softcap, sinks, scale), logits in the hundreds, forced
              split counts (more splits than key tiles too), caches NaN beyond the keys a
              sequence has, split merges by the last block and by the merge kernel, a
              captured CUDA graph replayed as the lengths grow, routing through
              task5.attention.attention, settled tiles (fresh_keys: the keys a kernel
              writes just before the decode NaN until it does); bad input raises a sentence
  gqa-bench   the issue's grouped-query decode shapes (B, H_q / H_kv, ctx, D 128), fp16 and
              bf16, decode_gqa.cu and every fused SDPA backend (enable_gqa=True) timed as
              CUDA-graph replays in interleaved rounds with the caches rotated (bigger than
              L2): us, the fraction of copy bandwidth at which the KV bytes (read once) stream,
              best SDPA time / ours; at B 8, 32/8, ctx 8192 (fp16) the left-padded, windowed
              and softcapped decodes' bandwidth over the keys they read / the plain decode's;
              at B 1, 32/4, ctx 32768 (fp16) also the paths before it (task 4's kernel with
              rows; the CUDA-core grouped kernel), for A/B
"""

from __future__ import annotations

import contextlib
import math

import torch

from common.build import call_extension
from common.checks import Check, check_raises
from common.graphs import capture_graph, graph_per_call_timer
from common.harness import env_setting, gpu_group
from common.timing import interleaved_medians, measure_copy_bandwidth
from common.variants import Variant, check_variant, key_range, reference_attention_variant
from task5 import attention as attention_module
from task5.attention import attention, decode_attention_grouped
from task5.manifest import (
    GQA_BENCH_SHAPES,
    GQA_BW_SHAPES,
    GQA_CASE,
    GQA_VARIANT_SHAPE,
    GQA_VARIANTS,
    gqa_prefix,
)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LARGE = 10.0


def _off_16_bytes(t):
    """t's values in a contiguous view that starts one element past a 16-byte boundary."""
    view = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
    return view.copy_(t)


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
    # Head dims above 128 (the grouped kernel's 256-wide rows; 136 and 200 padded) and 96.
    (2, 8, 2, 1023, 256, "causal", ""), (2, 8, 8, 300, 256, "window", ""),
    (2, 4, 1, 113, 192, "causal", ""), (2, 16, 2, 513, 136, "mask-bool", ""),
    (4, 8, 2, 700, 200, "left-window", ""), (2, 12, 4, 1023, 160, "lengths", ""),
    (2, 8, 4, 300, 96, "stride", ""), (2, 8, 2, 1023, 256, "causal", "large"),
]
SPLITS = (None, 1, 7)


def _sweep(cases, gen, device, splits=SPLITS, dtypes=tuple(DTYPES), suffix="") -> list[Check]:
    checks = []
    for b, hq, hkv, ctx, d, pattern, options in cases:
        for dname in dtypes:
            dtype = DTYPES[dname]
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
                        f"splits {num_splits or 'auto'}{suffix}")
                checks.append(check_variant(name, run, q, k, v, variant))
    return checks


@contextlib.contextmanager
def _setting(name: str, value):
    """task5.attention's module switch `name` set to `value` inside the block."""
    before = getattr(attention_module, name)
    setattr(attention_module, name, value)
    try:
        yield
    finally:
        setattr(attention_module, name, before)


def gqa_small_group(args=None):
    device, gen, failed = gpu_group("gqa-small", args)
    if failed:
        return failed, {}
    small = [(2, 4, 2, 37, 64, p, "") for p in ("causal", "window", "stride", "mask-bool",
                                                 "mask-float", "lengths", "left")]
    checks = _sweep(small + [(1, 8, 1, 5, 128, "full", ""), (1, 8, 2, 40, 256, "window", "")],
                    gen, device, splits=(1, 3))
    mma_small = [(2, 4, 2, 3, 37, 64, "causal", "softcap sinks scale"),
                 (3, 8, 2, 1, 37, 128, "lengths", "empty nan"),
                 (2, 6, 2, 5, 40, 96, "mask-bool", ""), (2, 6, 2, 1, 70, 128, "mask-shared", "")]
    persistent = [(3, 8, 2, 1, 37, 128, "lengths", "empty nan"), (2, 8, 4, 1, 20, 64, "causal", "sinks")]
    return (checks + _mma_sweep(mma_small, gen, device, splits=(1, 3), dtypes=("fp16",))
            + _persistent_checks(persistent, gen, device)), {}


def gqa_group(args=None):
    device, gen, failed = gpu_group("gqa", args)
    if failed:
        return failed, {}
    checks = _sweep(SWEEP, gen, device)
    # fp16/bf16 grouped cases ran decode_gqa.cu above: the CUDA-core grouped kernel once more.
    with _setting("TENSOR_CORE_DECODE", False):
        checks += _sweep(SWEEP, gen, device, splits=(None,), dtypes=("fp16", "bf16"),
                         suffix=" [CUDA cores]")
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
        raises("head_dim 264", lambda: decode_attention_grouped(
            *_inputs(1, 2, 1, 8, 264, torch.float16, gen, device)), "head_dim"),
        raises("float64", lambda: decode_attention_grouped(q.double(), k.double(), v.double()),
               "dtype"),
    ]

    # The CUDA-core grouped kernel (fp32; fp16 with TENSOR_CORE_DECODE off and group 1 there).
    for dtype in (torch.float32, torch.float16):
        aligned = _inputs(2, 8, 2 if dtype == torch.float32 else 8, 200, 64, dtype, gen, device)
        shifted = [_off_16_bytes(t) for t in aligned]
        with _setting("TENSOR_CORE_DECODE", False):
            same = torch.equal(decode_attention_grouped(*shifted, causal=True),
                               decode_attention_grouped(*aligned, causal=True))
        checks.append(Check(f"decode input: {str(dtype)[6:]} q, k, v contiguous but starting off a "
                            "16-byte boundary (CUDA-core grouped kernel): copied, the same output "
                            "bit for bit", same))
    return checks, {}


# ---- decode_gqa.cu: grouped-query decode on tensor cores -----------------------------------

MMA_DTYPES = ("fp16", "bf16")
MMA_SPLITS = (None, 1, 5, 64)   # auto, unsplit, a few, more splits than some cases have tiles

# (B, H_q, H_kv, S_q, S_k, D, pattern, options). Patterns as _variant's, plus "full-window";
# options: large (logits in the hundreds), cache (strided views of token-major caches), nan
# (NaN in every key the kernel must not read: outside the sequence's keys and before the
# window), empty (the last sequence has no key), softcap, sinks, scale.
MMA_SWEEP = [
    # GQA ratios 1..8 and MQA, contexts on and off the tile sizes, every head dim
    (2, 8, 8, 1, 1, 128, "causal", ""), (2, 8, 4, 1, 15, 128, "causal", ""),
    (2, 9, 3, 1, 16, 64, "causal", ""), (2, 8, 2, 1, 17, 128, "full", ""),
    (1, 10, 2, 1, 33, 96, "causal", ""), (2, 12, 2, 1, 100, 128, "causal", ""),
    (2, 14, 2, 1, 1023, 128, "causal", ""), (2, 32, 4, 1, 4097, 128, "causal", ""),
    (1, 32, 1, 1, 2049, 128, "causal", ""), (2, 16, 2, 1, 513, 256, "causal", ""),
    (2, 8, 2, 1, 300, 40, "causal", ""), (2, 8, 4, 1, 300, 200, "causal", ""),
    (2, 8, 2, 1, 777, 64, "causal", "large"), (2, 16, 4, 1, 1023, 128, "causal", "large cache"),
    (2, 8, 2, 1, 1000, 96, "full", "cache"), (2, 8, 2, 1, 600, 256, "causal", "large"),
    (2, 8, 2, 1, 300, 136, "causal", ""), (2, 8, 4, 2, 513, 160, "causal", ""),
    (2, 8, 2, 1, 1023, 192, "window", ""),
    # several query rows per sequence (bottom-right causal), more rows than one tile
    (2, 8, 2, 2, 300, 128, "causal", ""), (2, 8, 2, 5, 1023, 128, "causal", ""),
    (1, 4, 1, 16, 511, 64, "causal", ""), (2, 8, 8, 16, 200, 128, "causal", ""),
    (2, 8, 2, 7, 90, 256, "full", ""), (2, 8, 2, 3, 4096, 96, "window", ""),
    (2, 8, 2, 16, 7, 128, "causal", ""),
    # every variant
    (2, 16, 2, 1, 1023, 128, "window", "nan"), (2, 8, 2, 4, 1023, 128, "full-window", "nan"),
    (2, 8, 4, 1, 1023, 64, "stride", ""), (2, 8, 4, 3, 500, 128, "stride", ""),
    (2, 8, 2, 1, 513, 64, "mask-bool", ""), (2, 8, 2, 4, 300, 128, "mask-bool", ""),
    (2, 8, 4, 1, 300, 128, "mask-float", ""), (2, 8, 4, 6, 300, 96, "mask-float", ""),
    (4, 8, 2, 1, 1023, 128, "lengths", "empty nan"), (4, 8, 2, 3, 1023, 64, "lengths", "empty nan"),
    (4, 8, 2, 1, 1023, 64, "left", "empty nan"), (4, 16, 2, 2, 700, 128, "left-window", "nan"),
    (3, 8, 2, 1, 1500, 128, "causal", "softcap"), (3, 8, 2, 1, 1500, 128, "causal", "softcap large"),
    (3, 8, 2, 1, 1500, 128, "causal", "sinks"), (3, 8, 2, 4, 1500, 256, "causal", "sinks"),
    (3, 8, 2, 1, 700, 64, "causal", "scale"),
    (4, 8, 2, 2, 999, 128, "left-window", "softcap sinks scale nan empty"),
    (2, 8, 2, 1, 333, 128, "mask-float", "softcap sinks scale"),
    # a bool mask every head and query row of a sequence shares: the mask-vote kernels
    (2, 8, 2, 1, 1023, 128, "mask-shared", ""), (3, 8, 2, 1, 700, 64, "mask-shared-left", "empty nan"),
    (2, 16, 4, 1, 999, 96, "mask-shared-window", "nan"), (2, 8, 2, 4, 513, 128, "mask-shared", ""),
    (3, 8, 2, 1, 1500, 128, "mask-shared", "softcap sinks"), (2, 8, 2, 1, 300, 256, "mask-shared", ""),
]
MMA_LONG = [(1, 8, 2, 1, 131072, 128, "causal", "")]
# Split decodes merged by decode.cu's merge kernel instead of their last block (as when no
# counters can be had: a graph captured before the first decode).
# Several items per block on a persistent grid (forced to 2 blocks): every variant's plan, head
# dims 64-128, 12 and 32 rows (one and two row tiles), left padding with empty sequences.
MMA_PERSISTENT = [(5, 8, 2, 1, 300, 128, "window", "nan"), (4, 16, 4, 1, 700, 128, "left", "empty nan"),
                  (3, 16, 4, 1, 200, 96, "left-window", "softcap sinks scale nan"),
                  (4, 32, 8, 3, 90, 128, "causal", ""), (3, 32, 4, 4, 60, 64, "causal", ""),
                  (2, 8, 2, 1, 64, 128, "mask-float", ""), (4, 16, 4, 1, 700, 128, "mask-shared-left", "empty nan")]
MMA_MERGE_KERNEL = [(2, 8, 2, 1, 1023, 128, "causal", ""), (1, 32, 1, 1, 2049, 128, "causal", ""),
                    (2, 8, 2, 5, 700, 64, "left-window", "sinks nan empty"),
                    (2, 8, 2, 3, 900, 256, "mask-bool", "softcap")]
# Through task5.attention.attention (the routing must pick decode_gqa.cu for these).
MMA_ROUTED = [(2, 8, 2, 1, 1023, 128, "causal", ""), (2, 8, 2, 4, 513, 64, "window", ""),
              (3, 8, 4, 1, 700, 128, "left", "softcap sinks scale")]


def _shared_bool_mask(batch, seq_k, gen, device, empty=False):
    """A bool mask [B, 1, 1, S_k] that every head and query row of a sequence shares
    (transformers' padding mask; decode_gqa.cu's mask-vote kernels take it): each sequence's
    first keys dropped (padding), a run of 40 dropped keys (whole key tiles) and three single
    ones (tiles where the vote finds a dropped key); with `empty`, the last sequence sees none."""
    cols = torch.arange(seq_k, device=device)
    pads = torch.randint(0, max(1, seq_k // 3), (batch, 1), device=device, generator=gen)
    pads[0] = 0
    start = torch.randint(0, max(1, seq_k - 40), (batch, 1), device=device, generator=gen)
    keep = (cols >= pads) & ~((cols >= start) & (cols < start + 40))
    singles = torch.randint(0, seq_k, (batch, 3), device=device, generator=gen)
    keep.scatter_(1, singles, False)
    if empty and batch > 1:
        keep[-1] = False
    return keep.view(batch, 1, 1, seq_k)


def _mma_variant(pattern, options, batch, heads_q, seq_q, seq_k, dtype, gen, device) -> Variant:
    lengths = None
    if pattern in ("lengths", "left", "left-window"):
        lengths = torch.randint(1, seq_k + 1, (batch,), device=device, generator=gen,
                                dtype=torch.int32)
        lengths[0] = seq_k
        if "empty" in options and batch > 1:
            lengths[-1] = 0                                  # an empty sequence: zeros
    mask = None
    if pattern == "mask-bool":
        mask = torch.rand(batch, heads_q, seq_q, seq_k, device=device, generator=gen) < 0.6
        mask[0, 0, 0] = False                                # a row that sees nothing
    elif pattern == "mask-float":
        mask = (torch.randn(batch, 1, seq_q, seq_k, device=device, generator=gen) * 2).to(dtype)
    elif pattern.startswith("mask-shared"):
        mask = _shared_bool_mask(batch, seq_k, gen, device, empty="empty" in options)
    if pattern.endswith("-left"):                            # the mask and left-padded lengths
        lengths = torch.randint(1, seq_k + 1, (batch,), device=device, generator=gen,
                                dtype=torch.int32)
        lengths[0] = seq_k
    sinks = None
    if "sinks" in options:
        sinks = torch.randn(heads_q, device=device, generator=gen) * 2
    return Variant(causal=not pattern.startswith("full"),
                   window=max(1, seq_k // 3) if "window" in pattern else None,
                   stride=3 if pattern == "stride" else 1, mask=mask, key_lengths=lengths,
                   left_padding=pattern.startswith("left") or pattern.endswith("-left"),
                   softcap=30.0 if "softcap" in options else None, sinks=sinks,
                   scale=0.3 if "scale" in options else None)


def _poison_unread(k, v, variant: Variant, seq_q: int):
    """Copies of k and v with NaN in every key no query of its sequence may see: outside the
    sequence's keys, and before the window of its first query. A kernel that reads one (and
    multiplies it by a zero weight) outputs NaN."""
    batch, _, seq_k, _ = k.shape
    begin, end = key_range(batch, seq_k, variant.key_lengths, variant.left_padding, k.device)
    cols = torch.arange(seq_k, device=k.device).view(1, seq_k)
    unread = (cols < begin.view(batch, 1)) | (cols >= end.view(batch, 1))
    if variant.window:
        unread |= cols <= (end - seq_q - variant.window).view(batch, 1)
    unread = unread.view(batch, 1, seq_k, 1).expand_as(k)
    return (k.masked_fill(unread, float("nan")), v.masked_fill(unread, float("nan")))


def _mma_inputs(b, hq, hkv, sq, sk, d, dtype, gen, device, options):
    scale = LARGE if "large" in options else 1.0

    def randn(*shape):
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(dtype)

    if "cache" not in options:
        return randn(b, hq, sq, d), randn(b, hkv, sk, d), randn(b, hkv, sk, d)
    # Token-major buffers viewed per head, as a model holds them (the cache longer than sk).
    q = randn(b, sq, hq, d).transpose(1, 2)
    k, v = (randn(b, sk + 3, hkv, d)[:, :sk].transpose(1, 2) for _ in "kv")
    return q, k, v


def _run_gqa(q, k, v, variant: Variant, out, num_splits, fresh_keys=None):
    """decode_gqa.cu itself (any group, head dims up to 256), past task5.attention's routing."""
    return attention_module._decode_gqa(q, k, v, variant.causal, variant.window, variant.stride,
                                        variant.mask, variant.key_lengths, variant.left_padding,
                                        out, num_splits, variant.softcap, variant.sinks,
                                        variant.scale, fresh_keys)


def _mma_sweep(cases, gen, device, splits=MMA_SPLITS, dtypes=MMA_DTYPES, routed=False,
               suffix="") -> list[Check]:
    checks = []
    for b, hq, hkv, sq, sk, d, pattern, options in cases:
        for dname in dtypes:
            dtype = DTYPES[dname]
            q, k, v = _mma_inputs(b, hq, hkv, sq, sk, d, dtype, gen, device, options)
            variant = _mma_variant(pattern, options, b, hq, sq, sk, dtype, gen, device)
            kr, vr = _poison_unread(k, v, variant, sq) if "nan" in options else (k, v)
            for num_splits in splits:
                name = (f"{dname} {'attention()' if routed else 'decode_gqa'} B{b} Hq{hq}/Hkv{hkv} "
                        f"Sq{sq} Sk{sk} D{d}: {variant.describe()}"
                        f"{f' ({options})' if options else ''}, splits {num_splits or 'auto'}"
                        f"{suffix}")
                if routed:
                    if not attention_module._gqa_kernel_applies(q, k):
                        checks.append(Check(name, False, "task5.attention does not route this "
                                            "call to decode_gqa.cu"))
                        continue

                    def run(out, q=q, k=kr, v=vr, variant=variant):
                        return attention(q, k, v, out=out, **variant.kwargs())
                else:
                    def run(out, q=q, k=kr, v=vr, variant=variant, num_splits=num_splits):
                        return _run_gqa(q, k, v, variant, out, num_splits)
                checks.append(check_variant(name, run, q, k, v, variant))
    return checks


def _persistent_checks(cases, gen, device) -> list[Check]:
    """Unsplit work on a persistent grid (decode_gqa.cuh: each block walks items, copying the
    next one's Q and first tiles while it merges the one before), forced to a grid of 2 blocks
    (ATTN_GQA_PERSISTENT_GRID) so that small cases walk several items: against float64, and bit
    for bit equal to a block per item (ATTN_GQA_PERSISTENT=0)."""
    checks = []
    for b, hq, hkv, sq, sk, d, pattern, options in cases:
        q, k, v = _mma_inputs(b, hq, hkv, sq, sk, d, torch.float16, gen, device, options)
        variant = _mma_variant(pattern, options, b, hq, sq, sk, torch.float16, gen, device)
        kr, vr = _poison_unread(k, v, variant, sq) if "nan" in options else (k, v)
        name = (f"fp16 decode_gqa persistent grid of 2, B{b} Hq{hq}/Hkv{hkv} Sq{sq} Sk{sk} D{d}: "
                f"{variant.describe()}{f' ({options})' if options else ''}")
        with env_setting("ATTN_GQA_PERSISTENT_GRID", "2"):
            checks.append(check_variant(name, lambda out: _run_gqa(q, kr, vr, variant, out, 1),
                                        q, k, v, variant))
            walked = _run_gqa(q, kr, vr, variant, None, 1)
        with env_setting("ATTN_GQA_PERSISTENT", "0"):
            per_item = _run_gqa(q, kr, vr, variant, None, 1)
        checks.append(Check(f"{name}: bit for bit a block per item",
                            torch.equal(walked.view(torch.int16), per_item.view(torch.int16))))
    return checks


# The mask-vote kernels against the elementwise predicate (ATTN_GQA_MASK_VOTE=0): a split
# decode, several query rows, a window with left padding, and a persistent grid of 2 blocks.
MMA_MASK_VOTE = [(2, 8, 2, 1, 1023, 128, "mask-shared", "", None),
                 (2, 8, 2, 3, 513, 64, "mask-shared", "", 4),
                 (3, 16, 4, 1, 999, 96, "mask-shared-window", "", None),
                 (4, 16, 4, 1, 700, 128, "mask-shared-left", "empty", "walk")]


def _mask_vote_checks(cases, gen, device) -> list[Check]:
    """A tile the vote finds every key kept in skips only a predicate that would hide nothing:
    the mask-vote kernels' output is bit for bit the elementwise predicate's."""
    checks = []
    for b, hq, hkv, sq, sk, d, pattern, options, splits in cases:
        for dname in MMA_DTYPES:
            dtype = DTYPES[dname]
            q, k, v = _mma_inputs(b, hq, hkv, sq, sk, d, dtype, gen, device, options)
            variant = _mma_variant(pattern, options, b, hq, sq, sk, dtype, gen, device)
            grid = "2" if splits == "walk" else None
            num_splits = 1 if splits == "walk" else splits
            with env_setting("ATTN_GQA_PERSISTENT_GRID", grid):
                voted = _run_gqa(q, k, v, variant, None, num_splits)
                with env_setting("ATTN_GQA_MASK_VOTE", "0"):
                    elementwise = _run_gqa(q, k, v, variant, None, num_splits)
            checks.append(Check(
                f"{dname} decode_gqa mask vote, B{b} Hq{hq}/Hkv{hkv} Sq{sq} Sk{sk} D{d}: "
                f"{variant.describe()}{f' ({options})' if options else ''}, splits "
                f"{splits or 'auto'}: bit for bit the elementwise predicate's output",
                torch.equal(voted.view(torch.int16), elementwise.view(torch.int16))))
    return checks


# Settled tiles (fresh_keys): (B, H_q, H_kv, S_q, S_k, D, pattern, fresh keys, splits). Task 6's
# step (lengths on the device), a window, S_q 4 with its 4 keys fresh, head dims 96 and 256, no
# key fresh, more fresh keys than keys, and left padding (where the promise is not used).
SETTLED_CASES = [(1, 32, 8, 1, 4096, 128, "causal", 1, None), (4, 32, 8, 1, 1074, 128, "lengths", 1, None),
                 (2, 16, 4, 1, 3000, 64, "window", 1, 3), (3, 8, 2, 4, 777, 128, "lengths", 4, None),
                 (2, 8, 2, 1, 1023, 96, "causal", 1, 2), (2, 8, 2, 1, 500, 256, "causal", 1, None),
                 (2, 16, 4, 1, 2000, 128, "causal", 0, None), (2, 8, 2, 1, 300, 128, "causal", 5000, 2),
                 (3, 8, 2, 1, 900, 128, "left", 1, None)]


def _settled_checks(gen, device) -> list[Check]:
    """fresh_keys, the settled tiles of decode_gqa.cuh (each warp's first tiles below the fresh
    keys copied before the wait for the kernel before): each sequence's last `fresh` keys are
    NaN until one copy kernel, launched just before the decode, writes them (a tile copied
    before that kernel ended could hold NaN, which poisons the output), and then against
    float64 (check_variant) and bit for bit equal to the decode without the promise."""
    checks = []
    for b, hq, hkv, sq, sk, d, pattern, fresh, splits in SETTLED_CASES:
        q = torch.randn(b, hq, sq, d, device=device, generator=gen).to(torch.float16)
        # K and V in one buffer, so that one kernel writes both's fresh rows.
        kv = torch.randn(2, b, hkv, sk, d, device=device, generator=gen).to(torch.float16)
        variant = _mma_variant(pattern, "", b, hq, sq, sk, torch.float16, gen, device)
        _, ends = key_range(b, sk, variant.key_lengths, variant.left_padding, device)
        rows = [(i, j) for i in range(b) for j in range(max(0, int(ends[i]) - fresh), int(ends[i]))]
        b_idx = torch.tensor([i for i, _ in rows], device=device, dtype=torch.long)
        s_idx = torch.tensor([j for _, j in rows], device=device, dtype=torch.long)
        fresh_rows = kv[:, b_idx, :, s_idx].clone()

        def run(out, variant=variant, kv=kv, b_idx=b_idx, s_idx=s_idx, fresh_rows=fresh_rows,
                fresh=fresh, splits=splits, q=q):
            kv[:, b_idx, :, s_idx] = float("nan")
            kv[:, b_idx, :, s_idx] = fresh_rows      # the kernel just before the decode
            return _run_gqa(q, kv[0], kv[1], variant, out, splits, fresh_keys=fresh)

        name = (f"fp16 decode_gqa, settled tiles: B{b} Hq{hq}/Hkv{hkv} Sq{sq} Sk{sk} D{d}: "
                f"{variant.describe()}, {fresh} fresh keys, splits {splits or 'auto'}")
        checks.append(check_variant(name, run, q, kv[0], kv[1], variant))
        promised = run(None)
        plain = _run_gqa(q, kv[0], kv[1], variant, None, splits)
        checks.append(Check(f"{name}: bit for bit the decode without the promise",
                            torch.equal(promised.view(torch.int16), plain.view(torch.int16))))
    return checks


def _graph_checks(gen, device) -> list[Check]:
    """A captured decode replayed while the key lengths (read on the device) change: equal,
    bit for bit, to eager calls with the same lengths, which the sweeps check for accuracy."""
    checks = []
    b, hq, hkv, sk, d = 3, 16, 4, 3000, 128
    q, k, v = (torch.randn(*shape, device=device, generator=gen).to(torch.float16)
               for shape in ((b, hq, 1, d), (b, hkv, sk, d), (b, hkv, sk, d)))
    sinks = torch.randn(hq, device=device, generator=gen)
    for left, window in ((False, None), (True, 1024)):
        lengths = torch.tensor([100, 1, 2000], dtype=torch.int32, device=device)
        variant = Variant(causal=True, window=window, key_lengths=lengths, left_padding=left,
                          sinks=sinks if left else None)
        out = torch.empty_like(q)
        graph, _ = capture_graph(lambda variant=variant, out=out: _run_gqa(q, k, v, variant, out,
                                                                          None))
        same = True
        for new in ([101, 2, 2001], [1500, 0, 3000], [3000, 3000, 1]):
            lengths.copy_(torch.tensor(new, dtype=torch.int32))
            graph.replay()
            eager = _run_gqa(q, k, v, variant, None, None)
            same = same and torch.equal(out, eager)
            err = (eager.double() - reference_attention_variant(q, k, v, variant)).abs().max()
            same = same and bool(err < 1e-2)
        checks.append(Check(f"decode_gqa in a CUDA graph, {variant.describe()}: replays as the "
                            "lengths grow equal eager calls", same))
    return checks


def gqa_mma_group(args=None):
    device, gen, failed = gpu_group("gqa-mma", args)
    if failed:
        return failed, {}
    checks = _mma_sweep(MMA_SWEEP, gen, device)
    checks += _mma_sweep(MMA_LONG, gen, device, splits=(None,), dtypes=("fp16",))
    checks += _mma_sweep(MMA_ROUTED, gen, device, splits=(None,), routed=True)
    with env_setting("ATTN_DECODE_COMBINE_KERNEL", "1"):
        checks += _mma_sweep(MMA_MERGE_KERNEL, gen, device, splits=(None, 5),
                             suffix=" [merge kernel]")
    checks += _persistent_checks(MMA_PERSISTENT, gen, device)
    checks += _mask_vote_checks(MMA_MASK_VOTE, gen, device)
    checks += _settled_checks(gen, device)
    checks += _graph_checks(gen, device)
    ext = attention_module._ext()
    strict = (ValueError, TypeError)

    def direct(q, k, v, num_splits=1, sinks=None):
        return call_extension(ext.decode_attention_gqa, q, k, v, True, None, 1, None, None, False,
                              None, sinks, None, num_splits, None)

    def inputs(sq=1, d=64, dtype=torch.float16):
        return _mma_inputs(2, 8, 2, sq, 64, d, dtype, gen, device, "")

    def malformed_grid():
        with env_setting("ATTN_GQA_PERSISTENT_GRID", "two"):
            return direct(*inputs())

    aligned = inputs()
    checks.append(Check("decode_gqa input: q, k, v contiguous but starting off a 16-byte boundary: "
                        "copied, the same output bit for bit",
                        torch.equal(direct(*map(_off_16_bytes, aligned)), direct(*aligned))))

    checks += [
        check_raises("decode_gqa input: 17 query rows", lambda: direct(*inputs(sq=17)),
                     exc_types=strict, must_mention="query rows"),
        check_raises("decode_gqa input: head_dim 264", lambda: direct(*inputs(d=264)),
                     exc_types=strict, must_mention="256"),
        check_raises("decode_gqa input: num_splits 0", lambda: direct(*inputs(), num_splits=0),
                     exc_types=strict, must_mention="num_splits"),
        check_raises("decode_gqa input: float32", lambda: direct(*inputs(dtype=torch.float32)),
                     exc_types=strict, must_mention="dtype"),
        check_raises("decode_gqa input: sinks of the wrong shape", lambda: direct(
            *inputs(), sinks=torch.zeros(7, device=device)), exc_types=strict, must_mention="shape"),
        check_raises("decode_gqa switch: ATTN_GQA_PERSISTENT_GRID=two", malformed_grid,
                     exc_types=strict, must_mention="ATTN_GQA_PERSISTENT_GRID"),
        check_raises("decode_attention_grouped input: fresh_keys -1", lambda: decode_attention_grouped(
            *inputs(), causal=True, fresh_keys=-1), exc_types=strict, must_mention="fresh_keys"),
        check_raises("decode_attention_grouped input: fresh_keys 1.0", lambda: decode_attention_grouped(
            *inputs(), causal=True, fresh_keys=1.0), exc_types=strict, must_mention="fresh_keys"),
        check_raises("decode_gqa input: fresh_keys -2 past the Python checks", lambda: call_extension(
            ext.decode_attention_gqa, *inputs(), True, None, 1, None, None, False, None, None, None,
            1, None, -2), exc_types=strict, must_mention="fresh_keys"),
    ]
    return checks, {}


# ---- the benchmark ---------------------------------------------------------------------------

GQA_HEAD_DIM = 128
ROTATE_BYTES = 256 * 2**20          # several caches, together far bigger than the 50 MB L2
GQA_ROUNDS = 5                      # interleaved rounds: ours, the SDPA backends, the variants
BW_TARGET = 0.85
SDPA_TARGET = 1.0
VARIANT_TARGET = 0.9
SOFTCAP = 50.0                      # Gemma-2's
SDPA_TIMED = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")  # MATH is never best


def _gqa_shape(shape: str) -> tuple[int, int, int, int]:
    import re

    return tuple(map(int, re.fullmatch(r"b(\d+)_hq(\d+)_hkv(\d+)_ctx(\d+)", shape).groups()))


def _bench_variants(batch, ctx, device) -> dict[str, tuple[dict, float]]:
    """{variant: (attention kwargs, the fraction of the plain decode's keys it reads)}."""
    lengths = torch.tensor([max(1, ctx - 512 * i) for i in range(batch)], dtype=torch.int32,
                           device=device)
    found = {"leftpad": (dict(causal=True, key_lengths=lengths, left_padding=True),
                         float(lengths.sum()) / (batch * ctx)),
             "window4096": (dict(causal=True, window=4096), min(ctx, 4096) / ctx),
             "softcap": (dict(causal=True, softcap=SOFTCAP), 1.0)}
    assert tuple(found) == GQA_VARIANTS, "the variants the manifest names"
    return found


def _bench_shape(dname, shape, copy_gbps, gen, device) -> tuple[list[Check], dict]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from common.checks import REL_TOL, relative_error

    dtype = DTYPES[dname]
    b, hq, hkv, ctx = _gqa_shape(shape)
    d = GQA_HEAD_DIM
    key = gqa_prefix(dname, shape)
    kv_bytes = 2 * b * hkv * ctx * d * 2
    sets = [_mma_inputs(b, hq, hkv, 1, ctx, d, dtype, gen, device, "")
            for _ in range(max(2, math.ceil(ROTATE_BYTES / kv_bytes)))]
    q, k, v = sets[0]
    truth = reference_attention_variant(q, k, v, Variant(causal=True))
    if not attention_module._gqa_kernel_applies(q, k):
        return [Check(f"GQA decode {dname} {shape}", False, "decode_gqa.cu does not run here "
                      "(switched off, or this GPU lacks the shared memory)")], {}

    def ours(q, k, v, **kw):
        return attention(q, k, v, **kw)

    checks = [Check(f"GQA decode {dname} {shape} vs float64",
                    relative_error(ours(q, k, v, causal=True), truth) <= REL_TOL[dtype])]
    timers = {"ours": graph_per_call_timer(lambda q, k, v: ours(q, k, v, causal=True), sets)}
    for name in SDPA_TIMED:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel(backend):
                def peer(q, k, v):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                err = relative_error(peer(q, k, v), truth)
                if err > REL_TOL[dtype]:
                    print(f"[task5] SDPA {name} at {dname} {shape}: rel_err {err:.1e}, left out")
                    continue
                timers[f"sdpa_{name.lower()}"] = graph_per_call_timer(peer, sets)
        except RuntimeError as err:
            print(f"[task5] SDPA {name} refuses GQA decode: {str(err).splitlines()[0][:100]}")
    variants = _bench_variants(b, ctx, device) if (dname, shape) == ("fp16", GQA_VARIANT_SHAPE) else {}
    for name, (kwargs, _) in variants.items():
        variant = Variant(**kwargs)
        err = relative_error(ours(q, k, v, **kwargs), reference_attention_variant(q, k, v, variant))
        checks.append(Check(f"GQA decode {dname} {shape} {name} vs float64", err <= REL_TOL[dtype]))
        timers[name] = graph_per_call_timer(lambda q, k, v, kw=kwargs: ours(q, k, v, **kw), sets)
    if key == GQA_CASE:   # the paths before decode_gqa.cu, for A/B
        with _setting("GQA_DECODE_KERNEL", False):
            timers["prefill_rows"] = graph_per_call_timer(
                lambda q, k, v: decode_attention_grouped(q, k, v), sets)
        with _setting("TENSOR_CORE_DECODE", False):
            timers["cuda_core"] = graph_per_call_timer(
                lambda q, k, v: decode_attention_grouped(q, k, v), sets)
    times = interleaved_medians(timers, rounds=GQA_ROUNDS)

    ours_ms = times.pop("ours")
    gbps = kv_bytes / (ours_ms * 1e-3) / 1e9
    metrics = {f"{key}.us": ours_ms * 1e3, f"{key}.gbps": gbps, f"{key}.copy_gbps": copy_gbps,
               f"{key}.bw_fraction": gbps / copy_gbps,
               f"{key}.num_splits": attention_module.gqa_num_splits(q, k, True)}
    for name in ("prefill_rows", "cuda_core"):
        if name in times:
            metrics[f"{key}.{name}_us"] = times.pop(name) * 1e3
    for name, (_, fraction) in variants.items():
        ms = times.pop(name)
        metrics[f"{key}.{name}.us"] = ms * 1e3
        ratio = (fraction / ms) / (1.0 / ours_ms)   # bandwidth over the keys read vs plain
        metrics[f"{key}.{name}.ratio_vs_plain"] = ratio
        checks.append(Check(f"GQA decode {dname} {shape} {name}: bandwidth vs plain >= "
                            f"{VARIANT_TARGET}", ratio >= VARIANT_TARGET,
                            f"{ms * 1e3:.1f} us reading {fraction:.2f} of the keys, plain "
                            f"{ours_ms * 1e3:.1f} us: {ratio:.2f}", target=True))
    sdpa = {name.removeprefix("sdpa_"): ms for name, ms in times.items()}
    metrics.update({f"{key}.sdpa_{name}_us": ms * 1e3 for name, ms in sdpa.items()})
    detail = (f"{ours_ms * 1e3:.1f} us, {metrics[f'{key}.num_splits']} splits, {gbps:.0f} GB/s "
              f"of K+V read once = {gbps / copy_gbps:.2f} of the copy bandwidth")
    if shape in GQA_BW_SHAPES:
        checks.append(Check(f"GQA decode {dname} {shape}: bw_fraction >= {BW_TARGET}",
                            gbps / copy_gbps >= BW_TARGET, detail, target=True))
    if sdpa:
        best = min(sdpa, key=sdpa.get)
        ratio = sdpa[best] / ours_ms
        metrics[f"{key}.ratio_vs_sdpa_best"] = ratio
        metrics[f"{key}.sdpa_best_us"] = sdpa[best] * 1e3
        checks.append(Check(f"GQA decode {dname} {shape}: best SDPA / ours >= {SDPA_TARGET}",
                            ratio >= SDPA_TARGET, f"best SDPA ({best}, enable_gqa) "
                            f"{sdpa[best] * 1e3:.1f} us, ours {ours_ms * 1e3:.1f} us: {ratio:.2f}",
                            target=True))
    else:
        checks.append(Check(f"GQA decode {dname} {shape} timing", True, detail))
    return checks, metrics


def gqa_bench_group(args=None):
    device, gen, failed = gpu_group("gqa-bench", args)
    if failed:
        return failed, {}
    copy_gbps = measure_copy_bandwidth()
    print(f"[task5] gqa-bench: device copy bandwidth {copy_gbps:.0f} GB/s (read + write)")
    checks, metrics = [], {}
    for shape in GQA_BENCH_SHAPES:
        for dname in MMA_DTYPES:
            found, figures = _bench_shape(dname, shape, copy_gbps, gen, device)
            checks += found
            metrics.update(figures)
            torch.cuda.empty_cache()
    return checks, metrics


GROUPS = {"gqa-small": gqa_small_group, "gqa": gqa_group, "gqa-mma": gqa_mma_group,
          "gqa-bench": gqa_bench_group}
