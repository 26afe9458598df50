"""Task 4's points, graded groups, metric names and Results.md sections (see common/manifest.py).

The module speedups are recorded by common.harness.module_checks under
`module_metric("task4", "speedup", mask, label)`; the kernel-alone figures by task4/test.py
(fp32 course kernel) and task4/mma_checks.py (fp16/bf16 tensor-core kernel).
"""

from common.manifest import (
    Metric,
    Part,
    Row,
    Section,
    SpeedRule,
    Table,
    TaskManifest,
    module_metric,
)

MASKS = ("noncausal", "causal")
COURSE_SHAPES = (("b4_s128", "(4, 128)"), ("b64_s4096", "(64, 4096)"))   # (label, (B, S))


def speedup(mask: str, shape: str) -> str:
    """task4.speedup.<mask>.<b4_s128|b64_s4096>: nn.MultiheadAttention time / ours, whole module."""
    return module_metric("task4", "speedup", mask, shape)


SPEEDUP_METRICS = tuple(speedup(mask, shape) for mask in MASKS for shape, _ in COURSE_SHAPES)


def fp32_prefix(shape: str, mask: str) -> str:
    """task4.fp32.<b_h_s_d>.<mask>: the fp32 course kernel alone against SDPA."""
    return f"task4.fp32.{shape}.{mask}"


def mma_prefix(dtype: str, shape: str, mask: str) -> str:
    """task4.mma.<dtype>.<b_h_s_d>.<mask>: the fp16/bf16 tensor-core kernel against SDPA."""
    return f"task4.mma.{dtype}.{shape}.{mask}"


# Task 4's tiers: the module time includes the fp32 projections (~65% of nn.MultiheadAttention's
# time at (64, 4096)), so even a free kernel reaches only ~1.5x; 0.7x means our attention takes
# ~2.2x SDPA's fp32 kernel (~22 TFLOP/s), 0.5x ~3.8x (~12 TFLOP/s).
TIERS = ((0.7, 1.0), (0.5, 0.5))

COURSE_SECTION = Section(
    "Task 4: fused FlashAttention-2 (fp32) vs nn.MultiheadAttention, whole module",
    intro=("hidden 4096, 32 heads (head_dim 128); speedup = nn.MultiheadAttention time / ours "
           "(median of CUDA-event timings, projections included in both).",),
    blocks=(Table(("(B, S)", "non-causal speedup", "causal speedup"),
                  tuple(Row((label, *(Metric(speedup(m, shape), suffix="x") for m in MASKS)))
                        for shape, label in COURSE_SHAPES)),),
    sources=("task4.speedup",))


def _kernel_rows() -> tuple[Row, ...]:
    rows = []
    for shape in ("b64_h32_s4096_d128", "b4_h32_s128_d128"):
        for mask in MASKS:
            p = fp32_prefix(shape, mask)
            rows.append(Row(("fp32 course kernel", shape, mask, Metric(f"{p}.tflops", "{:.1f}"),
                             "SDPA efficient", Metric(f"{p}.sdpa_efficient_tflops", "{:.1f}"),
                             Metric(f"{p}.ratio_vs_sdpa_efficient", suffix="x")), when=p))
    for dtype in ("fp16", "bf16"):
        for shape in ("b4_h32_s4096_d128", "b8_h32_s2048_d64"):
            for mask in MASKS:
                p = mma_prefix(dtype, shape, mask)
                for peer in ("flash", "cudnn"):
                    rows.append(Row((f"{dtype} tensor-core kernel", shape, mask,
                                     Metric(f"{p}.tflops", "{:.1f}"), f"SDPA {peer}",
                                     Metric(f"{p}.sdpa_{peer}_tflops", "{:.1f}"),
                                     Metric(f"{p}.ratio_vs_sdpa_{peer}", suffix="x")),
                                    when=f"{p}.sdpa_{peer}_tflops"))
    return tuple(rows)


