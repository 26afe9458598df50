"""Head dims 96 and 256 on the Hopper kernel (issue 31, build point 2): correctness first, then
timing beside SDPA, one process; the figures go to results/<gpu>.json.

    python -m task4.hopper_head_dims                # check, time, record
    python -m task4.hopper_head_dims --no-record    # check and time only
    python -m task4.hopper_head_dims --no-timing
    python -m task4.hopper_head_dims --dry-run      # on a CPU: the plumbing, PyTorch as the kernel

(a) Correctness: head_dim 96 (the 128 instantiation, columns 96..127 zero-filled by the TMA)
    and 256 (its own tiles: 80 keys dense, 64 for variants), fp16 and bf16, causal and not, odd lengths, GQA/MQA,
    S_q != S_k, a window, left-padded key lengths, softcap 50, sinks, x8 logits, bool/additive
    block masks: task4.hopper.flash_attention_hopper at the version flash_attention routes to
    (and v2 at 256, its other rung) and task4.attention.flash_attention itself, each against
    float64 by FlashAttention-2's criterion (common.variants.check_variant: a NaN-poisoned
    `out` that must be wholly overwritten, two runs bit-identical). Also the first two heads
    of every timing shape. Any failure: no timing.
(b) Timing: b2_h16_s8192_d256 and b4_h32_s4096_d96, causal and not, fp16 and bf16:
    flash_attention as routed, the Hopper versions that take the head dim (2 and 5 at 256;
    2, 5 and 7 at 96), SDPA pinned to each backend that runs the case (cuDNN, FLASH,
    EFFICIENT; a backend that raises is left out), the contenders in turn for ROUNDS rounds
    (common.timing.interleaved_medians over time_cuda), TFLOP/s = 4 B H S^2 D / time (halved
    when causal), ratio_vs_sdpa_best = the fastest SDPA backend's time / flash_attention's.
Metrics as task4.hopper.<dtype>.<shape>.<mask>.{tflops, version, sdpa_<backend>_tflops,
ratio_vs_sdpa_best, v<N>_tflops}.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task4.hopper_head_dims")

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from common.checks import Check
from common.timing import interleaved_medians, time_cuda
from common.variants import Variant, check_variant

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ROUNDS = 3
REPEATS = 10
TIMING_SHAPES = {"b2_h16_s8192_d256": (2, 16, 16, 8192, 256),
                 "b4_h32_s4096_d96": (4, 32, 32, 4096, 96)}
OTHER_VERSIONS = {96: (2, 5, 7), 256: (2, 5)}  # the rungs timed beside the routed call
DEVICE = "cuda"  # "cpu" with --dry-run: the script's plumbing with PyTorch standing in for the kernel


def correctness_cases(d: int) -> list[tuple]:
    """(label, B, H_q, H_kv, S_q, S_k, q scale, variant kwargs, mask kind or None)."""
    dev = DEVICE
    lengths = torch.tensor([1000, 513, 1, 777], dtype=torch.int32, device=dev)
    sinks = torch.linspace(-1.0, 2.0, 8, device=dev)
    cases = []
    for causal in (False, True):
        cases += [
            ("dense", 2, 4, 4, 1000, 1000, 1.0, dict(causal=causal), None),
            ("odd", 1, 3, 3, 7, 7, 1.0, dict(causal=causal), None),
            ("one", 2, 2, 2, 1, 1, 1.0, dict(causal=causal), None),
            ("odd2049", 1, 2, 2, 2049, 2049, 1.0, dict(causal=causal), None),
            ("gqa", 2, 8, 2, 777, 777, 1.0, dict(causal=causal), None),
            ("mqa", 1, 4, 1, 65, 190, 1.0, dict(causal=causal), None),
            ("sq<sk", 1, 4, 4, 300, 1000, 1.0, dict(causal=causal), None),
            ("sq>sk", 1, 4, 4, 1000, 129, 1.0, dict(causal=causal), None),
            ("x8logits", 2, 4, 4, 1000, 1000, 8.0, dict(causal=causal), None),
            ("window", 1, 4, 2, 1500, 1500, 1.0, dict(causal=causal, window=300), None),
            ("leftpad", 4, 2, 2, 1000, 1000, 1.0,
             dict(causal=causal, key_lengths=lengths, left_padding=True), None),
            ("varlen", 4, 2, 2, 1000, 1000, 1.0, dict(causal=causal, key_lengths=lengths), None),
            ("softcap50", 1, 4, 4, 1000, 1000, 1.0, dict(causal=causal, softcap=50.0), None),
            ("softcap50_window", 1, 4, 2, 1200, 1200, 8.0,
             dict(causal=causal, softcap=50.0, window=256), None),
            ("sinks", 1, 8, 8, 500, 700, 1.0, dict(causal=causal, sinks=sinks), None),
            ("boolmask", 1, 4, 2, 700, 900, 1.0, dict(causal=causal), "blocks"),
            ("boolmask64", 2, 4, 4, 500, 500, 1.0, dict(causal=causal), "blocks64"),
            ("addmask", 1, 8, 2, 640, 768, 1.0, dict(causal=causal), "blocksfloat"),
        ]
    return cases


def routed_version(q, k, v, causal) -> int | None:
    from task4 import attention

    return attention._hopper_version(q, k, v, causal, None)


def check_correctness(checks: list[Check]) -> None:
    from task4 import attention, hopper
    from task4.variants_checks import block_sparse_mask

    for dname, dtype in DTYPES.items():
        for d in (96, 256):
            for label, b, hq, hkv, sq, sk, qscale, kwargs, mask_kind in correctness_cases(d):
                g = torch.Generator(device=DEVICE).manual_seed(sq * 131 + sk * 7 + d + hq)
                q = (torch.randn(b, hq, sq, d, device=DEVICE, generator=g) * qscale).to(dtype)
                k, v = (torch.randn(b, hkv, sk, d, device=DEVICE, generator=g).to(dtype)
                        for _ in range(2))
                if mask_kind is not None:
                    kwargs = dict(kwargs, mask=block_sparse_mask(mask_kind, b, hq, sq, sk, dtype,
                                                                 g, DEVICE))
                variant = Variant(**kwargs)
                causal = variant.causal
                name = f"{dname} d{d} {label} {(b, hq, hkv, sq, sk)} {variant.describe()}"
                version = routed_version(q, k, v, causal)
                if version is None or not hopper.supports(q, k, v, mask=variant.mask):
                    checks.append(Check(f"{name}: routed to the Hopper kernel", False,
                                        f"routed version {version}"))
                    continue
                call = {n: x for n, x in variant.kwargs().items() if n != "causal"}
                versions = sorted({version, *((2,) if d == 256 else ())})
                for ver in versions:
                    checks.append(check_variant(
                        f"v{ver} {name}", lambda out, q=q, k=k, v=v, ver=ver, causal=causal,
                        call=call: hopper.flash_attention_hopper(q, k, v, causal, ver, out, **call),
                        q, k, v, variant))
                checks.append(check_variant(
                    f"flash_attention {name}", lambda out, q=q, k=k, v=v, variant=variant:
                    attention.flash_attention(q, k, v, out=out, **variant.kwargs()), q, k, v,
                    variant))
                for c in checks[-len(versions) - 1:]:
                    if not c.passed:
                        print("FAIL", c.name, c.detail, flush=True)
                del q, k, v
            torch.cuda.empty_cache()
        print(f"{dname}: {sum(c.passed for c in checks)}/{len(checks)} checks passed so far",
              flush=True)
    # The timing shapes themselves, on their first batch and two heads (float64 of the whole
    # [8192, 8192] score matrices of every head would not fit).
    for dname, dtype in DTYPES.items():
        for label, (_, _, _, s, d) in TIMING_SHAPES.items():
            g = torch.Generator(device=DEVICE).manual_seed(s + d)
            q, k, v = (torch.randn(1, 2, s, d, device=DEVICE, generator=g).to(dtype)
                       for _ in range(3))
            for causal in (False, True):
                c = check_variant(
                    f"flash_attention {dname} {label} (first 2 heads) {'causal' if causal else 'full'}",
                    lambda out, q=q, k=k, v=v, causal=causal:
                    attention.flash_attention(q, k, v, causal, out), q, k, v, Variant(causal=causal))
                checks.append(c)
                if not c.passed:
                    print("FAIL", c.name, c.detail, flush=True)
            del q, k, v
            torch.cuda.empty_cache()


def time_cases(metrics: dict) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from task4 import attention, hopper

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}

    def sdpa(backend, q, k, v, causal):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    print(f"\n{'case':42s} {'ver':>3s} {'ours':>6s} " +
          " ".join(f"{n:>9s}" for n in backends) + "  vs best   others", flush=True)
    for dname, dtype in DTYPES.items():
        for label, (b, hq, hkv, s, d) in TIMING_SHAPES.items():
            q = torch.randn(b, hq, s, d, device=DEVICE, dtype=dtype)
            k, v = (torch.randn(b, hkv, s, d, device=DEVICE, dtype=dtype) for _ in range(2))
            for mask in ("noncausal", "causal"):
                causal = mask == "causal"
                flops = 4 * b * hq * s * s * d / (2 if causal else 1)
                contenders = {"routed": lambda q=q, k=k, v=v, causal=causal:
                              attention.flash_attention(q, k, v, causal)}
                for ver in OTHER_VERSIONS[d]:
                    contenders[f"v{ver}"] = (lambda ver=ver, q=q, k=k, v=v, causal=causal:
                                             hopper.flash_attention_hopper(q, k, v, causal, ver))
                for name, backend in backends.items():
                    fn = sdpa(backend, q, k, v, causal)
                    try:
                        fn()
                        torch.cuda.synchronize()
                    except (RuntimeError, ValueError) as err:  # the backend does not take this case
                        print(f"  ({dname} {label} {mask}: SDPA {name} raised "
                              f"{str(err).splitlines()[0][:100]})", flush=True)
                        continue
                    contenders[f"sdpa_{name}"] = fn
                timers = {n: (lambda reps, fn=fn: time_cuda(fn, warmup=3, repeats=reps).median_ms)
                          for n, fn in contenders.items()}
                ms = interleaved_medians(timers, rounds=ROUNDS, repeats=REPEATS)
                tflops = {n: flops / (t * 1e-3) / 1e12 for n, t in ms.items()}
                sdpa_ms = {n[5:]: t for n, t in ms.items() if n.startswith("sdpa_")}
                best = min(sdpa_ms, key=sdpa_ms.get) if sdpa_ms else None
                ratio = sdpa_ms[best] / ms["routed"] if best else float("nan")
                version = routed_version(q, k, v, causal) or 0
                key = f"task4.hopper.{dname}.{label}.{mask}"
                metrics[f"{key}.tflops"] = tflops["routed"]
                metrics[f"{key}.version"] = float(version)
                metrics[f"{key}.ratio_vs_sdpa_best"] = ratio
                metrics.update({f"{key}.{n}_tflops": tf for n, tf in tflops.items() if n != "routed"})
                others = " ".join(f"{n} {tflops[n]:.0f}" for n in contenders
                                  if n.startswith("v"))
                print(f"{dname + ' ' + label + ' ' + mask:42s} v{version:<2d} {tflops['routed']:6.0f} " +
                      " ".join(f"{tflops.get('sdpa_' + n, float('nan')):9.0f}" for n in backends) +
                      f"  {ratio:6.3f}x  {others}", flush=True)
            del q, k, v
            torch.cuda.empty_cache()


def _dry_run() -> None:
    global DEVICE
    from common.variants import pytorch_attention_variant
    from task4 import attention, hopper

    DEVICE = "cpu"

    def fake(q, k, v, causal=False, version=5, out=None, lse=None, scale=None, **kw):
        variant = Variant(causal=causal, scale=scale, **{n: x for n, x in kw.items()
                                                          if n != "stride"})
        result = pytorch_attention_variant(q, k, v, variant)
        return out.copy_(result) if out is not None else result

    hopper.available = lambda: True
    hopper.load = lambda: None
    hopper.supports = lambda *a, **kw: True
    hopper.flash_attention_hopper = fake
    attention.flash_attention = lambda q, k, v, causal=False, out=None, **kw: fake(
        q, k, v, causal, 5, out, **kw)
    attention._hopper_version = lambda q, k, v, causal, out: attention.HOPPER_VERSION[
        (q.shape[3], bool(causal))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-timing", action="store_true", help="correctness only")
    parser.add_argument("--no-record", action="store_true", help="do not write results/<gpu>.json")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU, PyTorch standing in for the kernel (checks the script)")
    args = parser.parse_args(argv)
    from task4 import hopper

    if args.dry_run:
        _dry_run()
        args.no_timing = True
    if not hopper.available():
        print("needs an H100/H200 (compute capability 9.0)")
        return 2
    started = time.time()
    hopper.load()
    checks = []
    check_correctness(checks)
    failed = [c for c in checks if not c.passed]
    print(f"\ncorrectness: {len(checks) - len(failed)}/{len(checks)} passed "
          f"({time.time() - started:.0f} s)", flush=True)
    metrics = {}
    if failed:
        print("failures, so no timing:")
        for c in failed[:40]:
            print("  FAIL", c.name, c.detail)
    elif not args.no_timing:
        time_cases(metrics)
        if not args.no_record:
            from common.results import record

            print(f"[task4] recorded in {record(metrics)}")
    print(f"done in {time.time() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
