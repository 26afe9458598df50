"""Task 6's GQA course model, bf16: the kernels of decode steps replayed as CUDA graphs, traced
by torch.profiler (CUPTI): per kind of kernel its duration inside the step, and between each
pair of consecutive kinds the time from the end of one to the start of the next (negative
where the overlapped launch started it early). The trace is of the last steps of a
generate(..., 12 tokens); medians over the layers and steps traced. Tracing may itself change
the timing a little; the TBT figures are in the what-if logs beside this one.
    PYTHONPATH=. python .scratch/t6_gqa_step_timeline.py   (writes $OUT/t6_gqa_step_timeline.json)
"""
import collections, json, os, re, statistics
import torch
from torch.profiler import ProfilerActivity, profile
from task6.generate import generate
from task6.test import GQA_COURSE

OUT = os.environ.get("OUT", ".")
cfg, dev = GQA_COURSE, "cuda"
model = cfg.build(torch.bfloat16, dev)
prompt = cfg.prompt_tokens(torch.Generator(device=dev).manual_seed(1), dev)
generate(model, prompt, 4, use_cuda_graph=True)   # warm-up: kernels loaded
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    generate(model, prompt, 12, use_cuda_graph=True)
    torch.cuda.synchronize()
kernels = []
for e in prof.events():
    if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start:
        kernels.append((e.time_range.start, e.time_range.end, e.name))
kernels.sort()


def kind(name):
    if "decode_gqa_kernel" in name:
        return "decode_gqa"
    m = re.search(r"decode_linear_kernel<([^()]*)>", name)
    if m:   # <T, rows, gated, k_splits>: the gated one is the SwiGLU product
        t, rows, gated, splits = [x.strip() for x in m.group(1).split(",")]
        return f"decode_linear<{'gated' if gated == 'true' else 'plain'}, k_splits {splits}>"
    base = re.sub(r"^void ", "", name.replace("(anonymous namespace)::", ""))
    base = re.sub(r"[<(].*", "", base)
    return base.split("::")[-1][:40]


# The decode steps: from the last prefill kernel on (the flash attention of the prompt), the
# kernels between decode attentions belong to the decode steps; keep the last 8 steps' worth.
gqa = [i for i, k in enumerate(kernels) if kind(k[2]) == "decode_gqa"]
layers = cfg.layers if hasattr(cfg, "layers") else 24
start = gqa[-8 * layers] - 3 if len(gqa) >= 8 * layers else gqa[0] - 3
trace = kernels[max(0, start):]
dur = collections.defaultdict(list)
gap = collections.defaultdict(list)
for (s0, e0, n0), (s1, e1, n1) in zip(trace, trace[1:]):
    gap[f"{kind(n0)} -> {kind(n1)}"].append(s1 - e0)
for s, e, n in trace:
    dur[kind(n)].append(e - s)
span = trace[-1][1] - trace[0][0]
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "what": __doc__,
       "commit": os.environ.get("ATTN_COMMIT"), "kernels_traced": len(trace), "span_us": span,
       "duration_us": {k: {"count": len(v), "median": statistics.median(v), "sum": sum(v)} for k, v in dur.items()},
       "end_to_start_us": {k: {"count": len(v), "median": statistics.median(v), "sum": sum(v)} for k, v in gap.items()},
       "names": sorted({n for _, _, n in trace})}
print(f"[timeline] {res['device']}; {len(trace)} kernels over {span:.0f} us (the last ~8 decode steps)")
print("  kind                       count  median us   sum us")
for k, v in sorted(res["duration_us"].items(), key=lambda kv: -kv[1]["sum"]):
    print(f"  {k:26s} {v['count']:5d} {v['median']:10.2f} {v['sum']:8.0f}")
print("  end of one -> start of next   count  median us   sum us")
for k, v in sorted(res["end_to_start_us"].items(), key=lambda kv: -abs(kv[1]["sum"])):
    print(f"  {k:36s} {v['count']:5d} {v['median']:9.2f} {v['sum']:8.0f}")
json.dump(res, open(os.path.join(OUT, "t6_gqa_step_timeline.json"), "w"), indent=1)
