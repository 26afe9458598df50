"""The attention operations tasks 6 and 7 run their models on: our kernels, or the same in PyTorch.

One contract, two implementations, so a model is written once against it: task 6's decoder
(task6/model.py), task 7's GPT-2 loop (task7/inference.py) and its Hugging Face attention
function (task7/hf_attention.py):

    allocate_kv_cache(batch, max_seq_len, hidden, dtype, device) -> (k_cache, v_cache)
        each [B, max_seq_len, hidden]: token-major, the heads interleaved in hidden (task 5).
    update_kv_cache(k_cache, v_cache, k, v, current_pos: int | Tensor)
        k, v [B, n_new, hidden] written at positions [current_pos, current_pos + n_new).
    flash_attention(q, k, v, causal=False) -> [B, H, S, D]          (task 4)
        q, k, v [B, H, S, D] views whose last dimension is contiguous.
    decode_attention(q, k_cache, v_cache, num_heads, seq_len, fresh_keys=None) -> [B, 1, hidden]
        one query per sequence against cache positions [0, seq_len)   (task 5).
        fresh_keys: the decode step's promise that the kernel just before wrote only each
        sequence's last fresh_keys positions (its append); a hint, same output.
    decode_attention_bhsd(q, k, v, seq_len) -> [B, H, 1, D]         (task 5)
        the same on [B, H, S_max, D] views (Hugging Face's cache layout).
    decode_linear(x, weight, bias=None, residual=None) -> x @ weight.T (+ bias) (+ residual)
        the few-row products of a decode step (task 5's decode_linear.cu; not graded).

and the fused kernels of a decode step (task5/fused.py, not graded):

    add_norm(x, weight, bias=None, eps=1e-5, residual=None, rms=False) -> out | (out, x + residual)
        LayerNorm / RMSNorm of x's rows, after the residual add when one is given.
    rope_append(q, k, v, k_cache, v_cache, cos, sin, current_pos) -> q rotated [B, S, Hq, D]
        RoPE on q [B, S, Hq, D] and k [B, S, Hkv, D] at positions current_pos + s (fp32
        tables [max_len, D]), and the rotated k and v written into the caches.
    decode_swiglu(x, weight, bias=None, residual=None) -> silu(gate) * up (+ residual)
        [gate, up] = x @ weight.T (+ bias), weight the stacked [2 * width, K].

Grouped-query attention: the caches may hold fewer heads than q (hidden_kv = H_kv * D, with
H_q a multiple of H_kv); decode_attention and flash_attention then give query head h the KV
head h // (H_q / H_kv), as Llama, Mistral and Qwen do.

`current_pos` and `seq_len` are Python ints or CUDA int32 tensors read on the device, which
is what lets a CUDA graph replay the decode step while the position advances in place.

The paged KV cache (beyond the course; task5/decode_paged.cu): PageAllocator hands pages
[num_pages, page_size, H_kv, D] to sequences through a block table as they grow and takes a
finished sequence's back; paged_rope_append and paged_attention run a model's layer on it,
on our kernels or in PyTorch (any device); gather_pages and reference_paged_attention are
the layout and the float64 truth the tests read.

`kernel_ops()` imports the task 4 and task 5 extensions (built on first use). `torch_ops()`
does the same work with torch.nn.functional.scaled_dot_product_attention: it runs on a CPU,
so the loop and the mask handling are tested where there is no GPU, and it is the yardstick
the kernels must agree with.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionOps:
    name: str
    allocate_kv_cache: Callable
    update_kv_cache: Callable
    flash_attention: Callable
    decode_attention: Callable
    decode_attention_bhsd: Callable
    decode_linear: Callable
    add_norm: Callable
    rope_append: Callable
    decode_swiglu: Callable


# --- our kernels ------------------------------------------------------------------------

@cache
def kernel_ops() -> AttentionOps:
    """Task 4's flash_attention and task 5's cache, decode and decode_linear kernels (CUDA)."""
    # Imported here, not at the top: this module must import on machines without the
    # extensions (a CPU), and building them is needed only when they are used.
    task4 = importlib.import_module("task4.attention")
    task5 = importlib.import_module("task5.attention")
    fused = importlib.import_module("task5.fused")

    def decode_attention(q, k_cache, v_cache, num_heads, seq_len, causal=False, out=None,
                         num_splits=None, fresh_keys=None):
        if k_cache.shape[-1] == q.shape[-1]:   # as many KV heads as query heads: the course kernel
            return task5.decode_attention(q, k_cache, v_cache, num_heads, seq_len, causal, out,
                                          num_splits)
        # Grouped-query: the per-head views of the caches, the grouped decode kernel, with the
        # length read on the device when it is a tensor (CUDA graphs), and the step's promise
        # of which keys its append wrote (fresh_keys) passed on.
        q_heads, k_heads, v_heads = _head_views(q, k_cache, v_cache, num_heads)
        lengths = seq_len if isinstance(seq_len, torch.Tensor) else None
        if lengths is None:
            k_heads, v_heads = k_heads[:, :, :seq_len], v_heads[:, :, :seq_len]
        o = task5.decode_attention_grouped(q_heads, k_heads, v_heads, key_lengths=lengths,
                                           num_splits=num_splits, fresh_keys=fresh_keys)
        return _finish(o.transpose(1, 2).reshape(q.shape), out)

    return AttentionOps("kernels", task5.allocate_kv_cache, task5.update_kv_cache,
                        task4.flash_attention, decode_attention, task5.decode_attention_bhsd,
                        task5.decode_linear, fused.add_norm, fused.rope_append,
                        fused.decode_swiglu)


def _head_views(q, k_cache, v_cache, num_heads):
    """q [B, 1, H_q * D] and the caches [B, L, H_kv * D] as [B, H, S, D] views (no copies)."""
    head_dim = q.shape[-1] // num_heads
    kv_heads = k_cache.shape[-1] // head_dim
    if num_heads <= 0 or q.shape[-1] % num_heads or k_cache.shape[-1] % head_dim \
            or num_heads % max(kv_heads, 1):
        raise ValueError(f"q has {q.shape[-1]} features for {num_heads} heads and the caches "
                         f"{k_cache.shape[-1]}: the caches must hold H_kv heads of the same "
                         "head_dim, H_kv dividing the number of query heads.")

    def heads(t, count):  # [B, S, count * D] -> [B, count, S, D], a view
        return t.view(t.shape[0], t.shape[1], count, head_dim).transpose(1, 2)

    return heads(q, num_heads), heads(k_cache, kv_heads), heads(v_cache, kv_heads)


def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """k, v [B, H_kv, S, D] repeated to q's H_q heads (query head h reads KV head h // group)."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


