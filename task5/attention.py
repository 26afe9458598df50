"""Task 5: the KV cache and the decode kernel (the second phase of inference).

A language model generates in two phases:

    prefill   the whole prompt [B, S, hidden] goes through attention at once (task 4's kernel),
              and every token's K and V are kept in a cache;
    decode    then one token at a time: its q, k, v are [B, 1, hidden]; k and v are appended
              to the cache (update_kv_cache), and its q attends to every cached key
              (decode_attention). Nothing about the earlier tokens is recomputed.

The cache is preallocated once, [B, max_seq_len, hidden] for K and for V (token-major, the
heads interleaved in hidden, as the projections produce them), so appending is a copy into
place and decoding reads the first `seq_len` rows where they are: no per-step slice, no
concatenation, no copy. Viewed per head, the cache is [B, H, max_seq_len, D] with strides
(max_seq_len * hidden, D, hidden, 1); the kernels take such strided views directly
(decode_attention_bhsd), which also covers Hugging Face's [B, H, S, D] cache (task 7).

A decode step reads the whole cache once and does ~2 FLOPs per byte it reads, so its speed
limit is memory bandwidth, not arithmetic. One block per (batch, head) is too few to keep the
GPU's memory busy when B * H is small (B 1, H 32: 32 blocks on 132 SMs), so the split-KV
("FlashDecoding") path cuts each head's keys into `num_splits` ranges, one block each, and a
second kernel merges the partial results with their log-sum-exp weights.
`choose_num_splits` picks the count from the SM count, B * H and the context.

The causal flag: the new query is the last token, so a causal mask hides nothing from it
(every cached key is in its past); the kernels accept the flag and it changes nothing.

CUDA graphs (task 6 captures a whole decode step): `current_pos` and `seq_len` may be CUDA
int32 tensors (0-d, or [B] for one value per sequence) instead of Python ints. The kernels then
read them from device memory when they run, so a captured graph replays correctly while the
tensor is incremented; with a tensor length the split count depends only on max_seq_len.
A value in device memory cannot be checked on the host without a synchronisation, so only int
arguments are validated (position + new tokens <= max_seq_len, 1 <= seq_len <= max_seq_len);
device values are clamped by the kernels instead: rows written outside the cache are skipped
and lengths are clamped to [0, max_seq_len] (a length of 0 gives an output of zeros).
"""

from __future__ import annotations

import math
import operator
from functools import cache

import torch
from torch import nn

from common.build import call_extension
from common.inputs import check_attention_arguments, check_flag, is_int
from common.limits import DECODE_LINEAR_MAX_ROWS, check_head_dim

# Split-KV heuristic (choose_num_splits). A decode block is 4 warps and 5-6 of them fit on an
# SM; about 2 per SM already keep enough loads in flight to saturate HBM. So: split only until
# there are TARGET_BLOCKS_PER_SM blocks per SM (rounding down, so that every block is resident
# at once and none waits for a second wave), and never into splits shorter than
# MIN_KEYS_PER_SPLIT keys, whose fixed costs (loading q, merging the warps, writing a partial)
# would start to show. Short splits pay off at short contexts, where a decode is latency:
# fewer keys per warp is fewer dependent trips to memory, and the last block of a head merges
# the splits without a second kernel. `python -m task5.test --decode` prints a sweep of forced
# split counts to tune these on a GPU.
TARGET_BLOCKS_PER_SM = 4
MIN_KEYS_PER_SPLIT = 64
MAX_AUTO_SPLITS = 128


def _ext():
    from task5.compile import load

    return load()


def choose_num_splits(batch_heads: int, context: int, num_sms: int) -> int:
    """How many blocks share the keys of one (batch, head): 1 = no split.

    floor(TARGET_BLOCKS_PER_SM * num_sms / batch_heads) blocks per head fill the GPU in one
    wave; at most context // MIN_KEYS_PER_SPLIT of them, at most MAX_AUTO_SPLITS, at least 1.
    """
    if batch_heads <= 0 or context <= 0 or num_sms <= 0:
        return 1
    wanted = TARGET_BLOCKS_PER_SM * num_sms // batch_heads
    longest = context // MIN_KEYS_PER_SPLIT
    return max(1, min(wanted, longest, MAX_AUTO_SPLITS))


@cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _auto_num_splits(q, batch_heads: int, context: int) -> int:
    if not (isinstance(q, torch.Tensor) and q.is_cuda):
        return 1  # the extension's checks say what is wrong with such an input
    return choose_num_splits(batch_heads, context, _num_sms(q.device.index))


def _int_or_tensor(value, name: str) -> tuple[int, torch.Tensor | None]:
    """A position or length as the extension takes it: (int, None) or (0, CUDA int32 tensor)."""
    if isinstance(value, torch.Tensor):
        return 0, value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a Python int or a CUDA int32 tensor, not a bool.")
    try:
        return operator.index(value), None
    except TypeError:
        raise TypeError(f"{name} must be a Python int or a CUDA int32 tensor (0-d or [batch]) "
                        f"but is a {type(value).__name__}.") from None


