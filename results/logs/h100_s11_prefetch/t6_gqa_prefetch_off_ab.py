"""Task 6's GQA course model, bf16, CUDA-graph TBT over 100 new tokens, with the decode
attention's L2 prefetch of its first tiles before its wait (the default) and without it
(ATTN_GQA_PREFETCH=0, read when the step's graph is captured), one process, 3 interleaved
rounds, medians; greedy tokens compared.
    PYTHONPATH=. python .scratch/t6_gqa_prefetch_off_ab.py   (writes $OUT/t6_gqa_prefetch_off_ab.json)
"""
import json, os, statistics, time
import torch
from common.harness import env_setting
from common.timing import measure_copy_bandwidth
from task6.generate import generate
from task6.test import GQA_COURSE, decode_kv_bytes, decode_weight_bytes

OUT = os.environ.get("OUT", ".")
t0 = time.time()
cfg, dev = GQA_COURSE, "cuda"
model = cfg.build(torch.bfloat16, dev)
prompt = cfg.prompt_tokens(torch.Generator(device=dev).manual_seed(1), dev)
ARMS = {"auto": None, "no_prefetch": "0"}


def run(arm, tokens=100):
    with env_setting("ATTN_GQA_PREFETCH", ARMS[arm]):
        timings = {}
        out = generate(model, prompt, tokens, use_cuda_graph=True, timings=timings)
        return out, timings["tbt_ms"]


ref, _ = run("auto")
same = {arm: bool(torch.equal(run(arm)[0], ref)) for arm in ARMS}
copy_gbps = measure_copy_bandwidth()
bytes_ms = (decode_weight_bytes(model) + decode_kv_bytes(cfg, 2)) / copy_gbps / 1e6
tbt = {a: [] for a in ARMS}
for _ in range(3):
    for arm in ARMS:
        tbt[arm].append(run(arm)[1])
med = {a: statistics.median(v) for a, v in tbt.items()}
print(f"[prefetch] {torch.cuda.get_device_name()}; bytes roofline {bytes_ms:.3f} ms at {copy_gbps:.0f} GB/s; {time.time() - t0:.0f} s")
for a, t in med.items():
    print(f"  {a:8s} TBT {t:.3f} ms ({t / bytes_ms:.3f}x)  tokens equal to auto: {same[a]}  rounds {', '.join(f'{x:.3f}' for x in tbt[a])}")
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
           "commit": os.environ.get("ATTN_COMMIT"), "copy_gbps": copy_gbps, "bytes_ms": bytes_ms,
           "tbt_ms": tbt, "median_ms": med, "tokens_equal": same},
          open(os.path.join(OUT, "t6_gqa_prefetch_off_ab.json"), "w"), indent=1)
