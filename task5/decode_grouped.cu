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
// Measured speed (GB/s, the fraction of copy bandwidth, against SDPA with enable_gqa, as
// CUDA-graph replays): python -m task5.test --gqa-bench; Results.md ("Grouped-query decode",
// the "CUDA cores (grouped kernel)" row), rendered from results/<gpu>.json.
//
// The kernel and its launch are templates in decode_grouped.cuh, instantiated per element type
// in decode_grouped_fp32.cu, _fp16.cu and _bf16.cu (compiled in parallel); this file holds the
// entry point, its checks and the split workspace.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "attention_checks.cuh"
#include "attention_mask.cuh"
#include "decode_common.cuh"
#include "decode_grouped.cuh"

namespace {

// ---- host side: layout choices and launches (given) ---------------------------------------

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
  launch_decode_grouped(p, tile, grid, stream);  // decode_grouped_<dtype>.cu
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
  // 16-byte loads only: a view that does not allow them is copied once (rare).
  const bool wide = can_load_16_bytes(q, k, v);
  const torch::Tensor qa = wide ? q : q.contiguous();
  const torch::Tensor ka = wide ? k : k.contiguous();
  const torch::Tensor va = wide ? v : v.contiguous();
  torch::Tensor result = out.has_value() ? *out : torch::empty(q.sizes(), q.options());
  const int splits = static_cast<int>(num_splits);
  switch (q.scalar_type()) {
    case torch::kFloat32: run_decode_grouped<float>(qa, ka, va, result, mask_params, group, splits); break;
    case torch::kFloat16: run_decode_grouped<__half>(qa, ka, va, result, mask_params, group, splits); break;
    default: run_decode_grouped<__nv_bfloat16>(qa, ka, va, result, mask_params, group, splits); break;
  }
  return result;
}
