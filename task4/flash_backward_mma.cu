// Beyond the course (issue 33, part 2, not graded): FlashAttention-2's backward pass on tensor
// cores, fp16 and bf16 (mma.sync m16n8k16, ldmatrix, cp.async; every GPU from sm_80). The
// fp32 lesson (flash_backward.cu) is the same algorithm on CUDA cores; this is the one
// training in half precision uses (task4/backward.py routes fp16/bf16 gradients here).
//
// The idea. The forward (flash_attention_mma) saved O and each query row's base-2
// log-sum-exp lse2 = log2(sum_j 2^(s_ij * log2 e)) of the scaled logits s (its `lse` output;
// natural lse = lse2 / log2 e). Given dO, Algorithm 2 of Dao (2023) needs no S x S matrix:
//
//   preprocess  D_i = rowsum(dO_i * O_i) in float32 (one warp per row; lse2 -inf -> +inf)
//   dK/dV       a CTA owns a tile of keys of one KV head and walks the query tiles of every
//               query head of its GQA group: per tile it recomputes S = Q K^T * scale (with a
//               softcap c: s = c * tanh(s / c), whose slope 1 - tanh^2 multiplies dS), the
//               mask, P = exp2(S * log2 e - lse2), then dV += P^T dO, dP = dO V^T,
//               dS = P * (dP - D), dK += dS^T Q * scale, all accumulated in fp32 registers;
//               dK and dV are summed over the group in those registers (no atomics, no
//               [B, H_q, S_k, D] buffer to reduce)
//   dQ          two modes (mma_bwd::launch_backward_mma):
//               - by atomics (the default; FlashAttention-2's): the dK/dV kernel also writes
//                 each query tile's dS^T to shared memory, its warps compute dQ[tile] += dS K
//                 over the CTA's keys and add it into a zeroed float32 [B, H_q, S_q, D] buffer
//                 with atomicAdd; a last pass scales and converts it to fp16/bf16. 5 tile
//                 products. The order of the adds changes the last bits from run to run.
//               - deterministic (under torch.use_deterministic_algorithms(True)): a second
//                 kernel owns a tile of queries, walks the key tiles it sees, recomputes S, P,
//                 dP and dS and accumulates dQ += dS K * scale in registers. Bit-identical
//                 gradients run to run and no float32 buffer, at the price of recomputing
//                 S = Q K^T and dP = dO V^T: 7 tile products instead of 5 (1.4x the tensor-core
//                 FLOPs; the TFLOP/s reported count 2.5 x the forward's FLOPs, FlashAttention's
//                 convention, so this work shows up as lower TFLOP/s), and K and V read once
//                 more per query tile.
//               Removing two of seven products bought far less than two sevenths of the time
//               (results/logs/h100_backward_dq_modes_ab.txt): the dK/dV kernel is bound by the
//               latency of the shared-memory loads feeding its mma (task4/NOTES.md, "The
//               backward's speed").
//
// Tile shapes and why (flash_backward_mma.cuh: BwdKV*, BwdQ*). A warp owns 16 rows (one m16
// tile), a CTA 4 warps = 64 rows, so that every product of the backward has the owned rows as
// its M dimension: P^T and dS^T (dK/dV kernel) and dS (dQ kernel) are fp32 accumulators whose
// fragment, rounded to 16 bits, is the A operand of the next mma, and P never touches shared
// memory (dS only for the atomic dQ; the .cuh's top comment lists the products). Registers bind the shapes: the
// dK/dV kernel holds dK and dV (16 x D each: 2 x D/2 fp32 per thread, 128 at D = 128) plus two
// score-shaped accumulators S^T and dP^T (16 x kBlockStream: kBlockStream/2 each); with 64
// streamed queries at D = 128 that is 192 fp32 and ptxas spilled, so D = 128 streams 32 queries
// per step (64 at D = 64, where dK and dV are half as large). The dQ kernel holds only dQ: 64
// streamed keys per step at both head dims. The streamed tiles are double-buffered (the next
// tile's cp.async copies run under the current tile's math, one barrier per tile), and launch
// bounds ask for 2 CTAs (8 warps) per SM. The general instantiation (window, key lengths, mask
// tensor, stride, softcap) also keeps the softcap slope per score in registers.
// Shared memory: the own tiles (2 x 64 rows) and two stages of the two streamed tiles, in the
// forward's swizzled 16-bit layout: at D = 128, 64 KB for dK/dV (32 streamed rows) and 96 KB
// for dQ (64); at D = 64, 48 KB each. The atomic dQ adds the dS^T tile (keys x streamed
// queries, rows padded by 16 bytes against bank conflicts); at D = 128 its CTA owns 128 keys
// (8 warps, one CTA per SM), which halves the atomics (S_k / 128 adds per dQ element).
//
// Head dims: 64 and 128 are instantiated; every multiple of 8 up to 128 runs on the next one
// with zero-filled columns (the forward's load_tile) that are never written back.
// Variants: the forward's (common/csrc/attention_mask.cuh): causal (bottom-right for
// S_q != S_k), GQA/MQA, sliding window, stride, bool or additive mask tensors (no gradient),
// key lengths (right or left padded), softcap, scale; sinks need nothing (they are inside the
// forward's lse and have no value). Tiles the mask proves empty are never visited.
//
// The atomic-dQ mode runs FlashAttention-2's 2-D warp layout (issue 33): a CTA of 8 warps
// owning 128 keys, each warp a 32 x 32 block of every product, P and dS through shared memory
// (flash_backward_mma_2d.cuh says why), for every variant and head dim above. It measured
// faster than the 16-row kernel on every benchmark case (task4/NOTES.md, "The backward's
// speed"); the 16-row kernel stays for the deterministic mode, for GPUs whose blocks cannot
// have the 2-D tile's shared memory, and for comparison: ATTN_BWD_LAYOUT=rows (read per call).
//
// Where its speed lives: Results.md, "The backward pass on tensor cores (fp16/bf16)" (rendered
// from results/<gpu>.json; python -m task4.test --backward-half-bench measures it beside SDPA's
// FLASH and cuDNN backends in one process). No number is written here.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "tensor_api.h"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "attention_checks.cuh"
#include "attention_mask_host.cuh"
#include "device_query.cuh"
#include "flash_backward_mma.cuh"
#include "flash_backward_mma_2d.cuh"

