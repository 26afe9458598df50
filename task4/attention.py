"""Task 4: multi-head attention on the fused FlashAttention-2 CUDA kernel.

Task 3 ran FlashAttention-2 tile by tile in Python. Here the whole tile loop is one CUDA
kernel (task4/flash_attention.cu): a block copies its Q tile and each K/V tile into shared
memory, computes scores, the online softmax and P V in registers, and writes O / l once. The
S x S score matrix never exists, not even in shared memory.

This file is the Python side, read top to bottom:

    flash_attention(q, k, v, causal)      q/k/v [B, heads, S, head_dim] -> [B, heads, S, head_dim]
        fp32          -> ext.flash_attention_fp32  (the course kernel, CUDA cores)
        fp16 or bf16  -> ext.flash_attention_mma   (tensor cores, task4/flash_attention_mma.cu)
                         or, on an H100/H200, the sm_90a kernel of task4/hopper.py
                         (task4/flash_attention_hopper.cu) for what it takes
    CustomFlashAttention(w_q, w_k, w_v, w_o, hidden_dim, num_heads)
        forward(x, causal): the projections in PyTorch (one GEMM for q, k and v, as
        nn.MultiheadAttention does), the attention on head *views* of them (no copies: the
        kernel takes strides), then the output projection.

The kernels take any strides whose last dimension is contiguous, so `x.view(B, S, H, D)
.transpose(1, 2)` goes in as it is. Tasks 5, 6 and 7 call `flash_attention` for prefill.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from functools import cache

import torch
from torch import nn

from common.build import BuildError, call_extension
from common.inputs import check_attention_arguments, check_key_lengths
from common.variants import Variant, reference_attention_variant
from task4.compile import load

HALF_DTYPES = (torch.float16, torch.bfloat16)
KERNELS = ("auto", "fp32", "mma")


def _extension():
    """The built extension (cached build reused; without a GPU this raises BuildError)."""
    return load()


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    out: torch.Tensor | None = None, *, window: int | None = None,
                    stride: int = 1, mask: torch.Tensor | None = None,
                    key_lengths: torch.Tensor | None = None,
                    left_padding: bool = False, softcap: float | None = None,
                    sinks: torch.Tensor | None = None,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(head_dim) [+ mask]) v on the fused kernel.

    q [B, H_q, S_q, D], k and v [B, H_kv, S_k, D]: CUDA tensors of one dtype, any strides
    with a contiguous last dimension; head_dim a multiple of 8 up to 256. fp32 runs the
    course kernel, fp16 and bf16 the tensor-core kernel. Returns a new contiguous
    [B, H_q, S_q, D] tensor, or writes `out` (same shape and dtype, any strides with a
    contiguous last dimension) and returns it. Bad input raises ValueError or TypeError.

    Beyond self-attention (common/variants.py has the exact definitions):
      * H_q a multiple of H_kv: grouped-query / multi-query attention;
      * S_q != S_k: the queries are the last S_q positions, causal is bottom-right aligned
        (query i sees key j iff j <= i + S_k - S_q; a chunk after a cache, a decode step);
      * window: key j visible iff j > pos(i) - window (transformers' sliding window);
      * stride: key j visible iff (pos(i) - j) % stride == 0;
      * mask: bool (True = keep) or additive float, broadcastable to [B, H_q, S_q, S_k];
      * key_lengths [B] int32: valid keys [0, len) per sequence, or with left_padding the
        last len keys (transformers' left-padded batches);
      * scale (None = 1/sqrt(D)), softcap (scores -> softcap * tanh(scores / softcap) before
        the mask, Gemma-2) and sinks ([H_q] logits, one extra softmax term per head with no
        value, GPT-OSS): the scores are softcap * tanh(q.k * scale / softcap) + mask.
    A query row that sees no key outputs zeros. Key tiles that no row of a query tile can
    see are never loaded, so a sliding window costs S * window, not S^2.

    Every argument is checked once, here, before a kernel is chosen
    (common.inputs.check_attention_arguments), so each path gets the same sentences.
    """
    signature = _call_signature(q, k, v, causal, out, window, stride, mask, key_lengths,
                                left_padding, softcap, sinks, scale)
    route = _routes.get(signature, _UNCHECKED) if signature is not None else _UNCHECKED
    if route is _UNCHECKED:
        check_attention_arguments(q, k, v, causal, out, window=window, stride=stride, mask=mask,
                                  key_lengths=key_lengths, left_padding=left_padding,
                                  softcap=softcap, sinks=sinks, scale=scale)
        route = _UNROUTED
    elif key_lengths is not None:
        check_key_lengths(key_lengths, k.shape[2])  # values, not metadata: checked every call
    return flash_attention_unchecked(q, k, v, causal, out, window, stride, mask, key_lengths,
                                     left_padding, softcap=softcap, sinks=sinks, scale=scale,
                                     signature=signature, route=route)


