// The decode-time linear layers' kernel (decode_linear_kernel, plain and SwiGLU) and its
// launch, as templates: decode_linear.cu explains the idea and holds the entry points and their
// checks; decode_linear_fp32.cu, _fp16.cu and _bf16.cu instantiate the kernels of one element
// type each, so the build compiles them in parallel.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>

#include "attention_checks.cuh"
#include "device_values.cuh"

namespace {

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

using attn::from_float;
using attn::to_float;

// fp32 streams its weights in explicit rounds and its first wave prefetches them; the 16-bit
// types do neither (the file's header says why). The kernel and its launch both ask this.
template <typename T>
constexpr bool kExplicitRounds = sizeof(T) == 4;

// One step along K for one lane: its kRowsPerWarp pieces of W (already loaded) times the
// matching pieces of the M rows of x (ordinary loads: every warp reads all of x, so L1 serves
// it), accumulated in fp32.
template <typename T, int M>
__device__ __forceinline__ void accumulate_step(float (&acc)[kRowsPerWarp][M],
                                                const Pack<T> (&wp)[kRowsPerWarp],
                                                const T* __restrict__ x, int K, int k) {
  constexpr int kVec = Pack<T>::kElems;
  Pack<T> xp[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    xp[m].raw = __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m) * K + k));
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[kVec];
    xp[m].to_float(xf);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      float wf[kVec];
      wp[r].to_float(wf);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[r][m] = fmaf(wf[e], xf[e], acc[r][m]);
    }
  }
}

// One step along K, loads and all: the kRowsPerWarp pieces of W at k, then accumulate_step.
template <typename T, int M>
__device__ __forceinline__ void stream_step(float (&acc)[kRowsPerWarp][M],
                                            const T* const (&w_rows)[kRowsPerWarp],
                                            const T* __restrict__ x, int K, int k) {
  Pack<T> wp[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) wp[r].raw = load_streaming(w_rows[r] + k);
  accumulate_step<T, M>(acc, wp, x, K, k);
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
template <typename T, int M, bool kGated, int kSplits>
__global__ void __launch_bounds__(kThreads)
decode_linear_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     const T* __restrict__ residual, T* __restrict__ out, int N, int K,
                     int prefetch_blocks, unsigned prefetch_bytes) {
  constexpr int kVec = Pack<T>::kElems;
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
  constexpr int k_step = 32 * kVec * kSplits;
  int k = (k_part * 32 + lane) * kVec;

  // fp32's first wave of blocks (blockIdx.x < prefetch_blocks) is resident while the kernel
  // before still runs (a norm, the attention's merge), when HBM has little to do: it asks L2
  // for the first prefetch_bytes of its weight rows, which do not depend on that kernel.
  if constexpr (kExplicitRounds<T>) {
    if (blockIdx.x < prefetch_blocks && k_part == 0) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        if (lane == r) attn::prefetch_to_l2(w_rows[r], prefetch_bytes);
      }
    }
  }
  attn::wait_for_previous_kernel();  // x (and the residual) come from the kernel before

  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }
  // kUnroll steps of weight loads in flight: fp32 in explicit rounds, every load of a round
  // issued before any is used; the 16-bit types in a plain loop that ptxas unrolls.
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
    for (; k < K; k += k_step) stream_step<T, M>(acc, w_rows, x, K, k);  // the steps left over
  } else {
#pragma unroll kUnroll
    for (; k < K; k += k_step) stream_step<T, M>(acc, w_rows, x, K, k);
  }

  // The weights are streamed: the next kernel may now be scheduled into this one's tail.
  attn::let_next_kernel_start();

  // Sum each (row, m) over the 32 lanes.
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
  // Split K: the warps of a row group add their sums into the first one's (k_part 0), in a
  // fixed order (the result does not depend on timing).
  if constexpr (kSplits > 1) {
    __shared__ float partial[kWarps][kRowsPerWarp][M];
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
    }
  }
  if (lane == 0 && k_part == 0) {
    // The bias is read per output, not once per row before the loop over m: written that way,
    // ptxas gives the bf16/fp16 kernels with k_splits 2 128 registers instead of 116 and
    // schedules them differently, and task 6's bf16 step is faster (measured: task6/NOTES.md).
    const auto plus_bias = [&](float sum, int64_t w_row) {
      return sum + (bias != nullptr ? to_float(bias[w_row]) : 0.0f);
    };
#pragma unroll
    for (int r = 0; r < kOutRows; ++r) {
      const int row = row0 + r;
      if (row >= N) continue;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const int64_t at = static_cast<int64_t>(m) * N + row;
        float y = plus_bias(acc[r][m], row);
        if constexpr (kGated) {
          const float up = plus_bias(acc[r + kOutRows][m], static_cast<int64_t>(N) + row);
          y = y / (1.0f + __expf(-y)) * up;  // silu(gate) * up
        }
        const float res = residual != nullptr ? to_float(residual[at]) : 0.0f;
        out[at] = from_float<T>(y + res);
      }
    }
  }
}

