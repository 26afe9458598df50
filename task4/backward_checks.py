"""The attention backward on task 4's kernels (issue 33): checks and a benchmark.

    python -m task4.test --backward           # correctness, below
    python -m task4.test --backward-bench     # the fp32 backward against SDPA's fp32 backward

backward        dq, dk, dv of task4.attention.flash_attention through autograd (the forward
                writes each row's lse, the backward is task4/flash_backward.cu) against float64
                autograd of the same formula, by FlashAttention-2's criterion per gradient:
                max|ours - ref64| <= 2 * max|PyTorch in the input dtype - ref64| + 1e-5.
                Cases: odd lengths (1, 7, 77, 130, 1000), head dims 8..128, S_q != S_k both ways
                (causal rows that see no key), GQA ratios 1, 2, 4, 8, causal, windows, key lengths
                (right and left padded), bool and additive masks (rows fully masked), a stride,
                softcap, sinks (no gradient of their own), a scale, logits x6, head views of a
                fused projection, dO not contiguous (every case) or expanded (a .sum()), fp16
                and bf16 (computed in fp32). Every case runs twice under
                torch.use_deterministic_algorithms(True): the gradients must be bit-identical
                (fp16/bf16 also run the default dQ by atomics). Also: the fp32 forward's lse
                against float64; finite differences in float64 on tiny cases; bad input raises
                a sentence; torch.compile(fullgraph=True) gives the eager gradients.
backward-bench  the fp32 backward (task4.backward.fp32.<shape>.<mask>) against SDPA's efficient
                backend in fp32, alternating rounds in one process: ms, TFLOP/s (2.5 x the
                forward's FLOPs / time, FlashAttention's convention) and the ratio.

Why finite differences and not torch.autograd.gradcheck: gradcheck wants float64 in and out,
and the kernels compute in fp32, whose rounding (1e-7 relative) divided by gradcheck's step
(1e-6) is noise as large as the derivative. So the finite differences are taken in float64 on
the float64 formula the kernel approximates (what gradcheck would compute on an exact kernel),
and the kernel's analytic gradients must match them to fp32 accuracy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

from common.checks import Check, check_raises
from common.harness import gpu_group
from common.timing import attention_flops, interleaved_medians, tflops, time_cuda
from common.variants import (
    Variant,
    fa2_criterion,
    keep_mask,
    reference_attention_variant,
    reference_lse_variant,
    softmax_scale,
)
from task4.manifest import BACKWARD_FP32_SHAPES, BACKWARD_HALF_SHAPES, backward_prefix

LOG2E = 1.4426950408889634
# Finite differences: central, step 1e-6 in float64; the kernel must match them within this
# (fp32 gradients of O(1) inputs are good to ~1e-6; the differences to ~1e-9).
FD_STEP = 1e-6
FD_TOLERANCE = 1e-4


# --- the formula: float64 truth and PyTorch's yardstick ------------------------------------

def attention_formula(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      variant: Variant | None = None) -> torch.Tensor:
    """Attention of common/variants.py written out in q's dtype, differentiable (autograd):
    with float64 inputs the truth, with the input dtype PyTorch's yardstick. Rows that see no
    key output 0 with zero gradients (the most negative finite score, not -inf, keeps them
    free of NaN, and `* keep` zeroes them)."""
    variant = Variant() if variant is None else variant
    batch, heads, seq_q, head_dim = q.shape
    group, seq_k = heads // k.shape[1], k.shape[2]
    kk = k.repeat_interleave(group, dim=1) if group > 1 else k
    vv = v.repeat_interleave(group, dim=1) if group > 1 else v
    scores = (q @ kk.transpose(-2, -1)) * softmax_scale(head_dim, variant)
    if variant.softcap is not None:
        scores = variant.softcap * torch.tanh(scores / variant.softcap)
    keep = keep_mask(batch, heads, seq_q, seq_k, variant, device=q.device)
    keep = keep.expand(batch, heads, seq_q, seq_k)
    if variant.mask is not None and variant.mask.dtype != torch.bool:
        bias = variant.mask.to(q.device, q.dtype).expand(batch, heads, seq_q, seq_k)
        scores = scores + torch.where(keep, bias, torch.zeros((), dtype=q.dtype, device=q.device))
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    if variant.sinks is not None:
        sinks = variant.sinks.to(q.device, q.dtype).reshape(1, heads, 1, 1)
        scores = torch.cat([scores, sinks.expand(batch, heads, seq_q, 1)], dim=-1)
        probs = torch.softmax(scores, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return (probs * keep) @ vv


def formula_gradients(q, k, v, d_out, variant: Variant, dtype: torch.dtype):
    """(out, dq, dk, dv) of attention_formula in `dtype` by torch autograd."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = attention_formula(*leaves, variant)
    out.backward(d_out.to(dtype))
    return (out.detach(), *(t.grad for t in leaves))


