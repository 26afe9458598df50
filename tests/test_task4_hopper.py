"""Task 4+: the Hopper kernel (task4/flash_attention_hopper.cuh, its host entry
flash_attention_hopper.cu and instantiation files flash_attention_hopper_<dtype>.cu;
task4/hopper.py).

CPU: the kernel's files compile device side for sm_90a (wgmma, setmaxnreg need the "a" target)
through ptxas, every instantiation (exactly once) without local-memory spills and without ptxas
giving up on wgmma pipelining or setmaxnreg; the Python module imports and says unavailable off Hopper.
GPU (compute capability 9.0 only): every version against float64 by FlashAttention-2's
criterion on small shapes that are not tile multiples, causal and not, GQA, Sq != Sk,
strided views, NaN-poisoned outputs, bit-identical reruns; block-sparse bool and additive
mask tensors (the per-tile summary) on versions 2 and 5 and through flash_attention.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import _sm90_compile
import pytest
import torch

from common import build

REPO_ROOT = Path(__file__).resolve().parent.parent
# The extension's .cu files: the host entry and the instantiations (task4/hopper.py SOURCES).
SOURCES = [REPO_ROOT / "task4" / name for name in (
    "flash_attention_hopper.cu", "flash_attention_hopper_fp16.cu", "flash_attention_hopper_fp16_general.cu",
    "flash_attention_hopper_bf16.cu", "flash_attention_hopper_bf16_general.cu")]
# 2 dtypes x (head_dim 64: v1-v7, 128: v1-v5 and v7) dense, + 2 dtypes x 2 head dims x (v2, v5)
# with the general predicate (windows, lengths, sinks), + 2 dtypes x 2 head dims v5 with the
# softcap, + head_dim 256's own tile: 2 dtypes x (v2, v5 dense, v5 general, v5 softcap), + its
# 80-key tile (ATTN_HOPPER_D256_TILE): 2 dtypes x (v4, v5) dense, + the general v7
# (ATTN_HOPPER_GENERAL_VERSION=7): 2 dtypes x 2 head dims. Head_dim 96 runs on the 128
# instantiations. (The general v5's A/B kernels at head_dim 128, ATTN_HOPPER_GENERAL_LOOP=old and
# ATTN_HOPPER_EDGE_MASK=two_sided, 2 dtypes each, were removed once the H100 had measured them.)
EXPECTED_KERNELS = 26 + 8 + 4 + 8 + 4 + 4


def test_sources_are_the_extensions():
    from task4 import hopper

    # (The backward's files, hopper.BACKWARD_SOURCES, have their own test:
    # tests/test_task4_hopper_backward.py.)
    assert [str(p.relative_to(REPO_ROOT)) for p in SOURCES] == \
        [s for s in hopper.SOURCES if s.endswith(".cu") and s not in hopper.BACKWARD_SOURCES]


@pytest.fixture(scope="module")
def ptxas_report() -> str:
    """The files' device-side compiles for sm_90a with ptxas -v (tests/_sm90_compile.py)."""
    return _sm90_compile.ptxas_report(SOURCES)


def _kernels(report: str) -> dict[str, list[str]]:
    """{mangled kernel name: its 'Function properties' lines, once per file that compiled it}."""
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"Function properties for (\S*flash_attention_hopper_kernel\S*)\n"
                             r"(.*\n.*)", report):
        found.setdefault(match.group(1), []).append(match.group(2))
    return found


@pytest.mark.slow
def test_every_instantiation_compiles_for_sm90a_without_spills(ptxas_report):
    # Each kernel in one file (the header's extern declarations keep the others from compiling
    # it again). The instantiation files carry no solution region, so the student skeleton
    # compiles every instantiation too, of the kernel bodies it has.
    kernels = _kernels(ptxas_report)
    assert len(kernels) == EXPECTED_KERNELS, \
        f"expected {EXPECTED_KERNELS} kernels:\n{ptxas_report[-3000:]}"
    for name, found in kernels.items():
        assert len(found) == 1, f"{name} is compiled in {len(found)} files"
        props = found[0]
        assert "0 bytes spill stores, 0 bytes spill loads" in props, f"{name} spills: {props}"
        assert "0 bytes stack frame" in props, f"{name} uses local memory: {props}"


@pytest.mark.slow
def test_ptxas_keeps_wgmma_async_and_honours_setmaxnreg(ptxas_report):
    # C7510-style "wgmma.mma_async instructions are serialized" costs the overlap the kernel is
    # built for; C7508 says setmaxnreg was ignored (no register cap at entry).
    lowered = ptxas_report.lower()
    assert "serialized" not in lowered, ptxas_report[-3000:]
    assert "setmaxnreg" not in lowered, ptxas_report[-3000:]


def test_module_imports_and_is_unavailable_off_hopper():
    from task4 import hopper

    assert hopper.VERSIONS == (1, 2, 3, 4, 5, 6, 7)
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        assert not hopper.available()
        q = torch.zeros(1, 1, 8, 64, dtype=torch.float16)
        assert not hopper.supports(q, q, q)
        with pytest.raises(build.BuildError):
            hopper.load()


# --- GPU (Hopper only) ---------------------------------------------------------------------

