"""fp32 accuracy at large logits: every fp32 attention path against FlashAttention-2's criterion.

    python -m task4.fp32_accuracy_checks             # the worst cases, then the verdicts
    python -m task4.fp32_accuracy_checks --all       # every case
    python -m task4.test --fp32-accuracy             # the same checks as a group of task 4's test

FlashAttention-2's criterion: max |out - ref64| <= 2 * max |pt - ref64| + 1e-6, where ref64 is
attention in float64 and pt is PyTorch's attention in fp32, SDPA's math backend
(common/variants.py: reference_attention_variant, pytorch_attention_variant). The inputs are
scaled x6 and x10 (logits of tens to hundreds, where the rounding of q . k is what an fp32
output's error is made of), fresh random numbers each run (--seed reproduces): head dims
8..128, lengths that are not tile multiples (1, 7, 77, 129, 256, 1000), S_q != S_k, causal
or not, GQA, windows, masks, key lengths, strides, contiguous tensors, head views of a
[B, S, 3 * hidden] projection and transposed layouts. Every fp32 path runs:

  prefill          task4.attention.flash_attention (the fp32 course kernel), dense
  prefill-views    the same on strided views, written into strided outputs
  prefill-course   the course entry custom_flash_attention ([B, S, hidden] in and out)
  prefill-variants GQA, windows, masks, key lengths, strides (dense classes and predicate)
  decode           task5's course decode kernel: decode_attention_bhsd and decode_attention
                   (the [B, S_max, hidden] cache's head views), one split
  decode-splits    the same with 2..8 splits (split-KV, merged by the last block)
  decode-grouped   task5's CUDA-core grouped decode in fp32, dense and with variants, 1..3 splits

What a verdict means (task4/NOTES.md, "fp32 accuracy at large logits", has the evidence).
At large logits an fp32 output's error comes from the rounding of q . k in the rows whose
two largest logits are close, and, where PyTorch's error is small, from the last ulp of
outputs as large as 40 (an ulp is 4e-6 there, four times the criterion's 1e-6). A float
score carries as much rounding as PyTorch's own, and two errors of one size differ by 2x on
a share of cases whichever is judged; so the kernels keep the scores beyond float: the
prefill computes q . k in float64 and subtracts the row max in float64 (its P, l and O stay
float), and the decode kernels compute the scores, the softmax state and the output sums in
float64 and round each output once. Every group is held to the criterion: a case over the
bound FAILs. Each line also says on how many cases PyTorch's own textbook formula
softmax((q k^T) * scale) v in fp32 misses the same criterion, for comparison.

Each group is one line per input scale, whose detail names the worst case: our error,
PyTorch's, and their ratio. Outputs are NaN-poisoned before each kernel runs.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: "
                     "python -m task4.fp32_accuracy_checks")

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from common.build import call_extension
from common.checks import Check, poisoned_empty, report
from common.harness import fresh_generator, gpu_group, pick_device
from common.variants import (
    Variant,
    keep_mask,
    pytorch_attention_variant,
    reference_attention_variant,
)

SCALES = (6.0, 10.0)            # q, k, v = randn * scale
ABS_FLOOR = 1e-6                # FlashAttention-2's criterion: <= 2 * PyTorch's error + this
LENGTHS = (1, 7, 77, 129, 256, 1000)
HEAD_DIMS = tuple(range(8, 129, 8))
SDPA_MATH = "SDPA math"         # common/variants.py, pytorch_attention_variant
CASES_PER_GROUP = {"prefill": 40, "prefill-views": 24, "prefill-course": 16,
                   "prefill-variants": 40, "decode": 40, "decode-splits": 40,
                   "decode-grouped": 56}


# --- PyTorch's fp32 attention: the yardstick and the control ------------------------------

TEXTBOOK = "(q k^T) * scale"    # the control: PyTorch's textbook formula


def pytorch_formulas(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     variant: Variant = Variant()) -> dict[str, torch.Tensor]:
    """PyTorch's attention in q's dtype, two ways: SDPA's math backend (q and k each times
    sqrt(scale): the criterion's yardstick) and the textbook formula softmax((q k^T) * scale
    [+ bias]) v (the control: the same criterion applied to PyTorch itself). Rows that see no
    key are 0, as in common/variants.py."""
    out = {SDPA_MATH: pytorch_attention_variant(q, k, v, variant)}
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv, seq_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    kk = k.repeat_interleave(group, dim=1) if group > 1 else k
    vv = v.repeat_interleave(group, dim=1) if group > 1 else v
    keep = keep_mask(batch, heads_q, seq_q, seq_k, variant, device=q.device)
    bias = (variant.mask.to(q.device, q.dtype)
            if variant.mask is not None and variant.mask.dtype != torch.bool else None)
    scale = 1.0 / math.sqrt(head_dim)

    def finish(scores):
        if bias is not None:
            scores = scores + bias
        scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ vv

    out[TEXTBOOK] = finish((q @ kk.transpose(-2, -1)) * scale)
    return out


# --- cases --------------------------------------------------------------------------------

@dataclass
class Case:
    """One input: q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D] (views, as the kernel reads them),
    the variant, and `run()`, which runs the kernel and returns its output as [B, H_q, S_q, D]."""

    group: str
    name: str
    scale: float
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    run: Callable[[], torch.Tensor]
    variant: Variant = field(default_factory=Variant)


@dataclass
class Result:
    case: Case
    ours: float                 # max |out - ref64|
    pytorch: dict[str, float]   # max |pt - ref64|: SDPA math (the yardstick), the textbook formula
    error: str = ""             # what the kernel raised, if it raised

    @property
    def passed(self) -> bool:
        """FlashAttention-2's criterion: ours <= 2 * SDPA math's error + ABS_FLOOR (inf if the
        kernel raised or gave a NaN/Inf)."""
        return self.ours <= self.bound

    @property
    def bound(self) -> float:
        return 2.0 * self.pytorch[SDPA_MATH] + ABS_FLOOR

    @property
    def ratio(self) -> float:
        return _ratio(self.ours, self.pytorch[SDPA_MATH])

    @property
    def control(self) -> float:
        """PyTorch's textbook formula judged like a kernel: its error over SDPA math's."""
        return _ratio(self.pytorch[TEXTBOOK], self.pytorch[SDPA_MATH])

    @property
    def control_over(self) -> bool:
        return self.pytorch[TEXTBOOK] > self.bound


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (0.0 if a == 0 else math.inf)


class _Picker:
    """Random choices from the run's generator (so --seed reproduces every case)."""

    def __init__(self, gen: torch.Generator):
        self.gen = gen

    def int(self, low: int, high: int) -> int:          # in [low, high]
        return int(torch.randint(low, high + 1, (1,), generator=self.gen,
                                 device=self.gen.device).item())

    def choice(self, options):
        return options[self.int(0, len(options) - 1)]

    def coin(self) -> bool:
        return self.int(0, 1) == 1


