// What task 5's attention decode kernels share: one block shape, K/V/q rows moved as 16-byte
// packs, the type the scores are kept in (Score<T>), the partial results of a split decode
// and the one merge that turns them into outputs, and the host's layout checks.
//
// The decode ideas, one file each:
//   decode.cu          the course: update_kv_cache, and decode_split_kernel, one query row per
//                      (batch, head) against the cache, its keys split across blocks
//                      (FlashDecoding); and the merges of split results every decode path
//                      uses: combine_splits (partial states o, m, l in Score<T>: the course's
//                      kernel and decode_grouped.cu) and merge_lse_splits (normalised
//                      outputs and their log-sum-exp: decode_gqa.cu, and task 4's kernel with
//                      the query heads of a KV head as its rows, merge_attention_splits);
//   decode_grouped.cu  beyond the course: the query heads of a KV head decoded by one block
//                      on CUDA cores, reading the KV head's cache once, with every attention
//                      variant (common/csrc/attention_mask.cuh); fp32, and what decode_gqa.cu
//                      does not take;
//   decode_gqa.cu      beyond the course: grouped-query decode on tensor cores, built for the
//                      memory system (the query heads of a KV head as the rows of one mma
//                      tile, split-KV, a multi-stage cp.async pipeline per warp), fp16/bf16,
//                      every variant, up to 16 query rows per sequence;
//   decode_paged.cu    beyond the course: the paged KV cache, pages [num_pages, page_size,
//                      H_kv, D] read through a block table (its address policy in
//                      decode_paged.cuh): decode_gqa.cu's kernel and launch with that policy,
//                      so its splits are merged as decode_gqa.cu's are; the append of new
//                      tokens is rope_append.cu's kernel with the same policy.
// Each file opens with its idea and tile shape; their speed is measured by task5/test.py
// (--decode, --gqa-bench) and shown in Results.md, rendered from results/<gpu>.json.
//
// Everything here is in namespace attn_decode: a named namespace, because decode.cu's merges
// are called from the other files (combine_splits, merge_lse_splits), so their argument types
// must be one type in every file. A .cu file opens it with `using namespace attn_decode;`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "tensor_api.h"

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "attention_checks.cuh"
#include "device_values.cuh"

namespace attn_decode {

constexpr int MAX_HEAD_DIM = attn::kMaxHeadDim;  // registers and shared memory are sized for it (common/limits.py)
constexpr int WARP_SIZE = 32;
constexpr int WARPS_PER_BLOCK = 4;
constexpr int THREADS_PER_BLOCK = WARPS_PER_BLOCK * WARP_SIZE;
constexpr int MAX_SPLITS = 1024;        // more splits than this only add combine work
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr double LOG2_E = 1.4426950408889634;

// A position or length read at run time (RuntimeInt), and the fp32 conversions:
// device_values.cuh, shared with the other task 5 kernels.
using attn::from_float;
using attn::RuntimeInt;
using attn::runtime_int;
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

// The torch dtype of Score<T> (the partial results of a split decode).
template <typename T>
constexpr torch::ScalarType score_dtype() {
  return std::is_same_v<Score<T>, double> ? torch::kFloat64 : torch::kFloat32;
}

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

// DecodeTensors of q, k, v and out (checked tensors of element type T).
template <typename T>
DecodeTensors<T> decode_tensors(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, torch::Tensor& out) {
  return {reinterpret_cast<const T*>(q.data_ptr()), reinterpret_cast<const T*>(k.data_ptr()),
          reinterpret_cast<const T*>(v.data_ptr()), reinterpret_cast<T*>(out.data_ptr()),
          q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
          v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1)};
}

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

// Merge each row's splits into its output (combine_splits_kernel, one block per row). Defined
// in decode.cu, where the course's decode kernel merges its own splits the same way
// (merge_split_states), for T = float, __half and __nv_bfloat16; raises if the launch fails.
template <typename T>
void combine_splits(const SplitStates<T>& states, int64_t rows, cudaStream_t stream);

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

