"""Settled tiles: the GQA decode copying its warps' first K/V tiles into shared memory before
waiting for the kernel before (ATTN_GQA_FRESH_KEYS=n: only each sequence's last n keys may be
fresh), and RoPE + append letting the attention start before its own wait
(ATTN_ROPE_RELEASE_EARLY=1); both read when a graph is captured.
(a) decode shapes as CUDA-graph replays against cuDNN, caches rotated beyond L2, arms and cuDNN
in alternating rounds in one process (fresh 0: the graph's previous kernel is the previous
decode, which writes no key); (b) task 6's GQA course model, bf16, CUDA-graph TBT, 3 interleaved
rounds, greedy tokens compared.
    PYTHONPATH=. python .scratch/settled_ab.py   (writes $OUT/settled_ab.json)
"""
import contextlib, json, math, os, statistics, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from common.graphs import graph_per_call_timer
from common.harness import env_setting
from common.timing import interleaved_samples, measure_copy_bandwidth
from task5 import attention as am

am._ext()
OUT = os.environ.get("OUT", ".")
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
       "commit": os.environ.get("ATTN_COMMIT"), "decode": {}, "task6": {}}
t0 = time.time()


@contextlib.contextmanager
def envs(settings):
    with contextlib.ExitStack() as stack:
        for name, value in settings.items():
            stack.enter_context(env_setting(name, value))
        yield


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


DEC_ARMS = {"base": {}, "settled": {"ATTN_GQA_FRESH_KEYS": "0"}}
if "--no-decode" not in sys.argv:
    for dt, b, hq, hkv, ctx in ((torch.float16, 1, 32, 8, 4096), (torch.float16, 1, 32, 4, 32768),
                                (torch.float16, 1, 32, 8, 32768), (torch.float16, 8, 32, 8, 8192),
                                (torch.float16, 64, 32, 8, 1024), (torch.float16, 4, 32, 8, 1074)):
        d = 128
        kv_bytes = 2 * b * hkv * ctx * d * 2
        g = torch.Generator(device="cuda").manual_seed(1)
        sets = [tuple(torch.randn(*s, device="cuda", generator=g).to(dt)
                      for s in ((b, hq, 1, d), (b, hkv, ctx, d), (b, hkv, ctx, d)))
                for _ in range(max(2, math.ceil(256 * 2**20 / kv_bytes)))]
        timers, outs = {}, {}
        for arm, setting in DEC_ARMS.items():
            with envs(setting):
                timers[arm] = graph_per_call_timer(lambda q, k, v: am.attention(q, k, v, causal=True), sets)
                outs[arm] = am.attention(*sets[0], causal=True)
        timers["cudnn"] = graph_per_call_timer(cudnn, sets)
        same = all(torch.equal(outs[a], outs["base"]) for a in DEC_ARMS)
        samples = interleaved_samples(timers, rounds=9, repeats=20)
        us = {n: statistics.median(x) * 1e3 for n, x in samples.items()}
        key = f"{str(dt)[6:]}_b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
        res["decode"][key] = {"us": us, "bits_equal": same,
                              "us_rounds": {n: [t * 1e3 for t in x] for n, x in samples.items()}}
        print(f"{key} (bits equal {same}): " + ", ".join(
            f"{n} {us[n]:.2f} us (cuDNN/this {us['cudnn'] / us[n]:.3f})" for n in us), flush=True)
        del sets, timers, outs
        torch.cuda.empty_cache()

from task6.generate import generate  # noqa: E402
from task6.test import GQA_COURSE, decode_kv_bytes, decode_weight_bytes  # noqa: E402

cfg = GQA_COURSE
model = cfg.build(torch.bfloat16, "cuda")
prompt = cfg.prompt_tokens(torch.Generator(device="cuda").manual_seed(1), "cuda")
ARMS = {"base": {}, "release": {"ATTN_ROPE_RELEASE_EARLY": "1"},
        "settled": {"ATTN_GQA_FRESH_KEYS": "1"},
        "both": {"ATTN_ROPE_RELEASE_EARLY": "1", "ATTN_GQA_FRESH_KEYS": "1"}}
ROUNDS = int(os.environ.get("AB_ROUNDS", "3"))


def run(arm, tokens=100):
    with envs(ARMS[arm]):
        timings = {}
        out = generate(model, prompt, tokens, use_cuda_graph=True, timings=timings)
        return out, timings["tbt_ms"]


ref, _ = run("base")
same = {arm: bool(torch.equal(run(arm)[0], ref)) for arm in ARMS}
copy_gbps = measure_copy_bandwidth()
bytes_ms = (decode_weight_bytes(model) + decode_kv_bytes(cfg, 2)) / copy_gbps / 1e6
tbt = {a: [] for a in ARMS}
for _ in range(ROUNDS):
    for arm in ARMS:
        tbt[arm].append(run(arm)[1])
med = {a: statistics.median(v) for a, v in tbt.items()}
res["task6"] = {"copy_gbps": copy_gbps, "bytes_ms": bytes_ms, "tbt_ms": tbt, "median_ms": med,
                "tokens_equal": same}
print(f"task6 GQA bf16 (bytes roofline {bytes_ms:.3f} ms at {copy_gbps:.0f} GB/s): " + ", ".join(
    f"{a} {med[a]:.3f} ms ({med[a] / bytes_ms:.3f}x, tokens equal {same[a]})" for a in ARMS))
print(f"{time.time() - t0:.0f} s")
json.dump(res, open(os.path.join(OUT, "settled_ab.json"), "w"), indent=1)
