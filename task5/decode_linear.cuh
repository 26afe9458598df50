// The decode-time product kernel shared by decode_linear.cu (y = x W^T, SwiGLU) and
// decode_norm_linear.cu (the same with the norm before it folded in): the idea, the tile shape
// and what was measured are in decode_linear.cu's header. Two translation units, so that ninja
// builds the two families of instantiations in parallel.

#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/types.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention_checks.cuh"
#include "device_values.cuh"

namespace decode_product {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 4;
constexpr int kUnroll = 4;   // steps along K whose loads are in flight together
constexpr int kMaxRows = ATTN_DECODE_LINEAR_MAX_ROWS;   // rows of x (M): common/limits.py
constexpr int kMaxKSplits = kWarps;     // warps of a block that share rows and split K
constexpr int kMinStepsPerWarp = 2 * kUnroll;  // the automatic k_splits leaves a warp this many
static_assert(kMaxRows == 8, "launch() below instantiates M = 1..8: change both together");

// 16 bytes of T, converted to fp32.
template <typename T>
struct Pack {
  static constexpr int kElems = 16 / sizeof(T);
  uint4 raw;
  __device__ __forceinline__ void to_float(float (&f)[kElems]) const;
};
template <>
__device__ __forceinline__ void Pack<float>::to_float(float (&f)[4]) const {
  f[0] = __uint_as_float(raw.x);
  f[1] = __uint_as_float(raw.y);
  f[2] = __uint_as_float(raw.z);
  f[3] = __uint_as_float(raw.w);
}
template <>
__device__ __forceinline__ void Pack<__half>::to_float(float (&f)[8]) const {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
    f[2 * i] = pair.x;
    f[2 * i + 1] = pair.y;
  }
}
template <>
__device__ __forceinline__ void Pack<__nv_bfloat16>::to_float(float (&f)[8]) const {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
    f[2 * i] = pair.x;
    f[2 * i + 1] = pair.y;
  }
}

// A weight load: read once, so do not keep it in L1.
__device__ __forceinline__ uint4 load_streaming(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

using attn::from_float;
using attn::to_float;

// The norm folded into the product (kNorm; decode_norm_linear.cu). x then holds the norm's
// input h, and for LayerNorm (mean and rstd of each row of h; p_m any number, below the row's
// first element)
//   y[m, n] = sum_k W[n, k] * (gamma[k] * (h[m, k] - mean_m) * rstd_m + beta[k]) + bias[n]
//           = rstd_m * (sum_k W[n, k] gamma[k] (h[m, k] - p_m) - (mean_m - p_m) colsum[n]) + shift[n]
// with colsum = W gamma and shift = W beta + bias, fixed per layer and computed once on the
// host (task5/fused.py). RMSNorm has no mean (p_m = 0): y = rstd_m * sum_k W[n, k] gamma[k]
// h[m, k] + bias[n]. So the product streams W against gamma * (h - p), and the statistics of
// h, which it reads anyway, are needed only in the epilogue: no norm kernel, and no prologue
// before the weight stream. p_m, a value of the row, keeps both differences of the size of the
// row's spread: with p = 0, a row of mean 300 and spread 1 would leave the fp32 sums about
// 300 times their rounding error once the mean is taken out.
template <typename T>
struct FoldedNorm {
  const T* gamma = nullptr;       // [K]
  const float* colsum = nullptr;  // [weight rows], LayerNorm only
  const float* shift = nullptr;   // [weight rows], or null for none
  float eps = 0.0f;
  bool rms = false;
};

// Running sums of one warp's share of each row of h - pivot, for the statistics; the pivot is
// the row's first element (LayerNorm; 0 for RMSNorm), so that a large mean cannot cancel.
template <int M>
struct RowSums {
  float sum[M];
  float squares[M];
};

// One step along K for one lane: its kRowsPerWarp pieces of W (already loaded) times the
// matching pieces of the M rows of x (ordinary loads: every warp reads all of x, so L1 serves
// it), accumulated in fp32. With the norm folded in, each x is replaced by gamma * (x - pivot),
// and the warp adds x - pivot into the sums of the rows it keeps statistics of (`row_group`:
// rows m with m % row_groups == row_group; the sums by reference: through a pointer ptxas
// kept them in local memory, a load and a store per step).
template <typename T, int M, bool kNorm>
__device__ __forceinline__ void accumulate_step(float (&acc)[kRowsPerWarp][M],
                                                const Pack<T> (&wp)[kRowsPerWarp],
                                                const T* __restrict__ x, int K, int k,
                                                const T* __restrict__ gamma, const float (&pivot)[M],
                                                RowSums<M>& sums, int row_groups,
                                                int row_group) {
  constexpr int kVec = Pack<T>::kElems;
  Pack<T> xp[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    xp[m].raw = __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m) * K + k));
  }
  float gf[kVec];
  if constexpr (kNorm) {
    Pack<T> gp;
    gp.raw = __ldg(reinterpret_cast<const uint4*>(gamma + k));
    gp.to_float(gf);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[kVec];
    xp[m].to_float(xf);
    if constexpr (kNorm) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) xf[e] -= pivot[m];
      if (m % row_groups == row_group) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          sums.sum[m] += xf[e];
          sums.squares[m] = fmaf(xf[e], xf[e], sums.squares[m]);
        }
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) xf[e] *= gf[e];
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      float wf[kVec];
      wp[r].to_float(wf);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[r][m] = fmaf(wf[e], xf[e], acc[r][m]);
    }
  }
}