def _flash_gradients(q, k, v, d_out, variant: Variant):
    """(out, dq, dk, dv) of task4.attention.flash_attention through autograd."""
    from task4.attention import flash_attention

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*leaves, **variant.kwargs())
    out.backward(d_out)
    return (out.detach(), *(t.grad for t in leaves))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


@contextlib.contextmanager
def deterministic_algorithms(on: bool = True):
    """torch.use_deterministic_algorithms(on) inside the block (warn_only: other operators
    only warn), restored after; the fp16/bf16 backward reads it (task4/backward.py)."""
    was = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _criterion_details(grads, truth, yardstick) -> tuple[bool, list[str]]:
    details, passed = [], True
    for label, ours, ref, pt in zip(("out", "dq", "dk", "dv"), grads, truth, yardstick,
                                    strict=True):
        ok, err, bound = fa2_criterion(ours, ref, pt)
        passed &= ok and ours.dtype == pt.dtype and ours.shape == pt.shape
        details.append(f"{label} {err:.1e}{'<=' if ok else '>'}{bound:.1e}")
    return passed, details


def check_backward_case(name: str, q, k, v, d_out, variant: Variant) -> Check:
    """One case: out, dq, dk, dv against float64 by FlashAttention-2's criterion, in each mode
    the dtype has: fp16/bf16 with dQ by atomics (the default) and deterministic (a separate dQ
    pass, under torch.use_deterministic_algorithms); fp32 has one. The deterministic mode runs
    twice and its gradients must be bit-identical."""
    truth = formula_gradients(q, k, v, d_out, variant, torch.float64)
    yardstick = formula_gradients(q, k, v, d_out, variant, q.dtype)
    half = q.dtype in (torch.float16, torch.bfloat16)
    try:
        atomic = _flash_gradients(q, k, v, d_out, variant) if half else None
        with deterministic_algorithms():
            first = _flash_gradients(q, k, v, d_out, variant)
            second = _flash_gradients(q, k, v, d_out, variant)
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
        return Check(name, False, f"raised {type(err).__name__}: {str(err).splitlines()[0][:160]}")
    passed, details = _criterion_details(first, truth, yardstick)
    if atomic is not None:
        ok, atomic_details = _criterion_details(atomic, truth, yardstick)
        passed &= ok
        details = (["deterministic:", *details, "| atomic dQ:", *atomic_details])
    same = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(first[1:], second[1:], strict=True))
    if not same:
        details.append("two deterministic backward runs differ")
    return Check(name, passed and same, "; ".join(details))


