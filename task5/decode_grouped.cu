// Task 5, beyond the course: grouped-query decode with every attention variant on CUDA cores;
// the host side (the layout choices, the launch, the merge of splits, decode_attention_grouped).
//
// The kernel, its idea and tile shape, and where its speed is measured are in
// decode_grouped.cuh; its instantiations are compiled in decode_grouped_fp32.cu, _fp16.cu and
// _bf16.cu.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

#include "attention_checks.cuh"
#include "attention_mask_host.cuh"
#include "decode_common.cuh"
#include "decode_grouped.cuh"
#include "device_query.cuh"

// The block shape, packs, Score<T>, the merge of split results and the layout checks.
using namespace attn_decode;

namespace {

// The tile constants, GroupedDecodeParams and grouped_kernel (decode_grouped.cuh).
using namespace attn_grouped;

// ---- host side: layout choices and launches (given) ---------------------------------------

// Launch decode_grouped_kernel with the group tile and lanes for this shape (more query heads
// per block hold more registers, so fewer blocks fit per SM).
template <typename T, int GROUP_TILE, int MIN_BLOCKS, int ROW = MAX_ROW_NARROW>
void launch_grouped_tile(const GroupedDecodeParams<T>& p, dim3 grid, cudaStream_t stream) {
  constexpr int kSmem = grouped_smem_bytes<T, ROW>();
  static_assert(kSmem + WARPS_PER_BLOCK * GROUP_TILE * ROW * sizeof(Score<T>) <= 227 * 1024,
                "the tiles and the warps' outputs fit an SM's shared memory");
  const GroupedKernel<T> kernel = grouped_kernel<T, GROUP_TILE, MIN_BLOCKS, ROW>(p.head_dim);
  // Above 48 KB a kernel must opt in to more dynamic shared memory (once per device).
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  attn::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem, device);
  kernel<<<grid, THREADS_PER_BLOCK, kSmem, stream>>>(p);
}

int grouped_tile_for(int group, int head_dim) {
  const int tile = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
  return head_dim > MAX_ROW_NARROW ? std::min(tile, GROUPED_WIDE_MAX_TILE) : tile;
}

template <typename T>
void run_decode_grouped(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        torch::Tensor& out, const attn::MaskParams& mask, int group,
                        int num_splits) {
  GroupedDecodeParams<T> p{decode_tensors<T>(q, k, v, out)};
  p.heads_q = static_cast<int>(q.size(1));
  p.heads_kv = static_cast<int>(k.size(1));
  p.group = group;
  p.head_dim = static_cast<int>(q.size(3));
  const int tile = grouped_tile_for(group, p.head_dim);
  p.head_chunks = attn::ceil_div(group, tile);
  p.mask = mask;
  p.score_scale = static_cast<Score<T>>(LOG2_E / std::sqrt(static_cast<double>(p.head_dim)));
  p.num_splits = num_splits;
  p.keys_per_split = (k.size(2) + num_splits - 1) / num_splits;

  const int64_t states = q.size(0) * q.size(1) * static_cast<int64_t>(num_splits);
  torch::Tensor workspace;
  if (num_splits > 1) {
    workspace = torch::empty({states * (p.head_dim + 2)}, q.options().dtype(score_dtype<T>()));
    p.partial_o = workspace.data_ptr<Score<T>>();
    p.partial_m = p.partial_o + states * p.head_dim;
    p.partial_l = p.partial_m + states;
  }
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(q.size(0) * p.heads_kv * p.head_chunks),
                  static_cast<unsigned>(num_splits));
  if (p.head_dim > MAX_ROW_NARROW) {  // rows of 256 elements, at most 4 heads per block
    switch (tile) {
      case 1: launch_grouped_tile<T, 1, 2, GROUPED_WIDE_ROW>(p, grid, stream); break;
      case 2: launch_grouped_tile<T, 2, 2, GROUPED_WIDE_ROW>(p, grid, stream); break;
      default: launch_grouped_tile<T, 4, 2, GROUPED_WIDE_ROW>(p, grid, stream); break;
    }
  } else {
    switch (tile) {
      case 1: launch_grouped_tile<T, 1, 3>(p, grid, stream); break;
      case 2: launch_grouped_tile<T, 2, 3>(p, grid, stream); break;
      case 4: launch_grouped_tile<T, 4, 2>(p, grid, stream); break;
      default: launch_grouped_tile<T, 8, 2>(p, grid, stream); break;
    }
  }
  attn::check_launch("decode_grouped_kernel");
  if (num_splits > 1) {  // the course kernel's merge (decode.cu), one block per query head
    combine_splits<T>({p.partial_o, p.partial_m, p.partial_l, p.out, p.out_stride_b,
                       p.out_stride_h, p.heads_q, p.num_splits, p.head_dim},
                      q.size(0) * q.size(1), stream);
  }
}

}  // namespace

