"""Beyond the course (issue 33): `flash_attention` with a gradient, on the CUDA kernels.

task4.attention.flash_attention is inference-only until autograd asks for more: when grad mode
is on and q, k or v requires grad, it calls `differentiable_attention` here instead of the
inference path, and `loss.backward()` then runs FlashAttention-2's backward:

    forward   the fp32 kernel (task4/flash_attention.cu) or the tensor-core kernel
              (flash_attention_mma), each also writing the base-2 log-sum-exp of every query
              row (lse2 = log2(sum_j exp(s_ij)), s the scaled logits; its sinks included);
              saved: q, k, v, out and lse, never an S x S matrix
    backward  fp32: the fp32 backward kernel (task4/flash_backward.cu); fp16/bf16: the
              tensor-core backward (task4/flash_backward_mma.cu, mma.sync, sm_80+), in the
              input dtype with fp32 accumulators. Both give dq, dk, dv with dk and dv summed
              over each KV head's query group (GQA).

The wgmma backward (issue 33; task4/flash_backward_hopper_kernel.cuh, in the Hopper extension)
computes fp16/bf16 gradients on an H100/H200 (the default there: on the H100 it ran 1.1-1.6x
SDPA's FLASH backward where the mma.sync kernel ran 0.88-0.96x, results/logs/h100_s8_bwd_wgmma/)
when the call is in its scope: dense or causal with no other variant (no window, stride, mask
tensor, key lengths or softcap; sinks and a scale are fine), head_dim a multiple of 8 from 64 to
128, not deterministic. Anything else, other GPUs, and every call while ATTN_BWD_LAYOUT (read at
each backward, so that one process can time both) is "2d" or "rows", runs the mma.sync backward;
unset or "wgmma" is the default.

Without grad (inference, torch.no_grad(), inputs that do not require grad) nothing changes: no
lse is computed, the Hopper kernel and the strided classes still run where they apply.

Both passes are custom operators (torch.library.custom_op, `attention_kernels::...`) with
fake (meta) implementations, so torch.compile traces through them without a graph break and
never looks inside. The backward takes every variant of the forward that does not need a
gradient of its own: causal (bottom-right for S_q != S_k), GQA, window, stride, bool or additive
masks, key lengths and left padding, softcap, sinks and scale. A mask or sinks that require grad
raise a sentence: their gradients are not implemented.

Determinism. The fp32 backward has no atomics: two runs give bit-identical gradients. The
fp16/bf16 one adds each key tile's share of dQ with atomics, as FlashAttention-2 does (5 tile
products instead of 7); their order changes the last bits from run to run. Under
`torch.use_deterministic_algorithms(True)` it computes dQ in a separate pass instead, and its
gradients are bit-identical run to run (PyTorch's switch, read at each backward).

On a CPU these operators have no kernel; tests/test_task4_backward.py stands task 3's
PyTorch version (task3/flash_backward.py) in for the extension's four entries that
`kernel_forward` and `kernel_backward` call, to check the plumbing there.
"""

import os
from functools import cache

import torch

from common.build import BuildError, call_extension, is_written

HALF_DTYPES = (torch.float16, torch.bfloat16)
NAMESPACE = "attention_kernels"

_VARIANT_SCHEMA = ("bool causal, int? window, int stride, Tensor? mask, Tensor? key_lengths, "
                   "bool left_padding, float? softcap")


def _extension():
    from task4.attention import _extension as load

    return load()


def _hopper_extension(q):
    """The Hopper extension (task4/hopper.py) when q is on a compute capability 9.0 GPU and the
    extension builds, else None."""
    from task4 import hopper

    if not q.is_cuda or not hopper.is_sm90(q.get_device()):
        return None
    try:
        return hopper.load()
    except BuildError:
        return None


def wgmma_backward_in_scope(q, causal, window, stride, mask, key_lengths, softcap) -> bool:
    """Whether the wgmma backward takes this call (its device and build aside): fp16/bf16,
    dense or causal with no other variant, head_dim a multiple of 8 from 64 to 128, and not
    under torch.use_deterministic_algorithms (its dQ is added by atomics)."""
    head_dim = q.shape[-1]
    return (q.dtype in HALF_DTYPES and window is None and stride == 1 and mask is None
            and key_lengths is None and softcap is None and 64 <= head_dim <= 128
            and head_dim % 8 == 0 and not torch.are_deterministic_algorithms_enabled())