KERNEL_SECTION = Section(
    "Kernel alone vs PyTorch SDPA (same inputs, same run)",
    intro=("TFLOP/s = 4·B·H·S²·D / time (halved when causal); ratio = our throughput / the "
           "peer's (> 1 means faster).",),
    blocks=(Table(("kernel", "shape", "mask", "ours TFLOP/s", "peer", "peer TFLOP/s", "ratio"),
                  _kernel_rows()),),
    sources=("task4.fp32", "task4.mma"), where="beyond")

# --- attention variants (task4/variants_checks.py) --------------------------------------------

def variant_prefix(case: str) -> str:
    """task4.variants.fp16.<case>: window<W>_s<S>, stride<N>_s<S>, dense_<b_h_s_d>.<mask>."""
    return f"task4.variants.fp16.{case}"


WINDOW_CASE = "window4096_s16384"          # B 1, H 32, S 16384, D 128, window 4096
STRIDE_CASES = tuple(f"stride{n}_s4096" for n in (2, 4, 8))   # B 1, H 16, S 4096, D 64
DENSE_CASES = ("dense_b4_h32_s4096_d128", "dense_b8_h32_s2048_d64")


def _dense_rows() -> tuple[Row, ...]:
    return tuple(Row((case.removeprefix("dense_"), mask,
                      Metric(f"{variant_prefix(case)}.{mask}.tflops", "{:.0f}"),
                      Metric(f"{variant_prefix(case)}.{mask}.before_tflops", "{:.0f}"),
                      Metric(f"{variant_prefix(case)}.{mask}.ratio_vs_before", "{:.3f}")),
                     when=f"{variant_prefix(case)}.{mask}")
                 for case in DENSE_CASES for mask in MASKS)


VARIANTS_SECTION = Section(
    "Attention variants on the prefill kernels (fp16)",
    intro=("One predicate (common/csrc/attention_mask.cuh) serves GQA, S_q != S_k, sliding windows, "
           "strides, mask tensors and key lengths; correctness of every pattern is checked against "
           "float64 by FlashAttention-2's criterion (`python -m task4.test --variants`). "
           "Sliding window 4096 at S 16384 (B 1, H 32, D 128), causal: ",
           Metric(f"{variant_prefix(WINDOW_CASE)}.ms", "{:.2f}"), " ms against ",
           Metric(f"{variant_prefix(WINDOW_CASE)}.dense_causal_ms", "{:.2f}"),
           " ms dense causal, a speedup of ",
           Metric(f"{variant_prefix(WINDOW_CASE)}.speedup_vs_dense_causal", suffix="x"),
           " (the visible (query, key) pairs alone allow ",
           Metric(f"{variant_prefix(WINDOW_CASE)}.work_ratio", suffix="x"), ")."),
    blocks=(Table(("strided, causal (B 1, H 16, S 4096, D 64)", "ours ms (dense classes)",
                   "ours ms (per-element predicate)", "SDPA + materialised mask ms", "speedup"),
                  tuple(Row((case.split("_")[0], Metric(f"{variant_prefix(case)}.ms", "{:.3f}"),
                             Metric(f"{variant_prefix(case)}.predicate_ms", "{:.3f}"),
                             Metric(f"{variant_prefix(case)}.sdpa_mask_ms", "{:.3f}"),
                             Metric(f"{variant_prefix(case)}.speedup_vs_sdpa_mask", suffix="x")),
                            when=variant_prefix(case)) for case in STRIDE_CASES)),
            Table(("dense shape", "mask", "TFLOP/s now", "TFLOP/s before the variants",
                   "ratio (same run, alternating)"), _dense_rows())),
    sources=("task4.variants",), where="beyond")

# --- the backward pass (task4/backward_checks.py) ---------------------------------------------

BACKWARD_FP32_SHAPES = ("b4_h32_s1024_d64", "b1_h32_s4096_d128")
# The tensor-core backward (fp16/bf16): issue 33's Measure shapes.
BACKWARD_HALF_SHAPES = ("b4_h32_s4096_d128", "b8_h32_s2048_d64", "b1_h32_s16384_d128")