def _check_fresh_keys(fresh_keys) -> None:
    if fresh_keys is None:
        return
    if not is_int(fresh_keys):
        raise TypeError(f"fresh_keys must be an int (how many of each sequence's last keys the "
                        f"kernel just before may have written) or None, not "
                        f"{type(fresh_keys).__name__} {fresh_keys!r}.")
    if fresh_keys < 0:
        raise ValueError(f"fresh_keys must be >= 0 (0: no key was written just before; None: any "
                         f"may have been) but is {fresh_keys}.")


def _check_num_splits(num_splits) -> None:
    if num_splits is not None and not is_int(num_splits):
        raise TypeError(f"num_splits must be an int (blocks per head; 1 = no split) or None to "
                        f"choose it, not {type(num_splits).__name__} {num_splits!r}.")


def allocate_kv_cache(batch: int, max_seq_len: int, hidden: int, dtype=torch.float32,
                      device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """The (k_cache, v_cache) pair, each [batch, max_seq_len, hidden], allocated once."""
    shape = (batch, max_seq_len, hidden)
    return (torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device))


def update_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, current_pos) -> None:
    """Write k, v [B, n_new, hidden] into the caches [B, max_seq_len, hidden] at positions
    [current_pos, current_pos + n_new), in place (a decode step has n_new = 1; a prefill
    writes the prompt at current_pos 0).

    current_pos: a Python int (checked: current_pos + n_new <= max_seq_len), or a CUDA int32
    tensor, 0-d or [B] (one position per sequence), read on the device when the kernel runs
    (CUDA graphs); it is not checked on the host, and rows it sends outside the cache are
    skipped. fp32, fp16 and bf16; k/v and the caches may be strided (last dim contiguous).
    """
    ext = _ext()
    value, tensor = _int_or_tensor(current_pos, "current_pos")
    call_extension(ext.update_kv_cache, k_cache, v_cache, k, v, value, tensor)