// Merge float32 partials by their lse into out (merge_splits_kernel in decode.cu, one block per
// row: B * H_kv * rows blocks), for T = float, __half and __nv_bfloat16; raises if the launch
// fails. The one merge of this form: merge_attention_splits (the binding) launches it too.
template <typename T>
void merge_lse_splits(const MergeParams<T, float>& params, int64_t rows, cudaStream_t stream);

// Zeroed counters for the merges in a split's last block, `count` of them (decode.cu): the
// decode kernels that merge their own splits take one per group of splits, and leave it zeroed.
// nullptr inside a CUDA graph capture before the first allocation, past the capacity, or with
// ATTN_DECODE_COMBINE_KERNEL=1: then a merge kernel runs instead.
int* split_counters(cudaStream_t stream, int64_t count);

// The merges in a split's last block (decode.cu's merge_in_last_block, decode_gqa.cu's). Called
// by thread 0 after a __syncthreads() that follows the block's writes: publishes them,
// counts the block on *counter, and answers whether it was the last of `blocks` (after which
// the other blocks' writes are visible to it). One thread fences, acquire-release, instead of a
// __threadfence() (sequentially consistent) in every thread: task 6's bf16 decode step was
// slightly faster so (task6/NOTES.md). fence.acq_rel needs Volta (sm_70) or later.
__device__ __forceinline__ bool count_block_is_last(int* counter, int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // this block's writes, then the count
  const bool last = atomicAdd(counter, 1) == blocks - 1;
  if (last) asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // the count, then their writes
#else
  __threadfence();
  const bool last = atomicAdd(counter, 1) == blocks - 1;
  if (last) __threadfence();
#endif
  return last;
}

// ---- host side: layout checks ----------------------------------------------------------------

inline void check_float_dtype(const torch::Tensor& t, const char* name) {
  attn::check_dtype(t, name, {torch::kFloat32, torch::kFloat16, torch::kBFloat16});
}

using attn::check_last_dim_contiguous;

// q [batch, heads, 1, head_dim] and k, v 4-d (`kv_layout` names their dimensions): CUDA
// tensors of one float dtype.
inline void check_decode_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const char* kv_layout) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    attn::check_cuda_tensor(*t, name);
  }
  check_float_dtype(q, "q");
  attn::check_same(q, "q", k, "k");
  attn::check_same(q, "q", v, "v");
  attn::check_dim(q, "q", 4, "[batch, heads, 1, head_dim]");
  attn::check_dim(k, "k", 4, kv_layout);
  attn::check_dim(v, "v", 4, kv_layout);
}

// `out`, when given, must be a CUDA tensor of q's dtype and shape with a contiguous last dim.
inline void check_out_like_q(const std::optional<torch::Tensor>& out, const torch::Tensor& q) {
  if (!out.has_value()) return;
  attn::check_cuda_tensor(*out, "out");
  attn::check_same(q, "q", *out, "out");
  TORCH_CHECK_VALUE(out->sizes() == q.sizes(), attn::str("out has shape ", out->sizes(), " but must be ",
                    q.sizes(), " like q."));
  check_last_dim_contiguous(*out, "out");
}

inline bool pointer_aligned(const void* ptr, int64_t unit) {
  return reinterpret_cast<std::uintptr_t>(ptr) % static_cast<std::uintptr_t>(unit) == 0;
}

// A dimension of size 1 is only ever indexed at 0, so its stride does not matter.
inline bool stride_multiple(const torch::Tensor& t, int dim, int64_t elems) {
  return t.size(dim) == 1 || t.stride(dim) % elems == 0;
}

// Can q/k/v be read as 16-byte packs (VEC elements)? head_dim, every base pointer and every
// stride that is used must be multiples of VEC elements; otherwise the scalar path runs (the
// course's kernel) or the tensors are copied once (the grouped kernel).
inline bool can_load_16_bytes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t vec = 16 / q.element_size();
  if (q.size(3) % vec != 0) return false;
  for (const torch::Tensor* t : {&q, &k, &v}) {
    if (!pointer_aligned(t->data_ptr(), 16)) return false;
    for (int dim = 0; dim < 3; ++dim) {
      if (!stride_multiple(*t, dim, vec)) return false;
    }
  }
  return true;
}

}  // namespace attn_decode