def backward_prefix(dtype: str, shape: str, mask: str) -> str:
    """task4.backward.<dtype>.<b_h_s_d>.<mask>: the attention backward against SDPA's."""
    return f"task4.backward.{dtype}.{shape}.{mask}"


BACKWARD_SECTION = Section(
    "The backward pass (fp32 lesson kernel) vs SDPA's fp32 backward",
    intro=("task4/flash_backward.cu through autograd (`python -m task4.test --backward-bench`): "
           "the time of the backward alone, with the forward's output and lse saved; TFLOP/s = "
           "2.5 x the forward's 4·B·H·S²·D (halved when causal) / time, FlashAttention's "
           "convention; ratio = SDPA's time / ours (> 1 means faster), SDPA pinned to its "
           "efficient backend in fp32, alternating rounds in one process. Correctness of every "
           "variant: `python -m task4.test --backward`.",),
    blocks=(Table(("shape", "mask", "ours ms", "ours TFLOP/s", "SDPA efficient TFLOP/s", "ratio"),
                  tuple(Row((shape, mask,
                             Metric(f"{backward_prefix('fp32', shape, mask)}.ms", "{:.2f}"),
                             Metric(f"{backward_prefix('fp32', shape, mask)}.tflops", "{:.1f}"),
                             Metric(f"{backward_prefix('fp32', shape, mask)}.sdpa_efficient_tflops",
                                    "{:.1f}"),
                             Metric(f"{backward_prefix('fp32', shape, mask)}.ratio_vs_sdpa_efficient",
                                    suffix="x")),
                            when=backward_prefix("fp32", shape, mask))
                        for shape in BACKWARD_FP32_SHAPES for mask in MASKS)),),
    sources=("task4.backward",), where="beyond")

BACKWARD_HALF_SECTION = Section(
    "The backward pass on tensor cores (fp16/bf16) vs SDPA's FLASH and cuDNN backwards",
    intro=("flash_attention's backward through autograd (`python -m task4.test "
           "--backward-half-bench`): on a Hopper GPU, dense and causal calls run the wgmma "
           "backward (task4/flash_backward_hopper_kernel.cuh: a producer warpgroup's TMA copies, "
           "two consumer warpgroups of 64 keys, S^T and dP^T so that P^T and dS^T feed dV and dK "
           "from registers); every other call and GPU, and the deterministic mode, run the "
           "mma.sync backward (task4/flash_backward_mma.cu). The backward alone, the forward's "
           "output and lse saved; "
           "TFLOP/s = 2.5 x the forward's 4·B·H·S²·D (halved when causal) / time; ratio = SDPA's "
           "time / ours (> 1 means faster), SDPA pinned to FLASH_ATTENTION (FlashAttention-2's "
           "backward) and to CUDNN_ATTENTION, same dtype, alternating rounds in one process. "
           "\"ours\" adds dQ with atomics, as FlashAttention-2 does (5 tile products); "
           "\"deterministic\" (mma.sync) is the mode `torch.use_deterministic_algorithms(True)` selects, a "
           "separate dQ pass (7 tile products, which the 2.5x convention does not count) with "
           "bit-identical gradients. Correctness of every variant in both modes: "
           "`python -m task4.test --backward-half`.",),
    blocks=(Table(("dtype", "shape", "mask", "ours TFLOP/s", "deterministic TFLOP/s",
                   "SDPA flash TFLOP/s", "vs flash", "SDPA cuDNN TFLOP/s", "vs cuDNN"),
                  tuple(Row((dtype, shape, mask,
                             Metric(f"{backward_prefix(dtype, shape, mask)}.tflops", "{:.1f}"),
                             Metric(f"{backward_prefix(dtype, shape, mask)}.deterministic_tflops",
                                    "{:.1f}"),
                             Metric(f"{backward_prefix(dtype, shape, mask)}.sdpa_flash_tflops",
                                    "{:.1f}"),
                             Metric(f"{backward_prefix(dtype, shape, mask)}.ratio_vs_sdpa_flash",
                                    suffix="x"),
                             Metric(f"{backward_prefix(dtype, shape, mask)}.sdpa_cudnn_tflops",
                                    "{:.1f}"),
                             Metric(f"{backward_prefix(dtype, shape, mask)}.ratio_vs_sdpa_cudnn",
                                    suffix="x")),
                            when=backward_prefix(dtype, shape, mask))
                        for dtype in ("fp16", "bf16") for shape in BACKWARD_HALF_SHAPES
                        for mask in MASKS)),),
    sources=("task4.backward.fp16", "task4.backward.bf16"), where="beyond")

