"""The paged KV cache (task5/decode_paged.cu, rope_append_paged, ops.PageAllocator): checks.

The decode through a block table is decode_gqa.cu's kernel with another K/V address policy,
so it is checked as that kernel is (task5/variants_checks.py), against float64 by
FlashAttention-2's criterion: the pages gathered into a contiguous cache
(task5.ops.gather_pages) and common.variants' reference. Groups of `python -m task5.test`:

  paged-small  a few tiny cases (compute-sanitizer), one per page size, with softcap, sinks
               and scale, an empty sequence and a window, fp16
  paged-bench  the issue's shape (B 8, H_q 32 / H_kv 8, ctx 8192, D 128, fp16): the paged
               decode (pages shuffled) against decode_gqa.cu on the contiguous cache, timed as
               CUDA-graph replays in interleaved rounds with the caches rotated beyond L2, at
               page sizes 16, 64 and 256: time contiguous / time paged (targets: >= 0.9 at 16,
               >= 0.95 at 64 and 256)
  paged        fp16 and bf16; page sizes 16, 32, 64, 128, 256; GQA ratios 1, 4, 8 and MQA;
               head dims 64, 96, 128, 256; S_q 1 and up to 16 (bottom-right causal); every
               variant (window, stride, bool/additive masks, softcap, sinks, scale), empty
               sequences, logits in the hundreds; split counts auto / 1 / 5. Pages are handed
               out in a shuffled order (no sequence's pages are adjacent), every page and row
               no query may see is NaN (pages no sequence holds, table entries past a
               sequence's pages, rows past its length, rows before a window), so a kernel that
               reads one fails. Also: equal, bit for bit, to decode_gqa.cu on the gathered
               contiguous cache; a captured CUDA graph replayed while pages are added and the
               lengths grow; rope_append_paged against rope_append into a contiguous cache
               (equal); routing through the allocator; bad input raises a sentence
"""

from __future__ import annotations

import math

import torch

from common.checks import Check, check_raises
from common.graphs import capture_graph
from common.harness import gpu_group
from common.variants import Variant, check_variant, reference_attention_variant
from task5 import attention as attention_module
from task5.attention import paged_decode_attention
from task5.manifest import PAGED_TARGETS
from task5.ops import PageAllocator, gather_pages, scatter_to_pages

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LARGE = 10.0
SPLITS = (None, 1, 5)

# (B, H_q, H_kv, S_q, longest sequence, D, page_size, pattern, options). Patterns: causal,
# full, window, stride, mask-bool, mask-float; options: softcap, sinks, scale, large (logits
# in the hundreds), empty (the last sequence holds no key).
PAGED_SWEEP = [
    # GQA ratios 1, 4, 8 and MQA; every page size; every head dim
    (3, 8, 8, 1, 1000, 128, 16, "causal", ""), (3, 32, 8, 1, 1000, 128, 16, "causal", ""),
    (2, 32, 4, 1, 3000, 128, 32, "causal", ""), (2, 8, 1, 1, 777, 64, 64, "causal", ""),
    (3, 16, 4, 1, 1500, 64, 16, "causal", ""), (2, 8, 2, 1, 600, 96, 128, "causal", ""),
    (2, 16, 2, 1, 900, 256, 256, "causal", ""), (2, 8, 2, 1, 5000, 128, 256, "full", ""),
    # several query rows per sequence (a prefill chunk, speculative decoding)
    (2, 8, 2, 4, 1023, 128, 64, "causal", ""), (2, 8, 8, 16, 500, 128, 16, "causal", ""),
    (2, 4, 1, 16, 300, 256, 32, "causal", ""), (2, 8, 2, 7, 400, 96, 64, "full", ""),
    # every variant; a window's first tile starts mid-page
    (3, 16, 2, 1, 2000, 128, 16, "window", ""), (2, 8, 2, 3, 2000, 64, 32, "window", ""),
    (2, 8, 4, 1, 700, 128, 64, "stride", ""), (2, 8, 2, 2, 500, 128, 128, "mask-bool", ""),
    (2, 8, 4, 1, 500, 96, 16, "mask-float", ""),
    (3, 8, 2, 1, 1500, 128, 256, "causal", "softcap"), (3, 8, 2, 4, 1500, 128, 16, "causal", "sinks"),
    (3, 8, 2, 1, 700, 64, 32, "causal", "scale"),
    (4, 8, 2, 2, 999, 128, 64, "window", "softcap sinks scale empty"),
    (2, 16, 4, 1, 1023, 128, 16, "causal", "large"), (4, 8, 2, 1, 1023, 256, 128, "full", "empty"),
]
PAGED_SMALL = [
    (2, 4, 2, 1, 37, 64, 16, "causal", "softcap sinks scale"),
    (3, 8, 2, 3, 70, 128, 32, "window", "empty"), (2, 4, 1, 1, 100, 128, 64, "causal", ""),
    (2, 4, 4, 2, 130, 64, 128, "causal", ""), (1, 8, 2, 1, 300, 128, 256, "causal", ""),
]


