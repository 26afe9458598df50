// Task 5, beyond the course: grouped-query decode on tensor cores; the host side (the
// configuration per head dim and GPU, the checks, the launch, and the entries
// decode_attention_gqa and decode_gqa_geometry; the paged cache's launch, for decode_paged.cu).
//
// The kernel, its idea and tile shape, and where its speed is measured are in decode_gqa.cuh;
// its instantiations are compiled in decode_gqa_fp16.cu and decode_gqa_bf16.cu.

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_checks.cuh"
#include "attention_mask_host.cuh"
#include "decode_common.cuh"
#include "decode_gqa.cuh"
#include "device_query.cuh"

// MAX_SPLITS, the merge of split results (merge_lse_splits), the layout checks.
using namespace attn_decode;

namespace {

// The configurations, GqaParams, ContiguousKv and gqa_kernel (decode_gqa.cuh).
using namespace attn_gqa;

// ---- host side: configuration, checks and launch (given) ---------------------------------

// The shared memory a block of `device` may opt in to.
int optin_shared_memory(int device) {
  return attn::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
}

// Above 48 KB a kernel must opt in to more dynamic shared memory (attn::allow_dynamic_smem,
// once per device); false if the GPU has less shared memory per block than the configuration
// needs (sm_86/89: 99 KB), or is older than sm_80 (no cp.async, no bf16 mma.sync).
template <typename Element, typename Cfg, typename KvLayout = ContiguousKv>
bool prepare_kernel(int device) {
  const int major = attn::device_attribute(cudaDevAttrComputeCapabilityMajor, device);
  if (major < 8 || optin_shared_memory(device) < Cfg::kSmemBytes) return false;
  attn::allow_dynamic_smem(reinterpret_cast<const void*>(gqa_kernel<Element, Cfg, KvLayout>()),
                           Cfg::kSmemBytes, device);
  if constexpr (kCanWalk<Cfg>) {  // the persistent grid's kernel: the same shared memory
    attn::allow_dynamic_smem(reinterpret_cast<const void*>(gqa_kernel<Element, GqaWalk<Cfg>, KvLayout>()),
                             Cfg::kSmemBytes, device);
  }
  if constexpr (std::is_same_v<KvLayout, ContiguousKv> && !Cfg::kMaskVote && kCanVote<Cfg>) {
    prepare_kernel<Element, GqaMaskVote<Cfg>, KvLayout>(device);  // and the mask vote's
  }
  return true;
}

// Call fn with a null pointer of the configuration type for head_dim on `device` (the smallest
// that holds it; at head dim 128 the compact one where GqaD128 does not fit).
template <typename Fn>
decltype(auto) with_config(int64_t head_dim, int device, Fn&& fn) {
  if (head_dim <= 64) return fn(static_cast<GqaD64*>(nullptr));
  if (head_dim <= 96) return fn(static_cast<GqaD96*>(nullptr));
  if (head_dim <= 128) {
    if (optin_shared_memory(device) >= GqaD128::kSmemBytes) return fn(static_cast<GqaD128*>(nullptr));
    return fn(static_cast<GqaD128Compact*>(nullptr));
  }
  return fn(static_cast<GqaD256*>(nullptr));
}

// Call fn with a null pointer of the element type of q.
template <typename Fn>
decltype(auto) with_element(const torch::ScalarType dtype, Fn&& fn) {
  if (dtype == torch::kHalf) return fn(static_cast<__half*>(nullptr));
  return fn(static_cast<__nv_bfloat16*>(nullptr));
}

// out's rows can take 16-byte stores (GqaParams::out_vec16).
bool rows_aligned_16(const torch::Tensor& t) {
  if (!pointer_aligned(t.data_ptr(), 16)) return false;
  for (int dim = 0; dim < 3; ++dim) {
    if (!stride_multiple(t, dim, 8)) return false;
  }
  return true;
}

// The kernel's blocks resident at once on `device` (looked up once per device).
template <typename Element, typename Cfg, typename KvLayout>
int64_t resident_blocks(int device) {
  const void* kernel = reinterpret_cast<const void*>(gqa_kernel<Element, Cfg, KvLayout>());
  return std::max(1, attn::resident_blocks(kernel, Cfg::kThreads, Cfg::kSmemBytes, device));
}

// How many blocks of a row tile merge its splits (GqaParams::merge_blocks, merge_in_last_block):
// a waiting merger gains where a row tile has many splits' partials to read and costs where the
// splits' blocks finish far apart (long key ranges) or where it holds an SM that the next
// overlapped kernel would use (few splits), as measured (results/logs/h100_s9_decode_mergers/):
// so more than one only for key ranges of at most kMergeWaitMaxKeys keys (the cache's capacity
// or the window, over the splits), one per 4 splits, at most one row each, and only where the
// whole grid is resident at once: the first mergers wait for the last block to count, so a
// waiting merger must never hold the SM that block needs. (It waits only for blocks of its own
// row tile, which the GPU dispatches in index order before any later tile's, so fewer SMs
// than mergers would be needed to stall it; the residency bound is kept as a margin, for
// instance where an MPS partition leaves the process fewer SMs than the device reports.)
// ATTN_GQA_MERGE_BLOCKS (read on every call so that one process can compare) forces a count
// ("1", "2", "4", "8", "16"; within the same limits).
template <typename Element, typename Cfg, typename KvLayout>
int merge_blocks(int device, int64_t blocks, int64_t rows_per_tile, int64_t num_splits,
                 int64_t keys_per_split) {
  constexpr int64_t kMergeWaitMaxKeys = 768;  // between 520 (MQA: faster) and 1024 (slower)
  if (num_splits <= 1 || blocks > resident_blocks<Element, Cfg, KvLayout>(device)) return 1;
  int64_t wanted = keys_per_split <= kMergeWaitMaxKeys ? num_splits / 4 : 1;
  const int forced = attn::env_choice("ATTN_GQA_MERGE_BLOCKS", {"auto", "1", "2", "4", "8", "16"}, 0);
  if (forced > 0) wanted = int64_t{1} << (forced - 1);
  return static_cast<int>(std::max<int64_t>(1, std::min({wanted, rows_per_tile, num_splits})));
}

}  // namespace

