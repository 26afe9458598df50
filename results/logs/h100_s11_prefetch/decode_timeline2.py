"""Where the GQA decode's time goes: per-block %globaltimer stamps (issue 32; branch gqa-timeline2).

    python .scratch/decode_timeline2.py           # from the repository root; writes $OUT/decode_timeline2.json

Runs task5's decode_attention_gqa_timeline (the GqaTimeline kernel: the default kernel's
body with thread 0 of each block stamping %globaltimer into timeline [blocks][8]; slots in
decode_gqa.cuh, TimelineSlot) eagerly, after warm-up, RUNS times per shape, the caches rotated
beyond L2 as task5/variants_checks.py's gqa bench does (its _mma_inputs, ROTATE_BYTES), with a
synchronize before each launch (so the kernel before it has finished: the start spread is the
launch's own, no overlap with a previous decode). Prints, per shape, medians over the runs of
each figure, and checks the probe's output equals the default kernel's bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from task5 import attention as attention_module  # noqa: E402
from task5.variants_checks import ROTATE_BYTES, _mma_inputs  # noqa: E402

SHAPES = [(4, 32, 8, 1074), (1, 32, 4, 32768), (1, 32, 8, 4096), (1, 32, 8, 32768)]  # first: task 6's GQA step
HEAD_DIM = 128
RUNS = int(os.environ.get("TIMELINE_RUNS", "20"))
WARMUP = 5
SLOTS = ["start", "after_wait", "first_tile", "warp0_loop_end", "loop_end", "partial_done",
         "merge_end", "smid"]   # decode_gqa.cuh's TimelineSlot (loop_end: the warps merged)
S = {name: i for i, name in enumerate(SLOTS)}


def call(ext, q, k, v, num_splits, timeline=None):
    args = (q, k, v, True, None, 1, None, None, False, None, None, None, num_splits, None)
    if timeline is None:
        return ext.decode_attention_gqa(*args)
    return ext.decode_attention_gqa_timeline(*args, timeline)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def analyse(tl: torch.Tensor, kv_bytes: int) -> dict:
    """One run's timeline [blocks][8] (ns) -> its figures (us, GB/s)."""
    t = tl.tolist()
    n = len(t)
    t0 = min(row[S["start"]] for row in t)
    rel = lambda row, s: (row[s] - t0) / 1e3  # noqa: E731  us since the first block's start
    merging = [row for row in t if row[S["merge_end"]] != 0]
    has_tile = [row for row in t if row[S["first_tile"]] != 0]
    ends = [max(row[S["partial_done"]], row[S["merge_end"]]) for row in t]
    loop_end = sorted(rel(row, S["loop_end"]) for row in t)
    first_tile = [rel(row, S["first_tile"]) for row in has_tile]
    starts = [rel(row, S["start"]) for row in t]
    last_loop_end = max(row[S["loop_end"]] for row in t)
    fig = {
        "blocks": n,
        "sms": len({row[S["smid"]] for row in t}),
        "span_us": (max(ends) - t0) / 1e3,
        "start_max_us": max(starts),                       # the last block's start
        "wait_med_us": median([(row[S["after_wait"]] - row[S["start"]]) / 1e3 for row in t]),
        "ramp_med_us": median([(row[S["first_tile"]] - row[S["start"]]) / 1e3 for row in has_tile]),
        "ramp_max_us": max([(row[S["first_tile"]] - row[S["start"]]) / 1e3 for row in has_tile],
                           default=float("nan")),
        "wait_to_first_tile_med_us": median(
            [(row[S["first_tile"]] - row[S["after_wait"]]) / 1e3 for row in has_tile]),
        "first_tile_med_us": median(first_tile),
        "loop_end_min_us": loop_end[0],
        "loop_end_med_us": median(loop_end),
        "loop_end_max_us": loop_end[-1],
        "loop_to_partial_med_us": median(
            [(row[S["partial_done"]] - row[S["loop_end"]]) / 1e3 for row in t]),
        "merges": len(merging),
        "merge_med_us": median([(row[S["merge_end"]] - row[S["partial_done"]]) / 1e3
                                for row in merging]),
        "merge_max_us": max([(row[S["merge_end"]] - row[S["partial_done"]]) / 1e3
                             for row in merging], default=float("nan")),
        "warp0_loop_end_med_us": median([rel(row, S["warp0_loop_end"]) for row in t
                                         if row[S["warp0_loop_end"]] != 0]),
        # the last block's loop end to the end of the kernel's work (merge end; no split merge:
        # the last block's output written)
        "last_loop_end_to_end_us": (max(ends) - last_loop_end) / 1e3,
    }
    streaming = fig["loop_end_med_us"] - fig["first_tile_med_us"]
    fig["stream_us"] = streaming
    fig["implied_gbps"] = kv_bytes / (streaming * 1e-6) / 1e9 if streaming > 0 else float("nan")
    fig["bytes_over_span_gbps"] = kv_bytes / (fig["span_us"] * 1e-6) / 1e9
    return fig


