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
// decode_grouped and decode_gqa keep the kernel in a header (decode_grouped.cuh, decode_gqa.cuh,
// which open with the idea), the host side in the .cu, and compile the instantiations one element
// type per file (decode_grouped_fp32.cu, decode_gqa_fp16.cu, ...), so the build runs them side
// by side. Each file opens with its idea and tile shape; their speed is measured by task5/test.py
// (--decode, --gqa-bench) and shown in Results.md, rendered from results/<gpu>.json.
//
// Everything here is in namespace attn_decode: a named namespace, because decode.cu's merges
// are called from the other files (combine_splits, merge_lse_splits), so their argument types
// must be one type in every file. A .cu file opens it with `using namespace attn_decode;`.
// What the kernels use is in decode_common_device.cuh (no torch header: the kernel headers and
// the files that compile their instantiations include it alone); this header adds the host side.
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
#include "attention_mask.cuh"
#include "decode_common_device.cuh"
#include "decode_paged.cuh"
#include "device_values.cuh"

namespace attn_decode {

// The device side (the block shape, packs, Score<T>, DecodeTensors, SplitStates, MergeParams,
// count_block_is_last): decode_common_device.cuh.

using attn::runtime_int;

// The torch dtype of Score<T> (the partial results of a split decode).
template <typename T>
constexpr torch::ScalarType score_dtype() {
  return std::is_same_v<Score<T>, double> ? torch::kFloat64 : torch::kFloat32;
}

// DecodeTensors of q, k, v and out (checked tensors of element type T).
template <typename T>
DecodeTensors<T> decode_tensors(const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, torch::Tensor& out) {
  return {reinterpret_cast<const T*>(q.data_ptr()), reinterpret_cast<const T*>(k.data_ptr()),
          reinterpret_cast<const T*>(v.data_ptr()), reinterpret_cast<T*>(out.data_ptr()),
          q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
          v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1)};
}

// ---- the merges of split results (defined in decode.cu) -------------------------------------

// Merge each row's splits into its output (combine_splits_kernel, one block per row). Defined
// in decode.cu, where the course's decode kernel merges its own splits the same way
// (merge_split_states), for T = float, __half and __nv_bfloat16; raises if the launch fails.
template <typename T>
void combine_splits(const SplitStates<T>& states, int64_t rows, cudaStream_t stream);

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

// ---- the paged KV cache (decode_paged.cuh): decode_paged.cu fills it, decode_gqa.cu launches --

// Checks k_pages, v_pages [num_pages, page_size, H_kv, D] (contiguous, `like`'s dtype and
// device, head_dim D), the page size, block_table [B, max_pages] int32 on the device; returns
// the kernels' view. Raises a sentence for each mistake.
PagedKv paged_kv(const torch::Tensor& k_pages, const torch::Tensor& v_pages,
                 const torch::Tensor& block_table, const torch::Tensor& like, int64_t batch,
                 int64_t head_dim);

// decode_gqa.cu's kernel through the block table (PagedKv): q [B, H_q, S_q, D] against the
// pages, with `mask` (seq_k = max_pages * page_size, key lengths = seq_lens) and the score
// transforms already set. Defined in decode_gqa.cu, beside the contiguous launch.
torch::Tensor launch_decode_gqa_paged(const torch::Tensor& q, const PagedKv& pages, int64_t heads_kv,
                                      const attn::MaskParams& mask, double scale, int64_t num_splits,
                                      std::optional<torch::Tensor> out);

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
