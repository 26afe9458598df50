"""Checks and benchmark of the fp16/bf16 tensor-core kernel (task4/flash_attention_mma.cu).

The group functions, each `fn(args=None) -> (checks, metrics)`, are run by
`python -m task4.test` (its small, mma and mma-bench groups), by `python -m task4.bench`,
by pytest (tests/test_task4_mma.py), and by this module on its own:

    python -m task4.mma_checks                  # every group below
    python -m task4.mma_checks --small          # what compute-sanitizer runs
    python -m task4.mma_checks --benchmark      # or --correctness, --inputs

  mma_small        tiny shapes (S 1, 17, 130; head_dim 64, 128), both dtypes and masks, every
                   tile config; correctness only, a few seconds
  mma_correctness  against float64: S 1, 77, 1000, 4097 x head_dim 32, 64, 80, 96, 128, 136,
                   160, 192, 200, 256 x both masks x fp16/bf16, every tile config, strided head views of a fused qkv
                   projection written into a strided out, batch * heads > 65535; plus the
                   bad-input checks of mma_inputs
  mma_inputs       bad input raises ValueError / TypeError with a sentence that says what to do
  mma_benchmark    ours vs SDPA pinned to FLASH (FlashAttention-2) and to cuDNN, same inputs,
                   same run, medians of CUDA events, at (4,32,4096,128) and (8,32,2048,64)

Every output is NaN-poisoned before the kernel runs (an element it forgets to write shows
up), each case runs twice and must match bit for bit (a difference is a race), and inputs
are fresh N(0, 1) numbers each run (--seed reproduces). The extension is called directly.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task4.mma_checks")

import argparse
import os
import sys

import torch

from common.checks import (
    REL_TOL,
    Check,
    check_raises,
    check_relative,
    poisoned_empty,
    random_qkv,
    reference_attention,
    relative_error,
)
from common.harness import config_list, env_setting, fresh_generator, pick_device, task_main
from common.timing import attention_flops, tflops, time_cuda
from task4.manifest import mma_prefix

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CONFIG_ENV = "ATTN_MMA_CONFIG"
# The tile configurations ATTN_MMA_CONFIG selects, for printing only: they mirror the
# ConfigD* lines of flash_attention_mma.cuh (keep the two in step). Head dims 32, 96, 192 and
# 256 have only config 0; other head dims run on the next larger one (80 -> 96, 40 -> 64,
# 136 -> 192, 200 -> 256, ...).
CONFIGS = {
    128: {0: "128x64, 4 warps x 32 rows, Q re-read from smem (FlashAttention-2's tile)",
          1: "128x64, 8 warps x 16 rows, Q in registers",
          2: "64x64, 4 warps x 16 rows, Q in registers, 3 CTAs per SM"},
    64: {0: "128x128, 4 warps x 32 rows, Q re-read from smem (FlashAttention-2's tile)",
         1: "128x64, 4 warps x 32 rows, Q in registers",
         2: "128x128, 8 warps x 16 rows, Q in registers"},
}
ALL_CONFIGS = (0, 1, 2)
KERNEL_DIMS = (32, 64, 96, 128, 192, 256)  # the head dims flash_attention_mma.cu instantiates

# The benchmark: (B, H, S, D), and the acceptance bar against SDPA's FLASH backend.
BENCH_SHAPES = ((4, 32, 4096, 128), (8, 32, 2048, 64))
ACCEPT_RATIO_VS_FLASH = 0.9
BENCH_TIMING = dict(warmup=5, repeats=30, max_seconds=1.5)

# Correctness cases (B, H) x S x D; S >= LARGE_SEQ compares two heads only (float64 cost).
CORRECTNESS_SEQS = (1, 77, 1000, 4097)
CORRECTNESS_DIMS = (64, 128, 32, 96, 80, 136, 160, 192, 200, 256)
CORRECTNESS_BH = (2, 3)
LARGE_SEQ = 1000
LARGE_BH_CASE = (2, 32769, 5, 64)  # batch * heads = 65538 > 65535: grid.z splits it
SMALL_SEQS = (1, 17, 130)
SMALL_DIMS = (64, 128)


def _mask(causal: bool) -> str:
    return "causal" if causal else "noncausal"


def _ext():
    from task4.compile import load

    return load()


def shape_label(b: int, h: int, s: int, d: int) -> str:
    """'b4_h32_s4096_d128': the key of a benchmark shape in the metric names."""
    return f"b{b}_h{h}_s{s}_d{d}"


def metric_prefix(dtype: str, shape: tuple[int, int, int, int], causal: bool) -> str:
    return mma_prefix(dtype, shape_label(*shape), _mask(causal))


parse_configs = config_list(ALL_CONFIGS)  # '0,1,2' -> [0, 1, 2], an argparse type


def parse_dtypes(text: str) -> list[str]:
    """'fp16,bf16' -> ['fp16', 'bf16'] (an argparse type)."""
    dtypes = [part.strip() for part in text.split(",") if part.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise argparse.ArgumentTypeError(f"--dtype: {bad or text!r} not among {list(DTYPES)}")
    return dtypes


def mma_config(config: int | None):
    """Run the kernel with tile config `config` (None: leave ATTN_MMA_CONFIG as it is)."""
    return env_setting(CONFIG_ENV, None if config is None else str(config))


def config_label(config: int | None, head_dim: int) -> str:
    if config is None:
        return f"config {os.environ.get(CONFIG_ENV) or 'default'}"
    kernel_dim = next(d for d in KERNEL_DIMS if head_dim <= d)
    if config not in CONFIGS.get(kernel_dim, {0: ""}):
        return f"config {config} (= 0 for head_dim {head_dim})"
    return f"config {config}"


def _configs_for(head_dim: int) -> tuple[int, ...]:
    """The tile configs worth testing for head_dim (32 and 96 have only config 0)."""
    kernel_dim = next(d for d in KERNEL_DIMS if head_dim <= d)
    return tuple(CONFIGS[kernel_dim]) if kernel_dim in CONFIGS else (0,)


def _gpu_only(group: str, device) -> list[Check] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return [Check(group, False, "needs a CUDA GPU (the tensor-core kernel runs only there)")]
    return None


def check_kernel(name: str, ext, q, k, v, causal: bool, ref, make_out, heads=None,
                 dtype=None) -> list[Check]:
    """Run the kernel twice into fresh NaN-poisoned outputs; compare with `ref`, and run 1
    with run 2 bit for bit. `heads`: compare only these (batch, head) pairs with `ref`
    (which then holds one [S, D] reference per pair)."""
    dtype = dtype or q.dtype
    outs = []
    for _ in range(2):
        out = make_out()
        try:
            result = ext.flash_attention_mma(q, k, v, causal, out)
        except RuntimeError as err:  # the student skeleton's "not implemented"
            return [Check(name, False, f"raised {type(err).__name__}: {str(err).splitlines()[0]}")]
        if result.data_ptr() != out.data_ptr():
            return [Check(name, False, "did not return the `out` it was given")]
        outs.append(out)
    checks = []
    if heads is None:
        checks.append(check_relative(f"{name} vs float64", outs[0], ref, dtype))
    else:
        for (i, j), r in zip(heads, ref, strict=True):
            checks.append(check_relative(f"{name} head ({i},{j}) vs float64", outs[0][i, j], r,
                                         dtype))
    same = torch.equal(outs[0], outs[1])
    checks.append(Check(f"{name} repeatable", same,
                        "" if same else "two runs on the same input differ: a race"))
    return checks


def _case(ext, b, h, s, d, dtype, causal, gen, configs, tag="") -> list[Check]:
    """One shape and mask, each config in `configs`; large S compares two heads."""
    device = gen.device
    q, k, v = random_qkv(b, h, s, d, dtype=DTYPES[dtype], device=device, generator=gen)
    if s >= LARGE_SEQ:
        heads = [(0, 0), (b - 1, h - 1)]
        ref = [reference_attention(q[i, j], k[i, j], v[i, j], causal) for i, j in heads]
    else:
        heads, ref = None, reference_attention(q, k, v, causal)
    checks = []
    for config in configs:
        name = (f"mma {dtype} {config_label(config, d)} (B,H,S,D)=({b},{h},{s},{d}) "
                f"{_mask(causal)}{tag}")
        with mma_config(config):
            checks += check_kernel(name, ext, q, k, v, causal, ref,
                                   lambda: poisoned_empty(b, h, s, d, dtype=q.dtype, device=device),
                                   heads=heads)
    return checks


def mma_small(args=None):
    """Tiny shapes, every dtype, mask and tile config, no timing: for compute-sanitizer."""
    device = pick_device(getattr(args, "device", None))
    if (skip := _gpu_only("mma small", device)) is not None:
        return skip, {}
    ext = _ext()
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    print(f"[task4.mma] small: inputs seed {seed}")
    checks: list[Check] = []
    for s in SMALL_SEQS:
        for d in SMALL_DIMS:
            for dtype in DTYPES:
                for causal in (False, True):
                    checks += _case(ext, 1, 2, s, d, dtype, causal, gen, _configs_for(d))
    # The other instantiations once each (head_dim 32, 96, 192, 256; 80 on the 96 tile and
    # 136 on the 192 tile).
    for d in (32, 80, 96, 136, 192, 256):
        checks += _case(ext, 1, 2, 17, d, "bf16", True, gen, (0,))
    return checks, {}


def _strided_cases(ext, gen) -> list[Check]:
    """Head views of a fused [B, S, 3*H*D] projection (row stride 3*H*D, no copies), written
    into the head view of a [B, S, H, D] output (row stride H*D)."""
    device = gen.device
    checks = []
    b, s, h = 2, 77, 3
    for d in (64, 128, 256):
        for dtype in DTYPES:
            qkv = torch.randn(b, s, 3 * h * d, device=device, generator=gen).to(DTYPES[dtype])
            q, k, v = (t.unflatten(-1, (h, d)).transpose(1, 2) for t in qkv.split(h * d, dim=-1))
            for causal in (False, True):
                ref = reference_attention(q, k, v, causal)
                for config in _configs_for(d):
                    with mma_config(config):
                        checks += check_kernel(
                            f"mma {dtype} {config_label(config, d)} strided qkv views and out "
                            f"(B,S,H,D)=({b},{s},{h},{d}) {_mask(causal)}", ext, q, k, v, causal,
                            ref, lambda d=d, dt=q.dtype: poisoned_empty(
                                b, s, h, d, dtype=dt, device=device).transpose(1, 2))
    return checks


def mma_correctness(args=None):
    """Against float64 over odd lengths, every head dim and config; strided; huge B*H."""
    device = pick_device(getattr(args, "device", None))
    if (skip := _gpu_only("mma correctness", device)) is not None:
        return skip, {}
    ext = _ext()
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    print(f"[task4.mma] correctness: inputs seed {seed} (pass --seed {seed} to reproduce)")
    checks: list[Check] = []
    b, h = CORRECTNESS_BH
    for s in CORRECTNESS_SEQS:
        for d in CORRECTNESS_DIMS:
            for dtype in DTYPES:
                for causal in (False, True):
                    # Every config on the shorter lengths, the default on the longest.
                    configs = _configs_for(d) if s < 4000 else (0,)
                    checks += _case(ext, b, h, s, d, dtype, causal, gen, configs)
    for d in (8, 40, 104):  # padding columns on the 32, 64 and 128 tiles
        checks += _case(ext, 1, 2, 77, d, "fp16", True, gen, (0,))
    checks += _strided_cases(ext, gen)
    bl, hl, sl, dl = LARGE_BH_CASE
    for causal in (False, True):
        checks += _case(ext, bl, hl, sl, dl, "fp16", causal, gen, (0,), tag=" (B*H > 65535)")

    # Without `out`: a new contiguous tensor, equal to what the poisoned-out call wrote.
    q, k, v = random_qkv(2, 3, 77, 64, dtype=torch.float16, device=device, generator=gen)
    fresh = ext.flash_attention_mma(q, k, v, True)
    given = ext.flash_attention_mma(q, k, v, True,
                                    poisoned_empty(*q.shape, dtype=q.dtype, device=device))
    checks.append(Check("mma without out: a new contiguous tensor, the same result",
                        fresh.is_contiguous() and fresh.shape == q.shape
                        and torch.equal(fresh, given)))
    input_checks, _ = mma_inputs(args)
    return checks + input_checks, {}


def mma_inputs(args=None):
    """Bad input raises ValueError/TypeError naming what is wrong, and launches nothing."""
    device = pick_device(getattr(args, "device", None))
    if (skip := _gpu_only("mma inputs", device)) is not None:
        return skip, {}
    ext = _ext()
    fn = ext.flash_attention_mma
    half = torch.float16
    q, k, v = random_qkv(1, 2, 16, 64, dtype=half, device=device)
    strict = (ValueError, TypeError)

    def raises(name, call, mention=None):
        return check_raises(f"mma input: {name}", call, exc_types=strict, must_mention=mention)

    def qkv(d, **kw):
        return random_qkv(1, 2, 16, d, dtype=kw.get("dtype", half), device=device)

    wide, huge, odd = qkv(264), qkv(512), qkv(60)
    strided_last = torch.randn(1, 2, 16, 128, device=device).to(half)[..., ::2]
    odd_rows = torch.randn(1, 2, 16, 68, device=device).to(half)[..., :64]  # row stride 68
    flat = torch.empty(q.numel() + 1, dtype=half, device=device)
    misaligned = flat[1:].view(q.shape).copy_(q)  # 2 bytes past a 16-byte boundary
    checks = [
        raises("CPU tensors", lambda: fn(q.cpu(), k.cpu(), v.cpu()), "CUDA"),
        raises("one CPU tensor among CUDA ones", lambda: fn(q, k.cpu(), v), "CUDA"),
        raises("float32 input", lambda: fn(q.float(), k.float(), v.float()), "dtype"),
        raises("float64 input", lambda: fn(q.double(), k.double(), v.double()), "dtype"),
        raises("mixed fp16 / bf16", lambda: fn(q, k.to(torch.bfloat16), v), "dtype"),
        raises("3-D tensors", lambda: fn(q[0], k[0], v[0]), "dimensions"),
        raises("5-D tensors", lambda: fn(q[None], k[None], v[None]), "dimensions"),
        raises("k and v of different lengths", lambda: fn(q, k[:, :, :8], v), "k and v"),
        raises("head_dim 264", lambda: fn(*wide), "head_dim"),
        raises("head_dim 512", lambda: fn(*huge), "head_dim"),
        raises("head_dim 60 (not a multiple of 8)", lambda: fn(*odd), "head_dim"),
        raises("last dimension not contiguous",
               lambda: fn(strided_last, strided_last, strided_last), "contiguous"),
        raises("rows not 16-byte aligned (row stride 68)",
               lambda: fn(odd_rows, odd_rows, odd_rows), "contiguous"),
        raises("data pointer not 16-byte aligned", lambda: fn(misaligned, k, v), "clone"),
        raises("empty sequence (S = 0)", lambda: fn(q[:, :, :0], k[:, :, :0], v[:, :, :0]),
               "empty"),
        raises("empty batch (B = 0)", lambda: fn(q[:0], k[:0], v[:0]), "empty"),
        raises("out of the wrong shape", lambda: fn(q, k, v, False, torch.empty_like(q[:, :1])),
               "out"),
        raises("out of the wrong dtype",
               lambda: fn(q, k, v, False, torch.empty_like(q, dtype=torch.bfloat16)), "dtype"),
        raises("out on the CPU", lambda: fn(q, k, v, False, torch.empty(q.shape, dtype=half)),
               "CUDA"),
        raises("out is k", lambda: fn(q, k, v, False, k), "out"),
    ]
    for bad in ("7", "x"):
        with mma_config(bad):
            checks.append(raises(f"{CONFIG_ENV}={bad}", lambda: fn(q, k, v), CONFIG_ENV))
    # Nothing above launched a kernel or left a CUDA error behind: a good call still works.
    torch.cuda.synchronize()
    checks += check_kernel("mma input: a valid call after the bad ones", ext, q, k, v, False,
                           reference_attention(q, k, v),
                           lambda: poisoned_empty(*q.shape, dtype=half, device=device))
    return checks, {}


# --- benchmark ----------------------------------------------------------------------------

def _sdpa_backends():
    """{'flash': backend, 'cudnn': backend or None} of torch.nn.attention."""
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}


def _time_sdpa(backend, q, k, v, causal):
    """(median ms, one output) of SDPA pinned to `backend`, or (None, reason) if it refuses."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    if backend is None:
        return None, "this torch has no such backend"

    def call():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    try:
        with sdpa_kernel(backend):
            out = call()
            torch.cuda.synchronize()
            t = time_cuda(call, **BENCH_TIMING)
    except RuntimeError as err:  # "No available kernel" and the like
        return None, str(err).strip().splitlines()[0][:120]
    return t.median_ms, out


