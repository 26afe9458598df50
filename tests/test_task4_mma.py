"""Task 4+: the fp16/bf16 tensor-core kernel (task4/flash_attention_mma.cu).

The GPU tests wrap the groups of task4/mma_checks.py (skipped without CUDA). The CPU tests
check what can be checked without a GPU: the modules import without building anything, the
flags, the config mirror against the kernel header, the benchmark's metric names (with a
stand-in extension and clock), and that every group reports, rather than crashes, on a CPU.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from common.checks import Check, assert_checks
from common.timing import Timing
from task4 import bench, mma_checks

REPO_ROOT = Path(__file__).resolve().parent.parent
ISSUE_SHAPES = ("b4_h32_s4096_d128", "b8_h32_s2048_d64")
ISSUE_FIELDS = ("ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn", "tflops", "sdpa_flash_tflops",
                "sdpa_cudnn_tflops")

# --- CPU ----------------------------------------------------------------------------------


def test_flags_parse_and_reject():
    assert mma_checks.parse_configs("0,2") == [0, 2]
    assert mma_checks.parse_dtypes("bf16,fp16") == ["bf16", "fp16"]
    for bad in ("3", "a", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            mma_checks.parse_configs(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        mma_checks.parse_dtypes("fp32")
    parser = argparse.ArgumentParser()
    mma_checks.add_arguments(parser)
    args = parser.parse_args(["--configs", "1,2", "--dtype", "fp16"])
    # dest names that never collide with task4.test's own --configs (the fp32 kernel's)
    assert args.mma_configs == [1, 2] and args.mma_dtypes == ["fp16"]


def test_config_env_is_set_and_restored(monkeypatch):
    monkeypatch.delenv(mma_checks.CONFIG_ENV, raising=False)
    with mma_checks.mma_config(2):
        assert mma_checks.os.environ[mma_checks.CONFIG_ENV] == "2"
    assert mma_checks.CONFIG_ENV not in mma_checks.os.environ
    monkeypatch.setenv(mma_checks.CONFIG_ENV, "1")
    with mma_checks.mma_config(0):
        assert mma_checks.os.environ[mma_checks.CONFIG_ENV] == "0"
    assert mma_checks.os.environ[mma_checks.CONFIG_ENV] == "1"
    with mma_checks.mma_config(None):
        assert mma_checks.os.environ[mma_checks.CONFIG_ENV] == "1"


def test_config_descriptions_mirror_the_kernel_header():
    """CONFIGS (printed by the benchmark) says what flash_attention_mma.cuh compiles."""
    header = (REPO_ROOT / "task4" / "flash_attention_mma.cuh").read_text()
    found = re.findall(r"using ConfigD(\d+)_(\d) = TileConfig<(\d+), (\d+), (\d+), (\d+), "
                       r"(true|false), (true|false), (\d)>;", header)
    assert len(found) == 10, found
    for dim, index, head_dim, block_m, block_n, warps, q_regs, _stats, _ctas in found:
        assert dim == head_dim
        text = mma_checks.CONFIGS.get(int(dim), {}).get(int(index))
        if text is None:  # head dims 32, 96, 192, 256: only config 0, not described
            assert index == "0" and int(dim) not in mma_checks.CONFIGS
            continue
        rows = int(block_m) // int(warps)
        assert text.startswith(f"{block_m}x{block_n}, {warps} warps x {rows} rows"), text
        assert ("Q in registers" in text) == (q_regs == "true"), text


def test_metric_names_are_the_issues():
    assert tuple(mma_checks.shape_label(*s) for s in mma_checks.BENCH_SHAPES) == ISSUE_SHAPES
    assert (mma_checks.metric_prefix("bf16", mma_checks.BENCH_SHAPES[1], True)
            == "task4.mma.bf16.b8_h32_s2048_d64.causal")


class _FakeExt:
    """Computes what the kernel computes (SDPA on the CPU) into `out`."""

    def flash_attention_mma(self, q, k, v, causal=False, out=None):
        result = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                is_causal=causal).to(q.dtype)
        return result if out is None else out.copy_(result)


def test_benchmark_records_every_metric_of_the_issue(monkeypatch):
    """With a stand-in extension and clock, on tiny shapes: the metric names, the acceptance
    checks, and cuDNN reported as unavailable when SDPA refuses it."""
    monkeypatch.setattr(mma_checks, "_ext", lambda: _FakeExt())
    monkeypatch.setattr(mma_checks, "BENCH_SHAPES", ((1, 2, 64, 16), (1, 1, 32, 8)))

    def fake_sdpa(backend, q, k, v, causal):
        if backend == "cudnn":
            return None, "No available kernel"
        return 2.0, F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                   is_causal=causal).to(q.dtype)

    monkeypatch.setattr(mma_checks, "_sdpa_backends", lambda: {"flash": "flash", "cudnn": "cudnn"})
    monkeypatch.setattr(mma_checks, "_time_sdpa", fake_sdpa)
    monkeypatch.setattr(mma_checks, "time_cuda", lambda fn, **kw: (fn(), Timing(1.0, 1, 1, 1, 3))[1])
    checks, metrics, rows = mma_checks.benchmark_rows(configs=[1], seed=0, device="cpu")
    assert_checks(checks)
    labels = [mma_checks.shape_label(*s) for s in mma_checks.BENCH_SHAPES]
    for dtype in ("fp16", "bf16"):
        for label in labels:
            for mask in ("noncausal", "causal"):
                prefix = f"task4.mma.{dtype}.{label}.{mask}"
                for field in ("ratio_vs_sdpa_flash", "tflops", "sdpa_flash_tflops",
                              "config1.tflops", "config1.ratio_vs_sdpa_flash"):
                    assert f"{prefix}.{field}" in metrics, f"{prefix}.{field}"
                assert metrics[f"{prefix}.ratio_vs_sdpa_flash"] == pytest.approx(2.0)
                assert f"{prefix}.ratio_vs_sdpa_cudnn" not in metrics  # unavailable
    assert sum("unavailable" in c.detail for c in checks) == 8
    assert sum(">= 0.9x SDPA flash" in c.name for c in checks) == 8
    assert len(rows) == 16
    table = mma_checks.format_table(rows)
    assert "b1_h2_s64_d16" in table and " - " in table  # cuDNN columns shown as '-'


def test_correctness_and_small_groups_run_end_to_end(monkeypatch):
    """The group logic (cases, poisoned outs, the two-run comparison, per-head references,
    strided views, config switching) on the CPU, with a stand-in extension and small sizes."""
    seen_configs = set()

    class RecordingExt(_FakeExt):
        def flash_attention_mma(self, q, k, v, causal=False, out=None):
            seen_configs.add(mma_checks.os.environ.get(mma_checks.CONFIG_ENV))
            return super().flash_attention_mma(q, k, v, causal, out)

    monkeypatch.setattr(mma_checks, "_ext", lambda: RecordingExt())
    monkeypatch.setattr(mma_checks, "_gpu_only", lambda group, device: None)
    monkeypatch.setattr(mma_checks, "mma_inputs", lambda args=None: ([], {}))
    monkeypatch.setattr(mma_checks, "CORRECTNESS_SEQS", (1, 77))
    monkeypatch.setattr(mma_checks, "CORRECTNESS_DIMS", (64, 80))
    monkeypatch.setattr(mma_checks, "LARGE_SEQ", 50)  # so the two-heads path runs too
    monkeypatch.setattr(mma_checks, "LARGE_BH_CASE", (2, 3, 5, 64))
    monkeypatch.setattr(mma_checks, "SMALL_SEQS", (17,))
    monkeypatch.delenv(mma_checks.CONFIG_ENV, raising=False)
    args = argparse.Namespace(device="cpu", seed=3)
    for group in (mma_checks.mma_small, mma_checks.mma_correctness):
        checks, metrics = group(args)
        assert_checks(checks)
        assert metrics == {}
        assert any("head (1,2) vs float64" in c.name for c in checks) == (group is not
                                                                          mma_checks.mma_small)
        assert any("repeatable" in c.name for c in checks)
    assert any("strided qkv views" in c.name for c in checks)
    assert seen_configs == {None, "0", "1", "2"}
    assert mma_checks.CONFIG_ENV not in mma_checks.os.environ


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report given without a GPU")
def test_groups_report_instead_of_crashing_without_a_gpu():
    for group in (mma_checks.mma_small, mma_checks.mma_correctness, mma_checks.mma_inputs,
                  mma_checks.mma_benchmark):
        checks, metrics = group()
        assert len(checks) == 1 and not checks[0].passed and "GPU" in checks[0].detail
        assert isinstance(checks[0], Check) and metrics == {}
    assert bench.main([]) == 1
    assert mma_checks.main(["--small", "--no-record"]) == 1


# --- GPU: the groups of task4/mma_checks.py ------------------------------------------------


@pytest.mark.gpu
def test_mma_small():
    checks, _ = mma_checks.mma_small()
    assert_checks(checks)


@pytest.mark.gpu
def test_mma_bad_inputs_raise():
    checks, _ = mma_checks.mma_inputs()
    assert_checks(checks)


@pytest.mark.gpu
def test_mma_correctness():
    checks, _ = mma_checks.mma_correctness()
    assert_checks(checks)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_mma_benchmark_meets_the_acceptance():
    checks, metrics = mma_checks.mma_benchmark()
    assert_checks(checks)
    for dtype in ("fp16", "bf16"):
        for shape in ISSUE_SHAPES:
            for mask in ("noncausal", "causal"):
                for field in ("ratio_vs_sdpa_flash", "tflops", "sdpa_flash_tflops"):
                    assert f"task4.mma.{dtype}.{shape}.{mask}.{field}" in metrics
