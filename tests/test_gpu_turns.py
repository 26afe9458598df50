"""tests/conftest.py's turns at the GPU, which keep timed tests alone on it when the suite runs
on several pytest-xdist workers: untimed tests share it, a timed test waits for them and then
has it alone, and tests that arrive while a timed test waits queue behind it (no starvation).
flock locks two open files of one process against each other, so threads stand in for workers."""

from __future__ import annotations

import threading
import time

import conftest


def _hold(exclusive: bool, events: list, name: str, seconds: float) -> threading.Thread:
    def run():
        with conftest._gpu_turn(exclusive):
            events.append(("start", name, time.perf_counter()))
            time.sleep(seconds)
            events.append(("end", name, time.perf_counter()))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _interval(events, name):
    start = next(t for kind, n, t in events if kind == "start" and n == name)
    end = next(t for kind, n, t in events if kind == "end" and n == name)
    return start, end


def test_untimed_tests_share_and_a_timed_test_waits_then_is_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "GPU_LOCKS", tmp_path)
    events: list = []
    readers = [_hold(False, events, f"untimed{i}", 0.4) for i in range(2)]
    time.sleep(0.1)
    timed = _hold(True, events, "timed", 0.3)
    time.sleep(0.1)
    late = _hold(False, events, "late", 0.1)      # arrives while the timed test waits
    for t in (*readers, timed, late):
        t.join(timeout=10)
    r0, r1 = _interval(events, "untimed0"), _interval(events, "untimed1")
    t_start, t_end = _interval(events, "timed")
    late_start, _ = _interval(events, "late")
    assert r1[0] < r0[1] and r0[0] < r1[1], "the untimed tests ran side by side"
    assert t_start >= max(r0[1], r1[1]) - 1e-3, "the timed test waited for the running ones"
    assert late_start >= t_end - 1e-3, "a test that came while it waited ran after it"


def test_on_a_gpu_machine_the_suite_really_runs_on_workers(tmp_path):
    """conftest.pytest_cmdline_main, as it acts on a GPU machine, must start pytest-xdist's
    workers: setting `numprocesses` alone, after xdist has read its options, ran everything in
    one process while looking parallel. A tiny suite with the repository's hooks (the GPU check
    forced on) must run its tests in workers, the timed ones all in one worker, in order."""
    import subprocess
    import sys
    from pathlib import Path

    repo_conftest = Path(conftest.__file__).resolve()
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('repo_conftest', {str(repo_conftest)!r})\n"
        "repo = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(repo)\n"
        "repo._cuda_available = lambda: True\n"
        "pytest_cmdline_main = repo.pytest_cmdline_main\n"
        "pytest_collection_modifyitems = repo.pytest_collection_modifyitems\n"
        "pytest_configure_node = repo.pytest_configure_node\n")
    log = tmp_path / "timed.log"
    timed = "".join(
        f"\n\n@pytest.mark.timed\ndef test_timed_{i}():\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        f"        f.write('{i} ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        for i in range(4))
    (tmp_path / "test_worker.py").write_text(
        "import os\n\nimport pytest\n\n\n"
        + "".join(f"def test_untimed_{i}():\n    pass\n\n\n" for i in range(6))
        + "def test_in_a_worker():\n"
        "    assert os.environ.get('PYTEST_XDIST_WORKER', '').startswith('gw')\n" + timed)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    runs = [line.split() for line in log.read_text().splitlines()]
    assert [int(i) for i, _ in runs] == [0, 1, 2, 3], runs
    assert len({worker for _, worker in runs}) == 1, f"timed tests on several workers: {runs}"