# --- the same in plain PyTorch ------------------------------------------------------------

def _torch_allocate_kv_cache(batch, max_seq_len, hidden, dtype, device):
    shape = (batch, max_seq_len, hidden)
    return (torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device))


def _torch_update_kv_cache(k_cache, v_cache, k, v, current_pos):
    n_new = k.shape[1]
    if isinstance(current_pos, torch.Tensor):
        # index_copy_ with positions computed on the device: no host sync, so it can be
        # captured in a CUDA graph like the kernel.
        rows = current_pos.reshape(()).long() + torch.arange(n_new, device=k.device)
        k_cache.index_copy_(1, rows, k)
        v_cache.index_copy_(1, rows, v)
    else:
        k_cache[:, current_pos:current_pos + n_new].copy_(k)
        v_cache[:, current_pos:current_pos + n_new].copy_(v)


def _finish(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result.contiguous()
    out.copy_(result)
    return out


def _torch_flash_attention(q, k, v, causal=False, out=None):
    k, v = _repeat_kv(q, k, v)
    return _finish(F.scaled_dot_product_attention(q, k, v, is_causal=causal), out)


def _visible_keys(seq_len, max_len: int, device) -> torch.Tensor | None:
    """Boolean [B or 1, 1, 1, max_len] mask of positions < seq_len, or None for an int."""
    if not isinstance(seq_len, torch.Tensor):
        return None
    lengths = seq_len.reshape(-1, 1).to(device)
    keep = torch.arange(max_len, device=device).unsqueeze(0) < lengths
    return keep[:, None, None, :]


def _torch_decode_attention_bhsd(q, k, v, seq_len, causal=False, out=None, num_splits=None):
    # A single query is the last position, so the causal mask hides nothing: causal is moot.
    keep = _visible_keys(seq_len, k.shape[2], k.device)
    if keep is None:
        k, v = k[:, :, :seq_len], v[:, :, :seq_len]
    k, v = _repeat_kv(q, k, v)
    return _finish(F.scaled_dot_product_attention(q, k, v, attn_mask=keep), out)


def _torch_decode_attention(q, k_cache, v_cache, num_heads, seq_len, causal=False, out=None,
                            num_splits=None, fresh_keys=None):
    o = _torch_decode_attention_bhsd(*_head_views(q, k_cache, v_cache, num_heads), seq_len)
    return _finish(o.transpose(1, 2).reshape(q.shape), out)


def _torch_decode_linear(x, weight, bias=None, residual=None):
    out = F.linear(x, weight, bias)
    return out if residual is None else out + residual


def _torch_rope_append(q, k, v, k_cache, v_cache, cos, sin, current_pos):
    """RoPE in the rotate-half form (task6/rope.py) at positions current_pos + s, computed
    as task 6's apply_rope does (x * cos, then the two addcmuls), and the cache write."""
    seq, half = q.shape[1], q.shape[-1] // 2
    if isinstance(current_pos, torch.Tensor):
        rows = current_pos.reshape(()).long() + torch.arange(seq, device=cos.device)
        cos, sin = cos.index_select(0, rows), sin.index_select(0, rows)
    else:
        cos, sin = cos[current_pos:current_pos + seq], sin[current_pos:current_pos + seq]
    cos = cos.to(q.dtype)[None, :, None, :]
    sin = sin.to(q.dtype)[None, :, None, :half]

    def rotate(x):
        out = x * cos
        out[..., :half].addcmul_(x[..., half:], sin, value=-1.0)
        out[..., half:].addcmul_(x[..., :half], sin)
        return out

    _torch_update_kv_cache(k_cache, v_cache, rotate(k).flatten(2), v.flatten(2), current_pos)
    return rotate(q)


@cache
def torch_ops() -> AttentionOps:
    """The same operations with PyTorch's scaled_dot_product_attention (any device)."""
    from task5.fused import torch_add_norm, torch_swiglu

    return AttentionOps("torch", _torch_allocate_kv_cache, _torch_update_kv_cache,
                        _torch_flash_attention, _torch_decode_attention,
                        _torch_decode_attention_bhsd, _torch_decode_linear, torch_add_norm,
                        _torch_rope_append, torch_swiglu)


BACKENDS = ("auto", "kernels", "torch")


def ops_for(device: torch.device | str, backend: str = "auto") -> AttentionOps:
    """'kernels' (CUDA only), 'torch' (anywhere), or 'auto': kernels on a GPU, torch on a CPU."""
    device = torch.device(device)
    if backend not in BACKENDS:
        raise ValueError(f"Unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}.")
    if backend == "auto":
        backend = "kernels" if device.type == "cuda" else "torch"
    if backend == "kernels":
        if device.type != "cuda":
            raise ValueError("The course kernels run on a CUDA GPU only; on this device pass "
                             "--attention torch (PyTorch's SDPA) instead.")
        return kernel_ops()
    return torch_ops()


# --- the paged KV cache's bookkeeping (task5/decode_paged.cu is its decode kernel) -----------

class OutOfPagesError(RuntimeError):
    """No free page is left for a sequence that grows (PageAllocator.reserve)."""


class PageAllocator:
    """Pages of a paged KV cache, handed to sequences as they grow and taken back when they end.

    The cache is k_pages, v_pages [num_pages, page_size, H_kv, D] (allocate_paged_kv_cache);
    this class owns the two tensors the kernels read through it, on `device`:

        block_table  [batch, max_pages] int32   page j of sequence b (-1: none)
        seq_lens     [batch] int32              the tokens sequence b holds

    and a host copy of both, so that handing out a page never waits for the GPU. They are
    updated in place (a captured CUDA graph that reads them stays valid as pages are added).

        alloc = PageAllocator(num_pages=64, page_size=16, batch=4, max_pages=8)
        start = alloc.append(seq=2, tokens=5)   # pages for 5 more tokens; their first position
        alloc.free(seq=2)                       # sequence 2 is done: its pages are free again

    `shuffle` (a seed) hands pages out in a random order, as a long-running server's free list
    would be: the tests use it so that no kernel can rely on a sequence's pages being adjacent.
    """

    def __init__(self, num_pages: int, page_size: int, batch: int, max_pages: int,
                 device="cuda", shuffle: int | None = None):
        from task5.attention import PAGE_SIZES

        for name, value in (("num_pages", num_pages), ("batch", batch), ("max_pages", max_pages)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}.")
        if page_size not in PAGE_SIZES:
            raise ValueError(f"page_size must be one of {PAGE_SIZES} (the paged decode's tiles "
                             f"are 16 keys; a shift divides by it) but is {page_size!r}.")
        self.num_pages, self.page_size = num_pages, page_size
        self.batch, self.max_pages = batch, max_pages
        self.device = torch.device(device)
        self._free = list(range(num_pages - 1, -1, -1))     # pop() hands out page 0 first
        if shuffle is not None:
            import random

            random.Random(shuffle).shuffle(self._free)
        self._pages: list[list[int]] = [[] for _ in range(batch)]
        self._host_table = torch.full((batch, max_pages), -1, dtype=torch.int32)
        self._host_lens = torch.zeros(batch, dtype=torch.int32)
        self.block_table = self._host_table.to(self.device, copy=True)
        self.seq_lens = self._host_lens.to(self.device, copy=True)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def capacity(self) -> int:
        """The most tokens one sequence can hold: max_pages * page_size."""
        return self.max_pages * self.page_size

    def length(self, seq: int) -> int:
        return int(self._host_lens[self._check_seq(seq)])

    def pages(self, seq: int) -> list[int]:
        """Sequence seq's pages, in order (a copy)."""
        return list(self._pages[self._check_seq(seq)])

    def _check_seq(self, seq) -> int:
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < self.batch:
            raise ValueError(f"seq must be a sequence index in [0, {self.batch}) but is {seq!r}.")
        return seq

    def reserve(self, seq: int, length: int) -> None:
        """Give sequence seq the pages `length` tokens need (its length does not change)."""
        self._reserve(seq, length)
        self._upload()

    def _reserve(self, seq: int, length: int) -> None:
        seq = self._check_seq(seq)
        if length > self.capacity:
            raise ValueError(f"sequence {seq} would hold {length} tokens, but its block_table row "
                             f"has {self.max_pages} pages of {self.page_size} tokens "
                             f"({self.capacity} tokens); allocate a longer table (max_pages).")
        needed = -(-length // self.page_size) - len(self._pages[seq])
        if needed > len(self._free):
            raise OutOfPagesError(
                f"out of pages: sequence {seq} needs {needed} more page(s) of {self.page_size} "
                f"tokens to hold {length} tokens, but only {len(self._free)} of {self.num_pages} "
                "pages are free; free finished sequences (free(seq)) or allocate more pages.")
        for _ in range(max(needed, 0)):
            page = self._free.pop()
            self._host_table[seq, len(self._pages[seq])] = page
            self._pages[seq].append(page)

    def append(self, seq: int, tokens: int = 1) -> int:
        """Make room for `tokens` more tokens of sequence seq and count them in its length;
        returns the position of the first (its length before), where the append kernel
        (task5.fused.rope_append_paged) writes them."""
        return self.append_many({seq: tokens})[seq]

    def append_many(self, tokens: dict[int, int]) -> dict[int, int]:
        """append for several sequences at once, {seq: tokens}, with one upload of the table
        and lengths; returns {seq: first new position}. Nothing changes if a page is missing."""
        starts = {}
        taken = [list(p) for p in self._pages]
        free, table = list(self._free), self._host_table.clone()
        try:
            for seq, count in tokens.items():
                if not isinstance(count, int) or count < 0:
                    raise ValueError(f"tokens must be an int >= 0, not {count!r}.")
                starts[seq] = self.length(seq)
                self._reserve(seq, starts[seq] + count)
        except (OutOfPagesError, ValueError):
            self._pages, self._free = taken, free
            self._host_table.copy_(table)
            raise
        for seq, count in tokens.items():
            self._host_lens[seq] += count
        self._upload()
        return starts

    def free(self, seq: int) -> None:
        """Sequence seq is finished: its pages go back to the free list, its length to 0."""
        seq = self._check_seq(seq)
        self._free.extend(reversed(self._pages[seq]))
        self._pages[seq] = []
        self._host_table[seq] = -1
        self._host_lens[seq] = 0
        self._upload()

    def _upload(self) -> None:
        # In place, in stream order: kernels queued before read the old values, those after the
        # new ones, and a CUDA graph that holds these tensors reads them at each replay.
        self.block_table.copy_(self._host_table)
        self.seq_lens.copy_(self._host_lens)


def allocate_paged_kv_cache(num_pages: int, page_size: int, kv_heads: int, head_dim: int,
                            dtype=torch.float16, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """(k_pages, v_pages), each [num_pages, page_size, kv_heads, head_dim], zeroed."""
    shape = (num_pages, page_size, kv_heads, head_dim)
    return (torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device))


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor
                 ) -> torch.Tensor:
    """The contiguous cache [B, H_kv, max_pages * page_size, D] that pages [num_pages,
    page_size, H_kv, D] hold through block_table [B, max_pages]: key t of sequence b is row
    t % page_size of page block_table[b, t // page_size]; keys at or past seq_lens[b] (and
    entries that are not pages) are zeros. Any device; the tests' reference reads it."""
    num_pages, page_size, heads_kv, head_dim = pages.shape
    batch, max_pages = block_table.shape
    table = block_table.to(pages.device).long()
    valid = (table >= 0) & (table < num_pages)
    rows = pages[table.clamp(0, num_pages - 1)]        # [B, max_pages, page_size, H_kv, D]
    rows = rows.reshape(batch, max_pages * page_size, heads_kv, head_dim)
    position = torch.arange(max_pages * page_size, device=pages.device).view(1, -1)
    keep = (position < seq_lens.to(pages.device).long().view(-1, 1)) & \
        valid.repeat_interleave(page_size, dim=1)
    rows = torch.where(keep[:, :, None, None], rows, torch.zeros((), dtype=pages.dtype,
                                                                  device=pages.device))
    return rows.transpose(1, 2)


def scatter_to_pages(cache: torch.Tensor, pages: torch.Tensor, block_table: torch.Tensor) -> None:
    """The inverse of gather_pages for the tests: rows of a contiguous cache [B, H_kv,
    max_pages * page_size, D] written into the pages block_table lists (in place; entries
    that are not pages are skipped)."""
    num_pages, page_size, heads_kv, head_dim = pages.shape
    batch, max_pages = block_table.shape
    table = block_table.to(pages.device).long()
    rows = cache.transpose(1, 2).reshape(batch, max_pages, page_size, heads_kv, head_dim)
    valid = (table >= 0) & (table < num_pages)
    pages[table[valid]] = rows[valid].to(pages.dtype)


def reference_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                              block_table: torch.Tensor, seq_lens: torch.Tensor,
                              variant=None) -> torch.Tensor:
    """The float64 truth of task5.attention.paged_decode_attention: the pages gathered into a
    contiguous cache (gather_pages), then common.variants.reference_attention_variant with the
    lengths seq_lens (a variant's own key_lengths are replaced; left padding does not apply).
    Runs on any device, a CPU included."""
    from dataclasses import replace

    from common.variants import Variant, reference_attention_variant

    variant = Variant(causal=True) if variant is None else variant
    variant = replace(variant, key_lengths=seq_lens.to(q.device), left_padding=False)
    k = gather_pages(k_pages, block_table, seq_lens).to(q.device)
    v = gather_pages(v_pages, block_table, seq_lens).to(q.device)
    return reference_attention_variant(q, k, v, variant)


