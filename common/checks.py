"""Correctness checking: the only copies of the reference, the tolerances and the report.

The truth is attention computed in float64 (`reference_attention`). A kernel passes when
its relative error ||out - ref|| / ||ref|| is under the tolerance of its dtype, has no NaN
or Inf, and wrote every element: outputs are poisoned with NaN before the kernel runs, so
an element the kernel skipped shows up as NaN. Where the course checks with
`torch.allclose(atol=1e-6)` against nn.MultiheadAttention, we keep that check too.

Every task's test collects `Check`s; `report` prints one uniform PASS/FAIL table, and the
pytest wrappers assert on the same objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

# Relative-error tolerances against the float64 reference, by the dtype the kernel computes
# in. fp32 arithmetic lands around 1e-7..1e-6 on these sizes; tensor-core fp16 (10-bit
# mantissa) and bf16 (7-bit) operands land near 1e-3 and 5e-3.
REL_TOL = {
    torch.float32: 2e-5,
    torch.float16: 5e-3,
    torch.bfloat16: 2e-2,
    torch.float64: 1e-12,
}

# The course's own check: torch.allclose(out, nn.MultiheadAttention(...), atol=1e-6).
COURSE_ATOL = 1e-6


def causal_keep_mask(seq_q: int, seq_k: int, device=None) -> torch.Tensor:
    """Boolean [seq_q, seq_k], True where query i may attend key j.

    Queries are the last seq_q positions of the key sequence (bottom-right aligned), so for
    seq_q == seq_k this is the lower triangle, and a single decode query sees every key.
    """
    offset = seq_k - seq_q
    rows = torch.arange(seq_q, device=device).unsqueeze(1)
    cols = torch.arange(seq_k, device=device).unsqueeze(0)
    return cols <= rows + offset


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        causal: bool = False, scale: float | None = None,
                        max_chunk_bytes: int = 2**30) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v in float64; q [..., Sq, D], k/v [..., Sk, D].

    The leading dimensions are processed in chunks so that no more than `max_chunk_bytes`
    of float64 scores exist at once (the full (64, 32, 4096, 4096) matrix would be 275 GB).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    lead = q.shape[:-2]
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    qf = q.reshape(-1, seq_q, q.shape[-1])
    kf = k.reshape(-1, seq_k, k.shape[-1])
    vf = v.reshape(-1, seq_k, v.shape[-1])
    keep = causal_keep_mask(seq_q, seq_k, device=q.device) if causal else None
    chunk = max(1, max_chunk_bytes // (8 * seq_q * seq_k))
    out = torch.empty(qf.shape[0], seq_q, v.shape[-1], dtype=torch.float64, device=q.device)
    for start in range(0, qf.shape[0], chunk):
        sl = slice(start, start + chunk)
        scores = (qf[sl].double() @ kf[sl].double().transpose(-2, -1)) * scale
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        out[sl] = torch.softmax(scores, dim=-1) @ vf[sl].double()
    return out.reshape(*lead, seq_q, v.shape[-1])


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (inf if out has NaN/Inf, e.g. unwritten poison)."""
    out64 = out.double()
    if not torch.isfinite(out64).all():
        return math.inf
    denom = ref.double().norm().item()
    diff = (out64 - ref.double()).norm().item()
    return diff / denom if denom > 0 else diff


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` with NaN (floating) so any element a kernel forgets to write is caught."""
    return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-12345)


def poisoned_empty(*shape, dtype, device) -> torch.Tensor:
    return poison_(torch.empty(*shape, dtype=dtype, device=device))


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def unwritten(out: torch.Tensor, before: torch.Tensor | None = None) -> bool:
    """True when `out` still holds, bit for bit, what it held before a kernel ran (`before`;
    by default the poison): the kernel wrote nothing, as a skeleton's empty kernel body does.
    A kernel that computes a NaN writes another bit pattern than torch's fill, so a working
    kernel that overflows everywhere is not mistaken for one that never ran."""
    if out.numel() == 0:
        return False
    before = poison_(torch.empty_like(out)) if before is None else before
    if before.shape != out.shape or before.dtype != out.dtype:
        return False
    as_int = _SAME_SIZE_INT[out.element_size()]
    return torch.equal(out.contiguous().view(as_int), before.contiguous().view(as_int))


def random_qkv(batch: int, heads: int, seq: int, head_dim: int, *, dtype=torch.float32,
               device="cuda", seq_k: int | None = None, generator: torch.Generator | None = None):
    """Fresh N(0,1) q [B,H,Sq,D], k, v [B,H,Sk,D]: never zeros, which hide indexing bugs."""
    seq_k = seq if seq_k is None else seq_k
    g = generator

    def make(s):
        return torch.randn(batch, heads, s, head_dim, device=device, dtype=torch.float32,
                           generator=g).to(dtype)

    return make(seq), make(seq_k), make(seq_k)


@dataclass
class Check:
    """One named check and its outcome.

    target=True marks a target beyond correctness (a speed, e.g. ">= 0.9x SDPA flash", or an
    accuracy beyond what PyTorch itself reaches): a miss prints MISS and is recorded, but it
    does not fail the run (the exit code is for correctness), and the grader gives points for
    correctness only.
    """

    name: str
    passed: bool
    detail: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    target: bool = False

    def line(self) -> str:
        status = "PASS" if self.passed else ("MISS" if self.target else "FAIL")
        return f"{status}  {self.name}  {self.detail}".rstrip()


def check_relative(name: str, out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
                   tol: float | None = None) -> Check:
    """PASS when the relative error against the float64 reference is within tolerance."""
    tol = REL_TOL[dtype] if tol is None else tol
    err = relative_error(out, ref)
    if out.shape != ref.shape:
        return Check(name, False, f"shape {tuple(out.shape)} but expected {tuple(ref.shape)}")
    return Check(name, err <= tol, f"rel_err {err:.2e} (tol {tol:.0e})", {"rel_err": err})


def check_allclose(name: str, out: torch.Tensor, expected: torch.Tensor,
                   atol: float = COURSE_ATOL, rtol: float = 1e-5) -> Check:
    """The course's check: torch.allclose with its atol (default rtol)."""
    if out.shape != expected.shape:
        return Check(name, False, f"shape {tuple(out.shape)} but expected {tuple(expected.shape)}")
    ok = torch.allclose(out.float(), expected.float(), atol=atol, rtol=rtol)
    max_abs = (out.float() - expected.float()).abs().max().item()
    return Check(name, bool(ok), f"max |diff| {max_abs:.2e} (allclose atol {atol:.0e})",
                 {"max_abs_diff": max_abs})


def check_raises(name: str, fn, exc_types=(ValueError, TypeError, RuntimeError),
                 must_mention: str | None = None) -> Check:
    """PASS when fn() raises one of exc_types (and, optionally, mentions a word)."""
    try:
        fn()
    except exc_types as err:  # noqa: PERF203 - the exception is the point
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        ok = must_mention is None or must_mention.lower() in str(err).lower()
        return Check(name, ok, f"raised {type(err).__name__}: {msg[:90]}")
    except Exception as err:  # a crash of the wrong kind is a failure, not a pass
        return Check(name, False, f"raised the wrong exception {type(err).__name__}: {err}")
    return Check(name, False, "no exception was raised")


def report(title: str, checks: list[Check]) -> int:
    """Print the uniform PASS/FAIL/MISS table; return the process exit code.

    The exit code says whether the code is correct: 1 when a correctness check failed (or
    none ran), else 0. A missed performance target prints MISS and is counted on the last
    line, but does not fail the run: timings depend on the GPU, and a student whose code is
    right must see a green run (the figures are recorded either way)."""
    print(f"\n== {title} ==")
    for c in checks:
        print("  " + c.line())
    if not checks:
        print("  FAIL  no checks ran")
        return 1
    failed = [c for c in checks if not c.passed and not c.target]
    missed = [c for c in checks if not c.passed and c.target]
    line = f"  {len(checks) - len(failed) - len(missed)}/{len(checks)} passed"
    if failed:
        line += "; failed: " + ", ".join(c.name for c in failed)
    if missed:
        line += (f"; {len(missed)} target{'s' if len(missed) > 1 else ''} missed (MISS: "
                 "recorded, not a failure): " + ", ".join(c.name for c in missed))
    print(line)
    return 1 if failed else 0


def missed_targets(checks: list[Check]) -> int:
    """How many targets were missed (run_all's summary shows the count)."""
    return sum(1 for c in checks if not c.passed and c.target)


def correctness_passed(checks: list[Check]) -> bool:
    """Every check passed, except perhaps performance targets."""
    return bool(checks) and all(c.passed or c.target for c in checks)


def assert_checks(checks: list[Check]) -> None:
    """For pytest: fail with every failing correctness line, not only the first. Performance
    targets (target=True) are reported by the task CLIs, not asserted: timings vary by GPU."""
    assert checks, "no checks ran"
    failed = [c.line() for c in checks if not c.passed and not c.target]
    assert not failed, "\n".join(failed)
