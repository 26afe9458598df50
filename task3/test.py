"""Task 3 test: FlashAttention-2 in PyTorch against nn.MultiheadAttention and float64.

    python -m task3.test                 # all groups, on the GPU if there is one
    python -m task3.test --module        # the course shapes only
    python -m task3.test --tiles         # odd lengths and unequal tile sizes

Course shapes: hidden 128, 8 heads, (B, S) = (4, 128) and (16, 4096), both masks, fp32.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task3.test")

import sys

from common.checks import check_relative, random_qkv, reference_attention
from common.harness import ModuleCase, fresh_generator, module_checks, pick_device, task_main
from task3.attention import CustomFlashAttention, flash_attention_forward

HIDDEN, HEADS, WEIGHT_SEED = 128, 8, 0
CASES = [ModuleCase(b, s, causal) for (b, s) in ((4, 128), (16, 4096)) for causal in (False, True)]


def module_group(args=None):
    device = pick_device(getattr(args, "device", None))
    return module_checks("task3", CustomFlashAttention, hidden=HIDDEN, heads=HEADS, cases=CASES,
                         weight_seed=WEIGHT_SEED, input_seed=getattr(args, "seed", None),
                         device=device, fp64_max_batch=1)


# (seq, rows_per_q_tile, rows_per_kv_tile): lengths that are not multiples of the tiles,
# unequal tiles in both directions, one token, and tiles larger than the sequence.
TILE_CASES = [(77, 16, 32), (77, 32, 16), (1, 64, 64), (100, 128, 128), (129, 64, 64)]


def tiles_group(args=None):
    device = pick_device(getattr(args, "device", None))
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    print(f"[task3] tiles: inputs seed {seed} (pass --tiles --seed {seed} to reproduce)")
    checks = []
    for seq, br, bc in TILE_CASES:
        q, k, v = random_qkv(2, 3, seq, 16, device=device, generator=gen)
        for causal in (False, True):
            out = flash_attention_forward(q, k, v, causal, rows_per_q_tile=br, rows_per_kv_tile=bc)
            name = f"S={seq} q_tile={br} kv_tile={bc} {'causal' if causal else 'noncausal'}"
            checks.append(check_relative(name, out, reference_attention(q, k, v, causal), q.dtype))
    return checks, {}


GROUPS = {"module": module_group, "tiles": tiles_group}


def main(argv=None) -> int:
    return task_main("task3", GROUPS, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
