// The device side of device_values.cuh, without a torch header: element conversions to and
// from fp32, RuntimeInt (a per-sequence integer read on the device), and the device half of
// overlapped launches (wait_for_previous_kernel, let_next_kernel_start, the prefetches). The
// kernel headers include it (decode_common_device.cuh, decode_linear.cuh), so that the files
// that compile their instantiations (decode_*_fp16.cu, ...) parse no torch header; a host
// file includes device_values.cuh, which includes this one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

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

// Overlapped launches (programmatic dependent launch, Hopper and later). A decode step is ~200
// small kernels, and between two of them the GPU drains: the last blocks of one finish while
// the next is still being launched, and its weight stream has not started. A kernel launched
// with launch_overlapped may start while the kernel before it in the stream is finishing:
// it must call wait_for_previous_kernel() before it reads anything that kernel wrote, or
// writes anything. Only data no kernel of the step writes, such as weights, may be read before
// (and the cache rows settled before the step, where the caller says which: the GQA decode's
// fresh_keys); a prefetch into L2, where every write lands, may name any address, since it
// cannot make a load see an old value (the decode kernels prefetch their first keys so).
// A kernel calls let_next_kernel_start() once it has waited, so that at most two kernels
// overlap, except RoPE + append (rope_append.cu), which lets the decode attention after it
// start before it waits itself: that attention may then overlap the product before RoPE too,
// and before its own wait it reads only the settled rows, the lengths and the parameters.
// Before Hopper, or with ATTN_OVERLAP_LAUNCHES=0 (to measure what it buys), it is an ordinary
// launch and the two calls do nothing. The CUDA graph of a decode step keeps these overlaps.
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

}  // namespace attn
