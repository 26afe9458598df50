"""A/B of the grouped-query decode's fixed costs (issue 32, branch decode-floor): decode_gqa.cu's
measurement switches against the default and SDPA pinned to cuDNN (enable_gqa), fp16 D 128,
CUDA-graph replays (32 calls per graph), caches rotated beyond L2, one process, interleaved
rounds (common.graphs.graph_per_call_timer + common.timing.interleaved_medians, as
task5/variants_checks.py's gqa-bench).

Arms (each switch is read when a call is made, so it is set while its graph is captured):
  default        as committed
  spread         ATTN_GQA_MERGE=spread: the split merge spread over the split blocks (each waits
                 for its row tile's splits, then merges 1/num_splits of the outputs) instead of
                 the last block reading every split's partials alone
  before         ATTN_GQA_SETUP=before: block geometry and key plan before the wait for the
                 kernel before (off the post-wait critical path)
  spread_before  both
  fill           (only where it changes the split count) the split count that fills the SMs,
                 floor(SMs x blocks/SM / unsplit blocks): b1 32/4 -> 33 splits = 132 blocks
  fill_spread    fill + spread
  cudnn          F.scaled_dot_product_attention(enable_gqa=True) pinned to cuDNN
Floor: b1 32/8 ctx 16 (tiny, L2-resident: the fixed cost of one decode) and a one-element add.

Correctness first (FlashAttention-2's criterion against float64, check_variant: run twice, bit
for bit; and each switch's output bit for bit against the default's: the switches change no
arithmetic), then a captured graph of the spread merge replayed as key lengths change (the
counters must be left at zero by every decode), then the timings.

    PYTHONPATH=. python .scratch/decode_floor_ab.py      (writes $OUT/decode_floor_ab.json)
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
from common.timing import interleaved_medians, measure_copy_bandwidth
from common.variants import Variant, check_variant, reference_attention_variant
from task5 import attention as am
from task5.variants_checks import _mma_inputs, _mma_variant, _run_gqa

am._ext()   # builds the task 5 extension if needed (not counted below)
faulthandler.dump_traceback_later(400, exit=True)  # a hang (a spin that never ends) says where
OUT = os.environ.get("OUT", ".")
DEV = "cuda"
ROUNDS = 7
ROTATE_BYTES = 256 * 2**20
ARM_ENV = {"default": {}, "spread": {"ATTN_GQA_MERGE": "spread"},
           "before": {"ATTN_GQA_SETUP": "before"},
           "spread_before": {"ATTN_GQA_MERGE": "spread", "ATTN_GQA_SETUP": "before"}}
DEFAULT_SPLITS = am.gqa_num_splits
t_start = time.time()
result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
          "checks": {}, "shapes": {}}


def dump():
    with open(os.path.join(OUT, "decode_floor_ab.json"), "w") as f:
        json.dump(result, f, indent=1)


@contextlib.contextmanager
def arm(env: dict, splits: int | None = None):
    """The arm's switches set (and, for `fill`, gqa_num_splits forced) inside the block."""
    with contextlib.ExitStack() as stack:
        for name, value in env.items():
            stack.enter_context(env_setting(name, value))
        if splits is not None:
            am.gqa_num_splits = lambda *a, **kw: splits
        try:
            yield
        finally:
            am.gqa_num_splits = DEFAULT_SPLITS