def decode_attention_bhsd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len,
                          causal: bool = False, out: torch.Tensor | None = None,
                          num_splits: int | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for one query per (batch, head) against cache rows
    [0, seq_len). q [B, H, 1, D]; k, v [B, H, S_max, D], any batch/head/seq strides with a
    contiguous last dimension (read in place); returns [B, H, 1, D] (written into `out` if given).

    seq_len: a Python int in [1, S_max] (checked), or a CUDA int32 tensor, 0-d or [B], read on
    the device and clamped to [0, S_max] there (not checked on the host).
    num_splits: None picks it with choose_num_splits (from S_max when seq_len is a tensor, so
    that a captured CUDA graph does not depend on the value); 1 is the unsplit course kernel.
    """
    check_flag(causal, "causal")
    _check_num_splits(num_splits)
    ext = _ext()
    value, tensor = _int_or_tensor(seq_len, "seq_len")
    if num_splits is None:
        batch_heads = q.shape[0] * q.shape[1] if q.dim() == 4 else 0
        context = value if tensor is None else (k.shape[2] if k.dim() == 4 else 0)
        num_splits = _auto_num_splits(q, batch_heads, context)
    return call_extension(ext.decode_attention_bhsd, q, k, v, value, tensor, causal, num_splits,
                          out)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     num_heads: int, seq_len, causal: bool = False,
                     out: torch.Tensor | None = None, num_splits: int | None = None) -> torch.Tensor:
    """The course's layout: q [B, 1, hidden] against k_cache, v_cache [B, max_seq_len, hidden]
    (heads interleaved in hidden), keys [0, seq_len); returns [B, 1, hidden].

    The same kernel as decode_attention_bhsd, on the per-head views of q and the caches (made
    without copies). seq_len and num_splits as there.
    """
    check_flag(causal, "causal")
    _check_num_splits(num_splits)
    if not is_int(num_heads):
        raise TypeError(f"num_heads must be an int, not {type(num_heads).__name__} {num_heads!r}.")
    ext = _ext()
    value, tensor = _int_or_tensor(seq_len, "seq_len")
    if num_splits is None:
        batch_heads = q.shape[0] * num_heads if q.dim() == 3 and num_heads > 0 else 0
        context = value if tensor is None else (k_cache.shape[1] if k_cache.dim() == 3 else 0)
        num_splits = _auto_num_splits(q, batch_heads, context)
    return call_extension(ext.decode_attention, q, k_cache, v_cache, num_heads, value, tensor,
                          causal, num_splits, out)


def decode_attention_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                             causal: bool = False, window: int | None = None, stride: int = 1,
                             mask: torch.Tensor | None = None,
                             key_lengths: torch.Tensor | None = None,
                             left_padding: bool = False, out: torch.Tensor | None = None,
                             num_splits: int | None = None,
                             fresh_keys: int | None = None) -> torch.Tensor:
    """One query per (batch, query head) against a cache, with every attention variant.

    q [B, H_q, 1, D]; k, v [B, H_kv, S, D] (H_q a multiple of H_kv, any strides with a
    contiguous last dimension); returns [B, H_q, 1, D], or writes `out` (that shape, any
    strides with a contiguous last dimension, e.g. a view of a [B, 1, H_q, D] buffer). The
    query heads of one KV head share one pass over its keys (grouped-query attention reads
    the cache once per KV head).
    causal, window, stride, mask, key_lengths, left_padding: common/variants.py. key_lengths
    ([B] or 0-d int32 on the GPU) is read on the device, so a captured CUDA graph stays valid
    while it is incremented. num_splits: None picks it from the SM count (from S, so that a
    graph does not depend on the lengths); a number forces it on the kernel that runs
    (decode_gqa.cu for fp16/bf16 with H_q / H_kv >= 2, else the CUDA-core grouped kernel).
    fresh_keys: a promise that only each sequence's last fresh_keys keys (of its length) may
    have been written by the kernel launched just before this call, as a decode step's append
    writes its new keys (None, the default: any key may have been). decode_gqa.cu then copies
    the others while that kernel finishes (settled tiles, decode_gqa.cuh); the output is the
    same bit for bit. A wrong promise can read stale keys.
    """
    check_attention_arguments(q, k, v, causal, out, window=window, stride=stride, mask=mask,
                              key_lengths=key_lengths, left_padding=left_padding)
    _check_num_splits(num_splits)
    _check_fresh_keys(fresh_keys)
    if q.shape[2] != 1:
        raise ValueError(f"decode attends one new query per sequence: q must be [batch, heads, 1, "
                         f"head_dim] but has shape {tuple(q.shape)}; use task5.attention.attention "
                         "(up to 16 query rows on the decode kernel) for several queries.")
    return _decode_grouped_routed(q, k, v, causal, window, stride, mask, key_lengths,
                                  left_padding, out, num_splits, fresh_keys=fresh_keys)


def _decode_grouped_routed(q, k, v, causal, window, stride, mask, key_lengths, left_padding,
                           out, num_splits, softcap=None, sinks=None, scale=None,
                           fresh_keys=None):
    """The decode kernel that runs arguments already checked (decode_attention_grouped,
    attention): decode_gqa.cu where it applies (fp16/bf16, group >= 2, S_q <= 16, every
    variant); otherwise (S_q == 1 and no softcap, sinks or scale here) the tensor-core path
    of task 4's kernel for the plain grouped case when GQA_DECODE_KERNEL is off, else the
    CUDA-core grouped kernel."""
    if _gqa_kernel_applies(q, k):
        return _decode_gqa(q, k, v, causal, window, stride, mask, key_lengths, left_padding, out,
                           num_splits, softcap, sinks, scale, fresh_keys)
    if (TENSOR_CORE_DECODE and num_splits is None and window is None and stride == 1
            and mask is None and key_lengths is None and not left_padding):
        splits = _tensor_core_splits(q, k, v)
        if splits:
            return _decode_on_tensor_cores(q, k, v, splits, out)
    ext = _ext()
    if num_splits is None:   # q and k are [B, H, S, D] here (checked by the caller)
        num_splits = _auto_num_splits(q, q.shape[0] * k.shape[1], k.shape[2])
    return call_extension(ext.decode_attention_grouped, q, k, v, causal, window, stride, mask,
                          key_lengths, left_padding, num_splits, out)


# Grouped-query decode on tensor cores (task5/decode_gqa.cu; decode_gqa.cuh has the design): the
# G = H_q / H_kv query heads of a KV head (times S_q <= 16 query rows) are the rows of one
# mma tile, the keys are split across the GPU and merged by their log-sum-exp, and each warp
# keeps several K/V tiles in flight, with every variant (softcap, sinks and scale included).
# CUDA cores would do G multiply-adds per cached element and run out of issue slots long
# before memory bandwidth (Results.md has both).
TENSOR_CORE_DECODE = True       # False: always the CUDA-core grouped kernel (tests run both)
GQA_DECODE_KERNEL = True        # False: the path before decode_gqa.cu (below), for A/B timing
GQA_MIN_GROUP = 2               # MHA (one query head per KV head) stays on the course kernel
                                # and the CUDA-core grouped kernel (1: here too, for A/B)
GQA_MAX_QUERY_ROWS = 16         # S_q per sequence: speculative decoding's few rows
GQA_MAX_HEAD_DIM = 256          # its widest instantiation (common.limits.MAX_HEAD_DIM too)

# Its split count (choose_gqa_splits), in the spirit of FlashAttention-3's num_splits heuristic
# (hopper/heuristics.h) and FlashInfer's decode plan: blocks that already fill GQA_FULL_WAVE of
# the GPU's resident blocks are not split; otherwise the fewest splits whose wave efficiency
# (blocks / resident slots, over the waves that takes) is within GQA_WAVE_EFFICIENCY of the
# best, and never fewer than GQA_MIN_TILES_PER_WARP key tiles per warp of a split (the fixed
# costs of a block: Q, the merge of its warps, a partial written and merged).
# GQA_WAVE_EFFICIENCY is FlashAttention-3's 85% raised to 95%: a batch-1 decode streams at
# what its busy SMs pull (one block per SM), so every idle SM costs bandwidth, while more splits
# cost only a longer merge. A sweep of forced split counts on the H100 (fp16, D 128) found the
# counts that fill the most SMs in one wave fastest; at 85% the heuristic left 12-16 SMs idle
# (results/logs/h100_gqa_splits_merge_ab.json, which also shows the merge's loads are not what
# costs: issuing eight splits' loads at once changed nothing). Among the counts within that
# efficiency, the first that deals every warp of every split the same whole number of key tiles
# is preferred (a split of 16.5 tiles leaves half its warps a third tile while the others wait):
# 32 splits instead of 31 of 8192 keys measured faster (results/logs/h100_s9_split_counts/).
# A batch whose key lengths differ (key_lengths, several sequences): the blocks of the short
# sequences finish early and leave their SMs idle while the longest sequence's run. Twice the
# splits puts a second wave behind the first for those SMs to take, where the split count was
# more than 1 (a GPU already full of unsplit blocks balances itself) and each warp keeps at
# least GQA_LENGTHS_VARY_MIN_TILES_PER_WARP tiles. Measured on the H100 (fp16 D 128, left
# padded, results/logs/h100_gqa_varlen_splits.json): B 8 ctx 8192 is fastest at 4 splits
# (the heuristic's 2 doubled), B 4 ctx 4096 at 4 (8 would leave 4 tiles per warp), B 64 ctx
# 1024 at 1.
GQA_FULL_WAVE = 0.8
GQA_WAVE_EFFICIENCY = 0.95
GQA_MIN_TILES_PER_WARP = 2
GQA_LENGTHS_VARY_MIN_TILES_PER_WARP = 8
GQA_MAX_SPLITS = 128


def choose_gqa_splits(blocks: int, key_tiles: int, warps: int, slots: int,
                      max_splits: int = GQA_MAX_SPLITS, lengths_vary: bool = False) -> int:
    """How many key ranges decode_gqa.cu cuts the keys of each (sequence, KV head, row tile)
    into: 1 = no split.

    blocks: the unsplit blocks, batch * H_kv * row tiles; key_tiles: the key tiles a block
    may read (the cache's capacity or the window, in the kernel's tiles of keys per warp);
    warps: per block; slots: the blocks resident at once, SMs x blocks per SM; lengths_vary:
    several sequences whose key lengths (read on the device) may differ.
    """
    splits = _wave_splits(blocks, key_tiles, warps, slots, max_splits)
    if lengths_vary and splits > 1:
        limit = key_tiles // (GQA_LENGTHS_VARY_MIN_TILES_PER_WARP * warps)
        splits = max(splits, min(2 * splits, limit, max_splits))
    return splits


def _wave_splits(blocks: int, key_tiles: int, warps: int, slots: int, max_splits: int) -> int:
    """choose_gqa_splits for sequences of one length: FlashAttention-3's wave efficiency."""
    if blocks <= 0 or key_tiles <= 0 or warps <= 0 or slots <= 0:
        return 1
    if blocks >= GQA_FULL_WAVE * slots:
        return 1
    limit = max(1, min(key_tiles // (GQA_MIN_TILES_PER_WARP * warps), max_splits))
    efficiency = []
    for splits in range(1, limit + 1):
        waves = blocks * splits / slots
        efficiency.append(waves / math.ceil(waves))
    best = max(efficiency)
    candidates = [s for s, e in enumerate(efficiency, 1) if e >= GQA_WAVE_EFFICIENCY * best]
    # Among them, the first that gives every warp of every split the same number of whole tiles.
    even = [s for s in candidates if key_tiles % (s * warps) == 0]
    return even[0] if even else candidates[0]


@cache
def _gqa_geometry(device_index: int, head_dim: int, bf16: bool) -> tuple[int, int, int]:
    """(keys per warp tile, warps per block, resident blocks per SM; 0: not on this GPU)."""
    return tuple(_ext().decode_gqa_geometry(head_dim, bf16, device_index))


def _gqa_kernel_applies(q, k) -> bool:
    """Does decode_gqa.cu take this (already checked) call, and is it switched on?"""
    if not (TENSOR_CORE_DECODE and GQA_DECODE_KERNEL and isinstance(q, torch.Tensor) and q.is_cuda
            and q.dim() == 4 and k.dim() == 4 and q.dtype in (torch.float16, torch.bfloat16)):
        return False
    heads_q, seq_q, head_dim = q.shape[1], q.shape[2], q.shape[3]
    heads_kv = k.shape[1]
    if not (1 <= seq_q <= GQA_MAX_QUERY_ROWS and heads_kv >= 1
            and heads_q // heads_kv >= GQA_MIN_GROUP
            and head_dim % 8 == 0 and 0 < head_dim <= GQA_MAX_HEAD_DIM):
        return False
    return _gqa_geometry(q.device.index, head_dim, q.dtype == torch.bfloat16)[2] > 0


def gqa_num_splits(q, k, causal: bool = False, window: int | None = None,
                   key_lengths: torch.Tensor | None = None) -> int:
    """The split count decode_gqa.cu runs q [B, H_q, S_q, D] against k [B, H_kv, S_k, D] with
    (choose_gqa_splits on this GPU): from S_k, or the window, and whether key lengths are given
    for several sequences, never from the lengths' values on the device, so that a captured
    CUDA graph does not depend on them."""
    return _gqa_splits_for(q, k.shape[1], k.shape[2], causal, window,
                           lengths_vary=(key_lengths is not None and key_lengths.dim() > 0
                                         and q.shape[0] > 1))


def _gqa_splits_for(q, heads_kv: int, seq_k: int, causal: bool, window: int | None,
                    lengths_vary: bool = False) -> int:
    """gqa_num_splits for a cache of heads_kv KV heads and seq_k keys per sequence at most (a
    paged cache: max_pages * page_size; its seq_lens count as one length, as the paged bench's
    equal lengths measured)."""
    batch, heads_q, seq_q, head_dim = q.shape
    tile_keys, warps, per_sm = _gqa_geometry(q.device.index, head_dim, q.dtype == torch.bfloat16)
    keys = seq_k
    if window is not None:   # the keys one tile of rows may see
        keys = min(seq_k, window + seq_q - 1 if causal else 2 * window + seq_q - 2)
    row_tiles = math.ceil(heads_q // heads_kv * seq_q / 16)
    return choose_gqa_splits(batch * heads_kv * row_tiles, math.ceil(keys / tile_keys), warps,
                             _num_sms(q.device.index) * per_sm, lengths_vary=lengths_vary)


def _decode_gqa(q, k, v, causal, window, stride, mask, key_lengths, left_padding, out,
                num_splits, softcap, sinks, scale, fresh_keys=None):
    if num_splits is None:
        num_splits = gqa_num_splits(q, k, causal, window, key_lengths)
    return call_extension(_ext().decode_attention_gqa, q, k, v, causal, window, stride, mask,
                          key_lengths, left_padding, softcap, sinks, scale, num_splits, out,
                          fresh_keys)


# The path before decode_gqa.cu, kept for A/B timing (GQA_DECODE_KERNEL = False), plain
# fp16/bf16 grouped decode only, as FlashAttention-2 does it: the G query heads of one KV head
# are the rows of a G-row "prefill" on task 4's tensor-core kernel (its 16-row tile, one warp
# per block), and the keys are cut into `splits` ranges that are separate "heads" of a
# strided view of the cache (no copy); merge_attention_splits merges the ranges by their lse.
TENSOR_CORE_MIN_GROUP = 2       # one query head per KV head is the course kernel's job
TENSOR_CORE_MIN_KEYS_PER_SPLIT = 64


def _tensor_core_splits(q, k, v) -> int:
    """The number of key ranges for the tensor-core path, or 0 if it does not apply."""
    if not (isinstance(q, torch.Tensor) and q.is_cuda and q.dim() == 4 and k.dim() == 4
            and v.dim() == 4 and q.dtype in (torch.float16, torch.bfloat16)
            and k.dtype == q.dtype and v.dtype == q.dtype and q.shape[2] == 1
            and k.shape == v.shape and k.shape[0] == q.shape[0] and k.shape[3] == q.shape[3]
            and q.shape[3] in (64, 128) and k.shape[1] >= 1 and q.shape[1] % k.shape[1] == 0):
        return 0
    batch, heads_q, _, _ = q.shape
    heads_kv, seq = k.shape[1], k.shape[2]
    if heads_q // heads_kv < TENSOR_CORE_MIN_GROUP:
        return 0
    # The ranges are a view [B, H_kv * splits, seq / splits, D]: the heads of k and v must be
    # `seq` rows apart, rows 16-byte aligned.
    for t in (k, v):
        if t.stride(3) != 1 or t.stride(1) != seq * t.stride(2) or t.stride(2) % 8 or \
                t.stride(0) % 8 or t.data_ptr() % 16:
            return 0
    target = max(1, 4 * _num_sms(q.device.index) // (batch * heads_kv))  # measured best of 2..8
    splits = 1
    while (splits * 2 <= target and seq % (splits * 2) == 0
           and seq // (splits * 2) >= TENSOR_CORE_MIN_KEYS_PER_SPLIT and splits * 2 <= 1024):
        splits *= 2
    return splits


def _decode_on_tensor_cores(q, k, v, splits: int, out):
    from task4.compile import load as load_task4

    batch, heads_q, _, head_dim = q.shape
    heads_kv, seq = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    per_split = seq // splits

    def ranges(t):  # [B, H_kv, seq, D] -> [B, H_kv * splits, seq / splits, D], a view
        return t.as_strided((batch, heads_kv * splits, per_split, head_dim),
                            (t.stride(0), per_split * t.stride(2), t.stride(2), 1))

    # Each range's rows are the group's queries: [B, H_kv * splits, G, D] (a copy of q, small).
    rows = q.reshape(batch, heads_kv, 1, group, head_dim).expand(
        batch, heads_kv, splits, group, head_dim).reshape(batch, heads_kv * splits, group, head_dim)
    # float32 partials: rounded to q's dtype only once, after the merge.
    partial = torch.empty(rows.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, heads_kv * splits, group, dtype=torch.float32, device=q.device)
    load_task4().flash_attention_mma(rows, ranges(k), ranges(v), False, partial, None, 1, None,
                                     None, False, lse)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _ext().merge_attention_splits(partial.view(batch, heads_kv, splits, group, head_dim),
                                  lse.view(batch, heads_kv, splits, group), out)
    return out


# ---- the paged KV cache (task5/decode_paged.cu; the allocator is task5/ops.py's PageAllocator) --

PAGE_SIZES = (16, 32, 64, 128, 256)


def check_paged_arguments(q, k_pages, v_pages, block_table, seq_lens, *, validate: bool = True,
                          max_query_rows: int | None = GQA_MAX_QUERY_ROWS) -> None:
    """The paged cache's arguments, checked with sentences a student can act on.

    q [B, H_q, S_q, D]; k_pages, v_pages [num_pages, page_size, H_kv, D] of q's dtype, on q's
    device, contiguous, page_size one of PAGE_SIZES; block_table [B, max_pages] int32 and
    seq_lens [B] int32 on q's device. validate: also read seq_lens and block_table (a
    synchronisation, skipped while a CUDA graph is being captured) and raise if a length needs
    more pages than the table has or a used entry is not a page; the kernels clamp such values
    instead (they never read outside the pages or the table)."""
    tensors = (("q", q), ("k_pages", k_pages), ("v_pages", v_pages), ("block_table", block_table),
               ("seq_lens", seq_lens))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}.")
    if q.dim() != 4:
        raise ValueError(f"q must be [batch, heads, seq_q, head_dim] but has shape {tuple(q.shape)}.")
    batch, heads_q, seq_q, head_dim = q.shape
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q has dtype {q.dtype}, but the paged decode runs on tensor cores in "
                        "float16 or bfloat16; convert q and the pages with .half() or .bfloat16().")
    if max_query_rows is not None and not 1 <= seq_q <= max_query_rows:
        raise ValueError(f"the paged decode takes 1 to {max_query_rows} query rows per sequence "
                         f"but q has {seq_q} (q [batch, heads, seq_q, head_dim] = {tuple(q.shape)}); "
                         "run a longer prompt in chunks of at most that many rows.")
    for name, t in tensors[1:]:
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; put them on the same "
                             "device.")
    for name, t in (("k_pages", k_pages), ("v_pages", v_pages)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be [num_pages, page_size, kv_heads, head_dim] but has "
                             f"shape {tuple(t.shape)}.")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; they must match.")
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages and v_pages must have one shape but are {tuple(k_pages.shape)} "
                         f"and {tuple(v_pages.shape)}.")
    num_pages, page_size, heads_kv, pages_head_dim = k_pages.shape
    if page_size not in PAGE_SIZES:
        raise ValueError(f"page_size (k_pages.shape[1]) must be one of {PAGE_SIZES} but is "
                         f"{page_size}.")
    if pages_head_dim != head_dim:
        raise ValueError(f"the pages hold head_dim {pages_head_dim} but q has {head_dim}; they "
                         "must match.")
    if num_pages < 1 or heads_kv < 1 or heads_q % heads_kv:
        raise ValueError(f"q has {heads_q} heads and the pages {heads_kv} KV heads ({num_pages} "
                         "pages): the query heads must be a multiple of the KV heads, and there "
                         "must be a page.")
    for name, t in (("k_pages", k_pages), ("v_pages", v_pages)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous; pass {name}.contiguous().")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError(f"block_table and seq_lens must be int32 tensors but have dtypes "
                        f"{block_table.dtype} and {seq_lens.dtype}; create them with "
                        "dtype=torch.int32.")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] < 1:
        raise ValueError(f"block_table must be [batch, max_pages] = [{batch}, >= 1] but has shape "
                         f"{tuple(block_table.shape)}.")
    if tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens must be [{batch}] (one length per sequence) but has shape "
                         f"{tuple(seq_lens.shape)}.")
    if not validate or (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    capacity = block_table.shape[1] * page_size
    lengths = seq_lens.cpu()
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > capacity):
        worst = int(lengths.max()) if int(lengths.max()) > capacity else int(lengths.min())
        raise ValueError(f"seq_lens holds {worst}, but block_table has {block_table.shape[1]} "
                         f"pages of {page_size} tokens per sequence ({capacity} keys): the table "
                         "is too short for that length (or the length is negative); give the "
                         "sequence more pages or a longer table.")
    used = torch.arange(block_table.shape[1]).view(1, -1) * page_size < lengths.view(-1, 1)
    table = block_table.cpu()
    bad = used & ((table < 0) | (table >= num_pages))
    if bool(bad.any()):
        b, slot = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"block_table[{b}, {slot}] = {int(table[b, slot])} is not a page (0 .. "
                         f"{num_pages - 1}), but sequence {b} has {int(lengths[b])} keys and needs "
                         "it; allocate its pages with task5.ops.PageAllocator.")


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                           causal: bool = True, window: int | None = None, stride: int = 1,
                           mask: torch.Tensor | None = None, softcap: float | None = None,
                           sinks: torch.Tensor | None = None, scale: float | None = None,
                           out: torch.Tensor | None = None, num_splits: int | None = None,
                           validate: bool = True) -> torch.Tensor:
    """Decode (or a prefill chunk of S_q <= 16 rows) through a paged KV cache.

    q [B, H_q, S_q, D] (fp16/bf16, D a multiple of 8 up to 256) attends to the keys of the
    pages k_pages, v_pages [num_pages, page_size, H_kv, D]: sequence b's key t is row
    t % page_size of page block_table[b, t // page_size], and it has seq_lens[b] keys
    (int32 on the GPU, read there: a captured CUDA graph stays valid as the lengths grow and
    pages are added to the table). Its queries are its last S_q positions (causal is
    bottom-right aligned). window, stride, mask (broadcastable to [B, H_q, S_q, max_pages *
    page_size]), softcap, sinks and scale as in common/variants.py. The kernel is
    decode_gqa.cu's, through the block table (task5/decode_paged.cu). num_splits: None picks
    it from the table's capacity (or the window), never from the lengths. validate: see
    check_paged_arguments (pass False in a timed loop). Returns [B, H_q, S_q, D] (or `out`).
    """
    check_flag(causal, "causal")
    _check_num_splits(num_splits)
    check_paged_arguments(q, k_pages, v_pages, block_table, seq_lens, validate=validate)
    if not q.is_cuda:
        raise ValueError("the paged decode runs on a CUDA GPU; q is on the CPU (the float64 "
                         "reference is task5.ops.reference_paged_attention).")
    if num_splits is None:
        capacity = block_table.shape[1] * k_pages.shape[1]
        num_splits = _gqa_splits_for(q, k_pages.shape[2], capacity, causal, window)
    return call_extension(_ext().decode_attention_paged, q, k_pages, v_pages, block_table,
                          seq_lens, causal, window, stride, mask, softcap, sinks, scale,
                          num_splits, out)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              window: int | None = None, stride: int = 1, mask: torch.Tensor | None = None,
              key_lengths: torch.Tensor | None = None, left_padding: bool = False,
              out: torch.Tensor | None = None, softcap: float | None = None,
              sinks: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Attention with every variant of common/variants.py on the fastest kernel that fits.

    q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D] -> [B, H_q, S_q, D]. On the GPU a decode runs a
    decode kernel: fp16/bf16 grouped-query attention with S_q <= 16 runs decode_gqa.cu with
    every variant, other single query rows the grouped decode kernel (softcap, sinks and scale
    the prefill kernels); longer queries run task 4's prefill kernels. On the CPU it is
    PyTorch's attention in the input dtype (common.variants.pytorch_attention_variant), the
    twin the tests compare with. The arguments are checked once, here, whichever runs.
    """
    check_attention_arguments(q, k, v, causal, out, window=window, stride=stride, mask=mask,
                              key_lengths=key_lengths, left_padding=left_padding,
                              softcap=softcap, sinks=sinks, scale=scale,
                              kernel=isinstance(q, torch.Tensor) and q.is_cuda)
    if not q.is_cuda:
        from common.variants import Variant, pytorch_attention_variant

        result = pytorch_attention_variant(q, k, v, Variant(causal, window, stride, mask,
                                                            key_lengths, left_padding, softcap,
                                                            sinks, scale))
        return result if out is None else out.copy_(result)
    # decode_gqa.cu takes up to 16 query rows with every variant (fp16/bf16, group >= 2); the
    # other decode kernels do not take softcap, sinks or scale: such a query row goes to the
    # prefill kernels, which handle S_q == 1 as well (one query tile, mostly empty).
    scores_changed = softcap is not None or sinks is not None or scale is not None
    # The decode kernels have no backward: rows whose gradient autograd needs take task 4's
    # differentiable prefill path (task4/backward.py) instead, whatever S_q.
    from task4.backward import wants_grad

    decode = _gqa_kernel_applies(q, k) or (q.shape[2] == 1 and not scores_changed)
    if decode and not wants_grad(q, k, v, mask, sinks):
        return _decode_grouped_routed(q, k, v, causal, window, stride, mask, key_lengths,
                                      left_padding, out, None, softcap, sinks, scale)
    from task4.attention import flash_attention_unchecked

    return flash_attention_unchecked(q, k, v, causal, out, window, stride, mask, key_lengths,
                                     left_padding, softcap=softcap, sinks=sinks, scale=scale)


def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) (+ residual) for the few token rows of a decode step.

    A decode step is bound by reading the weights once; decode_linear.cu streams them at
    memory speed where cuBLAS, at 4 rows, does not (see its header). It takes x [..., K] with at
    most DECODE_LINEAR_MAX_ROWS rows in all, contiguous, K * element size a multiple of 16
    bytes; anything else (a prefill, a CPU tensor, an odd K) goes to torch's F.linear, so the
    result never depends on which path ran beyond fp32 rounding. Not part of the course's
    tasks: the task 6 and task 7 models call it in their decode steps.
    """
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    usable = (x.is_cuda and 1 <= rows <= DECODE_LINEAR_MAX_ROWS and x.is_contiguous()
              and weight.is_contiguous() and x.dtype == weight.dtype
              and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
              and (x.shape[-1] * x.element_size()) % 16 == 0
              and x.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0
              and (residual is None or residual.is_contiguous()))
    if not usable:
        out = torch.nn.functional.linear(x, weight, bias)
        return out if residual is None else out + residual
    return _ext().decode_linear(x, weight, bias, residual)


