"""common.tools.bench's output side on synthetic points (the sweep itself needs a GPU)."""

from __future__ import annotations

import csv

import pytest

from common.results import REPO_ROOT
from common.tools import bench


def synthetic_points() -> list[bench.Point]:
    points = []
    for dtype in bench.DTYPES:
        for d in bench.HEAD_DIMS:
            for seq in bench.SEQ_LENS:
                for causal in (False, True):
                    for impl, rate in (("task4 kernel", 2.0), ("SDPA flash", 1.0)):
                        points.append(bench.Point("prefill", impl, dtype, bench.TOTAL_TOKENS // seq,
                                                  2048 // d, seq, d, causal, ms=1.0,
                                                  tflops=rate * seq, peak_mem_mb=64.0))
    points.append(bench.Point("prefill", "SDPA math", "fp16", 1, 16, 16384, 128, False,
                              note="skipped: S x S scores too large"))
    for batch in (1, 8):
        for ctx in (512, 2048):
            points.append(bench.Point("decode", "task5 decode kernel", "fp16", batch, 32, ctx, 128,
                                      False, ms=0.1, gbps=1000.0))
    return points


def test_plots_csv_and_headline(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    points = synthetic_points()
    paths = bench.plot(points, 3000.0, "test", "synthetic")
    assert [p.name for p in paths] == ["bench_test_prefill.png", "bench_test_decode.png",
                                       "bench_test_memory.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    bench.write_csv(points, tmp_path / "bench.csv")
    rows = list(csv.DictReader(open(tmp_path / "bench.csv")))
    assert len(rows) == len(points) and rows[-1]["kind"] == "decode"
    best = bench.headline(points)
    assert best["bench.prefill.fp16.d128.noncausal.task4_kernel.max_tflops"] == 2.0 * 16384
    assert not any("SDPA_math" in k for k in best), "a skipped point has no figure"


def test_skip_rules_protect_memory():
    assert bench._skip_reason("SDPA math", 1, 16, 16384, "fp32")
    assert bench._skip_reason("task2 naive CUDA", 4, 32, 8192, "fp32")
    assert not bench._skip_reason("task4 fp32 kernel", 1, 16, 16384, "fp32")


@pytest.mark.gpu
@pytest.mark.timed
def test_the_sweep_runs_on_the_gpu(tmp_path):
    """The sweep itself (`python -m common.tools.bench --quick`: a few points of each curve,
    every implementation), into a scratch results folder. The main job runs the whole sweep
    only with --everything, so this is where every run of the GPU suite exercises it."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "common.tools.bench", "--quick", "--no-record",
                           "--repeats", "3"], cwd=REPO_ROOT, env={**os.environ, "ATTN_RESULTS_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader(open(next(tmp_path.glob("bench_*.csv")))))
    assert {r["kind"] for r in rows} == {"prefill", "decode"}
    assert len(list(tmp_path.glob("bench_*_*.png"))) == 3
