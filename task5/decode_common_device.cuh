// The device side of decode_common.cuh, without a torch header: the block shape, 16-byte packs,
// Score<T>, the tensors of a decode (DecodeTensors), the partial results of a split decode
// (SplitStates, MergeParams) and the count of a split's last block. The kernel headers include
// it (decode_grouped.cuh, decode_gqa.cuh), so that the files that compile their instantiations
// (decode_grouped_fp32.cu, decode_gqa_fp16.cu, ...) parse no torch header; a host file includes
// decode_common.cuh (the decode files, their merges and layout checks), which includes this one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device_inline.cuh"

#ifndef ATTN_MAX_HEAD_DIM
#error "ATTN_MAX_HEAD_DIM is undefined: build through common.build (python -m task5.compile), which passes common/limits.py's values"
#endif

namespace attn_decode {

constexpr int MAX_HEAD_DIM = ATTN_MAX_HEAD_DIM;  // registers and shared memory are sized for it (common/limits.py)
constexpr int WARP_SIZE = 32;
constexpr int WARPS_PER_BLOCK = 4;
constexpr int THREADS_PER_BLOCK = WARPS_PER_BLOCK * WARP_SIZE;
constexpr int MAX_SPLITS = 1024;        // more splits than this only add combine work
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr double LOG2_E = 1.4426950408889634;

// A position or length read at run time (RuntimeInt), and the fp32 conversions:
// device_inline.cuh, shared with the other task 5 kernels.
using attn::from_float;
using attn::RuntimeInt;
using attn::to_float;

// VEC consecutive elements of type T moved as one access, kept as the raw bits of an integer
// vector (16 bytes: uint4) until they are converted to floats. Zeroing a whole raw vector (a
// key past the end) is 2 instructions; zeroing 8 separate halves compiled to 16 byte permutes.
template <int BYTES> struct RawBits;
template <> struct RawBits<16> { using type = uint4; };
template <> struct RawBits<8> { using type = uint2; };
template <> struct RawBits<4> { using type = unsigned; };
template <> struct RawBits<2> { using type = unsigned short; };
template <typename T, int VEC>
using Pack = typename RawBits<sizeof(T) * VEC>::type;

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_pack(const T* ptr) {
  return *reinterpret_cast<const Pack<T, VEC>*>(ptr);
}

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> zero_pack() {
  return Pack<T, VEC>{};  // all bits 0: 0.0 in fp32, fp16 and bf16
}

// The VEC elements of a pack as floats; pairs of 16-bit values convert in one step.
template <typename T, int VEC>
__device__ __forceinline__ void unpack(const Pack<T, VEC>& p, float (&f)[VEC]) {
  if constexpr (std::is_same_v<T, __half> && VEC % 2 == 0) {
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      const float2 t = __half22float2(reinterpret_cast<const __half2*>(&p)[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  } else if constexpr (std::is_same_v<T, __nv_bfloat16> && VEC % 2 == 0) {
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      const float2 t = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(&p)[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) f[e] = to_float(reinterpret_cast<const T*>(&p)[e]);
  }
}

// The type of the scores, the softmax state (running max m and sum l) and the unnormalised
// output: double for fp32, float for fp16/bf16. An fp32 score rounded to float is already as
// wrong as PyTorch's own fp32 attention (half an ulp of q . k is up to 1e-5 in logit units at
// large logits), so an fp32 decode in float could only match PyTorch's error, not beat it. In
// double, q . k is exact far below that (a product of two floats is exact in a double), the
// largest score minus the max is exactly 0 (its weight is exactly 1, as in PyTorch's
// softmax), and the sums and merges add no rounding of their own: the output is rounded to
// float once, at the end, so its error is that one rounding, which no float result beats.
// Only the weights exp2(s - m) stay float (exp2f). Decode reads each K and V element from
// memory once, so the double arithmetic costs no time; 16-bit inputs round far more than a
// float sum does (task4/NOTES.md, "fp32 accuracy at large logits").
template <typename T>
using Score = std::conditional_t<std::is_same_v<T, float>, double, float>;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// ---- the tensors of a decode -----------------------------------------------------------------

// The pointers of a decode's tensors and their strides in elements (the last dimension is
// contiguous): q and out [B, H_q, 1, D], k and v [B, H_kv, S_max, D] (H_kv = H_q in the
// course's decode). The kernels' parameters (DecodeParams, GroupedDecodeParams) start with it.
template <typename T>
struct DecodeTensors {
  const T* q;
  const T* k;
  const T* v;
  T* out;
  int64_t q_stride_b, q_stride_h;
  int64_t k_stride_b, k_stride_h, k_stride_s;
  int64_t v_stride_b, v_stride_h, v_stride_s;
  int64_t out_stride_b, out_stride_h;
};

// ---- the merge of split results --------------------------------------------------------------

// A split decode's partial results: for each row (a (batch, query head), row = b * heads + h)
// and each of its num_splits key ranges, the unnormalised output o = sum exp2(s - m) v, the
// range's max score m (base 2; -inf for a range without keys) and l = sum exp2(s - m), all
// Score<T>; and the output rows they merge into. The names are DecodeParams' (decode.cu).
template <typename T>
struct SplitStates {
  const Score<T>* partial_o;   // [rows, num_splits, head_dim]
  const Score<T>* partial_m;   // [rows, num_splits]
  const Score<T>* partial_l;   // [rows, num_splits]
  T* out;                      // row b * heads + h at out + b * out_stride_b + h * out_stride_h
  int64_t out_stride_b, out_stride_h;
  int heads, num_splits, head_dim;
};

// The other form of partial results: each key range's NORMALISED output and its base-2
// log-sum-exp, what the grouped decodes on tensor cores write (decode_gqa.cu, and task 4's
// kernel with a KV head's query heads as rows). partial [B, H_kv, num_splits, rows, head_dim]
// and lse [B, H_kv, num_splits, rows], contiguous, rows = group * seq_q (row r = i * group +
// g: query i of query head g of the KV head; seq_q = 1 for one new token); out row (b, h, i)
// at out + b * out_stride_b + h * out_stride_h + i * out_stride_s. A range whose lse is -inf
// (no visible key) adds nothing; a row without any gets zeros.
template <typename T, typename Partial = T>
struct MergeParams {
  const Partial* partial;  // q's dtype, or float32 (no rounding before the merge)
  const float* lse;
  T* out;
  int64_t out_stride_b, out_stride_h;
  int heads_q, group, num_splits, head_dim;
  int seq_q = 1;
  int64_t out_stride_s = 0;
};

// The merges in a split's last block(s) (decode.cu's merge_in_last_block, decode_gqa.cu's).
// Called by thread 0 after a __syncthreads() that follows the block's writes: publishes them,
// counts the block on *counter and answers its place in the count, 0 .. blocks - 1 (blocks - 1
// for the last, after which the other blocks' writes are visible to it). One thread fences,
// acquire-release, instead of a __threadfence() (sequentially consistent) in every thread: task
// 6's bf16 decode step was slightly faster so (task6/NOTES.md). fence.acq_rel needs Volta
// (sm_70) or later.
__device__ __forceinline__ int count_block_ticket(int* counter, int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // this block's writes, then the count
  const int ticket = atomicAdd(counter, 1);
  if (ticket == blocks - 1) asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // the count, then their writes
#else
  __threadfence();
  const int ticket = atomicAdd(counter, 1);
  if (ticket == blocks - 1) __threadfence();
#endif
  return ticket;
}

// Was this block the last of `blocks` to count (count_block_ticket)?
__device__ __forceinline__ bool count_block_is_last(int* counter, int blocks) {
  return count_block_ticket(counter, blocks) == blocks - 1;
}

}  // namespace attn_decode
