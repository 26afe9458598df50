"""Build the task 2 extension `custom_self_attention`:  python -m task2.compile"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task2.compile")

import sys
from functools import lru_cache

from common.build import compile_main, load_extension

NAME = "custom_self_attention"
SOURCES = ["task2/binding.cpp", "task2/attention_kernel.cu"]


@lru_cache(maxsize=1)
def load(verbose: bool = False):
    """The built extension module (a cached build is reused, a missing one is built)."""
    return load_extension(NAME, SOURCES, verbose=verbose)


if __name__ == "__main__":
    sys.exit(compile_main("task2", load))
