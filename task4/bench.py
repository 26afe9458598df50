"""Benchmark the fp16/bf16 tensor-core kernel against PyTorch SDPA (FLASH and cuDNN backends).

    python -m task4.bench                        # default tile config, fp16 and bf16
    python -m task4.bench --configs 0,1,2        # also every tile config, in the same run
    python -m task4.bench --dtype fp16 --seed 1

Shapes (B, H, S, D) = (4, 32, 4096, 128) and (8, 32, 2048, 64), both masks. Same inputs for
every kernel, medians of CUDA events (common.timing). Prints the table and the acceptance
checks (ours >= 0.9x SDPA's FLASH backend); it records nothing: `python -m task4.test
--mma-bench` records the figures in results/<gpu>.json. The timing is task4.mma_checks'.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task4.bench")

import argparse
import sys

from common.build import BuildError
from common.checks import report
from common.harness import pick_device
from task4.mma_checks import add_arguments, mma_benchmark


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m task4.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for the random inputs (default: fresh each run)")
    parser.add_argument("--device", default=None, help="cuda (the default when present)")
    args = parser.parse_args(argv)
    if pick_device(args.device).type != "cuda":
        print("[task4.bench] needs a CUDA GPU; none is visible to torch here.")
        return 1
    try:
        checks, _ = mma_benchmark(args)
    except BuildError as err:
        print(f"[task4.bench] {err}")
        return 1
    return report("task4.bench: fp16/bf16 kernel vs SDPA", checks)


if __name__ == "__main__":
    sys.exit(main())