namespace {

// Which kernel shape computes the atomic-dQ backward: FlashAttention-2's 2-D warp layout
// (flash_backward_mma_2d.cuh) where the GPU gives a block its shared memory, else the 16-row
// kernel (flash_backward_mma.cuh). ATTN_BWD_LAYOUT, read on every call (attn::env_choice) so
// that one process can time both: unset, empty or "2d", that choice; "rows", the 16-row
// kernel; "wgmma" (like unset) is task4/backward.py's choice of the Hopper backward
// (flash_backward_hopper.cu) where it applies, so a call that reaches this kernel under it is
// outside that kernel's scope (or on another GPU) and gets the default. The deterministic mode
// has one shape and ignores it.
bool backward_layout_2d(int padded_dim, bool general) {
  if (attn::env_choice("ATTN_BWD_LAYOUT", {"2d", "rows", "wgmma"}, 0) == 1) return false;  // "rows"
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const int optin = attn::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return optin >= mma_bwd::backward_2d_smem_bytes(padded_dim, general);
}

}  // namespace

// fp16/bf16 FlashAttention-2 backward: q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D], out and d_out
// like q (any strides), lse [B, H_q, S_q] float32, the forward's base-2 log-sum-exp (what
// flash_attention_mma writes into `lse`), and the forward's variant arguments. Returns
// {dq, dk, dv}, new contiguous tensors in q's dtype; dk and dv summed over each KV head's
// query group. dQ by atomics, or with `deterministic` by a separate pass (bit-identical runs).
std::vector<torch::Tensor> flash_attention_backward_mma(
    torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor out, torch::Tensor lse,
    torch::Tensor d_out, bool causal, std::optional<int64_t> window, int64_t stride,
    std::optional<torch::Tensor> mask, std::optional<torch::Tensor> key_lengths,
    bool left_padding, std::optional<double> softcap, std::optional<double> scale,
    bool deterministic) {
  const int kv_group = attn::check_half_qkv(q, k, v);
  for (const auto& [t, name] : {std::pair<const torch::Tensor&, const char*>{out, "out"},
                                {d_out, "d_out"}}) {
    attn::check_cuda_tensor(t, name);
    attn::check_same(q, "q", t, name);
  }
  attn::check_cuda_tensor(lse, "lse");
  attn::check_dtype(lse, "lse", {torch::kFloat32});
  TORCH_CHECK_VALUE(lse.device() == q.device(), attn::str("lse must be on q's device ", q.device(),
                    " but is on ", lse.device(), "."));
  const int64_t batch = q.size(0), heads = q.size(1), seq_q = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = k.size(1), seq_k = k.size(2);
  attn::check_backward_head_dim(head_dim);
  static_assert(attn::kBackwardMaxHeadDim <= 128, "the dispatch below pads head dims up to 128");
  TORCH_CHECK_VALUE(out.sizes() == q.sizes() && d_out.sizes() == q.sizes(), attn::str("out and d_out "
                    "must have the shape of q ", q.sizes(), " but have ", out.sizes(), " and ",
                    d_out.sizes(), "."));
  TORCH_CHECK_VALUE(lse.dim() == 3 && lse.size(0) == batch && lse.size(1) == heads &&
                    lse.size(2) == seq_q, attn::str("lse must have shape [", batch, ", ", heads, ", ",
                    seq_q, "] (one base-2 log-sum-exp per query row, as the forward wrote it) but "
                    "has shape ", lse.sizes(), "."));
  TORCH_CHECK_VALUE(seq_k <= INT32_MAX / 2 && seq_q <= INT32_MAX / 2 && batch * heads <= 65535,
                    attn::str("seq_q (", seq_q, ") and seq_k (", seq_k, ") must fit in 30 bits and "
                    "batch * heads (", batch * heads, ") in 65535; split the batch."));

  const c10::cuda::CUDAGuard device_guard(q.device());
  const int major = attn::device_attribute(cudaDevAttrComputeCapabilityMajor, q.device().index());
  TORCH_CHECK_VALUE(major >= 8, attn::str("flash_attention_backward_mma needs a GPU of compute "
                    "capability 8.0 or newer (cp.async, bf16 mma.sync); this one is ", major,
                    ".x. Compute the backward in float32 (flash_attention_backward_fp32)."));

  const double scale_value = attn::softmax_scale(scale, head_dim);
  mma_bwd::BwdParams p;
  p.mask = attn::make_mask_params(q, k, causal, window, stride, mask, key_lengths, left_padding,
                                  static_cast<float>(1.0 / scale_value));
  attn::set_score_transforms(p.mask, q, softcap, std::nullopt, scale_value);

  // What the kernels read with 16-byte cp.async (attention_checks.cuh); anything else is copied.
  using attn::with_16_byte_rows;
  const torch::Tensor qa = with_16_byte_rows(q), ka = with_16_byte_rows(k), va = with_16_byte_rows(v);
  const torch::Tensor oa = with_16_byte_rows(out), doa = with_16_byte_rows(d_out);
  const auto f32 = q.options().dtype(torch::kFloat32);
  torch::Tensor lse2 = torch::empty({batch, heads, seq_q}, f32);
  torch::Tensor delta = torch::empty({batch, heads, seq_q}, f32);
  torch::Tensor dq = torch::empty({batch, heads, seq_q, head_dim}, q.options());
  torch::Tensor dk = torch::empty({batch, kv_heads, seq_k, head_dim}, q.options());
  torch::Tensor dv = torch::empty({batch, kv_heads, seq_k, head_dim}, q.options());
  if (q.numel() == 0 || k.numel() == 0) {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }

  // BEGIN SOLUTION
  // HINT: Optional extension (beyond the graded course): fill p (the pointers of qa, ka, va, oa,
  // HINT: doa, lse, lse2, delta, dq, dk, dv; their batch/head/row strides; the sizes; scale and
  // HINT: scale_log2 = log2(e) * scale), run the preprocess (ceil(B * H_q * S_q / 8) blocks of 8
  // HINT: warps), then the dK/dV and dQ kernels for q's dtype at head dim 64 or 128
  // HINT: (mma_bwd::backward_<dtype>_d<64|128>, passing `deterministic`; without it they also
  // HINT: need p.dq_accum: a zeroed float32 [B, H_q, S_q + mma_bwd::kDqAccumExtraRows,
  // HINT: padded_head_dim]), and check each launch.
  p.q = qa.data_ptr();
  p.k = ka.data_ptr();
  p.v = va.data_ptr();
  p.out = oa.data_ptr();
  p.d_out = doa.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.lse2 = lse2.data_ptr<float>();
  p.delta = delta.data_ptr<float>();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.q_stride_b = qa.stride(0);
  p.q_stride_h = qa.stride(1);
  p.q_stride_s = qa.stride(2);
  p.k_stride_b = ka.stride(0);
  p.k_stride_h = ka.stride(1);
  p.k_stride_s = ka.stride(2);
  p.v_stride_b = va.stride(0);
  p.v_stride_h = va.stride(1);
  p.v_stride_s = va.stride(2);
  p.o_stride_b = oa.stride(0);
  p.o_stride_h = oa.stride(1);
  p.o_stride_s = oa.stride(2);
  p.do_stride_b = doa.stride(0);
  p.do_stride_h = doa.stride(1);
  p.do_stride_s = doa.stride(2);
  p.lse_stride_b = lse.stride(0);
  p.lse_stride_h = lse.stride(1);
  p.lse_stride_s = lse.stride(2);
  p.batch = static_cast<int>(batch);
  p.heads = static_cast<int>(heads);
  p.kv_heads = static_cast<int>(kv_heads);
  p.kv_group = kv_group;
  p.seq_q = static_cast<int>(seq_q);
  p.seq_k = static_cast<int>(seq_k);
  p.head_dim = static_cast<int>(head_dim);
  p.scale = static_cast<float>(scale_value);
  p.scale_log2 = static_cast<float>(1.4426950408889634 * scale_value);

  // The fused dQ's float32 accumulator: head_dim padded to the instantiation, rows past S_q
  // for a query tile that starts near its end (mma_bwd::BwdParams says why), zeroed.
  const int padded_dim = mma_bwd::padded_head_dim(head_dim);
  torch::Tensor dq_accum;
  if (!deterministic) {
    const int64_t rows = seq_q + mma_bwd::kDqAccumExtraRows;
    dq_accum = torch::zeros({batch, heads, rows, padded_dim}, f32);
    p.dq_accum = dq_accum.data_ptr<float>();
    p.dq_accum_rows = static_cast<int>(rows);
    p.dq_accum_dim = padded_dim;
  } else {
    p.dq_accum = nullptr;
    p.dq_accum_rows = p.dq_accum_dim = 0;
  }

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool fp16 = q.scalar_type() == torch::kHalf;
  const int64_t rows = batch * heads * seq_q;
  const int64_t blocks = (rows + mma_bwd::kPreprocessWarps - 1) / mma_bwd::kPreprocessWarps;
  TORCH_CHECK_VALUE(blocks <= INT32_MAX, attn::str("batch * heads * seq_q (", rows, ") is too large "
                    "for one launch; split the batch."));
  if (fp16) mma_bwd::preprocess_fp16(p, blocks, stream);
  else mma_bwd::preprocess_bf16(p, blocks, stream);
  attn::check_launch("backward_preprocess_mma_kernel");

  const char* error = nullptr;
  const bool layout_2d = !deterministic && backward_layout_2d(padded_dim, p.mask.general());
  if (layout_2d) {
    if (padded_dim == 64) {
      error = fp16 ? mma_bwd::backward_2d_fp16_d64(p, stream)
                   : mma_bwd::backward_2d_bf16_d64(p, stream);
    } else {
      error = fp16 ? mma_bwd::backward_2d_fp16_d128(p, stream)
                   : mma_bwd::backward_2d_bf16_d128(p, stream);
    }
  } else if (padded_dim == 64) {
    error = fp16 ? mma_bwd::backward_fp16_d64(p, deterministic, stream)
                 : mma_bwd::backward_bf16_d64(p, deterministic, stream);
  } else {
    error = fp16 ? mma_bwd::backward_fp16_d128(p, deterministic, stream)
                 : mma_bwd::backward_bf16_d128(p, deterministic, stream);
  }
  TORCH_CHECK(error == nullptr, attn::str("flash_attention_backward_mma could not launch: ",
              error ? error : ""));
  attn::check_launch(deterministic ? "flash_backward_dkdv_mma_kernel / flash_backward_dq_mma_kernel"
                     : layout_2d   ? "flash_backward_2d_kernel / backward_dq_convert_kernel"
                                   : "flash_backward_dkdv_mma_kernel (fused dQ) / backward_dq_convert_kernel");
  // END SOLUTION
  return {dq, dk, dv};
}
