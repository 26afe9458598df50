// Task 4+ (beyond the course): FlashAttention-2 forward on tensor cores, fp16 and bf16.
//
// The idea: the course kernel (flash_attention.cu) computes in fp32 on CUDA cores. Real models
// run attention in fp16/bf16, where the tensor cores do a 16x8x16 matrix product per warp
// instruction (mma.sync.m16n8k16, fp32 accumulation). This kernel is FlashAttention-2's
// forward pass built on that instruction, and the parts that make it fast:
//   * Q, K, V tiles are copied global -> shared with cp.async (no register round trip), and
//     the copies of the next tile overlap the math on the current one;
//   * shared -> registers with ldmatrix (one instruction loads a whole 8x8 fragment set);
//     shared rows are XOR-swizzled so neither the copies nor ldmatrix hit bank conflicts;
//   * the score accumulator S never leaves registers: its m16n8 fp32 fragment, rounded to
//     16 bits, is exactly the A operand of the next mma (P V), so P needs no shared memory;
//   * the online softmax runs on those fragments (a row is spread over 4 lanes: 2 shuffles),
//     with exp2 and the 1/sqrt(D) scale folded into one FFMA;
//   * causal: key tiles past the diagonal are never visited, the mask is only applied on
//     the tiles that cross it, and the heaviest query tiles are launched first.
//
// Tile shapes (flash_attention_mma.cuh, ATTN_MMA_CONFIG picks one; default 0):
//   head_dim 128: 128 query rows x 64 keys, 4 warps of 32 rows (FlashAttention-2's choice).
//     Registers bound it: a warp's O (32 x 128) and S (32 x 64) fp32 fragments take 192 of
//     a thread's 255 registers. 32 rows per warp (two m16 tiles) let every K/V fragment
//     loaded from shared memory feed two mma, which keeps shared-memory bandwidth below the
//     tensor cores' rate; 2 CTAs (8 warps) fit per SM.
//   head_dim 64: 128 x 128, 4 warps of 32 rows (again FlashAttention-2's): O is half as
//     large, so the key tile doubles and halves the per-tile softmax overhead.
//   head_dim 32 / 96 run on their own instantiations; any other multiple of 8 up to 128 runs
//   on the next larger one with zero-filled columns that are never written back.
//   head_dim 192 / 256 (and every head dim above 128, on the next larger one): 64 query rows x
//   64 keys (32 at 256), 4 warps of 16 rows, Q and the row statistics in shared memory: O
//   alone is 128 registers per thread at 256.
//
// Attention variants (GQA/MQA, S_q != S_k with bottom-right causal, sliding window, stride,
// a mask tensor, per-sequence key lengths): common/csrc/attention_mask.cuh, evaluated on the
// tiles that need it; key tiles no row can see are never loaded. A softcap (applied to every
// tile's raw scores before the mask) and attention sinks (added to each row's denominator and
// lse in the epilogue) run on the general instantiation; a custom scale is scale_log2.
//
// Measured speed: Results.md (rendered from results/<gpu>.json), against SDPA's FLASH and
// cuDNN backends in the same run.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "tensor_api.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "attention_checks.cuh"
#include "attention_mask_host.cuh"
#include "device_query.cuh"
#include "flash_attention_mma.cuh"
#include "flash_attention_mma_host.cuh"

namespace {

// The tile configuration, read on every call so a benchmark can switch it between calls.
int tile_config_from_env() {
  return attn::env_int("ATTN_MMA_CONFIG", 0, 0, mma_attn::kNumConfigs - 1,
                       "a tile configuration of the fp16/bf16 kernel");
}

// The kernel copies rows with 16-byte cp.async: the last dimension must be contiguous and
// every row must start on a 16-byte boundary.
void check_row_layout(const torch::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.stride(3) == 1, attn::str(name, " must have a contiguous last dimension (stride 1) "
                    "but has strides ", t.strides(), "; call .contiguous() first."));
  for (int dim = 0; dim < 3; ++dim) {
    TORCH_CHECK_VALUE(t.size(dim) == 1 || t.stride(dim) % 8 == 0, attn::str(name, " has strides ",
                      t.strides(), ": every row must start 16 bytes (8 elements) apart from a "
                      "16-byte boundary; call .contiguous() first."));
  }
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, attn::str(name,
                    " does not start on a 16-byte boundary (a view at an odd offset); call "
                    ".clone() first."));
}

}  // namespace

