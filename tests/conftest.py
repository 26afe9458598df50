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
# runs, no other GPU test does, so what it measures is its own. They run one after another on
# one worker (the xdist group TIMED_GROUP), from the start, while the other workers run the
# long tests that need no GPU (nvcc, the release, the skeleton's builds): timed tests spread over
# every worker would leave the others waiting for the GPU, idle. On a CPU (CI) it is one process.
GPU_WORKERS = 4
GPU_LOCKS = REPO_ROOT / "build" / "pytest_gpu"
TIMED_GROUP = "gpu-timed"


def pytest_cmdline_main(config):
    if (hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist")
            or getattr(config.option, "numprocesses", 0) is not None
            or config.option.collectonly or not _cuda_available()):
        return None
    # All three: xdist reads `dist` and `tx` (not numprocesses) when it starts the workers,
    # and its own pytest_cmdline_main, which derives them from -n, has run by now.
    config.option.numprocesses = GPU_WORKERS
    if config.option.dist == "no":
        # loadgroup: every test is its own unit of work except the timed ones, one unit (the
        # xdist_group mark pytest_collection_modifyitems gives them), handed out in the order
        # that hook leaves, not reordered by size (loadscopereorder): the long ones first.
        config.option.dist = "loadgroup"
        config.option.loadscopereorder = False
    config.option.tx = ["popen"] * GPU_WORKERS
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist's workers parse the command line again and never see the `loadgroup` set above; they
    must know it to add the group to the timed tests' ids (pytest_collection_modifyitems)."""
    node.workerinput["timed_group"] = node.config.option.dist == "loadgroup"


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
    """On a GPU: the timed tests first (one worker takes them all, one after another: they have
    the GPU to themselves), beside them the long tests that spend most of their time off the
    GPU (building the skeleton's extensions and then running them, the longest of all; then
    compiling every source), then the long GPU tests, then the rest: the suite ends when its
    longest test does, so the longest start first."""
    if "timed" in item.keywords:
        return 0
    if "slow" not in item.keywords:
        return 4
    if "gpu_turn_inside" in item.keywords:
        return 1
    return 2 if "gpu" not in item.keywords else 3


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook, which reads the group marks
def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        items.sort(key=_start_order)  # stable: each group keeps its collection order
        if getattr(config, "workerinput", {}).get("timed_group"):
            config.option.loadgroup = True  # read by xdist's own hook, which runs after this one
            for item in items:
                if "timed" in item.keywords:
                    item.add_marker(pytest.mark.xdist_group(TIMED_GROUP))
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
