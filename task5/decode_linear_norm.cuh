// Decode-time linear layers with the LayerNorm / RMSNorm before them folded in:
// y = norm(x) @ W^T (+ bias) (+ residual) for a few rows of x, without a norm kernel.
//
// Not part of the graded course: task 6's fused decode step uses it (issue 32), for the
// products that follow a norm (qkv after ln1, gate/up after ln2, lm_head after ln_f).
//
// The idea. A norm before a product costs a decode step a kernel per norm (49 a step in task 6),
// each a few microseconds of latency on the critical path. The earlier attempts to remove it
// (task6/NOTES.md, "What was tried") normalised x in each block's prologue (the weight stream
// waited on it), or folded the norm into the loop (the bf16 loop has no room for more work per
// element), or split it over two products' epilogues (cross-kernel sums). This kernel keeps the
// loop of decode_linear_kernel as it is and needs the row statistics only in its epilogue,
// by the norm's algebra (computed once per layer on the host: task5/fused.py, fold_norm):
//   LayerNorm  y = W (gamma * (x - mean) * rstd + beta) + b
//                = rstd * (W' x - mean * colsum) + shift,   W' = W diag(gamma),
//                  colsum = W' 1 (fp32), shift = W beta + b (fp32)
//   RMSNorm    y = rstd * (W' x) + b                      (colsum null, shift = b)
// So the loop streams the raw x (the residual stream) against W' (W itself while gamma is 1:
// the host then passes W, no copy), from the first cycle, as decode_linear_kernel does. After
// its loop, each block sums its M rows of x (at most 8 x K; they are in the SM's L1, the loop
// has just read them): one pass, fp32, shifted by the row's first element for LayerNorm as
// norm.cu does (a large common offset then costs no digits). The sums are reduced with the
// split-K partial sums (one barrier), and the epilogue applies rstd, mean * colsum and shift.
// What it adds to a block: a read of x from L1 and a reduction, after let_next_kernel_start
// (the next kernel may already be scheduled) and while the SM's other blocks stream.
// Numerics: x is not rounded to the dtype after normalising (the twin rounds norm(x) to the
// dtype before its product), and W' = W * gamma is rounded to the dtype when gamma is not 1;
// W' x - mean * colsum cancels when |mean| >> std (fp32: about 6e-8 * |mean| / std relative).
//
// A separate kernel, not a template flag of decode_linear_kernel: ptxas's schedule of the bf16
// loop moved with any edit to that kernel, even after its loop (task6/NOTES.md), so the plain
// kernel is left untouched. Its instantiations are compiled in decode_linear_norm_<type>.cu.
#pragma once

#include "decode_linear.cuh"

namespace attn_linear {

// x [M, K] (raw, not normalised), w [rows, K] (W', the norm's gamma folded in), residual
// [M, N] or null, out [M, N]. colsum [rows] fp32 (LayerNorm; null for RMSNorm), shift [rows]
// fp32 or null (W beta + b); rows = N, or 2N for kGated (gate rows then up rows, as
// decode_linear_kernel). rms: RMSNorm statistics (no mean) instead of LayerNorm's.
template <typename T, int M, bool kGated, int kSplits>
__global__ void __launch_bounds__(kThreads)
decode_linear_norm_kernel(const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ residual, T* __restrict__ out, int N, int K,
                          const float* __restrict__ colsum, const float* __restrict__ shift,
                          float eps, int rms) {
  constexpr int kVec = Pack<T>::kElems;
  constexpr int kOutRows = kGated ? kRowsPerWarp / 2 : kRowsPerWarp;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row_group = warp / kSplits;
  const int k_part = warp % kSplits;
  constexpr int kRowGroups = kWarps / kSplits;
  const int row0 = (blockIdx.x * kRowGroups + row_group) * kOutRows;

  // The loop: decode_linear_kernel's (16-bit types: a plain loop; fp32: explicit rounds).
  const T* w_rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int feature = min(row0 + r % kOutRows, N - 1);
    const int64_t w_row = r < kOutRows ? feature : static_cast<int64_t>(N) + feature;
    w_rows[r] = w + w_row * K;
  }
  constexpr int k_step = 32 * kVec * kSplits;
  int k = (k_part * 32 + lane) * kVec;
  attn::wait_for_previous_kernel();  // x (and the residual) come from the kernel before

  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }
  if constexpr (kExplicitRounds<T>) {
    for (; k + (kUnroll - 1) * k_step < K; k += kUnroll * k_step) {
      Pack<T> wp[kUnroll][kRowsPerWarp];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) wp[u][r].raw = load_streaming(w_rows[r] + k + u * k_step);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) accumulate_step<T, M>(acc, wp[u], x, K, k + u * k_step);
    }
    for (; k < K; k += k_step) stream_step<T, M>(acc, w_rows, x, K, k);
  } else {
#pragma unroll kUnroll
    for (; k < K; k += k_step) stream_step<T, M>(acc, w_rows, x, K, k);
  }
  attn::let_next_kernel_start();

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
      acc[r][m] = v;
    }
  }

  // The rows' statistics: every thread of the block sums its 16-byte pieces of each row
  // (pieces threadIdx.x, + kThreads, ...), x - pivot and its square; the pivot is the row's
  // first element for LayerNorm (as norm.cu's shift), 0 for RMSNorm.
  __shared__ float stats[kWarps][2][M];
  {
    float pivot[M], s1[M], s2[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      pivot[m] = rms ? 0.0f : to_float(x[static_cast<int64_t>(m) * K]);
      s1[m] = 0.0f;
      s2[m] = 0.0f;
    }
    const int pieces = K / kVec;
    for (int p = threadIdx.x; p < pieces; p += kThreads) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        Pack<T> xp;
        xp.raw = __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m) * K + p * kVec));
        float xf[kVec];
        xp.to_float(xf);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float d = xf[e] - pivot[m];
          s1[m] += d;
          s2[m] = fmaf(d, d, s2[m]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        s1[m] += __shfl_xor_sync(0xffffffffu, s1[m], offset);
        s2[m] += __shfl_xor_sync(0xffffffffu, s2[m], offset);
      }
      if (lane == 0) {
        stats[warp][0][m] = s1[m];
        stats[warp][1][m] = s2[m];
      }
    }
  }
  // Split K: as decode_linear_kernel, the warps of a row group add their sums into the first
  // one's; the same barrier publishes the statistics.
  __shared__ float partial[kWarps][kRowsPerWarp][M];
  if constexpr (kSplits > 1) {
    if (lane == 0 && k_part > 0) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int m = 0; m < M; ++m) partial[warp][r][m] = acc[r][m];
      }
    }
  }
  __syncthreads();
  if (lane == 0 && k_part == 0) {
    if constexpr (kSplits > 1) {
#pragma unroll
      for (int part = 1; part < kSplits; ++part) {
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
          for (int m = 0; m < M; ++m) acc[r][m] += partial[warp + part][r][m];
        }
      }
    }
    // mean and rstd of each row, in a fixed order over the warps (no dependence on timing).
    float mean[M], rstd[M];
    const float inv_k = 1.0f / static_cast<float>(K);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
      for (int w_ = 0; w_ < kWarps; ++w_) {
        s1 += stats[w_][0][m];
        s2 += stats[w_][1][m];
      }
      if (rms) {
        mean[m] = 0.0f;
        rstd[m] = rsqrtf(s2 * inv_k + eps);
      } else {
        const float d_mean = s1 * inv_k;
        const float var = fmaxf(s2 * inv_k - d_mean * d_mean, 0.0f);
        mean[m] = to_float(x[static_cast<int64_t>(m) * K]) + d_mean;
        rstd[m] = rsqrtf(var + eps);
      }
    }
    const auto folded = [&](float sum, int64_t w_row, int m) {
      if (colsum != nullptr) sum = fmaf(-mean[m], colsum[w_row], sum);
      sum *= rstd[m];
      return shift != nullptr ? sum + shift[w_row] : sum;
    };