def _cases():
    # (B, H_q, H_kv, S_q, S_k, D, causal, layout)
    cases = []
    for s in (1, 7, 113, 257):
        for d in (64, 96, 128, 256):
            for causal in (False, True):
                cases.append((2, 3, 3, s, s, d, causal, "contiguous"))
    for d in (64, 96, 128, 256):
        for causal in (False, True):
            cases.append((1, 2, 2, 7, 300, d, causal, "contiguous"))     # Sq < Sk
            cases.append((1, 2, 2, 300, 129, d, causal, "contiguous"))   # Sq > Sk: empty rows
            cases.append((2, 8, 2, 200, 200, d, causal, "contiguous"))   # GQA
            cases.append((1, 4, 1, 65, 190, d, causal, "contiguous"))    # MQA
            cases.append((2, 4, 4, 150, 150, d, causal, "bshd"))         # strided views
    return cases


def _inputs(b, hq, hkv, sq, sk, d, dtype, layout="contiguous"):
    """q [b, hq, sq, d], k and v [b, hkv, sk, d] from a generator seeded by the shape (returned
    too, for what a test draws after them); "bshd": [B, S, H, D] tensors seen as [B, H, S, D]."""
    g = torch.Generator(device="cuda").manual_seed(sq * 131 + sk * 7 + d + hq)
    if layout == "bshd":
        q = torch.randn(b, sq, hq, d, device="cuda", generator=g).to(dtype).transpose(1, 2)
        k = torch.randn(b, sk, hkv, d, device="cuda", generator=g).to(dtype).transpose(1, 2)
        v = torch.randn(b, sk, hkv, d, device="cuda", generator=g).to(dtype).transpose(1, 2)
    else:
        q = torch.randn(b, hq, sq, d, device="cuda", generator=g).to(dtype)
        k = torch.randn(b, hkv, sk, d, device="cuda", generator=g).to(dtype)
        v = torch.randn(b, hkv, sk, d, device="cuda", generator=g).to(dtype)
    return q, k, v, g


def _make(case, dtype):
    b, hq, hkv, sq, sk, d, causal, layout = case
    q, k, v, _ = _inputs(b, hq, hkv, sq, sk, d, dtype, layout)
    return q, k, v, causal


@pytest.mark.gpu
@pytest.mark.parametrize("version", (1, 2, 3, 4, 5, 6, 7))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_version_matches_float64(version, dtype):
    hopper = _sm90_compile.hopper_or_skip()
    from common.checks import assert_checks
    from common.variants import Variant, check_variant

    checks = []
    for case in _cases():
        if not hopper.takes_head_dim(version, case[5]):
            continue
        q, k, v, causal = _make(case, dtype)
        assert hopper.supports(q, k, v)
        checks.append(check_variant(
            f"v{version} {case}", lambda out, q=q, k=k, v=v, causal=causal:
            hopper.flash_attention_hopper(q, k, v, causal, version, out), q, k, v,
            Variant(causal=causal)))
    assert_checks(checks)


# Head_dim 256's 80-key tile (ATTN_HOPPER_D256_TILE, read per call by the host entry): key tiles
# no longer powers of two, so the causal diagonal, the sequence end and S_q != S_k land anywhere
# in a tile. "80" (v5) and "80fa3" (v4, O rescaled early, the default: the same products in the
# same order) against float64 and bit-identical to each other, "64" (the 64-key tile, kept for
# A/B runs) against float64; a variant ignores the variable (64-key tile); an unknown value raises.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_head_dim_256_tile80_matches_float64(dtype, monkeypatch):
    hopper = _sm90_compile.hopper_or_skip()
    from common.checks import Check, assert_checks
    from common.variants import Variant, check_variant

    checks = []
    cases = [c for c in _cases() if c[5] == 256] + [(1, 2, 2, 161, 161, 256, True, "contiguous"),
                                                    (1, 2, 2, 80, 241, 256, True, "contiguous")]
    for case in cases:
        q, k, v, causal = _make(case, dtype)
        outs = {}
        for tile in ("64", "80", "80fa3"):
            monkeypatch.setenv("ATTN_HOPPER_D256_TILE", tile)
            checks.append(check_variant(
                f"tile {tile} {case}", lambda out, q=q, k=k, v=v, causal=causal:
                hopper.flash_attention_hopper(q, k, v, causal, 5, out), q, k, v, Variant(causal=causal)))
            outs[tile] = hopper.flash_attention_hopper(q, k, v, causal, 5)
        checks.append(Check(f"tile 80fa3 == 80 bit for bit {case}",
                            bool(torch.equal(outs["80"].view(torch.int16), outs["80fa3"].view(torch.int16)))))
    q, k, v, _ = _make((1, 2, 2, 300, 300, 256, True, "contiguous"), dtype)
    monkeypatch.setenv("ATTN_HOPPER_D256_TILE", "80")
    variant = Variant(causal=True, window=100)
    checks.append(check_variant("tile 80 set, a window (64-key tile)", lambda out:
                                hopper.flash_attention_hopper(q, k, v, True, 5, out, window=100),
                                q, k, v, variant))
    monkeypatch.setenv("ATTN_HOPPER_D256_TILE", "96")
    with pytest.raises(ValueError, match="ATTN_HOPPER_D256_TILE"):
        hopper.flash_attention_hopper(q, k, v, True, 5)
    assert_checks(checks)


# The issue's lengths (not tile multiples), both head dims and masks, B and H varied, every
# other case on strided [B, S, H, D] views: through task4.attention.flash_attention, which must
# route each to the Hopper kernel.
ISSUE_LENGTHS = (1, 7, 113, 1000, 1023, 2049, 4097)


