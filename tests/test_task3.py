"""Task 3: FlashAttention-2 in PyTorch (runs on the CPU, and on the GPU when present)."""

from common.checks import assert_checks
from task3 import test as task3_test


def test_task3_course_shapes():
    checks, _ = task3_test.module_group()
    assert_checks(checks)


def test_task3_tiles_and_odd_lengths():
    checks, _ = task3_test.tiles_group()
    assert_checks(checks)