# ---- host time: a call shaped like one already checked and routed skips both ------------------
# At short shapes the checks and the routing cost more host time than the kernel launch itself,
# and a prefill whose GPU waits for its launch waits for them too (results/logs/
# h100_host_parts_*.log, issue 31). Both read only the call's metadata: each tensor's type,
# dtype, device, shape, strides and 16-byte alignment (what the TMA needs), the other
# arguments' types and values, and the two switches below. So the first call with a given
# signature is checked and routed in full and its route remembered (the memo starts over at
# ROUTE_MEMO_SIZE signatures). Tensor *values* are never remembered: key lengths are checked
# on every call (check_key_lengths keeps its own memo of the last tensor), a mask is summarised
# per call, and every kernel reads its inputs afresh.
ROUTE_MEMO_SIZE = 1024
_UNCHECKED = object()  # not seen: check everything
_UNROUTED = object()   # checked, kernel not chosen yet (say, only differentiable calls so far)
_routes: dict[tuple, object] = {}


def _tensor_signature(t) -> tuple:
    if not isinstance(t, torch.Tensor):
        return (type(t), t)  # None; anything else is hashed as it is (or is unhashable)
    return (type(t), t.dtype, t.device, t.shape, t.stride(), t.data_ptr() % 16)


def _call_signature(q, k, v, causal, out, window, stride, mask, key_lengths, left_padding,
                    softcap, sinks, scale) -> tuple | None:
    """What the checks and the routing of this call depend on, or None (not remembered; also
    while torch.compile traces the call, where there is no host time to save)."""
    if torch.compiler.is_compiling() or not (
            isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
            and isinstance(v, torch.Tensor)):
        return None
    extra = None
    if not (out is None and mask is None and key_lengths is None and sinks is None):
        extra = tuple(_tensor_signature(t) for t in (out, mask, key_lengths, sinks))
    signature = (HOPPER_PREFILL, STRIDE_AS_DENSE_CLASSES,
                 q.dtype, q.device, q.shape, q.stride(), q.data_ptr() % 16,
                 k.dtype, k.device, k.shape, k.stride(), k.data_ptr() % 16,
                 v.dtype, v.device, v.shape, v.stride(), v.data_ptr() % 16,
                 type(causal), causal, type(window), window, type(stride), stride,
                 type(left_padding), left_padding, type(softcap), softcap, type(scale), scale,
                 extra)
    try:
        hash(signature)
    except TypeError:  # an argument of an unhashable type: the checks will name it
        return None
    return signature


def _remember_route(signature, route) -> None:
    if signature is None:
        return
    if len(_routes) >= ROUTE_MEMO_SIZE:
        _routes.clear()
    _routes[signature] = route


def flash_attention_unchecked(q, k, v, causal, out, window, stride, mask, key_lengths,
                              left_padding, *, softcap=None, sinks=None, scale=None,
                              signature=None, route=_UNROUTED):
    """flash_attention on arguments already checked (by flash_attention, or by
    task5.attention.attention): picks the kernel and runs it; no path below checks again.
    When autograd needs a backward (grad mode on, an input requires grad), the forward that
    also saves each row's log-sum-exp runs instead (task4/backward.py), differentiable.
    `signature` and `route`: flash_attention's memo (the Hopper version, None for the other
    kernels, or _UNROUTED)."""
    from task4 import backward

    if backward.wants_grad(q, k, v, mask, sinks):
        _remember_route(signature, route)
        return backward.differentiable_attention(q, k, v, causal, out, window, stride, mask,
                                                 key_lengths, left_padding, softcap=softcap,
                                                 sinks=sinks, scale=scale)
    if _strided_as_dense_classes(q, k, stride, window, mask, key_lengths):
        _remember_route(signature, route)
        return _strided_by_classes(q, k, v, causal, out, stride, softcap, sinks, scale)
    version = route
    if version is _UNROUTED:
        version = _hopper_version(q, k, v, causal, out, stride, mask)
        # Remembered once the Hopper probe has answered (before, during a graph capture, the
        # answer is "not yet", which must not stick).
        _remember_route(signature, version if _hopper_probe.cache_info().currsize else _UNROUTED)
    if version is not None:
        from task4 import hopper

        return hopper.flash_attention_hopper(
            q, k, v, causal, version, out, scale=scale, window=window, stride=stride, mask=mask,
            key_lengths=key_lengths, left_padding=left_padding, softcap=softcap, sinks=sinks)
    ext = _extension()
    if q.dtype in HALF_DTYPES:
        return call_extension(ext.flash_attention_mma, q, k, v, causal, out, window, stride,
                              mask, key_lengths, left_padding, None, softcap, sinks, scale)
    return call_extension(ext.flash_attention_fp32, q, k, v, causal, out, window, stride, mask,
                          key_lengths, left_padding, softcap, sinks, scale)


