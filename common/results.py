"""Measured results: record them in results/<gpu>.json, render Results.md from them.

Nothing in Results.md is typed by hand. Tests and benchmarks call `record(...)` with the
figures they measured; `python -m common.results` renders Results.md from every
`results/*.json`. With no results at all it renders the blank template students fill in.

File shape (one file per GPU model, e.g. results/h100.json):
    {"meta":    {device, torch, cuda, date, commit}          # the latest run
     "metrics": {name: number}, "texts": {name: str},
     "runs":    [{meta of each run}], "metric_run": {name: index into runs}}
so every number can be traced to the run (device, torch, date, commit) that produced it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(os.environ.get("ATTN_RESULTS_DIR", REPO_ROOT / "results"))
RESULTS_MD = REPO_ROOT / "Results.md"


# --- recording ---------------------------------------------------------------------------

def device_key() -> str:
    """Short lower-case GPU model ('h100', 'h200', 'a100', 'rtx4090'), or 'cpu'."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    found = re.search(r"\b([a-z]{1,3}\d{2,4}[a-z]?)\b", name.replace("nvidia", ""))
    return found.group(1) if found else re.sub(r"[^a-z0-9]+", "_", name).strip("_")


def run_meta() -> dict:
    import torch

    # ATTN_COMMIT names the commit where the checkout has no .git (a copied working tree).
    commit = os.environ.get("ATTN_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                                    capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
    meta = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or "unknown",
    }
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    return meta


def results_path(key: str | None = None) -> Path:
    return RESULTS_DIR / f"{key or device_key()}.json"


def load(path: Path) -> dict:
    if not path.exists():
        return {"meta": {}, "metrics": {}, "texts": {}, "runs": [], "metric_run": {}}
    data = json.loads(path.read_text())
    for key, empty in (("metrics", {}), ("texts", {}), ("runs", []), ("metric_run", {})):
        data.setdefault(key, empty)
    return data


