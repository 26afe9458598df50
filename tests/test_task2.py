"""Task 2: naive CUDA attention. The GPU tests run task2.test's groups; the rest run anywhere."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest
import torch

from common.checks import assert_checks
from task2 import attention as task2_attention
from task2 import test as task2_test

TASK2 = Path(__file__).resolve().parent.parent / "task2"


# --- on a GPU: the same groups as `python -m task2.test` (the first one builds the extension)

@pytest.mark.gpu
def test_task2_small():
    checks, _ = task2_test.small_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task2_inputs():
    checks, _ = task2_test.inputs_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task2_softmax():
    checks, _ = task2_test.softmax_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task2_gemm():
    checks, _ = task2_test.gemm_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task2_attention():
    checks, _ = task2_test.attention_group()
    assert_checks(checks)


# --- anywhere ----------------------------------------------------------------------------

def test_task2_groups_are_the_documented_flags():
    assert set(task2_test.GROUPS) == {"softmax", "gemm", "attention", "small", "inputs"}


def test_task2_course_shapes_are_tested():
    softmax = {(shape, dim) for shape, dim, _, _ in task2_test.SOFTMAX_CASES}
    assert {((4, 10, 10), -1), ((4, 5, 5), -2), ((4, 1000, 1000), -1)} <= softmax
    gemm = {(layout, a, b) for layout, a, b, _, _ in task2_test.GEMM_CASES}
    assert {("nn", (4, 10, 10), (4, 10, 10)), ("nn", (4, 1000, 1000), (4, 1000, 1000)),
            ("nn", (4, 1000, 500), (4, 500, 300))} <= gemm
    cases = {(c.batch, c.seq, c.causal) for c in task2_test.COURSE_CASES}
    assert cases == {(4, 10, False), (4, 10, True), (16, 100, False), (16, 100, True)}
    assert (task2_test.HIDDEN, task2_test.HEADS) == (128, 8)


def test_task2_module_rejects_heads_that_do_not_divide_hidden():
    w = torch.zeros(10, 10)
    with pytest.raises(ValueError, match="divisible"):
        task2_attention.CustomSelfAttention(w, w, w, w, 10, 3)


def test_task2_not_implemented_reads_as_not_implemented(monkeypatch):
    """The skeleton's TORCH_CHECK(false, "... not implemented yet") becomes NotImplementedError,
    which the course harness reports as a failed check instead of crashing."""

    class Skeleton:
        def custom_attention(self, *args):
            raise RuntimeError("Task 2: custom_attention is not implemented yet\nException raised ...")

        def softmax(self, *args):
            raise RuntimeError("softmax_kernel failed to launch: invalid configuration argument")

    monkeypatch.setattr(task2_attention, "load", lambda: Skeleton())
    x = torch.zeros(1, 2, 8)
    with pytest.raises(NotImplementedError, match="Task 2: custom_attention is not implemented yet"):
        task2_attention.custom_attention(x, x, x, 2)
    with pytest.raises(RuntimeError, match="failed to launch"):  # other errors pass through
        task2_attention.softmax(x)


def test_task2_an_empty_kernel_reads_as_not_implemented(monkeypatch):
    """The skeleton empties the kernel bodies and keeps their launchers: a kernel that leaves its
    poisoned output (or the scores it works in place on) exactly as it was is "not
    implemented yet", which the grader reports as such; a kernel that writes is judged on
    its numbers."""
    from common.checks import poisoned_empty
    from common.tools import grade

    make_out = partial(poisoned_empty, 2, 3, dtype=torch.float32, device="cpu")
    out, checks = task2_test._run_twice("softmax", lambda out: out, make_out, "softmax_kernel")
    assert out is None and len(checks) == 1 and not checks[0].passed
    assert checks[0].detail.startswith("not implemented yet: softmax_kernel wrote none")
    out, checks = task2_test._run_twice("softmax", lambda out: out.fill_(0.5), make_out,
                                        "softmax_kernel")
    assert out is not None and checks[0].passed  # written, repeatable: the numbers decide

    monkeypatch.setattr(task2_test.ext, "scale_and_causal_mask", lambda s, scale, causal: s)
    masks = task2_test._mask_checks([(2, 5)], "cpu", torch.Generator().manual_seed(0))
    assert masks and all("not implemented yet: scale_and_causal_mask_kernel" in c.detail
                         for c in masks)

    report = {"exit_code": 1, "checks": [{"name": c.name, "passed": False, "detail": c.detail}
                                         for c in masks]}
    run = grade.classify(grade.Run(groups=("attention",)), 2, report, "")
    assert run.status == "not implemented"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_task2_without_a_gpu_says_so_in_one_sentence():
    from common.build import BuildError

    with pytest.raises(BuildError) as info:
        task2_test.softmax_group()
    assert "\n" not in str(info.value)


def test_task2_solution_regions_are_well_formed():
    """Each BEGIN SOLUTION has an END in the same file, opens with HINT lines, and `kernel`
    regions sit inside __global__ functions (the release tool empties them)."""
    for path in (TASK2 / "attention_kernel.cu", TASK2 / "attention.py"):
        lines = path.read_text().splitlines()
        comment = "//" if path.suffix == ".cu" else "#"
        begins = [i for i, line in enumerate(lines) if line.strip().startswith(f"{comment} BEGIN SOLUTION")]
        ends = [i for i, line in enumerate(lines) if line.strip() == f"{comment} END SOLUTION"]
        assert len(begins) == len(ends), path
        for begin, end in zip(begins, ends, strict=True):
            assert begin < end, path
            assert lines[begin + 1].strip().startswith(f"{comment} HINT:"), (path, begin + 1)
            if lines[begin].strip().endswith("kernel"):
                header = "\n".join(lines[max(0, begin - 6):begin])
                assert re.search(r"__global__ void \w+\(", header), (path, begin + 1)
    cu = (TASK2 / "attention_kernel.cu").read_text()
    kernel_regions = cu.count("// BEGIN SOLUTION kernel")
    host_regions = cu.count("// BEGIN SOLUTION\n")
    assert (kernel_regions, host_regions) == (4, 1)  # softmax, 2 GEMMs, scale/mask; the pipeline
