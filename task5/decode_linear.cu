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
// Tried and left out: loading the first kUnroll steps of weights before waiting for the
// kernel before (they do not depend on it), to keep the memory busy through its tail: task
// 6's bf16 TBT did not improve beyond run-to-run noise (task6/NOTES.md).
// Launched overlapped (device_values.cuh): on Hopper the next kernel is launched once every
// warp here has streamed its weights, so its blocks are resident when this one's tail ends.
// (Prefetching the next kernel's first weights into L2 before its wait was tried: ptxas then
// scheduled the bf16 main loop with fewer loads in flight, and the step got slower. A bulk
// prefetch of each row's first round, which holds no registers, gained nothing either;
// task6/NOTES.md.) The loop has no room for more work per element: folding the norm before
// the product into it (x replaced by gamma * (x - pivot), the row sums taken on the way) made
// the bf16 products slower by more than the norm kernel it removed cost (task6/NOTES.md).
//
// Measured speed (GB/s of weights read, against cuBLAS; task 6's TBT against its roofline):
// Results.md, rendered from results/<gpu>.json.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/types.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

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

// Work fused into the epilogue, for the products of a decode step that feed a small kernel
// (null pointers: none; the host sets at most one of the two).
//   * rope (the qkv product): RoPE and the KV-cache append of rope_append.cu, done by the warp
//     that computed the values. Each warp then takes the rows (i, i + 1, i + D/2, i + 1 + D/2)
//     of one head instead of 4 consecutive rows, so it holds both coordinates of the two points
//     it rotates; the rounding is rope_append's (the product is rounded to T first), so the
//     result is the same bits as decode_linear followed by rope_append.
//   * norm (a residual product, o_proj or the down projection): the rows of out are normalised
//     for the next layer's product (LayerNorm or RMSNorm, norm.cu's arithmetic) by the block
//     that finishes last (a counter, as the decode kernel's split merge does), so no norm
//     kernel and no kernel boundary follows.
template <typename T>
struct Epilogue {
  // RoPE + cache append: q_out [M, q_heads, D]; caches [M, max_len, kv_heads * D] (element
  // strides cache_stride_b, cache_stride_pos); cos, sin fp32 [table_len, D]; the position is
  // read on the device (a CUDA graph replays the step as it advances).
  T* q_out;
  T* k_cache;
  T* v_cache;
  const float* cos;
  const float* sin;
  int64_t cache_stride_b, cache_stride_pos, max_position;
  int head_dim, q_heads, kv_heads;
  attn::RuntimeInt position;
  // Normalisation of out's rows into norm_out [M, N]; norm_bias null for RMSNorm or no bias.
  T* norm_out;
  const T* norm_weight;
  const T* norm_bias;
  float norm_eps;
  bool rms;
  unsigned* counter;  // zeroed; the last block resets it
};

// (x1, x2) rotated by the angle whose cosine and sine are (c, s): rope_append.cu's rounding.
__device__ __forceinline__ float2 rotate(float x1, float x2, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)), fmaf(x1, s, __fmul_rn(x2, c)));
}

// The output feature of row r (< 4) of row group `group` when the epilogue applies RoPE: the
// points (i, i + D/2) and (i + 1, i + 1 + D/2) of one head, i = 2 * (group % (D / 4)).
__device__ __forceinline__ int rope_feature(int group, int r, int head_dim) {
  const int quarter = head_dim / 4;
  const int head = group / quarter, i = 2 * (group % quarter);
  return head * head_dim + i + (r & 1) + (r >> 1) * (head_dim / 2);
}

