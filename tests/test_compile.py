"""Every .cu (nvcc, sm_90, device side) and extension .cpp (g++ -fsyntax-only) compiles,
without a GPU.

This is how CI, which has no GPU, catches a kernel that does not compile. The sources are
compiled once per session, in parallel (one process: all at once at the first test; under
pytest-xdist: each by the worker that runs its test); each file is its own test so a failure
names it. On a GPU machine a source of an extension the session has built for the GPU (and
that loads) has compiled already, more strictly, and is not compiled again. The
.cu files are compiled as common.tools.compile_check does by default (device side: every
function parsed and checked, every kernel through ptxas; not the host compiler's second pass),
which is also how the release test compiles the skeleton, so unchanged files compile once.
"""

from __future__ import annotations

import os
import threading

import pytest

from common.tools import compile_check

SOURCES = compile_check.find_sources()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _need_nvcc():
    if compile_check.find_nvcc() is None:
        if os.environ.get("ATTN_REQUIRE_NVCC"):
            pytest.fail("ATTN_REQUIRE_NVCC is set (as in CI) but nvcc was not found")
        pytest.skip("nvcc is not installed here; the compile check needs the CUDA toolkit")


def _extension_of(path) -> str | None:
    """The build module (task<N>.compile or a Hopper build) whose SOURCES list this source."""
    import importlib

    from common.tools.build_all import HOPPER_BUILDS, build_modules

    relative = str(path.relative_to(compile_check.REPO_ROOT))
    return next((name for name in (*build_modules(hopper=False), *HOPPER_BUILDS)
                 if relative in getattr(importlib.import_module(name), "SOURCES", ())), None)


def _built_here(path) -> bool:
    """On a GPU machine the session built every extension for this GPU before the first test
    (tests/conftest.py), host code and all, which checks more than this file's device-side
    compile does: a source of an extension that loads has compiled, and compiling it again cost
    the suite's workers minutes of CPU. (CI, which has no GPU, compiles every source here.)"""
    import importlib

    import torch

    if not torch.cuda.is_available():
        return False
    from common.tools.build_all import build_modules

    name = _extension_of(path)
    if name is None or name not in build_modules():
        return False
    try:
        importlib.import_module(name).load()
    except Exception:  # a failed build: compile it here, where the error is shown
        return False
    return True


class _CompiledOnDemand(dict):
    """Under pytest-xdist the sources' tests run on several workers: each compiles only its
    own source (compile_all in every worker would compile every source once per worker), unless
    the session's build on this GPU has compiled it (_built_here)."""

    def __missing__(self, path):
        self[path] = ((True, "") if _built_here(path)
                      else compile_check.compile_one(path, device_only=True))
        return self[path]


@pytest.fixture(scope="session")
def compiled():
    _need_nvcc()
    if os.environ.get("PYTEST_XDIST_WORKER") or _cuda():
        return _CompiledOnDemand()
    return compile_check.compile_all(SOURCES)


def test_the_check_catches_a_broken_kernel(tmp_path):
    _need_nvcc()
    broken = tmp_path / "broken.cu"
    broken.write_text("__global__ void k(float* x) { x[threadIdx.x] = undefined_name; }\n")
    ok, output = compile_check.compile_one(broken)
    assert not ok and "undefined_name" in output


def test_device_only_mode_still_checks_host_code(tmp_path):
    """The skeleton's sources are compiled device side only (tests/test_release.py): a host
    function that does not compile must still fail there."""
    _need_nvcc()
    broken = tmp_path / "host.cu"
    broken.write_text("__global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n"
                      "void launch(float* x) { undefined_host_name(x); k<<<1, 32>>>(x); }\n")
    ok, output = compile_check.compile_one(broken, device_only=True)
    assert not ok and "undefined_host_name" in output


def test_a_source_is_compiled_once_per_process(tmp_path, monkeypatch):
    """Same content (and same included headers) -> the earlier result, without a compiler."""
    _need_nvcc()
    first, second = tmp_path / "a" / "same.cu", tmp_path / "b" / "same.cu"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text("__global__ void k(float* x) { x[threadIdx.x] = 2.0f; }\n")
    assert compile_check.compile_one(first, device_only=True)[0]
    monkeypatch.setattr(compile_check, "_compile", lambda *a: pytest.fail("compiled again"))
    assert compile_check.compile_one(second, device_only=True)[0]


@pytest.mark.slow
@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(compile_check.REPO_ROOT)) for p in SOURCES])
def test_source_compiles(compiled, path):
    ok, output = compiled[path]
    assert ok, f"{path} does not compile:\n{output[-4000:]}"


def test_each_result_is_reported_as_it_finishes(tmp_path, monkeypatch, capsys):
    """The whole check takes minutes: each file's line comes when that file is done, the
    summary last. The slow source waits until the fast one's line is out."""
    fast, slow = tmp_path / "fast.cu", tmp_path / "slow.cu"
    fast_reported = threading.Event()

    def fake_compile(path, nvcc=None, root=None, device_only=False):
        if path == slow:
            assert fast_reported.wait(10), "the fast source was not reported before the slow one ended"
            return False, "slow.cu: error: undefined_name"
        return True, ""

    monkeypatch.setattr(compile_check, "compile_one", fake_compile)
    seen = []

    def on_result(path, ok, output):
        seen.append((path.name, ok))
        if path == fast:
            fast_reported.set()

    results = compile_check.compile_all([slow, fast], workers=2, on_result=on_result)
    assert seen == [("fast.cu", True), ("slow.cu", False)]
    assert list(results) == [slow, fast]

    # The command prints each line through print_result, flushed, then the summary.
    monkeypatch.setattr(compile_check, "compile_one", lambda path, *a, **k: (path == fast, "error"))
    monkeypatch.setattr(compile_check, "find_nvcc", lambda: "nvcc")
    monkeypatch.setattr(compile_check, "find_sources", lambda root: [slow, fast])
    assert compile_check.main([str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"PASS  {fast}" in lines and lines[lines.index(f"FAIL  {slow}") + 1] == "error"
    assert lines[-1] == "1/2 sources compile"


@pytest.mark.gpu
def test_on_a_gpu_every_source_is_in_an_extension_that_loads():
    """What lets a GPU run skip the compiles: each source is part of an extension the session
    built for this GPU (a .cu file no compile.py lists would be compiled by nobody there)."""
    from common.tools.build_all import build_modules

    built = build_modules()
    owners = {p: _extension_of(p) for p in SOURCES}
    assert not [str(p) for p, name in owners.items() if name is None], "sources no compile.py lists"
    missing = [str(p) for p, name in owners.items() if name in built and not _built_here(p)]
    assert not missing, f"built for this GPU but not loading: {missing}"
