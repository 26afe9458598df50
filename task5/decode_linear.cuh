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
// speed, also moved with unrelated edits, so it is left exactly as measured (task6/NOTES.md;
// one more kernel parameter alone made task 6's bf16 steps slower:
// results/logs/h100_s12_record_regressed/).
// Launched overlapped (device_values.cuh): on Hopper the next kernel is launched once every
// warp here has streamed its weights, so its blocks are resident when this one's tail ends.
// Letting it start as soon as this kernel's wait returns instead (instantiations of their own,
// whose loops ptxas scheduled anew) measured slower in each of task 6's steps
// (results/logs/h100_s13_linear_early/).
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
// Files. This header is the kernel and its idea; decode_linear.cu is the host side (checks,
// the choice of k_splits, the launch, the two entries, with torch); decode_linear_fp32.cu,
// decode_linear_fp16.cu and decode_linear_bf16.cu compile the instantiations, one file per
// element type (48 kernels each: M = 1..8 rows, plain and gated, k_splits 1, 2, 4), so that
// the build compiles them side by side: the 144 in one file were among the longest compiles
// of the task 5 extension (results/logs/cpu_nvcc_decode_split.txt). This header includes no
// torch header.
//
// Measured speed (GB/s of weights read, against cuBLAS; task 6's TBT against its roofline):
// Results.md, rendered from results/<gpu>.json.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device_inline.cuh"

#ifndef ATTN_DECODE_LINEAR_MAX_ROWS
#error "ATTN_DECODE_LINEAR_MAX_ROWS is undefined: build through common.build (python -m task5.compile), which passes common/limits.py's values"
#endif

namespace attn_linear {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 4;
constexpr int kUnroll = 4;   // steps along K whose loads are in flight together
constexpr int kMaxRows = ATTN_DECODE_LINEAR_MAX_ROWS;   // rows of x (M): common/limits.py
constexpr int kMaxKSplits = kWarps;     // warps of a block that share rows and split K
constexpr int kMinStepsPerWarp = 2 * kUnroll;  // the automatic k_splits leaves a warp this many
static_assert(kMaxRows == 8, "linear_kernel() below instantiates M = 1..8: change both together");

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

// ---- which instantiation runs a call ---------------------------------------------------------

// An instantiation of decode_linear_kernel, as the host launches it (decode_linear.cu).
template <typename T>
using LinearKernel = void (*)(const T*, const T*, const T*, const T*, T*, int, int, int, unsigned);

// decode_linear_kernel for `rows` rows of x (1..kMaxRows) and k_splits warps along K (1, 2, or
// 4 for any other value). Each element type's instantiations are compiled in one file,
// decode_linear_<type>.cu (the extern declarations below); a file that includes this header
// instantiates none of them.
template <typename T, bool kGated>
LinearKernel<T> linear_kernel(int rows, int k_splits) {
  const auto with_rows = [&](auto splits) -> LinearKernel<T> {
    constexpr int kSplits = decltype(splits)::value;
    switch (rows) {
      case 1: return decode_linear_kernel<T, 1, kGated, kSplits>;
      case 2: return decode_linear_kernel<T, 2, kGated, kSplits>;
      case 3: return decode_linear_kernel<T, 3, kGated, kSplits>;
      case 4: return decode_linear_kernel<T, 4, kGated, kSplits>;
      case 5: return decode_linear_kernel<T, 5, kGated, kSplits>;
      case 6: return decode_linear_kernel<T, 6, kGated, kSplits>;
      case 7: return decode_linear_kernel<T, 7, kGated, kSplits>;
      default: return decode_linear_kernel<T, 8, kGated, kSplits>;
    }
  };
  switch (k_splits) {
    case 1: return with_rows(std::integral_constant<int, 1>{});
    case 2: return with_rows(std::integral_constant<int, 2>{});
    default: return with_rows(std::integral_constant<int, 4>{});
  }
}

extern template LinearKernel<float> linear_kernel<float, false>(int rows, int k_splits);
extern template LinearKernel<float> linear_kernel<float, true>(int rows, int k_splits);
extern template LinearKernel<__half> linear_kernel<__half, false>(int rows, int k_splits);
extern template LinearKernel<__half> linear_kernel<__half, true>(int rows, int k_splits);
extern template LinearKernel<__nv_bfloat16> linear_kernel<__nv_bfloat16, false>(int rows, int k_splits);
extern template LinearKernel<__nv_bfloat16> linear_kernel<__nv_bfloat16, true>(int rows, int k_splits);

}  // namespace attn_linear
