"""Time the Hopper kernel's ladder yourself: each version checked, then timed beside SDPA.

    python -m task4.hopper_ladder                 # every version, record the figures
    python -m task4.hopper_ladder --versions 5 --no-record
    python -m task4.hopper_ladder --routing       # measure and write task4/hopper_routing.json
    compute-sanitizer --tool racecheck python -m task4.hopper_ladder --sanitizer-cases 4,5

1. Builds the sm_90a extension (task4/hopper.py).
2. Checks each version (1 = wgmma + cp.async, 2 = TMA + mbarrier pipeline, 3 = producer/consumer
   warpgroups, 4 = + softmax overlapping P V, 5 = + the consumers' turns, 6 = 5 with three
   consumers, head_dim 64 only, 7 = 5 persistent: one CTA per SM taking work tiles;
   task4/flash_attention_hopper.cu) in its own process, so a version that faults or hangs
   cannot take the others down: fp16 and bf16, both masks, lengths 1 to 2049 (not tile
   multiples), head_dim 64 and 128, against float64 by FlashAttention-2's criterion (error at
   most 2x PyTorch's same-dtype SDPA error + 1e-5). The full matrix (GQA, S_q != S_k, strided
   views) is tests/test_task4_hopper.py.
3. Times every correct version on the issue's shapes beside SDPA pinned to cuDNN and to
   FlashAttention-2, in the same process: 3 warm-up calls, then the median of 10 CUDA-event
   timings (each input is at least 67 MB, larger than L2, so nothing is served from it), the
   contenders of a case in turn, 3 rounds, the median of the rounds. TFLOP/s = 4·B·H·S²·D /
   time, halved when causal.
4. Times task4.attention.flash_attention itself, which picks the version for the head_dim
   and mask (task4.attention.HOPPER_VERSION), the same way.
5. With --routing (instead of 2-4): the routing table flash_attention reads. For each dtype,
   head_dim (64, 128), mask and key-length bucket (task4.hopper.SEQ_BUCKETS: S 512 to 16384,
   a batch of ROUTING_TOKENS // S sequences, 32 heads: every input larger than L2), the rungs
   that take every variant (task4.hopper.ROUTING_VERSIONS) are timed in turn (3 rounds of 10)
   and the fastest is written to task4/hopper_routing.json with every rung's TFLOP/s, the
   device, torch and the commit. Commit that file: it is how the routing is chosen.
Recorded as task4.hopper.v<N>.<dtype>.<shape>.<mask>.tflops (the ladder),
task4.hopper.<dtype>.<shape>.<mask>.{tflops,ratio_vs_sdpa_cudnn,version} (flash_attention) and
task4.hopper.<dtype>.<shape>.<mask>.sdpa_{cudnn,flash}_tflops; Results.md renders them.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task4.hopper_ladder")

import argparse
import json
import math
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

# (B, H, S, D) of the correctness cases; lengths that are not multiples of any tile.
CHECK_CASES = ((1, 2, 1, 64), (2, 3, 7, 64), (2, 3, 113, 128), (1, 4, 1000, 128), (2, 2, 257, 64),
               (1, 2, 1023, 64), (1, 2, 2049, 128))
# Issue 31's dense shapes: label -> (B, H_q, H_kv, S, D). SDPA gets the GQA shape's K and V
# repeated to H_q heads (done once, before timing), as a caller of cuDNN's kernel must.
SHAPES = {"b4_h32_s4096_d128": (4, 32, 32, 4096, 128), "b8_h32_s2048_d64": (8, 32, 32, 2048, 64),
          "b1_h32_s16384_d128": (1, 32, 32, 16384, 128), "b16_h32_s1024_d128": (16, 32, 32, 1024, 128),
          "b32_h32_s512_d64": (32, 32, 32, 512, 64), "b2_h32_s8192_d64": (2, 32, 32, 8192, 64),
          "b4_hq32_hkv8_s4096_d128": (4, 32, 8, 4096, 128)}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
MASKS = ("noncausal", "causal")
ROUTING_ROUNDS = 3
CHILD_SECONDS = 120  # one version's checks take a few seconds; more is a hang
ROUNDS = 3           # each case's contenders timed in turn this many times


def check_version(version: int) -> list[list]:
    """[dtype, B, H, S, D, causal, error, tolerance, exception] per case (run in a child)."""
    from task4 import hopper

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in DTYPES.values():
        for (b, h, s, d) in CHECK_CASES:
            if not hopper.takes_head_dim(version, d):
                continue
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=gen).to(dtype)
                           for _ in range(3))
                try:
                    out = hopper.flash_attention_hopper(q, k, v, causal, version)
                    torch.cuda.synchronize()
                except Exception as exc:  # reported, not raised: the parent prints it
                    rows.append([str(dtype), b, h, s, d, causal, None, None, repr(exc)[:200]])
                    continue
                truth = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
                same_dtype = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                err = (out.double() - truth).abs().max().item()
                tol = 2 * (same_dtype.double() - truth).abs().max().item() + 1e-5
                rows.append([str(dtype), b, h, s, d, causal, err, tol, ""])
    return rows


def _sanitizer_variants(b: int, hq: int, sq: int, sk: int) -> dict[str, dict]:
    """The variant arguments the general instantiations take, one small case each: a window,
    left-padded key lengths, a block-sparse bool mask (its per-tile summary kernel too), a
    softcap (its own instantiation) and sinks."""
    lengths = torch.tensor([sk - 37] + [sk] * (b - 1), dtype=torch.int32, device="cuda")
    keep = torch.rand(b, 1, sq, sk, device="cuda") < 0.7
    keep[..., :, : sk // 3] = False            # whole tiles dropped: the summary skips them
    return {"window": dict(causal=True, window=50),
            "left-padded key lengths": dict(causal=True, key_lengths=lengths, left_padding=True),
            "bool mask": dict(mask=keep),
            "softcap": dict(causal=True, softcap=5.0),
            "sinks": dict(causal=True, sinks=torch.randn(hq, device="cuda"))}


def sanitizer_cases(versions: list[int]) -> None:
    """Small launches of each version for compute-sanitizer (memcheck, racecheck, synccheck):
    fp16/bf16, head_dim 64/128, both masks, S 130 (not a tile multiple) and GQA with S_q 70 <
    S_k 300, then for the versions flash_attention routes variants to (hopper.ROUTING_VERSIONS)
    the general instantiations: a window, left-padded key lengths, a bool mask tensor, a softcap
    and sinks (_sanitizer_variants); each checked loosely against common.variants' float64
    reference (matmuls, no SDPA kernel of PyTorch's under the sanitizer). `python -m
    common.tools.sanitize --tasks 4` runs it on a compute capability 9.0 GPU."""
    from common.variants import Variant, reference_attention_variant
    from task4 import hopper

    def check(version, q, k, v, fields, what):
        out = hopper.flash_attention_hopper(q, k, v, fields.get("causal", False), version,
                                            **{n: x for n, x in fields.items() if n != "causal"})
        ref = reference_attention_variant(q, k, v, Variant(**fields))
        err = (out.double() - ref).abs().max().item()
        assert err < 2e-2, (version, what, q.dtype, tuple(q.shape), tuple(k.shape), err)

    for version in versions:
        for dtype in DTYPES.values():
            for d in (64, 128):
                if not hopper.takes_head_dim(version, d):
                    continue
                for (b, hq, hkv, sq, sk) in ((1, 2, 2, 130, 130), (1, 4, 2, 70, 300)):
                    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
                    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
                    for causal in (False, True):
                        check(version, q, k, v, dict(causal=causal), "dense")
                if version not in hopper.ROUTING_VERSIONS:
                    continue
                b, hq, hkv, sq, sk = 2, 4, 2, 70, 300
                q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
                k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
                for what, fields in _sanitizer_variants(b, hq, sq, sk).items():
                    check(version, q, k, v, fields, what)
        torch.cuda.synchronize()
        print(f"version {version} ok", flush=True)


def time_ladder(versions: list[int], rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    """{"<dtype>.<shape>.<mask>": {"cudnn": TFLOP/s, "fa2": ..., "v<N>": ..., "dispatched": ...,
    "version": the version flash_attention ran}}. The contenders of a case are timed in turn,
    `rounds` times, and each one's median taken: run one after the other, they would also
    measure the clock, which drifts with the power drawn by whatever ran before."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from common.timing import interleaved_medians, time_cuda
    from task4 import attention, hopper

    def sdpa(backend, q, k, v, causal):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    table = {}
    for dtype_name, dtype in DTYPES.items():
        for label, (b, h, h_kv, s, d) in SHAPES.items():
            q = torch.randn(b, h, s, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(b, h_kv, s, d, device="cuda", dtype=dtype) for _ in range(2))
            k_sdpa, v_sdpa = (t.repeat_interleave(h // h_kv, dim=1) for t in (k, v))
            for mask in MASKS:
                causal = mask == "causal"
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                contenders = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, q, k_sdpa, v_sdpa, causal),
                              "fa2": sdpa(SDPBackend.FLASH_ATTENTION, q, k_sdpa, v_sdpa, causal)}
                for version in versions:
                    if not hopper.takes_head_dim(version, d):
                        continue
                    contenders[f"v{version}"] = (lambda version=version:
                                                 hopper.flash_attention_hopper(q, k, v, causal, version))
                contenders["dispatched"] = lambda: attention.flash_attention(q, k, v, causal)
                timers = {name: (lambda reps, fn=fn:
                                 time_cuda(fn, warmup=3, repeats=reps).median_ms)
                          for name, fn in contenders.items()}
                ms = interleaved_medians(timers, rounds=rounds, repeats=10)
                key = f"{dtype_name}.{label}.{mask}"
                table[key] = {name: flops / (t * 1e-3) / 1e12 for name, t in ms.items()}
                print(key, " ".join(f"{n} {tf:.0f}" for n, tf in table[key].items()), flush=True)
                table[key]["version"] = float(
                    attention._hopper_version(q, k, v, causal, None) or 0)
            del q, k, v, k_sdpa, v_sdpa
    return table


ROUTING_TOKENS = 32768  # B * S of each routing case


def measure_routing(rounds: int = ROUTING_ROUNDS) -> dict:
    """The routing table (task4/hopper.py's ROUTING_PATH format): {"versions": {key: version},
    "tflops": {key: {"v<N>": TFLOP/s}}, and where it was measured}."""
    from common.results import run_meta
    from common.timing import interleaved_medians, time_cuda
    from task4 import hopper

    versions, tflops = {}, {}
    for dtype_name, dtype in DTYPES.items():
        for head_dim in (64, 128):
            for bucket in hopper.SEQ_BUCKETS:
                batch, heads = max(1, ROUTING_TOKENS // bucket), 32
                q, k, v = (torch.randn(batch, heads, bucket, head_dim, device="cuda", dtype=dtype)
                           for _ in range(3))
                for mask in MASKS:
                    causal = mask == "causal"
                    flops = 4 * batch * heads * bucket * bucket * head_dim / (2 if causal else 1)
                    timers = {f"v{n}": (lambda reps, n=n: time_cuda(
                        lambda: hopper.flash_attention_hopper(q, k, v, causal, n),
                        warmup=3, repeats=reps).median_ms)
                        for n in hopper.ROUTING_VERSIONS if hopper.takes_head_dim(n, head_dim)}
                    ms = interleaved_medians(timers, rounds=rounds, repeats=10)
                    key = hopper.routing_key(dtype_name, head_dim, causal, bucket)
                    tflops[key] = {name: flops / (t * 1e-3) / 1e12 for name, t in ms.items()}
                    best = max(tflops[key], key=tflops[key].get)
                    versions[key] = int(best[1:])
                    print(key, " ".join(f"{n} {tf:.0f}" for n, tf in tflops[key].items()),
                          "->", best, flush=True)
                del q, k, v
    return {"_how": "python -m task4.hopper_ladder --routing (task4/hopper_ladder.py's docstring)",
            "measured": run_meta(), "versions": versions, "tflops": tflops}


def metrics_from(table: dict[str, dict[str, float]]) -> dict[str, float]:
    """The results-JSON figures of a time_ladder table."""
    metrics = {}
    ratios = [row["dispatched"] / row["cudnn"] for row in table.values()]
    if ratios:
        metrics["task4.hopper.dense_geomean_vs_sdpa_cudnn"] = math.prod(ratios) ** (1 / len(ratios))
    for key, row in table.items():
        metrics[f"task4.hopper.{key}.sdpa_cudnn_tflops"] = row["cudnn"]
        metrics[f"task4.hopper.{key}.sdpa_flash_tflops"] = row["fa2"]
        metrics[f"task4.hopper.{key}.tflops"] = row["dispatched"]
        metrics[f"task4.hopper.{key}.ratio_vs_sdpa_cudnn"] = row["dispatched"] / row["cudnn"]
        metrics[f"task4.hopper.{key}.version"] = row["version"]
        for name, tf in row.items():
            if name.startswith("v") and name[1:].isdigit():
                metrics[f"task4.hopper.{name}.{key}.tflops"] = tf
    return metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m task4.hopper_ladder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", default="7,6,5,4,3,2,1", help="versions to check and time")
    parser.add_argument("--no-record", action="store_true", help="do not write results/<gpu>.json")
    parser.add_argument("--sanitizer-cases", default=None, metavar="VERSIONS",
                        help="only run small cases of these versions (for compute-sanitizer)")
    parser.add_argument("--routing", action="store_true",
                        help="measure the fastest rung per case and write task4/hopper_routing.json")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sanitizer_cases is not None:
        sanitizer_cases([int(v) for v in args.sanitizer_cases.split(",")])
        return 0
    if args.child is not None:
        print("JSON" + json.dumps(check_version(args.child)))
        return 0

    from task4 import hopper

    if not hopper.available():
        print("task4.hopper_ladder needs a compute capability 9.0 GPU (H100, H200): the kernel is "
              "sm_90a code.")
        return 1
    start = time.time()
    hopper.load()
    print(f"built in {time.time() - start:.0f} s", flush=True)
    if args.routing:
        table = measure_routing()
        hopper.ROUTING_PATH.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"[task4] wrote {hopper.ROUTING_PATH} (commit it: flash_attention routes by it)")
        return 0
    correct = []
    for version in (int(v) for v in args.versions.split(",")):
        try:
            proc = subprocess.run([sys.executable, "-m", "task4.hopper_ladder", "--child",
                                   str(version)], capture_output=True, text=True, timeout=CHILD_SECONDS)
        except subprocess.TimeoutExpired:
            print(f"v{version}: no answer within {CHILD_SECONDS} s (a hang: a barrier that never "
                  "completes?)", flush=True)
            continue
        found = [line for line in proc.stdout.splitlines() if line.startswith("JSON")]
        if not found:
            print(f"v{version}: crashed (exit {proc.returncode})\n{proc.stderr[-1500:]}", flush=True)
            continue
        rows = json.loads(found[0][4:])
        bad = [r for r in rows if r[6] is None or not r[6] <= r[7]]
        print(f"v{version}: {len(rows) - len(bad)}/{len(rows)} cases within FlashAttention-2's "
              "criterion", flush=True)
        for row in bad[:8]:
            print("   ", row, flush=True)
        if not bad:
            correct.append(version)
    table = time_ladder(correct) if correct else {}
    if table and not args.no_record:
        from common.results import record

        print(f"[task4] recorded in {record(metrics_from(table))}")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
