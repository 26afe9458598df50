"""Task 4+: the Hopper FlashAttention kernel (task4/flash_attention_hopper.cuh; its host entry
task4/flash_attention_hopper.cu, its instantiations flash_attention_hopper_{fp16,bf16}{,_general}.cu,
compiled in parallel), as an optional extension `custom_flash_attention_hopper` built for sm_90a
only.

    available()                                   True only on a compute capability 9.0 GPU
    supports(q, k, v, causal, out=None, ...)      whether the kernel takes these inputs
    tile_summary(q, k, mask)                      a mask tensor's per-tile summary (the tests')
    flash_attention_hopper(q, k, v, causal=False, version=3, out=None, lse=None, scale=None)
    flash_attention_backward_hopper(q, k, v, out, lse, d_out, causal=False, scale=None)
                                                  the backward on wgmma (dense or causal):
                                                  [dq, dk, dv]; task4/backward.py routes to it
                                                  (the default on Hopper where it applies)

`version` picks a rung of the ladder the kernel file describes: 1 = wgmma with cp.async
loads, 2 = TMA + mbarrier pipeline, 3 = warp-specialized producer/consumer warpgroups, 4 = 3 with
each consumer's softmax overlapping its own P V product, 5 = 4 with the two consumers taking
turns at the tensor cores (ping-pong), 6 = 5 with three consumer warpgroups (head_dim 64 only),
7 = 5 persistent. Head dims 64 and 128 run every rung that takes them, 96 runs on the 128 tile
(columns 96..127 zero-filled) on all but v6, 256 has a 64-key tile of its own on versions 2 and
5 (`takes_head_dim`), and a dense version-5 call at 256 runs on an 80-key tile with v4's loop
and O rescaled while S computes (FlashAttention-3's schedule at 256; ATTN_HOPPER_D256_TILE=64 or
80, read on every call, picks the 64-key tile or the 80-key tile on v5's turns, for A/B runs). Cases the kernel does not
take (other head dims, a stride, fp32, unaligned strides) are refused by `supports`; callers
fall back to the mma.sync kernel (task4.attention.flash_attention).
Windows, key lengths, mask tensors (bool or additive, summarised per 128 x 128 tile so that
empty tiles are skipped; on version 5 whichever was asked), softcap, sinks and a scale run its
general predicate (versions 2 and 5).

Build: `python -m task4.hopper` (or the first call) JIT-builds it like common.build's
load_extension (same flags, include folder, build-folder naming, flock), but always for
TORCH_CUDA_ARCH_LIST=9.0a, so nvcc gets -gencode=arch=compute_90a,code=sm_90a (wgmma and
setmaxnreg exist only there); the build folder is build/custom_flash_attention_hopper-sm9.0a-
torch<version>/. (load_extension has no arch argument yet; with one, `_load_for_arch` goes.)
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task4.hopper")

import bisect
import json
import os
import sys
from functools import lru_cache
from pathlib import Path

import torch

from common import build
from common.build import BuildError, call_extension, compile_main
from task4.manifest import HOPPER_VERSIONS, hopper_takes_head_dim

NAME = "custom_flash_attention_hopper"
# The host entry (SOURCES[1], which holds the dispatch the release stubs: is_written), then the
# instantiations, two files per element type (dense, general) so that ninja compiles them side by side.
# The backward on wgmma (issue 33) is built into the same extension (sm_90a too): its host entry
# and its instantiations, one file per element type, compiled beside the forward's.
SOURCES = ["task4/hopper_binding.cpp", "task4/flash_attention_hopper.cu",
           "task4/flash_attention_hopper_fp16.cu", "task4/flash_attention_hopper_fp16_general.cu",
           "task4/flash_attention_hopper_bf16.cu", "task4/flash_attention_hopper_bf16_general.cu",
           "task4/flash_backward_hopper.cu", "task4/flash_backward_hopper_fp16.cu",
           "task4/flash_backward_hopper_bf16.cu"]
BACKWARD_SOURCES = SOURCES[6:]
ARCH = "9.0a"  # torch turns "9.0a" into -gencode=arch=compute_90a,code=sm_90a
VERSIONS = HOPPER_VERSIONS
takes_head_dim = hopper_takes_head_dim  # (version, head_dim) -> bool: v6 is head_dim 64 only
HALF_DTYPES = (torch.float16, torch.bfloat16)


def is_written() -> bool:
    """False in the student release before the kernel is written: the release replaces the
    host dispatch with a "not implemented yet" stub (common/tools/release.py), so there is
    nothing to build or run yet."""
    return build.is_written(SOURCES[1])


def available() -> bool:
    """True on a CUDA GPU of compute capability 9.0 (H100, H200), where sm_90a code runs."""
    try:
        return torch.cuda.is_available() and is_sm90(torch.cuda.current_device())
    except (RuntimeError, AssertionError):
        return False


@lru_cache(maxsize=None)
def is_sm90(device_index: int) -> bool:
    """Whether CUDA device `device_index` is compute capability 9.0; asked once per device
    (flash_attention asks on every call, and torch's query costs microseconds each time)."""
    try:
        return torch.cuda.get_device_capability(device_index) == (9, 0)
    except (RuntimeError, AssertionError):
        return False


@lru_cache(maxsize=1)
def load(verbose: bool = False):
    """The built extension (a cached build is reused). Raises BuildError off Hopper."""
    if not available():
        raise BuildError("The Hopper kernel is built for sm_90a and runs only on a compute "
                         "capability 9.0 GPU (H100, H200); none is present.")
    return _load_for_arch(NAME, SOURCES, ARCH, verbose=verbose)


def _load_for_arch(name: str, sources: list[str], arch: str, verbose: bool = False):
    """common.build.load_extension with the architecture fixed to `arch`."""
    build._require_toolchain()
    from torch.utils import cpp_extension

    paths = [build.REPO_ROOT / s for s in sources]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise BuildError(f"Extension {name!r} lists sources that do not exist: {missing}.")
    build_dir = build.build_dir_for(name, arch)
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    try:
        with build._exclusive(build_dir):
            return cpp_extension.load(
                name=name,
                sources=[str(p) for p in paths],
                extra_cflags=build.CXX_FLAGS,
                extra_cuda_cflags=list(build.CUDA_FLAGS),
                extra_include_paths=[str(build.COMMON_CSRC)],
                build_directory=str(build_dir),
                verbose=verbose,
            )
    except (RuntimeError, OSError, ImportError) as err:
        if isinstance(err, BuildError):
            raise
        last = str(err).strip().splitlines()[-1] if str(err).strip() else "no message"
        raise BuildError(
            f"Building extension {name!r} failed ({type(err).__name__}: {last}); the compiler "
            f"output above names the file and line to fix. Run `python -m task4.hopper "
            f"--verbose` to see every command.") from err
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous


# Routing by measurement: which rung flash_attention runs, per dtype, head_dim, mask and key-length
# bucket, is what `python -m task4.hopper_ladder --routing` measured fastest on this kind of GPU
# and wrote to ROUTING_PATH (committed, with the device, torch and commit it came from, and every
# contender's TFLOP/s). A case the table lacks gets task4.attention's rules.
ROUTING_PATH = Path(__file__).with_name("hopper_routing.json")
SEQ_BUCKETS = (512, 1024, 2048, 4096, 8192, 16384)  # S_k up to each; longer keys: the last
# The rungs that take every variant (6 and 7 run a variant as 5).
ROUTING_VERSIONS = (2, 5, 6, 7)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def seq_bucket(seq_k: int) -> int:
    """The smallest bucket >= seq_k (the largest for longer sequences)."""
    return SEQ_BUCKETS[min(bisect.bisect_left(SEQ_BUCKETS, seq_k), len(SEQ_BUCKETS) - 1)]


def routing_key(dtype_name: str, head_dim: int, causal: bool, bucket: int) -> str:
    return f"{dtype_name}.d{head_dim}.{'causal' if causal else 'noncausal'}.s{bucket}"


@lru_cache(maxsize=1)
def routing() -> dict:
    """The committed routing table ({} when there is none)."""
    try:
        return json.loads(ROUTING_PATH.read_text())
    except FileNotFoundError:
        return {}


# Head dims that run on another's instantiation read its rows of the table: 96 is the 128 kernel
# with zero-filled columns (task4/flash_attention_hopper.cuh), so its rungs rank as at 128.
ROUTING_HEAD_DIM = {96: 128}


def routed_version(dtype: torch.dtype, head_dim: int, causal: bool, seq_k: int) -> int | None:
    """The measured fastest rung for these inputs, or None when the table has no such case."""
    if dtype not in DTYPE_NAMES:
        return None
    version = routing().get("versions", {}).get(
        routing_key(DTYPE_NAMES[dtype], ROUTING_HEAD_DIM.get(head_dim, head_dim), causal,
                    seq_bucket(seq_k)))
    return int(version) if version is not None and takes_head_dim(int(version), head_dim) else None


def supports(q, k, v, out=None, *, stride: int = 1, mask=None) -> bool:
    """Whether flash_attention_hopper takes these inputs here (never raises). Windows, key
    lengths, mask tensors (bool or additive, on q's device), softcap, sinks and a scale are
    taken; a stride (a per-key predicate) is not; then the dtype, head_dim, the GPU and the
    strides decide."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
            and isinstance(v, torch.Tensor)) or not q.is_cuda:
        return False
    if q.dtype not in HALF_DTYPES or stride != 1 or not is_sm90(q.get_device()):
        return False
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.device != q.device):
        return False
    try:
        ext = load()
    except BuildError:
        return False
    return bool(ext.hopper_supports(q, k, v, out, stride, mask))


def flash_attention_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           version: int = 3, out: torch.Tensor | None = None,
                           lse: torch.Tensor | None = None,
                           scale: float | None = None, *, window: int | None = None,
                           stride: int = 1, mask: torch.Tensor | None = None,
                           key_lengths: torch.Tensor | None = None, left_padding: bool = False,
                           softcap: float | None = None,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v on the Hopper kernel (scale None = 1/sqrt(D)); q [B, H_q, S_q, D],
    k/v [B, H_kv, S_k, D], with the variants of common/variants.py but a stride (versions 2, 5,
    6 and 7 take them: a window, key lengths, a mask tensor, softcap or sinks run the general
    predicate).

    Returns a new [B, H_q, S_q, D] tensor or writes `out`. Inputs it does not take raise
    ValueError / TypeError naming why (check `supports` first to fall back instead).
    """
    return call_extension(load().flash_attention_hopper, q, k, v, causal, version, out, lse,
                          scale, window, stride, mask, key_lengths, left_padding, softcap, sinks)


def flash_attention_backward_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
                                    causal: bool = False, scale: float | None = None):
    """[dq, dk, dv] of softmax(q k^T * scale) v on the wgmma backward (task4/
    flash_backward_hopper_kernel.cuh): fp16/bf16, dense or causal (bottom-right for S_q != S_k),
    GQA/MQA, head dims that are multiples of 8 from 64 to 128; `lse` [B, H_q, S_q] float32 is
    the forward's base-2 log-sum-exp. Other inputs raise ValueError naming why (task4/backward.py
    routes them to the mma.sync backward instead)."""
    return call_extension(load().flash_attention_backward_hopper, q, k, v, out, lse, d_out,
                          causal, scale)


