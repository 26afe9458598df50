"""Task 1 test: the naive PyTorch attention against nn.MultiheadAttention.

    python -m task1.test            # runs on the GPU if there is one, else on the CPU

hidden 128, 8 heads, B 4, S 10, non-causal and causal, fp32 (the course's shapes).
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task1.test")

import sys

from common.harness import ModuleCase, module_checks, pick_device, task_main
from task1.attention import CustomSelfAttention

HIDDEN, HEADS, WEIGHT_SEED = 128, 8, 0
CASES = [ModuleCase(4, 10, causal=False), ModuleCase(4, 10, causal=True)]


def attention_checks(args=None):
    seed = getattr(args, "seed", None)
    device = pick_device(getattr(args, "device", None))
    return module_checks("task1", CustomSelfAttention, hidden=HIDDEN, heads=HEADS, cases=CASES,
                         weight_seed=WEIGHT_SEED, input_seed=seed, device=device)


GROUPS = {"attention": attention_checks}


def main(argv=None) -> int:
    return task_main("task1", GROUPS, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