# --- the cases -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    """q [batch, heads, seq_q, head_dim], k/v [batch, kv_heads, seq_k, head_dim]; `variant`
    names what goes into common.variants.Variant (tensors are drawn per run)."""

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    causal: bool = False
    extra: str = ""              # window<N>, lengths, left, bool, additive, stride<N>,
    #                              softcap, sinks, scale, views, expanded
    dtype: torch.dtype = torch.float32
    logits: float = 1.0          # q and k times this

    def label(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        parts = [f"B{self.batch} H{self.heads}/{self.kv_heads} Sq{self.seq_q} Sk{self.seq_k} "
                 f"D{self.head_dim}", "causal" if self.causal else "full", dtype]
        if self.extra:
            parts.append(self.extra)
        if self.logits != 1.0:
            parts.append(f"logits x{self.logits:g}")
        return " ".join(parts)


CASES = [
    Case(1, 1, 1, 1, 1, 64), Case(2, 4, 4, 7, 7, 64, True), Case(2, 4, 4, 77, 77, 64),
    Case(1, 3, 3, 130, 130, 128, True), Case(1, 2, 2, 1000, 1000, 64, True),
    *(Case(2, 2, 2, 77, 77, d, True) for d in (8, 40, 80, 128)),
    Case(2, 4, 2, 77, 130, 64), Case(2, 4, 2, 77, 130, 64, True),
    Case(2, 4, 2, 130, 77, 64), Case(2, 4, 2, 130, 77, 64, True),   # rows that see no key
    Case(2, 8, 8, 1, 200, 64, True),
    *(Case(1, 8, kv, 130, 130, 64, True) for kv in (8, 4, 2, 1)),
    Case(2, 4, 2, 200, 200, 64, True, "window16"), Case(2, 4, 2, 200, 200, 64, False, "window50"),
    Case(3, 4, 2, 77, 130, 64, True, "lengths"), Case(3, 4, 2, 77, 130, 64, True, "left"),
    Case(2, 4, 2, 77, 100, 64, False, "bool"), Case(2, 4, 4, 77, 100, 64, True, "additive"),
    Case(1, 4, 2, 130, 130, 64, True, "stride3"),
    Case(2, 8, 2, 77, 130, 64, True, "softcap"), Case(2, 4, 2, 77, 130, 64, True, "sinks"),
    Case(2, 4, 4, 77, 77, 64, True, "scale"), Case(2, 4, 2, 77, 130, 64, True, "views"),
    Case(2, 4, 2, 77, 77, 64, True, "expanded"),
    Case(2, 4, 2, 130, 130, 64, False, logits=6.0), Case(2, 4, 2, 130, 130, 128, True, logits=6.0),
    *(Case(2, 4, 2, 77, 130, 64, causal, dtype=dt) for dt in (torch.float16, torch.bfloat16)
      for causal in (False, True)),
]
SMALL_CASES = [Case(2, 4, 4, 7, 7, 64, True), Case(2, 4, 2, 13, 29, 64, True, "window8"),
               Case(2, 4, 2, 29, 13, 32, True, "lengths"), Case(1, 4, 1, 33, 33, 128, True, "softcap")]


def case_inputs(case: Case, gen: torch.Generator, device) -> tuple:
    """(q, k, v, d_out, variant) of one case: fresh random numbers from `gen`."""
    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    b, hq, hkv, sq, sk, d = (case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k,
                             case.head_dim)
    if case.extra == "views":   # head views of fused [B, S, H, D] projections (no copies)
        q = (randn(b, sq, hq + 2, d) * case.logits)[:, :, :hq].transpose(1, 2)
        kv = randn(b, sk, 2, hkv, d)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    else:
        q, k = randn(b, hq, sq, d) * case.logits, randn(b, hkv, sk, d) * case.logits
        v = randn(b, hkv, sk, d)
    if case.extra == "expanded":          # what out.sum().backward() passes: strides 0
        d_out = torch.ones((), device=device).expand(b, hq, sq, d)
    else:                                 # every other column of a wider tensor
        d_out = randn(b, hq, sq, 2 * d)[..., ::2]
    fields: dict = {"causal": case.causal}
    extra = case.extra
    if extra.startswith("window"):
        fields["window"] = int(extra.removeprefix("window"))
    elif extra.startswith("stride"):
        fields["stride"] = int(extra.removeprefix("stride"))
    elif extra in ("lengths", "left"):
        lengths = torch.randint(1, sk + 1, (b,), device=device, generator=gen)
        lengths[0] = sk
        fields.update(key_lengths=lengths.to(torch.int32), left_padding=extra == "left")
    elif extra == "bool":
        keep = torch.rand(b, 1, sq, sk, device=device, generator=gen) < 0.7
        keep[:, :, sq // 2] = False       # a row that sees nothing
        fields["mask"] = keep
    elif extra == "additive":
        bias = randn(1, hq, sq, sk) * 2
        fields["mask"] = bias.masked_fill(torch.rand(1, hq, sq, sk, device=device,
                                                     generator=gen) < 0.3, float("-inf"))
    elif extra == "softcap":
        fields["softcap"] = 5.0
        q, k = q * 3, k * 3
    elif extra == "sinks":
        fields["sinks"] = randn(hq) * 2
    elif extra == "scale":
        fields["scale"] = 0.05
    dtype = case.dtype
    return (q.to(dtype), k.to(dtype), v.to(dtype), d_out.to(dtype), Variant(**fields))


def _case_checks(cases, gen, device) -> list[Check]:
    checks = []
    for case in cases:
        q, k, v, d_out, variant = case_inputs(case, gen, device)
        checks.append(check_backward_case(f"backward {case.label()}", q, k, v, d_out, variant))
    return checks


def lse_checks(gen, device) -> list[Check]:
    """The fp32 forward's lse (base 2, sinks included) against float64."""
    from task4.backward import kernel_forward

    checks = []
    for name, variant, shape in (
            ("causal Sq<Sk GQA", Variant(causal=True), (2, 4, 2, 77, 130, 64)),
            ("causal Sq>Sk (rows with no key: -inf)", Variant(causal=True), (2, 4, 2, 130, 77, 64)),
            ("window, sinks", Variant(causal=True, window=20, sinks=torch.randn(
                4, device=device, generator=gen)), (1, 4, 4, 100, 100, 32))):
        b, hq, hkv, sq, sk, d = shape
        q = torch.randn(b, hq, sq, d, device=device, generator=gen)
        k, v = (torch.randn(b, hkv, sk, d, device=device, generator=gen) for _ in range(2))
        try:
            _, lse = kernel_forward(q, k, v, variant.causal, variant.window, 1, None, None, False,
                                    None, variant.sinks, None)
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
            checks.append(Check(f"fp32 lse {name}", False, f"raised {type(err).__name__}: {err}"))
            continue
        truth = reference_lse_variant(q, k, v, variant) * LOG2E
        seen = torch.isfinite(truth)
        same_inf = torch.equal(seen, torch.isfinite(lse)) and bool(
            (lse[~seen] == float("-inf")).all())
        err = (lse[seen].double() - truth[seen]).abs().max().item() if seen.any() else 0.0
        bound = 1e-5 * max(1.0, truth[seen].abs().max().item() if seen.any() else 1.0)
        checks.append(Check(f"fp32 lse {name}", same_inf and err <= bound,
                            f"max err {err:.1e} (bound {bound:.1e}); -inf exactly where no key"
                            if same_inf else "-inf rows differ from float64's"))
    return checks


