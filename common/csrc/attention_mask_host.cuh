// The host side of attention_mask.cuh: validate an attention call's variant arguments (torch
// tensors) and fill the MaskParams every kernel family reads, plus the shape checks the
// tensor-core entries share. Included by the extensions' host entries; files that only
// instantiate kernels include attention_mask.cuh alone (it has no torch headers, which
// dominate a kernel file's compile time).
#pragma once

#include "tensor_api.h"

#include <cmath>
#include <cstdint>
#include <optional>

#include "attention_checks.cuh"
#include "attention_mask.cuh"

namespace attn {

// q [B, H_q, S_q, D], k [B, H_kv, S_k, D] (validated by the caller). Raises a Python
// ValueError / TypeError for every bad description. `mask_scale` converts an additive mask
// value (logit units) to the kernel's score units.
// seq_k: the keys a sequence may have (k.size(2); a paged cache's max_pages * page_size).
inline MaskParams make_mask_params(const torch::Tensor& q, int64_t seq_k, bool causal,
                                   std::optional<int64_t> window, int64_t stride,
                                   const std::optional<torch::Tensor>& mask,
                                   const std::optional<torch::Tensor>& key_lengths,
                                   bool left_padding, float mask_scale) {
  const int64_t batch = q.size(0), heads = q.size(1), seq_q = q.size(2);
  MaskParams p;
  p.seq_q = static_cast<int>(seq_q);
  p.seq_k = static_cast<int>(seq_k);
  p.causal = causal ? 1 : 0;
  if (window.has_value()) {
    TORCH_CHECK_VALUE(*window >= 1, attn::str("window must be at least 1 (a query sees itself) but is ",
                      *window, "; pass None for no window."));
    p.window = static_cast<int>(std::min<int64_t>(*window, static_cast<int64_t>(INT32_MAX / 2)));
  }
  TORCH_CHECK_VALUE(stride >= 1, attn::str("stride must be at least 1 (1 = every key) but is ", stride, "."));
  p.stride = static_cast<int>(std::min<int64_t>(stride, static_cast<int64_t>(INT32_MAX / 2)));
  p.inv_stride = 1.f / static_cast<float>(p.stride);
  TORCH_CHECK_VALUE(p.stride == 1 || (seq_k < (1 << 22) && seq_q < (1 << 22)), attn::str("a stride "
                    "takes sequences shorter than 2^22 = 4194304 tokens (its divisibility test is "
                    "exact below that) but seq_q is ", seq_q, " and seq_k ", seq_k, "."));
  if (key_lengths.has_value()) {
    const torch::Tensor& t = *key_lengths;
    check_cuda_tensor(t, "key_lengths");
    TORCH_CHECK_TYPE(t.scalar_type() == torch::kInt32, attn::str("key_lengths must be an int32 tensor but has "
                     "dtype ", t.scalar_type(), "; create it with dtype=torch.int32."));
    TORCH_CHECK_VALUE(t.device() == q.device(), attn::str("key_lengths is on ", t.device(), " but q is on ",
                      q.device(), "; put them on the same GPU."));
    const bool one = t.dim() == 0 || (t.dim() == 1 && t.size(0) == 1);
    TORCH_CHECK_VALUE(one || (t.dim() == 1 && t.size(0) == batch), attn::str("key_lengths must have shape [",
                      batch, "] (one length per sequence) but has shape ", t.sizes(), "."));
    p.key_lengths = t.data_ptr<int32_t>();
    p.key_lengths_stride = one ? 0 : t.stride(0);
    p.left_padding = left_padding ? 1 : 0;
  } else {
    TORCH_CHECK_VALUE(!left_padding, attn::str("left_padding needs key_lengths (how many keys of each "
                      "sequence are real); pass key_lengths or left_padding=False."));
  }
  if (mask.has_value()) {
    const torch::Tensor& m = *mask;
    check_cuda_tensor(m, "mask");
    TORCH_CHECK_VALUE(m.device() == q.device(), attn::str("mask is on ", m.device(), " but q is on ",
                      q.device(), "; put them on the same GPU."));
    const auto dtype = m.scalar_type();
    TORCH_CHECK_TYPE(dtype == torch::kBool || dtype == torch::kFloat32 || dtype == q.scalar_type(),
                     attn::str("mask has dtype ", dtype, " but must be bool (True = keep) or an additive "
                     "float mask of dtype float32 or ", q.scalar_type(), " (q's dtype)."));
    TORCH_CHECK_VALUE(m.dim() >= 1 && m.dim() <= 4, attn::str("mask must have 1 to 4 dimensions, "
                      "broadcastable to [batch, heads, seq_q, seq_k] = [", batch, ", ", heads, ", ",
                      seq_q, ", ", seq_k, "], but has shape ", m.sizes(), "."));
    const int64_t full[4] = {batch, heads, seq_q, seq_k};
    int64_t strides[4] = {0, 0, 0, 0};
    for (int d = 0; d < 4; ++d) {
      const int md = d - (4 - static_cast<int>(m.dim()));  // the mask's own dim, or < 0
      if (md < 0) continue;
      const int64_t size = m.size(md);
      TORCH_CHECK_VALUE(size == 1 || size == full[d], attn::str("mask of shape ", m.sizes(),
                        " does not broadcast to [batch, heads, seq_q, seq_k] = [", batch, ", ", heads,
                        ", ", seq_q, ", ", seq_k, "]: each dimension must be 1 or the full size."));
      strides[d] = size == 1 ? 0 : m.stride(md);
    }
    p.mask = m.data_ptr();
    p.mask_kind = dtype == torch::kBool ? kBoolMask
                  : dtype == torch::kFloat32 ? kFloat32Mask
                  : dtype == torch::kHalf ? kFloat16Mask : kBFloat16Mask;
    p.mask_stride_b = strides[0];
    p.mask_stride_h = strides[1];
    p.mask_stride_q = strides[2];
    p.mask_stride_k = strides[3];
    p.mask_scale = mask_scale;
  }
  return p;
}

inline MaskParams make_mask_params(const torch::Tensor& q, const torch::Tensor& k, bool causal,
                                   std::optional<int64_t> window, int64_t stride,
                                   const std::optional<torch::Tensor>& mask,
                                   const std::optional<torch::Tensor>& key_lengths,
                                   bool left_padding, float mask_scale) {
  return make_mask_params(q, k.size(2), causal, window, stride, mask, key_lengths, left_padding,
                          mask_scale);
}

// The softmax scale: `scale` (validated: positive and finite) or 1 / sqrt(head_dim).
inline double softmax_scale(std::optional<double> scale, int64_t head_dim) {
  if (!scale.has_value()) return 1.0 / std::sqrt(static_cast<double>(head_dim));
  TORCH_CHECK_VALUE(std::isfinite(*scale) && *scale > 0.0, attn::str("scale must be a positive, "
                    "finite number or None, got ", *scale, "."));
  return *scale;
}

// The score transforms of p (see the top of this file): softcap (logit units, validated) and
// sinks ([H_q], float32, float16 or bfloat16 on q's device), with `scale` the softmax scale.
// Returns the float32 copy of the sinks that p points to (or the tensor itself): the caller
// keeps it alive until the kernel is launched.
inline std::optional<torch::Tensor> set_score_transforms(MaskParams& p, const torch::Tensor& q,
                                                         std::optional<double> softcap,
                                                         const std::optional<torch::Tensor>& sinks,
                                                         double scale) {
  if (softcap.has_value()) {
    TORCH_CHECK_VALUE(std::isfinite(*softcap) && *softcap > 0.0, attn::str("softcap must be a "
                      "positive, finite number or None, got ", *softcap, "."));
    p.softcap = *softcap / scale;  // raw score units
    p.softcap_inv = scale / *softcap;
  }
  if (!sinks.has_value()) return std::nullopt;
  const torch::Tensor& t = *sinks;
  check_cuda_tensor(t, "sinks");
  const auto dtype = t.scalar_type();
  TORCH_CHECK_TYPE(dtype == torch::kFloat32 || dtype == torch::kHalf || dtype == torch::kBFloat16,
                   attn::str("sinks has dtype ", dtype, " but must be float32, float16 or bfloat16 "
                   "(one logit per query head); convert it with .float()."));
  TORCH_CHECK_VALUE(t.device() == q.device(), attn::str("sinks is on ", t.device(), " but q is on ",
                    q.device(), "; put them on the same GPU."));
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == q.size(1), attn::str("sinks must have shape [",
                    q.size(1), "] (one logit per query head, q having ", q.size(1), " heads) but "
                    "has shape ", t.sizes(), "."));
  torch::Tensor values = t.to(torch::kFloat32).contiguous();  // a no-op for float32 [H_q]
  p.sinks = values.data_ptr<float>();
  return values;
}

