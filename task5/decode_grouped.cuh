// Task 5, beyond the course: grouped-query decode with every attention variant.
//
// The idea. Grouped-query attention (Llama-3, Mistral, Qwen) gives H_q / H_kv query heads one
// KV head. Decoding each query head on its own, as the course's kernel (decode.cu) does, would
// read that head's cache H_q / H_kv times; here one block reads it once for GROUP_TILE query
// heads: every K row is converted to float once and dotted with GROUP_TILE queries, every V
// row accumulated into GROUP_TILE outputs. The pattern (window, stride, mask tensor,
// per-sequence lengths, left padding) is the predicate of attention_mask.cuh with the single
// query at position key_end - 1; the key range of a window is clipped before the loop, so a
// windowed decode reads only the window. Long contexts are split across blocks
// (FlashDecoding), and the splits are merged by decode.cu's merge (combine_splits), the one
// the course's kernel uses.
//
// Tile shape and why. A block is 4 warps (decode_common.cuh) and holds the queries and
// outputs of GROUP_TILE = 1, 2, 4 or 8 query heads (the group size rounded up to a power of
// two, at most 8: a bigger group takes several blocks). Holding them costs registers, which leaves few K/V loads in flight if
// they go through registers as in decode.cu's decode_split_kernel; so the K/V rows stream
// global -> shared memory with cp.async, GROUPED_STAGES = 4 tiles of GROUPED_TILE_KEYS = 32
// keys deep (the copies need no registers; 8 keys per warp per tile), and the warps compute on
// one tile while the next ones land. A key is read by LANES_PER_KEY lanes, 16 bytes each, as
// in decode_split_kernel. Head dims above 128 (up to 256) run their own instantiations: shared
// rows of 256 elements, at most 4 query heads per block, and 2 stages for fp32 (so that the
// tiles stay at 128 KB).
//
// Where it runs (task5/attention.py, _decode_grouped_routed, decides): fp16/bf16 decode with
// two or more query heads per KV head goes to the tensor-core kernel, decode_gqa.cu, with
// every variant; fp32, and multi-head attention (one query head per KV head) with any
// variant, run this kernel.
//
// Files. This header is the kernel and its idea; decode_grouped.cu is the host side (the
// layout choices, the launch, the entry decode_attention_grouped, with torch);
// decode_grouped_fp32.cu, decode_grouped_fp16.cu and decode_grouped_bf16.cu compile the 11
// instantiations of each element type, so that the build compiles them side by side (the 33
// in one file were among the longest compiles of the task 5 extension); this header includes
// no torch header, which keeps them light (results/logs/cpu_nvcc_decode_split.txt).
//
// Measured speed (GB/s, the fraction of copy bandwidth, against SDPA with enable_gqa, as
// CUDA-graph replays): python -m task5.test --gqa-bench; Results.md ("Grouped-query decode",
// the "CUDA cores (grouped kernel)" row), rendered from results/<gpu>.json.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention_mask.cuh"
#include "decode_common_device.cuh"

