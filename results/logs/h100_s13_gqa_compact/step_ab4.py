"""The GQA decode at head dim 128 in its compact configuration (GqaD128Compact: 4 warps x 4
stages, ~200 registers x 128 threads, so that a block fits on an SM beside two of the products'
blocks) against GqaD128 (8 warps x 3 stages, ~200 x 256 threads, which fits beside none),
chosen per call by ATTN_GQA_COMPACT=1; the split heuristic's geometry cache is cleared at each
switch. Task 6's GQA course model (bf16), CUDA-graph TBT over 100 tokens, and lone decodes
as CUDA-graph replays (caches rotated beyond L2), interleaved rounds, one process.
    PYTHONPATH=. python results/logs/h100_s13_gqa_compact/step_ab4.py   (writes $OUT/step_ab4.json)
"""
import contextlib, json, os, statistics, time
import torch
import task5.attention as t5
from common.graphs import graph_time_per_call_ms
from common.harness import env_setting
from common.timing import measure_copy_bandwidth
from task6.generate import generate
from task6.test import GQA_COURSE, decode_kv_bytes, decode_weight_bytes

OUT = os.environ.get("OUT", ".")
ROUNDS = int(os.environ.get("AB_ROUNDS", "5"))
ARMS = {"base": {}, "compact": {"ATTN_GQA_COMPACT": "1"}}
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
       "commit": os.environ.get("ATTN_COMMIT"), "models": {}, "lone": {}}
t0 = time.time()


@contextlib.contextmanager
def arm(name):
    with contextlib.ExitStack() as stack:
        for key, value in ARMS[name].items():
            stack.enter_context(env_setting(key, value))
        t5._gqa_geometry.cache_clear()
        try:
            yield
        finally:
            t5._gqa_geometry.cache_clear()


copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps
cfg, dtype = GQA_COURSE, torch.bfloat16
model = cfg.build(dtype, "cuda")
prompt = cfg.prompt_tokens(torch.Generator(device="cuda").manual_seed(1), "cuda")


def run(name, tokens=100):
    with arm(name):
        timings = {}
        out = generate(model, prompt, tokens, use_cuda_graph=True, timings=timings)
        return out, timings["tbt_ms"]


ref, _ = run("base")
same = {a: bool(torch.equal(run(a)[0], ref)) for a in ARMS}
bytes_ms = (decode_weight_bytes(model) + decode_kv_bytes(cfg, 2)) / copy_gbps / 1e6
tbt = {a: [] for a in ARMS}
for _ in range(ROUNDS):
    for a in ARMS:
        tbt[a].append(run(a)[1])
med = {a: statistics.median(v) for a, v in tbt.items()}
res["models"]["gqa_bf16"] = {"bytes_ms": bytes_ms, "tbt_ms": tbt, "median_ms": med, "tokens_equal": same}
print(f"gqa_bf16 step (bytes roofline {bytes_ms:.3f} ms at {copy_gbps:.0f} GB/s): " + ", ".join(
    f"{a} {med[a]:.3f} ms ({med[a] / bytes_ms:.3f}x, tokens equal {same[a]})" for a in ARMS), flush=True)
del model
torch.cuda.empty_cache()

gen = torch.Generator(device="cuda").manual_seed(2)
for b, hq, hkv, ctx in ((4, 32, 8, 1074), (1, 32, 8, 32768), (1, 32, 4, 32768), (8, 32, 8, 8192),
                        (64, 32, 8, 1024), (1, 32, 8, 4096)):
    kv_bytes = 2 * b * hkv * ctx * 128 * 2
    n_sets = max(2, -(-100_000_000 // kv_bytes))
    sets = []
    for _ in range(n_sets):
        q = torch.randn(b, hq, 1, 128, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(b, hkv, ctx, 128, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(b, hkv, ctx, 128, device="cuda", dtype=dtype, generator=gen)
        sets.append((q, k, v))
    outs = {}
    for a in ARMS:
        with arm(a):
            outs[a] = t5.decode_attention_grouped(*sets[0])
    bit_equal = bool(torch.equal(outs["base"], outs["compact"]))
    err = (outs["base"].float() - outs["compact"].float()).abs().max().item()
    times = {a: [] for a in ARMS}
    for _ in range(3):
        for a in ARMS:
            with arm(a):
                times[a].append(graph_time_per_call_ms(t5.decode_attention_grouped, sets) * 1e3)
    m = {a: statistics.median(v) for a, v in times.items()}
    label = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
    res["lone"][label] = {"us": times, "median_us": m, "bw_fraction": {a: kv_bytes / (m[a] * 1e3) / copy_gbps for a in ARMS},
                          "max_abs_diff": err}
    print(f"lone {label}: " + ", ".join(f"{a} {m[a]:.2f} us (bw {kv_bytes / (m[a] * 1e3) / copy_gbps:.3f})" for a in ARMS)
          + f"; max |base - compact| {err:.2e}", flush=True)
    del sets, outs
    torch.cuda.empty_cache()
print(f"{time.time() - t0:.0f} s")
json.dump(res, open(os.path.join(OUT, "step_ab4.json"), "w"), indent=1)