// ---- entry points (declared in binding.cpp) -----------------------------------------------

// The kernel's geometry for head_dim and dtype on `device`: {keys per warp tile, warps per
// block, resident blocks per SM} (0 blocks: this GPU cannot run it), for the split heuristic
// and the routing of task5/attention.py.
std::vector<int64_t> decode_gqa_geometry(int64_t head_dim, bool bf16, int64_t device) {
  TORCH_CHECK_VALUE(head_dim > 0 && head_dim <= kGqaMaxHeadDim && head_dim % 8 == 0,
                    attn::str("head_dim must be a multiple of 8 up to ", kGqaMaxHeadDim, " but is ",
                    head_dim, "."));
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return with_config(head_dim, static_cast<int>(device), [&](auto* cfg_tag) {
    using Cfg = std::remove_pointer_t<decltype(cfg_tag)>;
    return with_element(bf16 ? torch::kBFloat16 : torch::kHalf, [&](auto* element_tag) {
      using Element = std::remove_pointer_t<decltype(element_tag)>;
      int blocks = 0;
      if (prepare_kernel<Element, Cfg>(static_cast<int>(device))) {
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &blocks, gqa_kernel<Element, Cfg, ContiguousKv>(), Cfg::kThreads, Cfg::kSmemBytes));
      }
      return std::vector<int64_t>{Cfg::kTileKeys, Cfg::kWarps, blocks};
    });
  });
}

