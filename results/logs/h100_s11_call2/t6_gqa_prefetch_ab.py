"""Branch t6-gqa-oproj-prefetch: task 6's GQA course model, bf16, CUDA-graph TBT over 100 tokens
with o_proj's weight prefetched into L2 during each decode attention (task6.model
O_PROJ_PREFETCH_BYTES: 0 = off, 16 MB, 32 MB = all of it; evict_last or not), one process,
3 interleaved rounds, medians; greedy tokens checked equal to the run without the prefetch.
    PYTHONPATH=. python .scratch/t6_gqa_prefetch_ab.py   (writes $OUT/t6_gqa_prefetch_ab.json)
"""
import json, os, statistics, time
import torch
from common.timing import measure_copy_bandwidth
from task6 import model as tm
from task6.generate import generate
from task6.test import GQA_COURSE, decode_kv_bytes, decode_weight_bytes

OUT = os.environ.get("OUT", ".")
t0 = time.time()
cfg, dev = GQA_COURSE, "cuda"
model = cfg.build(torch.bfloat16, dev)
prompt = cfg.prompt_tokens(torch.Generator(device=dev).manual_seed(1), dev)
ARMS = {"off": (0, False), "16MB": (16 << 20, False), "all": (1 << 40, False),
        "16MB_evict_last": (16 << 20, True), "all_evict_last": (1 << 40, True)}


def run(arm, tokens=100):
    tm.O_PROJ_PREFETCH_BYTES, tm.PREFETCH_EVICT_LAST = ARMS[arm]
    try:
        timings = {}
        out = generate(model, prompt, tokens, use_cuda_graph=True, timings=timings)
        return out, timings["tbt_ms"]
    finally:
        tm.O_PROJ_PREFETCH_BYTES, tm.PREFETCH_EVICT_LAST = 0, False


ref, _ = run("off", 100)
same = {}
for arm in ARMS:
    out, _ = run(arm, 100)
    same[arm] = bool(torch.equal(out, ref))
copy_gbps = measure_copy_bandwidth()
bytes_ms = (decode_weight_bytes(model) + decode_kv_bytes(cfg, 2)) / copy_gbps / 1e6
tbt = {a: [] for a in ARMS}
for _ in range(3):
    for arm in ARMS:
        tbt[arm].append(run(arm)[1])
med = {a: statistics.median(v) for a, v in tbt.items()}
print(f"[prefetch] {torch.cuda.get_device_name()}; bytes roofline {bytes_ms:.3f} ms at {copy_gbps:.0f} GB/s; {time.time() - t0:.0f} s")
for a, t in med.items():
    print(f"  {a:18s} TBT {t:.3f} ms ({t / bytes_ms:.3f}x)  tokens equal to off: {same[a]}  rounds {', '.join(f'{x:.3f}' for x in tbt[a])}")
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
           "commit": os.environ.get("ATTN_COMMIT"), "copy_gbps": copy_gbps, "bytes_ms": bytes_ms,
           "tbt_ms": tbt, "median_ms": med, "tokens_equal": same},
          open(os.path.join(OUT, "t6_gqa_prefetch_ab.json"), "w"), indent=1)
