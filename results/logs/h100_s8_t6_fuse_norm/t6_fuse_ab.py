"""Issue 32 / task 6: the norm folded into the product after it (decode_linear_norm.cuh), on a GPU.

    python .scratch/t6_fuse_ab.py            # correctness, then the A/B, then both profiles

1. correctness: decode_linear / decode_swiglu with norm= against float64 (norm then product) by
   task 5's criterion (err <= 2 x the PyTorch twin's + 1e-5): fp32/fp16/bf16, rows 1..8, K 4096,
   LayerNorm and RMSNorm, gamma/beta identity and not, plain and gated, each k_split.
2. task 6's gqa-course model (bf16, B 4, prompt 1024, 100 new tokens): TBT of the CUDA-graph
   decode with model.fused_norm True (norm folded) and False (norm kernels), alternating
   rounds in this one process, medians; greedy tokens of the two compared.
3. the per-kind profile of one decode step (torch.profiler, eager) for both, with the list of
   the kernels counted as "everything else".
"""
import itertools
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from task5 import fused  # noqa: E402
from task5.fused_checks import _criterion  # noqa: E402
from task6.generate import generate  # noqa: E402
from task6 import test as t6  # noqa: E402

ROUNDS = 5
t0 = time.time()
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
fused._ext()
print(f"[build/load] {time.time() - t0:.1f} s", flush=True)

# ---- 1. correctness -----------------------------------------------------------------------
fails, total = 0, 0
for dtype, rows, rms, gated, affine, k_splits in itertools.product(
        (torch.float32, torch.float16, torch.bfloat16), (1, 2, 3, 4, 8), (False, True),
        (False, True), (False, True), (0, 1, 2, 4)):
    if k_splits and rows not in (1, 4):
        continue
    K, N = 4096, 384

    def rand(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, device=dev, generator=gen) * scale + shift).to(dtype)

    rows_w = 2 * N if gated else N
    x, w = rand(rows, K, shift=0.3), rand(rows_w, K, scale=K ** -0.5)
    b, r = (None if gated else rand(rows_w, scale=0.1)), rand(rows, N)
    nw = rand(K, scale=0.5, shift=1.0) if affine else torch.ones(K, dtype=dtype, device=dev)
    nb = None if rms else (rand(K, scale=0.2) if affine else torch.zeros(K, dtype=dtype, device=dev))
    fold = fused.fold_norm(w, b, nw, nb, 1e-5, rms)
    ours = fused._ext().decode_linear_norm(x, fold.weight, r, fold.colsum, fold.shift, 1e-5, rms,
                                           gated, k_splits)
    twin = fused.torch_linear_norm(x, w, b, r, nw, nb, 1e-5, rms, gated)
    d = [None if t is None else t.double() for t in (x, w, b, r, nw, nb)]
    truth = fused.torch_linear_norm(*d, 1e-5, rms, gated)
    c = _criterion(f"{dtype} rows {rows} {'rms' if rms else 'layer'} gated {gated} affine {affine} "
                   f"k_splits {k_splits}", ours, twin, truth)
    total += 1
    if not c.passed:
        fails += 1
        print("FAIL", c.name, c.detail, flush=True)
print(f"[correctness] {total - fails}/{total} pass ({time.time() - t0:.1f} s)", flush=True)

# ---- 2. TBT A/B on the gqa-course model -----------------------------------------------------
cfg = t6.GQA_COURSE
model = cfg.build(torch.bfloat16, dev)
prompt = cfg.prompt_tokens(torch.Generator(device=dev).manual_seed(1784137639), dev)
model.attention_backend = "custom"


def tbt(fold: bool):
    model.fused_norm = fold
    timings: dict = {}
    toks = generate(model, prompt, cfg.new_tokens, use_cuda_graph=True, timings=timings)
    return toks, timings["tbt_ms"]


for fold in (True, False):   # warm-up: build, folds made, allocator grown
    model.fused_norm = fold
    generate(model, prompt, 4, use_cuda_graph=True)
results = {True: [], False: []}
tokens = {}
for i in range(ROUNDS):
    for fold in ((True, False) if i % 2 == 0 else (False, True)):
        tokens[fold], ms = tbt(fold)
        results[fold].append(ms)
    print(f"[round {i}] folded {results[True][-1]:.3f} ms, norm kernels {results[False][-1]:.3f} ms",
          flush=True)
med = {k: statistics.median(v) for k, v in results.items()}
same = (tokens[True] == tokens[False]).all(dim=1)
first_diff = [int((a != b).nonzero()[0]) if not s else None
              for a, b, s in zip(tokens[True], tokens[False], same)]
copy_gbps = t6.measure_copy_bandwidth()
bytes_ms = (t6.decode_weight_bytes(model) + t6.decode_kv_bytes(cfg, 2)) / (copy_gbps * 1e9) * 1e3
print(f"[tbt] median of {ROUNDS}: folded {med[True]:.3f} ms ({min(results[True]):.3f}-"
      f"{max(results[True]):.3f}), norm kernels {med[False]:.3f} ms ({min(results[False]):.3f}-"
      f"{max(results[False]):.3f}); folded/kernels {med[True] / med[False]:.4f}", flush=True)
print(f"[tbt] copy bandwidth {copy_gbps:.0f} GB/s, bytes roofline {bytes_ms:.3f} ms: "
      f"folded {med[True] / bytes_ms:.3f}x, norm kernels {med[False] / bytes_ms:.3f}x", flush=True)
print(f"[tokens] folded vs norm kernels, per sequence: first differing step {first_diff} "
      "(None: identical; bf16 near-ties may flip)", flush=True)

# ---- 3. profiles ----------------------------------------------------------------------------
for fold in (True, False):
    model.fused_norm = fold
    other: dict = {}
    prof = t6.decode_profile(model, prompt, other=other)
    print(f"--- profile, fused_norm={fold}")
    print(t6.format_profile("bf16", prof, other), flush=True)
print(f"[done] {time.time() - t0:.1f} s")
