"""One benchmark for every implementation we have, against PyTorch's SDPA backends.

    python -m common.tools.bench               # the whole sweep (about a minute on a warm H100)
    python -m common.tools.bench --quick       # a few points of each sweep (a smoke test)

Prefill: FlashAttention's own benchmark protocol: the total number of tokens B*S fixed at
16k, S from 512 to 16384, hidden 2048 (so H = 2048 / head_dim), head_dim 64 and 128, fp32 /
fp16 / bf16, causal and not; plus the course shapes. Implementations: task 2 (naive CUDA,
fp32, materialises S x S), task 4's fp32 course kernel, task 4's fp16/bf16 mma.sync kernel,
on an H100/H200 the Hopper kernel (what task4.attention.flash_attention runs there), and
SDPA pinned to each backend (FLASH, EFFICIENT, CUDNN, MATH where its S x S matrix fits).
Decode: one query against a KV cache, context 512 .. 64k and batch 1 .. 32, fp16, task 5's
kernel against SDPA. Each point is timed with CUDA events (warm-up, median) in one process,
on the same inputs for every implementation, with peak memory.

Writes results/bench_<gpu>.csv (every point), headline figures into results/<gpu>.json,
and three plots: bench_<gpu>_prefill.png, bench_<gpu>_decode.png, bench_<gpu>_memory.png.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.bench")

import argparse
import csv
import math
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from common.results import RESULTS_DIR, device_key, record
from common.timing import attention_flops, measure_copy_bandwidth, tflops, time_cuda

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOTAL_TOKENS = 16384
HIDDEN = 2048
SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384]
HEAD_DIMS = [64, 128]
COURSE_SHAPES = [(4, 32, 128, 128), (64, 32, 4096, 128)]  # (B, H, S, D), fp32 only
DECODE_CONTEXTS = [512, 2048, 8192, 32768, 65536]
DECODE_BATCHES = [1, 8, 32]
MATH_MAX_SCORE_BYTES = 8 * 2**30        # SDPA MATH materialises B*H*S*S scores (twice)
TASK2_MAX_SEQ = 4096                    # naive: S x S in memory and slow beyond this
TASK2_MAX_SCORE_BYTES = 5 * 2**30       # ... and its S x S fp32 scores must fit
SEQ_AXIS = "sequence length S (B*S = 16k, hidden 2048)"


@dataclass
class Point:
    kind: str             # prefill | decode
    impl: str
    dtype: str
    batch: int
    heads: int
    seq: int              # S for prefill, context length for decode
    head_dim: int
    causal: bool
    ms: float = math.nan
    tflops: float = math.nan
    gbps: float = math.nan
    peak_mem_mb: float = math.nan
    note: str = ""


def _sdpa(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def prefill_impls(dtype: str) -> dict[str, Callable]:
    """name -> fn(q, k, v, causal) on [B, H, S, D] head views of [B, S, H, D] tensors."""
    impls: dict[str, Callable] = {}
    if dtype == "fp32":
        from task2.attention import custom_attention
        from task4.attention import flash_attention

        def task2(q, k, v, causal):
            b, h, s, d = q.shape  # the [B, S, hidden] tensors these views come from
            merged = [t.transpose(1, 2).reshape(b, s, h * d) for t in (q, k, v)]
            return custom_attention(*merged, h, causal)

        impls["task2 naive CUDA"] = task2
        impls["task4 fp32 kernel"] = flash_attention
    else:
        from task4 import hopper
        from task4.attention import flash_attention, hopper_prefill

        def mma_sync(q, k, v, causal):
            with hopper_prefill(False):
                return flash_attention(q, k, v, causal)

        impls["task4 mma.sync kernel"] = mma_sync
        if hopper.available():  # what flash_attention runs on an H100/H200
            impls["task4 Hopper kernel"] = flash_attention
        impls["SDPA flash"] = _sdpa("FLASH_ATTENTION")
        impls["SDPA cudnn"] = _sdpa("CUDNN_ATTENTION")
    impls["SDPA efficient"] = _sdpa("EFFICIENT_ATTENTION")
    impls["SDPA math"] = _sdpa("MATH")
    return impls


def _skip_reason(impl: str, batch: int, heads: int, seq: int, dtype: str) -> str:
    score_bytes = batch * heads * seq * seq * torch.finfo(DTYPES[dtype]).bits // 8
    if impl == "SDPA math" and 2 * score_bytes > MATH_MAX_SCORE_BYTES:
        return "skipped: S x S scores too large"
    if impl.startswith("task2") and (seq > TASK2_MAX_SEQ or score_bytes > TASK2_MAX_SCORE_BYTES):
        return "skipped: naive S x S too slow/large"
    return ""


def measure(fn: Callable, args: tuple, repeats: int) -> tuple[float, float]:
    """(median ms, peak extra memory in MB beyond the inputs) of fn(*args)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn(*args)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    del out
    t = time_cuda(lambda: fn(*args), warmup=2, repeats=repeats, max_seconds=1.0)
    return t.median_ms, peak