#pragma unroll
    for (int r = 0; r < kOutRows; ++r) {
      const int row = row0 + r;
      if (row >= N) continue;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const int64_t at = static_cast<int64_t>(m) * N + row;
        float y = folded(acc[r][m], row, m);
        if constexpr (kGated) {
          const float up = folded(acc[r + kOutRows][m], static_cast<int64_t>(N) + row, m);
          y = y / (1.0f + __expf(-y)) * up;  // silu(gate) * up
        }
        const float res = residual != nullptr ? to_float(residual[at]) : 0.0f;
        out[at] = from_float<T>(y + res);
      }
    }
  }
}

// ---- which instantiation runs a call ---------------------------------------------------------

template <typename T>
using LinearNormKernel = void (*)(const T*, const T*, const T*, T*, int, int, const float*,
                                  const float*, float, int);

// decode_linear_norm_kernel for `rows` rows of x (1..kMaxRows) and k_splits 1, 2 or 4 (any
// other value: 4). Instantiated in decode_linear_norm_<type>.cu.
template <typename T, bool kGated>
LinearNormKernel<T> linear_norm_kernel(int rows, int k_splits) {
  const auto with_rows = [&](auto splits) -> LinearNormKernel<T> {
    constexpr int kSplits = decltype(splits)::value;
    switch (rows) {
      case 1: return decode_linear_norm_kernel<T, 1, kGated, kSplits>;
      case 2: return decode_linear_norm_kernel<T, 2, kGated, kSplits>;
      case 3: return decode_linear_norm_kernel<T, 3, kGated, kSplits>;
      case 4: return decode_linear_norm_kernel<T, 4, kGated, kSplits>;
      case 5: return decode_linear_norm_kernel<T, 5, kGated, kSplits>;
      case 6: return decode_linear_norm_kernel<T, 6, kGated, kSplits>;
      case 7: return decode_linear_norm_kernel<T, 7, kGated, kSplits>;
      default: return decode_linear_norm_kernel<T, 8, kGated, kSplits>;
    }
  };
  switch (k_splits) {
    case 1: return with_rows(std::integral_constant<int, 1>{});
    case 2: return with_rows(std::integral_constant<int, 2>{});
    default: return with_rows(std::integral_constant<int, 4>{});
  }
}

extern template LinearNormKernel<float> linear_norm_kernel<float, false>(int rows, int k_splits);
extern template LinearNormKernel<float> linear_norm_kernel<float, true>(int rows, int k_splits);
extern template LinearNormKernel<__half> linear_norm_kernel<__half, false>(int rows, int k_splits);
extern template LinearNormKernel<__half> linear_norm_kernel<__half, true>(int rows, int k_splits);
extern template LinearNormKernel<__nv_bfloat16> linear_norm_kernel<__nv_bfloat16, false>(int rows, int k_splits);
extern template LinearNormKernel<__nv_bfloat16> linear_norm_kernel<__nv_bfloat16, true>(int rows, int k_splits);

}  // namespace attn_linear