def fill_splits(q, k) -> int:
    """floor(resident blocks / unsplit blocks) where the default splits at all."""
    base = DEFAULT_SPLITS(q, k, causal=True)
    if base <= 1:
        return base
    _, warps, per_sm = am._gqa_geometry(q.device.index, q.shape[3], q.dtype == torch.bfloat16)
    row_tiles = math.ceil(q.shape[1] // k.shape[1] * q.shape[2] / 16)
    unsplit = q.shape[0] * k.shape[1] * row_tiles
    return max(base, min(am.GQA_MAX_SPLITS, am._num_sms(q.device.index) * per_sm // unsplit))


def spread_engaged(q, k, variant, splits) -> bool:
    """Whether decode_gqa.cu runs the spread merge for this call (its host rule: split, at
    most 128 splits, the whole grid resident at once)."""
    if splits is None:
        splits = DEFAULT_SPLITS(q, k, variant.causal, variant.window, variant.key_lengths)
    _, _, per_sm = am._gqa_geometry(q.device.index, q.shape[3], q.dtype == torch.bfloat16)
    blocks = q.shape[0] * k.shape[1] * math.ceil(q.shape[1] // k.shape[1] * q.shape[2] / 16) * splits
    return 1 < splits <= 128 and blocks <= am._num_sms(q.device.index) * per_sm


# ---- correctness ---------------------------------------------------------------------------
gen = torch.Generator(device=DEV).manual_seed(7)
# (B, H_q, H_kv, S_q, S_k, D, pattern, options, forced split counts)
CASES = [(1, 32, 8, 1, 1, 128, "causal", "", (None,)),
         (1, 32, 8, 1, 16, 128, "causal", "", (None, 3)),
         (2, 32, 4, 1, 1000, 128, "causal", "", (None, 5, 64)),
         (2, 32, 8, 1, 1000, 128, "window", "nan", (None, 7)),
         (4, 32, 4, 1, 1000, 128, "left", "empty nan", (None, 7)),
         (3, 16, 4, 1, 1000, 128, "left-window", "softcap sinks scale nan", (None, 6)),
         (1, 32, 8, 1, 32768, 128, "causal", "", (None,)),
         (1, 32, 4, 1, 32768, 128, "causal", "", (None, 33))]
ok = True
for b, hq, hkv, sq, sk, d, pattern, options, split_list in CASES:
    dtype = torch.float16
    q, k, v = _mma_inputs(b, hq, hkv, sq, sk, d, dtype, gen, DEV, options)
    variant = _mma_variant(pattern, options, b, hq, sq, sk, dtype, gen, DEV)
    kr, vr = k, v   # what the kernel reads: NaN in every key it must not read ("nan")
    if "nan" in options:
        from task5.variants_checks import _poison_unread
        kr, vr = _poison_unread(k, v, variant, sq)
    for splits in split_list:
        outs = {}
        for name, env in ARM_ENV.items():
            with arm(env):
                label = (f"B{b} {hq}/{hkv} Sk{sk} {pattern}{' ' + options if options else ''} "
                         f"splits {splits or 'auto'} [{name}]")
                check = check_variant(label, lambda out: _run_gqa(q, kr, vr, variant, out, splits),
                                      q, k, v, variant)
                outs[name] = _run_gqa(q, kr, vr, variant, None, splits)
            same = torch.equal(outs[name].view(torch.uint8), outs["default"].view(torch.uint8))
            passed = bool(check.passed) and same
            ok &= passed
            result["checks"][label] = {"passed": passed, "detail": check.detail,
                                       "bits_equal_default": same,
                                       "spread_engaged": spread_engaged(q, k, variant, splits)
                                       if "spread" in name else None}
            if not passed:
                print(f"FAIL {label}: {check.detail}; bits equal to default: {same}", flush=True)
torch.cuda.synchronize()
print(f"[checks] {sum(c['passed'] for c in result['checks'].values())}/{len(result['checks'])} "
      f"passed ({time.time() - t_start:.0f} s)", flush=True)

# A captured graph of two spread decodes (forced 9 splits, so every block waits for the others)
# replayed while the key lengths change: equal to eager default decodes, bit for bit.
b, hq, hkv, sk, d = 3, 32, 4, 3000, 128   # 3 x 4 x 9 = 108 blocks: the whole grid resident
q, k, v = (torch.randn(*s, device=DEV, generator=gen).half()
           for s in ((b, hq, 1, d), (b, hkv, sk, d), (b, hkv, sk, d)))
lengths = torch.tensor([100, 1, 2000], dtype=torch.int32, device=DEV)
variant = Variant(causal=True, key_lengths=lengths, left_padding=True)
for name in ("spread", "spread_before"):
    outs = [torch.empty_like(q), torch.empty_like(q)]
    with arm(ARM_ENV[name]):
        graph, _ = capture_graph(lambda: [_run_gqa(q, k, v, variant, o, 9) for o in outs])
    same = True
    for new in ([101, 2, 2001], [1500, 0, 3000], [3000, 3000, 1], [7, 8, 9]):
        lengths.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        eager = _run_gqa(q, k, v, variant, None, 9)
        same &= torch.equal(outs[0], eager) and torch.equal(outs[1], eager)
    torch.cuda.synchronize()
    result["checks"][f"graph replays [{name}]"] = {"passed": bool(same)}
    ok &= bool(same)
    print(f"[checks] graph replays as lengths change [{name}]: {'ok' if same else 'FAIL'}",
          flush=True)
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
          (8, 32, 8, 8192)]
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
    base, fill = DEFAULT_SPLITS(q, k, causal=True), fill_splits(q, k)
    timers, splits_of = {}, {}
    for name, env in ARM_ENV.items():
        with arm(env):
            timers[name] = graph_per_call_timer(ours, sets)
        splits_of[name] = base
    if fill != base:
        for name, env in (("fill", {}), ("fill_spread", ARM_ENV["spread"])):
            with arm(env, splits=fill):
                timers[name] = graph_per_call_timer(ours, sets)
            splits_of[name] = fill
    timers["cudnn"] = graph_per_call_timer(cudnn, sets)
    times = {n: t * 1e3 for n, t in interleaved_medians(timers, rounds=ROUNDS).items()}
    entry = {"splits": splits_of, "kv_bytes": kv_bytes, "us": times,
             "bw_fraction": {n: kv_bytes / (t * 1e-6) / 1e9 / copy_gbps for n, t in times.items()},
             "cudnn_over": {n: times["cudnn"] / t for n, t in times.items() if n != "cudnn"}}
    result["shapes"][label] = entry
    rows.append((label, entry))
    print(f"{label} (splits {base}{f', fill {fill}' if fill != base else ''}): " + ", ".join(
        f"{n} {t:.2f}" for n, t in times.items()) + f"  ({time.time() - t_start:.0f} s)", flush=True)
    dump()
    del sets, timers
    torch.cuda.empty_cache()

# The floor: one decode of 16 keys (L2-resident), a one-element add, cuDNN's decode of 16 keys.
g = torch.Generator(device=DEV).manual_seed(2)
tiny = [tuple(torch.randn(*s, device=DEV, generator=g).half()
              for s in ((1, 32, 1, 128), (1, 8, 16, 128), (1, 8, 16, 128))) for _ in range(4)]
x = [(torch.ones(1, device=DEV),) for _ in range(4)]
timers = {"add_1_element": graph_per_call_timer(lambda t: t.add_(1), x)}
for name in ("default", "before"):
    with arm(ARM_ENV[name]):
        timers[name] = graph_per_call_timer(ours, tiny)
timers["cudnn"] = graph_per_call_timer(cudnn, tiny)
floor = {n: t * 1e3 for n, t in interleaved_medians(timers, rounds=ROUNDS).items()}
result["shapes"]["floor_b1_hq32_hkv8_ctx16"] = {"us": floor}
dump()

# ---- table ---------------------------------------------------------------------------------
arms = ["default", "spread", "before", "spread_before", "fill", "fill_spread", "cudnn"]
print("\nus (bw_fraction), fp16 D128, graph replays, caches rotated beyond L2; "
      f"copy {copy_gbps:.0f} GB/s")
print(f"{'shape':28s}" + "".join(f"{a:>16s}" for a in arms))
for label, entry in rows:
    cells = []
    for a in arms:
        t = entry["us"].get(a)
        cells.append(f"{t:8.2f} ({entry['bw_fraction'][a]:.3f})" if t is not None else "-")
    print(f"{label:28s}" + "".join(f"{c:>16s}" for c in cells))
print(f"{'floor ctx16':28s}" + "".join(
    f"{(f'{floor[a]:8.2f}' if a in floor else '-'):>16s}" for a in arms)
      + f"   add_1_element {floor['add_1_element']:.2f}")
print(f"checks {'all passed' if ok else 'SOME FAILED'}; {time.time() - t_start:.0f} s in all")
dump()
sys.exit(0 if ok else 1)