namespace attn_grouped {

// The block shape, packs, Score<T>, DecodeTensors (decode_common_device.cuh).
using namespace attn_decode;


constexpr int GROUPED_TILE_KEYS = 32;  // keys per shared-memory tile (8 per warp)
constexpr int GROUPED_STAGES = 4;      // tiles in flight or being computed
// Head dims above 128 run instantiations whose shared rows are 256 elements wide (ROW), with
// at most 4 query heads per block (GROUP_TILE: the accumulators hold twice the elements per
// head) and, for fp32 rows of 1 KB, 2 stages instead of 4 (128 KB of tiles either way).
constexpr int MAX_ROW_NARROW = 128;    // rows of head dims up to 128
constexpr int GROUPED_WIDE_ROW = 256;
constexpr int GROUPED_WIDE_MAX_TILE = 4;
template <typename T, int ROW>
constexpr int grouped_stages() { return ROW * static_cast<int>(sizeof(T)) > 512 ? 2 : GROUPED_STAGES; }
constexpr float LAZY_RESCALE = 8.f;    // see the online softmax of decode_grouped_kernel
// fp32 rescales at every new max instead (the largest score's weight is then exactly 1).
template <typename T>
constexpr float lazy_rescale() { return std::is_same_v<T, float> ? 0.f : LAZY_RESCALE; }

// q, k, v, out and their strides: DecodeTensors (decode_common.cuh).
template <typename T>
struct GroupedDecodeParams : DecodeTensors<T> {
  int heads_q, heads_kv, group, head_chunks, head_dim;
  attn::MaskParams mask;  // seq_q = 1
  Score<T> score_scale;   // log2(e) / sqrt(head_dim)
  int num_splits;
  int64_t keys_per_split;
  Score<T>* partial_o;    // [B * H_q, num_splits, head_dim] (num_splits > 1)
  Score<T>* partial_m;
  Score<T>* partial_l;
};

// Shared memory of one block: K and V tiles of every stage, rows of ROW elements (128: every
// head dim up to 128; 256 above).
template <typename T, int ROW>
constexpr int grouped_smem_bytes() {
  return grouped_stages<T, ROW>() * 2 * GROUPED_TILE_KEYS * ROW * static_cast<int>(sizeof(T));
}

__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Copy keys [key0, key0 + TILE_KEYS) of K and V (rows past key_end zero-filled) into one
// stage: 16-byte chunks, consecutive threads on consecutive chunks of a row.
template <int ROW, typename T>
__device__ __forceinline__ void load_kv_tile(T* k_tile, T* v_tile, const T* k_head, const T* v_head,
                                             int64_t k_stride_s, int64_t v_stride_s, int64_t key0,
                                             int64_t key_end, int head_dim) {
  constexpr int VEC = 16 / sizeof(T);
  const int chunks_per_row = head_dim / VEC;
  const int chunks = GROUPED_TILE_KEYS * chunks_per_row;
  for (int c = threadIdx.x; c < chunks; c += THREADS_PER_BLOCK) {
    const int row = c / chunks_per_row;
    const int col = (c % chunks_per_row) * VEC;
    const int64_t key = key0 + row;
    const bool valid = key < key_end;
    cp_async_16_zfill(k_tile + row * ROW + col,
                      valid ? k_head + key * k_stride_s + col : k_head, valid);
    cp_async_16_zfill(v_tile + row * ROW + col,
                      valid ? v_head + key * v_stride_s + col : v_head, valid);
  }
}

// grid (B * H_kv * head_chunks, num_splits). Block (b, kv head, chunk) decodes query heads
// kv_head * group + chunk * GROUP_TILE + g, g < GROUP_TILE (those < group), over the keys of
// its split. A key is read by LANES_PER_KEY lanes, VEC elements each (as decode_split_kernel).
// ROW: the shared rows' width in elements (>= head_dim), and the stages that fit.
template <typename T, int VEC, int LANES_PER_KEY, int CHUNKS, int GROUP_TILE, int MIN_BLOCKS,
          int ROW>
__global__ void __launch_bounds__(THREADS_PER_BLOCK, MIN_BLOCKS)
    decode_grouped_kernel(const GroupedDecodeParams<T> p) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (beyond the graded course): decode_split_kernel for GROUP_TILE
  // HINT: query heads that share one KV head, reading each K/V row once for all of them
  // HINT: (global -> shared with cp.async, STAGES tiles deep), with the attn::KeyMask<true>
  // HINT: predicate (the key range clipped to keys_begin/keys_end).
  constexpr int KEYS_PER_WARP_STEP = WARP_SIZE / LANES_PER_KEY;
  constexpr int ELEMS = VEC * CHUNKS;
  constexpr int KEYS_PER_WARP = GROUPED_TILE_KEYS / WARPS_PER_BLOCK;   // of each tile
  constexpr int STEPS = KEYS_PER_WARP / KEYS_PER_WARP_STEP;
  static_assert(KEYS_PER_WARP % KEYS_PER_WARP_STEP == 0, "whole warp steps per tile");

  constexpr int STAGES = grouped_stages<T, ROW>();
  extern __shared__ float4 grouped_smem[];  // [STAGES][K, V][TILE_KEYS][ROW] of T
  T* const tiles = reinterpret_cast<T*>(grouped_smem);
  constexpr int TILE_ELEMS = GROUPED_TILE_KEYS * ROW;
  __shared__ Score<T> warp_o[WARPS_PER_BLOCK][GROUP_TILE][ROW];
  __shared__ Score<T> warp_m[WARPS_PER_BLOCK][GROUP_TILE];
  __shared__ Score<T> warp_l[WARPS_PER_BLOCK][GROUP_TILE];

  const int chunk = blockIdx.x % p.head_chunks;
  const int bkv = blockIdx.x / p.head_chunks;
  const int b = bkv / p.heads_kv;
  const int kv_head = bkv % p.heads_kv;
  const int head0 = kv_head * p.group + chunk * GROUP_TILE;            // first query head
  const int heads_here = min(GROUP_TILE, p.group - chunk * GROUP_TILE);
  const int split = blockIdx.y;
  const int warp = threadIdx.x / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
  const int key_group = lane / LANES_PER_KEY;
  const int lane_in_key = lane % LANES_PER_KEY;