# The Hopper kernel (task4/flash_attention_hopper.cu) for fp16/bf16 on an H100 or H200, at
# the rung of its ladder that measured fastest for the dtype, head_dim, mask and key length
# (task4.hopper.routed_version: a table `python -m task4.hopper_ladder --routing` measures and
# writes; where it has no entry, HOPPER_VERSION below: at 64 the causal mask wastes more of
# v6's 192-row tiles on the diagonal),
# with windows, key lengths, bool and additive mask tensors, softcap, sinks and a scale (its
# general predicate; a mask tensor is summarised per tile, so a block-sparse mask costs its
# visible tiles); what it does not take (a stride, head dims other than 64, 96, 128 and 256,
# other GPUs, strides the TMA refuses, a failed build, a kernel that is not written yet) stays
# on the mma.sync kernel. On
# by default; ATTN_HOPPER_PREFILL=0 (or `with hopper_prefill(False):`) keeps fp16/bf16 on
# the mma.sync kernel, to compare the two or to time the mma.sync kernel.
HOPPER_PREFILL = os.environ.get("ATTN_HOPPER_PREFILL", "1") != "0"
# (head_dim, causal) -> version, where the measured routing table has no entry. 96 runs the 128
# kernel (zero-filled columns) and reads the table's 128 rows (hopper.ROUTING_HEAD_DIM); 256 has
# its own tiles (a dense v5 call runs the 80-key one), not in the table yet: v5.
HOPPER_VERSION = {(64, False): 6, (64, True): 2, (96, False): 5, (96, True): 5,
                  (128, False): 5, (128, True): 5, (256, False): 5, (256, True): 5}


@contextlib.contextmanager
def hopper_prefill(enabled: bool):
    """Within the block, fp16/bf16 attention may use the Hopper kernel (True) or not (False)."""
    global HOPPER_PREFILL
    before, HOPPER_PREFILL = HOPPER_PREFILL, bool(enabled)
    try:
        yield
    finally:
        HOPPER_PREFILL = before


def _hopper_version(q, k, v, causal, out, stride=1, mask=None) -> int | None:
    """The Hopper kernel's version to run these inputs on, or None for the mma.sync kernel."""
    if not HOPPER_PREFILL or not isinstance(q, torch.Tensor) or q.dtype not in HALF_DTYPES:
        return None
    from task4 import hopper

    head_dim, causal = q.shape[3], bool(causal)
    version = hopper.routed_version(q.dtype, head_dim, causal, k.shape[2])
    if version is None:
        version = HOPPER_VERSION.get((head_dim, causal))
    if version is None or not _hopper_ready():
        return None

    return version if hopper.supports(q, k, v, out, stride=stride, mask=mask) else None


def _hopper_ready() -> bool:
    """Whether the sm_90a extension is here and works: built once (a failed build is not
    retried), then one small problem per version in use checked against PyTorch, so that a
    Hopper kernel that is not written yet (the student release) or gives wrong results never
    takes the course's prefills. While a CUDA graph is captured (no synchronizing allowed)
    before that check has run, the answer is no."""
    if _hopper_probe.cache_info().currsize > 0:  # answered before: no GPU work, no sync
        return _hopper_probe()
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False
    return _hopper_probe()


@cache
def _hopper_probe() -> bool:
    from task4 import hopper

    if not hopper.available() or not hopper.is_written():
        return False
    try:
        ext = hopper.load()
    except BuildError as err:
        warnings.warn(f"The Hopper kernel did not build, so fp16/bf16 attention runs on the "
                      f"mma.sync kernel: {str(err).splitlines()[0]}", stacklevel=3)
        return False
    gen = torch.Generator(device="cuda").manual_seed(0)
    in_use = {(d, v) for (d, _), v in HOPPER_VERSION.items()}
    in_use |= {(d, v) for d, _ in HOPPER_VERSION for v in hopper.ROUTING_VERSIONS
               if hopper.takes_head_dim(v, d)}
    for head_dim, version in sorted(in_use):
        q, k, v = (torch.randn(1, 2, 130, head_dim, device="cuda", generator=gen).half()
                   for _ in range(3))
        try:
            ours = ext.flash_attention_hopper(q, k, v, True, version, None, None)
        except NotImplementedError:
            return False  # the optional extension is not written: nothing to say
        except RuntimeError as err:
            warnings.warn(f"The Hopper kernel (version {version}, head_dim {head_dim}) failed on a "
                          f"small problem, so fp16/bf16 attention runs on the mma.sync kernel: "
                          f"{str(err).splitlines()[0]}", stacklevel=3)
            return False
        truth = reference_attention_variant(q, k, v, Variant(causal=True))
        if not (ours.double() - truth).abs().max().item() <= 1e-2:
            warnings.warn(f"The Hopper kernel (version {version}, head_dim {head_dim}) gives wrong "
                          "results on a small problem, so fp16/bf16 attention runs on the mma.sync "
                          "kernel (python -m pytest tests/test_task4_hopper.py shows where).",
                          stacklevel=3)
            return False
    return True