def finite_difference_checks(gen, device) -> list[Check]:
    """The kernel's analytic gradients against central differences in float64 of the float64
    formula (see the module docstring for why not gradcheck), on tiny fp32 problems."""
    checks = []
    for name, variant, shape in (("causal GQA Sq<Sk", Variant(causal=True), (1, 2, 1, 5, 7, 8)),
                                 ("window Sq>Sk", Variant(causal=True, window=3), (1, 2, 2, 7, 4, 8)),
                                 ("softcap", Variant(softcap=1.5), (1, 2, 1, 4, 6, 16))):
        b, hq, hkv, sq, sk, d = shape
        q = torch.randn(b, hq, sq, d, device=device, generator=gen)
        k, v = (torch.randn(b, hkv, sk, d, device=device, generator=gen) for _ in range(2))
        d_out = torch.randn(b, hq, sq, d, device=device, generator=gen)
        try:
            ours = _flash_gradients(q, k, v, d_out, variant)[1:]
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
            checks.append(Check(f"finite differences {name}", False, f"raised {err}"))
            continue
        inputs = [t.double() for t in (q, k, v)]

        weights = d_out.double()

        def loss(values, variant=variant, weights=weights):
            return (reference_attention_variant(*values, variant) * weights).sum().item()

        worst = 0.0
        for index, grad in enumerate(ours):
            flat = inputs[index].view(-1)
            numeric = torch.empty(flat.numel(), dtype=torch.float64)
            for i in range(flat.numel()):
                keep = flat[i].item()
                flat[i] = keep + FD_STEP
                up = loss(inputs)
                flat[i] = keep - FD_STEP
                down = loss(inputs)
                flat[i] = keep
                numeric[i] = (up - down) / (2 * FD_STEP)
            worst = max(worst, (grad.double().cpu().view(-1) - numeric).abs().max().item())
        checks.append(Check(f"finite differences {name} (dq, dk, dv)", worst <= FD_TOLERANCE,
                            f"max |analytic - float64 central difference| {worst:.1e} "
                            f"(tolerance {FD_TOLERANCE:.0e})"))
    return checks