// The blocks of `kernel` that fit on the GPU at once: its first wave, resident while the kernel
// before it finishes. Looked up once per kernel and device.
int first_wave_blocks(const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  auto found = known.find(key);
  if (found == known.end()) {
    int per_sm = 0, sms = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    found = known.emplace(key, per_sm * sms).first;
  }
  return found->second;
}

// The bytes of each weight row that the first round of a row group reads: kUnroll steps of
// 512 bytes for each of its k_splits warps (all of a short row).
int64_t first_round_bytes(int64_t row_bytes, int k_splits) {
  return std::min<int64_t>(row_bytes, int64_t{kUnroll} * k_splits * 512);
}

template <typename T, int M, bool kGated>
void launch_rows(const torch::Tensor& x, const torch::Tensor& w, const T* bias, const T* residual,
                 const torch::Tensor& out, int N, int K, int k_splits, cudaStream_t stream) {
  const auto launch_split = [&](auto splits) {
    constexpr int kSplits = decltype(splits)::value;
    const int features_per_block = kWarps / kSplits * (kGated ? kRowsPerWarp / 2 : kRowsPerWarp);
    const int blocks = attn::ceil_div(N, features_per_block);
    const auto kernel = decode_linear_kernel<T, M, kGated, kSplits>;
    // Only an overlapped launch has a kernel before it to overlap.
    const bool prefetch = kExplicitRounds<T> && attn::overlapped_launches_enabled();
    const int prefetch_blocks = prefetch ? first_wave_blocks(reinterpret_cast<const void*>(kernel)) : 0;
    const int64_t prefetch_bytes = prefetch ? first_round_bytes(int64_t{K} * sizeof(T), kSplits) : 0;
    attn::launch_overlapped(kGated ? "decode_linear_kernel (SwiGLU)" : "decode_linear_kernel",
                            kernel, dim3(blocks), dim3(kThreads), stream,
                            reinterpret_cast<const T*>(x.data_ptr()),
                            reinterpret_cast<const T*>(w.data_ptr()), bias, residual,
                            reinterpret_cast<T*>(out.data_ptr()), N, K, prefetch_blocks,
                            static_cast<unsigned>(prefetch_bytes));
  };
  switch (k_splits) {
    case 1: launch_split(std::integral_constant<int, 1>{}); break;
    case 2: launch_split(std::integral_constant<int, 2>{}); break;
    default: launch_split(std::integral_constant<int, 4>{}); break;
  }
}

template <typename T, bool kGated>
void launch(const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& bias,
            const std::optional<torch::Tensor>& residual, const torch::Tensor& out, int rows, int N,
            int K, int k_splits, cudaStream_t stream) {
  const T* b = bias.has_value() ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr;
  const T* res = residual.has_value() ? reinterpret_cast<const T*>(residual->data_ptr()) : nullptr;
  switch (rows) {
    case 1: launch_rows<T, 1, kGated>(x, w, b, res, out, N, K, k_splits, stream); break;
    case 2: launch_rows<T, 2, kGated>(x, w, b, res, out, N, K, k_splits, stream); break;
    case 3: launch_rows<T, 3, kGated>(x, w, b, res, out, N, K, k_splits, stream); break;
    case 4: launch_rows<T, 4, kGated>(x, w, b, res, out, N, K, k_splits, stream); break;
    case 5: launch_rows<T, 5, kGated>(x, w, b, res, out, N, K, k_splits, stream); break;
    case 6: launch_rows<T, 6, kGated>(x, w, b, res, out, N, K, k_splits, stream); break;
    case 7: launch_rows<T, 7, kGated>(x, w, b, res, out, N, K, k_splits, stream); break;
    default: launch_rows<T, 8, kGated>(x, w, b, res, out, N, K, k_splits, stream); break;
  }
}

// Both kernels (plain, gated) of element type T: what each decode_linear_<dtype>.cu instantiates.
template <typename T>
void launch_type(const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& bias,
                 const std::optional<torch::Tensor>& residual, const torch::Tensor& out, int rows,
                 int N, int K, int k_splits, bool gated, cudaStream_t stream) {
  if (gated) {
    launch<T, true>(x, w, bias, residual, out, rows, N, K, k_splits, stream);
  } else {
    launch<T, false>(x, w, bias, residual, out, rows, N, K, k_splits, stream);
  }
}

}  // namespace

namespace attn_linear {

// One entry per element type, defined in decode_linear_<dtype>.cu: launch_type<T>.
void launch_fp32(const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& bias,
                 const std::optional<torch::Tensor>& residual, const torch::Tensor& out, int rows,
                 int N, int K, int k_splits, bool gated, cudaStream_t stream);
void launch_fp16(const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& bias,
                 const std::optional<torch::Tensor>& residual, const torch::Tensor& out, int rows,
                 int N, int K, int k_splits, bool gated, cudaStream_t stream);
void launch_bf16(const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& bias,
                 const std::optional<torch::Tensor>& residual, const torch::Tensor& out, int rows,
                 int N, int K, int k_splits, bool gated, cudaStream_t stream);

}  // namespace attn_linear
