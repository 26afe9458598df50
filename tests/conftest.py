"""pytest setup: run from the repository root; GPU tests skip with a reason when CUDA is absent.

`task3_report`: task 3's test run once per session (`python -m task3.test --json`, as a
student runs it), read by tests/test_task3.py and handed to the grader in tests/test_grade.py
(`--reports`), so its (16, 4096) course shapes are computed once per CI run, not twice."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@functools.cache
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# On a GPU machine the suite runs on GPU_WORKERS pytest-xdist workers (independent tests side
# by side: compiling, releasing, grading the skeleton, checking kernels) unless -n is given
# (-n 0: one process). Tests marked `timed` take the GPU for themselves (_gpu_turn): while one
# runs, no other GPU test does, so what it measures is its own. On a CPU (CI) it is one process.
GPU_WORKERS = 4
GPU_LOCKS = REPO_ROOT / "build" / "pytest_gpu"


def pytest_cmdline_main(config):
    if (hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist")
            or getattr(config.option, "numprocesses", 0) is not None
            or config.option.collectonly or not _cuda_available()):
        return None
    # All three: xdist reads `dist` and `tx` (not numprocesses) when it starts the workers,
    # and its own pytest_cmdline_main, which derives them from -n, has run by now.
    config.option.numprocesses = GPU_WORKERS
    if config.option.dist == "no":
        config.option.dist = "load"
    config.option.tx = ["popen"] * GPU_WORKERS
    # One test at a time to each worker, in the order pytest_collection_modifyitems leaves
    # (the long ones first): in chunks, the first worker would get every long test.
    if getattr(config.option, "maxschedchunk", None) is None:
        config.option.maxschedchunk = 1
    return None


@contextlib.contextmanager
def _gpu_turn(exclusive: bool):
    """Hold the GPU shared (any number of untimed tests) or exclusive (one timed test).

    Two flocks across the worker processes: `turn`, taken briefly by every test, and `gpu`,
    held for the test, shared or exclusive. A timed test keeps `turn` while it waits for `gpu`,
    so tests that arrive after it wait behind it instead of starving it."""
    GPU_LOCKS.mkdir(parents=True, exist_ok=True)
    with open(GPU_LOCKS / "turn", "a") as turn, open(GPU_LOCKS / "gpu", "a") as gpu:
        fcntl.flock(turn, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(gpu, fcntl.LOCK_EX)
            fcntl.flock(turn, fcntl.LOCK_UN)
        else:
            fcntl.flock(turn, fcntl.LOCK_UN)
            fcntl.flock(gpu, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(gpu, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _gpu_for_the_test(request):
    if ("gpu" not in request.keywords or "gpu_turn_inside" in request.keywords
            or not _cuda_available()):
        yield
        return
    with _gpu_turn(exclusive="timed" in request.keywords):
        yield


@pytest.fixture
def gpu_turn():
    """`with gpu_turn(exclusive=False):` for a test marked `gpu_turn_inside`, which uses the GPU
    for only part of its run (a long build first): a turn held through the build would make
    every timed test, and every test behind it, wait for the build."""
    return _gpu_turn


def pytest_sessionstart(session):
    """On a GPU machine, build every extension side by side before the first test: each test
    would otherwise build the extension it needs, one after another, when it first asks for it
    (task 2, 4, 5 and the Hopper kernel: minutes on a cold machine). A cached build makes this
    a few seconds. Under pytest-xdist only the controller builds; the workers find the builds."""
    if hasattr(session.config, "workerinput") or not _cuda_available():
        return
    from common.tools.build_all import build_all, build_modules

    start = time.perf_counter()
    modules = build_modules()
    failed = build_all(modules, quiet=True)
    print(f"\n[conftest] built {len(modules) - failed}/{len(modules)} CUDA extensions side by side "
          f"in {time.perf_counter() - start:.0f} s" + (" (the failures are above; the tests that "
          "need them will fail)" if failed else ""), flush=True)


def _start_order(item) -> int:
    """On a GPU: long tests that spend most of their time off the GPU (building the skeleton,
    compiling every source) first, then the timed ones (they take the GPU for themselves,
    while those builds keep the CPUs busy), then everything else: the suite ends when its
    longest test does, so the longest start first."""
    if "slow" in item.keywords and "timed" not in item.keywords:
        return 0
    return 1 if "timed" in item.keywords else 2


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        items.sort(key=_start_order)  # stable: each group keeps its collection order
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA; none is visible to torch here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def task3_report(tmp_path_factory) -> tuple[Path, dict]:
    """(the folder holding task3.json, its content) from one `python -m task3.test` run."""
    folder = tmp_path_factory.mktemp("task3_report")
    report = folder / "task3.json"
    proc = subprocess.run([sys.executable, "-m", "task3.test", "--json", str(report)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    assert report.exists(), f"task3.test wrote no report:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return folder, json.loads(report.read_text())