namespace {

// The launch both caches share (the contiguous entry below, the paged one in decode_paged.cu),
// after their own checks: q [B, H_q, S_q, D] (checked 4-d, fp16/bf16, CUDA) against the keys
// of kv_layout, heads_kv KV heads, the mask and score transforms in `mask`. Checks what is
// common (S_q, head_dim, num_splits, out), allocates the split partials, launches the kernel
// and, when no counters could be had, the merge. Returns [B, H_q, S_q, D] (or `out`).
template <typename KvLayout>
torch::Tensor launch_decode_gqa(const torch::Tensor& q, const KvLayout& kv_layout, int64_t heads_kv,
                                const attn::MaskParams& mask, double scale_value, int64_t num_splits,
                                std::optional<torch::Tensor> out, int fresh_keys = -1) {
  const int64_t batch = q.size(0), heads_q = q.size(1), seq_q = q.size(2), head_dim = q.size(3);
  const int64_t group = heads_q / heads_kv;
  TORCH_CHECK_VALUE(seq_q >= 1 && seq_q <= kMaxQueryRows, attn::str("the grouped-query decode takes 1 to ",
                    kMaxQueryRows, " query rows per sequence (q [batch, heads, seq_q, head_dim]) but q "
                    "has shape ", q.sizes(), "; run longer chunks through task 4's flash_attention."));
  TORCH_CHECK_VALUE(head_dim % 8 == 0 && head_dim <= kGqaMaxHeadDim, attn::str("head_dim must be a "
                    "multiple of 8 up to ", kGqaMaxHeadDim, " (rows move in 16-byte pieces) but is ",
                    head_dim, "."));
  TORCH_CHECK_VALUE(num_splits >= 1 && num_splits <= MAX_SPLITS, attn::str("num_splits must be in [1, ",
                    MAX_SPLITS, "] but is ", num_splits, "."));
  check_last_dim_contiguous(q, "q");
  check_out_like_q(out, q);
  const int64_t rows = group * seq_q;
  const int64_t row_tiles = (rows + kRowsPerTile - 1) / kRowsPerTile;
  const int64_t blocks = batch * heads_kv * num_splits * row_tiles;
  TORCH_CHECK_VALUE(blocks <= std::numeric_limits<int32_t>::max() && rows <= std::numeric_limits<int32_t>::max(),
                    attn::str("batch * kv_heads * num_splits * row tiles = ", blocks, " blocks is more "
                    "than one launch takes; use fewer splits."));

  c10::cuda::CUDAGuard guard(q.device());
  const int device = q.device().index();
  const bool ready = with_config(head_dim, device, [&](auto* cfg_tag) {
    using Cfg = std::remove_pointer_t<decltype(cfg_tag)>;
    return with_element(q.scalar_type(), [&](auto* element_tag) {
      return prepare_kernel<std::remove_pointer_t<decltype(element_tag)>, Cfg, KvLayout>(device);
    });
  });
  TORCH_CHECK_VALUE(ready, attn::str("the grouped-query decode kernel needs a GPU of compute capability "
                    "8.0 or newer with enough shared memory per block for head_dim ", head_dim,
                    "; this GPU has too little. Use decode_attention_grouped (CUDA cores) instead."));

  // 16-byte copies only: a view whose rows do not allow them is copied once (rare; a clone, so
  // that a contiguous view with a misaligned start is copied too, where contiguous() returns it).
  const torch::Tensor qa = attn::with_16_byte_rows(q);
  torch::Tensor result = out.has_value() ? *out : torch::empty(q.sizes(), q.options());
  GqaParams p{};
  p.mask = mask;
  p.q = qa.data_ptr();
  p.out = result.data_ptr();
  p.q_stride_b = qa.stride(0);
  p.q_stride_h = qa.stride(1);
  p.q_stride_s = qa.stride(2);
  p.o_stride_b = result.stride(0);
  p.o_stride_h = result.stride(1);
  p.o_stride_s = result.stride(2);
  p.heads_kv = static_cast<int>(heads_kv);
  p.group = static_cast<int>(group);
  p.seq_q = static_cast<int>(seq_q);
  p.head_dim = static_cast<int>(head_dim);
  p.rows = static_cast<int>(rows);
  p.row_tiles = static_cast<int>(row_tiles);
  p.num_splits = static_cast<int>(num_splits);
  p.scale_log2 = static_cast<float>(LOG2_E * scale_value);
  p.out_vec16 = rows_aligned_16(result) ? 1 : 0;
  // The overlapped launch and its prefetch (header); ATTN_GQA_OVERLAP=0 and ATTN_GQA_PREFETCH=0,
  // read on every call so that one process can compare, switch them off.
  const bool overlap = !attn::switched_off("ATTN_GQA_OVERLAP");
  const bool prefetch = overlap && attn::overlapped_launches_enabled() && !attn::switched_off("ATTN_GQA_PREFETCH");

  // The partials live until the merge has run (the caching allocator reuses the memory in
  // stream order, and inside a CUDA graph capture from the graph's pool).
  torch::Tensor partial, lse;
  if (num_splits > 1) {
    const auto options = q.options().dtype(torch::kFloat32);
    partial = torch::empty({batch, heads_kv, num_splits, rows, head_dim}, options);
    lse = torch::empty({batch, heads_kv, num_splits, rows}, options);
    p.partial = partial.data_ptr<float>();
    p.lse = lse.data_ptr<float>();
  }
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // A bool mask whose row every row of a tile shares (broadcast over heads, and one query per
  // sequence or broadcast over queries: transformers' padding mask) runs the mask-vote kernels
  // (GqaMaskVote; contiguous cache, head dims up to 128). ATTN_GQA_MASK_VOTE=0 (read on every
  // call, so that one process can compare) keeps it on the elementwise predicate everywhere.
  const bool mask_vote = std::is_same_v<KvLayout, ContiguousKv> && mask.mask != nullptr &&
                         mask.mask_kind == attn::kBoolMask && mask.mask_stride_h == 0 &&
                         (seq_q == 1 || mask.mask_stride_q == 0) &&
                         !attn::switched_off("ATTN_GQA_MASK_VOTE");
  with_config(head_dim, device, [&](auto* base_tag) {
    using BaseCfg = std::remove_pointer_t<decltype(base_tag)>;
    with_element(q.scalar_type(), [&](auto* element_tag) {
      using Element = std::remove_pointer_t<decltype(element_tag)>;
      const auto launch_with = [&](auto* cfg_tag) {
        using Cfg = std::remove_pointer_t<decltype(cfg_tag)>;
        // The keys a split may read: the cache's capacity or the window, over the splits.
        const int64_t keys = mask.window > 0 ? std::min<int64_t>(mask.seq_k, int64_t{mask.window} + seq_q)
                                             : mask.seq_k;
        p.merge_blocks = merge_blocks<Element, Cfg, KvLayout>(device, blocks, std::min<int64_t>(rows, kRowsPerTile),
                                                             num_splits, (keys + num_splits - 1) / num_splits);
        p.counters = num_splits > 1 ? split_counters(stream, (p.merge_blocks > 1 ? 2 : 1) * batch * heads_kv * row_tiles)
                                    : nullptr;
        // Tiles per warp asked of L2 before the wait: one at head dim 128 (the header says why;
        // measured with GqaD128 on the H100, and kept for the compact configuration), else as
        // many as the ring keeps in flight; ATTN_GQA_PREFETCH_TILES (read on every call, so that
        // one process can compare) sets the count.
        const int prefetch_tiles = Cfg::kHeadDim == 128 ? 1 : Cfg::kStages - 1;
        p.prefetch = prefetch ? attn::env_int("ATTN_GQA_PREFETCH_TILES", prefetch_tiles, 0, Cfg::kStages - 1,
                                              "a count of key tiles per warp to prefetch")
                              : 0;
        // Unsplit work of more blocks than are resident at once runs on a persistent grid of one
        // wave (GqaParams::items; the header says why). Read on every call so that one process can
        // compare: ATTN_GQA_PERSISTENT=0 launches a block per item instead; ATTN_GQA_PERSISTENT_GRID=N
        // (tests, compute-sanitizer) a persistent grid of N blocks wherever there are more items.
        int64_t grid = blocks;
        p.items = 0;
        GqaKernel<KvLayout> kernel = gqa_kernel<Element, Cfg, KvLayout>();
        if constexpr (kCanWalk<Cfg>) {
          if (num_splits == 1 && attn::env_choice("ATTN_GQA_PERSISTENT", {"1", "0"}, 0) == 0) {
            using Walk = GqaWalk<Cfg>;
            const int forced_grid = attn::env_int("ATTN_GQA_PERSISTENT_GRID", 0, 0, 1 << 20,
                                                  "a block count for the persistent grid (0: a full wave)");
            const int64_t wave = forced_grid > 0 ? forced_grid : resident_blocks<Element, Walk, KvLayout>(device);
            if (blocks > wave) {
              p.items = blocks;
              grid = wave;
              kernel = gqa_kernel<Element, Walk, KvLayout>();
            }
          }
        }
        // Settled tiles (the header): where the caller says which keys may be fresh, a contiguous
        // cache decoded one item per block, keys not left-padded. They replace the L2 prefetch.
        // ATTN_GQA_SETTLED=0 (read on every call, so that one process can compare) ignores
        // fresh_keys.
        p.fresh_keys = -1;
        if constexpr (std::is_same_v<KvLayout, ContiguousKv>) {
          if (fresh_keys >= 0 && overlap && attn::overlapped_launches_enabled() && p.items == 0 &&
              !mask.left_padding &&
              !attn::switched_off("ATTN_GQA_SETTLED")) {
            p.fresh_keys = fresh_keys;
            p.prefetch = 0;
          }
        }
        attn::launch_maybe_overlapped("decode_gqa_kernel", kernel, dim3(static_cast<unsigned>(grid)),
                                      dim3(Cfg::kThreads), Cfg::kSmemBytes, overlap, stream, p,
                                      kv_layout);
        if (num_splits > 1 && p.counters == nullptr) {
          MergeParams<Element, float> merge{p.partial, p.lse, static_cast<Element*>(p.out),
                                            p.o_stride_b, p.o_stride_h, static_cast<int>(heads_q),
                                            p.group, p.num_splits, p.head_dim, p.seq_q, p.o_stride_s};
          merge_lse_splits<Element>(merge, batch * heads_kv * rows, stream);
        }
      };
      if constexpr (std::is_same_v<KvLayout, ContiguousKv> && kCanVote<BaseCfg>) {
        if (mask_vote) {
          launch_with(static_cast<GqaMaskVote<BaseCfg>*>(nullptr));
          return;
        }
      }
      launch_with(static_cast<BaseCfg*>(nullptr));
    });
  });
  return result;
}

}  // namespace

