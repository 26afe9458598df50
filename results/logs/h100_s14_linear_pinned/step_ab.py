"""The bf16 decode products (decode_linear, decode_swiglu at M = 4) with their loop and epilogue
pinned in a __noinline__ function (branch linear-pinned, ATTN_LINEAR_VARIANT, read on every
launch, so when a step's graph is captured): 1 pinned alone, 2 pinned + the next kernel let
start once the wait returns, 3 pinned + the first wave's L2 prefetch of its first round, 4
both; against main's kernels (base, SASS unchanged). Task 6's GQA course model and the course
model (MHA), bf16, CUDA-graph TBT over 100 tokens, interleaved rounds, one process, greedy
tokens compared to the base arm's.
    PYTHONPATH=. python results/logs/h100_s14_linear_pinned/step_ab.py   (writes $OUT/step_ab.json)
"""
import contextlib, json, os, statistics, time
import torch
from common.harness import env_setting
from common.timing import measure_copy_bandwidth
from task6.generate import generate
from task6.test import COURSE, GQA_COURSE, decode_kv_bytes, decode_weight_bytes

OUT = os.environ.get("OUT", ".")
ROUNDS = int(os.environ.get("AB_ROUNDS", "5"))
ARMS = {"base": {}, "pinned": {"ATTN_LINEAR_VARIANT": "1"}, "pinned_early": {"ATTN_LINEAR_VARIANT": "2"},
        "pinned_prefetch": {"ATTN_LINEAR_VARIANT": "3"}, "pinned_both": {"ATTN_LINEAR_VARIANT": "4"}}
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
       "commit": os.environ.get("ATTN_COMMIT"), "models": {}}
t0 = time.time()


@contextlib.contextmanager
def envs(settings):
    with contextlib.ExitStack() as stack:
        for name, value in settings.items():
            stack.enter_context(env_setting(name, value))
        yield


copy_gbps = measure_copy_bandwidth()
res["copy_gbps"] = copy_gbps
for label, cfg, dtype in (("gqa_bf16", GQA_COURSE, torch.bfloat16),
                          ("course_bf16", COURSE, torch.bfloat16)):
    model = cfg.build(dtype, "cuda")
    prompt = cfg.prompt_tokens(torch.Generator(device="cuda").manual_seed(1), "cuda")

    def run(arm, tokens=100):
        with envs(ARMS[arm]):
            timings = {}
            out = generate(model, prompt, tokens, use_cuda_graph=True, timings=timings)
            return out, timings["tbt_ms"]

    ref, _ = run("base")
    same = {arm: bool(torch.equal(run(arm)[0], ref)) for arm in ARMS}
    elem = 2 if dtype == torch.bfloat16 else 4
    bytes_ms = (decode_weight_bytes(model) + decode_kv_bytes(cfg, elem)) / copy_gbps / 1e6
    tbt = {a: [] for a in ARMS}
    for _ in range(ROUNDS):
        for arm in ARMS:
            tbt[arm].append(run(arm)[1])
    med = {a: statistics.median(v) for a, v in tbt.items()}
    res["models"][label] = {"bytes_ms": bytes_ms, "tbt_ms": tbt, "median_ms": med, "tokens_equal": same}
    print(f"{label} (bytes roofline {bytes_ms:.3f} ms at {copy_gbps:.0f} GB/s): " + ", ".join(
        f"{a} {med[a]:.3f} ms ({med[a] / bytes_ms:.3f}x, tokens equal {same[a]})" for a in ARMS),
        flush=True)
    del model
    torch.cuda.empty_cache()
print(f"{time.time() - t0:.0f} s")
json.dump(res, open(os.path.join(OUT, "step_ab.json"), "w"), indent=1)
