// Small pieces the task 5 kernels share (decode.cu, decode_grouped.cu, decode_linear.cu,
// norm.cu, rope_append.cu): element conversions to and from the fp32 every kernel computes in,
// a per-sequence integer (a position, a length) that is either a host value or read on the
// device, and overlapped launches for the fused decode kernels. What only the attention decode
// kernels share is in decode_common.cuh.
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
  // The same value read from L2 (__ldcg: not kept in L1), for a kernel that looks at it before
  // wait_for_previous_kernel() only to choose what to prefetch: it reads it again with at().
  __device__ __forceinline__ int64_t peek(int64_t b) const {
    return device_values != nullptr ? static_cast<int64_t>(__ldcg(device_values + b * stride))
                                    : host_value;
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

// Overlapped launches (programmatic dependent launch, Hopper and later). A decode step is ~200
// small kernels, and between two of them the GPU drains: the last blocks of one finish while
// the next is still being launched, and its weight stream has not started. A kernel launched
// with launch_overlapped may start while the kernel before it in the stream is finishing:
// it must call wait_for_previous_kernel() before it reads anything that kernel wrote, or
// writes anything. Only constant data, such as weights, may be read before; a prefetch into
// L2, where every write lands, may name any address, since it cannot make a load see an old
// value (the decode kernel prefetches its first keys so). A kernel calls
// let_next_kernel_start() once it has waited, so at most two kernels overlap. Before Hopper,
// or with ATTN_OVERLAP_LAUNCHES=0 (to measure what it buys), it is an ordinary launch and the
// two calls do nothing. The CUDA graph of a decode step keeps these overlaps.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Prefetches, for a kernel to issue before it waits (the contract above): `bytes` (a multiple
// of 16) at ptr (16-byte aligned) into L2, one request to the SM's bulk-copy unit holding no
// registers (Hopper; nothing before it); the 128-byte line at ptr into the SM's L1.
__device__ __forceinline__ void prefetch_to_l2(const void* ptr, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(ptr), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void prefetch_to_l1(const void* ptr) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(ptr));
}

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
  static int major[64] = {};  // per device, looked up once (0: not yet)
  const int device = c10::cuda::current_device();
  if (device >= 64) return false;
  if (major[device] == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major[device], cudaDevAttrComputeCapabilityMajor, device));
  }
  return major[device] >= 9;
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
