"""The prefill on what real models run: each variant's speed against dense causal, same shape.

    python -m task4.hopper_variants               # check, time, record results/<gpu>.json
    python -m task4.hopper_variants --no-record

A variant should cost its visible (query, key) pairs: a sliding window, a padded batch or a
chunk after a cache reads only the key tiles some row sees, and the tiles every row sees
whole skip the mask. So the figure of merit is the efficiency

    efficiency_vs_dense = (4 * visible pairs * D / time)  /  (TFLOP/s of dense causal attention
                                                            over the same B, H, S_k, D)

for issue 31's cases (fp16 and bf16, B H 32 D 128):

  window4096_s16384     B 1, S 16384, causal, sliding window 4096 (Mistral's)
  leftpad_b4_s4096      B 4, S 4096, causal, key lengths 4096/3000/2048/1024 left-padded
  varlen_b4_s4096       the same lengths, right-padded (varlen keys)
  chunk1024_after7168   S_q 1024 after a 7168-token cache (S_k 8192), causal (bottom-right)
  blockmask_s8192       B 1, S 8192, a bool mask [1, 1, S, S] keeping half of the 128 x 128
                        blocks at random (the diagonal blocks always), whole blocks

Each runs through task4.attention.flash_attention as routed (on an H100 the Hopper kernel's
general predicate; the block mask through its per-tile summary), beside dense causal and the
mma.sync kernel, in one process, the contenders in turn for ROUNDS rounds (the median of the
rounds). Each case is first checked against float64 on its first two heads by
FlashAttention-2's criterion. Recorded as task4.hopper.variants.<dtype>.<case>.{ms,
dense_causal_ms, tflops, efficiency_vs_dense, mma_efficiency_vs_dense}. Targets (issue 31):
efficiency >= 0.9 for window, padding and chunk, >= 0.7 for the block mask: MISS lines, not
failures. (The window's speedup over dense causal, both routed, is task 4's variants-bench
group: python -m task4.test --variants-bench.)
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task4.hopper_variants")

import argparse
import statistics
import sys

import torch

from common.checks import Check, report
from common.timing import interleaved_samples, time_cuda
from common.variants import (
    Variant,
    fa2_criterion,
    keep_mask,
    pytorch_attention_variant,
    reference_attention_variant,
)

HEAD_DIM = 128
HEADS = 32
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ROUNDS = 5
TARGETS = {"window4096_s16384": 0.9, "leftpad_b4_s4096": 0.9, "varlen_b4_s4096": 0.9,
           "chunk1024_after7168": 0.9, "blockmask_s8192": 0.7}
KEY_LENGTHS = (4096, 3000, 2048, 1024)
BLOCK = 128


def block_mask(seq: int, gen: torch.Generator, device) -> torch.Tensor:
    """Bool [1, 1, seq, seq]: half of the BLOCK x BLOCK blocks kept at random, the diagonal ones
    always (so that no row is empty)."""
    blocks = seq // BLOCK
    keep = torch.rand(blocks, blocks, generator=gen, device=device) < 0.5
    keep |= torch.eye(blocks, dtype=torch.bool, device=device)
    return keep.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1).view(1, 1, seq, seq)


def cases(gen: torch.Generator, device) -> dict[str, tuple[int, int, int, Variant]]:
    """{case: (B, S_q, S_k, variant)}."""
    lengths = torch.tensor(KEY_LENGTHS, dtype=torch.int32, device=device)
    return {
        "window4096_s16384": (1, 16384, 16384, Variant(causal=True, window=4096)),
        "leftpad_b4_s4096": (4, 4096, 4096, Variant(causal=True, key_lengths=lengths,
                                                    left_padding=True)),
        "varlen_b4_s4096": (4, 4096, 4096, Variant(causal=True, key_lengths=lengths)),
        "chunk1024_after7168": (1, 1024, 8192, Variant(causal=True)),
        "blockmask_s8192": (1, 8192, 8192, Variant(mask=block_mask(8192, gen, device))),
    }


def visible_pairs(batch: int, seq_q: int, seq_k: int, variant: Variant, device) -> int:
    """(query, key) pairs some head sees, over every head: the work the variant needs."""
    per_head = keep_mask(batch, 1, seq_q, seq_k, variant, device=device).sum().item()
    return int(per_head) * HEADS


def _check(name: str, run, q, k, v, variant: Variant) -> Check:
    """FlashAttention-2's criterion on the first two heads against float64."""
    q, k, v = (t[:, :2].contiguous() for t in (q, k, v))
    ref = reference_attention_variant(q.double(), k.double(), v.double(), variant)
    ours = run(q, k, v)
    pt = pytorch_attention_variant(q, k, v, variant)
    ok, error, bound = fa2_criterion(ours, ref, pt)
    return Check(f"{name} vs float64", ok, f"max error {error:.2e}, bound {bound:.2e}")