def benchmark_rows(dtypes=None, configs=None, seed=None, device="cuda"):
    """Time ours (default config, then each of `configs`) against SDPA FLASH and cuDNN.

    Returns (checks, metrics, rows); rows are dicts for format_table.
    """
    ext = _ext()
    device = torch.device(device)
    gen, seed = fresh_generator(seed, device)
    env = os.environ.get(CONFIG_ENV)
    print(f"[task4.mma] benchmark: inputs seed {seed}; default run: {CONFIG_ENV}="
          f"{env if env else 'unset (config 0)'}; also timing configs: {configs or 'none'}")
    backends = _sdpa_backends()
    checks: list[Check] = []
    metrics: dict[str, float] = {}
    rows: list[dict] = []
    for dtype in dtypes or list(DTYPES):
        for shape in BENCH_SHAPES:
            b, h, s, d = shape
            q, k, v = random_qkv(b, h, s, d, dtype=DTYPES[dtype], device=device, generator=gen)
            for causal in (False, True):
                prefix = metric_prefix(dtype, shape, causal)
                flops = attention_flops(b, h, s, s, d, causal)
                peers = {}
                for peer, backend in backends.items():
                    ms, result = _time_sdpa(backend, q, k, v, causal)
                    peers[peer] = (ms, result)
                name = f"mma {dtype} {shape_label(*shape)} {_mask(causal)}"
                # Correctness on the benchmark inputs: ours against FLASH's output.
                out = poisoned_empty(*q.shape, dtype=q.dtype, device=device)
                ext.flash_attention_mma(q, k, v, causal, out)
                flash_ms, flash_out = peers["flash"]
                if flash_ms is not None:
                    diff = relative_error(out, flash_out)
                    tol = REL_TOL[DTYPES[dtype]]
                    checks.append(Check(f"{name} ours vs SDPA flash output", diff <= tol,
                                        f"rel diff {diff:.2e} (tol {tol:.0e})"))
                del out
                for config in [None, *(configs or [])]:
                    with mma_config(config):
                        t = time_cuda(lambda q=q, k=k, v=v, c=causal:
                                      ext.flash_attention_mma(q, k, v, c), **BENCH_TIMING)
                    ours = tflops(flops, t.median_ms)
                    row = {"dtype": dtype, "shape": shape_label(*shape), "mask": _mask(causal),
                           "config": "default" if config is None else str(config),
                           "ms": t.median_ms, "tflops": ours}
                    for peer, (ms, _) in peers.items():
                        row[f"{peer}_tflops"] = tflops(flops, ms) if ms is not None else None
                        row[f"ratio_vs_{peer}"] = (ours / row[f"{peer}_tflops"]
                                                   if ms is not None else None)
                    rows.append(row)
                    tag = "" if config is None else f".config{config}"
                    metrics[f"{prefix}{tag}.tflops"] = ours
                    metrics[f"{prefix}{tag}.ms"] = t.median_ms
                    for peer in peers:
                        if row[f"ratio_vs_{peer}"] is not None:
                            metrics[f"{prefix}{tag}.ratio_vs_sdpa_{peer}"] = row[f"ratio_vs_{peer}"]
                    if config is not None:
                        continue
                    for peer, (ms, why) in peers.items():
                        if ms is None:
                            checks.append(Check(f"{name} SDPA {peer}", True,
                                                f"unavailable ({why}); not compared"))
                        else:
                            metrics[f"{prefix}.sdpa_{peer}_tflops"] = row[f"{peer}_tflops"]
                            metrics[f"{prefix}.sdpa_{peer}_ms"] = ms
                    ratio = row["ratio_vs_flash"]
                    if ratio is None:
                        checks.append(Check(f"{name} >= {ACCEPT_RATIO_VS_FLASH}x SDPA flash", True,
                                            "SDPA flash unavailable: acceptance not evaluated"))
                    else:
                        cudnn = row["ratio_vs_cudnn"]
                        checks.append(Check(
                            f"{name} >= {ACCEPT_RATIO_VS_FLASH}x SDPA flash",
                            ratio >= ACCEPT_RATIO_VS_FLASH,
                            f"ours {ours:.1f} TFLOP/s, flash {row['flash_tflops']:.1f} "
                            f"(ratio {ratio:.2f}x)"
                            + (f", cuDNN {row['cudnn_tflops']:.1f} ({cudnn:.2f}x)"
                               if cudnn is not None else ""), target=True))
            del q, k, v
            torch.cuda.empty_cache()
    return checks, metrics, rows


