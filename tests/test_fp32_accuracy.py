"""fp32 accuracy at large logits (task4/fp32_accuracy_checks.py).

The GPU test runs every fp32 attention path (task 4's course kernel and its entries, task 5's
decode kernels with and without splits, the grouped decode with variants) on inputs scaled x6
and x10 against FlashAttention-2's criterion, as `python -m task4.fp32_accuracy_checks` does:
every path must meet it. Skipped without a GPU. The CPU tests pin the yardstick,
the control and the verdicts on stand-ins.
"""

from __future__ import annotations

import math

import pytest
import torch

from common.checks import assert_checks
from common.variants import Variant, reference_attention_variant
from task4 import fp32_accuracy_checks as fp32


@pytest.mark.gpu
def test_every_fp32_path_meets_flashattention2s_criterion_at_large_logits():
    checks, _ = fp32.fp32_accuracy_group()
    assert_checks(checks)


# --- CPU: the yardsticks and the verdicts ------------------------------------------------

@pytest.mark.parametrize("variant", [
    Variant(), Variant(causal=True), Variant(causal=True, window=3),
    Variant(key_lengths=torch.tensor([5, 0], dtype=torch.int32)),
    Variant(mask=torch.tensor([[True, False] * 4] * 6))])
def test_pytorch_formulas_are_attention_in_fp32(variant):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 16, generator=gen)
    k, v = (torch.randn(2, 2, 8, 16, generator=gen) for _ in range(2))
    ref = reference_attention_variant(q, k, v, variant)
    formulas = fp32.pytorch_formulas(q, k, v, variant)
    assert set(formulas) == {fp32.SDPA_MATH, fp32.TEXTBOOK}
    for name, out in formulas.items():
        assert out.dtype == torch.float32 and out.shape == q.shape, name
        assert (out.double() - ref).abs().max().item() < 1e-5, name


def _case(group, run, seed=1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 7, 24, generator=gen) * 6
    k, v = (torch.randn(1, 2, 7, 24, generator=gen) * 6 for _ in range(2))
    return fp32.Case(group, "B1 H2 Sq7 Sk7 D24", 6.0, q, k, v, lambda: run(q, k, v))


def _truth(q, k, v):
    return reference_attention_variant(q, k, v).float()


@pytest.mark.parametrize("group", ["prefill", "decode"])
def test_the_criterion_passes_the_truth_and_fails_what_is_off(group):
    assert fp32.evaluate(_case(group, _truth)).passed
    off = fp32.evaluate(_case(group, lambda q, k, v: _truth(q, k, v) + 1e-3))
    assert not off.passed and off.ours > off.bound
    nan = fp32.evaluate(_case(group, lambda q, k, v: _truth(q, k, v).fill_(math.nan)))
    assert not nan.passed


def test_a_kernel_that_raises_fails_with_its_message():
    def broken(q, k, v):
        raise RuntimeError("Task 4: flash_attention_fp32 is not implemented yet")

    result = fp32.evaluate(_case("prefill", broken))
    assert not result.passed and "not implemented" in result.error


def test_the_bound_doubles_sdpas_error_and_every_verdict_fails():
    result = fp32.evaluate(_case("prefill", _truth))
    assert result.bound == 2 * result.pytorch[fp32.SDPA_MATH] + fp32.ABS_FLOOR
    over = fp32.evaluate(_case("prefill", lambda q, k, v: _truth(q, k, v) + 1e-3))
    for group in ("prefill", "decode"):
        check = fp32._summary(group, 6.0, [result, over])
        assert not check.target and not check.passed and check.line().startswith("FAIL")
        assert "textbook formula is over on" in check.detail


def test_every_group_builds_its_cases_and_one_check_per_scale():
    gen = torch.Generator().manual_seed(2)
    for group in fp32.CASES_PER_GROUP:
        cases = fp32.make_cases(group, 3, 6.0, gen, torch.device("cpu"))
        assert len(cases) == 3
        for case in cases:
            b, hq, sq, d = case.q.shape
            assert case.k.shape[0] == b and hq % case.k.shape[1] == 0
            assert d in fp32.HEAD_DIMS and case.q.stride(-1) == 1
            assert sq == 1 or not group.startswith("decode")
    results = [fp32.evaluate(_case("prefill", _truth, seed)) for seed in range(3)]
    check = fp32._summary("prefill", 6.0, results)
    assert check.passed and "ratio" in check.detail
    assert check.name == "fp32 accuracy x6: prefill"