// RoPE and the cache append of one warp's 4 rows x M tokens (values: the product plus bias,
// in fp32, not yet rounded). Run by one lane.
template <typename T, int M>
__device__ __forceinline__ void rope_append_rows(const Epilogue<T>& ep, int group,
                                                 const float (&values)[4][M]) {
  const int quarter = ep.head_dim / 4, half = ep.head_dim / 2;
  const int head = group / quarter, i = 2 * (group % quarter);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float y[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) y[r] = to_float(from_float<T>(values[r][m]));  // qkv as stored
    const int64_t position = ep.position.at(m);
    const bool in_range = position >= 0 && position < ep.max_position;
    const bool is_v = head >= ep.q_heads + ep.kv_heads;
    float2 first = make_float2(y[0], y[2]), second = make_float2(y[1], y[3]);
    if (!is_v) {
      first = make_float2(0.0f, 0.0f), second = make_float2(0.0f, 0.0f);
      if (in_range) {
        const int64_t angle = position * ep.head_dim + i;
        first = rotate(y[0], y[2], ep.cos[angle], ep.sin[angle]);
        second = rotate(y[1], y[3], ep.cos[angle + 1], ep.sin[angle + 1]);
      }
    }
    T* dst;
    if (head < ep.q_heads) {
      dst = ep.q_out + (static_cast<int64_t>(m) * ep.q_heads + head) * ep.head_dim;
    } else {
      if (!in_range) continue;  // nothing is written outside the cache
      const int kv_head = head - ep.q_heads - (is_v ? ep.kv_heads : 0);
      dst = (is_v ? ep.v_cache : ep.k_cache) + m * ep.cache_stride_b +
            position * ep.cache_stride_pos + static_cast<int64_t>(kv_head) * ep.head_dim;
    }
    dst[i] = from_float<T>(first.x);
    dst[i + half] = from_float<T>(first.y);
    dst[i + 1] = from_float<T>(second.x);
    dst[i + 1 + half] = from_float<T>(second.y);
  }
}

// (count, mean, M2) statistics merged (Chan et al.): the variance of the union, exactly enough
// that a large mean does not cancel (each part is summed around its own mean).
__device__ __forceinline__ void merge_stats(float& n, float& mean, float& m2, float n_b,
                                            float mean_b, float m2_b) {
  const float total = n + n_b;
  if (n_b == 0.0f) return;
  const float delta = mean_b - mean;
  mean += delta * (n_b / total);
  m2 += m2_b + delta * delta * (n * n_b / total);
  n = total;
}

// One row of `hidden` elements normalised by one warp: h read from L2 (the other blocks wrote
// it), in chunks of kTailPieces 16-byte pieces per lane; the statistics per chunk around the
// chunk's mean, merged; a row of one chunk (bf16 hidden <= 4096) is read once.
constexpr int kTailPieces = 16;
template <typename T>
__device__ __forceinline__ void normalize_row_by_warp(const T* h, T* out, const Epilogue<T>& ep,
                                                      int hidden, int lane) {
  constexpr int kVec = Pack<T>::kElems;
  const int pieces = hidden / kVec;
  constexpr int kChunk = 32 * kTailPieces;
  Pack<T> held[kTailPieces];
  const auto load_chunk = [&](int start) {
#pragma unroll
    for (int p = 0; p < kTailPieces; ++p) {
      const int piece = start + p * 32 + lane;
      if (piece < pieces) held[p].raw = __ldcg(reinterpret_cast<const uint4*>(h) + piece);
    }
  };
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;  // RMSNorm: m2 is the sum of squares
  for (int start = 0; start < pieces; start += kChunk) {
    load_chunk(start);
    float count = 0.0f, sum = 0.0f;
#pragma unroll
    for (int p = 0; p < kTailPieces; ++p) {
      if (start + p * 32 + lane >= pieces) break;
      float f[kVec];
      held[p].to_float(f);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum += ep.rms ? f[e] * f[e] : f[e];
      count += kVec;
    }
    if (ep.rms) {
      m2 += sum;
      continue;
    }
    const float chunk_mean = count > 0.0f ? sum / count : 0.0f;
    float chunk_m2 = 0.0f;
#pragma unroll
    for (int p = 0; p < kTailPieces; ++p) {
      if (start + p * 32 + lane >= pieces) break;
      float f[kVec];
      held[p].to_float(f);
#pragma unroll
      for (int e = 0; e < kVec; ++e) chunk_m2 += (f[e] - chunk_mean) * (f[e] - chunk_mean);
    }
    merge_stats(n, mean, m2, count, chunk_mean, chunk_m2);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float n_b = __shfl_xor_sync(0xffffffffu, n, offset);
    const float mean_b = __shfl_xor_sync(0xffffffffu, mean, offset);
    const float m2_b = __shfl_xor_sync(0xffffffffu, m2, offset);
    if (ep.rms) {
      m2 += m2_b;
    } else {
      merge_stats(n, mean, m2, n_b, mean_b, m2_b);
    }
  }
  const float rstd = rsqrtf(m2 / static_cast<float>(hidden) + ep.norm_eps);
  if (ep.rms) mean = 0.0f;
  for (int start = 0; start < pieces; start += kChunk) {
    if (pieces > kChunk) load_chunk(start);  // one chunk: still held from the statistics
#pragma unroll
    for (int p = 0; p < kTailPieces; ++p) {
      const int piece = start + p * 32 + lane;
      if (piece >= pieces) break;
      float f[kVec], w[kVec], b[kVec];
      held[p].to_float(f);
      Pack<T> wp, bp;
      wp.raw = __ldg(reinterpret_cast<const uint4*>(ep.norm_weight) + piece);
      wp.to_float(w);
      if (ep.norm_bias != nullptr) {
        bp.raw = __ldg(reinterpret_cast<const uint4*>(ep.norm_bias) + piece);
        bp.to_float(b);
      }
      uint4 raw;
      T* e_out = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float shift = ep.norm_bias != nullptr ? b[e] : 0.0f;
        e_out[e] = from_float<T>((f[e] - mean) * rstd * w[e] + shift);
      }
      reinterpret_cast<uint4*>(out)[piece] = raw;
    }
  }
}