def record(metrics: dict[str, float] | None = None, texts: dict[str, str] | None = None,
           path: Path | None = None) -> Path:
    """Merge measured figures into results/<gpu>.json under this run's meta; return the path."""
    path = path or results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = load(path)
    meta = run_meta()
    if not data["runs"] or data["runs"][-1] != meta:
        data["runs"].append(meta)
    run_index = len(data["runs"]) - 1
    data["meta"] = meta
    for name, value in (metrics or {}).items():
        data["metrics"][name] = float(value)
        data["metric_run"][name] = run_index
    for name, text in (texts or {}).items():
        data["texts"][name] = str(text)
        data["metric_run"][name] = run_index
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def merge(sources: list[Path], path: Path) -> Path:
    """Fold results files measured elsewhere (e.g. copied back from a GPU machine) into `path`,
    keeping each figure's own run (device, torch, date, commit); where both hold a figure,
    the one measured later wins."""
    data = load(path)
    for source in sources:
        other = load(source)
        for name in list(other["metrics"]) + list(other["texts"]):
            meta = other["runs"][other["metric_run"][name]]
            if name in data["metric_run"]:
                mine = data["runs"][data["metric_run"][name]]
                if mine.get("date", "") > meta.get("date", ""):
                    continue
            if meta not in data["runs"]:
                data["runs"].append(meta)
            data["metric_run"][name] = data["runs"].index(meta)
            if name in other["metrics"]:
                data["metrics"][name] = other["metrics"][name]
            else:
                data["texts"][name] = other["texts"][name]
        data["meta"] = max([data["meta"], other["meta"]], key=lambda m: m.get("date", ""))
    used = sorted(set(data["metric_run"].values()))   # drop runs no figure points at any more
    data["runs"] = [data["runs"][i] for i in used]
    data["metric_run"] = {k: used.index(i) for k, i in data["metric_run"].items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


# --- rendering ---------------------------------------------------------------------------

BLANK = "_not measured yet_"


class View:
    """Formatting access to one results file (or to none: the blank template)."""

    def __init__(self, data: dict | None):
        self.data = data or {"meta": {}, "metrics": {}, "texts": {}, "runs": [], "metric_run": {}}
        self.metrics = self.data["metrics"]
        self.texts = self.data["texts"]

    def num(self, name: str, fmt: str = "{:.2f}", suffix: str = "") -> str:
        value = self.metrics.get(name)
        return BLANK if value is None else fmt.format(value) + suffix

    def has(self, prefix: str) -> bool:
        return any(k.startswith(prefix) for k in list(self.metrics) + list(self.texts))

    def source(self, *prefixes: str) -> str:
        """'measured on <device>, torch X, <date>, commit Y' for the runs behind a section."""
        runs = self.data["runs"]
        idx = sorted({i for k, i in self.data["metric_run"].items() if k.startswith(prefixes)})
        if not idx:
            return ""
        parts = []
        for i in idx:
            r = runs[i]
            parts.append(f"{r.get('device')}, torch {r.get('torch')}, CUDA {r.get('cuda')}, "
                         f"{r.get('date')}, commit {r.get('commit')}")
        return "\n_Measured on " + "; ".join(dict.fromkeys(parts)) + "._"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _section_task4(v: View) -> str:
    rows = []
    for shape, label in (("b4_s128", "(4, 128)"), ("b64_s4096", "(64, 4096)")):
        rows.append([label] + [v.num(f"task4.speedup.{m}.{shape}", "{:.2f}", "x")
                               for m in ("noncausal", "causal")])
    return ("### Task 4: fused FlashAttention-2 (fp32) vs nn.MultiheadAttention, whole module\n\n"
            "hidden 4096, 32 heads (head_dim 128); speedup = nn.MultiheadAttention time / ours "
            "(median of CUDA-event timings, projections included in both).\n\n"
            + _table(["(B, S)", "non-causal speedup", "causal speedup"], rows))


def _section_task5(v: View) -> str:
    rows = [[v.num("task5.speedup.ttft", "{:.2f}", "x"), v.num("task5.speedup.tbt", "{:.2f}", "x")]]
    return ("### Task 5: KV cache (B 16, hidden 4096, 32 heads, prompt 1024, 100 decode steps)\n\n"
            "TTFT speedup: prefill with the task 4 kernel vs nn.MultiheadAttention. TBT speedup: "
            "one decode step with the KV cache vs recomputing nn.MultiheadAttention over the "
            "whole sequence.\n\n" + _table(["TTFT speedup", "TBT speedup"], rows))


def _section_task6(v: View) -> str:
    rows = []
    for dtype in ("fp32", "bf16"):
        rows.append([dtype, v.num(f"task6.{dtype}.ttft_ms", "{:.1f}"),
                     v.num(f"task6.{dtype}.tbt_ms", "{:.2f}"),
                     v.num(f"task6.{dtype}.tbt_over_roofline", "{:.2f}", "x")])
    return ("### Task 6: dummy LLM (B 4, prompt 1024, hidden 4096, 32 heads, 24 layers, "
            "vocab 8192, 100 greedy tokens)\n\n"
            + _table(["dtype", "TTFT (ms)", "TBT (ms)", "TBT / weight-read time"], rows))


def _section_task7(v: View) -> str:
    out = ["### Task 7: GPT-2 generation with our kernels\n"]
    for key, label in (("task7.text.sampled", "Sampled (top-k 10, temperature 0.95)"),
                       ("task7.text.greedy", "Greedy")):
        text = v.texts.get(key)
        out.append(f"**{label}:**\n")
        out.append("```text\n" + text.strip() + "\n```\n" if text else BLANK + "\n")
    out.append(_table(["our TBT (ms)", "HF generate TBT (ms)", "speedup"],
                      [[v.num("task7.tbt_ms"), v.num("task7.ref_tbt_ms"),
                        v.num("task7.speedup_vs_ref.tbt", "{:.2f}", "x")]]))
    return "\n".join(out)


def _section_kernels(v: View) -> str:
    out = ["### Kernel alone vs PyTorch SDPA (same inputs, same run)\n",
           "TFLOP/s = 4·B·H·S²·D / time (halved when causal); ratio = our throughput / the "
           "peer's (> 1 means faster).\n"]
    rows = []
    for shape in ("b64_h32_s4096_d128", "b4_h32_s128_d128"):
        for mask in ("noncausal", "causal"):
            p = f"task4.fp32.{shape}.{mask}"
            if v.has(p):
                rows.append(["fp32 course kernel", shape, mask, v.num(f"{p}.tflops", "{:.1f}"),
                             "SDPA efficient", v.num(f"{p}.sdpa_efficient_tflops", "{:.1f}"),
                             v.num(f"{p}.ratio_vs_sdpa_efficient", "{:.2f}", "x")])
    for dtype in ("fp16", "bf16"):
        for shape in ("b4_h32_s4096_d128", "b8_h32_s2048_d64"):
            for mask in ("noncausal", "causal"):
                p = f"task4.mma.{dtype}.{shape}.{mask}"
                for peer in ("flash", "cudnn"):
                    if v.has(f"{p}.sdpa_{peer}_tflops"):
                        rows.append([f"{dtype} tensor-core kernel", shape, mask,
                                     v.num(f"{p}.tflops", "{:.1f}"), f"SDPA {peer}",
                                     v.num(f"{p}.sdpa_{peer}_tflops", "{:.1f}"),
                                     v.num(f"{p}.ratio_vs_sdpa_{peer}", "{:.2f}", "x")])
    if not rows:
        return "\n".join(out) + "\n" + BLANK
    return "\n".join(out) + "\n" + _table(
        ["kernel", "shape", "mask", "ours TFLOP/s", "peer", "peer TFLOP/s", "ratio"], rows)


def _section_decode(v: View) -> str:
    rows = []
    for shape in ("b1_h32_ctx4096_d128", "b1_h32_ctx32768_d128", "b16_h32_ctx2048_d128"):
        p = f"task5.decode.fp16.{shape}"
        if v.has(p):
            rows.append([shape, v.num(f"{p}.ms", "{:.4f}"), v.num(f"{p}.gbps", "{:.0f}"),
                         v.num(f"{p}.bw_fraction", "{:.2f}"), v.num(f"{p}.sdpa_best_ms", "{:.4f}"),
                         v.num(f"{p}.ratio_vs_sdpa_best", "{:.2f}", "x")])
    head = ("### Decode kernel (fp16, one query against the cache)\n\n"
            f"Copy bandwidth measured in the same run: {v.num('task5.copy_gbps', '{:.0f}')} GB/s "
            "(read + write). bw fraction = KV bytes read per second / copy bandwidth.\n\n")
    if not rows:
        return head + BLANK
    return head + _table(["shape", "ms", "GB/s", "bw fraction", "best SDPA ms", "speedup vs SDPA"], rows)


def _section_grading(v: View) -> str:
    return ("### Grading (`python -m common.grade`)\n\n"
            + _table(["checkout", "points (of 20)"],
                     [["reference solution (main)", v.num("grade.main.points", "{:.0f}")],
                      ["student skeleton (release output)", v.num("grade.skeleton.points", "{:.0f}")]]))


def _section_sanitizer(v: View) -> str:
    found = sorted(k for k in v.metrics if k.startswith("sanitizer."))
    head = "### compute-sanitizer on every kernel (`python -m common.sanitize`)\n\n"
    if not found:
        return head + BLANK
    tasks = sorted({k.split(".")[1] for k in found})
    tools = sorted({k.split(".")[2] for k in found})
    rows = [[t] + [v.num(f"sanitizer.{t}.{tool}.errors", "{:.0f}") for tool in tools] for t in tasks]
    return (head + "Each task's `--small` checks (every kernel, dtype and mask on tiny shapes) "
            "under each tool; the numbers are the errors it reported.\n\n"
            + _table(["task"] + tools, rows))


def _section_bench(v: View, key: str) -> str:
    plots = sorted(RESULTS_DIR.glob(f"bench_{key}_*.png"))
    csv = RESULTS_DIR / f"bench_{key}.csv"
    if not plots and not csv.exists():
        return "### Benchmark sweep (`python -m common.bench`)\n\n" + BLANK
    out = ["### Benchmark sweep (`python -m common.bench`)\n"]
    if csv.exists():
        out.append(f"Raw table: [{csv.relative_to(REPO_ROOT)}]({csv.relative_to(REPO_ROOT)})\n")
    for p in plots:
        rel = p.relative_to(REPO_ROOT)
        out.append(f"![{p.stem}]({rel})\n")
    return "\n".join(out)


def _section_all(v: View) -> str:
    if not v.metrics:
        return BLANK
    rows = [[f"`{k}`", f"{val:.6g}"] for k, val in sorted(v.metrics.items())]
    return _table(["metric", "value"], rows)


def render_markdown(data: dict | None, key: str) -> str:
    v = View(data)
    meta = v.data.get("meta") or {}
    if meta:
        header = (f"Rendered by `python -m common.results` from `results/{key}.json`. Latest run: "
                  f"{meta.get('device')}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, "
                  f"{meta.get('date')}, commit {meta.get('commit')}. Each section names the "
                  "run(s) it comes from. Do not edit by hand.")
    else:
        header = ("Fill this in by running the tests on your GPU: `python -m common.results` "
                  "renders it from `results/<gpu>.json`, which every `python -m taskN.test` "
                  "run appends to.")
    parts = [f"# Results\n\n{header}\n", "## The course's fields\n"]
    course = ((_section_task4, ("task4.speedup",)), (_section_task5, ("task5.speedup",)),
              (_section_task6, ("task6.",)), (_section_task7, ("task7.",)))
    extended = ((_section_kernels, ("task4.fp32", "task4.mma")),
                (_section_decode, ("task5.decode", "task5.copy")),
                (_section_sanitizer, ("sanitizer.",)), (_section_grading, ("grade.",)))
    for heading, sections in ((None, course), ("## Beyond the course\n", extended)):
        if heading:
            parts.append(heading)
        for section, prefixes in sections:
            parts.append(section(v))
            parts.append(v.source(*prefixes))
            parts.append("")
    parts.append(_section_bench(v, key) + "\n")
    parts.append("## Every recorded metric\n\n" + _section_all(v) + "\n")
    return "\n".join(p for p in parts if p is not None)


def primary_results_file() -> Path | None:
    """The file Results.md is rendered from: the H100's if present, else the newest."""
    files = sorted(RESULTS_DIR.glob("*.json"))
    files = [f for f in files if not f.name.startswith(("bench_", "grade_"))]
    if not files:
        return None
    for f in files:
        if f.stem == "h100":
            return f
    return max(files, key=lambda f: f.stat().st_mtime)


def render(out: Path = RESULTS_MD, source: Path | None = None, blank: bool = False) -> Path:
    source = None if blank else (source or primary_results_file())
    data = load(source) if source else None
    key = source.stem if source else "gpu"
    out.write_text(render_markdown(data, key))
    return out


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m common.results",
                                     description="Render Results.md from results/<gpu>.json.")
    parser.add_argument("--source", type=Path, help="results JSON to render (default: h100 or newest)")
    parser.add_argument("--out", type=Path, default=RESULTS_MD)
    parser.add_argument("--blank", action="store_true", help="render the blank student template")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                        help="first fold these results files (e.g. copied from a GPU machine) "
                             "into --source (default results/<their gpu>.json)")
    args = parser.parse_args(argv)
    if args.merge:
        target = args.source or RESULTS_DIR / f"{args.merge[0].stem.split('_')[0]}.json"
        merge(args.merge, target)
        print(f"[results] merged {len(args.merge)} file(s) into {target}")
        args.source = target
    path = render(args.out, args.source, args.blank)
    print(f"[results] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
