"""The shared machinery in common/: checks, results, timing, build errors, the test harness."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from common import checks, results
from common.checks import Check
from common.harness import task_main
from common.timing import attention_flops, time_cpu
from common.tools import report


def test_reference_attention_matches_a_hand_written_softmax():
    q, k, v = checks.random_qkv(2, 3, 5, 4, device="cpu")
    scores = (q.double() @ k.double().transpose(-2, -1)) / 2.0
    scores = scores.masked_fill(torch.triu(torch.ones(5, 5, dtype=torch.bool), 1), -math.inf)
    expected = torch.softmax(scores, -1) @ v.double()
    assert torch.allclose(checks.reference_attention(q, k, v, causal=True), expected)


def test_causal_mask_is_bottom_right_aligned_for_decode():
    keep = checks.causal_keep_mask(1, 7)
    assert keep.all(), "a single decode query must see every cached key"
    assert torch.equal(checks.causal_keep_mask(3, 3), torch.tril(torch.ones(3, 3, dtype=torch.bool)))


def test_an_unwritten_poisoned_element_fails_the_check():
    ref = torch.randn(4, 4, dtype=torch.float64)
    out = ref.float().clone()
    out[1, 2] = float("nan")
    check = checks.check_relative("poison", out, ref, torch.float32)
    assert not check.passed and checks.relative_error(out, ref) == math.inf


def test_unwritten_tells_an_untouched_output_from_a_computed_nan():
    out = checks.poisoned_empty(3, 5, dtype=torch.float32, device="cpu")
    assert checks.unwritten(out)
    computed_nan = torch.full((3, 5), 0x7FFFFFFF, dtype=torch.int32).view(torch.float32)
    assert computed_nan.isnan().all() and not checks.unwritten(computed_nan)
    one_written = out.clone()
    one_written[2, 4] = 1.0
    assert not checks.unwritten(one_written)
    scores = torch.randn(2, 4, 4)
    assert checks.unwritten(scores.clone(), scores) and not checks.unwritten(scores * 0.5, scores)
    assert checks.unwritten(checks.poisoned_empty(4, dtype=torch.bfloat16, device="cpu"))
    assert not checks.unwritten(torch.empty(0))


def test_a_small_error_passes_and_a_large_one_fails():
    ref = torch.randn(64, 64, dtype=torch.float64)
    assert checks.check_relative("ok", ref.float(), ref, torch.float32).passed
    assert not checks.check_relative("bad", (ref * 1.01).float(), ref, torch.float32).passed


def test_check_raises_needs_the_right_exception():
    assert checks.check_raises("ok", lambda: (_ for _ in ()).throw(ValueError("bad shape"))).passed
    assert not checks.check_raises("none", lambda: None).passed
    assert not checks.check_raises("wrong", lambda: 1 / 0).passed


def test_results_record_then_render(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(report, "RESULTS_DIR", tmp_path)
    path = results.record({"task4.speedup.causal.b64_s4096": 1.234,
                           "task5.speedup.tbt": 7.5}, {"task7.text.greedy": "Hello"},
                          path=tmp_path / "h100.json")
    data = json.loads(path.read_text())
    assert data["metrics"]["task5.speedup.tbt"] == 7.5 and data["runs"][0]["torch"]
    text = report.render_markdown(results.load(path), "h100")
    assert "1.23x" in text and "7.50x" in text and "Hello" in text
    assert "torch " + torch.__version__ in text


def test_blank_template_has_no_numbers():
    text = report.render_markdown(None, "gpu")
    assert report.BLANK in text and "x |" not in text


def test_time_cpu_reports_a_median():
    t = time_cpu(lambda: sum(range(1000)), repeats=5)
    assert t.repeats == 5 and 0 < t.min_ms <= t.median_ms <= t.p90_ms


def test_attention_flops_halves_when_causal():
    full = attention_flops(4, 32, 4096, 4096, 128, causal=False)
    assert full == 4 * 4 * 32 * 4096**2 * 128
    assert attention_flops(4, 32, 4096, 4096, 128, causal=True) == full / 2


def test_task_main_exits_nonzero_when_a_check_fails(capsys):
    groups = {"good": lambda a: ([Check("a", True)], {}), "bad": lambda a: ([Check("b", False)], {})}
    assert task_main("demo", groups, ["--good", "--no-record"]) == 0
    assert task_main("demo", groups, ["--no-record"]) == 1
    assert "FAIL  b" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_build_without_cuda_is_one_clear_sentence():
    from common.build import BuildError, load_extension

    with pytest.raises(BuildError) as info:
        load_extension("nothing", ["task1/attention.py"])
    message = str(info.value)
    assert "\n" not in message and ("CPU-only" in message or "No CUDA GPU" in message)


def test_merge_keeps_the_newer_figure_and_its_run(tmp_path):
    def results_file(name, date, metrics):
        path = tmp_path / name
        path.write_text(json.dumps({"meta": {"date": date}, "metrics": metrics, "texts": {},
                                    "runs": [{"date": date}], "metric_run": {k: 0 for k in metrics}}))
        return path

    newer = results_file("newer.json", "2026-11-22 07:00 UTC", {"a": 2.0})
    older = results_file("older.json", "2026-11-22 06:00 UTC", {"a": 1.0, "b": 3.0})
    merged = json.loads(results.merge([newer, older], tmp_path / "h100.json").read_text())
    assert merged["metrics"] == {"a": 2.0, "b": 3.0}
    assert merged["runs"][merged["metric_run"]["a"]]["date"] == "2026-11-22 07:00 UTC"
    assert merged["runs"][merged["metric_run"]["b"]]["date"] == "2026-11-22 06:00 UTC"


def test_token_timing_from_marks():
    from common.timing import TokenClock, TokenTiming

    timing = TokenTiming.from_marks([10.0, 12.0, 15.0, 16.0])
    assert timing.ttft_ms == 10.0 and timing.step_ms == [2.0, 3.0, 1.0]
    assert timing.tbt_ms == 2.0 and timing.steps == 4
    clock = TokenClock("cpu", capacity=2)
    clock.start()
    clock.mark()
    clock.mark()
    first, second = clock.times_ms()
    assert 0 <= first <= second
    with pytest.raises(RuntimeError):
        clock.mark()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
@pytest.mark.parametrize("task", [1, 3, 7])
def test_asking_for_cuda_without_a_gpu_is_one_sentence(task):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", f"task{task}.test", "--device", "cuda",
                           "--no-record"], capture_output=True, text=True, timeout=300)
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 1 and "Traceback" not in output, output[-2000:]
    assert len(output.splitlines()) == 1 and "NVIDIA GPU" in output


def test_device_problem_accepts_the_cpu_and_names_a_bad_device():
    from common.harness import device_problem

    assert device_problem(None) is None and device_problem("cpu") is None
    assert "not a device torch knows" in device_problem("gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_a_gpu_only_test_without_a_gpu_is_one_sentence_and_runs_nothing(tmp_path, capsys):
    ran = []

    def kernel_group(args):
        ran.append(args)
        return [Check("kernel", True)], {}

    groups = {"kernel": kernel_group}
    report = tmp_path / "report.json"
    assert task_main("demo", groups, ["--no-record", "--json", str(report)], gpu_only=True) == 1
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "needs an NVIDIA GPU" in out and "FAIL" not in out
    assert "CPU-only" in out or "no CUDA GPU" in out
    data = json.loads(report.read_text())   # the grader's reason is the check's detail
    assert data["exit_code"] == 1 and data["checks"][0]["detail"] in out
    assert task_main("demo", groups, ["--no-record", "--device", "cpu"], gpu_only=True) == 1
    assert "--device cpu" in capsys.readouterr().out and not ran


def test_checkout_commit_names_a_modified_tree(tmp_path, monkeypatch):
    """The commit recorded beside the figures: ATTN_COMMIT when set, else HEAD, marked
    "+modified" when tracked files differ from it (a working tree copied over an older checkout
    must not pass for that checkout), "unknown" outside git."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed here")
    monkeypatch.delenv("ATTN_COMMIT", raising=False)
    assert results.checkout_commit(tmp_path) == "unknown"

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True,
                       env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                            "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path), "PATH": os.environ["PATH"]})

    git("init", "-q")
    (tmp_path / "kernel.cu").write_text("a\n")
    git("add", "kernel.cu")
    git("commit", "-q", "-m", "first")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    assert results.checkout_commit(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked files do not count\n")
    assert results.checkout_commit(tmp_path) == head
    (tmp_path / "kernel.cu").write_text("b\n")
    assert results.checkout_commit(tmp_path) == head + "+modified"
    monkeypatch.setenv("ATTN_COMMIT", "abc1234")
    assert results.checkout_commit(tmp_path) == "abc1234"
