"""Compile every CUDA/C++ source of the repository without a GPU: CI's kernel check.

Each `.cu` file through nvcc for sm_90, device side (`--cubin`: the front end parses and
checks every function, host ones included, then cicc and ptxas build every kernel), and
`g++ -fsyntax-only` on each extension `.cpp`, with torch's include paths, so a kernel that
does not compile fails CI on a CPU machine. The device-side compile skips only the host
compiler's second pass over torch's headers, which is 60-70% of a full `nvcc -c` (measured on
the 2-core CI machine: 188 s against 446 s for the seven kernel files); `--full` adds it.

    python -m common.tools.compile_check              # every source under the repository
    python -m common.tools.compile_check task4        # the sources under one folder
    python -m common.tools.compile_check --full       # nvcc -c: the host pass as well

Each source's PASS or FAIL is printed as soon as it is compiled (in parallel, one per core),
then the count.

Each source is compiled with the flags a real build adds that change what compiles: the
kernels' limits as -D defines (common/limits.py, as common.build passes them). A kernel built
for an arch-specific target says so in a line `// compile_check: arch sm_90a` (the Hopper
kernel: wgmma exists only there); it is compiled for that target instead, with ptxas's report
(`-Xptxas -v`: registers, spills, and its warnings) in the output, which its own test reads
from this module's cache instead of compiling the file a second time.

The CPU build of torch ships the c10/ATen headers but not one header that its CUDA build
generates (c10/cuda/impl/cuda_cmake_macros.h); when it is missing, an equivalent one-line
stand-in is supplied from a temporary folder, removed when the process exits. Kernel files
include only light headers (common/csrc/tensor_api.h: ATen's tensor, c10/cuda), which is also
what keeps this check at seconds per file. Within one process a source is compiled once:
results are kept by the content of the source and of the repository headers it includes (so
the skeleton's unchanged files cost nothing after the solution's).
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.compile_check")

import argparse
import atexit
import hashlib
import os
import re
import shutil
import threading
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from functools import lru_cache
from pathlib import Path

from common.limits import define_flags

REPO_ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {"build", ".git", "__pycache__", ".pytest_cache", "student"}


def find_sources(root: Path = REPO_ROOT) -> list[Path]:
    """The .cu and .cpp files of the repository at `root`: those git tracks or would track
    (ignored scratch copies are not the repository's), else every one outside build folders."""
    from common.tools.release import list_files

    found = []
    for rel in list_files(root):
        path = root / rel
        if path.suffix in (".cu", ".cpp") and not SKIP_DIRS.intersection(Path(rel).parts):
            found.append(path)
    return sorted(found)


def find_nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@lru_cache(maxsize=4)
def include_flags(root: Path = REPO_ROOT) -> tuple[str, ...]:
    """torch's and Python's include folders, `root`/common/csrc, and the stand-in if needed."""
    from torch.utils import cpp_extension

    torch_includes = cpp_extension.include_paths()  # without cuda=True: no CUDA_HOME needed
    flags = [f"-I{p}" for p in torch_includes]
    flags.append(f"-I{sysconfig.get_paths()['include']}")
    flags.append(f"-I{root / 'common' / 'csrc'}")
    generated = Path(torch_includes[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not generated.exists():
        shim = Path(tempfile.mkdtemp(prefix="attn_shim_"))
        atexit.register(shutil.rmtree, shim, ignore_errors=True)
        header = shim / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        header.parent.mkdir(parents=True)
        header.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        flags.append(f"-I{shim}")
    return tuple(flags)


def cuda_include_flag(nvcc: str) -> str:
    return f"-I{Path(nvcc).resolve().parent.parent / 'include'}"


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_results: dict[str, tuple[bool, str]] = {}
_results_lock = threading.Lock()


def _local_includes(path: Path, root: Path, seen: set[Path]) -> None:
    """The repository headers `path` includes ("..."), transitively, into `seen`."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    for name in _INCLUDE.findall(text):
        for folder in (path.parent, root / "common" / "csrc"):
            header = (folder / name).resolve()
            if header.is_file():
                if header not in seen:
                    seen.add(header)
                    _local_includes(header, root, seen)
                break


def content_key(path: Path, flags: list[str], root: Path = REPO_ROOT) -> str:
    """A hash of what a compile of `path` depends on: its text, the repository headers it
    includes, and the command's flags (not the folder it lives in)."""
    digest = hashlib.sha256("\0".join(flags).encode())
    headers: set[Path] = set()
    _local_includes(path, root, headers)
    for part in [path, *sorted(headers)]:
        digest.update(part.name.encode() + b"\0" + part.read_bytes())
    return digest.hexdigest()


def compile_one(path: Path, nvcc: str | None = None, arch: str = "sm_90",
                root: Path = REPO_ROOT, device_only: bool = False) -> tuple[bool, str]:
    """Compile one source of the repository at `root`; return (ok, compiler output).

    `device_only` compiles a .cu file's device side only (`nvcc --cubin`: the front end parses
    and checks every function, host ones included, then cicc and ptxas build the kernels),
    skipping the host compiler's second pass over torch's headers: about a quarter of the
    time. A source whose content (and that of the headers it includes) was compiled before
    in this process is not compiled again: the earlier result is returned."""
    nvcc = nvcc or find_nvcc()
    device_only = device_only and path.suffix == ".cu"
    key = content_key(path, [nvcc or "", arch, path.suffix, os.environ.get("CXX", "g++"),
                             "device" if device_only else "full"], root)
    with _results_lock:
        if key in _results:
            return _results[key]
    result = _compile(path, nvcc, arch, root, device_only)
    with _results_lock:
        _results[key] = result
    return result


_ARCH_MARKER = re.compile(r"^//\s*compile_check:\s*arch\s+sm_(\d+a?)\s*$", re.M)


def declared_arch(path: Path) -> str | None:
    """The arch-specific target a .cu file declares (`// compile_check: arch sm_90a`), or None."""
    match = _ARCH_MARKER.search(path.read_text()) if path.suffix == ".cu" else None
    return match.group(1) if match else None


def _compile(path: Path, nvcc: str | None, arch: str, root: Path,
             device_only: bool) -> tuple[bool, str]:
    common = ["-std=c++20", "-DTORCH_EXTENSION_NAME=compile_check", *define_flags(),
              *include_flags(root)]
    with tempfile.TemporaryDirectory() as tmp:
        if path.suffix == ".cu":
            what = ["--cubin", "-o", str(Path(tmp) / "out.cubin")] if device_only else \
                   ["-c", "-o", str(Path(tmp) / "out.o")]
            declared = declared_arch(path)
            target = ([f"-gencode=arch=compute_{declared},code=sm_{declared}", "-Xptxas", "-v"]
                      if declared else [f"-arch={arch}", "-w"])
            cmd = [nvcc, *target, "-O1", "--expt-relaxed-constexpr", *common, str(path), *what]
        else:
            cxx = os.environ.get("CXX", "g++")
            cmd = [cxx, "-fsyntax-only", "-w", *common, cuda_include_flag(nvcc), str(path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def compile_all(paths: list[Path], root: Path = REPO_ROOT, workers: int | None = None,
                device_only: bool = True,
                on_result: Callable[[Path, bool, str], None] | None = None
                ) -> dict[Path, tuple[bool, str]]:
    """Compile `paths` (sources of the repository at `root`) in parallel; `on_result(path, ok,
    output)` is called for each source as it finishes (a full check takes minutes)."""
    nvcc = find_nvcc()
    workers = workers or max(1, min(len(paths), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        futures = {pool.submit(compile_one, p, nvcc, root=root, device_only=device_only): p
                   for p in paths}
        results = {}
        for future in as_completed(futures):
            path = futures[future]
            results[path] = future.result()
            if on_result is not None:
                on_result(path, *results[path])
    return {p: results[p] for p in paths}


def print_result(path: Path, ok: bool, output: str) -> None:
    """One source's line (and the compiler's output when it fails), printed at once."""
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    print(f"{'PASS' if ok else 'FAIL'}  {shown}", flush=True)
    if not ok:
        print(output, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.compile_check",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                        help="folders or sources to compile, relative to the repository root "
                             "(default: the whole repository)")
    parser.add_argument("--full", action="store_true",
                        help="compile .cu files with nvcc -c: the host compiler's pass as well")
    args = parser.parse_args(argv)
    roots = [REPO_ROOT / a for a in args.paths] or [REPO_ROOT]
    missing = [str(r) for r in roots if not r.exists()]
    if missing:
        parser.error(f"not found: {', '.join(missing)}; give folders or sources of this "
                     "repository, relative to its root.")
    if find_nvcc() is None:
        print("[compile_check] nvcc was not found; install the CUDA toolkit or set CUDA_HOME.")
        return 1
    paths = [p for r in roots for p in (find_sources(r) if r.is_dir() else [r])]
    print(f"[compile_check] compiling {len(paths)} sources; each is listed as it finishes",
          flush=True)
    results = compile_all(paths, device_only=not args.full, on_result=print_result)
    failed = sum(not ok for ok, _ in results.values())
    print(f"{len(paths) - failed}/{len(paths)} sources compile")
    # No sources at all is a failure for the whole repository, not for a folder without any.
    return 1 if failed or (not paths and not args.paths) else 0


if __name__ == "__main__":
    sys.exit(main())