// The norm tail: every block counts itself once its outputs are written; the last one
// normalises the M rows of out (a warp per row) and resets the counters for the next launch.
// The count is two-level: block b counts on counter 1 + b % kCounterLanes, and the block that
// completes a lane counts on counter 0. One counter for a thousand blocks serialises their
// atomics (each on the same address) at the end of the kernel.
constexpr int kCounterLanes = 32;
constexpr int kCounterStride = 32;  // ints between counters: one 128-byte line each
template <typename T, int M>
__device__ __forceinline__ void normalize_in_last_block(const T* out, int N, const Epilogue<T>& ep) {
  __shared__ bool is_last;
  __syncthreads();  // the block's outputs are written
  if (threadIdx.x == 0) {
    const unsigned blocks = gridDim.x, lane = blockIdx.x % kCounterLanes;
    const unsigned lanes = min(blocks, static_cast<unsigned>(kCounterLanes));
    const unsigned in_lane = (blocks - lane + kCounterLanes - 1) / kCounterLanes;
    unsigned* lane_counter = ep.counter + (1 + lane) * kCounterStride;
    bool last = false;
    if (attn::count_block_is_last(lane_counter, in_lane)) {  // this lane is complete
      *lane_counter = 0u;
      last = attn::count_block_is_last(ep.counter, lanes);
      if (last) *ep.counter = 0u;
    }
    is_last = last;
  }
  __syncthreads();
  if (!is_last) return;  // else the other blocks' outputs are visible since the count
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int m = warp; m < M; m += kWarps) {
    normalize_row_by_warp<T>(out + static_cast<int64_t>(m) * N,
                             ep.norm_out + static_cast<int64_t>(m) * N, ep, N, lane);
  }
}

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
// kFused: the instantiation that runs an Epilogue (RoPE + cache append, or the norm tail);
// the plain one (false) compiles as if the Epilogue did not exist.
template <typename T, int M, bool kGated, int kSplits, bool kFused>
__global__ void __launch_bounds__(kThreads)
decode_linear_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     const T* __restrict__ residual, T* __restrict__ out, int N, int K,
                     const Epilogue<T> ep) {
  constexpr int kVec = Pack<T>::kElems;
  constexpr int kOutRows = kGated ? kRowsPerWarp / 2 : kRowsPerWarp;  // output features per warp
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row_group = warp / kSplits;      // which rows of the block this warp streams
  const int k_part = warp % kSplits;         // which steps along K
  constexpr int kRowGroups = kWarps / kSplits;
  const int group = blockIdx.x * kRowGroups + row_group;  // this warp's group of rows
  const int row0 = group * kOutRows;
  const bool rope = kFused && ep.q_out != nullptr;
  // Output feature of row r (r < kOutRows): consecutive, or a head's RoPE points (Epilogue).
  const auto feature_of = [&](int r) {
    return rope ? rope_feature(group, r, ep.head_dim) : row0 + r;
  };

  // Weight row r of this warp: output feature row0 + r (for the gated kernel, r >= kOutRows
  // is the up row of feature row0 + r - kOutRows, N rows further). Rows past N (the last
  // block) read row N - 1 instead, so every load is in bounds and the loop has no branch;
  // their results are simply not written.
  const T* w_rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int feature = min(feature_of(r % kOutRows), N - 1);
    const int64_t w_row = r < kOutRows ? feature : static_cast<int64_t>(N) + feature;
    w_rows[r] = w + w_row * K;
  }

  // Lane `lane` takes elements lane*kVec, lane*kVec + 32*kVec, ... of every row (of this
  // warp's share of the steps): a warp reads 512 contiguous bytes of a row per step. Per step
  // a lane loads kRowsPerWarp pieces of W (from memory, once) and M pieces of x, and the
  // unrolling keeps kUnroll steps of loads in flight.
  constexpr int k_step = 32 * kVec * kSplits;
  int k = (k_part * 32 + lane) * kVec;

  attn::wait_for_previous_kernel();  // x (and the residual) come from the kernel before

  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }
#pragma unroll kUnroll
  for (; k < K; k += k_step) {
    Pack<T> wp[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) wp[r].raw = load_streaming(w_rows[r] + k);
    accumulate_step<T, M>(acc, wp, x, K, k);
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
  if (lane == 0 && k_part == 0 && rope) {
    if constexpr (kFused) {
      float values[kRowsPerWarp][M];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float b = bias != nullptr ? to_float(bias[feature_of(r)]) : 0.0f;
#pragma unroll
        for (int m = 0; m < M; ++m) values[r][m] = acc[r][m] + b;
      }
      rope_append_rows<T, M>(ep, group, values);
    }
  } else if (lane == 0 && k_part == 0) {
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
  if constexpr (kFused) {
    if (ep.norm_out != nullptr) normalize_in_last_block<T, M>(out, N, ep);
  }
}

// Epilogue<T>'s fields as the host fills them, before the dtype is dispatched.
struct EpilogueArgs {
  void* q_out = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t cache_stride_b = 0, cache_stride_pos = 0, max_position = 0;
  int head_dim = 0, q_heads = 0, kv_heads = 0;
  attn::RuntimeInt position{nullptr, 0, 0};
  void* norm_out = nullptr;
  const void* norm_weight = nullptr;
  const void* norm_bias = nullptr;
  float norm_eps = 0.0f;
  bool rms = false;
  unsigned* counter = nullptr;

  template <typename T>
  Epilogue<T> typed() const {
    return Epilogue<T>{static_cast<T*>(q_out), static_cast<T*>(k_cache), static_cast<T*>(v_cache),
                       cos, sin, cache_stride_b, cache_stride_pos, max_position, head_dim,
                       q_heads, kv_heads, position, static_cast<T*>(norm_out),
                       static_cast<const T*>(norm_weight), static_cast<const T*>(norm_bias),
                       norm_eps, rms, counter};
  }
};