// x [M, K], w [N, K], bias [N] or null, residual [M, N] or null, out [M, N]; all contiguous,
// rows of x and w 16-byte aligned (K * sizeof(T) % 16 == 0, checked on the host).
// kGated (SwiGLU): w is [2N, K], the gate's N rows then the up projection's N rows (bias
// [2N] likewise), and out = silu(x Wg^T + bg) * (x Wu^T + bu) (+ residual): a warp streams 2
// gate rows and the 2 matching up rows, so it loads as many rows per step as the plain
// kernel, and the [M, 2N] gate/up products never reach memory.
// kSplits (1, 2 or 4, dividing kWarps): warps warp / kSplits share their rows; warp % kSplits
// says which of every kSplits steps along K it takes. A template parameter, so that the
// stride along K is a constant: with a run-time stride every unrolled load needed its own
// address arithmetic, and the bf16 step (the most instructions per byte) lost what the split
// gained (task6/NOTES.md).
// kNorm: x is the input of a LayerNorm / RMSNorm folded into this product (FoldedNorm above;
// bias is then null, folded into norm.shift). Every row group's warps read all of h, so the
// row groups share the statistics out: row group g sums rows g, g + row_groups, ... over its
// warps' shares of K (the same extra work in every warp: a block waits for its slowest), and
// every epilogue warp takes the row statistics through shared memory.
template <typename T, int M, bool kGated, int kSplits, bool kNorm>
__global__ void __launch_bounds__(kThreads)
decode_linear_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     const T* __restrict__ residual, T* __restrict__ out, int N, int K,
                     FoldedNorm<T> norm) {
  constexpr int kOutRows = kGated ? kRowsPerWarp / 2 : kRowsPerWarp;  // output features per warp
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row_group = warp / kSplits;      // which rows of the block this warp streams
  const int k_part = warp % kSplits;         // which steps along K
  constexpr int kRowGroups = kWarps / kSplits;
  const int row0 = (blockIdx.x * kRowGroups + row_group) * kOutRows;

  // Weight row r of this warp: output feature row0 + r (for the gated kernel, r >= kOutRows
  // is the up row of feature row0 + r - kOutRows, N rows further). Rows past N (the last
  // block) read row N - 1 instead, so every load is in bounds and the loop has no branch;
  // their results are simply not written.
  const T* w_rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int feature = min(row0 + r % kOutRows, N - 1);
    const int64_t w_row = r < kOutRows ? feature : static_cast<int64_t>(N) + feature;
    w_rows[r] = w + w_row * K;
  }

  // Lane `lane` takes elements lane*kVec, lane*kVec + 32*kVec, ... of every row (of this
  // warp's share of the steps): a warp reads 512 contiguous bytes of a row per step. Per step
  // a lane loads kRowsPerWarp pieces of W (from memory, once) and M pieces of x, and the
  // unrolling keeps kUnroll steps of loads in flight.
  constexpr int k_step = 32 * Pack<T>::kElems * kSplits;
  int k = (k_part * 32 + lane) * Pack<T>::kElems;

  attn::wait_for_previous_kernel();  // x (and the residual) come from the kernel before

  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }
  float pivot[M];
  RowSums<M> sums;
  if constexpr (kNorm) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      pivot[m] = norm.rms ? 0.0f : to_float(x[static_cast<int64_t>(m) * K]);
      sums.sum[m] = 0.0f;
      sums.squares[m] = 0.0f;
    }
  }
