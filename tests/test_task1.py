"""Task 1: naive PyTorch attention (runs on the CPU, and on the GPU when present)."""

from common.checks import assert_checks
from task1 import test as task1_test


def test_task1_attention():
    checks, _ = task1_test.attention_checks()
    assert_checks(checks)