def timer_step(runs: list[torch.Tensor]) -> float:
    """The smallest positive step between distinct stamps of a run (ns): %globaltimer's
    resolution as this GPU updates it (if ~1000 ns, the sub-us figures are quantised)."""
    best = math.inf
    for tl in runs:
        vals = torch.unique(tl[:, :7][tl[:, :7] != 0]).tolist()
        for a, b in zip(vals, vals[1:]):
            best = min(best, b - a)
    return best


def main() -> int:
    start_wall = time.time()
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    ext = attention_module._ext()
    print(f"[timeline] {torch.cuda.get_device_name()}, build/load {time.time() - start_wall:.1f} s")
    report = {"device": torch.cuda.get_device_name(), "runs": RUNS, "slots": SLOTS, "shapes": {}}
    ok_all = True
    for b, hq, hkv, ctx in SHAPES:
        shape = f"b{b}_hq{hq}_hkv{hkv}_ctx{ctx}"
        kv_bytes = 2 * b * hkv * ctx * HEAD_DIM * 2
        sets = [_mma_inputs(b, hq, hkv, 1, ctx, HEAD_DIM, torch.float16, gen, device, "")
                for _ in range(max(2, math.ceil(ROTATE_BYTES / kv_bytes)))]
        q, k, v = sets[0]
        splits = attention_module.gqa_num_splits(q, k, True)
        row_tiles = math.ceil(hq // hkv / 16)
        blocks = b * hkv * splits * row_tiles
        timeline = torch.zeros(blocks, len(SLOTS), dtype=torch.int64, device=device)

        # bit for bit: the probe against the default kernel, every input set
        same = True
        for qs, ks, vs in sets:
            ref = call(ext, qs, ks, vs, splits)
            got = call(ext, qs, ks, vs, splits, timeline)
            same &= torch.equal(ref, got)
        ok_all &= same
        for i in range(WARMUP):
            call(ext, *sets[i % len(sets)], splits, timeline)
        torch.cuda.synchronize()

        raws, figs = [], []
        for r in range(RUNS):
            qs, ks, vs = sets[(r + 1) % len(sets)]   # a set not read by the run before
            timeline.zero_()
            torch.cuda.synchronize()
            call(ext, qs, ks, vs, splits, timeline)
            torch.cuda.synchronize()
            raw = timeline.cpu()
            raws.append(raw)
            figs.append(analyse(raw, kv_bytes))
        med = {key: median([f[key] for f in figs]) for key in figs[0]}
        step = timer_step(raws)
        span_order = sorted(range(RUNS), key=lambda i: figs[i]["span_us"])
        mid = span_order[RUNS // 2]
        t0 = int(raws[mid][:, 0].min())
        rel_raw = [[(x - t0) if (j < 7 and x != 0) else (x if j == 7 else None)
                    for j, x in enumerate(row)] for row in raws[mid].tolist()]
        report["shapes"][shape] = {
            "num_splits": splits, "blocks": blocks, "kv_bytes": kv_bytes,
            "bit_identical_to_default": bool(same), "timer_step_ns": step,
            "median": med, "runs": figs,
            "median_span_run_ns_since_first_start": rel_raw,   # [block][slot], slot 7: smid
        }
        print(f"\n[timeline] fp16 {shape}_d128: {splits} splits, {blocks} blocks on {med['sms']:.0f} "
              f"SMs, {kv_bytes / 2**20:.0f} MiB K+V; probe == default bit for bit: {same}; "
              f"%globaltimer step {step} ns; medians over {RUNS} runs (us from the first block's "
              f"start):")
        print(f"  kernel span (first start -> last end)      {med['span_us']:7.2f}")
        print(f"  last block start                           {med['start_max_us']:7.2f}")
        print(f"  wait for the kernel before (median block)  {med['wait_med_us']:7.2f}")
        print(f"  ramp, start -> first tile (median / max)   {med['ramp_med_us']:7.2f} / "
              f"{med['ramp_max_us']:.2f}   (after wait -> first tile {med['wait_to_first_tile_med_us']:.2f})")
        print(f"  loop end: min / median / max               {med['loop_end_min_us']:7.2f} / "
              f"{med['loop_end_med_us']:.2f} / {med['loop_end_max_us']:.2f}")
        print(f"  warp 0's loop end (median)                 {med['warp0_loop_end_med_us']:7.2f}")
        print(f"  loop end -> partial written + counted      {med['loop_to_partial_med_us']:7.2f}")
        print(f"  merge duration (median / max; {med['merges']:.0f} merges)  {med['merge_med_us']:7.2f} / "
              f"{med['merge_max_us']:.2f}")
        print(f"  last loop end -> kernel's end              {med['last_loop_end_to_end_us']:7.2f}")
        print(f"  streaming (median loop end - median first tile) {med['stream_us']:.2f} us: "
              f"{med['implied_gbps']:.0f} GB/s implied; bytes / span {med['bytes_over_span_gbps']:.0f} GB/s")
        del sets, q, k, v
        torch.cuda.empty_cache()

    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "decode_timeline2.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"\n[timeline] wrote {path}; bit-identical on every shape: {ok_all}; "
          f"{time.time() - start_wall:.1f} s")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
