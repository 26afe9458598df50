// Task 5, beyond the course: decode through a paged KV cache (issue 32, part 3).
//
// The idea. The cache is cut into pages of page_size tokens, k_pages and v_pages
// [num_pages, page_size, H_kv, D], and each sequence's pages are listed in its row of a block
// table [B, max_pages] (vLLM's PagedAttention, FlashAttention-2's block_table): a sequence
// holds only the pages its length needs, pages freed by a finished sequence serve the next,
// and no cache is sized for the longest sequence. decode_paged.cuh describes the layout and
// the address policy (PagedKv): key t of sequence b is row t % page_size of page
// block_table[b][t / page_size].
//
// Tile shape and why. None of its own: the decode is task5/decode_gqa.cu's kernel, the same
// body (the query heads of a KV head, times S_q <= 16 query rows, as the 16 rows of an
// mma.sync tile; split-KV; a cp.async ring per warp), instantiated with the paged
// address policy, so every variant the contiguous decode takes comes along: key lengths
// (seq_lens, read on the device, so a captured CUDA graph stays valid as they grow and as
// pages are added to the table), bottom-right causal S_q > 1 (a prefill chunk, speculative
// decoding's rows), a sliding window that reads only the window's pages, strides, masks,
// softcap, sinks and scale. The only cost a page adds is one block-table lookup per K/V row
// a warp copies (an L1-resident int32), issued with the row's cp.async; a page of >= 16
// tokens is whole 16-key tiles of the kernel, so the copies stay 16-byte row pieces.
// This file holds the argument checks and the entry point; the launch (split partials and
// their merge) is decode_gqa.cu's, shared with the contiguous cache. The append of new tokens
// (RoPE fused) is rope_append.cu's kernel with the same policy (rope_append_paged).
//
// Measured: python -m task5.test --paged checks it against float64; its speed against the
// contiguous cache is not measured yet.

#include <c10/cuda/CUDAGuard.h>
#include "tensor_api.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include "attention_checks.cuh"
#include "attention_mask_host.cuh"
#include "decode_common.cuh"
#include "decode_paged.cuh"

using namespace attn_decode;

namespace attn_decode {

PagedKv paged_kv(const torch::Tensor& k_pages, const torch::Tensor& v_pages,
                 const torch::Tensor& block_table, const torch::Tensor& like, int64_t batch,
                 int64_t head_dim) {
  const char* layout = "[num_pages, page_size, kv_heads, head_dim]";
  for (const auto& [t, name] : {std::pair{&k_pages, "k_pages"}, std::pair{&v_pages, "v_pages"},
                                std::pair{&block_table, "block_table"}}) {
    attn::check_cuda_tensor(*t, name);
    TORCH_CHECK_VALUE(t->device() == like.device(), attn::str(name, " is on ", t->device(), " but q is on ",
                      like.device(), "; put them on the same GPU."));
  }
  attn::check_same(like, "q", k_pages, "k_pages");
  attn::check_same(like, "q", v_pages, "v_pages");
  attn::check_dim(k_pages, "k_pages", 4, layout);
  attn::check_dim(v_pages, "v_pages", 4, layout);
  TORCH_CHECK_VALUE(k_pages.sizes() == v_pages.sizes(), attn::str("k_pages and v_pages must have one "
                    "shape ", layout, " but are ", k_pages.sizes(), " and ", v_pages.sizes(), "."));
  attn::check_nonempty(k_pages, "k_pages");
  const int64_t num_pages = k_pages.size(0), page_size = k_pages.size(1);
  TORCH_CHECK_VALUE(k_pages.size(3) == head_dim, attn::str("k_pages and v_pages hold head_dim ",
                    k_pages.size(3), " but q has head_dim ", head_dim, "; they must match."));
  TORCH_CHECK_VALUE(page_size >= kMinPageSize && page_size <= kMaxPageSize &&
                    (page_size & (page_size - 1)) == 0,
                    attn::str("page_size (k_pages.shape[1]) must be 16, 32, 64, 128 or 256 but is ",
                              page_size, "."));
  attn::check_contiguous(k_pages, "k_pages");
  attn::check_contiguous(v_pages, "v_pages");
  TORCH_CHECK_VALUE(pointer_aligned(k_pages.data_ptr(), 16) && pointer_aligned(v_pages.data_ptr(), 16),
                    "k_pages and v_pages must start on 16-byte boundaries (a fresh tensor does; a "
                    "view that starts mid-row does not); pass .clone() of the view.");
  TORCH_CHECK_VALUE(num_pages <= std::numeric_limits<int32_t>::max(), attn::str("k_pages has ",
                    num_pages, " pages; page ids are int32."));

  TORCH_CHECK_TYPE(block_table.scalar_type() == torch::kInt32, attn::str("block_table must be an int32 "
                   "tensor but has dtype ", block_table.scalar_type(), "; create it with dtype=torch.int32."));
  attn::check_dim(block_table, "block_table", 2, "[batch, max_pages]");
  TORCH_CHECK_VALUE(block_table.size(0) == batch && block_table.size(1) >= 1,
                    attn::str("block_table must be [batch, max_pages] = [", batch, ", >= 1] (one row of "
                              "page ids per sequence) but has shape ", block_table.sizes(), "."));
  TORCH_CHECK_VALUE(block_table.stride(1) == 1, "block_table's rows must be contiguous (stride 1 "
                    "along max_pages); pass block_table.contiguous().");
  const int64_t max_pages = block_table.size(1);
  TORCH_CHECK_VALUE(max_pages * page_size <= std::numeric_limits<int32_t>::max() / 2,
                    attn::str("block_table's ", max_pages, " pages of ", page_size, " tokens are too "
                              "many keys for 32-bit key indices."));

  PagedKv pages{};
  pages.k_pages = k_pages.data_ptr();
  pages.v_pages = v_pages.data_ptr();
  pages.block_table = block_table.data_ptr<int32_t>();
  pages.table_stride = block_table.stride(0);
  pages.max_pages = static_cast<int>(max_pages);
  pages.num_pages = static_cast<int>(num_pages);
  int shift = 0;
  while ((int64_t{1} << shift) < page_size) ++shift;
  pages.page_shift = shift;
  pages.page_stride = k_pages.stride(0);
  pages.row_stride = k_pages.stride(1);
  pages.head_stride = k_pages.stride(2);
  return pages;
}

}  // namespace attn_decode