def measure(dtype_name: str, device, gen) -> tuple[list[Check], dict[str, float]]:
    from task4.attention import flash_attention, hopper_prefill

    dtype = DTYPES[dtype_name]
    checks, metrics = [], {}
    for case, (batch, seq_q, seq_k, variant) in cases(gen, device).items():
        shape = (batch, HEADS)
        sets = [tuple(torch.randn(*shape, s, HEAD_DIM, device=device, dtype=dtype, generator=gen)
                      for s in (seq_q, seq_k, seq_k)) for _ in range(2)]
        dense_sets = [tuple(torch.randn(*shape, seq_k, HEAD_DIM, device=device, dtype=dtype,
                                        generator=gen) for _ in range(3)) for _ in range(2)]
        kwargs = variant.kwargs()
        causal = kwargs.pop("causal")

        def routed(q, k, v, causal=causal, kwargs=kwargs):
            return flash_attention(q, k, v, causal, **kwargs)

        def mma(q, k, v, causal=causal, kwargs=kwargs):
            with hopper_prefill(False):
                return flash_attention(q, k, v, causal, **kwargs)

        def dense(q, k, v):
            return flash_attention(q, k, v, True)

        name = f"{dtype_name} {case}"
        check = _check(name, routed, *sets[0], variant)
        checks.append(check)
        if not check.passed:
            continue
        timers = {"routed": (routed, sets), "mma": (mma, sets), "dense": (dense, dense_sets)}
        rounds = interleaved_samples(
            {n: (lambda reps, fn=fn, inputs=inputs: time_cuda(fn, inputs=inputs, repeats=reps).median_ms)
             for n, (fn, inputs) in timers.items()}, rounds=ROUNDS, repeats=10)
        ms = {n: statistics.median(r) for n, r in rounds.items()}
        pairs = visible_pairs(batch, seq_q, seq_k, variant, device)
        dense_pairs = batch * HEADS * seq_k * (seq_k + 1) / 2
        dense_tflops = 4 * dense_pairs * HEAD_DIM / (ms["dense"] * 1e-3) / 1e12
        tflops = {n: 4 * pairs * HEAD_DIM / (ms[n] * 1e-3) / 1e12 for n in ("routed", "mma")}
        key = f"task4.hopper.variants.{dtype_name}.{case}"
        efficiency = tflops["routed"] / dense_tflops
        metrics.update({f"{key}.ms": ms["routed"], f"{key}.dense_causal_ms": ms["dense"],
                        f"{key}.tflops": tflops["routed"],
                        f"{key}.dense_causal_tflops": dense_tflops,
                        f"{key}.efficiency_vs_dense": efficiency,
                        f"{key}.mma_efficiency_vs_dense": tflops["mma"] / dense_tflops})
        target = TARGETS[case]
        checks.append(Check(
            f"{name}: efficiency vs dense causal >= {target}", efficiency >= target,
            f"{efficiency:.2f} ({tflops['routed']:.0f} TFLOP/s on the visible pairs, dense causal "
            f"{dense_tflops:.0f}; the mma.sync kernel {tflops['mma'] / dense_tflops:.2f})",
            target=True))
        del sets, dense_sets
        torch.cuda.empty_cache()
    return checks, metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m task4.hopper_variants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="fp16,bf16", help="comma-separated: fp16, bf16")
    parser.add_argument("--no-record", action="store_true", help="do not write results/<gpu>.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("task4.hopper_variants times CUDA kernels: it needs an NVIDIA GPU, and none is "
              "visible to torch here.")
        return 1
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    checks, metrics = [], {}
    for dtype_name in (d.strip() for d in args.dtypes.split(",") if d.strip()):
        if dtype_name not in DTYPES:
            parser.error(f"unknown dtype {dtype_name!r}; choose from {', '.join(DTYPES)}")
        found, figures = measure(dtype_name, device, gen)
        checks += found
        metrics.update(figures)
    if metrics and not args.no_record:
        from common.results import record

        print(f"[task4] recorded in {record(metrics)}")
    return report("the prefill on real models' variants", checks)


if __name__ == "__main__":
    sys.exit(main())
