// Decode-time linear layers: y = x @ W^T (+ bias) (+ residual) for a few rows of x.
//
// Not part of the graded course: the task 6 and task 7 models use it in their decode steps.
//
// The idea. A decode step multiplies a handful of token vectors (batch 4: M = 4 rows) by every
// weight matrix of the model. Each weight element is used M times per load, so the step is
// bound by reading the weights once, and the whole game is to stream W at the memory
// bandwidth. cuBLAS does not, at M = 4: in task 6's profile its fp32 kernel (gemmSN_TN) and
// its bf16 kernels streamed the weights well below the copy bandwidth (the figures, measured
// beside this kernel's, are in Results.md). This kernel:
//   * gives each warp kRowsPerWarp rows of W (output features); its 32 lanes walk along K
//     with 16-byte loads (4 fp32 or 8 fp16/bf16), a warp reading 512 contiguous bytes of a
//     row per step, 4 steps unrolled so that many loads are in flight; W is read once, with
//     loads that do not allocate in L1 (.nc, L1::no_allocate);
//   * reads the matching 16 bytes of each of the M rows of x with ordinary loads: x is tiny
//     and every warp reads all of it, so it stays in L1 while W streams past;
//   * accumulates in fp32, reduces each (row, m) over the warp with shuffles, and adds the
//     bias and the residual in the epilogue (one kernel instead of a GEMM and two adds).
//   * decode_swiglu, the same kernel with kGated: the MLP's gate and up products in one pass
//     over their stacked weights, silu(gate) * up in the epilogue (SwiGLU's [M, 2 * width]
//     intermediate is never written, and two elementwise kernels are gone).
// No shared memory and no barrier: a first version staged x in shared memory chunk by chunk,
// and its barriers stalled the weight stream (below cuBLAS in bf16 on the H100; the log of
// that run is results/logs/h100_decode_linear_v1.log).
// Tile shape: 4 warps x 4 rows = 16 output features per block. That alone leaves too few
// loads in flight where N is small: N = 4096 (o_proj, and the down projection with K = 16384)
// gives 256 blocks, 8 warps per SM, each warp latency-bound on a long walk along K. So the
// block's warps may also split K (k_splits = 2 or 4: k_splits warps share their rows, each
// taking every k_splits-th 512-byte step along K, and add their sums in shared memory): the
// same bytes, k_splits times the blocks. The host picks the largest split that leaves each
// warp two rounds of kUnroll steps (bf16 at K = 4096: 2; fp32 at 4096 and both at 16384: 4),
// within 5% of the best split at every product of task 6's decode step in a sweep of
// k_splits 1, 2, 4 (Results.md, "Decode-step products"; task6/NOTES.md), and well ahead of
// no split where N is small: o_proj, and the down projection with its long K.
// The loop: fp32 issues each round of kUnroll steps' loads before using any (explicit
// rounds); the 16-bit types keep a plain loop unrolled by kUnroll and leave the schedule to
// ptxas. Measured in one process, explicit rounds made task 6's fp32 step faster and its bf16
// step slower (bf16 has twice the instructions per byte); the bf16 loop's schedule, and its
// speed, also moved with unrelated edits, so it is left exactly as measured (task6/NOTES.md).
// Launched overlapped (device_values.cuh): on Hopper the next kernel is launched once every
// warp here has streamed its weights, so its blocks are resident when this one's tail ends.
// fp32's first wave of blocks, resident while the kernel before finishes, asks L2 for its first
// round of weights meanwhile (a bulk prefetch per row: no registers). The same prefetch in the
// 16-bit kernels changed ptxas's schedule of their loop and cost more than it gained; issued
// instead by the norm kernel before the product, it slowed the norm itself (task6/NOTES.md).
// The loop has no room for more work per element: folding the norm before the product into
// it (x replaced by gamma * (x - pivot), the row sums taken on the way) made the bf16
// products slower by more than the norm kernel it removed cost (task6/NOTES.md).
//
// Nor does it need tensor cores: mma.sync versions (fragments loaded straight from global
// memory, or from shared memory filled by bulk copies) execute fewer instructions per byte but
// measured slower than this loop on every product of task 6, their loads touching 8 rows x 64
// bytes where this loop reads 512 contiguous bytes of one row (task6/NOTES.md).
//
// Measured speed (GB/s of weights read, against cuBLAS; task 6's TBT against its roofline):
// Results.md, rendered from results/<gpu>.json.
//
// The kernel and its launch are templates in decode_linear.cuh, instantiated per element type in
// decode_linear_fp32.cu, _fp16.cu and _bf16.cu (compiled in parallel); this file holds the entry
// points, their checks and the choice of k_splits.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/types.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "attention_checks.cuh"
#include "decode_linear.cuh"