# Strided attention is `stride` independent dense problems: with S_q == S_k, query i sees
# only keys j with j = i (mod stride), so the queries and keys of one residue class r,
# q[:, :, r::stride] and k[:, :, r::stride] (strided views, no copies), form a dense
# (causal) attention of their own, and the output of the class is out[:, :, r::stride].
# That costs 1/stride of the dense work, where evaluating the pattern per element on every
# tile (the kernels' general predicate, used for every other combination) costs more than
# the dense work. Classes shorter than this run the predicate instead (many tiny launches).
STRIDE_CLASS_MIN_LENGTH = 64
STRIDE_AS_DENSE_CLASSES = True   # False: always the predicate (the tests run both paths)


def _strided_as_dense_classes(q, k, stride, window, mask, key_lengths) -> bool:
    return (STRIDE_AS_DENSE_CLASSES and isinstance(stride, int) and stride > 1
            and window is None and mask is None and key_lengths is None
            and q.dim() == 4 and k.dim() == 4 and q.shape[2] == k.shape[2]
            and q.shape[2] // stride >= STRIDE_CLASS_MIN_LENGTH)


def _strided_by_classes(q, k, v, causal, out, stride, softcap, sinks, scale):
    # softcap, scale and sinks act per score and per row: each class takes them as they are.
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for r in range(stride):
        flash_attention_unchecked(q[:, :, r::stride], k[:, :, r::stride], v[:, :, r::stride],
                                  causal, out[:, :, r::stride], None, 1, None, None, False,
                                  softcap=softcap, sinks=sinks, scale=scale)
    return out

class CustomFlashAttention(nn.Module):
    """Multi-head self-attention on the fused FlashAttention-2 kernel (interface of task 1).

    w_q, w_k, w_v, w_o: [hidden_dim, hidden_dim] projection matrices (y = x @ w.T).
    kernel: "auto" (fp32 x -> the fp32 kernel, fp16/bf16 x -> the tensor-core kernel),
    "fp32" (always the fp32 kernel; half inputs are computed in fp32) or "mma" (always the
    tensor-core kernel; fp32 inputs are rounded to fp16 for it). The output has x's dtype.
    """

    def __init__(self, w_q, w_k, w_v, w_o, hidden_dim: int, num_heads: int, kernel: str = "auto"):
        super().__init__()
        if hidden_dim % num_heads != 0:
            raise ValueError(f"hidden_dim {hidden_dim} is not divisible by num_heads {num_heads}.")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}.")
        self.w_q, self.w_k, self.w_v, self.w_o = w_q, w_k, w_v, w_o
        # One [3 * hidden, hidden] matrix: q, k and v come out of a single GEMM.
        self.w_qkv = torch.cat([w_q, w_k, w_v])
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.kernel = kernel

    def kernel_for(self, dtype: torch.dtype) -> str:
        """'fp32' or 'mma': the kernel a forward on inputs of `dtype` runs."""
        if self.kernel != "auto":
            return self.kernel
        return "mma" if dtype in HALF_DTYPES else "fp32"

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        batch, seq, _ = x.shape
        # [B, S, 3 * hidden]; q, k, v are views of it (row stride 3 * hidden, no copies).
        q, k, v = (x @ self.w_qkv.T).split(self.hidden_dim, dim=-1)

        if self.kernel_for(x.dtype) == "fp32":
            q, k, v = (t.float() for t in (q, k, v))  # no-ops for fp32 x
            # The course entry: [B, S, hidden] in and out; the head split is a strided view
            # inside the extension, and the output comes back with the heads already merged.
            entry = _extension().custom_flash_attention
            attn = call_extension(entry, q, k, v, self.num_heads, causal, None)
        else:
            dtype = x.dtype if x.dtype in HALF_DTYPES else torch.float16

            def heads(t):  # [B, S, hidden] -> [B, heads, S, head_dim], a view
                return t.to(dtype).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

            out = flash_attention(heads(q), heads(k), heads(v), causal)
            attn = out.transpose(1, 2).reshape(batch, seq, self.hidden_dim)
        return attn.to(x.dtype) @ self.w_o.T