#pragma unroll kUnroll
  for (; k < K; k += k_step) {
    Pack<T> wp[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) wp[r].raw = load_streaming(w_rows[r] + k);
    accumulate_step<T, M, kNorm>(acc, wp, x, K, k, norm.gamma, pivot, sums, kRowGroups, row_group);
  }

  // The weights are streamed: the next kernel may now be scheduled into this one's tail.
  attn::let_next_kernel_start();

  // Sum each (row, m) over the 32 lanes.
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
  }
  // Split K: the warps of a row group add their sums into the first one's (k_part 0), in a
  // fixed order (the result does not depend on timing). With the norm folded in, the
  // statistics warps' row sums go through shared memory the same way, to every epilogue warp.
  float mean_above_pivot[M], rstd[M];
  if constexpr (kSplits > 1 || kNorm) {
    __shared__ float partial[kWarps][kRowsPerWarp][M];
    __shared__ float row_sums[kNorm ? kSplits : 1][2][M];
    if constexpr (kNorm) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m % kRowGroups != row_group) continue;
        const float sum = warp_sum(sums.sum[m]);
        const float squares = warp_sum(sums.squares[m]);
        if (lane == 0) {
          row_sums[k_part][0][m] = sum;
          row_sums[k_part][1][m] = squares;
        }
      }
    }
    if (lane == 0 && k_part > 0) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int m = 0; m < M; ++m) partial[warp][r][m] = acc[r][m];
      }
    }
    __syncthreads();
    if (lane == 0 && k_part == 0) {
#pragma unroll
      for (int part = 1; part < kSplits; ++part) {
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
          for (int m = 0; m < M; ++m) acc[r][m] += partial[warp + part][r][m];
        }
      }
      if constexpr (kNorm) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float sum = 0.0f, squares = 0.0f;
#pragma unroll
          for (int part = 0; part < kSplits; ++part) {
            sum += row_sums[part][0][m];
            squares += row_sums[part][1][m];
          }
          // Deviations d = h - pivot: mean - pivot = E[d], var = E[d^2] - E[d]^2 (RMSNorm:
          // pivot 0, and the mean square E[h^2] in place of the variance).
          const float mean_d = sum / K;
          const float var = norm.rms ? squares / K : fmaxf(squares / K - mean_d * mean_d, 0.0f);
          mean_above_pivot[m] = mean_d;
          rstd[m] = rsqrtf(var + norm.eps);
        }
      }
    }
  }
  if (lane == 0 && k_part == 0) {
    // One output of a weight row: bias added, or with the norm folded in, the row's statistics
    // applied (the norm's bias and the product's are in norm.shift).
    const auto finish = [&](float a, int m, int64_t w_row) {
      if constexpr (kNorm) {
        const float centred =
            norm.colsum != nullptr ? a - mean_above_pivot[m] * norm.colsum[w_row] : a;
        return rstd[m] * centred + (norm.shift != nullptr ? norm.shift[w_row] : 0.0f);
      } else {
        return a + (bias != nullptr ? to_float(bias[w_row]) : 0.0f);
      }
    };
#pragma unroll
    for (int r = 0; r < kOutRows; ++r) {
      const int row = row0 + r;
      if (row >= N) continue;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const int64_t at = static_cast<int64_t>(m) * N + row;
        float y = finish(acc[r][m], m, row);
        if constexpr (kGated) {
          const float up = finish(acc[r + kOutRows][m], m, static_cast<int64_t>(N) + row);
          y = y / (1.0f + __expf(-y)) * up;  // silu(gate) * up
        }
        const float res = residual != nullptr ? to_float(residual[at]) : 0.0f;
        out[at] = from_float<T>(y + res);
      }
    }
  }
}

template <typename T, int M, bool kGated, bool kNorm>
void launch_rows(const torch::Tensor& x, const torch::Tensor& w, const T* bias, const T* residual,
                 const torch::Tensor& out, int N, int K, int k_splits, const FoldedNorm<T>& norm,
                 cudaStream_t stream) {
  const auto launch_split = [&](auto splits) {
    constexpr int kSplits = decltype(splits)::value;
    const int features_per_block = kWarps / kSplits * (kGated ? kRowsPerWarp / 2 : kRowsPerWarp);
    const int blocks = attn::ceil_div(N, features_per_block);
    attn::launch_overlapped(kGated ? "decode_linear_kernel (SwiGLU)" : "decode_linear_kernel",
                            decode_linear_kernel<T, M, kGated, kSplits, kNorm>, dim3(blocks),
                            dim3(kThreads), stream, reinterpret_cast<const T*>(x.data_ptr()),
                            reinterpret_cast<const T*>(w.data_ptr()), bias, residual,
                            reinterpret_cast<T*>(out.data_ptr()), N, K, norm);
  };
  switch (k_splits) {
    case 1: launch_split(std::integral_constant<int, 1>{}); break;
    case 2: launch_split(std::integral_constant<int, 2>{}); break;
    default: launch_split(std::integral_constant<int, 4>{}); break;
  }
}