// GQA/MQA: the number of query heads per KV head; raises unless H_q is a multiple of H_kv.
inline int kv_group_size(const torch::Tensor& q, const torch::Tensor& k) {
  const int64_t heads_q = q.size(1), heads_kv = k.size(1);
  TORCH_CHECK_VALUE(heads_kv >= 1 && heads_q % heads_kv == 0, attn::str("q has ", heads_q, " heads and k/v ",
                    heads_kv, ": grouped-query attention needs the query heads to be a multiple of "
                    "the key/value heads (query head h reads KV head h / (H_q / H_kv))."));
  return static_cast<int>(heads_q / heads_kv);
}

// q [B, H_q, S_q, D], k and v [B, H_kv, S_k, D] (ranks checked by the caller): k and v of one
// shape with q's batch and head_dim, none empty, H_q a multiple of H_kv. Returns H_q / H_kv.
inline int check_qkv_shapes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3),
                    attn::str("k and v must both be [batch, kv_heads, seq_k, head_dim] with q's batch and "
                    "head_dim, q being [batch, heads, seq_q, head_dim]; got q ", q.sizes(), ", k ",
                    k.sizes(), " and v ", v.sizes(), "."));
  check_nonempty(q, "q");
  check_nonempty(k, "k");
  return kv_group_size(q, k);
}

// The tensor-core entries' arguments (mma.sync, Hopper, the grouped-query decode): q, k, v
// CUDA tensors of one 16-bit dtype, each [B, H, S, D], shaped as check_qkv_shapes wants.
// Returns H_q / H_kv.
inline int check_half_qkv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  check_cuda_tensor(q, "q");
  check_cuda_tensor(k, "k");
  check_cuda_tensor(v, "v");
  check_dtype(q, "q", {torch::kHalf, torch::kBFloat16});
  check_same(q, "q", k, "k");
  check_same(q, "q", v, "v");
  check_dim(q, "q", 4, "[batch, heads, seq_q, head_dim]");
  check_dim(k, "k", 4, "[batch, kv_heads, seq_k, head_dim]");
  check_dim(v, "v", 4, "[batch, kv_heads, seq_k, head_dim]");
  return check_qkv_shapes(q, k, v);
}

}  // namespace attn