# --- the Hopper kernel's ladder (task4/hopper_ladder.py) --------------------------------------

HOPPER_VERSIONS = (1, 2, 3, 4, 5, 6, 7)  # task4/hopper.py's VERSIONS
# The head dims each version takes (task4/flash_attention_hopper.cuh: 96 runs on the 128 tile, the
# TMA or v1's copies zero-filling columns 96..127; 256 has a 64-key tile of its own, built for v2
# and v5 alone, and dense v5 calls at 256 run an 80-key tile on v4's loop; v6's 160-register
# consumers hold 64 only). Other head dims run the mma.sync kernel.
HOPPER_HEAD_DIMS = {1: (64, 96, 128), 2: (64, 96, 128, 256), 3: (64, 96, 128), 4: (64, 96, 128),
                    5: (64, 96, 128, 256), 6: (64,), 7: (64, 96, 128)}
HOPPER_SHAPES = ("b4_h32_s4096_d128", "b8_h32_s2048_d64", "b1_h32_s16384_d128",
                 "b16_h32_s1024_d128", "b32_h32_s512_d64", "b2_h32_s8192_d64",
                 "b4_hq32_hkv8_s4096_d128")


def hopper_takes_head_dim(version: int, head_dim: int) -> bool:
    """Whether version `version` of the Hopper kernel is built for `head_dim`."""
    return head_dim in HOPPER_HEAD_DIMS.get(version, ())


def hopper_prefix(dtype: str, shape: str, mask: str, version: int | None = None) -> str:
    """task4.hopper[.v<N>].<dtype>.<shape>.<mask>: the sm_90a kernel (as flash_attention picks
    it, or version N) and its peers."""
    return f"task4.hopper.{f'v{version}.' if version else ''}{dtype}.{shape}.{mask}"


def _hopper_cases():
    return [(dtype, shape, mask) for dtype in ("fp16", "bf16") for shape in HOPPER_SHAPES
            for mask in MASKS]


def _hopper_rows() -> tuple[Row, ...]:
    rows = []
    for dtype, shape, mask in _hopper_cases():
        peers = hopper_prefix(dtype, shape, mask)
        rows.append(Row((dtype, shape, mask,
                         Metric(f"{peers}.sdpa_cudnn_tflops", "{:.0f}"),
                         Metric(f"{peers}.sdpa_flash_tflops", "{:.0f}"),
                         Metric(f"{peers}.version", "v{:.0f}"),
                         Metric(f"{peers}.tflops", "{:.0f}"),
                         Metric(f"{peers}.ratio_vs_sdpa_cudnn", suffix="x")),
                        when=f"{peers}.tflops"))
    return tuple(rows)


def _ladder_rows() -> tuple[Row, ...]:
    def cell(dtype, shape, mask, v):
        if not hopper_takes_head_dim(v, int(shape.rsplit("_d", 1)[1])):
            return "-"
        return Metric(f"{hopper_prefix(dtype, shape, mask, v)}.tflops", "{:.0f}")

    return tuple(Row((dtype, shape, mask, *(cell(dtype, shape, mask, v) for v in HOPPER_VERSIONS)),
                     when=hopper_prefix(dtype, shape, mask, HOPPER_VERSIONS[0]))
                 for dtype, shape, mask in _hopper_cases())


