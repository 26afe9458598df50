"""The kernels' limits live in common/limits.py; every build sees them as -D defines."""

from __future__ import annotations

import os

import pytest

from common import build, limits
from common.tools import compile_check


def test_supports_and_the_sentence():
    for head_dim in (8, 64, 96, 128, 136, 160, 192, 200, 256):
        assert limits.supports(head_dim), head_dim
    assert not limits.supports(264) and not limits.supports(12) and not limits.supports(0)
    assert limits.unsupported_reason(64) is None
    with pytest.raises(ValueError, match="head_dim 264 is not a multiple of 8 up to 256"):
        limits.check_head_dim(264, "use more heads")
    assert limits.BACKWARD_MAX_HEAD_DIM <= limits.MAX_HEAD_DIM


def test_every_build_gets_the_defines():
    flags = [f"-DATTN_MAX_HEAD_DIM={limits.MAX_HEAD_DIM}",
             f"-DATTN_HEAD_DIM_MULTIPLE={limits.HEAD_DIM_MULTIPLE}",
             f"-DATTN_BACKWARD_MAX_HEAD_DIM={limits.BACKWARD_MAX_HEAD_DIM}",
             f"-DATTN_DECODE_LINEAR_MAX_ROWS={limits.DECODE_LINEAR_MAX_ROWS}",
             f"-DATTN_NORM_MAX_THREADS={limits.NORM_MAX_THREADS}",
             f"-DATTN_NORM_MAX_PIECES_PER_THREAD={limits.NORM_MAX_PIECES_PER_THREAD}"]
    assert limits.define_flags() == flags
    for flag in flags:
        assert flag in build.CUDA_FLAGS and flag in build.CXX_FLAGS


def test_the_compile_check_passes_the_defines(tmp_path):
    if compile_check.find_nvcc() is None:
        if os.environ.get("ATTN_REQUIRE_NVCC"):
            pytest.fail("ATTN_REQUIRE_NVCC is set (as in CI) but nvcc was not found")
        pytest.skip("nvcc is not installed here")
    source = tmp_path / "limits.cu"
    source.write_text(f"static_assert(ATTN_MAX_HEAD_DIM == {limits.MAX_HEAD_DIM}, \"max\");\n"
                      f"static_assert(ATTN_HEAD_DIM_MULTIPLE == {limits.HEAD_DIM_MULTIPLE}, \"mult\");\n"
                      "__global__ void k(float* x) { x[threadIdx.x] = ATTN_MAX_HEAD_DIM; }\n")
    ok, output = compile_check.compile_one(source, device_only=True)
    assert ok, output