class PagedCase:
    """A random paged cache and its contiguous twin: the logical K/V [B, H_kv, capacity, D]
    (clean, for the reference), the pages holding them in a shuffled order with NaN wherever
    no query may read, the block table (entries past a sequence's pages name a NaN page) and
    the lengths."""

    def __init__(self, b, hq, hkv, sq, longest, d, page_size, pattern, options, dtype, gen,
                 device, seed):
        scale = LARGE if "large" in options else 1.0

        def randn(*shape):
            return (torch.randn(*shape, device=device, generator=gen) * scale).to(dtype)

        max_pages = math.ceil(longest / page_size) + 1           # a table longer than needed
        capacity = max_pages * page_size
        lengths = torch.randint(1, longest + 1, (b,), device=device, generator=gen,
                                dtype=torch.int32)
        lengths[0] = longest
        if "empty" in options and b > 1:
            lengths[-1] = 0
        self.q = randn(b, hq, sq, d)
        self.k, self.v = randn(b, hkv, capacity, d), randn(b, hkv, capacity, d)
        mask = None
        if pattern == "mask-bool":
            mask = torch.rand(b, hq, sq, capacity, device=device, generator=gen) < 0.6
            mask[0, 0, 0] = False                                # a row that sees nothing
        elif pattern == "mask-float":
            mask = (torch.randn(b, 1, sq, capacity, device=device, generator=gen) * 2).to(dtype)
        self.variant = Variant(
            causal=pattern != "full", window=max(1, longest // 3) if pattern == "window" else None,
            stride=3 if pattern == "stride" else 1, mask=mask, key_lengths=lengths,
            softcap=30.0 if "softcap" in options else None,
            sinks=torch.randn(hq, device=device, generator=gen) * 2 if "sinks" in options else None,
            scale=0.3 if "scale" in options else None)

        spare = 3                                                # pages nobody holds: NaN
        needed = sum(math.ceil(int(n) / page_size) for n in lengths.tolist())
        self.allocator = PageAllocator(needed + spare, page_size, b, max_pages, device=device,
                                       shuffle=seed)
        self.allocator.append_many({seq: int(n) for seq, n in enumerate(lengths.tolist())})
        nan = float("nan")
        self.k_pages = torch.full((needed + spare, page_size, hkv, d), nan, dtype=dtype,
                                  device=device)
        self.v_pages = torch.full_like(self.k_pages, nan)
        k_poisoned, v_poisoned = self._poison_unread(sq)
        scatter_to_pages(k_poisoned, self.k_pages, self.allocator.block_table)
        scatter_to_pages(v_poisoned, self.v_pages, self.allocator.block_table)
        # Table entries past each sequence's pages name a page of NaN (a kernel must stop at the
        # length, not at the first entry that is not a page).
        held = {page for seq in range(b) for page in self.allocator.pages(seq)}
        nan_page = min(set(range(needed + spare)) - held)
        self.block_table = self.allocator.block_table.clone()
        self.block_table[self.block_table < 0] = nan_page
        self.lengths = lengths

    def _poison_unread(self, sq):
        """Copies of k, v with NaN at keys no query of the sequence sees: at or past its length,
        before the window of its first query."""
        batch, _, capacity, _ = self.k.shape
        cols = torch.arange(capacity, device=self.k.device).view(1, capacity)
        end = self.variant.key_lengths.long().view(batch, 1)
        unread = cols >= end
        if self.variant.window:
            unread |= cols <= end - sq - self.variant.window
        unread = unread.view(batch, 1, capacity, 1).expand_as(self.k)
        return self.k.masked_fill(unread, float("nan")), self.v.masked_fill(unread, float("nan"))

    def run(self, out, num_splits=None, block_table=None):
        v = self.variant
        return paged_decode_attention(
            self.q, self.k_pages, self.v_pages,
            self.block_table if block_table is None else block_table, self.lengths,
            causal=v.causal, window=v.window, stride=v.stride, mask=v.mask, softcap=v.softcap,
            sinks=v.sinks, scale=v.scale, out=out, num_splits=num_splits)


def _sweep(cases, gen, device, splits=SPLITS, dtypes=("fp16", "bf16")) -> list[Check]:
    checks = []
    for index, (b, hq, hkv, sq, longest, d, page, pattern, options) in enumerate(cases):
        for dname in dtypes:
            case = PagedCase(b, hq, hkv, sq, longest, d, page, pattern, options, DTYPES[dname],
                             gen, device, seed=index)
            for num_splits in splits:
                name = (f"{dname} paged B{b} Hq{hq}/Hkv{hkv} Sq{sq} longest {longest} D{d} "
                        f"page {page}: {case.variant.describe()}"
                        f"{f' ({options})' if options else ''}, splits {num_splits or 'auto'}")
                checks.append(check_variant(
                    name, lambda out, case=case, n=num_splits: case.run(out, n),
                    case.q, case.k, case.v, case.variant))
    return checks


def _same_as_contiguous(gen, device) -> list[Check]:
    """The paged decode and decode_gqa.cu on the gathered contiguous cache run the same kernel
    body on the same tiles: equal bit for bit (same split count)."""
    checks = []
    for b, hq, hkv, sq, longest, d, page, pattern, options in (
            (3, 16, 4, 1, 1500, 128, 16, "causal", ""), (2, 8, 2, 3, 900, 64, 64, "window", "sinks"),
            (2, 8, 2, 1, 700, 256, 256, "causal", "softcap")):
        case = PagedCase(b, hq, hkv, sq, longest, d, page, pattern, options, torch.float16, gen,
                         device, seed=b + d)
        k = gather_pages(case.k_pages, case.allocator.block_table, case.lengths)
        v = gather_pages(case.v_pages, case.allocator.block_table, case.lengths)
        var = case.variant
        for num_splits in (1, 5):
            paged = case.run(None, num_splits)
            contiguous = attention_module._decode_gqa(
                case.q, k, v, var.causal, var.window, var.stride, var.mask, var.key_lengths,
                False, None, num_splits, var.softcap, var.sinks, var.scale)
            checks.append(Check(f"paged decode D{d} page {page} {var.describe()}, splits "
                                f"{num_splits}: equal to decode_gqa on the gathered cache",
                                bool(torch.equal(paged, contiguous))))
    return checks


def _graph_checks(gen, device) -> list[Check]:
    """A decode captured once, replayed while tokens are appended: the allocator adds pages to
    the same block_table and raises seq_lens in place; each replay equals an eager call."""
    b, hq, hkv, d, page = 3, 16, 4, 128, 16
    dtype = torch.float16
    max_pages = 40
    alloc = PageAllocator(b * max_pages, page, b, max_pages, device=device, shuffle=7)
    k_pages = torch.randn(b * max_pages, page, hkv, d, device=device, generator=gen).to(dtype)
    v_pages = torch.randn_like(k_pages)
    q = torch.randn(b, hq, 1, d, device=device, generator=gen).to(dtype)
    alloc.append_many({0: 5, 1: 16, 2: 100})
    out = torch.empty_like(q)
    graph, _ = capture_graph(lambda: paged_decode_attention(
        q, k_pages, v_pages, alloc.block_table, alloc.seq_lens, out=out, validate=False))
    same, accurate = True, True
    for grow in ({0: 1, 1: 1, 2: 1}, {0: 40, 1: 17, 2: 300}, {0: 200, 1: 0, 2: 200}):
        alloc.append_many(grow)
        graph.replay()
        eager = paged_decode_attention(q, k_pages, v_pages, alloc.block_table, alloc.seq_lens)
        same = same and bool(torch.equal(out, eager))
        truth = reference_attention_variant(
            q, gather_pages(k_pages, alloc.block_table, alloc.seq_lens),
            gather_pages(v_pages, alloc.block_table, alloc.seq_lens),
            Variant(causal=True, key_lengths=alloc.seq_lens))
        accurate = accurate and bool((out.double() - truth).abs().max() < 1e-2)
    return [Check("paged decode in a CUDA graph: replays as pages are added and lengths grow "
                  "equal eager calls", same and accurate,
                  "" if same else "a replay differs from the eager call")]


def _rope_tables(length, d, device):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().contiguous(), angles.sin().contiguous()


def _append_checks(gen, device) -> list[Check]:
    """rope_append_paged writes what rope_append writes into a contiguous cache (equal), at
    each sequence's own position, pages in a shuffled order; q rotated alike."""
    from task5.fused import rope_append, rope_append_paged

    checks = []
    b, hq, hkv, d, page, max_pages = 3, 8, 2, 128, 16, 12
    capacity = max_pages * page
    cos, sin = _rope_tables(capacity, d, device)
    for dname in ("fp32", "fp16", "bf16"):
        dtype = DTYPES[dname]
        for seq in (1, 5):
            alloc = PageAllocator(b * max_pages, page, b, max_pages, device=device, shuffle=seq)
            alloc.append_many({0: 0, 1: 15, 2: 100})             # lengths before the append
            k_pages = torch.zeros(b * max_pages, page, hkv, d, dtype=dtype, device=device)
            v_pages = torch.zeros_like(k_pages)
            k_cache = torch.zeros(b, capacity, hkv * d, dtype=dtype, device=device)
            v_cache = torch.zeros_like(k_cache)
            q, k, v = (torch.randn(b, seq, heads, d, device=device, generator=gen).to(dtype)
                       for heads in (hq, hkv, hkv))
            positions = alloc.seq_lens.clone()
            starts = alloc.append_many({i: seq for i in range(b)})
            rotated_paged = rope_append_paged(q, k, v, k_pages, v_pages, alloc.block_table, cos,
                                              sin, positions)
            rotated = rope_append(q, k, v, k_cache, v_cache, cos, sin, positions)
            ok = bool(torch.equal(rotated_paged, rotated))
            for pages, cache in ((k_pages, k_cache), (v_pages, v_cache)):
                gathered = gather_pages(pages, alloc.block_table, alloc.seq_lens)
                ok = ok and bool(torch.equal(gathered, cache.view(b, capacity, hkv, d)
                                             .transpose(1, 2)))
            checks.append(Check(f"rope_append_paged {dname}, {seq} new token(s) at positions "
                                f"{sorted(starts.values())}: equal to rope_append", ok))
    return checks


def _input_checks(gen, device) -> list[Check]:
    strict = (ValueError, TypeError)
    case = PagedCase(2, 8, 2, 1, 100, 64, 16, "causal", "", torch.float16, gen, device, seed=1)
    q, kp, vp, table, lengths = case.q, case.k_pages, case.v_pages, case.block_table, case.lengths

    def decode(q=q, kp=kp, vp=vp, table=table, lengths=lengths, **kw):
        return paged_decode_attention(q, kp, vp, table, lengths, **kw)

    def raises(name, fn, mention):
        return check_raises(f"paged input: {name}", fn, exc_types=strict, must_mention=mention)

    short = table[:, :2].contiguous()                            # 32 keys, lengths up to 100
    bad_entry = table.clone()
    bad_entry[0, 0] = kp.shape[0] + 5
    ext = attention_module._ext()
    return [
        raises("page size 8", lambda: decode(kp=kp[:, :8].contiguous(), vp=vp[:, :8].contiguous()),
               "page_size"),
        raises("page size 48", lambda: decode(kp=kp.repeat(1, 3, 1, 1)[:, :48].contiguous(),
                                              vp=vp.repeat(1, 3, 1, 1)[:, :48].contiguous()),
               "page_size"),
        raises("pages of another dtype", lambda: decode(kp=kp.bfloat16(), vp=vp.bfloat16()), "dtype"),
        raises("block_table int64", lambda: decode(table=table.long()), "int32"),
        raises("seq_lens int64", lambda: decode(lengths=lengths.long()), "int32"),
        raises("block_table too short for seq_lens", lambda: decode(table=short), "too short"),
        raises("a used table entry that is not a page", lambda: decode(table=bad_entry), "not a page"),
        raises("seq_lens of the wrong shape", lambda: decode(lengths=lengths[:1]), "shape"),
        raises("17 query rows", lambda: decode(q=q.expand(2, 8, 17, 64).contiguous()), "query rows"),
        raises("head_dim mismatch", lambda: decode(q=q[..., :32].contiguous()), "head_dim"),
        raises("pages on the CPU", lambda: decode(kp=kp.cpu(), vp=vp.cpu()), "device"),
        raises("float32", lambda: decode(q=q.float(), kp=kp.float(), vp=vp.float()), "dtype"),
        # the extension's own checks, past the Python ones
        raises("extension: page size 48", lambda: ext.decode_attention_paged(
            q, kp.repeat(1, 3, 1, 1)[:, :48].contiguous(), vp.repeat(1, 3, 1, 1)[:, :48].contiguous(),
            table, lengths), "page_size"),
        raises("extension: block_table int64", lambda: ext.decode_attention_paged(
            q, kp, vp, table.long(), lengths), "int32"),
    ]


def paged_small_group(args=None):
    device, gen, failed = gpu_group("paged-small", args)
    if failed:
        return failed, {}
    return _sweep(PAGED_SMALL, gen, device, splits=(1, 3), dtypes=("fp16",)), {}


def paged_group(args=None):
    device, gen, failed = gpu_group("paged", args)
    if failed:
        return failed, {}
    checks = _sweep(PAGED_SWEEP, gen, device)
    checks += _same_as_contiguous(gen, device)
    checks += _graph_checks(gen, device)
    checks += _append_checks(gen, device)
    checks += _input_checks(gen, device)
    return checks, {}


# ---- the benchmark ---------------------------------------------------------------------------

BENCH_SHAPE = (8, 32, 8, 8192, 128)          # B, H_q, H_kv, ctx, D
BENCH_ROUNDS = 5
ROTATE_BYTES = 256 * 2**20                   # caches together far bigger than the 50 MB L2


def paged_metric(page_size: int) -> str:
    b, hq, hkv, ctx, d = BENCH_SHAPE
    return f"task5.paged.fp16.b{b}_hq{hq}_hkv{hkv}_ctx{ctx}_d{d}.page{page_size}.ratio_vs_contiguous"


def paged_bench_group(args=None):
    from common.graphs import graph_per_call_timer
    from common.timing import interleaved_medians

    device, gen, failed = gpu_group("paged-bench", args)
    if failed:
        return failed, {}
    b, hq, hkv, ctx, d = BENCH_SHAPE
    dtype = torch.float16
    kv_bytes = 2 * b * hkv * ctx * d * 2
    copies = max(2, math.ceil(ROTATE_BYTES / kv_bytes))
    lengths = torch.full((b,), ctx, dtype=torch.int32, device=device)
    contiguous_sets, paged_sets = [], {page: [] for page in PAGED_TARGETS}
    for _ in range(copies):
        q = torch.randn(b, hq, 1, d, device=device, generator=gen).to(dtype)
        k, v = (torch.randn(b, hkv, ctx, d, device=device, generator=gen).to(dtype) for _ in "kv")
        contiguous_sets.append((q, k, v))
        for page in PAGED_TARGETS:
            alloc = PageAllocator(b * ctx // page, page, b, ctx // page, device=device, shuffle=page)
            alloc.append_many({seq: ctx for seq in range(b)})
            k_pages = torch.empty(b * ctx // page, page, hkv, d, dtype=dtype, device=device)
            v_pages = torch.empty_like(k_pages)
            scatter_to_pages(k, k_pages, alloc.block_table)
            scatter_to_pages(v, v_pages, alloc.block_table)
            paged_sets[page].append((q, k_pages, v_pages, alloc.block_table, lengths))
    checks = []
    q, k, v = contiguous_sets[0]
    truth = reference_attention_variant(q, k, v, Variant(causal=True))
    for page, sets in paged_sets.items():
        err = (paged_decode_attention(*sets[0]).double() - truth).abs().max().item()
        checks.append(Check(f"paged bench fp16 page {page} vs float64", err < 1e-2,
                            f"max err {err:.1e}"))

    def contiguous(q, k, v):
        return attention_module._decode_gqa(q, k, v, True, None, 1, None, None, False, None,
                                            None, None, None, None)

    def paged(q, k_pages, v_pages, table, lens):
        return paged_decode_attention(q, k_pages, v_pages, table, lens, validate=False)

    timers = {"contiguous": graph_per_call_timer(contiguous, contiguous_sets)}
    for page, sets in paged_sets.items():
        timers[f"page{page}"] = graph_per_call_timer(paged, sets)
    times = interleaved_medians(timers, rounds=BENCH_ROUNDS)
    metrics = {"task5.paged.fp16.contiguous_us": times["contiguous"] * 1e3}
    for page, target in PAGED_TARGETS.items():
        ratio = times["contiguous"] / times[f"page{page}"]
        metrics[paged_metric(page)] = ratio
        metrics[paged_metric(page).replace("ratio_vs_contiguous", "us")] = times[f"page{page}"] * 1e3
        checks.append(Check(f"paged decode fp16 B{b} {hq}/{hkv} ctx {ctx} page {page}: contiguous "
                            f"time / paged time >= {target}", ratio >= target,
                            f"paged {times[f'page{page}'] * 1e3:.1f} us, contiguous "
                            f"{times['contiguous'] * 1e3:.1f} us: {ratio:.2f}", target=True))
    return checks, metrics


GROUPS = {"paged-small": paged_small_group, "paged": paged_group,
          "paged-bench": paged_bench_group}
