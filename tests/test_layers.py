"""The layers of the repository: common/ (the machinery every task uses) never imports a task
or common/tools/ (the tools above the tasks); only the tools and the tasks look upwards.
Read from the source (ast), so an import inside a function counts too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LOWER = sorted(p for p in (REPO_ROOT / "common").rglob("*.py")
               if "tools" not in p.relative_to(REPO_ROOT / "common").parts)
FORBIDDEN = re.compile(r"^(task\d+|common\.tools)(\.|$)")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`: `import a.b`, `from a.b import c` (also as
    a.b.c, since c may be a module), and importlib.import_module("a.b") with a literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
              in ("import_module", "__import__") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def test_the_lower_layer_is_not_empty():
    names = {p.name for p in LOWER}
    assert {"build.py", "harness.py", "results.py", "limits.py", "manifest.py"} <= names


@pytest.mark.parametrize("path", LOWER, ids=[str(p.relative_to(REPO_ROOT)) for p in LOWER])
def test_lower_layer_imports_no_task_and_no_tool(path):
    bad = [f"line {line}: {module}" for line, module in imported_modules(path)
           if FORBIDDEN.match(module)]
    assert not bad, (f"{path.relative_to(REPO_ROOT)} imports a task or common.tools, which sit "
                     f"above it: {', '.join(bad)}; move the code up into common/tools/ or the task")


def test_the_check_sees_every_kind_of_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import task4.attention\nfrom common.tools import grade\nfrom task5 import ops\n"
                     "def f():\n    import importlib\n    importlib.import_module('task7.gpt2')\n")
    modules = [m for _, m in imported_modules(probe) if FORBIDDEN.match(m)]
    assert modules == ["task4.attention", "common.tools", "common.tools.grade", "task5",
                       "task5.ops", "task7.gpt2"]