// ---- entry point (declared in binding.cpp) -----------------------------------------------

// Beyond the course: one query per (batch, query head), q [B, H_q, 1, D], against k/v
// [B, H_kv, S, D] (H_q a multiple of H_kv), with every attention variant of
// common/variants.py (the query is at position key_end - 1 of its sequence). The query heads
// of a KV head share one pass over its keys. Returns [B, H_q, 1, D].
torch::Tensor decode_attention_grouped(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                       bool causal, std::optional<int64_t> window, int64_t stride,
                                       std::optional<torch::Tensor> mask,
                                       std::optional<torch::Tensor> key_lengths,
                                       bool left_padding, int64_t num_splits,
                                       std::optional<torch::Tensor> out) {
  check_decode_qkv(q, k, v, "[batch, kv_heads, seq, head_dim]");
  TORCH_CHECK_VALUE(q.size(2) == 1, attn::str("decode attends one new query per sequence: q must be [batch, "
                    "heads, 1, head_dim] but has shape ", q.sizes(), "; use task 4's flash_attention for "
                    "several queries."));
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3),
                    attn::str("k and v must both be [batch, kv_heads, seq, head_dim] with q's batch and "
                    "head_dim; got q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(), "."));
  attn::check_nonempty(q, "q");
  attn::check_nonempty(k, "k");
  const int group = attn::kv_group_size(q, k);
  attn::check_head_dim(q.size(3));
  TORCH_CHECK_VALUE(q.size(0) * k.size(1) * attn::ceil_div(group, 8) <= std::numeric_limits<int32_t>::max()
                    && k.size(2) <= std::numeric_limits<int32_t>::max() / 2,
                    attn::str("batch * kv_heads and seq must fit in 31 bits."));
  TORCH_CHECK_VALUE(num_splits >= 1 && num_splits <= MAX_SPLITS, attn::str("num_splits must be in [1, ",
                    MAX_SPLITS, "] but is ", num_splits, "."));
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(v, "v");
  check_out_like_q(out, q);
  // Scores are in base 2 ((q . k) * log2(e)/sqrt(D)): an additive mask value is multiplied
  // by log2(e).
  const attn::MaskParams mask_params = attn::make_mask_params(
      q, k, causal, window, stride, mask, key_lengths, left_padding, static_cast<float>(LOG2_E));
  c10::cuda::CUDAGuard guard(q.device());
  // 16-byte loads only: a view that does not allow them is copied once (rare; a clone, so that a
  // contiguous view with a misaligned start is copied too, where contiguous() returns it as is;
  // head dims are multiples of 8, so the copy's rows start on 16-byte boundaries).
  const bool wide = can_load_16_bytes(q, k, v);
  const torch::Tensor qa = wide ? q : attn::with_16_byte_rows(q);
  const torch::Tensor ka = wide ? k : attn::with_16_byte_rows(k);
  const torch::Tensor va = wide ? v : attn::with_16_byte_rows(v);
  torch::Tensor result = out.has_value() ? *out : torch::empty(q.sizes(), q.options());
  const int splits = static_cast<int>(num_splits);
  switch (q.scalar_type()) {
    case torch::kFloat32: run_decode_grouped<float>(qa, ka, va, result, mask_params, group, splits); break;
    case torch::kFloat16: run_decode_grouped<__half>(qa, ka, va, result, mask_params, group, splits); break;
    default: run_decode_grouped<__nv_bfloat16>(qa, ka, va, result, mask_params, group, splits); break;
  }
  return result;
}
