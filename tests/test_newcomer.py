"""A newcomer's first mistakes get one sentence they can act on, never a traceback.

Every command runs from the repository root as a module (`python -m task1.test`): a task or
tool file run as a script (`python task1/test.py`) says so. Every command answers --help with
its usage. Without a GPU, a task test that needs one says what is missing, with no FAIL lines.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def _command_files() -> list[str]:
    """The task and tool files with a __main__ block: every `python -m ...` command."""
    return sorted(p.relative_to(REPO_ROOT).as_posix()
                  for pattern in ("task*/*.py", "common/tools/*.py") for p in REPO_ROOT.glob(pattern)
                  if '__name__ == "__main__"' in p.read_text())


COMMANDS = _command_files()


def _module(rel: str) -> str:
    return rel.removesuffix(".py").replace("/", ".")


def _python(args: list[str], cwd: Path = REPO_ROOT) -> tuple[int, str]:
    """(exit code, stdout and stderr) of `python ARGS`."""
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _python_all(runs: list[list[str]]) -> list[tuple[int, str]]:
    """`_python` for each argument list, several at once (each start imports torch: ~1-2 s)."""
    with ThreadPoolExecutor(max(2, 2 * (os.cpu_count() or 1))) as pool:
        return list(pool.map(_python, runs))


@pytest.mark.parametrize("script, cwd", [("task1/test.py", "."), ("task4/compile.py", "."),
                                         ("task7/inference.py", "."),
                                         ("common/tools/compile_check.py", "."),
                                         ("test.py", "task1")])
def test_a_file_run_as_a_script_says_to_run_it_as_a_module(script, cwd):
    code, output = _python([script], REPO_ROOT / cwd)
    module = _module(Path(cwd, script).as_posix())
    assert code != 0 and "Traceback" not in output, output[-2000:]
    assert output == f"Run this from the repository root as a module: python -m {module}"


@pytest.mark.parametrize("rel", COMMANDS)
def test_every_command_file_guards_before_importing_the_repository(rel):
    """The guard cannot be shared (importing it is what fails), so each file carries it, before
    its first import of `common` or a task, naming its own module."""
    source = (REPO_ROOT / rel).read_text()
    body = ast.parse(source).body
    guard = next((n for n, node in enumerate(body) if isinstance(node, ast.If)
                  and ast.unparse(node.test) == "not __package__"), None)
    ours = {"common", *(p.name for p in REPO_ROOT.glob("task*"))}
    imported = [[node.module or ""] if isinstance(node, ast.ImportFrom) else
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                for node in body]
    first_import = next((n for n, names in enumerate(imported)
                         if any(name.split(".")[0] in ours for name in names)), len(body))
    assert guard is not None and guard < first_import, f"{rel}: no `if not __package__:` guard first"
    said = [c.value for c in ast.walk(body[guard]) if isinstance(c, ast.Constant)]
    assert any(str(s).endswith(f"python -m {_module(rel)}") for s in said), f"{rel}: {said}"


def test_every_command_prints_its_usage_with_help():
    assert "common/tools/compile_check.py" in COMMANDS and "task1/test.py" in COMMANDS
    results = _python_all([["-m", _module(rel), "--help"] for rel in COMMANDS])
    bad = {_module(rel): output[-600:] for rel, (code, output) in zip(COMMANDS, results, strict=True)
           if code != 0 or "usage:" not in output or "Traceback" in output}
    assert not bad, f"these commands do not answer --help with their usage: {bad}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
def test_a_gpu_task_test_without_a_gpu_is_one_sentence():
    tasks = (2, 4, 5, 6)
    for task, (code, output) in zip(tasks, _python_all([["-m", f"task{task}.test", "--no-record"]
                                                        for task in tasks]), strict=True):
        assert code == 1 and "Traceback" not in output and "FAIL" not in output, output[-2000:]
        assert len(output.splitlines()) == 1 and "needs an NVIDIA GPU" in output, output
