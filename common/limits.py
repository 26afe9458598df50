"""What the kernels of tasks 4 and 5 accept: the one home of these numbers.

Python code checks against these constants (`supports`, `check_head_dim`, the fused decode
wrappers' fallbacks), and `common.build` passes the same values to every extension build as
-D defines (`-DATTN_MAX_HEAD_DIM=256 -DATTN_HEAD_DIM_MULTIPLE=8 ...`, nvcc and the C++
compiler alike; `common.tools.compile_check` too), so a kernel uses the macros, never a
literal of its own.

The reasons: head_dim <= 256 sizes the attention kernels' registers and shared memory; each
kernel instantiates a separate tile configuration for head dims above 128 (fewer query rows per
block, or fewer pipeline stages), chosen at dispatch, so head dims up to 128 keep the tiles they
had. The backward kernels (task4/flash_backward.cu) take head dims up to BACKWARD_MAX_HEAD_DIM
only. A multiple of 8 keeps every row 16-byte aligned for fp16/bf16
vector loads (8 halves) and the tensor-core fragments whole. decode_linear keeps a
[rows][4] accumulator per lane in registers, one template instance per row count, so it takes
at most DECODE_LINEAR_MAX_ROWS rows (a decode step's batch). The norm kernel holds a row in
registers, NORM_MAX_PIECES_PER_THREAD 16-byte pieces per thread of a block of at most
NORM_MAX_THREADS: longer rows fall back to PyTorch.
"""

from __future__ import annotations

MAX_HEAD_DIM = 256
BACKWARD_MAX_HEAD_DIM = 128       # task4/flash_backward.cu's widest tile
HEAD_DIM_MULTIPLE = 8
DECODE_LINEAR_MAX_ROWS = 8          # task5/decode_linear.cuh (and decode_swiglu)
DECODE_LINEAR_K_SPLITS = (1, 2, 4)  # its warps per row along K (divisors of a block's 4 warps)
NORM_MAX_THREADS = 1024             # task5/norm.cu: one block per row
NORM_MAX_PIECES_PER_THREAD = 8
NORM_MAX_PIECES = NORM_MAX_THREADS * NORM_MAX_PIECES_PER_THREAD   # 16-byte pieces of one row

# The preprocessor names the extensions see, and their values.
DEFINES = {"ATTN_MAX_HEAD_DIM": MAX_HEAD_DIM, "ATTN_HEAD_DIM_MULTIPLE": HEAD_DIM_MULTIPLE,
           "ATTN_BACKWARD_MAX_HEAD_DIM": BACKWARD_MAX_HEAD_DIM,
           "ATTN_DECODE_LINEAR_MAX_ROWS": DECODE_LINEAR_MAX_ROWS,
           "ATTN_NORM_MAX_THREADS": NORM_MAX_THREADS,
           "ATTN_NORM_MAX_PIECES_PER_THREAD": NORM_MAX_PIECES_PER_THREAD}


def define_flags() -> list[str]:
    """['-DATTN_MAX_HEAD_DIM=256', ...] for nvcc and the C++ compiler: one per DEFINES entry."""
    return [f"-D{name}={value}" for name, value in DEFINES.items()]


def describe() -> str:
    """The rule, as error messages say it."""
    return f"a multiple of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}"


def supports(head_dim: int) -> bool:
    """Do the task 4 and task 5 kernels take this head_dim?"""
    return 0 < head_dim <= MAX_HEAD_DIM and head_dim % HEAD_DIM_MULTIPLE == 0


def unsupported_reason(head_dim: int) -> str | None:
    """None if the kernels take `head_dim`; else one sentence saying why not."""
    if supports(head_dim):
        return None
    return f"head_dim {head_dim} is not {describe()}, which the attention kernels take"


def check_head_dim(head_dim: int, hint: str = "") -> None:
    """ValueError naming the rule (and `hint`, what to do instead) if the kernels refuse it."""
    reason = unsupported_reason(head_dim)
    if reason:
        raise ValueError(reason + (f"; {hint}" if hint else "") + ".")
