"""A/B of the GQA decode's split merge (issue 32), one process, alternating rounds:
  default  a warp per row (each lane 4 columns, the row's lse read once, its first 16 splits'
           partials asked of L2 before them), shared by the last H blocks of a row tile to count
           (H = rows x splits / 64, at most one row each, only where the grid is resident at once)
  rows1    the same merge by the last block alone (ATTN_GQA_MERGE_BLOCKS=1)
  m8       by the last 8 (ATTN_GQA_MERGE_BLOCKS=8, within the same limits)
(the previous merge, the last block alone with a block barrier between the weights and the
sums, was an arm of the first run, decode_mergers_ab_run1.log, with the switch since removed)
and SDPA pinned to cuDNN; checks (float64 by FlashAttention-2's criterion, each arm vs default
bit for bit, graph replays as key lengths change) and timings (CUDA-graph replays, caches rotated
beyond L2, interleaved rounds) as results/logs/h100_s8_decode_merge/decode_merge_ab.py.
    PYTHONPATH=. python .scratch/decode_rows_ab.py   (writes $OUT/decode_rows_ab.json)
It also sweeps the split count at batch 1, 4 KV heads, 32768 keys.
"""

import contextlib
import faulthandler
import json
import math
import os
import sys
import time

import torch

from common.graphs import capture_graph, graph_per_call_timer
from common.harness import env_setting
from common.timing import interleaved_medians, interleaved_samples, measure_copy_bandwidth
import statistics
from common.variants import (Variant, check_variant, fa2_criterion, pytorch_attention_variant,
                             reference_attention_variant)
from task5 import attention as am
from task5 import ops
from task5.variants_checks import _mma_inputs, _mma_variant, _poison_unread, _run_gqa

am._ext()   # builds the task 5 extension if needed (not counted below)
faulthandler.dump_traceback_later(400, exit=True)  # a hang says where
OUT = os.environ.get("OUT", ".")
DEV = "cuda"
ROUNDS = 9
ROTATE_BYTES = 256 * 2**20
ARM_ENV = {"default": {}, "rows1": {"ATTN_GQA_MERGE_BLOCKS": "1"}, "m8": {"ATTN_GQA_MERGE_BLOCKS": "8"}}
t_start = time.time()
result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
          "checks": {}, "shapes": {}}


def dump():
    with open(os.path.join(OUT, "decode_rows_ab.json"), "w") as f:
        json.dump(result, f, indent=1)


@contextlib.contextmanager
def arm(env: dict):
    with contextlib.ExitStack() as stack:
        for name, value in env.items():
            stack.enter_context(env_setting(name, value))
        yield


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


ok = True


def record(label, passed, detail, same):
    global ok
    ok &= bool(passed) and bool(same)
    result["checks"][label] = {"passed": bool(passed) and bool(same), "detail": detail,
                               "bits_equal_default": bool(same)}
    if not (passed and same):
        print(f"FAIL {label}: {detail}; bits equal to default: {same}", flush=True)


# ---- correctness ---------------------------------------------------------------------------
gen = torch.Generator(device=DEV).manual_seed(7)
# (B, H_q, H_kv, S_q, S_k, D, pattern, options, forced split counts, dtype)
F16, BF16 = torch.float16, torch.bfloat16
CASES = [(1, 32, 8, 1, 1, 128, "causal", "", (None,), F16),
         (1, 32, 8, 1, 16, 128, "causal", "", (None, 3), F16),          # the floor; 2 empty splits
         (1, 32, 8, 1, 40, 128, "causal", "", (None, 2), F16),          # 3 warps, then 2 + 1
         (2, 32, 4, 1, 1000, 128, "causal", "", (None, 5, 64), F16),    # 64 splits: one tile each
         (2, 32, 8, 1, 1000, 128, "window", "nan", (None, 7), F16),
         (4, 32, 4, 1, 1000, 128, "left", "empty nan", (None, 7), F16),  # key lengths
         (4, 32, 4, 1, 20, 128, "lengths", "empty", (None, 2), F16),      # short lengths
         (3, 16, 4, 1, 1000, 128, "left-window", "softcap sinks scale nan", (None, 6), F16),
         (2, 16, 4, 1, 12, 128, "causal", "sinks", (None, 2), F16),       # sinks, one warp
         (2, 16, 4, 1, 12, 128, "causal", "softcap scale", (None,), BF16),
         (1, 16, 4, 1, 16, 128, "mask-bool", "", (None,), F16),
         (1, 16, 4, 1, 16, 128, "mask-float", "", (None,), BF16),
         (1, 32, 8, 4, 16, 128, "causal", "", (None, 2), F16),          # S_q 4: 16 rows
         (1, 32, 8, 3, 16, 128, "causal", "", (None,), F16),            # 12 rows: padding
         (1, 32, 4, 4, 16, 128, "causal", "", (None,), F16),            # 32 rows: 2 row tiles
         (1, 32, 8, 1, 16, 128, "causal", "cache", (None,), F16),       # token-major q
         (1, 32, 8, 1, 16, 64, "causal", "", (None, 2), F16),
         (2, 32, 8, 1, 100, 64, "causal", "", (None,), BF16),
         (1, 16, 4, 1, 16, 96, "causal", "", (None,), F16),
         (1, 16, 4, 1, 300, 96, "window", "", (None, 3), BF16),
         (1, 16, 4, 1, 16, 256, "causal", "sinks", (None, 2), F16),
         (2, 16, 4, 1, 300, 256, "causal", "", (None,), BF16)]