def _randn(gen, scale, *shape):
    return torch.randn(*shape, device=gen.device, generator=gen) * scale


def _layout(pick: _Picker, gen, scale, batch, heads, seq, head_dim, layout=None):
    """[B, H, S, D] in one of three layouts: contiguous, transposed ([B, S, H, D] viewed as
    [B, H, S, D]) or a head view of a wider [B, S, 3 * hidden] projection row."""
    layout = layout or pick.choice(("contiguous", "transposed", "projection"))
    if layout == "contiguous":
        return _randn(gen, scale, batch, heads, seq, head_dim)
    if layout == "transposed":
        return _randn(gen, scale, batch, seq, heads, head_dim).transpose(1, 2)
    fused = _randn(gen, scale, batch, seq, 3 * heads * head_dim)
    part = pick.int(0, 2) * heads * head_dim
    return fused[..., part:part + heads * head_dim].unflatten(-1, (heads, head_dim)).transpose(1, 2)


def _shape_name(q, k, variant=None, extra=""):
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    heads = f"H{hq}" if hq == hk else f"Hq{hq}/Hkv{hk}"
    text = f"B{b} {heads} Sq{sq} Sk{sk} D{d}"
    if variant is not None:
        text += f" {variant.describe()}"
    return text + (f" {extra}" if extra else "")


