"""Task 5's points, graded groups, metric names and Results.md sections (see common/manifest.py)."""

from common.limits import DECODE_LINEAR_K_SPLITS
from common.manifest import Metric, Part, Row, Section, Table, TaskManifest

TTFT_SPEEDUP = "task5.speedup.ttft"   # prefill (task 4 kernel) vs nn.MultiheadAttention
TBT_SPEEDUP = "task5.speedup.tbt"     # one cached decode step vs recomputing nn.MultiheadAttention
COPY_GBPS = "task5.copy_gbps"         # device-to-device copy bandwidth, same run


def decode_prefix(dtype: str, shape: str) -> str:
    """task5.decode.<dtype>.<b_h_ctx_d>: the decode kernel alone (ms, gbps, bw_fraction, ...)."""
    return f"task5.decode.{dtype}.{shape}"


COURSE_SECTION = Section(
    "Task 5: KV cache (B 16, hidden 4096, 32 heads, prompt 1024, 100 decode steps)",
    intro=("TTFT speedup: prefill with the task 4 kernel vs nn.MultiheadAttention. TBT speedup: "
           "one decode step with the KV cache vs recomputing nn.MultiheadAttention over the "
           "whole sequence.",),
    blocks=(Table(("TTFT speedup", "TBT speedup"),
                  (Row((Metric(TTFT_SPEEDUP, suffix="x"), Metric(TBT_SPEEDUP, suffix="x"))),)),),
    sources=("task5.speedup",))


def _decode_row(shape: str) -> Row:
    p = decode_prefix("fp16", shape)
    return Row((shape, Metric(f"{p}.ms", "{:.4f}"), Metric(f"{p}.gbps", "{:.0f}"),
                Metric(f"{p}.bw_fraction"), Metric(f"{p}.sdpa_best_ms", "{:.4f}"),
                Metric(f"{p}.ratio_vs_sdpa_best", suffix="x")), when=p)


DECODE_SECTION = Section(
    "Decode kernel (fp16, one query against the cache)",
    intro=("Copy bandwidth measured in the same run: ", Metric(COPY_GBPS, "{:.0f}"),
           " GB/s (read + write). bw fraction = KV bytes read per second / copy bandwidth."),
    blocks=(Table(("shape", "ms", "GB/s", "bw fraction", "best SDPA ms", "speedup vs SDPA"),
                  tuple(_decode_row(s) for s in ("b1_h32_ctx4096_d128", "b1_h32_ctx32768_d128",
                                                 "b16_h32_ctx2048_d128"))),),
    sources=("task5.decode", "task5.copy"), where="beyond")

# Short contexts, where a decode step is latency more than bytes: timed as CUDA-graph replays.
SHORT_DECODE_SHAPES = ("b1_h32_ctx1024_d128", "b1_h32_ctx4096_d128", "b1_h8_ctx4096_d128")


def _short_decode_row(shape: str) -> Row:
    p = decode_prefix("fp16", shape)
    return Row((shape, Metric(f"{p}.graph_us", "{:.1f}"), Metric(f"{p}.num_splits", "{:.0f}"),
                Metric(f"{p}.sdpa_best_graph_us", "{:.1f}"),
                Metric(f"{p}.graph_ratio_vs_sdpa_best", suffix="x")),
               when=f"{p}.graph_ratio_vs_sdpa_best")


SHORT_DECODE_SECTION = Section(
    "Decode at short contexts (fp16, CUDA-graph replays)",
    intro=("One decode call per graph node, 32 per graph, caches rotated (bigger than L2): the "
           "host's launch cost is out, as in a captured decode step. ratio = the best SDPA "
           "backend's time / ours (> 1: ours is faster). Ours is launched overlapped on Hopper: "
           "back to back, each call starts, and asks L2 for its first keys, during the previous "
           "call's merge (in a model step, during the RoPE kernel before it). With overlapped "
           "launches switched off (ATTN_OVERLAP_LAUNCHES=0) the three ratios were at parity with "
           "cuDNN in one run: results/logs/h100_decode_short_context_overlap.json.",),
    blocks=(Table(("shape", "ours us", "splits", "best SDPA us", "ratio vs SDPA"),
                  tuple(_short_decode_row(s) for s in SHORT_DECODE_SHAPES)),),
    sources=("task5.decode",), where="beyond")

