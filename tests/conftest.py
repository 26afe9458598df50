"""pytest setup: run from the repository root; GPU tests skip with a reason when CUDA is absent.

`task3_report`: task 3's test run once per session (`python -m task3.test --json`, as a
student runs it), read by tests/test_task3.py and handed to the grader in tests/test_grade.py
(`--reports`), so its (16, 4096) course shapes are computed once per CI run, not twice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


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


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
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
