"""Do task 4's correctness checks pass on every fresh draw? Runs the forward variant sweep, its
short-query cases, the one-row checks and the backward cases (fp32, and fp16/bf16 with the
7-row case at 8 x 16 heads) over many seeds and counts, per check, the draws that failed.
    PYTHONPATH=. python results/logs/h100_s13_flake_sweep/flake_sweep.py   (writes $OUT/flake_sweep.json)"""
import collections
import json
import os
import time

import torch

from task4 import backward_checks as bc
from task4 import variants_checks as vc

device = torch.device("cuda")
ROUND_SCALE = float(os.environ.get("ROUND_SCALE", "1"))


def rounds(label, fn, n, budget_s):
    fails, first, t0, done, checks = collections.Counter(), {}, time.time(), 0, 0
    for i in range(int(n * ROUND_SCALE)):
        if time.time() - t0 > budget_s:
            break
        gen = torch.Generator(device=device)
        gen.manual_seed(7_000_000 + 1000 * len(label) + i)
        for c in fn(gen):
            checks += 1
            if not c.passed:
                fails[c.name] += 1
                first.setdefault(c.name, f"seed {7_000_000 + 1000 * len(label) + i}: {c.detail[:220]}")
        done += 1
    print(f"{label}: {done} draws, {checks} checks, {sum(fails.values())} failed "
          f"({time.time() - t0:.0f} s)", flush=True)
    for name, count in fails.most_common():
        print(f"    {count:4d} x {name}  | first: {first[name]}", flush=True)
    return {"draws": done, "checks": checks, "failures": dict(fails), "first": first}


short = [c for c in vc.SWEEP if c[3] <= 7]
half = [case for dt in (torch.float16, torch.bfloat16) for case in bc._half_cases(dt)]
plan = [
    ("forward sweep", lambda g: vc._sweep_checks(vc.SWEEP, vc.DTYPES, g, device), 100, 120),
    ("forward short-query cases", lambda g: vc._sweep_checks(short, vc.DTYPES, g, device), 1000, 60),
    ("forward one-row", lambda g: vc._one_row_checks(vc.DTYPES, g, device), 200, 30),
    ("backward fp32 cases", lambda g: bc._case_checks(bc.CASES, g, device), 15, 70),
    ("backward fp16/bf16 cases", lambda g: bc._case_checks(half, g, device), 30, 70),
]
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
       "commit": os.environ.get("ATTN_COMMIT"), "groups": {}}
for label, fn, n, budget in plan:
    res["groups"][label] = rounds(label, fn, n, budget)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "flake_sweep.json"), "w"), indent=1)