# Grouped-query decode (decode_gqa.cu; task5/variants_checks.py, --gqa-bench): the shapes of
# issue 32, each at D 128, fp16 and bf16; the bandwidth target holds for the first four.
GQA_BENCH_SHAPES = ("b1_hq32_hkv8_ctx32768", "b1_hq32_hkv4_ctx32768", "b8_hq32_hkv8_ctx8192",
                    "b64_hq32_hkv8_ctx1024", "b1_hq32_hkv8_ctx4096")
GQA_BW_SHAPES = GQA_BENCH_SHAPES[:4]
GQA_VARIANT_SHAPE = "b8_hq32_hkv8_ctx8192"              # fp16: each variant against the plain
GQA_VARIANTS = ("leftpad", "window4096", "softcap")


def gqa_prefix(dtype: str, shape: str) -> str:
    """task5.gqa.<dtype>.<shape>_d128: us, gbps, bw_fraction, copy_gbps, num_splits,
    sdpa_<backend>_us, sdpa_best_us, ratio_vs_sdpa_best; <variant>.{us,ratio_vs_plain}."""
    return f"task5.gqa.{dtype}.{shape}_d128"


GQA_CASE = gqa_prefix("fp16", "b1_hq32_hkv4_ctx32768")   # also timed on the paths before


def _gqa_row(dtype: str, shape: str) -> Row:
    p = gqa_prefix(dtype, shape)
    return Row((shape, dtype, Metric(f"{p}.us", "{:.1f}"), Metric(f"{p}.num_splits", "{:.0f}"),
                Metric(f"{p}.gbps", "{:.0f}"), Metric(f"{p}.bw_fraction"),
                Metric(f"{p}.sdpa_best_us", "{:.1f}"),
                Metric(f"{p}.ratio_vs_sdpa_best", suffix="x")), when=f"{p}.us")


def _gqa_variant_row(variant: str) -> Row:
    p = f"{gqa_prefix('fp16', GQA_VARIANT_SHAPE)}.{variant}"
    return Row((variant, Metric(f"{p}.us", "{:.1f}"), Metric(f"{p}.ratio_vs_plain", suffix="x")),
               when=f"{p}.ratio_vs_plain")


GQA_SECTION = Section(
    "Grouped-query decode (D 128, tensor cores: query heads as rows, split KV, pipelined)",
    intro=("decode_gqa.cu, timed as CUDA-graph replays in interleaved rounds with every fused "
           "SDPA backend (enable_gqa=True), caches rotated (bigger than L2). bw fraction = KV "
           "bytes read once per second / the copy bandwidth of the same run (",
           Metric(f"{GQA_CASE}.copy_gbps", "{:.0f}"), " GB/s); ratio = best SDPA time / ours "
           "(targets: ratio >= 1.0 everywhere, bw fraction >= 0.85 for the first four shapes)."),
    blocks=(Table(("shape", "dtype", "us", "splits", "GB/s", "bw fraction", "best SDPA us",
                   "ratio vs SDPA"),
                  tuple(_gqa_row(dtype, shape) for shape in GQA_BENCH_SHAPES
                        for dtype in ("fp16", "bf16"))),
            Table(("path at B 1, 32/4, ctx 32768, fp16", "us"),
                  (Row(("tensor cores, decode_gqa.cu", Metric(f"{GQA_CASE}.us", "{:.1f}")),
                       when=f"{GQA_CASE}.us"),
                   Row(("tensor cores, task 4's kernel with the query heads as rows (before)",
                        Metric(f"{GQA_CASE}.prefill_rows_us", "{:.1f}")),
                       when=f"{GQA_CASE}.prefill_rows_us"),
                   Row(("CUDA cores (grouped kernel)", Metric(f"{GQA_CASE}.cuda_core_us", "{:.1f}")),
                       when=f"{GQA_CASE}.cuda_core_us"))),
            Table((f"variant at {GQA_VARIANT_SHAPE}, fp16", "us",
                   "bandwidth over the keys read vs plain"),
                  tuple(_gqa_variant_row(v) for v in GQA_VARIANTS))),
    sources=("task5.gqa",), where="beyond")

# The paged KV cache (decode_paged.cu on decode_gqa.cu's kernel; task5/paged_checks.py,
# --paged-bench): issue 32's shape, page sizes and targets (contiguous time / paged time).
PAGED_SHAPE = "b8_hq32_hkv8_ctx8192_d128"
PAGED_TARGETS = {16: 0.9, 64: 0.95, 256: 0.95}


