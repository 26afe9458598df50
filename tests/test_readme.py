"""README.md, the handout: it names every file a student edits, and its commands exist."""

from __future__ import annotations

import re

from common.tools import release

REPO_ROOT = release.REPO_ROOT


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def test_readme_names_every_file_with_a_solution_region():
    """Each file with a BEGIN SOLUTION region is named in a README paragraph that says to
    edit it; in the student's README too (the release keeps those paragraphs)."""
    solutions = release.find_solution_files(REPO_ROOT)
    readme = (REPO_ROOT / "README.md").read_text()
    for text, which in ((readme, "README.md"), (release.student_readme(readme), "the student README")):
        edit = [p for p in _paragraphs(text) if re.search(r"\bedit\b", p, re.I)]
        missing = [rel for rel in solutions if not any(f"`{rel}`" in p for p in edit)]
        assert not missing, (f"{which} never says to edit {', '.join(missing)} (each file with a "
                             "solution region must be named, in backquotes, in a paragraph that "
                             "says Edit)")


def test_readme_module_commands_exist():
    """Every `python -m X.Y` in the README is a module of this repository (or pip/pytest)."""
    readme = (REPO_ROOT / "README.md").read_text()
    for module in sorted(set(re.findall(r"python -m ([\w.]+)", readme))):
        if module in ("pip", "pytest") or "taskN" in module:   # taskN: any task
            continue
        path = REPO_ROOT / (module.replace(".", "/") + ".py")
        assert path.exists(), f"README.md runs `python -m {module}`, but {path} does not exist"