@cache
def _mma_backward_written() -> bool:
    """The wgmma backward runs the mma.sync backward's preprocess (D, lse2) and dQ conversion
    (task4/flash_backward_mma.cuh, solution regions of the optional lesson): in the student
    release, until that lesson is written, gradients must say "not implemented" rather than run
    those kernels' empty bodies on a Hopper GPU."""
    return is_written("task4/flash_backward_mma.cu")


def _wgmma_backward(q, causal, window, stride, mask, key_lengths, softcap):
    """The extension to run this gradient on the wgmma backward, or None: ATTN_BWD_LAYOUT unset
    or "wgmma" (read per call), the call in the kernel's scope, the mma.sync backward it builds
    on written, and a Hopper GPU with the extension."""
    if os.environ.get("ATTN_BWD_LAYOUT", "") not in ("", "wgmma"):
        return None
    if not _mma_backward_written():
        return None
    if not wgmma_backward_in_scope(q, causal, window, stride, mask, key_lengths, softcap):
        return None
    return _hopper_extension(q)


# --- the two kernel calls (the CPU tests replace these) -------------------------------------

def kernel_forward(q, k, v, causal, window, stride, mask, key_lengths, left_padding, softcap,
                   sinks, scale):
    """(out, lse): out [B, H_q, S_q, D] in q's dtype, lse [B, H_q, S_q] float32, base 2."""
    ext = _extension()
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    if q.dtype in HALF_DTYPES:
        out = call_extension(ext.flash_attention_mma, q, k, v, causal, None, window, stride,
                             mask, key_lengths, left_padding, lse, softcap, sinks, scale)
    else:
        out = call_extension(ext.flash_attention_fp32, q, k, v, causal, None, window, stride,
                             mask, key_lengths, left_padding, softcap, sinks, scale, lse)
    return out, lse


def kernel_backward(q, k, v, out, lse, d_out, causal, window, stride, mask, key_lengths,
                    left_padding, softcap, scale):
    """(dq, dk, dv) in the dtypes of q, k, v: the tensor-core backward for fp16/bf16 (its
    deterministic dQ pass under torch.use_deterministic_algorithms(True); the wgmma backward
    on a Hopper GPU where it applies), the fp32 lesson kernel for float32 (and for
    anything else, on float32 copies)."""
    dtype = q.dtype
    hopper_ext = _wgmma_backward(q, causal, window, stride, mask, key_lengths, softcap)
    if hopper_ext is not None:
        dq, dk, dv = call_extension(hopper_ext.flash_attention_backward_hopper, q, k, v,
                                    out.to(dtype), lse, d_out.to(dtype), causal, scale)
        return dq, dk, dv
    ext = _extension()
    if dtype in HALF_DTYPES:
        dq, dk, dv = call_extension(ext.flash_attention_backward_mma, q, k, v, out.to(dtype),
                                    lse, d_out.to(dtype), causal, window, stride, mask,
                                    key_lengths, left_padding, softcap, scale,
                                    torch.are_deterministic_algorithms_enabled())
        return dq, dk, dv
    if dtype != torch.float32:
        q, k, v, out, d_out = (t.float() for t in (q, k, v, out, d_out))
        if mask is not None and mask.dtype in HALF_DTYPES:
            mask = mask.float()
    dq, dk, dv = call_extension(ext.flash_attention_backward_fp32, q, k, v, out, lse, d_out,
                                causal, window, stride, mask, key_lengths, left_padding,
                                softcap, scale)
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


# --- the custom operators ---------------------------------------------------------------------

@torch.library.custom_op(
    f"{NAMESPACE}::flash_attention_forward", mutates_args=(),
    schema=(f"(Tensor q, Tensor k, Tensor v, {_VARIANT_SCHEMA}, Tensor? sinks, float? scale) "
            "-> (Tensor, Tensor)"))