def input_checks(device) -> list[Check]:
    """Bad input to the backward raises ValueError/TypeError (a RuntimeError where PyTorch's
    own sentence says it) naming what is wrong."""
    from task4.attention import _extension, flash_attention

    bwd = _extension().flash_attention_backward_fp32
    q = torch.randn(1, 2, 16, 64, device=device)
    k = v = out = d_out = q
    lse = torch.zeros(1, 2, 16, device=device)
    strict = (ValueError, TypeError)

    def raises(name, fn, mention, types=strict):
        return check_raises(f"backward input: {name}", fn, exc_types=types, must_mention=mention)

    def second_backward():
        leaf = q.clone().requires_grad_()
        result = flash_attention(leaf, k, v).sum()
        result.backward()
        result.backward()

    def variant_leaf(name):
        tensor = {"mask": torch.zeros(1, 1, 16, 16, device=device),
                  "sinks": torch.zeros(2, device=device)}[name].requires_grad_()
        return lambda: flash_attention(q.clone().requires_grad_(), k, v, **{name: tensor})

    return [
        raises("lse of the wrong shape", lambda: bwd(q, k, v, out, lse[:, :, :8], d_out), "lse"),
        raises("lse float64", lambda: bwd(q, k, v, out, lse.double(), d_out), "lse"),
        raises("d_out of the wrong shape", lambda: bwd(q, k, v, out, lse, d_out[:, :1]), "d_out"),
        raises("d_out on the CPU", lambda: bwd(q, k, v, out, lse, d_out.cpu()), "CUDA"),
        raises("fp16 q", lambda: bwd(q.half(), k, v, out, lse, d_out), "dtype"),
        raises("head_dim 136", lambda: bwd(*(torch.zeros(1, 1, 4, 136, device=device),) * 4,
                                           torch.zeros(1, 1, 4, device=device),
                                           torch.zeros(1, 1, 4, 136, device=device)), "head_dim"),
        raises("an additive mask that requires grad", variant_leaf("mask"), "mask requires grad"),
        raises("sinks that require grad", variant_leaf("sinks"), "sinks requires grad"),
        raises("a second backward through a freed graph", second_backward, "second time",
               (RuntimeError,)),
    ]


def compile_checks(gen, device, dtype=torch.float32) -> list[Check]:
    """torch.compile(fullgraph=True) over forward + loss: no graph break, the eager gradients
    (the fp32 kernels, or with an fp16/bf16 dtype the tensor-core ones)."""
    from task4.attention import flash_attention

    q = torch.randn(2, 4, 77, 64, device=device, generator=gen).to(dtype)
    k, v = (torch.randn(2, 2, 100, 64, device=device, generator=gen).to(dtype) for _ in range(2))

    def step(q, k, v):
        return flash_attention(q, k, v, causal=True).square().sum()

    suffix = "" if dtype == torch.float32 else f" {str(dtype).removeprefix('torch.')}"
    grads = {}
    for label, fn in (("eager", step), ("compiled", torch.compile(step, fullgraph=True))):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        try:
            fn(*leaves).backward()
        except Exception as err:   # a compile failure of any kind is this check's failure
            return [Check(f"torch.compile(fullgraph=True) forward + backward{suffix}", False,
                          f"{label} raised {type(err).__name__}: {str(err).splitlines()[0][:200]}")]
        grads[label] = [t.grad for t in leaves]
    worst = max((a.float() - b.float()).abs().max().item() / max(a.float().abs().max().item(), 1e-30)
                for a, b in zip(grads["eager"], grads["compiled"], strict=True))
    # fp16/bf16: the compiled loss may round its d_out (2 * out) apart from eager's.
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    return [Check(f"torch.compile(fullgraph=True) forward + backward{suffix}", worst <= tolerance,
                  f"max relative difference to eager {worst:.1e} (tolerance {tolerance:.0e})")]


# --- groups ------------------------------------------------------------------------------------

def backward_group(args=None):
    device, gen, checks = gpu_group("backward", args)
    if device is None:
        return checks, {}
    checks += input_checks(device)
    checks += _case_checks(CASES, gen, device)
    checks += lse_checks(gen, device)
    checks += finite_difference_checks(gen, device)
    checks += compile_checks(gen, device)
    return checks, {}


def backward_small_group(args=None):
    """A few cases of the backward, tiny: what compute-sanitizer runs."""
    device, gen, checks = gpu_group("backward-small", args)
    if device is None:
        return checks, {}
    return checks + _case_checks(SMALL_CASES, gen, device), {}


def _shape_of(label: str) -> tuple[int, int, int, int]:
    b, h, s, d = (int(part[1:]) for part in label.split("_"))
    return b, h, s, d