for b, hq, hkv, sq, sk, d, pattern, options, split_list, dtype in CASES:
    q, k, v = _mma_inputs(b, hq, hkv, sq, sk, d, dtype, gen, DEV, options)
    variant = _mma_variant(pattern, options, b, hq, sq, sk, dtype, gen, DEV)
    kr, vr = _poison_unread(k, v, variant, sq) if "nan" in options else (k, v)
    for splits in split_list:
        outs = {}
        for name, env in ARM_ENV.items():
            with arm(env):
                label = (f"{str(dtype)[6:]} B{b} {hq}/{hkv} Sq{sq} Sk{sk} D{d} {pattern}"
                         f"{' ' + options if options else ''} splits {splits or 'auto'} [{name}]")
                check = check_variant(label, lambda out: _run_gqa(q, kr, vr, variant, out, splits),
                                      q, k, v, variant)
                outs[name] = _run_gqa(q, kr, vr, variant, None, splits)
            record(label, check.passed, check.detail,
                   torch.equal(bits(outs[name]), bits(outs["default"])))

# An output whose rows are not 16-byte aligned (element-wise stores), one split and three.
for splits in (None, 3):
    q, k, v = _mma_inputs(1, 32, 8, 1, 16, 128, F16, gen, DEV, "")
    variant = Variant(causal=True)
    outs = {}
    for name, env in ARM_ENV.items():
        buf = torch.full((q.numel() + 1,), float("nan"), dtype=q.dtype, device=DEV)
        out = buf[1:].view(q.shape)
        with arm(env):
            _run_gqa(q, k, v, variant, out, splits)
        outs[name] = out.clone()
    for name in ARM_ENV:
        passed, err, bound = fa2_criterion(outs[name], reference_attention_variant(q, k, v, variant),
                                           pytorch_attention_variant(q, k, v, variant))
        record(f"unaligned out rows, splits {splits or 'auto'} [{name}]", passed,
               f"max err {err:.2e} <= {bound:.2e}", torch.equal(bits(outs[name]), bits(outs["default"])))

# The paged cache (the lean tail; its copies are never issued early): short and long sequences.
for d, dtype, lens in ((128, F16, [1, 16, 17, 700]), (64, BF16, [16, 5, 300, 64])):
    b, hq, hkv, page = len(lens), 32, 8, 16
    max_pages = math.ceil(max(lens) / page) + 1
    k_pages, v_pages = ops.allocate_paged_kv_cache(b * max_pages, page, hkv, d, dtype, DEV)
    k_pages.normal_(generator=gen)
    v_pages.normal_(generator=gen)
    table = torch.randperm(b * max_pages, device=DEV, generator=gen).view(b, max_pages).int()
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(b, hq, 1, d, device=DEV, generator=gen).to(dtype)
    for splits in (None, 4):
        outs = {}
        for name, env in ARM_ENV.items():
            with arm(env):
                outs[name] = am.paged_decode_attention(q, k_pages, v_pages, table, seq_lens,
                                                       num_splits=splits)
        ref = ops.reference_paged_attention(q, k_pages, v_pages, table, seq_lens)
        kc = ops.gather_pages(k_pages, table, seq_lens)
        vc = ops.gather_pages(v_pages, table, seq_lens)
        yard = pytorch_attention_variant(q, kc, vc, Variant(causal=True, key_lengths=seq_lens))
        for name in ARM_ENV:
            passed, err, bound = fa2_criterion(outs[name], ref, yard)
            record(f"paged D{d} {str(dtype)[6:]} lens {lens} splits {splits or 'auto'} [{name}]", passed,
                   f"max err {err:.2e} <= {bound:.2e}",
                   torch.equal(bits(outs[name]), bits(outs["default"])))