def _prefill_case(group, pick, gen, scale, device):
    from task4.attention import flash_attention

    head_dim = pick.choice(HEAD_DIMS)
    seq_k = pick.choice(LENGTHS)
    seq_q = pick.choice((seq_k, seq_k, 1, 7, max(1, seq_k // 3), seq_k + 13))
    batch, heads = pick.int(1, 2), pick.int(1, 4)
    causal = pick.coin()
    views = group == "prefill-views"
    layout = None if views else "contiguous"
    q = _layout(pick, gen, scale, batch, heads, seq_q, head_dim, layout)
    k = _layout(pick, gen, scale, batch, heads, seq_k, head_dim, layout)
    v = _layout(pick, gen, scale, batch, heads, seq_k, head_dim, layout)
    variant = Variant(causal=causal)

    def run():
        if views:   # the output through a [B, S, H, D] buffer's head view
            out = poisoned_empty(batch, seq_q, heads, head_dim, dtype=q.dtype,
                                 device=device).transpose(1, 2)
        else:
            out = poisoned_empty(*q.shape, dtype=q.dtype, device=device)
        return flash_attention(q, k, v, causal, out)

    extra = "views" if views else ""
    return Case(group, _shape_name(q, k, variant, extra), scale, q, k, v, run, variant)


def _course_case(pick, gen, scale, device):
    """custom_flash_attention: q, k, v [B, S, hidden] slices of one projection, as the
    course's module passes them; the output [B, S, hidden] is viewed per head to compare."""
    from task4.compile import load

    head_dim = pick.choice(HEAD_DIMS)
    heads = pick.int(1, 4)
    hidden = heads * head_dim
    seq = pick.choice(LENGTHS[:-1])
    batch = pick.int(1, 2)
    causal = pick.coin()
    qkv = _randn(gen, scale, batch, seq, 3 * hidden)
    q, k, v = qkv.split(hidden, dim=-1)

    def per_head(t):
        return t.unflatten(-1, (heads, head_dim)).transpose(1, 2)

    def run():
        out = poisoned_empty(batch, seq, hidden, dtype=q.dtype, device=device)
        result = call_extension(load().custom_flash_attention, q, k, v, heads, causal, out)
        return per_head(result)

    variant = Variant(causal=causal)
    return Case("prefill-course", _shape_name(per_head(q), per_head(k), variant, "course entry"),
                scale, per_head(q), per_head(k), per_head(v), run, variant)


def _variant_for(pick, gen, batch, heads_q, seq_q, seq_k, device, decode=False) -> Variant:
    causal = pick.coin()
    kind = pick.choice(("window", "lengths", "left", "bool", "float", "stride", "gqa")
                       if not decode else ("window", "lengths", "left", "bool", "float",
                                           "stride", "dense"))
    if kind == "window":
        return Variant(causal=causal, window=pick.int(1, seq_k + 1))
    if kind in ("lengths", "left"):
        lengths = torch.randint(1, seq_k + 1, (batch,), generator=gen, device=device,
                                dtype=torch.int32)
        return Variant(causal=causal, key_lengths=lengths, left_padding=kind == "left")
    if kind == "bool":
        keep = torch.rand(batch, 1, seq_q, seq_k, generator=gen, device=device) < 0.7
        return Variant(causal=causal, mask=keep)
    if kind == "float":
        bias = torch.randn(1, heads_q, seq_q, seq_k, generator=gen, device=device) * 2
        drop = torch.rand(1, heads_q, seq_q, seq_k, generator=gen, device=device) < 0.2
        return Variant(causal=causal, mask=bias.masked_fill(drop, float("-inf")))
    if kind == "stride":
        return Variant(causal=causal, stride=pick.int(2, 5))
    return Variant(causal=causal)


def _prefill_variant_case(pick, gen, scale, device):
    from task4 import attention
    from task4.attention import flash_attention

    head_dim = pick.choice(HEAD_DIMS)
    group = pick.choice((1, 2, 4))
    heads_kv = pick.int(1, 2)
    heads_q = heads_kv * group
    seq_k = pick.choice(LENGTHS)
    seq_q = pick.choice((seq_k, seq_k, 7, max(1, seq_k // 2)))
    batch = pick.int(1, 3)
    q = _layout(pick, gen, scale, batch, heads_q, seq_q, head_dim)
    k = _layout(pick, gen, scale, batch, heads_kv, seq_k, head_dim)
    v = _layout(pick, gen, scale, batch, heads_kv, seq_k, head_dim)
    variant = _variant_for(pick, gen, batch, heads_q, seq_q, seq_k, device)
    predicate = variant.stride > 1 and pick.coin()

    def run():
        out = poisoned_empty(*q.shape, dtype=q.dtype, device=device)
        before = attention.STRIDE_AS_DENSE_CLASSES
        attention.STRIDE_AS_DENSE_CLASSES = not predicate
        try:
            return flash_attention(q, k, v, out=out, **variant.kwargs())
        finally:
            attention.STRIDE_AS_DENSE_CLASSES = before

    extra = "[per-element predicate]" if predicate else ""
    return Case("prefill-variants", _shape_name(q, k, variant, extra), scale, q, k, v, run,
                variant)


def _decode_case(group, pick, gen, scale, device):
    """One query per (batch, head) against the first seq_len rows of a cache: the course's
    [B, S_max, hidden] cache (decode_attention, heads interleaved) or a [B, H, S_max, D]
    tensor or view (decode_attention_bhsd)."""
    from task5 import attention as decode

    head_dim = pick.choice(HEAD_DIMS)
    heads = pick.int(1, 4)
    batch = pick.int(1, 3)
    seq_len = pick.choice(LENGTHS)
    max_seq = seq_len + pick.choice((0, 0, 5, 64))
    splits = 1 if group == "decode" else pick.choice((2, 3, 4, 8))
    course_layout = pick.coin()
    if course_layout:
        hidden = heads * head_dim
        q_flat = _randn(gen, scale, batch, 1, hidden)
        k_cache, v_cache = (_randn(gen, scale, batch, max_seq, hidden) for _ in range(2))

        def per_head(t):
            return t.unflatten(-1, (heads, head_dim)).transpose(1, 2)

        q, k_all, v_all = per_head(q_flat), per_head(k_cache), per_head(v_cache)

        def run():
            out = poisoned_empty(batch, 1, hidden, dtype=q_flat.dtype, device=device)
            return per_head(decode.decode_attention(q_flat, k_cache, v_cache, heads, seq_len,
                                                    out=out, num_splits=splits))
    else:
        q = _layout(pick, gen, scale, batch, heads, 1, head_dim)
        k_all = _layout(pick, gen, scale, batch, heads, max_seq, head_dim)
        v_all = _layout(pick, gen, scale, batch, heads, max_seq, head_dim)

        def run():
            out = poisoned_empty(*q.shape, dtype=q.dtype, device=device)
            return decode.decode_attention_bhsd(q, k_all, v_all, seq_len, causal=True, out=out,
                                                num_splits=splits)

    k, v = k_all[:, :, :seq_len], v_all[:, :, :seq_len]
    extra = f"{'course cache' if course_layout else 'bhsd'} S_max {max_seq} splits {splits}"
    return Case(group, _shape_name(q, k, None, extra), scale, q, k, v, run, Variant())


def _grouped_case(pick, gen, scale, device):
    from task5 import attention as decode

    head_dim = pick.choice(HEAD_DIMS)
    group = pick.choice((1, 2, 4, 8))
    heads_kv = pick.int(1, 2)
    heads_q = heads_kv * group
    batch = pick.int(1, 3)
    seq_k = pick.choice(LENGTHS)
    splits = pick.choice((1, 1, 2, 3))
    q = _layout(pick, gen, scale, batch, heads_q, 1, head_dim)
    k = _layout(pick, gen, scale, batch, heads_kv, seq_k, head_dim)
    v = _layout(pick, gen, scale, batch, heads_kv, seq_k, head_dim)
    variant = (_variant_for(pick, gen, batch, heads_q, 1, seq_k, device, decode=True)
               if pick.coin() else Variant(causal=pick.coin()))

    def run():
        out = poisoned_empty(*q.shape, dtype=q.dtype, device=device)
        return decode.decode_attention_grouped(q, k, v, out=out, num_splits=splits,
                                               **variant.kwargs())

    return Case("decode-grouped", _shape_name(q, k, variant, f"splits {splits}"), scale, q, k, v,
                run, variant)


def make_cases(group: str, count: int, scale: float, gen: torch.Generator,
               device) -> list[Case]:
    """`count` fresh cases of `group` (CASES_PER_GROUP names the groups) at input scale `scale`."""
    pick = _Picker(gen)
    makers = {
        "prefill": lambda: _prefill_case("prefill", pick, gen, scale, device),
        "prefill-views": lambda: _prefill_case("prefill-views", pick, gen, scale, device),
        "prefill-course": lambda: _course_case(pick, gen, scale, device),
        "prefill-variants": lambda: _prefill_variant_case(pick, gen, scale, device),
        "decode": lambda: _decode_case("decode", pick, gen, scale, device),
        "decode-splits": lambda: _decode_case("decode-splits", pick, gen, scale, device),
        "decode-grouped": lambda: _grouped_case(pick, gen, scale, device),
    }
    return [makers[group]() for _ in range(count)]


# --- the criterion ------------------------------------------------------------------------

def evaluate(case: Case) -> Result:
    """Run the case's kernel and judge it by FlashAttention-2's criterion against SDPA's math
    backend; the textbook formula's error is kept for the comparison."""
    ref = reference_attention_variant(case.q, case.k, case.v, case.variant)
    formulas = pytorch_formulas(case.q, case.k, case.v, case.variant)
    pytorch = {name: (out.double() - ref).abs().max().item() if out.numel() else 0.0
               for name, out in formulas.items()}
    try:
        out = case.run()
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
        message = str(err).splitlines()[0][:160] if str(err) else ""
        return Result(case, math.inf, pytorch, f"raised {type(err).__name__}: {message}")
    ours = (out.double() - ref).abs().max().item() if out.numel() else 0.0
    if not bool(torch.isfinite(out).all()):
        ours = math.inf
    return Result(case, ours, pytorch)


def _summary(group: str, scale: float, results: list[Result]) -> Check:
    over = [r for r in results if not r.passed]
    worst = max(results, key=lambda r: (not r.passed, r.ratio))
    control = sum(1 for r in results if r.control_over)
    detail = (f"{len(results) - len(over)}/{len(results)} within 2 x PyTorch's error "
              f"({SDPA_MATH}) + {ABS_FLOOR:.0e}; worst: ours {worst.ours:.2e} vs PyTorch "
              f"{worst.pytorch[SDPA_MATH]:.2e} (ratio {worst.ratio:.2f}) at {worst.case.name}")
    if worst.error:
        detail += f" ({worst.error})"
    detail += f"; PyTorch's textbook formula is over on {control}/{len(results)}"
    metrics = {"worst_ratio": worst.ratio, "cases": float(len(results)),
               "over_bound": float(len(over)), "textbook_over_bound": float(control)}
    return Check(f"fp32 accuracy x{scale:g}: {group}", not over, detail, metrics)


def run_checks(groups=None, cases_per_group: dict[str, int] | None = None,
               gen: torch.Generator | None = None, device=None
               ) -> tuple[list[Check], list[Result]]:
    """Every group at every scale: ([one Check per group and scale], [every case's Result])."""
    device = device or torch.device("cuda")
    gen = gen or torch.Generator(device=device)
    counts = dict(CASES_PER_GROUP, **(cases_per_group or {}))
    checks, results = [], []
    for group in groups or CASES_PER_GROUP:
        for scale in SCALES:
            count = max(1, counts[group] // len(SCALES))
            found = [evaluate(c) for c in make_cases(group, count, scale, gen, device)]
            checks.append(_summary(group, scale, found))
            results += found
    return checks, results


def fp32_accuracy_group(args=None):
    """The group of `python -m task4.test --fp32-accuracy` (one line per path and scale)."""
    device, gen, failed = gpu_group("fp32-accuracy", args)
    if failed:
        return failed, {}
    checks, _ = run_checks(gen=gen, device=device)
    return checks, {}


GROUPS = {"fp32-accuracy": fp32_accuracy_group}


# --- the diagnostic table -----------------------------------------------------------------

def print_table(results: list[Result], every: bool = False, worst: int = 6) -> None:
    """Per case: our error, PyTorch's (SDPA math), their ratio, and the textbook formula's
    error and ratio to SDPA math's (the same criterion applied to PyTorch itself)."""
    header = (f"{'case':<62} {'x':>3} {'ours':>9} {'PyTorch':>9} {'ratio':>6} "
              f"{'textbook':>9} {'ratio':>6}  verdict")
    print(header)
    print("-" * len(header))
    by_group: dict[tuple[str, float], list[Result]] = {}
    for r in results:
        by_group.setdefault((r.case.group, r.case.scale), []).append(r)
    for (group, scale), found in by_group.items():
        shown = found if every else sorted(found, key=lambda r: -r.ratio)[:worst]
        print(f"[{group} x{scale:g}] {len(found)} cases"
              + ("" if every else f", the {len(shown)} with the largest ratio"))
        for r in shown:
            print(f"  {r.case.name[:60]:<60} {scale:>3g} {r.ours:9.2e} {r.pytorch[SDPA_MATH]:9.2e} "
                  f"{r.ratio:6.2f} {r.pytorch[TEXTBOOK]:9.2e} {r.control:6.2f}  "
                  f"{'ok' if r.passed else 'OVER'}{'  ' + r.error if r.error else ''}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m task4.fp32_accuracy_checks",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default=",".join(CASES_PER_GROUP),
                        help="comma-separated groups (default: all): " + ", ".join(CASES_PER_GROUP))
    parser.add_argument("--cases", type=int, default=None,
                        help="cases per group, split over the scales (default: "
                             + ", ".join(f"{g} {n}" for g, n in CASES_PER_GROUP.items()) + ")")
    parser.add_argument("--seed", type=int, default=None, help="reproduce a run (default: fresh)")
    parser.add_argument("--all", action="store_true", help="print every case, not the worst few")
    parser.add_argument("--worst", type=int, default=6, help="cases shown per group and scale")
    args = parser.parse_args(argv)
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    unknown = [g for g in groups if g not in CASES_PER_GROUP]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(CASES_PER_GROUP)}")
    device = pick_device(None)
    if device.type != "cuda":
        print("The fp32 accuracy checks run the CUDA kernels: they need an NVIDIA GPU, and none "
              "is visible to torch here.")
        return 1
    gen, seed = fresh_generator(args.seed, device)
    counts = {g: args.cases for g in groups} if args.cases else None
    checks, results = run_checks(groups, counts, gen, device)
    print(f"seed {seed} (--seed {seed} reproduces these cases); inputs randn x "
          f"{' and x'.join(f'{s:g}' for s in SCALES)}; bound = 2 x PyTorch's error ({SDPA_MATH}) "
          f"+ {ABS_FLOOR:.0e}; textbook = PyTorch's softmax((q k^T) * scale) v in fp32\n")
    print_table(results, every=args.all, worst=args.worst)
    return report("fp32 accuracy at large logits", checks)


if __name__ == "__main__":
    raise SystemExit(main())
