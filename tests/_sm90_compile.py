"""What the Hopper kernels' tests (tests/test_task4_hopper.py, tests/test_task4_hopper_backward.py)
share: their files' device-side compiles for sm_90a with ptxas -v, and the skip of their GPU tests
on other GPUs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.tools import compile_check


def ptxas_report(sources: list[Path]) -> str:
    """The `sources`' device-side compiles for sm_90a with ptxas -v, as CI's compile check runs
    them (their `// compile_check: arch sm_90a` line; in parallel): one compile per process and
    file, shared with it. Their reports one after the other. Without nvcc: skips, or fails
    where ATTN_REQUIRE_NVCC is set (as in CI)."""
    if compile_check.find_nvcc() is None:
        if os.environ.get("ATTN_REQUIRE_NVCC"):
            pytest.fail("ATTN_REQUIRE_NVCC is set (as in CI) but nvcc was not found")
        pytest.skip("nvcc is not installed here; the sm_90a compile check needs the CUDA toolkit")
    for source in sources:
        assert compile_check.declared_arch(source) == "90a", source.name
    found = compile_check.compile_all(sources, device_only=True)
    for source in sources:
        ok, output = found[source]
        assert ok, f"{source.name} does not compile for sm_90a:\n{output[-4000:]}"
    return "\n".join(found[source][1] for source in sources)


def hopper_or_skip():
    """task4.hopper, or a skip where there is no compute capability 9.0 GPU (sm_90a code runs
    only there)."""
    from task4 import hopper

    if not hopper.available():
        pytest.skip("needs a compute capability 9.0 GPU (H100/H200): the kernel is sm_90a code")
    return hopper
