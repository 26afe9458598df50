// Small pieces the task 5 kernels share (decode.cu, decode_linear.cu, norm.cu, rope_append.cu):
// element conversions to and from the fp32 every kernel computes in, and a per-sequence
// integer (a position, a length) that is either a host value or read on the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>

#include "attention_checks.cuh"

namespace attn {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// A per-sequence integer the kernels read at run time: a host value, or a CUDA int32 tensor
// (0-d: the same value for every sequence; [B]: one per sequence). Reading it on the device
// keeps a captured CUDA graph valid while the tensor is incremented between replays.
struct RuntimeInt {
  const int* device_values;  // nullptr: use host_value
  int64_t stride;            // 0 when every sequence reads element 0
  int64_t host_value;
  __device__ __forceinline__ int64_t at(int64_t b) const {
    return device_values != nullptr ? static_cast<int64_t>(device_values[b * stride]) : host_value;
  }
};

// `value`, or `tensor` when given (checked: CUDA int32 on `device`, 0-d or [batch]).
inline RuntimeInt runtime_int(int64_t value, const std::optional<torch::Tensor>& tensor,
                              const char* name, int64_t batch, const torch::Device& device) {
  if (!tensor.has_value()) return RuntimeInt{nullptr, 0, value};
  const torch::Tensor& t = *tensor;
  attn::check_cuda_tensor(t, name);
  TORCH_CHECK_TYPE(t.scalar_type() == torch::kInt32, attn::str(name,
                   " must be an int32 tensor but has dtype ", t.scalar_type(),
                   "; create it with dtype=torch.int32."));
  TORCH_CHECK_VALUE(t.device() == device, attn::str(name, " is on ", t.device(),
                    " but the attention inputs are on ", device, "; put them on the same GPU."));
  const bool one_value = t.dim() == 0 || (t.dim() == 1 && t.size(0) == 1);
  TORCH_CHECK_VALUE(one_value || (t.dim() == 1 && t.size(0) == batch), attn::str(name,
                    " must be a 0-d tensor or have shape [", batch,
                    "] (one value per sequence) but has shape ", t.sizes(), "."));
  return RuntimeInt{t.data_ptr<int32_t>(), one_value ? 0 : t.stride(0), 0};
}

inline void check_last_dim_contiguous(const torch::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.size(-1) == 1 || t.stride(-1) == 1, attn::str(name,
                    " must have a contiguous last dimension (stride 1) but its strides are ",
                    t.strides(), "; call .contiguous() first."));
}

inline bool aligned16(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace attn