template <typename T, int M, bool kGated>
void launch_rows(const torch::Tensor& x, const torch::Tensor& w, const T* bias, const T* residual,
                 const torch::Tensor& out, int N, int K, int k_splits, const Epilogue<T>& ep,
                 cudaStream_t stream) {
  const auto launch_split = [&](auto splits) {
    constexpr int kSplits = decltype(splits)::value;
    const int features_per_block = kWarps / kSplits * (kGated ? kRowsPerWarp / 2 : kRowsPerWarp);
    const int blocks = attn::ceil_div(N, features_per_block);
    // The fused epilogues are instantiations of their own (kFused), so that the registers
    // they need do not change how the plain kernel is compiled.
    const bool fused = !kGated && (ep.q_out != nullptr || ep.norm_out != nullptr);
    const auto kernel = fused ? decode_linear_kernel<T, M, false, kSplits, true>
                              : decode_linear_kernel<T, M, kGated, kSplits, false>;
    attn::launch_overlapped(kGated ? "decode_linear_kernel (SwiGLU)" : "decode_linear_kernel",
                            kernel, dim3(blocks),
                            dim3(kThreads), stream, reinterpret_cast<const T*>(x.data_ptr()),
                            reinterpret_cast<const T*>(w.data_ptr()), bias, residual,
                            reinterpret_cast<T*>(out.data_ptr()), N, K, ep);
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
            int K, int k_splits, const EpilogueArgs& args) {
  const T* b = bias.has_value() ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr;
  const T* res = residual.has_value() ? reinterpret_cast<const T*>(residual->data_ptr()) : nullptr;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const Epilogue<T> ep = args.typed<T>();
  switch (rows) {
    case 1: launch_rows<T, 1, kGated>(x, w, b, res, out, N, K, k_splits, ep, stream); break;
    case 2: launch_rows<T, 2, kGated>(x, w, b, res, out, N, K, k_splits, ep, stream); break;
    case 3: launch_rows<T, 3, kGated>(x, w, b, res, out, N, K, k_splits, ep, stream); break;
    case 4: launch_rows<T, 4, kGated>(x, w, b, res, out, N, K, k_splits, ep, stream); break;
    case 5: launch_rows<T, 5, kGated>(x, w, b, res, out, N, K, k_splits, ep, stream); break;
    case 6: launch_rows<T, 6, kGated>(x, w, b, res, out, N, K, k_splits, ep, stream); break;
    case 7: launch_rows<T, 7, kGated>(x, w, b, res, out, N, K, k_splits, ep, stream); break;
    default: launch_rows<T, 8, kGated>(x, w, b, res, out, N, K, k_splits, ep, stream); break;
  }
}

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

// The entries' shared checks and launch: `gated` halves the output features; `fused_epilogue`,
// given the output tensor, fills the Epilogue (or leaves it empty) before the launch.
template <typename FillEpilogue>
torch::Tensor run(const char* entry, const torch::Tensor& x, const torch::Tensor& weight,
                  const std::optional<torch::Tensor>& bias,
                  const std::optional<torch::Tensor>& residual, int64_t k_splits, bool gated,
                  const FillEpilogue& fused_epilogue) {
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
  EpilogueArgs args;
  fused_epilogue(args, out);
  const auto dispatch = [&](auto gated_flag) {
    constexpr bool kGated = decltype(gated_flag)::value;
    switch (x.scalar_type()) {
      case torch::kFloat32: launch<float, kGated>(x, weight, bias, residual, out, m, n, k, splits, args); break;
      case torch::kFloat16: launch<__half, kGated>(x, weight, bias, residual, out, m, n, k, splits, args); break;
      default: launch<__nv_bfloat16, kGated>(x, weight, bias, residual, out, m, n, k, splits, args); break;
    }
  };
  if (gated) {
    dispatch(std::true_type{});
  } else {
    dispatch(std::false_type{});
  }
  return out;
}

const auto no_epilogue = [](EpilogueArgs&, const torch::Tensor&) {};

}  // namespace

// x [..., K] with at most 8 rows in all (contiguous); weight [N, K] (contiguous); bias [N];
// residual [..., N] like the output; k_splits: 1, 2 or 4 warps per row along K, 0 to choose.
// Returns [..., N] in x's dtype.
torch::Tensor decode_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> residual, int64_t k_splits) {
  return run("decode_linear", x, weight, bias, residual, k_splits, /*gated=*/false, no_epilogue);
}

