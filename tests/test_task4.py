"""Task 4: the fused FlashAttention-2 kernels.

The GPU tests wrap the groups of `python -m task4.test` (skipped without CUDA). The CPU tests
check the Python side with a stand-in extension: routing by dtype, the head views and the
merge of the module, the not-implemented message of the student skeleton, and the flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from common.checks import assert_checks, reference_attention
from common.mha import make_mha, merge_heads, mha_weights, reference_module_output, split_heads
from task4 import attention
from task4 import test as task4_test

# --- CPU: the Python side, with a stand-in for the CUDA extension ---------------------------


def _attention_into(q, k, v, causal, out):
    """What the kernels compute, in float64 on the CPU, written into `out` when given."""
    result = reference_attention(q, k, v, causal).to(q.dtype)
    if out is None:
        return result.contiguous()
    out.copy_(result)
    return out


class FakeExtension:
    """Stands in for the built extension; records which entry ran."""

    def __init__(self):
        self.calls: list[str] = []

    # The variant arguments (window, stride, mask, key_lengths, left_padding, then lse for the
    # mma entry, softcap, sinks, scale) of the real entries are taken and must be the
    # defaults here: these tests are about dense attention.
    @staticmethod
    def _dense(variant):
        return variant[:5] in ((), (None, 1, None, None, False)) and \
            all(value is None for value in variant[5:])

    def flash_attention_fp32(self, q, k, v, causal=False, out=None, *variant):
        assert self._dense(variant)
        self.calls.append("fp32")
        return _attention_into(q, k, v, causal, out)

    def flash_attention_mma(self, q, k, v, causal=False, out=None, *variant):
        assert self._dense(variant)
        self.calls.append("mma")
        return _attention_into(q, k, v, causal, out)

    def custom_flash_attention(self, q, k, v, num_heads, causal=False, out=None):
        self.calls.append("course")
        heads = [split_heads(t, num_heads) for t in (q, k, v)]
        result = merge_heads(reference_attention(*heads, causal)).to(q.dtype)
        return result if out is None else out.copy_(result)


@pytest.fixture
def fake_ext(monkeypatch):
    ext = FakeExtension()
    monkeypatch.setattr(attention, "_extension", lambda: ext)
    return ext


def test_flash_attention_routes_by_dtype(fake_ext):
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    attention.flash_attention(q, k, v)
    attention.flash_attention(q.half(), k.half(), v.half(), causal=True)
    attention.flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert fake_ext.calls == ["fp32", "mma", "mma"]


def test_a_call_shaped_like_a_checked_one_skips_the_checks_not_their_sentences(fake_ext, monkeypatch):
    """flash_attention remembers the route of a call signature it has checked (host time, issue
    31); anything that would fail the checks differs in its signature, so it still raises."""
    import common.inputs

    monkeypatch.setattr(attention, "_routes", {})
    monkeypatch.setattr(FakeExtension, "_dense", staticmethod(lambda variant: True))
    checked = []
    real_check = common.inputs.check_attention_arguments
    monkeypatch.setattr(attention, "check_attention_arguments",
                        lambda *a, **kw: checked.append(1) or real_check(*a, **kw))
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    lengths = torch.tensor([3], dtype=torch.int32)
    for _ in range(3):
        attention.flash_attention(q, k, v, True)
        attention.flash_attention(q, k, v, True, key_lengths=lengths)
    assert len(checked) == 2 and fake_ext.calls == ["fp32"] * 6
    fresh = [torch.randn(1, 2, 5, 8) for _ in range(3)]  # same metadata, new tensors
    assert torch.allclose(attention.flash_attention(*fresh, True),
                          reference_attention(*fresh, True).float())
    assert len(checked) == 2
    with pytest.raises(TypeError, match="causal"):
        attention.flash_attention(q, k, v, 1)                       # 1 == True, but not a bool
    with pytest.raises(ValueError, match="contiguous"):
        attention.flash_attention(q, k.mT.contiguous().mT, v, True)  # same shape, other strides
    with pytest.raises(ValueError, match="key_lengths"):            # values: checked every call
        attention.flash_attention(q, k, v, True, key_lengths=torch.tensor([9], dtype=torch.int32))
    with pytest.raises(TypeError, match="window"):
        attention.flash_attention(q, k, v, True, window=2.0)
    with pytest.raises(TypeError):
        attention.flash_attention(q, k, v, True, mask=[[True]])    # unhashable: not remembered


def test_flash_attention_writes_out(fake_ext):
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    out = torch.full((1, 5, 2, 8), float("nan")).transpose(1, 2)
    assert attention.flash_attention(q, k, v, True, out=out) is out
    assert torch.allclose(out, reference_attention(q, k, v, True).float())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel, dtype, expected", [
    ("auto", torch.float32, ["course"]), ("fp32", torch.float32, ["course"]),
    ("mma", torch.float32, ["mma"]), ("auto", torch.bfloat16, ["mma"]),
    ("fp32", torch.bfloat16, ["course"])])
def test_module_projects_splits_and_merges_heads(fake_ext, kernel, dtype, expected, causal):
    hidden, heads = 32, 4
    mha = make_mha(hidden, heads, device="cpu", seed=0)
    weights = [w.to(dtype) for w in mha_weights(mha)]
    module = attention.CustomFlashAttention(*weights, hidden, heads, kernel=kernel)
    x = torch.randn(2, 7, hidden).to(dtype)
    out = module(x, causal=causal)
    assert fake_ext.calls == expected and out.dtype == dtype and out.shape == x.shape
    truth = reference_module_output(x, weights, heads, causal)
    tol = 1e-5 if (dtype == torch.float32 and kernel != "mma") else 3e-2
    assert (out.double() - truth).norm() / truth.norm() < tol


def test_module_rejects_bad_arguments():
    w = torch.eye(8)
    with pytest.raises(ValueError, match="divisible"):
        attention.CustomFlashAttention(w, w, w, w, 8, 3)
    with pytest.raises(ValueError, match="kernel"):
        attention.CustomFlashAttention(w, w, w, w, 8, 2, kernel="tensor")


def test_unwritten_solution_is_not_implemented(monkeypatch):
    def skeleton(*args):
        raise RuntimeError("Task 4: flash_attention_fp32 is not implemented yet\nmore")

    monkeypatch.setattr(attention, "_extension", lambda: SimpleNamespace(flash_attention_fp32=skeleton))
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(NotImplementedError, match="Task 4"):
        attention.flash_attention(q, q, q)


def test_other_runtime_errors_pass_through(monkeypatch):
    def broken(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(attention, "_extension", lambda: SimpleNamespace(flash_attention_fp32=broken))
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        attention.flash_attention(q, q, q)


def test_groups_and_course_metric_names():
    assert list(task4_test.GROUPS) == ["small", "inputs", "arguments", "shapes", "course",
                                       "kernel", "mma",
                                       "mma-bench", "variants-small", "variants",
                                       "variants-inputs", "strided", "variants-bench",
                                       "fp32-accuracy", "backward-small", "backward",
                                       "backward-bench", "backward-half-small", "backward-half",
                                       "backward-half-bench"]
    names = {f"task4.speedup.{c.mask}.{c.label}" for c in task4_test.COURSE_CASES}
    assert names == set(task4_test.SPEEDUP_METRICS) == {
        "task4.speedup.noncausal.b4_s128", "task4.speedup.noncausal.b64_s4096",
        "task4.speedup.causal.b4_s128", "task4.speedup.causal.b64_s4096"}
    # non-causal first, then causal, as the course runs them
    assert [c.causal for c in task4_test.COURSE_CASES] == [False, False, True, True]


def test_configs_flag():
    assert task4_test._config_list("0,2") == [0, 2]
    for bad in ("1,x", "7"):
        with pytest.raises(argparse.ArgumentTypeError):
            task4_test._config_list(bad)


def test_fp32_config_sets_and_restores_the_environment(monkeypatch):
    monkeypatch.delenv(task4_test.CONFIG_ENV, raising=False)
    with task4_test.fp32_config(2):
        assert os.environ[task4_test.CONFIG_ENV] == "2"
    assert task4_test.CONFIG_ENV not in os.environ
    monkeypatch.setenv(task4_test.CONFIG_ENV, "1")
    with task4_test.fp32_config(0):
        assert os.environ[task4_test.CONFIG_ENV] == "0"
    assert os.environ[task4_test.CONFIG_ENV] == "1"
    with task4_test.fp32_config(None):
        assert os.environ[task4_test.CONFIG_ENV] == "1"


def test_missing_mma_checks_is_a_failed_check_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "task4.mma_checks", None)  # import now raises ImportError
    if hasattr(sys.modules["task4"], "mma_checks"):
        monkeypatch.delattr(sys.modules["task4"], "mma_checks")
    for group in (task4_test.mma_group, task4_test.mma_bench_group):
        checks, metrics = group()
        assert len(checks) == 1 and not checks[0].passed and "missing" in checks[0].detail
        assert metrics == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report given without a GPU")
def test_without_a_gpu_the_test_says_so_in_one_sentence(capsys):
    assert task4_test.main(["--inputs", "--no-record"]) == 1
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "needs an NVIDIA GPU" in out and "FAIL" not in out


# --- GPU: the groups of python -m task4.test ----------------------------------------------


@pytest.mark.gpu
def test_task4_small():
    checks, _ = task4_test.small_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task4_bad_inputs_raise():
    checks, _ = task4_test.inputs_group()
    assert_checks(checks)


def test_every_bad_argument_raises_its_sentence_before_routing():
    """The checks every path goes through, on CPU tensors (CI): each bad call of the GPU
    group `arguments` raises ValueError/TypeError naming the argument."""
    from task4.argument_checks import cpu_check_cases

    assert_checks(cpu_check_cases())


def test_each_path_of_the_arguments_group_is_forced_and_restored():
    from task4 import argument_checks
    from task5 import attention as decode

    before = (attention.STRIDE_AS_DENSE_CLASSES, attention.HOPPER_PREFILL, decode.TENSOR_CORE_DECODE,
              decode.GQA_DECODE_KERNEL)
    for dtype in argument_checks.DTYPES.values():
        found = argument_checks.paths(dtype)
        assert {"strided classes", "task5.attention.attention"} <= {p[0] for p in found}
        for name, _, context, _ in found:
            with context():
                if name == "mma.sync kernel":
                    assert not attention.HOPPER_PREFILL and not attention.STRIDE_AS_DENSE_CLASSES
                if name == "grouped decode (CUDA cores)":
                    assert not decode.TENSOR_CORE_DECODE
                if name == "tensor-core decode on task 4's kernel":
                    assert decode.TENSOR_CORE_DECODE and not decode.GQA_DECODE_KERNEL
            assert (attention.STRIDE_AS_DENSE_CLASSES, attention.HOPPER_PREFILL,
                    decode.TENSOR_CORE_DECODE, decode.GQA_DECODE_KERNEL) == before


def test_a_pybind_type_error_becomes_a_sentence():
    from common.build import call_extension

    def entry(*args):
        raise TypeError("entry(): incompatible function arguments. The following argument types "
                        "are supported:\n    1. (arg0: torch.Tensor, arg1: bool) -> torch.Tensor"
                        "\n\nInvoked with: 'x', 'y'")

    with pytest.raises(TypeError, match=r"entry got an argument of the wrong type; it takes "
                                        r"\(arg0: torch.Tensor, arg1: bool\)"):
        call_extension(entry, "x", "y")


@pytest.mark.gpu
def test_task4_bad_arguments_on_every_kernel_path():
    from task4.argument_checks import arguments_group

    checks, _ = arguments_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task4_odd_shapes():
    checks, _ = task4_test.shapes_group()
    assert_checks(checks)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_task4_course_protocol():
    checks, metrics = task4_test.course_group()
    assert_checks(checks)
    assert set(task4_test.SPEEDUP_METRICS) <= set(metrics)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_task4_kernel_vs_sdpa():
    checks, metrics = task4_test.kernel_group()
    assert_checks(checks)
    assert "task4.fp32.b64_h32_s4096_d128.causal.ratio_vs_sdpa_efficient" in metrics


@pytest.mark.gpu
def test_task4_mma():
    checks, _ = task4_test.mma_group()
    assert_checks(checks)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_task4_mma_bench():
    checks, _ = task4_test.mma_bench_group()
    assert_checks(checks)