  // Keys of this split that the query may see at all (a mask tensor may differ per head:
  // it is applied per head below; everything else is the same for the whole group).
  const attn::KeyMask<true> mask0(p.mask, b, head0);
  const int64_t key_begin = max(static_cast<int64_t>(split) * p.keys_per_split,
                                static_cast<int64_t>(max(mask0.keys_begin(0), 0)));
  const int64_t key_end =
      min64(static_cast<int64_t>(split + 1) * p.keys_per_split, mask0.keys_end(0));
  const int num_tiles = key_end > key_begin
      ? static_cast<int>((key_end - key_begin + GROUPED_TILE_KEYS - 1) / GROUPED_TILE_KEYS) : 0;

  const T* k_head = p.k + b * p.k_stride_b + kv_head * p.k_stride_h;
  const T* v_head = p.v + b * p.v_stride_b + kv_head * p.v_stride_h;
  // Prologue: the first STAGES - 1 tiles in flight, one commit group each (empty past the end).
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) {
    if (t < num_tiles)
      load_kv_tile<ROW>(tiles + (2 * t) * TILE_ELEMS, tiles + (2 * t + 1) * TILE_ELEMS, k_head, v_head,
                   p.k_stride_s, p.v_stride_s, key_begin + t * GROUPED_TILE_KEYS, key_end,
                   p.head_dim);
    cp_async_commit_group();
  }

  Score<T> q_reg[GROUP_TILE][ELEMS];  // unscaled, as in load_query
#pragma unroll
  for (int g = 0; g < GROUP_TILE; ++g) {
    const T* q_row = p.q + b * p.q_stride_b + (head0 + min(g, heads_here - 1)) * p.q_stride_h;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int d0 = (c * LANES_PER_KEY + lane_in_key) * VEC;
      float x[VEC];
      unpack<T, VEC>(d0 < p.head_dim ? load_pack<T, VEC>(q_row + d0) : zero_pack<T, VEC>(), x);
#pragma unroll
      for (int e = 0; e < VEC; ++e) q_reg[g][c * VEC + e] = x[e];
    }
  }
  Score<T> m[GROUP_TILE], l[GROUP_TILE], acc[GROUP_TILE][ELEMS];
#pragma unroll
  for (int g = 0; g < GROUP_TILE; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < ELEMS; ++i) acc[g][i] = 0.f;
  }
  // Only a stride or a mask tensor needs the predicate per key: the range is exact otherwise.
  const bool elementwise = p.mask.stride > 1 || p.mask.mask != nullptr;

  for (int t = 0; t < num_tiles; ++t) {
    // Refill the stage that tile t - 1 used (every warp finished it: barrier at loop end).
    const int next = t + STAGES - 1;
    if (next < num_tiles) {
      const int stage = next % STAGES;
      load_kv_tile<ROW>(tiles + (2 * stage) * TILE_ELEMS, tiles + (2 * stage + 1) * TILE_ELEMS, k_head,
                   v_head, p.k_stride_s, p.v_stride_s, key_begin + next * GROUPED_TILE_KEYS,
                   key_end, p.head_dim);
    }
    cp_async_commit_group();
    cp_async_wait_group<STAGES - 1>();  // tile t has landed (this thread's copies) ...
    __syncthreads();                            // ... and everyone's
    const T* k_tile = tiles + (2 * (t % STAGES)) * TILE_ELEMS;
    const T* v_tile = k_tile + TILE_ELEMS;
    const int64_t tile_key0 = key_begin + static_cast<int64_t>(t) * GROUPED_TILE_KEYS;

    // This warp's STEPS x KEYS_PER_WARP_STEP keys of the tile, one key per lane group and
    // step: the K and V rows are converted to float once and used by every head. The
    // online softmax rescales lazily: the accumulators are rescaled only when a score
    // exceeds the running reference m by more than LAZY_RESCALE (in log2 units), so
    // p = exp2(s - m) <= 2^LAZY_RESCALE stays far from overflow, and the usual case is one
    // exp2 and one FMA per element instead of a rescale of GROUP_TILE x ELEMS accumulators.
    // (The result is the same: numerator and denominator share the reference m, up to an
    // ulp: a largest weight 2^(s - m) that is not 1 rounds a row one key dominates, so fp32,
    // judged against PyTorch's fp32, rescales at every new max: lazy_rescale<float>() = 0.)
#pragma unroll
    for (int u = 0; u < STEPS; ++u) {
      const int row = warp * KEYS_PER_WARP + u * KEYS_PER_WARP_STEP + key_group;
      const int64_t key = tile_key0 + row;
      Score<T> kf[ELEMS];  // converted once, used by every head
      float vf[ELEMS];
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        const int d0 = (c * LANES_PER_KEY + lane_in_key) * VEC;
        float x[VEC], y[VEC];
        const bool in = d0 < p.head_dim;
        unpack<T, VEC>(in ? load_pack<T, VEC>(k_tile + row * ROW + d0) : zero_pack<T, VEC>(), x);
        unpack<T, VEC>(in ? load_pack<T, VEC>(v_tile + row * ROW + d0) : zero_pack<T, VEC>(), y);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          kf[c * VEC + e] = x[e];
          vf[c * VEC + e] = y[e];
        }
      }
