// The host side the tensor-core entries share (flash_attention_mma.cu and the Hopper kernel's
// flash_attention_hopper.cu): q, k, v, out and the optional lse into mma_attn::Params. Apart
// from flash_attention_mma.cuh so that the files instantiating the kernels
// (flash_attention_mma_<dtype>.cu, flash_backward_mma_<dtype>.cu) compile without torch's
// headers.
#pragma once

#include "tensor_api.h"

#include <optional>

#include "attention_mask_host.cuh"
#include "flash_attention_mma.cuh"

namespace mma_attn {

// The host side both entries share (this kernel's and the Hopper kernel's): q, k, v and out
// [B, H, S, D] (shapes and strides already checked by the caller) into p; p.mask is the
// caller's. `scale` is the softmax scale (attn::softmax_scale: 1/sqrt(D) with the true D
// unless the caller gave one, also when the kernel's tile is wider: the padding columns are
// zero and add nothing to q.k): exp(x * scale) = exp2(x * log2(e) * scale).
inline void set_problem(Params& p, const torch::Tensor& q, const torch::Tensor& k,
                        const torch::Tensor& v, const torch::Tensor& out, int kv_group,
                        double scale) {
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.q_batch_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.q_row_stride = q.stride(2);
  p.k_batch_stride = k.stride(0);
  p.k_head_stride = k.stride(1);
  p.k_row_stride = k.stride(2);
  p.v_batch_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
  p.v_row_stride = v.stride(2);
  p.o_batch_stride = out.stride(0);
  p.o_head_stride = out.stride(1);
  p.o_row_stride = out.stride(2);
  p.batch_heads = q.size(0) * q.size(1);
  p.heads = static_cast<int>(q.size(1));
  p.kv_group = kv_group;
  p.seq_q = static_cast<int>(q.size(2));
  p.seq_k = static_cast<int>(k.size(2));
  p.head_dim = static_cast<int>(q.size(3));
  p.scale_log2 = static_cast<float>(1.4426950408889634 * scale);
  p.lse = nullptr;
  p.out_float = nullptr;
}

// The optional lse output, [B, H_q, S_q] float32, contiguous: each row's base-2 log-sum-exp.
inline void set_lse(Params& p, const std::optional<torch::Tensor>& lse, const torch::Tensor& q) {
  if (!lse.has_value()) return;
  attn::check_cuda_tensor(*lse, "lse");
  TORCH_CHECK_TYPE(lse->scalar_type() == torch::kFloat32, attn::str("lse must be float32 but has dtype ",
                   lse->scalar_type(), "."));
  TORCH_CHECK_VALUE(lse->device() == q.device() && lse->is_contiguous() && lse->dim() == 3 &&
                    lse->size(0) == q.size(0) && lse->size(1) == q.size(1) && lse->size(2) == q.size(2),
                    attn::str("lse must be a contiguous float32 [", q.size(0), ", ", q.size(1), ", ",
                    q.size(2), "] tensor on q's device but has shape ", lse->sizes(), "."));
  p.lse = lse->data_ptr<float>();
}

}  // namespace mma_attn
