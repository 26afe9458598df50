"""Beyond the course (issue 33): the wgmma backward for Hopper (task4/flash_backward_hopper_kernel.cuh,
its host entry flash_backward_hopper.cu and instantiation files flash_backward_hopper_<dtype>.cu,
built into the Hopper extension, task4/hopper.py), and its routing (task4/backward.py, under
ATTN_BWD_LAYOUT=wgmma).

CPU: the files compile device side for sm_90a through ptxas, each kernel once, without
local-memory spills and without ptxas serializing the wgmma or ignoring setmaxnreg.
GPU (compute capability 9.0 only): dq, dk, dv through task4.attention.flash_attention with
ATTN_BWD_LAYOUT=wgmma against float64 by FlashAttention-2's criterion (the helpers of
task4/backward_checks.py) on odd lengths, S_q != S_k (causal bottom-right), GQA and MQA, head
dims 64, 96 and 128, logits x6, dO not contiguous; dk and dv bit-identical on a second run (no
atomics reach them); out-of-scope calls (a window) still run the mma.sync backward.
"""

from __future__ import annotations

import re
from pathlib import Path

import _sm90_compile
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCES = [REPO_ROOT / "task4" / name for name in (
    "flash_backward_hopper.cu", "flash_backward_hopper_fp16.cu", "flash_backward_hopper_bf16.cu")]
# 2 dtypes x head dims 64 and 128.
EXPECTED_KERNELS = 4


def test_sources_are_in_the_hopper_extension():
    from task4 import hopper

    assert [str(p.relative_to(REPO_ROOT)) for p in SOURCES] == hopper.BACKWARD_SOURCES
    assert set(hopper.BACKWARD_SOURCES) <= set(hopper.SOURCES)


@pytest.fixture(scope="module")
def ptxas_report() -> str:
    """The files' device-side compiles for sm_90a with ptxas -v (tests/_sm90_compile.py)."""
    return _sm90_compile.ptxas_report(SOURCES)


@pytest.mark.slow
def test_every_instantiation_compiles_for_sm90a_without_spills(ptxas_report):
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"Function properties for (\S*flash_backward_hopper_kernel\S*)\n(.*\n.*)",
                             ptxas_report):
        found.setdefault(match.group(1), []).append(match.group(2))
    assert len(found) == EXPECTED_KERNELS, f"expected {EXPECTED_KERNELS} kernels:\n{ptxas_report[-3000:]}"
    for name, props in found.items():
        assert len(props) == 1, f"{name} is compiled in {len(props)} files"
        assert "0 bytes spill stores, 0 bytes spill loads" in props[0], f"{name} spills: {props[0]}"
        assert "0 bytes stack frame" in props[0], f"{name} uses local memory: {props[0]}"
    lowered = ptxas_report.lower()
    assert "serialized" not in lowered, ptxas_report[-3000:]
    assert "setmaxnreg" not in lowered, ptxas_report[-3000:]


# --- GPU (Hopper only) ---------------------------------------------------------------------

def _cases(dtype):
    from task4.backward_checks import Case

    def case(*args, **kwargs):
        return Case(*args, dtype=dtype, **kwargs)

    return [
        case(1, 2, 2, 257, 257, 64), case(1, 2, 2, 257, 257, 128, True),
        case(1, 2, 2, 300, 170, 64, True), case(1, 2, 2, 170, 300, 128, True),   # bottom-right
        case(1, 2, 2, 300, 170, 128), case(1, 2, 2, 1, 129, 64, True),
        case(2, 8, 2, 200, 333, 128, True), case(2, 8, 2, 333, 200, 64),         # GQA
        case(1, 4, 1, 190, 65, 64, True),                                         # MQA
        case(1, 2, 2, 200, 200, 96, True),                                        # on the 128 tile
        case(1, 4, 2, 256, 256, 128, True, "scale"), case(1, 4, 2, 150, 150, 64, True, "views"),
        case(2, 4, 2, 300, 300, 64, True, logits=6.0), case(2, 4, 2, 300, 300, 128, logits=6.0),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_wgmma_backward_matches_float64(dtype, monkeypatch):
    _sm90_compile.hopper_or_skip()
    from common.checks import Check, assert_checks
    from task4 import backward
    from task4.backward_checks import (
        _bits,
        _criterion_details,
        _flash_gradients,
        case_inputs,
        formula_gradients,
    )

    calls = []
    original = backward._wgmma_backward

    def spy(*args):
        ext = original(*args)
        calls.append(ext is not None)
        return ext

    monkeypatch.setattr(backward, "_wgmma_backward", spy)
    monkeypatch.setenv("ATTN_BWD_LAYOUT", "wgmma")
    gen = torch.Generator(device="cuda").manual_seed(0)
    checks = []
    for case in _cases(dtype):
        q, k, v, d_out, variant = case_inputs(case, gen, "cuda")
        truth = formula_gradients(q, k, v, d_out, variant, torch.float64)
        yardstick = formula_gradients(q, k, v, d_out, variant, q.dtype)
        first = _flash_gradients(q, k, v, d_out, variant)
        second = _flash_gradients(q, k, v, d_out, variant)
        ok, details = _criterion_details(first, truth, yardstick)
        same = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(first[2:], second[2:], strict=True))
        checks.append(Check(f"wgmma backward {case.label()}", ok and same and calls[-1],
                            "; ".join(details + ([] if same else ["dk/dv differ between two runs"])
                                      + ([] if calls[-1] else ["did not run the wgmma backward"]))))
    # Outside its scope (a window) the mma.sync backward runs, under the same switch.
    from task4.backward_checks import Case

    q, k, v, d_out, variant = case_inputs(Case(1, 2, 2, 200, 200, 64, True, "window50", dtype=dtype),
                                          gen, "cuda")
    grads = _flash_gradients(q, k, v, d_out, variant)
    ok, details = _criterion_details(grads, formula_gradients(q, k, v, d_out, variant, torch.float64),
                                     formula_gradients(q, k, v, d_out, variant, q.dtype))
    checks.append(Check("a window under ATTN_BWD_LAYOUT=wgmma runs the mma.sync backward",
                        ok and not calls[-1], "; ".join(details)))
    assert_checks(checks)
