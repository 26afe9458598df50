"""Task 2 test: the naive CUDA attention, kernel by kernel and as a module.

    python -m task2.test                       # every group
    python -m task2.test --softmax --gemm      # some groups (the flags combine)
    python -m task2.test --small --no-record   # tiny shapes, no timing: for compute-sanitizer

Groups:
  softmax    the course's shapes (4,10,10) dim -1, (4,5,5) dim -2, (4,1000,1000) dim -1; rows
             of length 1, rows longer than the block, other ranks and dims, more rows than
             gridDim.y allows, scores near 90 (exp overflows unless the row max is subtracted)
  gemm       GEMM_NN and GEMM_NT at (4,10,10), (4,1000,1000), (4,1000,500) x (4,500,300),
             sizes that are not multiples of 16, 2-D inputs, strided views, a batch > 65535
  attention  the module against nn.MultiheadAttention (hidden 128, 8 heads, (B,S) (4,10) and
             (16,100), both masks, timed; and S = 1), custom_attention and
             scale_and_causal_mask on their own
  small      a few tiny cases of every kernel, both masks, no timing
  inputs     bad input raises a clear ValueError / TypeError (task 2 sets no head_dim limit:
             head_dim 256 is checked to work in the attention group instead)

Every output is compared with float64 (relative error, the fp32 tolerance) and, where the
course does, with allclose(atol 1e-6) against PyTorch's own fp32 result. Inputs are fresh
random numbers each run (--seed N reproduces a run); outputs are filled with NaN before a
kernel runs, so an element it never writes shows up; every kernel runs twice on the same
input and must give the same bits, or there is a race.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task2.test")

import math
import sys
from functools import partial

import torch

from common.checks import (
    Check,
    check_allclose,
    check_raises,
    check_relative,
    poisoned_empty,
    reference_attention,
    unwritten,
)
from common.harness import ModuleCase, fresh_generator, module_checks, pick_device, task_main
from common.mha import merge_heads, split_heads
from common.timing import tflops, time_cuda
from task2 import attention as ext
from task2.compile import load

HIDDEN, HEADS, WEIGHT_SEED = 128, 8, 0
KERNEL_FILE = "task2/attention_kernel.cu"
COURSE_CASES = [ModuleCase(b, s, causal) for (b, s) in ((4, 10), (16, 100))
                for causal in (False, True)]
ONE_TOKEN_CASES = [ModuleCase(4, 1, causal) for causal in (False, True)]

# Softmax: (shape, dim, offset added to N(0, 3^2) inputs, what the case is for).
SOFTMAX_CASES = [
    ((4, 10, 10), -1, 0.0, "course"),
    ((4, 5, 5), -2, 0.0, "course"),
    ((4, 1000, 1000), -1, 0.0, "course; rows longer than the block"),
    ((3, 7, 1), -1, 0.0, "rows of length 1"),
    ((6, 3000), -1, 0.0, "rank 2, rows not a multiple of 256"),
    ((257,), 0, 0.0, "rank 1"),
    ((2, 3, 4, 5), 1, 0.0, "a middle dim of rank 4"),
    ((70000, 3), -1, 0.0, "70000 rows: more than gridDim.y allows"),
    # e^88.7 is the largest float: exp(90) overflows, so only a softmax that subtracts the row
    # max passes. Inputs in [64, 128) also make x - max exact, so the check stays fair.
    ((4, 10, 10), -1, 90.0, "scores near 90"),
]
SMALL_SOFTMAX_CASES = [((2, 3, 5), -1, 0.0, ""), ((2, 3, 300), -1, 0.0, "rows > 256"),
                       ((3, 4), 0, 0.0, ""), ((2, 3, 1), -1, 0.0, "rows of length 1"),
                       ((2, 5, 5), -2, 0.0, "")]
SOFTMAX_TIMED = (4, 1000, 1000)

# GEMMs: (layout, a shape, b shape, layout of the inputs in memory, course allclose).
# "transposed": both inputs are transposed views; "sliced": every other element of a wider
# tensor. The course's allclose(atol 1e-6) is kept where K is tiny: with K in the hundreds,
# two correct fp32 sums taken in different orders differ by more than 1e-6 on entries near 0,
# and the float64 relative error is the criterion there.
GEMM_CASES = [
    ("nn", (4, 10, 10), (4, 10, 10), "contiguous", True),
    ("nn", (4, 1000, 1000), (4, 1000, 1000), "contiguous", False),
    ("nn", (4, 1000, 500), (4, 500, 300), "contiguous", False),
    ("nn", (3, 17, 33), (3, 33, 15), "contiguous", False),
    ("nn", (37, 19), (19, 23), "contiguous", False),
    ("nn", (1, 1, 1), (1, 1, 1), "contiguous", True),
    ("nn", (4, 1000, 500), (4, 500, 300), "transposed", False),
    ("nn", (4, 40, 35), (4, 35, 17), "sliced", False),
    ("nn", (70000, 2, 3), (70000, 3, 2), "contiguous", False),
    ("nt", (4, 10, 10), (4, 10, 10), "contiguous", True),
    ("nt", (4, 1000, 1000), (4, 1000, 1000), "contiguous", False),
    ("nt", (4, 1000, 500), (4, 300, 500), "contiguous", False),
    ("nt", (3, 17, 33), (3, 15, 33), "contiguous", False),
    ("nt", (37, 19), (23, 19), "contiguous", False),
    ("nt", (4, 1000, 500), (4, 300, 500), "transposed", False),
    ("nt", (4, 40, 35), (4, 17, 35), "sliced", False),
    ("nt", (70000, 2, 3), (70000, 2, 3), "contiguous", False),
]
SMALL_GEMM_CASES = [
    ("nn", (2, 17, 5), (2, 5, 18), "contiguous", True),
    ("nt", (2, 17, 5), (2, 18, 5), "contiguous", True),
    ("nn", (3, 4), (4, 5), "transposed", True),
    ("nt", (2, 3, 4), (2, 5, 4), "sliced", True),
    ("nn", (1, 1, 1), (1, 1, 1), "contiguous", True),
]
GEMM_TIMED = (4, 1000, 1000, 1000)  # batch, M, N, K

# custom_attention on its own: (B, S, hidden, heads). Odd lengths, one token, head_dim 16
# with S not a multiple of the tile, and head_dim 256 (task 2 has no head_dim limit).
ATTENTION_CASES = [(4, 10, 128, 8), (16, 100, 128, 8), (2, 1, 128, 8), (3, 37, 96, 6),
                   (2, 33, 512, 2)]
SMALL_ATTENTION_CASES = [(2, 5, 32, 2), (1, 1, 32, 4), (2, 17, 48, 3)]
MASK_CASES = [(3, 7), (2, 100), (1, 1)]  # (batch, S) of the scores
SMALL_MASK_CASES = [(2, 5)]


def _setup(args, group: str):
    """Build or load the extension, pick the device, make a fresh generator."""
    load()  # no GPU or nvcc: BuildError with one sentence, which task_main reports
    device = pick_device(getattr(args, "device", None))
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    print(f"[task2] {group}: inputs seed {seed} (pass --seed {seed} to reproduce), device {device}")
    return device, gen


def _run_twice(name: str, fn, make_out, kernel: str):
    """fn(out) on two fresh NaN-poisoned outputs: (the first result or None, checks). Outputs
    left exactly as poisoned mean `kernel` never ran its body: "not implemented yet"."""
    try:
        outs = [make_out(), make_out()]
        results = [fn(out) for out in outs]
        if outs[0].is_cuda:
            torch.cuda.synchronize()
    except NotImplementedError as err:
        return None, [Check(name, False, f"not implemented: {err}")]
    except (RuntimeError, ValueError, TypeError) as err:
        first_line = str(err).splitlines()[0] if str(err) else ""
        return None, [Check(name, False, f"raised {type(err).__name__}: {first_line[:120]}")]
    into_out = all(r.data_ptr() == o.data_ptr() and r.shape == o.shape
                   for r, o in zip(results, outs, strict=True))
    if into_out and all(unwritten(r) for r in results):  # the skeleton's empty kernel body
        return None, [Check(name, False, f"not implemented yet: {kernel} wrote none of its output "
                                         f"(is its body still empty?); see its HINT in {KERNEL_FILE}")]
    # Compare bits, not values: NaN != NaN, and -0.0 == 0.0.
    same = torch.equal(results[0].view(torch.int32), results[1].view(torch.int32))
    if not into_out:
        detail = "did not write into (and return) the `out` tensor it was given"
    elif not same:
        detail = "two runs on the same input gave different bits: a race?"
    else:
        detail = "wrote into out; two runs bit-identical"
    return results[0], [Check(f"{name} repeatable", into_out and same, detail)]


def _vs_float64(name: str, out: torch.Tensor, ref: torch.Tensor) -> Check:
    check = check_relative(f"{name} vs float64", out, ref, torch.float32)
    if not torch.isfinite(out).all():
        check.detail += "; NaN/Inf in the output: elements never written, or an overflow"
    return check


def _label(shape) -> str:
    return "x".join(str(s) for s in shape)


# --- softmax -------------------------------------------------------------------------------

def _softmax_into(x, dim, out):
    return ext.softmax(x, dim, out=out)


def _softmax_checks(cases, device, gen) -> list[Check]:
    checks = []
    for shape, dim, offset, note in cases:
        name = f"softmax {tuple(shape)} dim {dim}" + (f" ({note})" if note else "")
        x = torch.randn(*shape, device=device, generator=gen) * 3 + offset
        out, run = _run_twice(name, partial(_softmax_into, x, dim),
                              partial(poisoned_empty, *shape, dtype=x.dtype, device=device),
                              "softmax_kernel")
        checks += run
        if out is None:
            continue
        checks.append(_vs_float64(name, out, torch.softmax(x.double(), dim)))
        checks.append(check_allclose(f"{name} vs torch.softmax", out, torch.softmax(x, dim)))
    return checks


def _softmax_timing(device, gen) -> tuple[list[Check], dict]:
    x = torch.randn(*SOFTMAX_TIMED, device=device, generator=gen)
    out = torch.empty_like(x)
    ours = time_cuda(lambda: ext.softmax(x, -1, out=out))
    peer = time_cuda(lambda: torch.softmax(x, -1))
    moved = 2 * x.numel() * x.element_size()  # the minimum: read once, write once
    key = f"task2.softmax.{_label(SOFTMAX_TIMED)}"
    metrics = {f"{key}.ms": ours.median_ms, f"{key}.gbps": moved / ours.median_ms / 1e6,
               f"{key}.torch_ms": peer.median_ms,
               f"{key}.torch_gbps": moved / peer.median_ms / 1e6}
    detail = (f"ours {ours.median_ms:.3f} ms ({metrics[f'{key}.gbps']:.0f} GB/s), torch.softmax "
              f"{peer.median_ms:.3f} ms ({metrics[f'{key}.torch_gbps']:.0f} GB/s)")
    return [Check(f"softmax {SOFTMAX_TIMED} timing", True, detail)], metrics


def softmax_group(args=None):
    device, gen = _setup(args, "softmax")
    checks = _softmax_checks(SOFTMAX_CASES, device, gen)
    if all(c.passed for c in checks):
        timing_checks, metrics = _softmax_timing(device, gen)
        return checks + timing_checks, metrics
    return checks, {}


# --- GEMMs ---------------------------------------------------------------------------------

def _make_input(shape, memory: str, device, gen) -> torch.Tensor:
    """N(0,1) of `shape`, laid out as a contiguous tensor, a transposed view or a slice."""
    if memory == "transposed":
        swapped = (*shape[:-2], shape[-1], shape[-2])
        return torch.randn(*swapped, device=device, generator=gen).transpose(-2, -1)
    if memory == "sliced":
        wide = (*shape[:-1], 2 * shape[-1])
        return torch.randn(*wide, device=device, generator=gen)[..., ::2]
    return torch.randn(*shape, device=device, generator=gen)


def _gemm_into(layout, a, b, out):
    return (ext.gemm_nn if layout == "nn" else ext.gemm_nt)(a, b, out=out)


def _gemm_checks(cases, device, gen) -> list[Check]:
    checks = []
    for layout, a_shape, b_shape, memory, course in cases:
        a = _make_input(a_shape, memory, device, gen)
        b = _make_input(b_shape, memory, device, gen)
        name = f"gemm_{layout} {a_shape} x {b_shape}" + ("" if memory == "contiguous"
                                                          else f" ({memory} views)")
        b_math = b if layout == "nn" else b.transpose(-2, -1)  # the [.., K, N] operand
        out_shape = (*a_shape[:-1], b_math.shape[-1])
        out, run = _run_twice(name, partial(_gemm_into, layout, a, b),
                              partial(poisoned_empty, *out_shape, dtype=a.dtype, device=device),
                              f"gemm_{layout}_kernel")
        checks += run
        if out is None:
            continue
        checks.append(_vs_float64(name, out, a.double() @ b_math.double()))
        if course:
            checks.append(check_allclose(f"{name} vs torch.matmul", out, a @ b_math))
    return checks


def _gemm_timing(device, gen) -> tuple[list[Check], dict]:
    batch, m, n, k = GEMM_TIMED
    a = torch.randn(batch, m, k, device=device, generator=gen)
    b_nn = torch.randn(batch, k, n, device=device, generator=gen)
    b_nt = torch.randn(batch, n, k, device=device, generator=gen)
    out = torch.empty(batch, m, n, device=device)
    flops = 2.0 * batch * m * n * k
    checks, metrics = [], {}
    for layout, b, ours_fn, peer_fn in (
            ("nn", b_nn, ext.gemm_nn, lambda a, b: torch.bmm(a, b)),
            ("nt", b_nt, ext.gemm_nt, lambda a, b: torch.bmm(a, b.transpose(1, 2)))):
        ours = time_cuda(partial(ours_fn, a, b, out=out))
        peer = time_cuda(partial(peer_fn, a, b))
        key = f"task2.gemm_{layout}.b{batch}_m{m}_n{n}_k{k}"
        metrics[f"{key}.tflops"] = tflops(flops, ours.median_ms)
        metrics[f"{key}.cublas_tflops"] = tflops(flops, peer.median_ms)
        checks.append(Check(f"gemm_{layout} {GEMM_TIMED} timing", True,
                            f"ours {ours.median_ms:.3f} ms ({metrics[f'{key}.tflops']:.2f} "
                            f"TFLOP/s), torch.bmm (cuBLAS) {peer.median_ms:.3f} ms "
                            f"({metrics[f'{key}.cublas_tflops']:.2f} TFLOP/s)"))
    return checks, metrics


def gemm_group(args=None):
    device, gen = _setup(args, "gemm")
    checks = _gemm_checks(GEMM_CASES, device, gen)
    if all(c.passed for c in checks):
        timing_checks, metrics = _gemm_timing(device, gen)
        return checks + timing_checks, metrics
    return checks, {}


# --- attention -----------------------------------------------------------------------------

def _attention_into(q, k, v, heads, causal, out):
    return ext.custom_attention(q, k, v, heads, causal, out=out)


def _attention_checks(cases, device, gen) -> list[Check]:
    checks = []
    for batch, seq, hidden, heads in cases:
        q, k, v = (torch.randn(batch, seq, hidden, device=device, generator=gen) for _ in range(3))
        for causal in (False, True):
            name = (f"custom_attention {'causal' if causal else 'noncausal'} (B,S)=({batch},{seq}) "
                    f"hidden {hidden} heads {heads}")
            out, run = _run_twice(name, partial(_attention_into, q, k, v, heads, causal),
                                  partial(poisoned_empty, batch, seq, hidden, dtype=q.dtype,
                                          device=device), "custom_attention")
            checks += run
            if out is None:
                continue
            ref = merge_heads(reference_attention(split_heads(q, heads), split_heads(k, heads),
                                                  split_heads(v, heads), causal))
            checks.append(_vs_float64(name, out, ref))
    return checks


def _mask_checks(cases, device, gen) -> list[Check]:
    """scale_and_causal_mask is elementwise fp32: it must match PyTorch bit for bit."""
    checks = []
    scale = 1.0 / math.sqrt(16)
    for batch, seq in cases:
        scores = torch.randn(batch, seq, seq, device=device, generator=gen)
        for causal in (False, True):
            name = f"scale_and_causal_mask {'causal' if causal else 'noncausal'} ({batch},{seq},{seq})"
            expected = scores * scale
            if causal:
                future = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), 1)
                expected = expected.masked_fill(future, float("-inf"))
            try:
                first = ext.scale_and_causal_mask(scores.clone(), scale, causal)
                second = ext.scale_and_causal_mask(scores.clone(), scale, causal)
            except (NotImplementedError, RuntimeError, ValueError, TypeError) as err:
                checks.append(Check(name, False, f"raised {type(err).__name__}: {err}"))
                continue
            if unwritten(first, scores) and unwritten(second, scores):  # an empty kernel body
                checks.append(Check(name, False, "not implemented yet: scale_and_causal_mask_kernel "
                                                 "left the scores unchanged (is its body still empty?); "
                                                 f"see its HINT in {KERNEL_FILE}"))
                continue
            same = torch.equal(first.view(torch.int32), second.view(torch.int32))
            exact = torch.equal(first, expected)
            checks.append(Check(name, same and exact,
                                "equals scores * scale, -inf above the diagonal, both runs" if
                                same and exact else f"exact match {exact}, runs identical {same}"))
    return checks


def attention_group(args=None):
    device, gen = _setup(args, "attention")
    seed = getattr(args, "seed", None)
    checks, metrics = module_checks("task2", ext.CustomSelfAttention, hidden=HIDDEN, heads=HEADS,
                                    cases=COURSE_CASES, weight_seed=WEIGHT_SEED,
                                    input_seed=seed, device=device, timing=True)
    one_token, _ = module_checks("task2", ext.CustomSelfAttention, hidden=HIDDEN, heads=HEADS,
                                 cases=ONE_TOKEN_CASES, weight_seed=WEIGHT_SEED,
                                 input_seed=seed, device=device)
    checks += one_token
    checks += _attention_checks(ATTENTION_CASES, device, gen)
    checks += _mask_checks(MASK_CASES, device, gen)
    return checks, metrics


def small_group(args=None):
    device, gen = _setup(args, "small")
    checks = _softmax_checks(SMALL_SOFTMAX_CASES, device, gen)
    checks += _gemm_checks(SMALL_GEMM_CASES, device, gen)
    checks += _mask_checks(SMALL_MASK_CASES, device, gen)
    checks += _attention_checks(SMALL_ATTENTION_CASES, device, gen)
    return checks, {}


# --- bad input -----------------------------------------------------------------------------

def inputs_group(args=None):
    device, gen = _setup(args, "inputs")

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    x, a, b, q = rand(2, 3, 4), rand(2, 3, 4), rand(2, 4, 5), rand(2, 5, 32)
    empty_q = torch.empty(2, 0, 32, device=device)
    value, type_ = (ValueError,), (TypeError,)
    cases = [
        ("softmax: CPU tensor", lambda: ext.softmax(x.cpu()), value, "CUDA"),
        ("softmax: float64", lambda: ext.softmax(x.double()), type_, "dtype"),
        ("softmax: int32", lambda: ext.softmax(x.int()), type_, "dtype"),
        ("softmax: empty", lambda: ext.softmax(torch.empty(2, 0, device=device)), value, "empty"),
        ("softmax: 0-d tensor", lambda: ext.softmax(x[0, 0, 0]), value, "dimension"),
        ("softmax: dim out of range", lambda: ext.softmax(x, 3), value, "out of range"),
        ("softmax: out of the wrong shape",
         lambda: ext.softmax(x, -1, out=torch.empty(2, 3, 5, device=device)), value, "shape"),
        ("softmax: out of the wrong dtype",
         lambda: ext.softmax(x, -1, out=torch.empty(2, 3, 4, device=device).double()), type_,
         "dtype"),
        ("gemm_nn: CPU tensors", lambda: ext.gemm_nn(a.cpu(), b.cpu()), value, "CUDA"),
        ("gemm_nn: b on the CPU", lambda: ext.gemm_nn(a, b.cpu()), value, "CUDA"),
        ("gemm_nn: float64", lambda: ext.gemm_nn(a.double(), b.double()), type_, "dtype"),
        ("gemm_nn: mixed dtypes", lambda: ext.gemm_nn(a, b.half()), type_, "dtype"),
        ("gemm_nn: rank 4", lambda: ext.gemm_nn(a[None], b[None]), value, "dimensions"),
        ("gemm_nn: rank 1", lambda: ext.gemm_nn(a[0, 0], b[0, 0]), value, "dimensions"),
        ("gemm_nn: ranks differ", lambda: ext.gemm_nn(a, b[0]), value, "dimensions"),
        ("gemm_nn: inner sizes differ", lambda: ext.gemm_nn(a, a), value, "gemm_nn needs"),
        ("gemm_nt: inner sizes differ", lambda: ext.gemm_nt(a, b), value, "gemm_nt needs"),
        ("gemm_nn: batch sizes differ", lambda: ext.gemm_nn(a, b[:1]), value, "batch"),
        ("gemm_nn: empty",
         lambda: ext.gemm_nn(torch.empty(2, 0, 4, device=device), b), value, "empty"),
        ("gemm_nn: out of the wrong shape",
         lambda: ext.gemm_nn(a, b, out=torch.empty(2, 3, 4, device=device)), value, "shape"),
        ("gemm_nt: strided out",
         lambda: ext.gemm_nt(a, a, out=torch.empty(2, 3, 3, device=device).transpose(1, 2)),
         value, "contiguous"),
        ("scale_and_causal_mask: not square",
         lambda: ext.scale_and_causal_mask(rand(2, 3, 4), 0.5), value, "square"),
        ("scale_and_causal_mask: strided scores",
         lambda: ext.scale_and_causal_mask(rand(2, 4, 4).transpose(1, 2), 0.5), value,
         "contiguous"),
        ("custom_attention: CPU tensors",
         lambda: ext.custom_attention(q.cpu(), q.cpu(), q.cpu(), 2), value, "CUDA"),
        ("custom_attention: float16", lambda: ext.custom_attention(q.half(), q.half(), q.half(), 2),
         type_, "dtype"),
        ("custom_attention: k of another dtype",
         lambda: ext.custom_attention(q, q.double(), q, 2), type_, "dtype"),
        ("custom_attention: [B, H, S, D] instead of [B, S, hidden]",
         lambda: ext.custom_attention(q[None], q[None], q[None], 2), value, "dimensions"),
        ("custom_attention: k of another length",
         lambda: ext.custom_attention(q, q[:, :3], q, 2), value, "same shape"),
        ("custom_attention: heads do not divide hidden",
         lambda: ext.custom_attention(q, q, q, 5), value, "divide"),
        ("custom_attention: 0 heads", lambda: ext.custom_attention(q, q, q, 0), value, "num_heads"),
        ("custom_attention: empty (S = 0)",
         lambda: ext.custom_attention(empty_q, empty_q, empty_q, 2), value, "empty"),
        ("custom_attention: out of the wrong shape",
         lambda: ext.custom_attention(q, q, q, 2, out=torch.empty(2, 5, 16, device=device)), value,
         "shape"),
        ("CustomSelfAttention: hidden not divisible by heads",
         lambda: ext.CustomSelfAttention(q, q, q, q, 10, 3), value, "divisible"),
    ]
    checks = [check_raises(name, fn, exc_types, must_mention=word)
              for name, fn, exc_types, word in cases]

    # Strided q, k, v are accepted (made contiguous inside) and give the same bits.
    strided = rand(2, 32, 5).transpose(1, 2)
    try:
        same = torch.equal(ext.custom_attention(strided, strided, strided, 2, True),
                           ext.custom_attention(strided.contiguous(), strided.contiguous(),
                                                strided.contiguous(), 2, True))
        checks.append(Check("custom_attention: strided q, k, v accepted", same,
                            "same result as contiguous copies" if same else "results differ"))
    except (NotImplementedError, RuntimeError, ValueError, TypeError) as err:
        checks.append(Check("custom_attention: strided q, k, v accepted", False,
                            f"raised {type(err).__name__}: {err}"))
    return checks, {}


GROUPS = {"softmax": softmax_group, "gemm": gemm_group, "attention": attention_group,
          "small": small_group, "inputs": inputs_group}


def main(argv=None) -> int:
    return task_main("task2", GROUPS, argv, description=__doc__, gpu_only=True)


if __name__ == "__main__":
    sys.exit(main())