def _paged_row(page: int) -> Row:
    p = f"task5.paged.fp16.{PAGED_SHAPE}.page{page}"
    return Row((str(page), Metric(f"{p}.us", "{:.1f}"), Metric("task5.paged.fp16.contiguous_us", "{:.1f}"),
                Metric(f"{p}.ratio_vs_contiguous", suffix="x"), f">= {PAGED_TARGETS[page]}"),
               when=f"{p}.ratio_vs_contiguous")


PAGED_SECTION = Section(
    "Paged KV cache (fp16, B 8, 32/8 heads, context 8192, D 128; CUDA-graph replays)",
    intro=("The decode through a block table (pages of [page_size, H_kv, D], handed out "
           "shuffled) on decode_gqa.cu's kernel, against the same kernel on the contiguous cache, "
           "in interleaved rounds, caches rotated beyond L2; ratio = contiguous time / paged time "
           "(`python -m task5.test --paged-bench`)."),
    blocks=(Table(("page size", "paged us", "contiguous us", "contiguous / paged", "target"),
                  tuple(_paged_row(page) for page in PAGED_TARGETS)),),
    sources=("task5.paged",), where="beyond")

# Task 6's decode-step products at batch 4, hidden 4096: (name, rows, K, N, gated). gate_up is
# timed twice: as one plain product over the stacked [2 * width, K] weight, and as decode_swiglu
# (silu(gate) * up in the epilogue, N = width).
DECODE_PRODUCTS = (("qkv_proj", 4, 4096, 12288, False), ("o_proj", 4, 4096, 4096, False),
                   ("gate_up_proj", 4, 4096, 32768, False), ("down_proj", 4, 16384, 4096, False),
                   ("lm_head", 4, 4096, 8192, False), ("gate_up_proj, SwiGLU", 4, 4096, 16384, True))


def decode_product_prefix(dtype: str, rows: int, k: int, n: int, gated: bool) -> str:
    """task5.decode_linear.<dtype>.m<rows>_k<K>_n<N> (decode_swiglu for the gated product):
    ms, gbps, bw_fraction, k_splits<s>.gbps, cublas_ms, cublas_gbps."""
    return f"task5.{'decode_swiglu' if gated else 'decode_linear'}.{dtype}.m{rows}_k{k}_n{n}"


def _product_row(dtype: str, name: str, rows: int, k: int, n: int, gated: bool) -> Row:
    p = decode_product_prefix(dtype, rows, k, n, gated)
    return Row((f"{name} [{rows} x {k}] x [{2 * n if gated else n} x {k}]^T", dtype,
                Metric(f"{p}.ms", "{:.4f}"), Metric(f"{p}.gbps", "{:.0f}"),
                Metric(f"{p}.bw_fraction"),
                *(Metric(f"{p}.k_splits{s}.gbps", "{:.0f}") for s in DECODE_LINEAR_K_SPLITS),
                Metric(f"{p}.cublas_gbps", "{:.0f}")), when=f"{p}.bw_fraction")


DECODE_PRODUCTS_SECTION = Section(
    "Decode-step products (decode_linear, decode_swiglu; CUDA-graph replays)",
    intro=("Task 6's products at batch 4, each timed as 32 calls per CUDA graph, weights rotated "
           "(bigger than L2). GB/s of weights read; bw fraction = that / the copy bandwidth of the "
           "same run (", Metric(COPY_GBPS, "{:.0f}"), " GB/s). Ours uses the automatic split of K; "
           "the k_splits columns force each split. cuBLAS: F.linear (for SwiGLU, then "
           "silu(gate) * up)."),
    blocks=(Table(("product", "dtype", "ms", "GB/s", "bw fraction",
                   *(f"k_splits {s}" for s in DECODE_LINEAR_K_SPLITS), "cuBLAS GB/s"),
                  tuple(_product_row(dtype, *product) for product in DECODE_PRODUCTS
                        for dtype in ("fp32", "bf16"))),),
    sources=("task5.decode_linear", "task5.decode_swiglu"), where="beyond")

MANIFEST = TaskManifest(
    task=5, points=4, needs_gpu=True, parts=(Part(("course", "kernels"), 4),),
    shown=(Metric(TTFT_SPEEDUP, suffix="x", label="TTFT"), Metric(TBT_SPEEDUP, suffix="x", label="TBT")),
    sections=(COURSE_SECTION, DECODE_SECTION, SHORT_DECODE_SECTION, GQA_SECTION,
              PAGED_SECTION, DECODE_PRODUCTS_SECTION),
    cpu_note="its kernels are CUDA")