HOPPER_SECTION = Section(
    "The Hopper kernel (sm_90a): what flash_attention runs on an H100, and its ladder",
    intro=("task4/flash_attention_hopper.cu, timed beside SDPA pinned to cuDNN and to "
           "FlashAttention-2 in the same process (`python -m task4.hopper_ladder`); TFLOP/s = "
           "4·B·H·S²·D / time, halved when causal. The first table is "
           "task4.attention.flash_attention as tasks 5-7 call it: it runs the version that "
           "measured fastest for the dtype, head_dim, mask and key length (task4/hopper_routing.json, "
           "`python -m task4.hopper_ladder --routing`); ratio = its throughput / cuDNN's (the "
           "GQA shape's K and V repeated to 32 heads for cuDNN), then their geometric mean. The last is every version "
           "of the ladder, each timed beside cuDNN and FA2 in the run that measured it (the runs "
           "are named below): v1 wgmma with cp.async loads; v2 TMA + mbarrier pipeline; "
           "v3 producer/consumer warpgroups; v4 each consumer's softmax overlapping its own P V "
           "product; v5 the two consumers taking turns at the tensor cores; v6 v5 with three "
           "consumers (head_dim 64 only).",),
    blocks=(Table(("dtype", "shape", "mask", "cuDNN TFLOP/s", "FA2 TFLOP/s", "version",
                   "flash_attention TFLOP/s", "/ cuDNN"), _hopper_rows()),
            Table(("figure", "value"),
                  (Row(("flash_attention / cuDNN, geometric mean over every dtype, shape and mask "
                        "above (issue 31's target: 1.0)",
                        Metric("task4.hopper.dense_geomean_vs_sdpa_cudnn", suffix="x")),
                       when="task4.hopper.dense_geomean_vs_sdpa_cudnn"),)),
            Table(("dtype", "shape", "mask", *(f"v{v} TFLOP/s" for v in HOPPER_VERSIONS)),
                  _ladder_rows())),
    sources=("task4.hopper",), where="beyond")


# --- head dims 96 and 256 on the Hopper kernel (task4/hopper_head_dims.py) --------------------

HOPPER_HEAD_DIM_SHAPES = ("b2_h16_s8192_d256", "b4_h32_s4096_d96")

HOPPER_HEAD_DIMS_SECTION = Section(
    "The Hopper kernel at head dims 96 (Phi-3) and 256 (Gemma)",
    intro=("`python -m task4.hopper_head_dims`: task4.attention.flash_attention as routed (96 on "
           "the head_dim-128 tile with columns 96..127 zero-filled by the TMA; 256 on an 80-key tile "
           "of its own, FlashAttention-3's, with O rescaled while S computes; 64 keys for variants) beside SDPA pinned to each backend that runs the case, one process, "
           "alternating rounds, after every check against float64 passed. TFLOP/s = 4·B·H·S²·D / "
           "time, halved when causal; ratio = the fastest SDPA backend's time / ours (issue 31's "
           "target at 256: 1.0).",),
    blocks=(Table(("dtype", "shape", "mask", "version", "cuDNN TFLOP/s", "FA2 TFLOP/s",
                   "efficient TFLOP/s", "flash_attention TFLOP/s", "/ best SDPA"),
                  tuple(Row((dtype, shape, mask,
                             Metric(f"{hopper_prefix(dtype, shape, mask)}.version", "v{:.0f}"),
                             Metric(f"{hopper_prefix(dtype, shape, mask)}.sdpa_cudnn_tflops", "{:.0f}"),
                             Metric(f"{hopper_prefix(dtype, shape, mask)}.sdpa_flash_tflops", "{:.0f}"),
                             Metric(f"{hopper_prefix(dtype, shape, mask)}.sdpa_efficient_tflops",
                                    "{:.0f}"),
                             Metric(f"{hopper_prefix(dtype, shape, mask)}.tflops", "{:.0f}"),
                             Metric(f"{hopper_prefix(dtype, shape, mask)}.ratio_vs_sdpa_best",
                                    suffix="x")),
                            when=f"{hopper_prefix(dtype, shape, mask)}.ratio_vs_sdpa_best")
                        for dtype in ("fp16", "bf16") for shape in HOPPER_HEAD_DIM_SHAPES
                        for mask in MASKS)),),
    sources=("task4.hopper",), where="beyond")


