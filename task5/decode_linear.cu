// Decode-time linear layers: y = x @ W^T (+ bias) (+ residual) for a few rows of x; the host
// side (checks, the choice of k_splits, the launch, decode_linear and decode_swiglu).
//
// Not part of the graded course: the task 6 and task 7 models use it in their decode steps.
// The kernel, its idea and tile shape are in decode_linear.cuh; its instantiations are
// compiled in decode_linear_fp32.cu, _fp16.cu and _bf16.cu. Measured speed (GB/s of weights
// read, against cuBLAS; task 6's TBT against its roofline): Results.md, rendered from
// results/<gpu>.json.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "tensor_api.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention_checks.cuh"
#include "decode_linear.cuh"
#include "device_query.cuh"
#include "device_values.cuh"

namespace {

using namespace attn_linear;

// The blocks of `kernel` that fit on the GPU at once: its first wave, resident while the kernel
// before it finishes (looked up once per kernel and device).
int first_wave_blocks(const void* kernel) {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  return attn::resident_blocks(kernel, kThreads, 0, device);
}

// The bytes of each weight row that the first round of a row group reads: kUnroll steps of
// 512 bytes for each of its k_splits warps (all of a short row).
int64_t first_round_bytes(int64_t row_bytes, int k_splits) {
  return std::min<int64_t>(row_bytes, int64_t{kUnroll} * k_splits * 512);
}

template <typename T, bool kGated>
void launch(const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& bias,
            const std::optional<torch::Tensor>& residual, const torch::Tensor& out, int rows, int N,
            int K, int k_splits) {
  const T* b = bias.has_value() ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr;
  const T* res = residual.has_value() ? reinterpret_cast<const T*>(residual->data_ptr()) : nullptr;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int splits = k_splits == 1 || k_splits == 2 ? k_splits : 4;  // as linear_kernel reads it
  const int features_per_block = kWarps / splits * (kGated ? kRowsPerWarp / 2 : kRowsPerWarp);
  const int blocks = attn::ceil_div(N, features_per_block);
  const LinearKernel<T> kernel = linear_kernel<T, kGated>(rows, splits);
  // Only an overlapped launch has a kernel before it to overlap.
  const bool prefetch = kExplicitRounds<T> && attn::overlapped_launches_enabled();
  const int prefetch_blocks = prefetch ? first_wave_blocks(reinterpret_cast<const void*>(kernel)) : 0;
  const int64_t prefetch_bytes = prefetch ? first_round_bytes(int64_t{K} * sizeof(T), splits) : 0;
  attn::launch_overlapped(kGated ? "decode_linear_kernel (SwiGLU)" : "decode_linear_kernel",
                          kernel, dim3(blocks), dim3(kThreads), stream,
                          reinterpret_cast<const T*>(x.data_ptr()),
                          reinterpret_cast<const T*>(w.data_ptr()), b, res,
                          reinterpret_cast<T*>(out.data_ptr()), N, K, prefetch_blocks,
                          static_cast<unsigned>(prefetch_bytes));
}

// The automatic k_splits: the largest of 1, 2, 4 that still leaves each warp
// kMinStepsPerWarp steps along K (two rounds of kUnroll loads in flight); below that a block
// lives for about one memory round trip and its fixed costs (start, the shared-memory sums,
// the epilogue) are no longer spread over enough bytes.
// ATTN_DECODE_LINEAR_K_SPLITS=1, 2 or 4 (read once per process) replaces the choice everywhere
// (to measure what the split buys inside a whole decode step; an explicit k_splits argument
// still wins).
int choose_k_splits(int K, int64_t element_size) {
  static const int forced = attn::env_choice("ATTN_DECODE_LINEAR_K_SPLITS", {"auto", "1", "2", "4"}, 0);
  if (forced > 0) return 1 << (forced - 1);
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
  const auto dispatch = [&](auto gated_flag) {
    constexpr bool kGated = decltype(gated_flag)::value;
    switch (x.scalar_type()) {
      case torch::kFloat32: launch<float, kGated>(x, weight, bias, residual, out, m, n, k, splits); break;
      case torch::kFloat16: launch<__half, kGated>(x, weight, bias, residual, out, m, n, k, splits); break;
      default: launch<__nv_bfloat16, kGated>(x, weight, bias, residual, out, m, n, k, splits); break;
    }
  };
  if (gated) {
    dispatch(std::true_type{});
  } else {
    dispatch(std::false_type{});
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