torch.cuda.synchronize()
print(f"[checks] {sum(c['passed'] for c in result['checks'].values())}/{len(result['checks'])} "
      f"passed ({time.time() - t_start:.0f} s)", flush=True)

# A captured lean graph (forced 9 splits) replayed while the key lengths change: sequences of
# one tile (warp 0 alone), none, and long ones; equal to eager default decodes, bit for bit.
b, hq, hkv, sk, d = 3, 32, 4, 3000, 128
q, k, v = (torch.randn(*s, device=DEV, generator=gen).half()
           for s in ((b, hq, 1, d), (b, hkv, sk, d), (b, hkv, sk, d)))
lengths = torch.tensor([100, 1, 2000], dtype=torch.int32, device=DEV)
for left in (True, False):
    variant = Variant(causal=True, key_lengths=lengths, left_padding=left)
    for splits in (9, None):
        outs = [torch.empty_like(q), torch.empty_like(q)]
        with arm(ARM_ENV["default"]):
            graph, _ = capture_graph(lambda: [_run_gqa(q, k, v, variant, o, splits) for o in outs])
        same = True
        for new in ([101, 2, 2001], [16, 0, 3000], [3000, 3000, 1], [7, 8, 9], [17, 16, 15]):
            lengths.copy_(torch.tensor(new, dtype=torch.int32))
            graph.replay()
            eager = _run_gqa(q, k, v, variant, None, splits)   # the default arm
            same &= torch.equal(bits(outs[0]), bits(eager)) and torch.equal(bits(outs[1]), bits(eager))
        torch.cuda.synchronize()
        label = f"graph replays as lengths change [default: rows] left_padding {left} splits {splits or 'auto'}"
        result["checks"][label] = {"passed": bool(same)}
        ok &= bool(same)
        print(f"[checks] {label}: {'ok' if same else 'FAIL'}", flush=True)
dump()
if not ok:
    print("some checks failed: timings follow anyway (for the record), read them with care",
          flush=True)

# ---- timings -------------------------------------------------------------------------------
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

copy_gbps = measure_copy_bandwidth()
result["copy_gbps"] = copy_gbps
print(f"copy bandwidth {copy_gbps:.0f} GB/s", flush=True)


def ours(q, k, v):
    return am.attention(q, k, v, causal=True)


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


SHAPES = [(1, 32, 4, 32768), (1, 32, 8, 32768), (1, 32, 8, 4096), (64, 32, 8, 1024),
          (8, 32, 8, 8192), (4, 32, 8, 1152), (1, 32, 4, 8192), (1, 32, 1, 32768)]
rows = []
for b, hq, hkv, ctx in SHAPES:
    d, dtype = 128, torch.float16
    label = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    kv_bytes = 2 * b * hkv * ctx * d * 2
    g = torch.Generator(device=DEV).manual_seed(1)
    sets = [tuple(t.to(dtype) for t in (torch.randn(b, hq, 1, d, device=DEV, generator=g),
                                        torch.randn(b, hkv, ctx, d, device=DEV, generator=g),
                                        torch.randn(b, hkv, ctx, d, device=DEV, generator=g)))
            for _ in range(max(2, math.ceil(ROTATE_BYTES / kv_bytes)))]
    q, k, v = sets[0]
    splits = am.gqa_num_splits(q, k, causal=True)
    timers = {}
    for name, env in ARM_ENV.items():
        with arm(env):
            timers[name] = graph_per_call_timer(ours, sets)
    timers["cudnn"] = graph_per_call_timer(cudnn, sets)
    samples = interleaved_samples(timers, rounds=ROUNDS)
    times = {n: statistics.median(v) * 1e3 for n, v in samples.items()}
    entry = {"splits": splits, "kv_bytes": kv_bytes, "us": times,
             "us_rounds": {n: [t * 1e3 for t in v] for n, v in samples.items()},
             "bw_fraction": {n: kv_bytes / (t * 1e-6) / 1e9 / copy_gbps for n, t in times.items()},
             "cudnn_over": {n: times["cudnn"] / t for n, t in times.items() if n != "cudnn"}}
    result["shapes"][label] = entry
    rows.append((label, entry))
    print(f"{label} (splits {splits}): " + ", ".join(f"{n} {t:.2f} [{min(entry['us_rounds'][n]):.2f}-{max(entry['us_rounds'][n]):.2f}]" for n, t in times.items())
          + f"  ({time.time() - t_start:.0f} s)", flush=True)
    dump()
    del sets, timers
    torch.cuda.empty_cache()

