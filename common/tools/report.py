"""Render Results.md from results/<gpu>.json:  python -m common.tools.report

Nothing in Results.md is typed by hand. The sections come from each task's manifest
(`taskN/manifest.py`, MANIFEST.sections: tables of metric names and formats), then the tools'
own sections (compute-sanitizer, grading, the benchmark sweep), then every recorded metric.
With no results at all it renders the blank template students fill in.

    python -m common.tools.report                              # from results/h100.json (or the newest)
    python -m common.tools.report --merge copied/h100.json     # first fold in a file from elsewhere
    python -m common.tools.report --blank                      # the student template
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.report")

import argparse
import sys
from pathlib import Path

from common.manifest import Metric, Section, Table, Text
from common.results import REPO_ROOT, RESULTS_DIR, load, merge
from common.tools.manifests import manifests

RESULTS_MD = REPO_ROOT / "Results.md"
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

    def metric(self, metric: Metric) -> str:
        return self.num(metric.name, metric.fmt, metric.suffix)

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


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _cell(v: View, cell: str | Metric) -> str:
    return v.metric(cell) if isinstance(cell, Metric) else cell


def render_section(v: View, section: Section) -> str:
    """A manifest's section: its title, its intro, its tables and texts (BLANK where empty)."""
    out = [f"### {section.title}\n"]
    if section.intro:
        out.append("".join(_cell(v, piece) for piece in section.intro) + "\n")
    for block in section.blocks:
        if isinstance(block, Text):
            text = v.texts.get(block.key)
            out.append(f"**{block.label}:**\n")
            out.append("```text\n" + text.strip() + "\n```\n" if text else BLANK + "\n")
        elif isinstance(block, Table):
            rows = [[_cell(v, c) for c in row.cells] for row in block.rows
                    if not row.when or v.has(row.when)]
            out.append((_table(block.header, rows) if rows else BLANK) + "\n")
    return "\n".join(out)


# --- the tools' own sections -----------------------------------------------------------------

def _section_sanitizer(v: View) -> str:
    found = sorted(k for k in v.metrics if k.startswith("sanitizer."))
    head = "### compute-sanitizer on every kernel (`python -m common.tools.sanitize`)\n\n"
    if not found:
        return head + BLANK
    tasks = sorted({k.split(".")[1] for k in found})
    tools = sorted({k.split(".")[2] for k in found})
    rows = [[t] + [v.num(f"sanitizer.{t}.{tool}.errors", "{:.0f}") for tool in tools] for t in tasks]
    return (head + "Each task's `--small` checks (every kernel, dtype and mask on tiny shapes) "
            "under each tool; the numbers are the errors it reported.\n\n"
            + _table(["task"] + tools, rows))


def _section_grading(v: View) -> str:
    from common.tools.grade import points_metric

    return ("### Grading (`python -m common.tools.grade`)\n\n"
            + _table(["checkout", "points (of 20)"],
                     [["reference solution (main)", v.num(points_metric("main"), "{:.0f}")],
                      ["student skeleton (release output)",
                       v.num(points_metric("skeleton"), "{:.0f}")]]))


def _section_bench(v: View, key: str) -> str:
    title = "### Benchmark sweep (`python -m common.tools.bench`)\n"
    plots = sorted(RESULTS_DIR.glob(f"bench_{key}_*.png"))
    csv = RESULTS_DIR / f"bench_{key}.csv"
    if not plots and not csv.exists():
        return title + "\n" + BLANK
    out = [title]
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


def _section_main_job(v: View) -> str:
    head = "### The main job (`python -m common.tools.run_all`, from an empty `build/`)\n\n"
    if "run_all.seconds" not in v.metrics:
        return head + BLANK
    summary = v.texts.get("run_all.summary", "").strip("\n").rstrip()  # keep the indentation
    return (head + f"{v.num('run_all.seconds', '{:.0f}')} s in all, "
            f"{v.num('run_all.failed_steps', '{:.0f}')} failed steps, "
            f"{v.num('run_all.targets_missed', '{:.0f}')} targets missed (MISS lines: recorded, "
            "not failures).\n" + (f"\n```text\n{summary}\n```\n" if summary else ""))


TOOL_SECTIONS = ((_section_main_job, ("run_all.",)), (_section_sanitizer, ("sanitizer.",)),
                 (_section_grading, ("grade.",)))


def render_markdown(data: dict | None, key: str) -> str:
    v = View(data)
    meta = v.data.get("meta") or {}
    if meta:
        header = (f"Rendered by `python -m common.tools.report` from `results/{key}.json`. Latest "
                  f"run: {meta.get('device')}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, "
                  f"{meta.get('date')}, commit {meta.get('commit')}. Each section names the "
                  "run(s) it comes from. Do not edit by hand.")
    else:
        header = ("Fill this in by running the tests on your GPU: `python -m common.tools.report` "
                  "renders it from `results/<gpu>.json`, which every `python -m taskN.test` "
                  "run appends to.")
    parts = [f"# Results\n\n{header}\n"]
    sections = [s for m in manifests() for s in m.sections]
    for where, heading in (("course", "## The course's fields\n"), ("beyond", "## Beyond the course\n")):
        parts.append(heading)
        for section in (s for s in sections if s.where == where):
            parts += [render_section(v, section), v.source(*section.sources), ""]
        if where == "beyond":
            for render, prefixes in TOOL_SECTIONS:
                parts += [render(v), v.source(*prefixes), ""]
    parts.append(_section_bench(v, key) + "\n")
    parts.append("## Every recorded metric\n\n" + _section_all(v) + "\n")
    return "\n".join(parts)


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
    parser = argparse.ArgumentParser(prog="python -m common.tools.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
        print(f"[report] merged {len(args.merge)} file(s) into {target}")
        args.source = target
    path = render(args.out, args.source, args.blank)
    print(f"[report] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
