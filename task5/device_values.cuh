// Small pieces the task 5 kernels share (decode.cu, decode_grouped.cu, decode_linear.cu,
// norm.cu, rope_append.cu): element conversions to and from the fp32 every kernel computes in,
// a per-sequence integer (a position, a length) that is either a host value or read on the
// device, and overlapped launches for the fused decode kernels. What only the attention decode
// kernels share is in decode_common.cuh. The device-side pieces are in device_inline.cuh
// (no torch header, for the files that compile kernel instantiations); this header adds the
// host side: runtime_int, layout checks, overlapped launches.
#pragma once

#include <c10/cuda/CUDAFunctions.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "tensor_api.h"

#include <cstdint>
#include <cstdlib>
#include <optional>

#include "attention_checks.cuh"
#include "device_inline.cuh"
#include "device_query.cuh"

namespace attn {

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

// Overlapped launches: the device half (wait_for_previous_kernel, let_next_kernel_start, the
// contract a kernel keeps) is in device_inline.cuh; the host half follows.

// Whether the environment variable `name` switches something off (its value starts with '0').
// The measurement switches (ATTN_OVERLAP_LAUNCHES, ATTN_NORM_PREFETCH, ATTN_ROPE_PREFETCH) read
// it; those read on every call let one process compare both settings.
inline bool switched_off(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && env[0] == '0';
}

inline bool overlapped_launches_enabled() {
  static const bool off = switched_off("ATTN_OVERLAP_LAUNCHES");
  if (off) return false;
  return attn::device_attribute(cudaDevAttrComputeCapabilityMajor, c10::cuda::current_device()) >= 9;
}

// kernel<<<grid, block, smem_bytes, stream>>>(args...), overlapped where it can be and
// `overlap` asks for it; raises with the kernel's name if the launch fails (as check_launch does).
template <typename... Params, typename... Args>
void launch_maybe_overlapped(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                             size_t smem_bytes, bool overlap, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute overlap_attribute[1];
  overlap_attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap_attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = overlap_attribute;
  config.numAttrs = overlap && overlapped_launches_enabled() ? 1 : 0;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  (void)cudaGetLastError();  // the error is reported here, once
  TORCH_CHECK(launched == cudaSuccess, attn::str(name, " failed to launch: ", cudaGetErrorString(launched)));
}

// kernel<<<grid, block, 0, stream>>>(args...), overlapped where it can be.
template <typename... Params, typename... Args>
void launch_overlapped(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                       cudaStream_t stream, Args... args) {
  launch_maybe_overlapped(name, kernel, grid, block, 0, true, stream, args...);
}

}  // namespace attn