// SwiGLU's first half in one pass: weight [2 * width, K] holds the gate rows then the up rows
// (bias [2 * width] likewise); returns silu(x Wg^T + bg) * (x Wu^T + bu) (+ residual), [..., width].
torch::Tensor decode_swiglu(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> residual, int64_t k_splits) {
  return run("decode_swiglu", x, weight, bias, residual, k_splits, /*gated=*/true, no_epilogue);
}

std::vector<torch::Tensor> add_norm(torch::Tensor x, std::optional<torch::Tensor> residual,
                                    torch::Tensor weight, std::optional<torch::Tensor> bias,
                                    double eps, bool rms);  // norm.cu

// decode_linear with a residual, then LayerNorm (or RMSNorm, rms) of its output rows for the
// next product: returns {out, norm(out)}. The norm runs in the product's last block (Epilogue);
// without the counters it needs (a CUDA graph captured before any eager call), on norm.cu's
// kernel after the product.
std::vector<torch::Tensor> decode_linear_norm(torch::Tensor x, torch::Tensor weight,
                                              std::optional<torch::Tensor> bias,
                                              torch::Tensor residual, torch::Tensor norm_weight,
                                              std::optional<torch::Tensor> norm_bias, double eps,
                                              bool rms, int64_t k_splits) {
  const char* entry = "decode_linear_norm";
  attn::check_cuda_tensor(x, "x");
  attn::check_same(norm_weight, "norm_weight", x, "x");
  attn::check_contiguous(norm_weight, "norm_weight");
  TORCH_CHECK_VALUE(norm_weight.dim() == 1 && norm_weight.size(0) == weight.size(0),
                    attn::str(entry, ": norm_weight must be [", weight.size(0), "] (one per output "
                              "feature) but is ", norm_weight.sizes(), "."));
  TORCH_CHECK_VALUE(!(rms && norm_bias.has_value()), "RMSNorm has no bias (pass norm_bias=None).");
  if (norm_bias.has_value()) {
    attn::check_same(*norm_bias, "norm_bias", x, "x");
    attn::check_contiguous(*norm_bias, "norm_bias");
    TORCH_CHECK_VALUE(norm_bias->sizes() == norm_weight.sizes(),
                      attn::str(entry, ": norm_bias is ", norm_bias->sizes(), " but norm_weight is ",
                                norm_weight.sizes(), "."));
  }
  TORCH_CHECK_VALUE((weight.size(0) * x.element_size()) % 16 == 0 && aligned16(norm_weight) &&
                        (!norm_bias.has_value() || aligned16(*norm_bias)),
                    attn::str(entry, " normalises 16-byte pieces: out_features (", weight.size(0),
                              ") times the element size must be a multiple of 16, and the norm's "
                              "weight and bias 16-byte aligned."));
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  unsigned* counter = reinterpret_cast<unsigned*>(
      attn::zeroed_counters(stream, attn::CounterUser::kDecodeLinearNorm));
  torch::Tensor normed;
  const torch::Tensor out = run(entry, x, weight, bias, residual, k_splits, /*gated=*/false,
                                [&](EpilogueArgs& args, const torch::Tensor& product) {
    if (counter == nullptr) return;
    normed = torch::empty_like(product);
    args.norm_out = normed.data_ptr();
    args.norm_weight = norm_weight.data_ptr();
    args.norm_bias = norm_bias.has_value() ? norm_bias->data_ptr() : nullptr;
    args.norm_eps = static_cast<float>(eps);
    args.rms = rms;
    args.counter = counter;
  });
  if (counter == nullptr) normed = add_norm(out, std::nullopt, norm_weight, norm_bias, eps, rms)[0];
  return {out, normed};
}