torch::Tensor flash_attention_mma(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal,
                                  std::optional<torch::Tensor> out, std::optional<int64_t> window,
                                  int64_t stride, std::optional<torch::Tensor> mask,
                                  std::optional<torch::Tensor> key_lengths, bool left_padding,
                                  std::optional<torch::Tensor> lse, std::optional<double> softcap,
                                  std::optional<torch::Tensor> sinks, std::optional<double> scale) {
  // ---- validation: every bad input raises a Python ValueError / TypeError ----
  const int kv_group = attn::check_half_qkv(q, k, v);
  const int64_t heads = q.size(1), seq = std::max(q.size(2), k.size(2));
  const int64_t head_dim = q.size(3);
  attn::check_head_dim(head_dim);
  static_assert(attn::kMaxHeadDim <= 256, "the dispatch below instantiates head dims up to 256");
  TORCH_CHECK_VALUE(seq <= INT_MAX / 2 && heads <= INT_MAX, attn::str("seq ", seq, " or heads ", heads,
                    " is too large for this kernel's 32-bit row indices."));
  check_row_layout(q, "q");
  check_row_layout(k, "k");
  check_row_layout(v, "v");

  c10::cuda::CUDAGuard device_guard(q.device());
  const int major = attn::device_attribute(cudaDevAttrComputeCapabilityMajor, q.device().index());
  TORCH_CHECK_VALUE(major >= 8, attn::str("flash_attention_mma needs a GPU of compute capability 8.0 or "
                    "newer (cp.async, bf16 mma.sync); this one is ", major, ".x. Use the fp32 "
                    "kernel or torch's scaled_dot_product_attention."));

  torch::Tensor o;
  if (out.has_value()) {
    o = *out;
    attn::check_cuda_tensor(o, "out");
    // float32 out is for a split decode's partials, merged by their lse afterwards.
    if (o.scalar_type() == torch::kFloat32 && lse.has_value()) {
      TORCH_CHECK_VALUE(o.device() == q.device(), attn::str("out must be on q's device ", q.device(),
                        " but is on ", o.device(), "."));
    } else {
      attn::check_same(q, "q", o, "out");
    }
    TORCH_CHECK_VALUE(o.sizes() == q.sizes(), attn::str("out must have the shape of q ", q.sizes(),
                      " but has ", o.sizes(), "."));
    check_row_layout(o, "out");
    // Other CTAs still read K and V (and Q rows) while a CTA writes its output rows.
    TORCH_CHECK_VALUE(!o.is_alias_of(q) && !o.is_alias_of(k) && !o.is_alias_of(v),
                      attn::str("out shares memory with q, k or v; pass a separate tensor."));
  } else {
    o = torch::empty(q.sizes(), q.options());
  }

  const double scale_value = attn::softmax_scale(scale, head_dim);
  mma_attn::Params p;
  mma_attn::set_problem(p, q, k, v, o, kv_group, scale_value);
  // An additive mask value a (logit units) is a / scale in the kernel's raw score units.
  p.mask = attn::make_mask_params(q, k, causal, window, stride, mask, key_lengths, left_padding,
                                  static_cast<float>(1.0 / scale_value));
  // Softcap and sinks run the general instantiation (run_config); the float32 sinks live
  // until the launch below.
  const std::optional<torch::Tensor> sink_values =
      attn::set_score_transforms(p.mask, q, softcap, sinks, scale_value);
  mma_attn::set_lse(p, lse, q);
  if (o.scalar_type() == torch::kFloat32) p.out_float = o.data_ptr<float>();

  // BEGIN SOLUTION
  // HINT: Optional extension (beyond the graded course): fill in the kernel in
  // HINT: flash_attention_mma.cuh, then dispatch here to the instantiation whose head dim holds
  // HINT: head_dim (32, 64, 96, 128, 192 or 256) for q's dtype, and check the launch.
  const int config = tile_config_from_env();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool fp16 = q.scalar_type() == torch::kHalf;
  const char* error = nullptr;
  // The smallest instantiated head dim that holds head_dim.
  if (head_dim <= 32) {
    error = fp16 ? mma_attn::run_fp16_d32(p, config, stream) : mma_attn::run_bf16_d32(p, config, stream);
  } else if (head_dim <= 64) {
    error = fp16 ? mma_attn::run_fp16_d64(p, config, stream) : mma_attn::run_bf16_d64(p, config, stream);
  } else if (head_dim <= 96) {
    error = fp16 ? mma_attn::run_fp16_d96(p, config, stream) : mma_attn::run_bf16_d96(p, config, stream);
  } else if (head_dim <= 128) {
    error = fp16 ? mma_attn::run_fp16_d128(p, config, stream)
                 : mma_attn::run_bf16_d128(p, config, stream);
  } else if (head_dim <= 192) {
    error = fp16 ? mma_attn::run_fp16_d192(p, config, stream)
                 : mma_attn::run_bf16_d192(p, config, stream);
  } else {
    error = fp16 ? mma_attn::run_fp16_d256(p, config, stream)
                 : mma_attn::run_bf16_d256(p, config, stream);
  }
  TORCH_CHECK(error == nullptr, attn::str("flash_attention_mma could not launch: ", error ? error : ""));
  attn::check_launch("flash_attention_mma_kernel");
  // END SOLUTION
  return o;
}