#pragma unroll
      for (int g = 0; g < GROUP_TILE; ++g) {
        Score<T> dot = 0;
#pragma unroll
        for (int i = 0; i < ELEMS; ++i) dot = fma(q_reg[g][i], kf[i], dot);
#pragma unroll
        for (int offset = LANES_PER_KEY / 2; offset > 0; offset /= 2)
          dot += __shfl_xor_sync(FULL_MASK, dot, offset);
        Score<T> s = key < key_end ? dot * p.score_scale : -INFINITY;
        if (elementwise && key < key_end) {
          // The mask's part alone (apply to 0: -inf, or the additive bias in base 2), added
          // in Score<T>: applied to a rounded float score it would undo the double's precision.
          const attn::KeyMask<true> mask(p.mask, b, head0 + min(g, heads_here - 1));
          const float bias = mask.apply(0.f, 0, static_cast<int>(key));
          s = bias == -INFINITY ? -INFINITY : s + bias;
        }
        if (s == -INFINITY) continue;  // not visible (uniform within the key group)
        if (s > m[g] + lazy_rescale<T>()) {  // rare: a new reference (the first key always)
          const float rescale = exp2f(static_cast<float>(m[g] - s));  // 0 before the first key
          l[g] *= rescale;
#pragma unroll
          for (int i = 0; i < ELEMS; ++i) acc[g][i] *= rescale;
          m[g] = s;
        }
        const float prob = exp2f(static_cast<float>(s - m[g]));
        l[g] += prob;
#pragma unroll
        for (int i = 0; i < ELEMS; ++i) acc[g][i] = fma(Score<T>(prob), vf[i], acc[g][i]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait_group<0>();  // nothing left in flight (empty groups only) before exit

  // Merge the key groups of each warp, then the warps, per head (as decode_split_kernel).
#pragma unroll
  for (int g = 0; g < GROUP_TILE; ++g) {
#pragma unroll
    for (int offset = LANES_PER_KEY; offset < WARP_SIZE; offset *= 2) {
      const Score<T> m_other = __shfl_xor_sync(FULL_MASK, m[g], offset);
      const Score<T> l_other = __shfl_xor_sync(FULL_MASK, l[g], offset);
      const Score<T> m_new = fmax(m[g], m_other);
      const Score<T> w_self = m[g] == -INFINITY ? 0.f : exp2f(static_cast<float>(m[g] - m_new));
      const Score<T> w_other =
          m_other == -INFINITY ? 0.f : exp2f(static_cast<float>(m_other - m_new));
      l[g] = l[g] * w_self + l_other * w_other;
#pragma unroll
      for (int i = 0; i < ELEMS; ++i) {
        const Score<T> acc_other = __shfl_xor_sync(FULL_MASK, acc[g][i], offset);
        acc[g][i] = acc[g][i] * w_self + acc_other * w_other;
      }
      m[g] = m_new;
    }
    if (key_group == 0) {
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int d = (c * LANES_PER_KEY + lane_in_key) * VEC + e;
          if (d < p.head_dim) warp_o[warp][g][d] = acc[g][c * VEC + e];
        }
      if (lane == 0) {
        warp_m[warp][g] = m[g];
        warp_l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < heads_here * p.head_dim; idx += THREADS_PER_BLOCK) {
    const int g = idx / p.head_dim;
    const int d = idx % p.head_dim;
    Score<T> block_m = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS_PER_BLOCK; ++w) block_m = fmax(block_m, warp_m[w][g]);
    Score<T> block_l = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS_PER_BLOCK; ++w) {
      const Score<T> weight = warp_m[w][g] == -INFINITY
                                  ? 0.f : exp2f(static_cast<float>(warp_m[w][g] - block_m));
      block_l = fma(weight, warp_l[w][g], block_l);
      o = fma(weight, warp_o[w][g][d], o);
    }
    const int h = head0 + g;
    if (p.num_splits == 1) {
      p.out[b * p.out_stride_b + h * p.out_stride_h + d] =
          from_float<T>(block_l > 0.f ? static_cast<float>(o / block_l) : 0.f);  // none: 0
    } else {
      const int64_t state = (static_cast<int64_t>(b) * p.heads_q + h) * p.num_splits + split;
      p.partial_o[state * p.head_dim + d] = o;
      if (d == 0) {
        p.partial_m[state] = block_m;
        p.partial_l[state] = block_l;
      }
    }
  }
  // END SOLUTION
}