// The qkv product of a decode step, then RoPE on its q and k heads and the KV-cache append of
// k and v (rope_append's work, in the product's epilogue): x [B, 1, K] or [B, K]; weight
// [(q_heads + 2 * kv_heads) * D, K], the q rows, then k's, then v's; caches [B, max_len,
// kv_heads * D]; cos, sin fp32 [table_len, D]; the position as rope_append takes it. Returns
// the rotated q, [B, 1, q_heads, D].
torch::Tensor decode_qkv_rope(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                              torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor cos,
                              torch::Tensor sin, int64_t current_pos,
                              std::optional<torch::Tensor> current_pos_tensor, int64_t q_heads,
                              int64_t kv_heads, int64_t k_splits) {
  const char* entry = "decode_qkv_rope";
  attn::check_cuda_tensor(x, "x");
  for (const auto& [t, name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    attn::check_same(*t, name, x, "x");
    attn::check_dim(*t, name, 3, "[batch, max_len, kv_heads * head_dim]");
    attn::check_last_dim_contiguous(*t, name);
  }
  TORCH_CHECK_VALUE(q_heads >= 1 && kv_heads >= 1 && weight.dim() == 2 &&
                        weight.size(0) % (q_heads + 2 * kv_heads) == 0,
                    attn::str(entry, ": weight has ", weight.sizes(), " rows, which are not ",
                              "(q_heads + 2 * kv_heads) = ", q_heads + 2 * kv_heads, " heads."));
  const int64_t head_dim = weight.size(0) / (q_heads + 2 * kv_heads);
  const int64_t batch = x.numel() / std::max<int64_t>(x.size(-1), 1);
  TORCH_CHECK_VALUE(head_dim % 4 == 0,
                    attn::str(entry, ": head_dim (", head_dim, ") must be a multiple of 4 (each "
                              "warp rotates two pairs); use decode_linear and rope_append."));
  TORCH_CHECK_VALUE(k_cache.sizes() == v_cache.sizes() && k_cache.strides() == v_cache.strides() &&
                        k_cache.size(0) == batch && k_cache.size(2) == kv_heads * head_dim,
                    attn::str(entry, ": the caches must both be [", batch, ", max_len, ",
                              kv_heads * head_dim, "] with the same strides, but are ",
                              k_cache.sizes(), " and ", v_cache.sizes(), "."));
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    attn::check_cuda_tensor(*t, name);
    attn::check_dtype(*t, name, {torch::kFloat32});
    attn::check_contiguous(*t, name);
    TORCH_CHECK_VALUE(t->dim() == 2 && t->size(1) == head_dim && t->sizes() == cos.sizes(),
                      attn::str("cos and sin must both be [max_len, ", head_dim, "] but are ",
                                cos.sizes(), " and ", sin.sizes(), "."));
  }
  const int64_t max_position = std::min(k_cache.size(1), cos.size(0));
  if (!current_pos_tensor.has_value()) {
    TORCH_CHECK_VALUE(current_pos >= 0 && current_pos < max_position,
                      attn::str("position ", current_pos, " does not fit: the cache holds ",
                                k_cache.size(1), " positions and the RoPE tables ", cos.size(0), "."));
  }
  const attn::RuntimeInt position =
      attn::runtime_int(current_pos, current_pos_tensor, "current_pos", batch, x.device());
  torch::Tensor q_out;
  run(entry, x, weight, bias, std::nullopt, k_splits, /*gated=*/false,
      [&](EpilogueArgs& args, const torch::Tensor&) {
    q_out = torch::empty({batch, 1, q_heads, head_dim}, x.options());
    args.q_out = q_out.data_ptr();
    args.k_cache = k_cache.data_ptr();
    args.v_cache = v_cache.data_ptr();
    args.cos = cos.data_ptr<float>();
    args.sin = sin.data_ptr<float>();
    args.cache_stride_b = k_cache.stride(0);
    args.cache_stride_pos = k_cache.stride(1);
    args.max_position = max_position;
    args.head_dim = static_cast<int>(head_dim);
    args.q_heads = static_cast<int>(q_heads);
    args.kv_heads = static_cast<int>(kv_heads);
    args.position = position;
  });
  return q_out;
}