def _forward_op(q, k, v, causal, window, stride, mask, key_lengths, left_padding, softcap,
                sinks, scale):
    return kernel_forward(q, k, v, causal, window, stride, mask, key_lengths, left_padding,
                          softcap, sinks, scale)


@_forward_op.register_fake
def _(q, k, v, causal, window, stride, mask, key_lengths, left_padding, softcap, sinks, scale):
    return (q.new_empty(q.shape),
            q.new_empty(q.shape[:3], dtype=torch.float32))


@torch.library.custom_op(
    f"{NAMESPACE}::flash_attention_backward", mutates_args=(),
    schema=(f"(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor d_out, "
            f"{_VARIANT_SCHEMA}, float? scale) -> (Tensor, Tensor, Tensor)"))
def _backward_op(q, k, v, out, lse, d_out, causal, window, stride, mask, key_lengths,
                 left_padding, softcap, scale):
    return kernel_backward(q, k, v, out, lse, d_out, causal, window, stride, mask, key_lengths,
                           left_padding, softcap, scale)


@_backward_op.register_fake
def _(q, k, v, out, lse, d_out, causal, window, stride, mask, key_lengths, left_padding,
      softcap, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, window, stride, mask, key_lengths, left_padding, softcap, _sinks, scale = \
        inputs
    out, lse = output
    # Every tensor through save_for_backward (mask and key_lengths too: they get no gradient,
    # but torch.compile traces what is saved on ctx); the rest are plain settings.
    ctx.save_for_backward(q, k, v, out, lse, mask, key_lengths)
    ctx.settings = (causal, window, stride, left_padding, softcap, scale)


def _backward(ctx, d_out, _d_lse):
    q, k, v, out, lse, mask, key_lengths = ctx.saved_tensors
    causal, window, stride, left_padding, softcap, scale = ctx.settings
    dq, dk, dv = _backward_op(q, k, v, out, lse, d_out, causal, window, stride, mask,
                              key_lengths, left_padding, softcap, scale)
    # One gradient per input of the forward operator: q, k, v, then the settings (none).
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


# --- the entry task4.attention.flash_attention calls ------------------------------------------

def wants_grad(q, k, v, mask=None, sinks=None) -> bool:
    """Does autograd need a backward of this call: grad mode on and some input requires grad?"""
    if not torch.is_grad_enabled():
        return False
    return (q.requires_grad or k.requires_grad or v.requires_grad  # q, k, v: checked tensors
            or (isinstance(mask, torch.Tensor) and mask.requires_grad)
            or (isinstance(sinks, torch.Tensor) and sinks.requires_grad))


def differentiable_attention(q, k, v, causal=False, out=None, window=None, stride=1, mask=None,
                             key_lengths=None, left_padding=False, *, softcap=None, sinks=None,
                             scale=None) -> torch.Tensor:
    """flash_attention whose result has a gradient to q, k and v (arguments already checked
    by common.inputs.check_attention_arguments). `out`, when given, receives the result by a
    copy (the operator itself writes a new tensor), so the gradient flows through it too."""
    from common.limits import BACKWARD_MAX_HEAD_DIM

    if q.shape[-1] > BACKWARD_MAX_HEAD_DIM:
        raise ValueError(f"head_dim {q.shape[-1]} needs a gradient, but the attention backward "
                         f"takes head dims up to {BACKWARD_MAX_HEAD_DIM} (the forward up to 256); "
                         "run under torch.no_grad(), or compute this attention in PyTorch to "
                         "train it.")
    for name, t in (("mask", mask), ("sinks", sinks)):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise ValueError(f"{name} requires grad, but the attention backward gives gradients "
                             f"to q, k and v only; pass {name}.detach() (or compute this "
                             "attention in PyTorch if you need its gradient).")
    result, _lse = _forward_op(q, k, v, causal, window, stride, mask, key_lengths, left_padding,
                               None if softcap is None else float(softcap), sinks,
                               None if scale is None else float(scale))
    if out is None:
        return result
    return out.copy_(result)