def format_table(rows: list[dict]) -> str:
    """The benchmark as a text table (TFLOP/s; ratio > 1 means ours is faster)."""
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    head = (f"{'dtype':5} {'shape':18} {'mask':9} {'config':7} {'ms':>8} {'ours':>7} "
            f"{'flash':>7} {'x flash':>7} {'cuDNN':>7} {'x cuDNN':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['dtype']:5} {r['shape']:18} {r['mask']:9} {r['config']:7} "
                     f"{r['ms']:8.3f} {r['tflops']:7.1f} {num(r.get('flash_tflops'), '7.1f')} "
                     f"{num(r.get('ratio_vs_flash'), '7.2f')} {num(r.get('cudnn_tflops'), '7.1f')} "
                     f"{num(r.get('ratio_vs_cudnn'), '7.2f')}")
    lines.append("TFLOP/s = 4*B*H*S^2*D / time (halved when causal); x = ours / peer.")
    return "\n".join(lines)


def mma_benchmark(args=None):
    """Ours against SDPA FLASH and cuDNN at (4,32,4096,128) and (8,32,2048,64), both dtypes
    and masks; a check per case that ours is >= 0.9x FLASH (the acceptance)."""
    device = pick_device(getattr(args, "device", None))
    if (skip := _gpu_only("mma benchmark", device)) is not None:
        return skip, {}
    checks, metrics, rows = benchmark_rows(
        dtypes=getattr(args, "mma_dtypes", None), configs=getattr(args, "mma_configs", None),
        seed=getattr(args, "seed", None), device=device)
    print(format_table(rows))
    for head_dim, configs in CONFIGS.items():
        print(f"  head_dim {head_dim} configs: "
              + "; ".join(f"{i}: {text}" for i, text in configs.items()))
    return checks, metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--configs and --dtype of the benchmark (dest mma_configs / mma_dtypes, so they never
    collide with task4.test's own --configs, which are the fp32 kernel's)."""
    parser.add_argument("--configs", dest="mma_configs", type=parse_configs, default=None,
                        metavar="0,1,2", help="also time these tile configs of the fp16/bf16 kernel "
                             f"(comma-separated, of {','.join(map(str, ALL_CONFIGS))}); the "
                             f"main figures are the default's ({CONFIG_ENV} unset)")
    parser.add_argument("--dtype", dest="mma_dtypes", type=parse_dtypes, default=None,
                        metavar="fp16,bf16", help="benchmark only these dtypes (comma-separated: fp16,bf16)")


GROUPS = {"small": mma_small, "correctness": mma_correctness, "inputs": mma_inputs,
          "benchmark": mma_benchmark}


def main(argv=None) -> int:
    return task_main("task4", GROUPS, argv, description=__doc__, extra_args=add_arguments,
                     gpu_only=True)


if __name__ == "__main__":
    sys.exit(main())
