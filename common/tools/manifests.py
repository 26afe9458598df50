"""Every task's manifest (taskN/manifest.py, MANIFEST), found by folder: adding a task folder
with a manifest adds it to the grader and to Results.md without editing common/."""

from __future__ import annotations

import functools
import importlib
import re

from common.manifest import TaskManifest
from common.results import REPO_ROOT


def task_folders() -> list[str]:
    """task1, task2, ... (the folders of this repository that hold a manifest.py), in order."""
    found = [p.parent.name for p in REPO_ROOT.glob("task*/manifest.py")
             if re.fullmatch(r"task\d+", p.parent.name)]
    return sorted(found, key=lambda name: int(name[4:]))


@functools.cache
def manifests() -> tuple[TaskManifest, ...]:
    found = []
    for folder in task_folders():
        manifest = importlib.import_module(f"{folder}.manifest").MANIFEST
        if f"task{manifest.task}" != folder:
            raise ValueError(f"{folder}/manifest.py declares task {manifest.task}")
        found.append(manifest)
    return tuple(found)