template <typename T, bool kGated, bool kNorm>
void launch(const torch::Tensor& x, const torch::Tensor& w, const T* bias, const T* residual,
            const torch::Tensor& out, int rows, int N, int K, int k_splits,
            const FoldedNorm<T>& norm) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  switch (rows) {
    case 1: launch_rows<T, 1, kGated, kNorm>(x, w, bias, residual, out, N, K, k_splits, norm, stream); break;
    case 2: launch_rows<T, 2, kGated, kNorm>(x, w, bias, residual, out, N, K, k_splits, norm, stream); break;
    case 3: launch_rows<T, 3, kGated, kNorm>(x, w, bias, residual, out, N, K, k_splits, norm, stream); break;
    case 4: launch_rows<T, 4, kGated, kNorm>(x, w, bias, residual, out, N, K, k_splits, norm, stream); break;
    case 5: launch_rows<T, 5, kGated, kNorm>(x, w, bias, residual, out, N, K, k_splits, norm, stream); break;
    case 6: launch_rows<T, 6, kGated, kNorm>(x, w, bias, residual, out, N, K, k_splits, norm, stream); break;
    case 7: launch_rows<T, 7, kGated, kNorm>(x, w, bias, residual, out, N, K, k_splits, norm, stream); break;
    default: launch_rows<T, 8, kGated, kNorm>(x, w, bias, residual, out, N, K, k_splits, norm, stream); break;
  }
}

// The automatic k_splits: the largest of 1, 2, 4 that still leaves each warp
// kMinStepsPerWarp steps along K (two rounds of kUnroll loads in flight); below that a block
// lives for about one memory round trip and its fixed costs (start, the shared-memory sums,
// the epilogue) are no longer spread over enough bytes.
// ATTN_DECODE_LINEAR_K_SPLITS=1, 2 or 4 replaces the choice everywhere (to measure what the
// split buys inside a whole decode step; an explicit k_splits argument still wins).
inline int choose_k_splits(int K, int64_t element_size) {
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

// The checks both entries share (x, weight, bias, residual, k_splits), with the product's
// sizes; `gated` halves the output features.
struct ProductShape {
  std::vector<int64_t> out_shape;
  int rows, N, K, k_splits;
};

inline ProductShape check_product(const char* entry, const torch::Tensor& x,
                                  const torch::Tensor& weight,
                                  const std::optional<torch::Tensor>& bias,
                                  const std::optional<torch::Tensor>& residual, int64_t k_splits,
                                  bool gated) {
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
                    attn::str(entry, " takes the gate and up weights stacked, [2 * width, ", K,
                              "], but weight has ", weight_rows, " rows (an odd number)."));
  const int64_t N = gated ? weight_rows / 2 : weight_rows;  // output features
  TORCH_CHECK_VALUE(rows >= 1 && rows <= kMaxRows,
                    attn::str(entry, " takes 1 to ", kMaxRows, " rows of x (a decode step); x has ",
                              rows, ": use torch.nn.functional.linear."));
  TORCH_CHECK_VALUE((K * x.element_size()) % 16 == 0 && attn::aligned16(x) &&
                        attn::aligned16(weight),
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
  const int k = static_cast<int>(K);
  const int splits =
      k_splits > 0 ? static_cast<int>(k_splits) : choose_k_splits(k, x.element_size());
  return {out_shape, static_cast<int>(rows), static_cast<int>(N), k, splits};
}

// Runs the product in x's dtype: `make_norm(T{})` gives the FoldedNorm<T> (empty without kNorm).
template <bool kGated, bool kNorm, typename MakeNorm>
torch::Tensor run_product(const torch::Tensor& x, const torch::Tensor& weight,
                          const std::optional<torch::Tensor>& bias,
                          const std::optional<torch::Tensor>& residual, const ProductShape& shape,
                          MakeNorm make_norm) {
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor out = torch::empty(shape.out_shape, x.options());
  const auto typed = [&](auto zero) {
    using T = decltype(zero);
    const T* b = bias.has_value() ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr;
    const T* res = residual.has_value() ? reinterpret_cast<const T*>(residual->data_ptr()) : nullptr;
    launch<T, kGated, kNorm>(x, weight, b, res, out, shape.rows, shape.N, shape.K, shape.k_splits,
                             make_norm(zero));
  };
  switch (x.scalar_type()) {
    case torch::kFloat32: typed(float{}); break;
    case torch::kFloat16: typed(__half{}); break;
    default: typed(__nv_bfloat16{}); break;
  }
  return out;
}

}  // namespace decode_product