def tile_summary(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor,
                 block_m: int = 128) -> torch.Tensor:
    """The per-tile summary the kernel builds for a mask tensor before it runs (the CUDA
    tile_summary_kernel): uint8 [mask batches, mask heads, ceil(S_q / block_m), ceil(S_k / 128)];
    tile_summary_reference says what it holds."""
    return call_extension(load().hopper_tile_summary, q, k, mask, block_m)


def tile_summary_reference(mask: torch.Tensor, seq_q: int, seq_k: int, block_m: int = 128,
                           block_n: int = 128) -> torch.Tensor:
    """What tile_summary computes, in PyTorch (any device): for each block of block_m query rows
    x block_n keys of `mask` (broadcastable to [B, H, seq_q, seq_k], bool True = keep or
    additive float), 0 when no element keeps its key (the kernel never loads the key tile), 1
    when every element keeps it with a bias of exactly 0 (no per-element work), 2 otherwise
    (some dropped, a finite nonzero bias, NaN). Rows >= seq_q and keys >= seq_k are left out.
    The mask's batch and head dimensions stay as they are (1 where it broadcasts)."""
    m = mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    m = m.expand(m.shape[0], m.shape[1], seq_q, seq_k)
    keep = m if m.dtype == torch.bool else m != float("-inf")
    clean = m if m.dtype == torch.bool else m == 0
    tiles_q, tiles_k = -(-seq_q // block_m), -(-seq_k // block_n)
    padded = (m.shape[0], m.shape[1], tiles_q * block_m, tiles_k * block_n)
    keep_p = torch.zeros(padded, dtype=torch.bool, device=m.device)
    clean_p = torch.ones(padded, dtype=torch.bool, device=m.device)
    keep_p[..., :seq_q, :seq_k] = keep
    clean_p[..., :seq_q, :seq_k] = clean
    blocks = (m.shape[0], m.shape[1], tiles_q, block_m, tiles_k, block_n)
    any_kept = keep_p.reshape(blocks).any(dim=5).any(dim=3)
    all_clean = clean_p.reshape(blocks).all(dim=5).all(dim=3)
    summary = torch.full(any_kept.shape, 2, dtype=torch.uint8, device=m.device)
    summary[all_clean] = 1
    summary[~any_kept] = 0
    return summary


if __name__ == "__main__":
    sys.exit(compile_main("task4", load, command="task4.hopper"))
