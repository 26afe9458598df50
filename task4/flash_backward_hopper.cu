// Beyond the course (issue 33): the wgmma backward for Hopper (sm_90a), fp16 / bf16: the host.
// compile_check: arch sm_90a
//
// The kernel, its tile and why: flash_backward_hopper_kernel.cuh (its building blocks:
// flash_backward_hopper.cuh; the design: task4/NOTES.md, "A wgmma backward for sm_90
// (design)"). This file is the host entry the Hopper extension binds: what the kernel takes
// (backward_hopper_refusal), the buffers (padded lse2 / D, the zeroed fp32 dq_accum), the tensor
// maps, and the launches. The instantiations are compiled in flash_backward_hopper_fp16.cu and
// _bf16.cu, beside this file. task4/backward.py sends a gradient here on a Hopper GPU when the
// call is in the kernel's scope (the default; ATTN_BWD_LAYOUT=2d or rows picks the mma.sync
// kernel instead, for A/B runs); everything else runs on the mma.sync backward
// (flash_backward_mma.cu).

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "tensor_api.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention_checks.cuh"
#include "attention_mask_host.cuh"
#include "device_query.cuh"
#include "flash_backward_hopper_kernel.cuh"
#include "hopper_tensor_map.h"

namespace {

// Why the wgmma backward cannot take these (checked) inputs, or "" when it can.
std::string backward_hopper_refusal(const torch::Tensor& q, const torch::Tensor& k) {
  const int64_t head_dim = q.size(3);
  if (head_dim < 64 || head_dim > 128 || head_dim % 8 != 0)
    return attn::str("head_dim ", head_dim, " (it takes multiples of 8 from 64 to 128)");
  if (std::max(q.size(2), k.size(2)) > INT_MAX / 2) return "sequences beyond 30-bit row indices";
  const int major = attn::device_attribute(cudaDevAttrComputeCapabilityMajor, q.device().index());
  const int minor = attn::device_attribute(cudaDevAttrComputeCapabilityMinor, q.device().index());
  if (major != 9 || minor != 0) return "a GPU that is not compute capability 9.0 (sm_90a code runs only there)";
  return "";
}

}  // namespace