namespace {

// The automatic k_splits: the largest of 1, 2, 4 that still leaves each warp
// kMinStepsPerWarp steps along K (two rounds of kUnroll loads in flight); below that a block
// lives for about one memory round trip and its fixed costs (start, the shared-memory sums,
// the epilogue) are no longer spread over enough bytes.
// ATTN_DECODE_LINEAR_K_SPLITS=1, 2 or 4 replaces the choice everywhere (to measure what the
// split buys inside a whole decode step; an explicit k_splits argument still wins).
int choose_k_splits(int K, int64_t element_size) {
  static const int forced = [] {
    const char* env = std::getenv("ATTN_DECODE_LINEAR_K_SPLITS");
    const int value = env != nullptr ? std::atoi(env) : 0;
    return value == 1 || value == 2 || value == 4 ? value : 0;
  }();
  if (forced > 0) return forced;
  const int elements_per_step = 32 * static_cast<int>(16 / element_size);  // 32 lanes x 16 bytes
  const int steps = attn::ceil_div(K, elements_per_step);
  int k_splits = 1;
  while (k_splits < kMaxKSplits && steps / (2 * k_splits) >= kMinStepsPerWarp) k_splits *= 2;
  return k_splits;
}

using attn::aligned16;

// The two entries' shared checks and launch: `gated` halves the output features.
torch::Tensor run(const torch::Tensor& x, const torch::Tensor& weight,
                  const std::optional<torch::Tensor>& bias,
                  const std::optional<torch::Tensor>& residual, int64_t k_splits, bool gated) {
  const char* entry = gated ? "decode_swiglu" : "decode_linear";
  attn::check_cuda_tensor(x, "x");
  attn::check_dtype(x, "x", {torch::kFloat32, torch::kFloat16, torch::kBFloat16});
  attn::check_same(weight, "weight", x, "x");
  attn::check_dim(weight, "weight", 2, "[out_features, in_features]");
  attn::check_contiguous(x, "x");
  attn::check_contiguous(weight, "weight");
  attn::check_nonempty(x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have at least one dimension.");
  const int64_t K = x.size(-1);
  const int64_t weight_rows = weight.size(0);
  const int64_t rows = x.numel() / K;
  TORCH_CHECK_VALUE(weight.size(1) == K, attn::str("weight is ", weight.sizes(), " but x has ", K,
                                                   " features in its last dimension."));
  TORCH_CHECK_VALUE(!gated || weight_rows % 2 == 0,
                    attn::str("decode_swiglu takes the gate and up weights stacked, [2 * width, ",
                              K, "], but weight has ", weight_rows, " rows (an odd number)."));
  const int64_t N = gated ? weight_rows / 2 : weight_rows;  // output features
  TORCH_CHECK_VALUE(rows >= 1 && rows <= kMaxRows,
                    attn::str(entry, " takes 1 to ", kMaxRows, " rows of x (a decode step); x has ",
                              rows, ": use torch.nn.functional.linear."));
  TORCH_CHECK_VALUE((K * x.element_size()) % 16 == 0 && aligned16(x) && aligned16(weight),
                    attn::str(entry, " reads 16-byte pieces: in_features (", K,
                              ") times the element size must be a multiple of 16 and x and weight "
                              "must start 16-byte aligned."));
  TORCH_CHECK_VALUE(weight_rows <= INT32_MAX && K <= INT32_MAX,
                    attn::str(entry, ": the weight is too large."));
  if (bias.has_value()) {
    attn::check_same(*bias, "bias", x, "x");
    attn::check_contiguous(*bias, "bias");
    TORCH_CHECK_VALUE(bias->numel() == weight_rows, attn::str("bias has ", bias->numel(),
                      " elements; expected ", weight_rows, " (one per row of weight)."));
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  if (residual.has_value()) {
    attn::check_same(*residual, "residual", x, "x");
    attn::check_contiguous(*residual, "residual");
    TORCH_CHECK_VALUE(residual->sizes().vec() == out_shape,
                      attn::str("residual is ", residual->sizes(), " but the output is ",
                                c10::IntArrayRef(out_shape), "."));
  }
  TORCH_CHECK_VALUE(k_splits == 0 || k_splits == 1 || k_splits == 2 || k_splits == 4,
                    attn::str(entry, ": k_splits is 1, 2 or 4 (warps of a block that split K), or "
                              "0 to choose from K; got ", k_splits, "."));
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor out = torch::empty(out_shape, x.options());
  const int n = static_cast<int>(N), k = static_cast<int>(K), m = static_cast<int>(rows);
  const int splits =
      k_splits > 0 ? static_cast<int>(k_splits) : choose_k_splits(k, x.element_size());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  switch (x.scalar_type()) {
    case torch::kFloat32:
      attn_linear::launch_fp32(x, weight, bias, residual, out, m, n, k, splits, gated, stream);
      break;
    case torch::kFloat16:
      attn_linear::launch_fp16(x, weight, bias, residual, out, m, n, k, splits, gated, stream);
      break;
    default:
      attn_linear::launch_bf16(x, weight, bias, residual, out, m, n, k, splits, gated, stream);
      break;
  }
  return out;
}

}  // namespace

// x [..., K] with at most 8 rows in all (contiguous); weight [N, K] (contiguous); bias [N];
// residual [..., N] like the output; k_splits: 1, 2 or 4 warps per row along K, 0 to choose.
// Returns [..., N] in x's dtype.
torch::Tensor decode_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> residual, int64_t k_splits) {
  return run(x, weight, bias, residual, k_splits, /*gated=*/false);
}

// SwiGLU's first half in one pass: weight [2 * width, K] holds the gate rows then the up rows
// (bias [2 * width] likewise); returns silu(x Wg^T + bg) * (x Wu^T + bu) (+ residual), [..., width].
torch::Tensor decode_swiglu(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> residual, int64_t k_splits) {
  return run(x, weight, bias, residual, k_splits, /*gated=*/true);
}

