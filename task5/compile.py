"""Build the task 5 extension `custom_flash_attention_decode`:  python -m task5.compile"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task5.compile")

import sys
from functools import lru_cache

from common.build import compile_main, load_extension

NAME = "custom_flash_attention_decode"
# The kernels with many instantiations are compiled in one file per element type (no torch
# header), beside their host entries, so that ninja builds them side by side: decode_grouped*,
# decode_gqa* and decode_linear* (results/logs/cpu_nvcc_decode_split.txt).
SOURCES = ["task5/binding.cpp", "task5/decode.cu",
           "task5/decode_grouped.cu", "task5/decode_grouped_fp32.cu", "task5/decode_grouped_fp16.cu",
           "task5/decode_grouped_bf16.cu",
           "task5/decode_gqa.cu", "task5/decode_gqa_fp16.cu", "task5/decode_gqa_bf16.cu",
           "task5/decode_paged.cu",
           "task5/decode_linear.cu", "task5/decode_linear_fp32.cu", "task5/decode_linear_fp16.cu",
           "task5/decode_linear_bf16.cu",
           "task5/norm.cu", "task5/rope_append.cu"]


@lru_cache(maxsize=1)
def load(verbose: bool = False):
    """The built extension module (a cached build is reused, a missing one is built)."""
    return load_extension(NAME, SOURCES, verbose=verbose)


if __name__ == "__main__":
    sys.exit(compile_main("task5", load))