def backward_bench_group(args=None):
    """The fp32 backward against SDPA's efficient backend (fp32), alternating rounds."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from task4.attention import flash_attention

    device, gen, checks = gpu_group("backward-bench", args)
    if device is None:
        return checks, {}
    metrics: dict[str, float] = {}
    for shape in BACKWARD_FP32_SHAPES:
        b, h, s, d = _shape_of(shape)
        # The fp32 backward of the long shape takes a good part of a second: fewer repeats.
        warmup, rounds, repeats = (3, 5, 10) if s * s * b <= 2**22 else (1, 3, 2)
        q, k, v, d_out = (torch.randn(b, h, s, d, device=device, generator=gen) for _ in range(4))
        for causal in (False, True):
            mask = "causal" if causal else "noncausal"
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            try:
                ours_out = flash_attention(*leaves, causal=causal)
            except NotImplementedError as err:
                return checks + [Check("backward-bench", False, f"not implemented: {err}")], metrics
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                peer_out = F.scaled_dot_product_attention(*leaves, is_causal=causal)

            def timer(out, leaves=leaves, d_out=d_out, warmup=warmup):
                def run():
                    torch.autograd.grad(out, leaves, d_out, retain_graph=True)

                return lambda reps: time_cuda(run, warmup=warmup, repeats=reps).median_ms

            timers = {"ours": timer(ours_out), "sdpa": timer(peer_out)}
            ms = interleaved_medians(timers, rounds=rounds, repeats=repeats)
            flops = 2.5 * attention_flops(b, h, s, s, d, causal)
            prefix = backward_prefix("fp32", shape, mask)
            ratio = ms["sdpa"] / ms["ours"]
            metrics.update({f"{prefix}.ms": ms["ours"], f"{prefix}.tflops": tflops(flops, ms["ours"]),
                            f"{prefix}.sdpa_efficient_ms": ms["sdpa"],
                            f"{prefix}.sdpa_efficient_tflops": tflops(flops, ms["sdpa"]),
                            f"{prefix}.ratio_vs_sdpa_efficient": ratio})
            checks.append(Check(f"fp32 backward {shape} {mask} timing", True,
                                f"ours {ms['ours']:.3f} ms = {tflops(flops, ms['ours']):.1f} "
                                f"TFLOP/s, SDPA efficient {ms['sdpa']:.3f} ms, ratio {ratio:.2f}x "
                                "(SDPA's time / ours)"))
            del ours_out, peer_out, timers
        torch.cuda.empty_cache()
    return checks, metrics


# --- fp16/bf16: the tensor-core backward (task4/flash_backward_mma.cu) ------------------------

# The 7-row case runs 8 x 16 heads, not 2 x 4. The criterion compares two maxima, and over only
# 2 x 4 x 7 rows they swing: SDPA's FlashAttention-2 and cuDNN backwards missed it on the same
# fresh draws as ours, with the same error (the difference D = rowsum(dO * O) with O rounded,
# which every FlashAttention-2 backward has); at 8 x 16 heads none of the three missed in any
# draw measured, in either dtype (results/logs/h100_s13_backward_flake/).
SEQ7_HEADS = (8, 16, 16)   # batch, query heads, KV heads


def _half_cases(dtype: torch.dtype) -> list[Case]:
    """Every case of the fp16/bf16 group for one dtype (the group runs both): odd lengths, head
    dims 8..128 (64 and 128 instantiated, the others padded), S_q != S_k both ways, GQA ratios 1
    to 8, every variant training uses (and the rest the forward takes), logits x6; d_out is a
    strided view in every case (an expanded one in `expanded`)."""
    def case(*args, **kwargs):
        return Case(*args, dtype=dtype, **kwargs)

    return [
        case(1, 1, 1, 1, 1, 64), case(*SEQ7_HEADS, 7, 7, 64, True), case(2, 4, 4, 77, 77, 128),
        case(1, 3, 3, 130, 130, 128, True), case(1, 2, 2, 1000, 1000, 64, True),
        case(1, 2, 2, 1000, 1000, 128),
        *(case(2, 2, 2, 77, 77, d, True) for d in (8, 16, 40, 72, 96, 120)),
        case(2, 4, 2, 77, 130, 64), case(2, 4, 2, 77, 130, 128, True),
        case(2, 4, 2, 130, 77, 64), case(2, 4, 2, 130, 77, 128, True),   # rows that see no key
        case(2, 8, 8, 1, 200, 64, True), case(2, 8, 2, 300, 33, 128),
        *(case(1, 2 * ratio, 2, 97, 130, 64 if ratio % 2 else 128, ratio % 3 != 0)
          for ratio in range(1, 9)),                                          # GQA ratios 1..8
        case(2, 4, 2, 200, 200, 64, True, "window16"), case(2, 4, 2, 200, 200, 128, False, "window50"),
        case(3, 4, 2, 77, 130, 64, True, "lengths"), case(3, 4, 2, 77, 130, 128, True, "left"),
        case(3, 4, 2, 130, 77, 128, False, "lengths"),
        case(2, 4, 2, 77, 100, 64, False, "bool"), case(2, 4, 4, 77, 100, 128, True, "additive"),
        case(1, 4, 2, 130, 130, 64, True, "stride3"),
        case(2, 8, 2, 77, 130, 64, True, "softcap"), case(2, 4, 4, 130, 130, 128, False, "softcap"),
        case(2, 4, 2, 77, 130, 128, True, "sinks"), case(2, 4, 4, 77, 77, 64, True, "scale"),
        case(2, 4, 2, 77, 130, 64, True, "views"), case(2, 4, 2, 77, 77, 128, True, "expanded"),
        case(2, 4, 2, 130, 130, 64, False, logits=6.0), case(2, 4, 2, 130, 130, 128, True, logits=6.0),
        case(2, 4, 1, 200, 200, 128, True, "window50", logits=6.0),
    ]


HALF_SMALL_CASES = [Case(*SEQ7_HEADS, 7, 7, 64, True, dtype=torch.float16),
                    Case(2, 4, 2, 13, 29, 128, True, "window8", dtype=torch.bfloat16),
                    Case(2, 4, 2, 29, 13, 64, True, "lengths", dtype=torch.float16),
                    Case(1, 4, 1, 33, 33, 128, True, "softcap", dtype=torch.bfloat16)]


def _half_input_checks(device) -> list[Check]:
    """Bad input to the tensor-core backward's entry raises a sentence naming what is wrong."""
    from task4.attention import _extension

    bwd = _extension().flash_attention_backward_mma
    q = torch.randn(1, 2, 16, 64, device=device, dtype=torch.float16)
    lse = torch.zeros(1, 2, 16, device=device)
    strict = (ValueError, TypeError)

    def raises(name, fn, mention):
        return check_raises(f"backward fp16/bf16 input: {name}", fn, exc_types=strict,
                            must_mention=mention)

    return [
        raises("lse of the wrong shape", lambda: bwd(q, q, q, q, lse[:, :, :8], q), "lse"),
        raises("lse float16", lambda: bwd(q, q, q, q, lse.half(), q), "lse"),
        raises("d_out of another dtype", lambda: bwd(q, q, q, q, lse, q.bfloat16()), "d_out"),
        raises("out of the wrong shape", lambda: bwd(q, q, q, q[:, :1], lse, q), "out"),
        raises("float32 q", lambda: bwd(q.float(), q, q, q, lse, q), "dtype"),
        raises("head_dim 136", lambda: bwd(*(torch.zeros(1, 1, 4, 136, device=device,
                                                         dtype=torch.float16),) * 4,
                                           torch.zeros(1, 1, 4, device=device),
                                           torch.zeros(1, 1, 4, 136, device=device,
                                                       dtype=torch.float16)), "head_dim"),
    ]