# The floor: decodes of 16 and 256 keys (L2-resident), a one-element add, cuDNN's decodes.
floors = {}
for ctx in (16, 256):
    g = torch.Generator(device=DEV).manual_seed(2)
    tiny = [tuple(torch.randn(*s, device=DEV, generator=g).half()
                  for s in ((1, 32, 1, 128), (1, 8, ctx, 128), (1, 8, ctx, 128))) for _ in range(4)]
    x = [(torch.ones(1, device=DEV),) for _ in range(4)]
    timers = {"add_1_element": graph_per_call_timer(lambda t: t.add_(1), x)}
    for name, env in ARM_ENV.items():
        with arm(env):
            timers[name] = graph_per_call_timer(ours, tiny)
    timers["cudnn"] = graph_per_call_timer(cudnn, tiny)
    floors[ctx] = {n: t * 1e3 for n, t in interleaved_medians(timers, rounds=ROUNDS).items()}
    result["shapes"][f"floor_b1_hq32_hkv8_ctx{ctx}"] = {"us": floors[ctx]}
    dump()


# The split count at batch 1, 4 KV heads, 32768 keys (default mergers): does cutting the keys
# finer than one block per SM (the hardware scheduler then hands later splits to the SMs that
# finish first) make up for the longer merge?
sweep = {}
b, hq, hkv, ctx, d = 1, 32, 4, 32768, 128
kv_bytes = 2 * b * hkv * ctx * d * 2
g = torch.Generator(device=DEV).manual_seed(3)
sets = [tuple(torch.randn(*sh, device=DEV, generator=g).half()
              for sh in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
        for _ in range(max(2, math.ceil(ROTATE_BYTES / kv_bytes)))]
timers = {}
for splits in (32, 48, 64, 96, 128):
    timers[f"splits{splits}"] = graph_per_call_timer(
        lambda q, k, v, s=splits: _run_gqa(q, k, v, Variant(causal=True), None, s), sets)
timers["cudnn"] = graph_per_call_timer(cudnn, sets)
sweep = {n: t * 1e3 for n, t in interleaved_medians(timers, rounds=ROUNDS).items()}
result["split_sweep_b1_hq32_hkv4_ctx32768"] = {"us": sweep, "bw_fraction": {
    n: kv_bytes / (t * 1e-6) / 1e9 / copy_gbps for n, t in sweep.items()}}
print("split sweep b1 hkv4 ctx32768: " + ", ".join(f"{n} {t:.2f}" for n, t in sweep.items()), flush=True)
del sets, timers
dump()

# ---- table ---------------------------------------------------------------------------------
arms = ["default", "rows1", "m8", "cudnn"]
print("\nus (bw_fraction), fp16 D128, graph replays, caches rotated beyond L2; "
      f"copy {copy_gbps:.0f} GB/s")
print(f"{'shape':28s}" + "".join(f"{a:>16s}" for a in arms) + f"{'rows1/default':>14s}")
for label, entry in rows:
    cells = [f"{entry['us'][a]:8.2f} ({entry['bw_fraction'][a]:.3f})" for a in arms]
    print(f"{label:28s}" + "".join(f"{c:>16s}" for c in cells)
          + f"{entry['us']['rows1'] / entry['us']['default']:14.3f}")
for ctx, floor in floors.items():
    print(f"{f'floor ctx{ctx}':28s}" + "".join(f"{floor[a]:16.2f}" for a in arms)
          + f"{floor['rows1'] / floor['default']:14.3f}   add_1_element {floor['add_1_element']:.2f}")
print(f"checks {'all passed' if ok else 'SOME FAILED'}; {time.time() - t_start:.0f} s in all")
dump()
sys.exit(0 if ok else 1)