class CustomFlashAttention(nn.Module):
    """Multi-head self-attention with a KV cache: task 4's kernel for the prompt, the decode
    kernel for each new token.

    w_q, w_k, w_v, w_o: [hidden_dim, hidden_dim] (y = x @ w.T + b); b_q, b_k, b_v, b_o: optional
    [hidden_dim] biases (GPT-2 has them). fp32, fp16 or bf16 (x, weights and cache alike).
    """

    def __init__(self, w_q, w_k, w_v, w_o, hidden_dim: int, num_heads: int,
                 b_q=None, b_k=None, b_v=None, b_o=None):
        super().__init__()
        if num_heads <= 0 or hidden_dim % num_heads != 0:
            raise ValueError(f"hidden_dim {hidden_dim} is not divisible by num_heads {num_heads}.")
        check_head_dim(hidden_dim // num_heads, "use more heads")
        self.w_q, self.w_k, self.w_v, self.w_o = w_q, w_k, w_v, w_o
        self.b_q, self.b_k, self.b_v, self.b_o = b_q, b_k, b_v, b_o
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """[B, S, hidden] -> [B, H, S, D], a view (no copy)."""
        batch, seq, _ = t.shape
        return t.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                decode: bool = False, current_pos=0, causal: bool = False) -> torch.Tensor:
        """x [B, S, hidden] -> [B, S, hidden].

        kv_cache: (k_cache, v_cache), each [B, max_seq_len, hidden] (allocate_kv_cache).
        decode=False (prefill): S prompt tokens written to the cache at current_pos, which must
        be 0, and attended with task 4's flash_attention. decode=True: S must be 1; the token
        is written at current_pos (an int or a CUDA int32 tensor, see update_kv_cache) and
        attends to the current_pos + 1 cached tokens.
        """
        if x.dim() != 3 or x.shape[-1] != self.hidden_dim:
            raise ValueError(f"x must be [batch, seq, {self.hidden_dim}] but has shape "
                             f"{tuple(x.shape)}.")
        batch, seq, _ = x.shape
        k_cache, v_cache = kv_cache
        if decode and seq != 1:
            raise ValueError(f"decode takes one new token per sequence (x [batch, 1, hidden]) but "
                             f"x has {seq}; run the prompt with decode=False first.")
        if not decode:
            position, tensor = _int_or_tensor(current_pos, "current_pos")
            if tensor is not None or position != 0:
                raise ValueError("prefill (decode=False) writes the prompt at current_pos 0 (an "
                                 f"int) but got current_pos={current_pos!r}; extend a cache one "
                                 "token at a time with decode=True.")
        # BEGIN SOLUTION
        # HINT: Project x to q, k, v: nn.functional.linear(x, w, b) = x @ w.T + b (b may be
        # HINT: None). Append k and v to the caches with update_kv_cache at current_pos.
        # HINT: Decode: attend q to the current_pos + 1 cached tokens with decode_attention.
        # HINT: Prefill: task 4's flash_attention (from task4.attention import flash_attention)
        # HINT: on the head views of q, k, v (self._split_heads: no copies), then merge the
        # HINT: heads back to [B, S, hidden]. Finally the output projection with w_o, b_o.
        q = nn.functional.linear(x, self.w_q, self.b_q)
        k = nn.functional.linear(x, self.w_k, self.b_k)
        v = nn.functional.linear(x, self.w_v, self.b_v)
        update_kv_cache(k_cache, v_cache, k, v, current_pos)
        if decode:
            # current_pos + 1 is an int, or a new device tensor (fine inside a CUDA graph).
            out = decode_attention(q, k_cache, v_cache, self.num_heads, current_pos + 1,
                                   causal=causal)
        else:
            from task4.attention import flash_attention

            heads = flash_attention(self._split_heads(q), self._split_heads(k),
                                    self._split_heads(v), causal=causal)
            out = heads.transpose(1, 2).reshape(batch, seq, self.hidden_dim)
        return nn.functional.linear(out, self.w_o, self.b_o)
        # END SOLUTION