// fp16/bf16 FlashAttention backward on wgmma: q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D], out and
// d_out like q (any strides), lse [B, H_q, S_q] float32 (the forward's base-2 log-sum-exp),
// dense or causal (bottom-right for S_q != S_k), `scale` the softmax scale (None: 1/sqrt(D)).
// D a multiple of 8 from 64 to 128. Returns {dq, dk, dv}, new contiguous tensors in q's dtype,
// dk and dv summed over each KV head's query group. dQ by atomics (the last bits change from run
// to run; dk and dv do not).
std::vector<torch::Tensor> flash_attention_backward_hopper(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                                           torch::Tensor out, torch::Tensor lse,
                                                           torch::Tensor d_out, bool causal,
                                                           std::optional<double> scale) {
  const int kv_group = attn::check_half_qkv(q, k, v);
  for (const auto& [t, name] : {std::pair<const torch::Tensor&, const char*>{out, "out"}, {d_out, "d_out"}}) {
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
  TORCH_CHECK_VALUE(out.sizes() == q.sizes() && d_out.sizes() == q.sizes(), attn::str("out and d_out "
                    "must have the shape of q ", q.sizes(), " but have ", out.sizes(), " and ",
                    d_out.sizes(), "."));
  TORCH_CHECK_VALUE(lse.dim() == 3 && lse.size(0) == batch && lse.size(1) == heads && lse.size(2) == seq_q,
                    attn::str("lse must have shape [", batch, ", ", heads, ", ", seq_q, "] (one base-2 "
                    "log-sum-exp per query row, as the forward wrote it) but has shape ", lse.sizes(), "."));
  const c10::cuda::CUDAGuard device_guard(q.device());
  const std::string refusal = backward_hopper_refusal(q, k);
  TORCH_CHECK_VALUE(refusal.empty(), attn::str("flash_attention_backward_hopper does not take ", refusal,
                    "; call flash_attention_backward_mma (task4/backward.py routes such calls there)."));

  const double scale_value = attn::softmax_scale(scale, head_dim);
  const int padded_dim = head_dim <= 64 ? 64 : 128;
  const int64_t seq_q_pad = hopper_bwd::padded_rows(seq_q);
  // What the TMA and the preprocess's 4-byte loads read (attention_checks.cuh: positive
  // strides too); anything else is copied.
  auto tma_ready = [](const torch::Tensor& t) { return attn::with_16_byte_rows(t, /*positive_strides=*/true); };
  const torch::Tensor qa = tma_ready(q), ka = tma_ready(k), va = tma_ready(v);
  const torch::Tensor oa = tma_ready(out), doa = tma_ready(d_out);
  const auto f32 = q.options().dtype(torch::kFloat32);
  // lse2 and D as the mma.sync preprocess writes them, then padded per (batch, head).
  torch::Tensor rows = torch::empty({2, batch * heads * seq_q}, f32);
  torch::Tensor padded = torch::empty({2, batch * heads * seq_q_pad}, f32);
  torch::Tensor dq_accum = torch::zeros({batch, heads, seq_q_pad, padded_dim}, f32);
  torch::Tensor dq = torch::empty({batch, heads, seq_q, head_dim}, q.options());
  torch::Tensor dk = torch::empty({batch, kv_heads, seq_k, head_dim}, q.options());
  torch::Tensor dv = torch::empty({batch, kv_heads, seq_k, head_dim}, q.options());

  // The preprocess and the convert pass read the mma.sync backward's parameters.
  mma_bwd::BwdParams p{};
  p.out = oa.data_ptr();
  p.d_out = doa.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.lse2 = rows[0].data_ptr<float>();
  p.delta = rows[1].data_ptr<float>();
  p.dq = dq.data_ptr();
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
  p.dq_accum = dq_accum.data_ptr<float>();
  p.dq_accum_rows = static_cast<int>(seq_q_pad);
  p.dq_accum_dim = padded_dim;

  hopper_bwd::BwdHopperParams hp{};
  hp.lse2 = padded[0].data_ptr<float>();
  hp.delta = padded[1].data_ptr<float>();
  hp.dq_accum = p.dq_accum;
  hp.dk = dk.data_ptr();
  hp.dv = dv.data_ptr();
  hp.heads = p.heads;
  hp.kv_heads = p.kv_heads;
  hp.kv_group = kv_group;
  hp.seq_q = p.seq_q;
  hp.seq_k = p.seq_k;
  hp.seq_q_pad = static_cast<int>(seq_q_pad);
  hp.head_dim = p.head_dim;
  hp.scale_log2 = p.scale_log2;
  hp.scale = p.scale;
  hp.mask = attn::make_mask_params(q, k, causal, std::nullopt, 1, std::nullopt, std::nullopt, false, 1.f);

  // Q and dO in boxes of the step's kBlockM rows, K and V of the CTA's 128 keys.
  const int block_m = padded_dim == 128 ? hopper_bwd::BwdTile<128>::kBlockM : hopper_bwd::BwdTile<64>::kBlockM;
  const CUtensorMap map_q = hopper_attn::make_tensor_map(qa, block_m);
  const CUtensorMap map_do = hopper_attn::make_tensor_map(doa, block_m);
  const CUtensorMap map_k = hopper_attn::make_tensor_map(ka, hopper_bwd::BwdTile<128>::kBlockN);
  const CUtensorMap map_v = hopper_attn::make_tensor_map(va, hopper_bwd::BwdTile<128>::kBlockN);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool fp16 = q.scalar_type() == torch::kHalf;
  const char* error;
  if (padded_dim == 64) {
    error = fp16 ? hopper_bwd::launch_backward_hopper<__half, 64>(p, hp, map_q, map_k, map_v, map_do, stream)
                 : hopper_bwd::launch_backward_hopper<__nv_bfloat16, 64>(p, hp, map_q, map_k, map_v, map_do, stream);
  } else {
    error = fp16 ? hopper_bwd::launch_backward_hopper<__half, 128>(p, hp, map_q, map_k, map_v, map_do, stream)
                 : hopper_bwd::launch_backward_hopper<__nv_bfloat16, 128>(p, hp, map_q, map_k, map_v, map_do, stream);
  }
  TORCH_CHECK(error == nullptr, attn::str("flash_attention_backward_hopper could not launch: ", error ? error : "",
              "."));
  attn::check_launch("backward_preprocess_mma_kernel / backward_pad_rows_kernel / flash_backward_hopper_kernel / "
                     "backward_dq_convert_kernel");
  return {dq, dk, dv};
}