def _issue_cases():
    cases, batch_heads = [], ((2, 3), (1, 5), (3, 2), (1, 1))
    for i, s in enumerate(ISSUE_LENGTHS):
        for d in (64, 128):
            for causal in (False, True):
                b, h = batch_heads[(i + d // 64) % len(batch_heads)] if s < 2000 else (1, 2)
                layout = "bshd" if (i + causal) % 2 else "contiguous"
                cases.append((b, h, h, s, s, d, causal, layout))
    return cases


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_dispatched_kernel_on_the_issue_lengths(dtype):
    _sm90_compile.hopper_or_skip()
    from common.checks import assert_checks
    from common.variants import Variant, check_variant
    from task4 import attention

    checks = []
    for case in _issue_cases():
        q, k, v, causal = _make(case, dtype)
        assert attention._hopper_version(q, k, v, causal, None) is not None, case
        checks.append(check_variant(
            f"flash_attention {case}", lambda out, q=q, k=k, v=v, causal=causal:
            attention.flash_attention(q, k, v, causal, out), q, k, v, Variant(causal=causal)))
        torch.cuda.empty_cache()
    assert_checks(checks)


@pytest.mark.gpu
def test_refuses_what_it_does_not_take():
    hopper = _sm90_compile.hopper_or_skip()
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    assert hopper.supports(q, q, q)
    assert not hopper.supports(q, q, q, stride=2)              # a per-key predicate: mma.sync
    assert hopper.supports(q, q, q, mask=torch.ones(64, 64, dtype=torch.bool, device="cuda"))
    assert not hopper.supports(q, q, q, mask=torch.ones(64, 64, dtype=torch.bool))  # on the CPU
    assert not hopper.supports(q.float(), q.float(), q.float())
    d80 = torch.randn(1, 2, 64, 80, device="cuda", dtype=torch.float16)
    assert not hopper.supports(d80, d80, d80)                   # not one of 64, 96, 128, 256
    with pytest.raises(ValueError, match="head_dim other than"):
        hopper.flash_attention_hopper(d80, d80, d80)
    d96 = torch.randn(1, 2, 64, 96, device="cuda", dtype=torch.float16)
    d256 = torch.randn(1, 2, 64, 256, device="cuda", dtype=torch.float16)
    assert hopper.supports(d96, d96, d96) and hopper.supports(d256, d256, d256)
    with pytest.raises(ValueError, match="head_dim 64 only"):
        hopper.flash_attention_hopper(d96, d96, d96, version=6)
    for version in (1, 3, 4, 7):                                # 256 has versions 2 and 5 only
        with pytest.raises(ValueError, match="head_dim 256 runs versions 2 and 5"):
            hopper.flash_attention_hopper(d256, d256, d256, version=version)
    with pytest.raises(ValueError):
        hopper.flash_attention_hopper(q, q, q, version=8)
    with pytest.raises(ValueError, match="versions 2, 5, 6 or 7"):
        hopper.flash_attention_hopper(q, q, q, True, 3, window=16)
    with pytest.raises(ValueError, match="a stride"):
        hopper.flash_attention_hopper(q, q, q, True, 5, stride=2)
    with pytest.raises(ValueError, match="versions 2, 5, 6 or 7"):
        hopper.flash_attention_hopper(q, q, q, True, 4, mask=torch.ones(64, 64, dtype=torch.bool,
                                                                       device="cuda"))
    q128 = torch.randn(1, 2, 64, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim 64 only"):
        hopper.flash_attention_hopper(q128, q128, q128, version=6)


# Block-sparse masks on the Hopper kernel, called as versions 2 and 5 (a mask tensor runs on
# the general v5 whichever of 2, 5 and 6 is asked), and through flash_attention, which must
# route them to the Hopper kernel: (B, H_q, H_kv, S_q, S_k, D, causal, mask kind of
# task4.variants_checks.BLOCK_MASKS).
MASK_CASES = [
    (2, 4, 2, 700, 900, 128, True, "blocks"), (2, 4, 2, 700, 900, 128, False, "blocks"),
    (1, 4, 4, 1000, 600, 64, True, "blocks"), (1, 4, 4, 1000, 600, 64, False, "blocksbh"),
    (1, 4, 1, 300, 1100, 128, False, "blocks2d"), (2, 4, 4, 500, 500, 64, False, "blocks64"),
    (2, 4, 4, 500, 500, 128, True, "blocks64"), (1, 8, 2, 640, 768, 64, True, "blocksfloat"),
    (2, 4, 4, 384, 1100, 128, False, "blocksfloat32"), (1, 2, 2, 7, 300, 128, True, "blocks"),
    (1, 2, 2, 1, 1, 64, False, "blocksfloat"),
    # head_dim 96 on the 128 tile; 256's 64-key tiles read the 128-key summary's blocks
    (1, 4, 2, 700, 900, 96, True, "blocks"), (2, 4, 4, 500, 500, 96, False, "blocks64"),
    (2, 4, 2, 700, 900, 256, True, "blocks"), (2, 4, 4, 500, 500, 256, False, "blocks64"),
    (1, 4, 4, 384, 1100, 256, False, "blocksfloat32"), (1, 8, 2, 640, 768, 256, True, "blocksfloat"),
]


# Head dims 96 (the 128 tile, zero-filled columns) and 256 (64-key tiles) with the variants real
# models run there (Gemma-2 at 256: softcap and sliding windows; Phi-3 at 96): (B, H_q, H_kv,
# S_q, S_k, D, variant kwargs), on versions 2 and 5 (256's general v2 runs as v5) and through
# flash_attention, which must route them to the Hopper kernel.
def _head_dim_variant_cases():
    lengths3 = torch.tensor([300, 129, 1], dtype=torch.int32, device="cuda")
    cases = []
    for d in (96, 256):
        cases += [
            (1, 4, 2, 300, 300, d, dict(causal=True, window=100)),
            (2, 4, 4, 257, 257, d, dict(causal=False, window=64)),
            (3, 2, 2, 300, 300, d, dict(causal=True, key_lengths=lengths3, left_padding=True)),
            (3, 2, 1, 113, 300, d, dict(causal=False, key_lengths=lengths3)),
            (1, 4, 2, 200, 200, d, dict(causal=True, softcap=50.0, window=90)),
            (2, 2, 2, 129, 129, d, dict(causal=False, softcap=30.0)),
            (1, 2, 2, 100, 700, d, dict(causal=True, window=200)),            # S_q < S_k
            (1, 4, 4, 300, 129, d, dict(causal=True, sinks=torch.linspace(-1, 2, 4, device="cuda"))),
            (1, 2, 2, 65, 190, d, dict(causal=True, scale=0.3)),
        ]
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_variants_at_head_dims_96_and_256(dtype):
    hopper = _sm90_compile.hopper_or_skip()
    from common.checks import assert_checks
    from common.variants import Variant, check_variant
    from task4 import attention

    checks = []
    for b, hq, hkv, sq, sk, d, kwargs in _head_dim_variant_cases():
        q, k, v, _ = _inputs(b, hq, hkv, sq, sk, d, dtype)
        variant = Variant(**kwargs)
        name = f"{(b, hq, hkv, sq, sk, d)} {variant.describe()}"
        assert hopper.supports(q, k, v), name
        assert attention._hopper_version(q, k, v, variant.causal, None) is not None, name
        call = {n: value for n, value in variant.kwargs().items() if n != "causal"}
        for version in (2, 5):
            checks.append(check_variant(
                f"v{version} {name}", lambda out, q=q, k=k, v=v, version=version, causal=variant.causal,
                call=call: hopper.flash_attention_hopper(q, k, v, causal, version, out, **call),
                q, k, v, variant))
        checks.append(check_variant(
            f"flash_attention {name}", lambda out, q=q, k=k, v=v, variant=variant:
            attention.flash_attention(q, k, v, out=out, **variant.kwargs()), q, k, v, variant))
    assert_checks(checks)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_block_sparse_masks_on_the_hopper_kernel(dtype):
    hopper = _sm90_compile.hopper_or_skip()
    from common.checks import assert_checks
    from common.variants import Variant, check_variant
    from task4 import attention
    from task4.variants_checks import block_sparse_mask

    checks = []
    for b, hq, hkv, sq, sk, d, causal, kind in MASK_CASES:
        q, k, v, g = _inputs(b, hq, hkv, sq, sk, d, dtype)
        mask = block_sparse_mask(kind, b, hq, sq, sk, dtype, g, "cuda")
        variant = Variant(causal=causal, mask=mask)
        name = f"{(b, hq, hkv, sq, sk, d)} {variant.describe()} ({kind})"
        assert hopper.supports(q, k, v, mask=mask), name
        assert attention._hopper_version(q, k, v, causal, None, 1, mask) is not None, name
        for version in (2, 5):
            checks.append(check_variant(
                f"v{version} {name}", lambda out, q=q, k=k, v=v, version=version, causal=causal,
                mask=mask: hopper.flash_attention_hopper(q, k, v, causal, version, out, mask=mask),
                q, k, v, variant))
        checks.append(check_variant(
            f"flash_attention {name}", lambda out, q=q, k=k, v=v, variant=variant:
            attention.flash_attention(q, k, v, out=out, **variant.kwargs()), q, k, v, variant))
    assert_checks(checks)


def test_tile_summary_reference_on_hand_built_blocks():
    """The per-tile summary's definition (task4.hopper.tile_summary_reference, what the kernel's
    tile_summary_kernel must write) on blocks whose kind is known: 0 nothing kept, 1 all kept
    with no bias, 2 partial or biased; the edges of S_q, S_k left out; broadcasts kept."""
    from task4.hopper import tile_summary_reference

    seq_q, seq_k = 200, 300          # 2 x 3 tiles of 128: the last row and column partial
    keep = torch.zeros(seq_q, seq_k, dtype=torch.bool)
    keep[:128, :128] = True          # tile (0, 0): all kept
    keep[:128, 128:256] = True
    keep[5, 200] = False             # tile (0, 1): one element dropped
    keep[128:, 256:] = True          # tile (1, 2): all kept (its rows and keys end early)
    keep[130, 10] = True             # tile (1, 0): one element kept
    got = tile_summary_reference(keep, seq_q, seq_k)
    assert got.shape == (1, 1, 2, 3) and got.dtype == torch.uint8
    assert got[0, 0].tolist() == [[1, 2, 0], [2, 0, 1]]
    # 64-row tiles: rows 0..63 and 64..127 of tile (0, 1) differ
    assert tile_summary_reference(keep, seq_q, seq_k, block_m=64)[0, 0, :2].tolist() == [
        [1, 2, 0], [1, 1, 0]]
    # additive: -inf drops, 0 keeps, a finite nonzero bias (or NaN) makes the tile partial
    add = torch.where(keep, 0.0, float("-inf"))
    add[0, 0] = 0.5                  # tile (0, 0) biased
    add[129, 257] = float("nan")     # tile (1, 2)
    add[0, 255] = -0.0               # still clean
    assert tile_summary_reference(add, seq_q, seq_k)[0, 0].tolist() == [[2, 2, 0], [2, 0, 2]]
    # a [B, 1, 1, S_k] key-padding mask: batch kept, heads and rows broadcast
    pad = torch.ones(2, 1, 1, seq_k, dtype=torch.bool)
    pad[1, :, :, 128:] = False
    got = tile_summary_reference(pad, seq_q, seq_k)
    assert got.shape == (2, 1, 2, 3)
    assert got[0, 0].tolist() == [[1, 1, 1]] * 2 and got[1, 0].tolist() == [[1, 0, 0]] * 2


@pytest.mark.gpu
def test_tile_summary_kernel_matches_its_definition():
    hopper = _sm90_compile.hopper_or_skip()
    from task4.variants_checks import BLOCK_MASKS, block_sparse_mask

    g = torch.Generator(device="cuda").manual_seed(7)
    for b, hq, sq, sk in ((2, 4, 700, 900), (1, 3, 1, 129), (3, 2, 1000, 128)):
        q = torch.zeros(b, hq, sq, 64, device="cuda", dtype=torch.float16)
        k = torch.zeros(b, 1, sk, 64, device="cuda", dtype=torch.float16)
        for kind in BLOCK_MASKS:
            mask = block_sparse_mask(kind, b, hq, sq, sk, torch.float16, g, "cuda")
            for block_m in (64, 128):
                got = hopper.tile_summary(q, k, mask, block_m)
                want = hopper.tile_summary_reference(mask, sq, sk, block_m)
                assert torch.equal(got, want), (b, hq, sq, sk, kind, block_m)
        strided = block_sparse_mask("blocks", b, 1, sk, sq, torch.float16, g, "cuda").transpose(-1, -2)
        assert torch.equal(hopper.tile_summary(q, k, strided), hopper.tile_summary_reference(strided, sq, sk))


def test_the_ladder_records_every_figure_results_md_shows():
    """task4/hopper_ladder.py's metric names are the ones task 4's manifest renders: a table
    of the shape time_ladder returns yields every Metric of the Hopper section, and no other."""
    from common.manifest import Metric
    from task4 import hopper_ladder, manifest

    table = {f"{dtype}.{shape}.{mask}": {"cudnn": 600.0, "fa2": 300.0, "dispatched": 540.0,
                                         "version": 5.0,
                                         **{f"v{v}": 100.0 * v for v in manifest.HOPPER_VERSIONS
                                            if manifest.hopper_takes_head_dim(v, hopper_ladder.SHAPES[shape][-1])}}
             for dtype in hopper_ladder.DTYPES for shape in hopper_ladder.SHAPES
             for mask in hopper_ladder.MASKS}
    recorded = hopper_ladder.metrics_from(table)
    shown = {cell.name for block in manifest.HOPPER_SECTION.blocks for row in block.rows
             for cell in row.cells if isinstance(cell, Metric)}
    assert set(recorded) == shown
    # The issue's acceptance names: flash_attention's own figures per dtype, shape and mask.
    assert recorded["task4.hopper.bf16.b4_h32_s4096_d128.causal.ratio_vs_sdpa_cudnn"] == 0.9
    assert recorded["task4.hopper.fp16.b8_h32_s2048_d64.noncausal.tflops"] == 540.0
    assert recorded["task4.hopper.v3.bf16.b4_h32_s4096_d128.causal.tflops"] == 300.0
    assert tuple(hopper_ladder.SHAPES) == manifest.HOPPER_SHAPES


def test_flash_attention_routes_what_the_hopper_kernel_takes(monkeypatch):
    """With HOPPER_PREFILL on, fp16/bf16 inputs the Hopper kernel takes go to it, at the
    version chosen for their head_dim and mask (here task4.attention's rules: the measured table
    is tested below); anything else (fp32, head_dim 80, a kernel that says no, no Hopper GPU)
    stays on the mma.sync path. Fakes stand in for the GPU."""
    from task4 import attention, hopper

    calls = []
    monkeypatch.setattr(attention, "_routes", {})  # a fresh memo: the routing below is faked
    monkeypatch.setattr(hopper, "routing", lambda: {})
    monkeypatch.setattr(attention, "HOPPER_PREFILL", True)
    monkeypatch.setattr(attention, "_hopper_ready", lambda: True)
    monkeypatch.setattr(hopper, "supports", lambda q, *a, **kw: q.shape[2] != 5)
    monkeypatch.setattr(hopper, "flash_attention_hopper",
                        lambda q, k, v, causal, version, out, lse=None, scale=None, **variant:
                        calls.append((version, scale, variant)) or q)

    def route(dtype, seq, head_dim, causal=False):
        q = torch.zeros(1, 2, seq, head_dim, dtype=dtype)
        return attention._hopper_version(q, q, q, causal, None)

    chosen = {d: attention.HOPPER_VERSION[(d, False)] for d in (64, 96, 128, 256)}
    assert set(attention.HOPPER_VERSION) == {(d, c) for d in (64, 96, 128, 256)
                                             for c in (False, True)}
    assert set(attention.HOPPER_VERSION.values()) <= set(hopper.VERSIONS)
    assert all(hopper.takes_head_dim(v, d) for (d, _), v in attention.HOPPER_VERSION.items())
    assert route(torch.float16, 8, 128) == chosen[128] and route(torch.bfloat16, 8, 64) == chosen[64]
    assert route(torch.float16, 8, 64, causal=True) == attention.HOPPER_VERSION[(64, True)]
    assert route(torch.float32, 8, 128) is None      # fp32: the course kernel
    assert route(torch.float16, 8, 96) == chosen[96]     # on the 128 tile, columns zero-filled
    assert route(torch.bfloat16, 8, 256, causal=True) == attention.HOPPER_VERSION[(256, True)]
    assert route(torch.float16, 8, 80) is None       # no rung for head_dim 80: mma.sync
    assert route(torch.float16, 5, 64) is None       # the kernel's own supports() says no
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    assert attention.flash_attention(q, q, q) is q and calls[-1][:2] == (chosen[64], None)
    assert attention.flash_attention(q, q, q, scale=0.2) is q          # a scale it takes
    assert calls[-1][:2] == (chosen[64], 0.2)
    # Every variant goes to the Hopper kernel too, passed on as it is (its general predicate).
    sinks = torch.zeros(2)
    assert attention.flash_attention(q, q, q, True, window=4, softcap=30.0, sinks=sinks) is q
    assert calls[-1][0] == attention.HOPPER_VERSION[(64, True)]
    assert calls[-1][2]["window"] == 4 and calls[-1][2]["softcap"] == 30.0
    assert calls[-1][2]["sinks"] is sinks
    keep = torch.ones(8, 8, dtype=torch.bool)                         # a mask tensor too
    assert attention.flash_attention(q, q, q, True, mask=keep) is q
    assert calls[-1][0] == attention.HOPPER_VERSION[(64, True)] and calls[-1][2]["mask"] is keep
    with attention.hopper_prefill(False):
        assert route(torch.float16, 8, 128) is None
    assert route(torch.float16, 8, 128) == chosen[128]
    monkeypatch.setattr(attention, "HOPPER_PREFILL", False)
    assert route(torch.float16, 8, 128) is None


def test_the_hopper_kernel_is_on_unless_switched_off():
    """flash_attention uses the Hopper kernel by default; ATTN_HOPPER_PREFILL=0 switches it off."""
    import subprocess
    import sys

    code = "from task4 import attention; print(attention.HOPPER_PREFILL)"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("ATTN_HOPPER_PREFILL", None)
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    off = subprocess.run([sys.executable, "-c", code], env={**env, "ATTN_HOPPER_PREFILL": "0"},
                         capture_output=True, text=True)
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False"), on.stderr + off.stderr


def test_without_a_hopper_gpu_the_routing_never_builds_it(monkeypatch):
    from task4 import attention, hopper

    monkeypatch.setattr(hopper, "available", lambda: False)
    attention._hopper_probe.cache_clear()
    try:
        assert attention._hopper_ready() is False
    finally:
        attention._hopper_probe.cache_clear()


def test_the_routing_table_is_measured_and_covers_every_case(monkeypatch):
    """task4/hopper_routing.json (written by `python -m task4.hopper_ladder --routing`) names the
    GPU it was measured on and, for every dtype, head_dim, mask and key-length bucket, a rung
    that takes the head_dim and is the fastest of the TFLOP/s it lists; flash_attention routes by
    it, bucketing S_k up to each bound (longer keys: the last)."""
    from task4 import attention, hopper

    table = hopper.routing()
    assert table, f"{hopper.ROUTING_PATH} is missing: run python -m task4.hopper_ladder --routing"
    assert table["measured"]["device"] not in (None, "cpu") and table["measured"]["commit"]
    for dtype in ("fp16", "bf16"):
        for head_dim in (64, 128):
            for causal in (False, True):
                for bucket in hopper.SEQ_BUCKETS:
                    key = hopper.routing_key(dtype, head_dim, causal, bucket)
                    version, tflops = table["versions"][key], table["tflops"][key]
                    assert version in hopper.ROUTING_VERSIONS and hopper.takes_head_dim(version, head_dim)
                    assert tflops[f"v{version}"] == max(tflops.values()), key
    assert [hopper.seq_bucket(s) for s in (1, 512, 513, 16384, 100000)] == [512, 512, 1024, 16384, 16384]
    fake = {"versions": {hopper.routing_key("bf16", 128, True, 2048): 2}}
    monkeypatch.setattr(hopper, "routing", lambda: fake)
    assert hopper.routed_version(torch.bfloat16, 128, True, 1500) == 2
    assert hopper.routed_version(torch.float16, 128, True, 1500) is None   # not in the table
    assert hopper.routed_version(torch.float32, 128, True, 1500) is None
    assert hopper.routed_version(torch.bfloat16, 96, True, 1500) == 2      # 96 runs the 128 kernel
    assert hopper.routed_version(torch.bfloat16, 256, True, 1500) is None  # not measured yet
    monkeypatch.setattr(attention, "HOPPER_PREFILL", True)
    monkeypatch.setattr(attention, "_hopper_ready", lambda: True)
    monkeypatch.setattr(hopper, "supports", lambda *a, **kw: True)
    q = torch.zeros(1, 2, 7, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 1500, 128, dtype=torch.bfloat16)
    assert attention._hopper_version(q, k, k, True, None) == 2            # by the table, S_k's bucket
    assert attention._hopper_version(q.half(), k.half(), k.half(), True, None) == \
        attention.HOPPER_VERSION[(128, True)]                              # by the rules


# The general path's aligned variant tiling (flash_attention_hopper.cuh, VariantTiling): key
# tiles from each sequence's first key, query tiles where the causal diagonal starts a key tile
# (the first may start above row 0: a negative TMA row), CTAs whose rows see no key writing
# zeros before any barrier. Each case in the three tilings ATTN_HOPPER_VARIANT_ALIGN selects
# (0 from zero, 1 aligned, 2 from zero with the empty CTAs skipped), odd lengths, empty rows and
# whole empty sequences, and the lse of v5 (-inf, or the sink's, where a row sees no key).
def _aligned_tiling_cases():
    def lens(*xs):
        return torch.tensor(xs, dtype=torch.int32, device="cuda")
    sinks = torch.linspace(-1, 2, 4, device="cuda")
    return [  # (B, H_q, H_kv, S_q, S_k, D, variant kwargs)
        (4, 4, 2, 333, 333, 128, dict(causal=True, key_lengths=lens(333, 296, 1, 0), left_padding=True)),
        (4, 4, 2, 333, 333, 64, dict(causal=True, key_lengths=lens(333, 296, 1, 0))),
        (3, 4, 4, 77, 300, 96, dict(causal=True, key_lengths=lens(300, 250, 60), left_padding=True)),
        (3, 4, 4, 77, 300, 128, dict(causal=True, key_lengths=lens(300, 250, 60))),
        (2, 4, 1, 300, 200, 64, dict(causal=True, key_lengths=lens(200, 129), sinks=sinks)),
        (2, 4, 2, 100, 357, 128, dict(causal=True, window=100000)),     # tile 0 starts at row -1
        (2, 2, 2, 700, 700, 128, dict(causal=True, window=300, key_lengths=lens(700, 451),
                                      left_padding=True)),
        (2, 2, 2, 513, 513, 64, dict(causal=False, window=64, key_lengths=lens(513, 200))),
        (2, 4, 2, 257, 257, 256, dict(causal=True, key_lengths=lens(257, 100), left_padding=True)),
        (2, 2, 2, 130, 130, 128, dict(causal=True, key_lengths=lens(0, 0))),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("tiling", ("0", "1", "2"))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_aligned_variant_tiling(dtype, tiling, monkeypatch):
    hopper = _sm90_compile.hopper_or_skip()
    import math

    from common.checks import Check, assert_checks
    from common.variants import Variant, check_variant, reference_lse_variant

    monkeypatch.setenv("ATTN_HOPPER_VARIANT_ALIGN", tiling)
    checks = []
    for b, hq, hkv, sq, sk, d, kwargs in _aligned_tiling_cases():
        q, k, v, _ = _inputs(b, hq, hkv, sq, sk, d, dtype)
        variant = Variant(**kwargs)
        name = f"tiling {tiling} {(b, hq, hkv, sq, sk, d)} {variant.describe()}"
        call = {n: value for n, value in variant.kwargs().items() if n != "causal"}
        for version in ((5,) if d == 256 else (2, 5)):
            checks.append(check_variant(
                f"v{version} {name}", lambda out, q=q, k=k, v=v, version=version, causal=variant.causal,
                call=call: hopper.flash_attention_hopper(q, k, v, causal, version, out, **call),
                q, k, v, variant))
        lse = torch.full(q.shape[:3], float("nan"), device="cuda")
        hopper.flash_attention_hopper(q, k, v, variant.causal, 5, None, lse, **call)
        ours, truth = lse.double() * math.log(2.0), reference_lse_variant(q, k, v, variant)
        finite = torch.isfinite(truth)
        same_inf = torch.equal(finite, torch.isfinite(ours)) and bool((ours[~finite] == float("-inf")).all())
        err = (ours[finite] - truth[finite]).abs().max().item() if finite.any() else 0.0
        checks.append(Check(f"v5 lse {name}", same_inf and err <= 1e-3,
                            f"max |lse - lse64| {err:.1e}" + ("" if same_inf else "; -inf rows differ")))
    assert_checks(checks)


# The general v5's key loop split into cut and wholly visible tiles, with one-sided masks on the
# cut tiles (flash_attention_hopper.cuh, Tile::kSplitKeyLoop, Tile::kEdgeMasks), against float64
# by FlashAttention-2's criterion, output and lse, in both tilings (aligned, and from zero: more
# tiles cut at the top, left padding's first key inside a tile). Cases long enough to have tiles
# in every one of the loops (a window cut at both ends, windows narrower than a tile, padding at
# either end, S_q != S_k), a sink, a scale, and a mask tensor (the per-tile loop). (Until the
# H100 measured them, ATTN_HOPPER_GENERAL_LOOP=old and ATTN_HOPPER_EDGE_MASK=two_sided kept the
# kernels before each step, and these cases also checked them bit for bit against those:
# results/logs/h100_gen_lean_ab.log, results/logs/h100_s8_win_edge/.)
def _general_loop_cases():
    def lens(*xs):
        return torch.tensor(xs, dtype=torch.int32, device="cuda")
    sinks = torch.linspace(-1, 2, 4, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(33)
    return [  # (B, H_q, H_kv, S_q, S_k, D, variant kwargs)
        (2, 2, 2, 1100, 1100, 128, dict(causal=True, key_lengths=lens(1100, 777))),
        (2, 2, 1, 1100, 1100, 96, dict(causal=True, key_lengths=lens(1100, 801), left_padding=True)),
        (1, 2, 2, 1500, 1500, 128, dict(causal=True, window=513)),
        (1, 2, 2, 1000, 1000, 128, dict(causal=False, window=300)),
        (1, 4, 2, 300, 900, 128, dict(causal=True, window=450, sinks=sinks)),
        (2, 2, 2, 900, 600, 128, dict(causal=True, key_lengths=lens(600, 333), scale=0.3)),
        (1, 2, 2, 700, 700, 128, dict(causal=True, window=50)),
        (2, 2, 2, 600, 600, 96, dict(causal=True, window=100, key_lengths=lens(600, 333), left_padding=True)),
        (2, 2, 2, 513, 513, 128, dict(causal=False, window=64, key_lengths=lens(513, 200))),
        (2, 2, 2, 650, 650, 128, dict(causal=False, window=190, key_lengths=lens(650, 377), left_padding=True)),
        (1, 2, 2, 640, 640, 128, dict(causal=True, mask=torch.rand(1, 2, 640, 640, device="cuda",
                                                                   generator=g) < 0.8)),
    ]


def _lse_check(name, lse, q, k, v, variant):
    """The base-2 lse the kernel wrote against float64's (natural) lse: the same -inf rows, and
    the finite ones within 1e-3."""
    import math

    from common.checks import Check
    from common.variants import reference_lse_variant

    ours, truth = lse.double() * math.log(2.0), reference_lse_variant(q, k, v, variant)
    finite = torch.isfinite(truth)
    same_inf = torch.equal(finite, torch.isfinite(ours)) and bool((ours[~finite] == float("-inf")).all())
    err = (ours[finite] - truth[finite]).abs().max().item() if finite.any() else 0.0
    return Check(f"lse {name}", same_inf and err <= 1e-3,
                 f"max |lse - lse64| {err:.1e}" + ("" if same_inf else "; -inf rows differ"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_general_split_loop_matches_float64(dtype, monkeypatch):
    hopper = _sm90_compile.hopper_or_skip()
    from common.checks import assert_checks
    from common.variants import Variant, check_variant

    checks = []
    for b, hq, hkv, sq, sk, d, kwargs in _general_loop_cases():
        q, k, v, _ = _inputs(b, hq, hkv, sq, sk, d, dtype)
        variant = Variant(**kwargs)
        call = {n: value for n, value in variant.kwargs().items() if n != "causal"}
        for tiling in ("1", "0"):
            monkeypatch.setenv("ATTN_HOPPER_VARIANT_ALIGN", tiling)
            name = f"v5 {(b, hq, hkv, sq, sk, d)} {variant.describe()} tiling {tiling}"
            checks.append(check_variant(
                name, lambda out, q=q, k=k, v=v, causal=variant.causal, call=call:
                hopper.flash_attention_hopper(q, k, v, causal, 5, out, **call), q, k, v, variant))
            lse = torch.full(q.shape[:3], float("nan"), device="cuda")
            hopper.flash_attention_hopper(q, k, v, variant.causal, 5, None, lse, **call)
            checks.append(_lse_check(name, lse, q, k, v, variant))
    assert_checks(checks)


# The general v7 (flash_attention_hopper.cuh, Tile::kVariantSchedule; ATTN_HOPPER_GENERAL_VERSION=7,
# read per call by the host entry): the persistent kernel on the aligned tiling's work tiles,
# ordered on the device from the key lengths, its zero-only rows written by the producer
# warpgroup's idle warps. Against float64 by FlashAttention-2's criterion (output and lse), and
# bit for bit equal to the general v5 (the same tiles, the same key loop): the split loop's cases,
# the aligned tiling's, and batches with more work tiles than an H100 has SMs. A mask tensor,
# the softcap and head_dim 256 run the general v5 under "7"; an unknown value raises.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_general_v7_matches_float64_and_v5(dtype, monkeypatch):
    hopper = _sm90_compile.hopper_or_skip()
    from common.checks import Check, assert_checks
    from common.variants import Variant, check_variant

    def bits(t):
        return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)

    def lens(*xs):
        return torch.tensor(xs, dtype=torch.int32, device="cuda")
    cases = [c for c in _general_loop_cases() + _aligned_tiling_cases() if c[5] != 256] + [
        (8, 16, 4, 1100, 1100, 128, dict(causal=True, key_lengths=lens(1100, 1000, 900, 700, 513, 300, 129, 0),
                                           left_padding=True)),
        (8, 16, 4, 1100, 1100, 64, dict(causal=True, key_lengths=lens(1100, 1000, 900, 700, 513, 300, 129, 0))),
        (1, 2, 2, 500, 500, 128, dict(causal=True, softcap=30.0, window=70)),  # the general v5 in both
    ]
    checks = []
    for b, hq, hkv, sq, sk, d, kwargs in cases:
        q, k, v, _ = _inputs(b, hq, hkv, sq, sk, d, dtype)
        variant = Variant(**kwargs)
        call = {n: value for n, value in variant.kwargs().items() if n != "causal"}
        results = {}
        for general in ("7", "5"):
            monkeypatch.setenv("ATTN_HOPPER_GENERAL_VERSION", general)
            name = f"general v{general} {(b, hq, hkv, sq, sk, d)} {variant.describe()}"
            if general == "7":
                checks.append(check_variant(
                    name, lambda out, q=q, k=k, v=v, causal=variant.causal, call=call:
                    hopper.flash_attention_hopper(q, k, v, causal, 5, out, **call), q, k, v, variant))
            lse = torch.full(q.shape[:3], float("nan"), device="cuda")
            out = hopper.flash_attention_hopper(q, k, v, variant.causal, 5, None, lse, **call)
            if general == "7":
                checks.append(_lse_check(name, lse, q, k, v, variant))
            results[general] = (out, lse)
        same = all(torch.equal(bits(a), bits(b_)) for a, b_ in zip(results["7"], results["5"]))
        checks.append(Check(f"general v7 == v5 bit for bit: {(b, hq, hkv, sq, sk, d)} {variant.describe()}",
                            same, "output and lse"))
    assert_checks(checks)
    monkeypatch.setenv("ATTN_HOPPER_GENERAL_VERSION", "6")
    q, k, v, _ = _inputs(1, 2, 2, 64, 64, 128, dtype)
    with pytest.raises(ValueError, match="ATTN_HOPPER_GENERAL_VERSION"):
        hopper.flash_attention_hopper(q, k, v, True, 5, key_lengths=lens(50))
