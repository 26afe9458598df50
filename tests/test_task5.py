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
                                      "gqa-small", "gqa", "gqa-mma", "gqa-bench", "paged-small",
                                      "paged", "paged-bench", "fused-small", "fused"}


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


def test_gqa_split_heuristic():
    """decode_gqa.cu's split count (FlashAttention-3's wave efficiency, FlashInfer's one wave)
    on an H100's 132 SMs with one resident block each, 4 warps, 16-key tiles (D 128)."""
    choose = attention.choose_gqa_splits
    # B 1, 8 KV heads, ctx 4096: 8 blocks would use 8 SMs; 16 splits fill 128 of 132 (15,
    # 120 of them, is not within 95% of the best).
    assert choose(8, 4096 // 16, 4, 132) == 16
    # B 1, 4 KV heads, ctx 32768: 32 splits (128 blocks), the fewest within 95% of the best.
    assert choose(4, 32768 // 16, 4, 132) == 32
    # B 8, 8 KV heads, ctx 8192: 64 blocks, 2 splits fill 128 SMs.
    assert choose(64, 8192 // 16, 4, 132) == 2
    # B 64: 512 blocks are nearly four full waves already; 80% of one wave is enough.
    assert choose(512, 1024 // 16, 4, 132) == 1
    # Within the margin, the first count that deals every warp the same whole number of tiles:
    # MQA (32 query rows: 2 row tiles) at 8192 keys, 8 warps: 32 (2 tiles each), not 31 (16.5
    # tiles a split); at 32768 keys 64, not 63 (results/logs/h100_s9_split_counts/).
    assert choose(2, 8192 // 16, 8, 132) == 32
    assert choose(2, 32768 // 16, 8, 132) == 64
    # no count within the margin divides the tiles evenly: the first of them, as before
    assert choose(32, 72, 8, 132) == 4
    assert choose(106, 10**6, 4, 132) == 1 and choose(105, 10**6, 4, 132) > 1
    # never fewer than GQA_MIN_TILES_PER_WARP tiles per warp of a split: short contexts stay whole
    assert choose(8, 2 * 4 * attention.GQA_MIN_TILES_PER_WARP - 1, 4, 132) == 1
    for blocks in (1, 3, 8, 64, 105, 400):
        for tiles in (1, 7, 64, 2048, 10**6):
            splits = choose(blocks, tiles, 4, 132)
            assert 1 <= splits <= attention.GQA_MAX_SPLITS
            assert splits == 1 or tiles // splits >= attention.GQA_MIN_TILES_PER_WARP * 4
    assert choose(0, 10, 4, 132) == choose(8, 0, 4, 132) == choose(8, 10, 4, 0) == 1


def test_gqa_split_heuristic_when_lengths_vary():
    """Key lengths that differ between sequences: twice the splits where the GPU was not full
    of unsplit blocks and each warp keeps 8 tiles (8 warps, 16-key tiles: D 128)."""
    choose = attention.choose_gqa_splits
    # B 8, 8 KV heads, ctx 8192: 2 -> 4 (measured fastest left-padded)
    assert choose(64, 8192 // 16, 8, 132) == 2
    assert choose(64, 8192 // 16, 8, 132, lengths_vary=True) == 4
    # B 4 ctx 4096: 4 splits already leave 8 tiles per warp
    assert choose(32, 4096 // 16, 8, 132, lengths_vary=True) == choose(32, 4096 // 16, 8, 132) == 4
    # B 64 ctx 1024 fills the GPU unsplit; B 8 ctx 1024 has too few tiles to split more
    assert choose(512, 1024 // 16, 8, 132, lengths_vary=True) == 1
    assert choose(64, 1024 // 16, 8, 132, lengths_vary=True) == choose(64, 1024 // 16, 8, 132)
    for blocks in (1, 3, 8, 64, 105, 400):
        for tiles in (1, 7, 64, 2048, 10**6):
            plain = choose(blocks, tiles, 8, 132)
            assert plain <= choose(blocks, tiles, 8, 132, lengths_vary=True) <= max(2 * plain, 1)


def test_gqa_split_count_depends_on_capacity_and_window_not_lengths(monkeypatch):
    """The count comes from the cache's capacity (or the window), so a captured CUDA graph
    does not depend on the lengths read on the device; more query rows are more row tiles."""
    monkeypatch.setattr(attention, "_gqa_geometry", lambda device, d, bf16: (16, 4, 1))
    monkeypatch.setattr(attention, "_num_sms", lambda device: 132)
    q, k = torch.empty(1, 32, 1, 128), torch.empty(1, 8, 4096, 128)
    assert attention.gqa_num_splits(q, k) == 16
    # a window of 1024 reads 1024 keys of each sequence: fewer tiles to split
    assert attention.gqa_num_splits(q, k, True, 1024) == attention.choose_gqa_splits(8, 64, 4, 132)
    # 16 query rows of 4 heads per KV head: 4 row tiles per KV head
    q16 = torch.empty(1, 32, 16, 128)
    assert attention.gqa_num_splits(q16, k) == attention.choose_gqa_splits(32, 256, 4, 132)
    # key lengths of several sequences may differ: twice the splits (test above); one
    # sequence, or one length for all (0-d), may not
    q8, k8 = torch.empty(8, 32, 1, 128), torch.empty(8, 8, 8192, 128)
    lengths = torch.full((8,), 100, dtype=torch.int32)
    assert attention.gqa_num_splits(q8, k8) == attention.choose_gqa_splits(64, 512, 4, 132)
    assert attention.gqa_num_splits(q8, k8, True, None, lengths) == attention.choose_gqa_splits(
        64, 512, 4, 132, lengths_vary=True)
    assert attention.gqa_num_splits(q8, k8, True, None, lengths[0]) == attention.gqa_num_splits(q8, k8)
    assert attention.gqa_num_splits(q, k, True, None, lengths[:1]) == attention.gqa_num_splits(q, k)
    # CPU tensors never route to the kernel
    assert not attention._gqa_kernel_applies(q, k)


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
    with pytest.raises(ValueError, match="256"):
        attention.CustomFlashAttention(*weights[:4], 528, 2)
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