// The paged cache's launch (declared in decode_paged.cuh, called by decode_paged.cu): the same
// kernel body with the PagedKv address policy.
torch::Tensor attn_decode::launch_decode_gqa_paged(const torch::Tensor& q, const PagedKv& pages,
                                                   int64_t heads_kv, const attn::MaskParams& mask,
                                                   double scale, int64_t num_splits,
                                                   std::optional<torch::Tensor> out) {
  return launch_decode_gqa(q, pages, heads_kv, mask, scale, num_splits, std::move(out));
}

// Beyond the course: softmax(q k^T * scale) v for S_q <= 16 query rows per (batch, query
// head), q [B, H_q, S_q, D] against k/v [B, H_kv, S_k, D] (H_q a multiple of H_kv; fp16 or
// bf16; D a multiple of 8 up to 256), the queries being the last S_q positions of their
// sequence, with every attention variant of common/variants.py. num_splits key ranges per
// (sequence, KV head), merged by their log-sum-exp. Returns [B, H_q, S_q, D] (or `out`).
// fresh_keys (a promise, or none): only each sequence's last fresh_keys keys may have been
// written by the kernel just before this one; the others are then copied while it finishes
// (settled tiles, decode_gqa.cuh).
torch::Tensor decode_attention_gqa(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal,
                                   std::optional<int64_t> window, int64_t stride,
                                   std::optional<torch::Tensor> mask,
                                   std::optional<torch::Tensor> key_lengths, bool left_padding,
                                   std::optional<double> softcap, std::optional<torch::Tensor> sinks,
                                   std::optional<double> scale, int64_t num_splits,
                                   std::optional<torch::Tensor> out, std::optional<int64_t> fresh_keys) {
  attn::check_half_qkv(q, k, v);
  TORCH_CHECK_VALUE(!fresh_keys.has_value() || *fresh_keys >= 0,
                    attn::str("fresh_keys counts the keys the kernel just before may have written; it "
                              "must be >= 0 (or None: any key may be fresh) but is ", *fresh_keys, "."));
  const int64_t head_dim = q.size(3), seq_k = k.size(2);
  TORCH_CHECK_VALUE(seq_k <= std::numeric_limits<int32_t>::max() / 2, attn::str("seq_k ", seq_k,
                    " is too long for 32-bit key indices."));
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(v, "v");
  if (out.has_value()) {
    // Other blocks still read q, k and v while a block writes its rows.
    TORCH_CHECK_VALUE(!out->is_alias_of(q) && !out->is_alias_of(k) && !out->is_alias_of(v),
                      attn::str("out shares memory with q, k or v; pass a separate tensor."));
  }
  const double scale_value = attn::softmax_scale(scale, head_dim);
  // An additive mask value a (logit units) is a / scale in the kernel's raw score units.
  attn::MaskParams mask_params = attn::make_mask_params(q, k, causal, window, stride, mask, key_lengths,
                                                        left_padding, static_cast<float>(1.0 / scale_value));
  // The float32 copy of the sinks mask_params points to lives until the launch below.
  const std::optional<torch::Tensor> sink_values =
      attn::set_score_transforms(mask_params, q, softcap, sinks, scale_value);

  // 16-byte copies only, as for q (launch_decode_gqa).
  const torch::Tensor ka = attn::with_16_byte_rows(k);
  const torch::Tensor va = attn::with_16_byte_rows(v);
  const ContiguousKv kv_layout{ka.data_ptr(), va.data_ptr(), ka.stride(0), ka.stride(1), ka.stride(2),
                               va.stride(0), va.stride(1), va.stride(2)};
  // A copy was written by the kernel just before: none of its keys is settled.
  const bool copied = ka.data_ptr() != k.data_ptr() || va.data_ptr() != v.data_ptr();
  const int fresh = fresh_keys.has_value() && !copied
                        ? static_cast<int>(std::min<int64_t>(*fresh_keys, seq_k)) : -1;
  return launch_decode_gqa(q, kv_layout, k.size(1), mask_params, scale_value, num_splits,
                           std::move(out), fresh);
}
