"""Build (JIT-compile) a task's CUDA extension: the only build code in the repository.

Every `taskN/compile.py` and `taskN/attention.py` calls `load_extension`. It wraps
`torch.utils.cpp_extension.load` (ninja) and adds what a course needs:

- it builds for the GPU that is present (its compute capability) unless the user set
  TORCH_CUDA_ARCH_LIST, and puts the build in `build/<name>-<arch>-torch<version>/` inside
  the repository (git ignores `build/`), so a cached build is reused and a different GPU or
  torch version never picks up a stale one;
- it recovers from the stale `lock` file that a killed build leaves behind (torch would
  otherwise wait on it forever);
- without a GPU, nvcc or ninja it raises `BuildError` with one sentence that says what is
  missing and what to do, instead of a long traceback.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from common.limits import define_flags

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = REPO_ROOT / "build"
COMMON_CSRC = REPO_ROOT / "common" / "csrc"

# -O3 everywhere; -lineinfo so compute-sanitizer and ncu can point at source lines.
# No --use_fast_math: the fp32 course path is graded at atol 1e-6, so each kernel chooses
# its fast intrinsics (exp2f, __expf) where it has shown they are accurate enough.
# Every build also gets the kernels' limits as -D defines (common/limits.py: ATTN_MAX_HEAD_DIM,
# ATTN_HEAD_DIM_MULTIPLE), so the C++ side checks the same numbers the Python side does.
CXX_FLAGS = ["-O3", *define_flags()]
CUDA_FLAGS = ["-O3", "-lineinfo", "--expt-relaxed-constexpr", *define_flags()]


class BuildError(RuntimeError):
    """A build could not start or failed; the message says what to do."""


def _require_toolchain() -> None:
    import torch
    from torch.utils import cpp_extension

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            raise BuildError(
                f"This PyTorch ({torch.__version__}) is a CPU-only build, so CUDA extensions "
                "cannot be built; on a machine with an NVIDIA GPU install a CUDA build of torch "
                "(see README.md, Setup)."
            )
        raise BuildError(
            "No CUDA GPU is visible to PyTorch (torch.cuda.is_available() is False); run this "
            "on a machine with an NVIDIA GPU and check `nvidia-smi` and CUDA_VISIBLE_DEVICES."
        )
    if cpp_extension.CUDA_HOME is None:
        raise BuildError(
            "nvcc was not found, so the CUDA extension cannot be compiled; install the CUDA "
            f"toolkit matching torch's CUDA {torch.version.cuda} and put its bin/ on PATH "
            "(or set CUDA_HOME)."
        )
    if not cpp_extension.is_ninja_available():
        raise BuildError(
            "ninja was not found, and torch's JIT build needs it; run `pip install ninja`."
        )


def target_arch() -> str:
    """The TORCH_CUDA_ARCH_LIST to build for: the user's, else the present GPU's."""
    import torch

    user = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if user:
        return user
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def build_dir_for(name: str, arch: str) -> Path:
    import torch

    tag = arch.replace(" ", "_").replace(";", "_").replace("+", "")
    version = torch.__version__.split("+")[0]
    return BUILD_ROOT / f"{name}-sm{tag}-torch{version}"


@contextlib.contextmanager
def _exclusive(build_dir: Path):
    """Hold an flock on the build folder for the whole build.

    torch's own lock is a plain file that nobody removes if the build is killed. An flock
    dies with its process, so once we hold ours, any torch `lock` file left in the folder
    belongs to a build that is no longer running, and removing it is safe.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            print(f"[build] removing a stale lock left by an interrupted build: {stale}")
            stale.unlink()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_extension(name: str, sources: list[str | os.PathLike], *, verbose: bool = False,
                   extra_cuda_cflags: list[str] | None = None):
    """JIT-build (or load the cached build of) extension `name` from `sources`.

    `sources` are paths relative to the repository root or absolute. Returns the module.
    Raises BuildError with a readable sentence when the toolchain is missing or the
    compiler fails (the compiler's own output is printed above it by torch).
    """
    _require_toolchain()
    from torch.utils import cpp_extension

    paths = [Path(s) if Path(s).is_absolute() else REPO_ROOT / s for s in sources]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise BuildError(f"Extension {name!r} lists sources that do not exist: {missing}.")

    arch = target_arch()
    build_dir = build_dir_for(name, arch)
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    try:
        with _exclusive(build_dir):
            return cpp_extension.load(
                name=name,
                sources=[str(p) for p in paths],
                extra_cflags=CXX_FLAGS,
                extra_cuda_cflags=CUDA_FLAGS + list(extra_cuda_cflags or []),
                extra_include_paths=[str(COMMON_CSRC)],
                build_directory=str(build_dir),
                verbose=verbose,
            )
    except (RuntimeError, OSError, ImportError) as err:
        if isinstance(err, BuildError):
            raise
        raise BuildError(
            f"Building extension {name!r} failed ({type(err).__name__}: "
            f"{str(err).strip().splitlines()[-1] if str(err).strip() else 'no message'}); "
            "the compiler output above names the file and line to fix. Run "
            f"`python -m {Path(paths[0]).parent.name}.compile --verbose` to see every command."
        ) from err
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous


def is_written(source: str) -> bool:
    """False while `source` (a path from the repository root) holds a host region the student
    release replaced with its "not implemented yet" stub (common/tools/release.py): code that
    builds on that file's kernels must not run them before they are written."""
    return "is not implemented yet" not in (REPO_ROOT / source).read_text()


def call_extension(fn, *args):
    """Call an extension entry; an unwritten solution region becomes NotImplementedError.

    In the student skeleton a host function's solution region is replaced by a
    TORCH_CHECK(false, "Task N: ... is not implemented yet") (reaching Python as a RuntimeError
    or, with TORCH_CHECK_NOT_IMPLEMENTED, as NotImplementedError); either way the tests then
    report "not implemented", not a crash.
    """
    try:
        return fn(*args)
    except RuntimeError as err:
        if "not implemented" in str(err).lower():
            raise NotImplementedError(str(err).strip().splitlines()[0]) from None
        raise
    except TypeError as err:
        if "incompatible function arguments" in str(err):
            raise TypeError(wrong_argument_types(fn, err)) from None
        raise


def wrong_argument_types(fn, err: TypeError) -> str:
    """pybind11's "incompatible function arguments" (a signature dump) as one sentence: the
    entry, what it takes, and what to check. The Python entries check their arguments
    first; this is for a direct call of an extension function."""
    lines = [line.strip() for line in str(err).splitlines()]
    takes = next((line.split(". ", 1)[1] for line in lines if line[:2] == "1."), "")
    name = getattr(fn, "__name__", "the extension function")
    return (f"{name} got an argument of the wrong type; it takes {takes or 'other types'}. "
            "Pass tensors as torch.Tensor (or None where optional), flags as True/False and "
            "sizes as Python ints.")


def compile_main(task: str, load, argv=None, command: str | None = None) -> int:
    """The body of every `python -m taskN.compile` (or of another build command, `command`,
    such as task4.hopper): build, say where, exit 0/1."""
    import argparse
    import time

    command = command or f"{task}.compile"
    parser = argparse.ArgumentParser(prog=f"python -m {command}",
                                     description=f"JIT-build the {task} CUDA extension.")
    parser.add_argument("--verbose", action="store_true", help="print every compiler command")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        module = load(verbose=args.verbose)
    except BuildError as err:
        print(f"[{command}] {err}")
        return 1
    print(f"[{command}] built {module.__name__} for sm_{target_arch().replace('.', '')} "
          f"in {time.perf_counter() - start:.1f} s ({module.__file__})")
    return 0