# --- the paged cache's two operations, on our kernels or in PyTorch (task 6's generate_paged) --

def paged_rope_append(q, k, v, k_pages, v_pages, block_table, cos, sin, seq_lens,
                      backend: str = "kernels"):
    """RoPE on q [B, S, Hq, D] and k [B, S, Hkv, D], k and v written into their pages at
    positions seq_lens[b] - S + s (seq_lens: [B] int32 on the device, the lengths once this
    call's tokens are in; a position without a page, or a negative one, writes nothing).
    Returns q rotated. backend "kernels" (task5.fused.rope_append_paged) or "torch"."""
    positions = seq_lens - q.shape[1]
    if backend == "kernels":
        from task5.fused import rope_append_paged

        return rope_append_paged(q, k, v, k_pages, v_pages, block_table, cos, sin, positions)
    batch, seq, half = q.shape[0], q.shape[1], q.shape[-1] // 2
    position = positions.long().view(batch, 1) + torch.arange(seq, device=q.device).view(1, seq)
    inside = (position >= 0) & (position < cos.shape[0])
    rows = position.clamp(0, cos.shape[0] - 1)
    c, s = cos[rows].to(q.dtype)[:, :, None, :], sin[rows].to(q.dtype)[:, :, None, :half]

    def rotate(x):   # as _torch_rope_append: x * cos, then the two addcmuls
        out = x * c
        out[..., :half].addcmul_(x[..., half:], s, value=-1.0)
        out[..., half:].addcmul_(x[..., :half], s)
        return out

    num_pages, page_size = k_pages.shape[:2]
    slot = (position // page_size).clamp(0, block_table.shape[1] - 1)
    page = block_table.long().gather(1, slot)
    write = inside & (position // page_size < block_table.shape[1]) & (page >= 0) & \
        (page < num_pages)
    flat_rows = page.clamp(0, num_pages - 1) * page_size + position.clamp(min=0) % page_size
    for pages, new in ((k_pages, rotate(k)), (v_pages, v)):
        # Boolean indexing reads `write` on the host: this twin is not for CUDA graphs.
        pages.view(num_pages * page_size, *pages.shape[2:])[flat_rows[write]] = new[write]
    return torch.where(inside[:, :, None, None], rotate(q), torch.zeros((), dtype=q.dtype,
                                                                        device=q.device))


def paged_attention(q, k_pages, v_pages, block_table, seq_lens, backend: str = "kernels"):
    """Causal attention of q [B, H_q, S, D] (the last S positions of each sequence) to the keys
    the pages hold through block_table, seq_lens[b] of sequence b (device values);
    [B, H_q, S, D]. backend "kernels" (task5.attention.paged_decode_attention, S <= 16) or
    "torch" (the pages gathered, then SDPA; any device)."""
    if backend == "kernels":
        from task5.attention import paged_decode_attention

        return paged_decode_attention(q, k_pages, v_pages, block_table, seq_lens, causal=True,
                                      validate=False)
    k = gather_pages(k_pages, block_table, seq_lens)
    v = gather_pages(v_pages, block_table, seq_lens)
    seq, capacity = q.shape[2], k.shape[2]
    query_pos = seq_lens.long().view(-1, 1, 1) - seq + torch.arange(seq, device=q.device).view(1, -1, 1)
    keep = torch.arange(capacity, device=q.device).view(1, 1, -1) <= query_pos
    keep &= torch.arange(capacity, device=q.device).view(1, 1, -1) < seq_lens.long().view(-1, 1, 1)
    k, v = _repeat_kv(q, k, v)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None])
    # A row without a visible key (a freed sequence) gives NaN in SDPA: zeros, as the kernel.
    return torch.where(keep.any(-1)[:, None, :, None], out, torch.zeros((), dtype=out.dtype,
                                                                        device=out.device))
