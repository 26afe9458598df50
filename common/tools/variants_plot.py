"""The attention-variants plot, drawn from the measured figures in results/<gpu>.json.

    python -m common.tools.variants_plot          # writes results/bench_<gpu>_variants.png

Three panels, every bar a recorded metric (task4.variants.*, task5.gqa.*; nothing typed):
the sliding window against dense causal, strided attention (ours as dense residue classes,
ours with the per-element predicate, SDPA with the materialised mask), and grouped-query
decode (ours on tensor cores, ours on CUDA cores, the best SDPA backend). Results.md shows
every results/bench_<gpu>_*.png (common.tools.report), so rendering picks it up.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.variants_plot")

import argparse
import json
import sys
from pathlib import Path

from common.results import RESULTS_DIR
from task4.manifest import STRIDE_CASES, WINDOW_CASE, variant_prefix
from task5.manifest import GQA_CASE


def _bars(ax, labels, values, title, unit):
    shown = [(label, value) for label, value in zip(labels, values, strict=True) if value is not None]
    if not shown:
        ax.set_visible(False)
        return
    names, heights = zip(*shown, strict=True)
    bars = ax.bar(range(len(names)), heights, color=["#2b6cb0", "#90cdf4", "#a0aec0", "#718096"][:len(names)])
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(unit)
    for bar, value in zip(bars, heights, strict=True):
        ax.annotate(f"{value:.3g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)


def plot(metrics: dict, out: Path) -> bool:
    """Draw the three panels from `metrics`; False (nothing written) when none was measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = variant_prefix(WINDOW_CASE)
    if not any(name.startswith(("task4.variants.", "task5.gqa.")) for name in metrics):
        return False
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    _bars(axes[0], ["dense causal", "window 4096"],
          [metrics.get(f"{window}.dense_causal_ms"), metrics.get(f"{window}.ms")],
          "Sliding window, S 16384 (B1 H32 D128, fp16)", "ms")
    labels, values = [], []
    for case in STRIDE_CASES:
        p = variant_prefix(case)
        n = case.split("_")[0].removeprefix("stride")
        labels += [f"s{n} classes", f"s{n} predicate", f"s{n} SDPA+mask"]
        values += [metrics.get(f"{p}.ms"), metrics.get(f"{p}.predicate_ms"),
                   metrics.get(f"{p}.sdpa_mask_ms")]
    _bars(axes[1], labels, values, "Strided causal, S 4096 (B1 H16 D64, fp16)", "ms")
    _bars(axes[2], ["ours, tensor cores", "ours, CUDA cores", "best SDPA"],
          [metrics.get(f"{GQA_CASE}.us"), metrics.get(f"{GQA_CASE}.cuda_core_us"),
           metrics.get(f"{GQA_CASE}.sdpa_best_us")],
          "GQA decode, 32/4 heads, ctx 32768 (fp16)", "us per step")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.variants_plot",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default=None, help="results/<gpu>.json to read (default: newest)")
    args = parser.parse_args(argv)
    files = ([RESULTS_DIR / f"{args.gpu}.json"] if args.gpu else
             sorted(RESULTS_DIR.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True))
    for path in files:
        if not path.exists():
            continue
        metrics = json.loads(path.read_text()).get("metrics", {})
        out = RESULTS_DIR / f"bench_{path.stem}_variants.png"
        if plot(metrics, out):
            print(f"[variants_plot] wrote {out}")
            return 0
    print("[variants_plot] no task4.variants / task5.gqa figures recorded yet; run "
          "`python -m task4.test --variants-bench --strided` and `python -m task5.test --gqa-bench` on a GPU.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