def backward_half_group(args=None):
    """The fp16/bf16 backward through autograd: every case of _half_cases in both dtypes by
    FlashAttention-2's criterion per gradient (PyTorch's same-dtype autograd as the yardstick),
    in both modes (dQ by atomics; deterministic, run twice and bit-identical); bad input;
    torch.compile(fullgraph=True) in fp16."""
    device, gen, checks = gpu_group("backward-half", args)
    if device is None:
        return checks, {}
    checks += _half_input_checks(device)
    for dtype in (torch.float16, torch.bfloat16):
        checks += _case_checks(_half_cases(dtype), gen, device)
    checks += compile_checks(gen, device, dtype=torch.float16)
    return checks, {}


def backward_half_small_group(args=None):
    """A few fp16/bf16 cases, tiny: what compute-sanitizer runs."""
    device, gen, checks = gpu_group("backward-half-small", args)
    if device is None:
        return checks, {}
    return checks + _case_checks(HALF_SMALL_CASES, gen, device), {}


def _sdpa_backward_timer(backend, leaves, d_out, causal, warmup):
    """(a timer of SDPA's backward pinned to `backend`, None) or (None, why it refused)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    if backend is None:
        return None, "this torch has no such backend"
    try:
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            torch.autograd.grad(out, leaves, d_out, retain_graph=True)
            torch.cuda.synchronize()
    except RuntimeError as err:   # "No available kernel" and the like
        return None, str(err).strip().splitlines()[0][:120]

    def run():
        torch.autograd.grad(out, leaves, d_out, retain_graph=True)

    return (lambda reps: time_cuda(run, warmup=warmup, repeats=reps).median_ms), None


def backward_half_bench_group(args=None):
    """The fp16/bf16 backward against SDPA's FLASH (FlashAttention-2's own backward) and cuDNN
    backends, same dtype, same inputs, alternating rounds in one process: TFLOP/s (2.5 x the
    forward's FLOPs / time) and ratio = SDPA's time / ours, per BACKWARD_HALF_SHAPES and mask."""
    from torch.nn.attention import SDPBackend

    from task4.attention import flash_attention

    device, gen, checks = gpu_group("backward-half-bench", args)
    if device is None:
        return checks, {}
    backends = {"flash": SDPBackend.FLASH_ATTENTION,
                "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}
    metrics: dict[str, float] = {}
    for dtype_name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        for shape in BACKWARD_HALF_SHAPES:
            b, h, s, d = _shape_of(shape)
            warmup, rounds, repeats = (3, 5, 10) if s <= 4096 else (2, 5, 5)
            q, k, v, d_out = (torch.randn(b, h, s, d, device=device, generator=gen, dtype=dtype)
                              for _ in range(4))
            for causal in (False, True):
                mask = "causal" if causal else "noncausal"
                prefix = backward_prefix(dtype_name, shape, mask)
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                try:
                    ours_out = flash_attention(*leaves, causal=causal)
                    torch.autograd.grad(ours_out, leaves, d_out, retain_graph=True)
                except (NotImplementedError, RuntimeError, ValueError) as err:
                    checks.append(Check(f"backward {dtype_name} {shape} {mask}", False,
                                        f"raised {type(err).__name__}: {str(err).splitlines()[0]}"))
                    continue

                def ours(reps, out=ours_out, leaves=leaves, d_out=d_out, warmup=warmup,
                         deterministic=False):
                    def run():
                        torch.autograd.grad(out, leaves, d_out, retain_graph=True)

                    with deterministic_algorithms(deterministic):
                        return time_cuda(run, warmup=warmup, repeats=reps).median_ms

                timers, refused = {"ours": ours,
                                   "deterministic": functools.partial(ours, deterministic=True)}, {}
                for peer, backend in backends.items():
                    timer, why = _sdpa_backward_timer(backend, leaves, d_out, causal, warmup)
                    if timer is None:
                        refused[peer] = why
                    else:
                        timers[peer] = timer
                ms = interleaved_medians(timers, rounds=rounds, repeats=repeats)
                flops = 2.5 * attention_flops(b, h, s, s, d, causal)
                metrics[f"{prefix}.ms"] = ms["ours"]
                metrics[f"{prefix}.tflops"] = tflops(flops, ms["ours"])
                metrics[f"{prefix}.deterministic_tflops"] = tflops(flops, ms["deterministic"])
                detail = [f"ours {ms['ours']:.3f} ms = {tflops(flops, ms['ours']):.1f} TFLOP/s "
                          f"(deterministic {tflops(flops, ms['deterministic']):.1f})"]
                for peer in backends:
                    if peer in ms:
                        metrics[f"{prefix}.sdpa_{peer}_tflops"] = tflops(flops, ms[peer])
                        metrics[f"{prefix}.ratio_vs_sdpa_{peer}"] = ms[peer] / ms["ours"]
                        detail.append(f"SDPA {peer} {ms[peer]:.3f} ms, ratio "
                                      f"{ms[peer] / ms['ours']:.2f}x")
                    else:
                        detail.append(f"SDPA {peer} refused: {refused[peer]}")
                checks.append(Check(f"backward {dtype_name} {shape} {mask} timing", True,
                                    "; ".join(detail) + " (ratio = SDPA's time / ours)"))
                del ours_out, timers, leaves
            del q, k, v, d_out
            torch.cuda.empty_cache()
    return checks, metrics


GROUPS = {"backward-small": backward_small_group, "backward": backward_group,
          "backward-bench": backward_bench_group, "backward-half-small": backward_half_small_group,
          "backward-half": backward_half_group, "backward-half-bench": backward_half_bench_group}
