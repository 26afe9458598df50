"""Task 5: the KV cache and the decode kernels.

On the GPU: the same check groups `python -m task5.test` runs. Without one: what can be
checked on the CPU (the module imports, the split heuristic, argument handling).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from common.checks import assert_checks
from task5 import attention
from task5 import test as task5_test


def test_module_imports_without_building_the_extension():
    for name in ("update_kv_cache", "decode_attention", "decode_attention_bhsd",
                 "allocate_kv_cache", "choose_num_splits", "CustomFlashAttention"):
        assert callable(getattr(attention, name))
    assert set(task5_test.GROUPS) == {"kernels", "inputs", "small", "course", "decode",
                                      "gqa-small", "gqa", "gqa-bench", "fused-small", "fused"}


def test_split_heuristic_fills_the_gpu_without_tiny_splits():
    choose = attention.choose_num_splits
    # B 1, H 32 on 132 SMs: one block per head would leave most SMs idle, so split ...
    assert choose(32, 32768, 132) == 16
    # ... but never below MIN_KEYS_PER_SPLIT keys a split,
    assert choose(8, 2048, 132) == 2048 // attention.MIN_KEYS_PER_SPLIT
    assert choose(32, attention.MIN_KEYS_PER_SPLIT * 2 - 1, 132) == 1 and choose(32, 1, 132) == 1
    # and not at all once batch * heads gives every SM a couple of blocks.
    assert choose(16 * 32, 2048, 132) == 1
    assert choose(4 * 32, 4096, 132) == 4
    for batch_heads in (1, 7, 32, 512, 10**6):
        for context in (1, 255, 256, 4097, 10**6):
            splits = choose(batch_heads, context, 132)
            assert 1 <= splits <= attention.MAX_AUTO_SPLITS
            assert splits == 1 or context // splits >= attention.MIN_KEYS_PER_SPLIT
    assert choose(0, 100, 132) == 1 and choose(8, 0, 132) == 1


def test_positions_and_lengths_are_ints_or_tensors():
    convert = attention._int_or_tensor
    assert convert(5, "seq_len") == (5, None)
    length = torch.tensor(3, dtype=torch.int32)
    value, tensor = convert(length, "seq_len")
    assert value == 0 and tensor is length
    for bad in (True, 2.0, "3", None):
        with pytest.raises(TypeError, match="int"):
            convert(bad, "seq_len")


def test_allocate_kv_cache_shapes():
    k_cache, v_cache = attention.allocate_kv_cache(2, 8, 16, torch.float16, "cpu")
    assert k_cache.shape == v_cache.shape == (2, 8, 16) and k_cache.dtype == torch.float16
    assert k_cache.data_ptr() != v_cache.data_ptr() and not k_cache.any()


def test_module_argument_checks_need_no_gpu():
    hidden, heads = 64, 4
    weights = [torch.randn(hidden, hidden) for _ in range(4)]
    with pytest.raises(ValueError, match="divisible"):
        attention.CustomFlashAttention(*weights, hidden, 5)
    with pytest.raises(ValueError, match="128"):
        attention.CustomFlashAttention(*weights[:4], 272, 2)
    module = attention.CustomFlashAttention(*weights, hidden, heads)
    cache = attention.allocate_kv_cache(2, 8, hidden, torch.float32, "cpu")
    with pytest.raises(ValueError, match="one new token"):
        module(torch.randn(2, 3, hidden), cache, decode=True, current_pos=4)
    with pytest.raises(ValueError, match="current_pos"):
        module(torch.randn(2, 3, hidden), cache, decode=False, current_pos=2)
    with pytest.raises(ValueError, match="x must be"):
        module(torch.randn(2, 3, hidden + 1), cache)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
def test_gpu_groups_fail_cleanly_without_a_gpu():
    for group in task5_test.GROUPS.values():
        checks, metrics = group(SimpleNamespace(device="cpu", seed=None))
        assert checks and not any(c.passed for c in checks) and not metrics


@pytest.mark.gpu
def test_task5_kernels():
    checks, _ = task5_test.kernels_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task5_small():
    checks, _ = task5_test.small_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task5_bad_inputs_raise():
    checks, _ = task5_test.inputs_group()
    assert_checks(checks)


@pytest.mark.gpu
@pytest.mark.parametrize("group", ["fused-small", "fused"])
def test_task5_fused_decode_kernels(group):
    """Norm, RoPE + cache append and SwiGLU kernels against float64 and their PyTorch twins."""
    checks, _ = task5_test.GROUPS[group]()
    assert_checks(checks)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_task5_course_protocol():
    checks, _ = task5_test.course_group()
    assert_checks(checks)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_task5_decode_kernel_speed():
    checks, _ = task5_test.decode_group()
    assert_checks(checks)