// Beyond the course: softmax(q k^T * scale) v for S_q <= 16 query rows per (batch, query head),
// q [B, H_q, S_q, D] (fp16 or bf16), against the paged cache k_pages, v_pages
// [num_pages, page_size, H_kv, D] through block_table [B, max_pages] int32: sequence b has
// seq_lens[b] keys ([B] int32 on the GPU, read there and clamped to [0, max_pages *
// page_size]), and its queries are its last S_q positions (bottom-right causal). Every
// variant of common/variants.py but left padding. Returns [B, H_q, S_q, D] (or `out`).
torch::Tensor decode_attention_paged(torch::Tensor q, torch::Tensor k_pages, torch::Tensor v_pages,
                                     torch::Tensor block_table, torch::Tensor seq_lens, bool causal,
                                     std::optional<int64_t> window, int64_t stride,
                                     std::optional<torch::Tensor> mask, std::optional<double> softcap,
                                     std::optional<torch::Tensor> sinks, std::optional<double> scale,
                                     int64_t num_splits, std::optional<torch::Tensor> out) {
  attn::check_cuda_tensor(q, "q");
  attn::check_dtype(q, "q", {torch::kHalf, torch::kBFloat16});
  attn::check_dim(q, "q", 4, "[batch, heads, seq_q, head_dim]");
  attn::check_nonempty(q, "q");
  const int64_t batch = q.size(0), heads_q = q.size(1), head_dim = q.size(3);
  const PagedKv pages = paged_kv(k_pages, v_pages, block_table, q, batch, head_dim);
  const int64_t heads_kv = k_pages.size(2);
  TORCH_CHECK_VALUE(heads_q % heads_kv == 0, attn::str("q has ", heads_q, " heads and the pages ", heads_kv,
                    " KV heads: grouped-query attention needs the query heads to be a multiple of the "
                    "KV heads (query head h reads KV head h / (H_q / H_kv))."));
  if (out.has_value()) {
    // Other blocks still read q and the pages while a block writes its rows.
    TORCH_CHECK_VALUE(!out->is_alias_of(q) && !out->is_alias_of(k_pages) && !out->is_alias_of(v_pages),
                      "out shares memory with q, k_pages or v_pages; pass a separate tensor.");
  }
  const int64_t capacity = static_cast<int64_t>(pages.max_pages) << pages.page_shift;
  const double scale_value = attn::softmax_scale(scale, head_dim);
  // seq_lens are the key lengths (right-aligned: the keys of sequence b are 0 .. seq_lens[b] - 1).
  attn::MaskParams mask_params = attn::make_mask_params(q, capacity, causal, window, stride, mask,
                                                        seq_lens, false, static_cast<float>(1.0 / scale_value));
  const std::optional<torch::Tensor> sink_values =
      attn::set_score_transforms(mask_params, q, softcap, sinks, scale_value);
  return launch_decode_gqa_paged(q, pages, heads_kv, mask_params, scale_value, num_splits, std::move(out));
}
