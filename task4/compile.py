"""Build the task 4 extension `custom_flash_attention`:  python -m task4.compile"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task4.compile")

import sys
from functools import lru_cache

from common.build import compile_main, load_extension

NAME = "custom_flash_attention"
SOURCES = ["task4/binding.cpp", "task4/flash_attention.cu", "task4/flash_attention_mma.cu",
           "task4/flash_attention_mma_fp16.cu", "task4/flash_attention_mma_bf16.cu",
           "task4/flash_backward.cu", "task4/flash_backward_mma.cu",
           "task4/flash_backward_mma_fp16.cu", "task4/flash_backward_mma_bf16.cu",
           "task4/flash_backward_mma_2d_fp16.cu", "task4/flash_backward_mma_2d_bf16.cu"]


@lru_cache(maxsize=1)
def load(verbose: bool = False):
    """The built extension module (a cached build is reused, a missing one is built)."""
    return load_extension(NAME, SOURCES, verbose=verbose)


if __name__ == "__main__":
    sys.exit(compile_main("task4", load))