def prefill_sweep(quick: bool, repeats: int, progress) -> list[Point]:
    cases = []
    seqs = SEQ_LENS[::2] if quick else SEQ_LENS
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            for s in seqs:
                for causal in (False, True):
                    cases.append((dtype, TOTAL_TOKENS // s, HIDDEN // d, s, d, causal))
    for b, h, s, d in COURSE_SHAPES[: 1 if quick else None]:
        for causal in (False, True):
            cases.append(("fp32", b, h, s, d, causal))
    points = []
    for dtype, b, h, s, d, causal in progress(cases, desc="prefill"):
        gen = torch.Generator(device="cuda").manual_seed(s * 131 + d)
        qkv = [torch.randn(b, s, h, d, device="cuda", generator=gen).to(DTYPES[dtype])
               for _ in range(3)]
        views = tuple(t.transpose(1, 2) for t in qkv)  # [B, H, S, D], last dim contiguous
        for impl, fn in prefill_impls(dtype).items():
            p = Point("prefill", impl, dtype, b, h, s, d, causal)
            p.note = _skip_reason(impl, b, h, s, dtype)
            if not p.note:
                try:
                    p.ms, p.peak_mem_mb = measure(fn, (*views, causal), repeats)
                    p.tflops = tflops(attention_flops(b, h, s, s, d, causal), p.ms)
                except (RuntimeError, ValueError, TypeError) as err:  # a backend refusing
                    p.note = f"unavailable: {str(err).splitlines()[0][:80]}"
                    torch.cuda.empty_cache()
            points.append(p)
        del qkv, views
    return points


def decode_sweep(quick: bool, repeats: int, progress) -> list[Point]:
    from task5.attention import decode_attention_bhsd

    heads, d, dtype = 32, 128, torch.float16
    impls = {"task5 decode kernel": lambda q, k, v: decode_attention_bhsd(q, k, v, k.shape[2])}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        run = _sdpa(name)
        impls[f"SDPA {name.split('_')[0].lower()}"] = lambda q, k, v, run=run: run(q, k, v, False)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    cases = [(b, c) for b in DECODE_BATCHES for c in DECODE_CONTEXTS
             if b * c * heads * d * 2 * 2 <= 8 * 2**30]
    if quick:
        cases = cases[::3]
    points = []
    for b, ctx in progress(cases, desc="decode"):
        kv_bytes = 2 * b * ctx * heads * d * 2
        sets = max(1, math.ceil(4 * l2 / kv_bytes))  # rotate caches so L2 never serves a read
        inputs = []
        for _ in range(sets):
            q = torch.randn(b, heads, 1, d, device="cuda", dtype=dtype)
            cache = torch.randn(2, b, ctx, heads, d, device="cuda", dtype=dtype)  # [B, S, H, D]
            inputs.append((q, cache[0].transpose(1, 2), cache[1].transpose(1, 2)))
        for impl, fn in impls.items():
            p = Point("decode", impl, "fp16", b, heads, ctx, d, False)
            try:
                t = time_cuda(fn, inputs=inputs, warmup=3, repeats=repeats, max_seconds=1.0)
                p.ms = t.median_ms
                p.gbps = kv_bytes / (p.ms * 1e-3) / 1e9
            except (RuntimeError, ValueError, TypeError) as err:
                p.note = f"unavailable: {str(err).splitlines()[0][:80]}"
            points.append(p)
        del inputs
        torch.cuda.empty_cache()
    return points


# --- output ------------------------------------------------------------------------------

def write_csv(points: list[Point], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(points[0])))
        writer.writeheader()
        for p in points:
            writer.writerow(asdict(p))


def _style(impl: str) -> dict:
    ours = impl.startswith("task")
    return {"linewidth": 2.4 if ours else 1.2, "linestyle": "-" if ours else "--", "marker": "o",
            "markersize": 4}


def _finish(ax, title: str, xlabel: str, ylabel: str, log_y: bool = False) -> None:
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _save(fig, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot(points: list[Point], copy_gbps: float, key: str, meta: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    sweep = [p for p in points if p.kind == "prefill" and p.batch * p.seq == TOTAL_TOKENS]
    panels = [(d, c) for d in HEAD_DIMS for c in (False, True)]
    fig, axes = plt.subplots(len(DTYPES), len(panels), figsize=(5 * len(panels), 3.8 * len(DTYPES)),
                             squeeze=False)
    for row, dtype in enumerate(DTYPES):
        for col, (d, causal) in enumerate(panels):
            ax = axes[row][col]
            cell = [p for p in sweep if p.dtype == dtype and p.head_dim == d and p.causal == causal]
            for impl in dict.fromkeys(p.impl for p in cell):
                xs = [p.seq for p in cell if p.impl == impl and not math.isnan(p.tflops)]
                ys = [p.tflops for p in cell if p.impl == impl and not math.isnan(p.tflops)]
                if xs:
                    ax.plot(xs, ys, label=impl, **_style(impl))
            _finish(ax, f"{dtype}, head_dim {d}, {'causal' if causal else 'non-causal'}",
                    SEQ_AXIS, "TFLOP/s")
    paths.append(_save(fig, f"Attention forward throughput: {meta}",
                       RESULTS_DIR / f"bench_{key}_prefill.png"))

    decode = [p for p in points if p.kind == "decode"]
    if decode:
        batches = sorted({p.batch for p in decode})
        fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
        for ax, b in zip(axes[0], batches, strict=True):
            cell = [p for p in decode if p.batch == b]
            for impl in dict.fromkeys(p.impl for p in cell):
                pts = [p for p in cell if p.impl == impl and not math.isnan(p.gbps)]
                if pts:
                    ax.plot([p.seq for p in pts], [p.gbps for p in pts], label=impl, **_style(impl))
            ax.axhline(copy_gbps, color="black", linewidth=1, label=f"copy bandwidth {copy_gbps:.0f} GB/s")
            _finish(ax, f"decode, fp16, batch {b}, 32 heads, head_dim 128",
                    "context length (cached tokens)", "KV read bandwidth (GB/s)")
        paths.append(_save(fig, f"Decode attention: {meta}", RESULTS_DIR / f"bench_{key}_decode.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, dtype in zip(axes[0], ("fp32", "fp16"), strict=True):
        cell = [p for p in sweep if p.dtype == dtype and p.head_dim == 128 and not p.causal]
        for impl in dict.fromkeys(p.impl for p in cell):
            pts = [p for p in cell if p.impl == impl and not math.isnan(p.peak_mem_mb)]
            if pts:
                ax.plot([p.seq for p in pts], [p.peak_mem_mb for p in pts], label=impl, **_style(impl))
        _finish(ax, f"{dtype}, head_dim 128, non-causal", SEQ_AXIS,
                "peak memory beyond the inputs (MiB)", log_y=True)
    paths.append(_save(fig, f"Attention forward memory: {meta}", RESULTS_DIR / f"bench_{key}_memory.png"))
    return paths


def headline(points: list[Point]) -> dict[str, float]:
    """A few figures for results/<gpu>.json: best TFLOP/s of each implementation per dtype."""
    metrics = {}
    for p in points:
        if p.kind != "prefill" or math.isnan(p.tflops):
            continue
        impl = re.sub(r"[^A-Za-z0-9]+", "_", p.impl)   # one dot-free word: "task4_mma_sync_kernel"
        name = f"bench.prefill.{p.dtype}.d{p.head_dim}.{'causal' if p.causal else 'noncausal'}." \
               f"{impl}.max_tflops"
        metrics[name] = max(metrics.get(name, 0.0), p.tflops)
    return metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few points of each sweep")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-decode", action="store_true")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("[bench] needs an NVIDIA GPU with CUDA; none is visible to torch here.")
        return 1
    from tqdm import tqdm

    from common.build import BuildError
    from common.results import run_meta

    key = device_key()
    meta = run_meta()
    label = f"{meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}, {meta['date']}"
    try:
        copy_gbps = measure_copy_bandwidth()
        points = prefill_sweep(args.quick, args.repeats, tqdm)
        if not args.no_decode:
            points += decode_sweep(args.quick, args.repeats, tqdm)
    except BuildError as err:
        print(f"[bench] {err}")
        return 1
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    csv_path = RESULTS_DIR / f"bench_{key}.csv"
    write_csv(points, csv_path)
    plots = plot(points, copy_gbps, key, label)
    if not args.no_record:
        record({**headline(points), "bench.copy_gbps": copy_gbps})
    print(f"[bench] {len(points)} points -> {csv_path}; plots: {', '.join(p.name for p in plots)}")
    ours = [p for p in points if p.kind == "prefill" and p.seq == 4096 and p.head_dim == 128
            and p.batch * p.seq == TOTAL_TOKENS]
    print(f"\n{'impl':<26}{'dtype':<6}{'mask':<10}{'TFLOP/s':>9}{'peak MiB':>10}")
    for p in ours:
        print(f"{p.impl:<26}{p.dtype:<6}{'causal' if p.causal else 'full':<10}"
              f"{p.tflops:>9.1f}{p.peak_mem_mb:>10.0f}  {p.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