// ---- which instantiation the host launches ------------------------------------------------

// decode_grouped_kernel, as the host side (decode_grouped.cu) configures and launches it.
template <typename T>
using GroupedKernel = void (*)(const GroupedDecodeParams<T>);

// The instantiation for GROUP_TILE query heads per block, MIN_BLOCKS blocks per SM, shared rows
// of ROW elements, and head_dim: 32 lanes per key, one 16-byte pack each (fp32 above 128: two
// packs per lane), or 16 lanes where 16 packs cover head_dim (else fp32, D > 64). Each element
// type's instantiations are compiled in one file, decode_grouped_<type>.cu (the extern
// declarations below); a file that includes this header instantiates none of them.
template <typename T, int GROUP_TILE, int MIN_BLOCKS, int ROW>
GroupedKernel<T> grouped_kernel(int head_dim) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int CHUNKS = ROW > MAX_ROW_NARROW && VEC == 4 ? 2 : 1;
  GroupedKernel<T> kernel = decode_grouped_kernel<T, VEC, 32, CHUNKS, GROUP_TILE, MIN_BLOCKS, ROW>;
  if constexpr (ROW <= MAX_ROW_NARROW) {
    if ((head_dim + VEC - 1) / VEC <= 16)
      kernel = decode_grouped_kernel<T, VEC, 16, 1, GROUP_TILE, MIN_BLOCKS, ROW>;
  }
  return kernel;
}

// The tiles run_decode_grouped (decode_grouped.cu) launches: GROUP_TILE 1, 2, 4, 8 at head dims up
// to 128, 1, 2, 4 above.
extern template GroupedKernel<float> grouped_kernel<float, 1, 3, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<float> grouped_kernel<float, 2, 3, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<float> grouped_kernel<float, 4, 2, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<float> grouped_kernel<float, 8, 2, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<float> grouped_kernel<float, 1, 2, GROUPED_WIDE_ROW>(int head_dim);
extern template GroupedKernel<float> grouped_kernel<float, 2, 2, GROUPED_WIDE_ROW>(int head_dim);
extern template GroupedKernel<float> grouped_kernel<float, 4, 2, GROUPED_WIDE_ROW>(int head_dim);
extern template GroupedKernel<__half> grouped_kernel<__half, 1, 3, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<__half> grouped_kernel<__half, 2, 3, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<__half> grouped_kernel<__half, 4, 2, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<__half> grouped_kernel<__half, 8, 2, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<__half> grouped_kernel<__half, 1, 2, GROUPED_WIDE_ROW>(int head_dim);
extern template GroupedKernel<__half> grouped_kernel<__half, 2, 2, GROUPED_WIDE_ROW>(int head_dim);
extern template GroupedKernel<__half> grouped_kernel<__half, 4, 2, GROUPED_WIDE_ROW>(int head_dim);
extern template GroupedKernel<__nv_bfloat16> grouped_kernel<__nv_bfloat16, 1, 3, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<__nv_bfloat16> grouped_kernel<__nv_bfloat16, 2, 3, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<__nv_bfloat16> grouped_kernel<__nv_bfloat16, 4, 2, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<__nv_bfloat16> grouped_kernel<__nv_bfloat16, 8, 2, MAX_ROW_NARROW>(int head_dim);
extern template GroupedKernel<__nv_bfloat16> grouped_kernel<__nv_bfloat16, 1, 2, GROUPED_WIDE_ROW>(int head_dim);
extern template GroupedKernel<__nv_bfloat16> grouped_kernel<__nv_bfloat16, 2, 2, GROUPED_WIDE_ROW>(int head_dim);
extern template GroupedKernel<__nv_bfloat16> grouped_kernel<__nv_bfloat16, 4, 2, GROUPED_WIDE_ROW>(int head_dim);

}  // namespace attn_grouped