# --- the prefill on real models' variants (task4/hopper_variants.py) --------------------------

HOPPER_VARIANT_CASES = (
    ("window4096_s16384", "sliding window 4096, B 1, S 16384, causal"),
    ("leftpad_b4_s4096", "left-padded batch, B 4, S 4096, causal"),
    ("varlen_b4_s4096", "varlen keys, B 4, S 4096, causal"),
    ("chunk1024_after7168", "S_q 1024 after 7168 cached keys, causal"),
    ("blockmask_s8192", "bool mask keeping half the 128x128 blocks, S 8192"))


def hopper_variant_prefix(dtype: str, case: str) -> str:
    """task4.hopper.variants.<dtype>.<case>: a variant as routed against dense causal."""
    return f"task4.hopper.variants.{dtype}.{case}"


HOPPER_VARIANTS_SECTION = Section(
    "The prefill on real models' variants: efficiency against dense causal",
    intro=("`python -m task4.hopper_variants`: each case as task4.attention.flash_attention routes "
           "it (on an H100 the Hopper kernel's general predicate; the block mask through its "
           "per-tile summary), H 32, D 128, timed beside dense causal attention over the same "
           "B, H, S_k, D and beside the mma.sync kernel, one process, alternating rounds. "
           "Efficiency = TFLOP/s on the visible (query, key) pairs / dense causal TFLOP/s; a "
           "variant that costs exactly its visible pairs scores 1. Targets: 0.9 (window, "
           "padding, chunk), 0.7 (block mask).",),
    blocks=(Table(("dtype", "case", "ms", "TFLOP/s (visible pairs)", "dense causal TFLOP/s",
                   "efficiency", "mma.sync efficiency"),
                  tuple(Row((dtype, label,
                             Metric(f"{hopper_variant_prefix(dtype, case)}.ms", "{:.3f}"),
                             Metric(f"{hopper_variant_prefix(dtype, case)}.tflops", "{:.0f}"),
                             Metric(f"{hopper_variant_prefix(dtype, case)}.dense_causal_tflops",
                                    "{:.0f}"),
                             Metric(f"{hopper_variant_prefix(dtype, case)}.efficiency_vs_dense"),
                             Metric(f"{hopper_variant_prefix(dtype, case)}.mma_efficiency_vs_dense")),
                            when=hopper_variant_prefix(dtype, case))
                        for dtype in ("fp16", "bf16") for case, label in HOPPER_VARIANT_CASES)),),
    sources=("task4.hopper.variants",), where="beyond")

MANIFEST = TaskManifest(
    task=4, points=4, needs_gpu=True,
    everything_groups=("backward-bench", "backward-half-bench"),
    parts=(Part(("course", "shapes"), 2),),
    speed=(SpeedRule(speedup("noncausal", "b64_s4096"), "non-causal (64, 4096)", TIERS),
           SpeedRule(speedup("causal", "b64_s4096"), "causal (64, 4096)", TIERS)),
    shown=tuple(Metric(speedup(mask, shape), suffix="x",
                       label=f"{'c' if mask == 'causal' else 'nc'} {label.strip('()').replace(', ', 'x')}")
                for shape, label in COURSE_SHAPES for mask in MASKS),
    sections=(COURSE_SECTION, KERNEL_SECTION, VARIANTS_SECTION, HOPPER_SECTION,
              HOPPER_HEAD_DIMS_SECTION, HOPPER_VARIANTS_SECTION, BACKWARD_SECTION,
              BACKWARD_HALF_SECTION),
    cpu_note="its kernel is CUDA")
