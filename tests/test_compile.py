"""Every .cu (nvcc -c, sm_90) and extension .cpp (g++ -fsyntax-only) compiles, without a GPU.

This is how CI, which has no GPU, catches a kernel that does not compile. The sources are
compiled once per session, in parallel; each file is its own test so a failure names it.
"""

from __future__ import annotations

import os

import pytest

from common.tools import compile_check

SOURCES = compile_check.find_sources()


def _need_nvcc():
    if compile_check.find_nvcc() is None:
        if os.environ.get("ATTN_REQUIRE_NVCC"):
            pytest.fail("ATTN_REQUIRE_NVCC is set (as in CI) but nvcc was not found")
        pytest.skip("nvcc is not installed here; the compile check needs the CUDA toolkit")


@pytest.fixture(scope="session")
def compiled():
    _need_nvcc()
    return compile_check.compile_all(SOURCES)


def test_the_check_catches_a_broken_kernel(tmp_path):
    _need_nvcc()
    broken = tmp_path / "broken.cu"
    broken.write_text("__global__ void k(float* x) { x[threadIdx.x] = undefined_name; }\n")
    ok, output = compile_check.compile_one(broken)
    assert not ok and "undefined_name" in output


@pytest.mark.slow
@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(compile_check.REPO_ROOT)) for p in SOURCES])
def test_source_compiles(compiled, path):
    ok, output = compiled[path]
    assert ok, f"{path} does not compile:\n{output[-4000:]}"
