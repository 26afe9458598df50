"""Measured results: record them in results/<gpu>.json (the recording side).

Nothing in Results.md is typed by hand. Tests and benchmarks call `record(...)` with the
figures they measured; `python -m common.tools.report` renders Results.md from the
`results/*.json` files (the metric names and sections come from each task's manifest.py).

File shape (one file per GPU model, e.g. results/h100.json):
    {"meta":    {device, torch, cuda, date, commit}          # the latest run
     "metrics": {name: number}, "texts": {name: str},
     "runs":    [{meta of each run}], "metric_run": {name: index into runs}}
so every number can be traced to the run (device, torch, date, commit) that produced it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(os.environ.get("ATTN_RESULTS_DIR", REPO_ROOT / "results"))


# --- recording ---------------------------------------------------------------------------

def device_key() -> str:
    """Short lower-case GPU model ('h100', 'h200', 'a100', 'rtx4090'), or 'cpu'."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    found = re.search(r"\b([a-z]{1,3}\d{2,4}[a-z]?)\b", name.replace("nvidia", ""))
    return found.group(1) if found else re.sub(r"[^a-z0-9]+", "_", name).strip("_")


def checkout_commit(root: Path | None = None) -> str:
    """The commit the figures come from: ATTN_COMMIT when set (a copied working tree without
    .git), else git's HEAD, with "+modified" when tracked files differ from it (a working tree
    copied over an older checkout reports that checkout's HEAD: the suffix says the figures are
    not that commit's); "unknown" without either."""
    commit = os.environ.get("ATTN_COMMIT", "")
    if commit:
        return commit
    root = root or REPO_ROOT
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                                capture_output=True, text=True, timeout=5).stdout.strip()
        if commit:
            changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                     cwd=root, capture_output=True, text=True, timeout=10)
            if changed.returncode == 0 and changed.stdout.strip():
                commit += "+modified"
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return commit or "unknown"


def run_meta() -> dict:
    import torch

    meta = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": checkout_commit(),
    }
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    return meta


def results_path(key: str | None = None) -> Path:
    return RESULTS_DIR / f"{key or device_key()}.json"


def load(path: Path) -> dict:
    if not path.exists():
        return {"meta": {}, "metrics": {}, "texts": {}, "runs": [], "metric_run": {}}
    data = json.loads(path.read_text())
    for key, empty in (("metrics", {}), ("texts", {}), ("runs", []), ("metric_run", {})):
        data.setdefault(key, empty)
    return data


def record(metrics: dict[str, float] | None = None, texts: dict[str, str] | None = None,
           path: Path | None = None) -> Path:
    """Merge measured figures into results/<gpu>.json under this run's meta; return the path.

    Under a lock, written whole then renamed: the GPU suite's workers record side by side, and
    an unlocked read-modify-write would lose one's figures or read the other's half-written file."""
    import fcntl

    path = path or results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _record_locked(path, metrics, texts)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _record_locked(path: Path, metrics, texts) -> Path:
    data = load(path)
    meta = run_meta()
    if not data["runs"] or data["runs"][-1] != meta:
        data["runs"].append(meta)
    run_index = len(data["runs"]) - 1
    data["meta"] = meta
    for name, value in (metrics or {}).items():
        data["metrics"][name] = float(value)
        data["metric_run"][name] = run_index
    for name, text in (texts or {}).items():
        data["texts"][name] = str(text)
        data["metric_run"][name] = run_index
    partial = path.with_name(path.name + f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    partial.replace(path)
    return path


def merge(sources: list[Path], path: Path) -> Path:
    """Fold results files measured elsewhere (e.g. copied back from a GPU machine) into `path`,
    keeping each figure's own run (device, torch, date, commit); where both hold a figure,
    the one measured later wins."""
    data = load(path)
    for source in sources:
        other = load(source)
        for name in list(other["metrics"]) + list(other["texts"]):
            meta = other["runs"][other["metric_run"][name]]
            if name in data["metric_run"]:
                mine = data["runs"][data["metric_run"][name]]
                if mine.get("date", "") > meta.get("date", ""):
                    continue
            if meta not in data["runs"]:
                data["runs"].append(meta)
            data["metric_run"][name] = data["runs"].index(meta)
            if name in other["metrics"]:
                data["metrics"][name] = other["metrics"][name]
            else:
                data["texts"][name] = other["texts"][name]
        data["meta"] = max([data["meta"], other["meta"]], key=lambda m: m.get("date", ""))
    used = sorted(set(data["metric_run"].values()))   # drop runs no figure points at any more
    data["runs"] = [data["runs"][i] for i in used]
    data["metric_run"] = {k: used.index(i) for k, i in data["metric_run"].items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path
