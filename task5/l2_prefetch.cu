// Experiment: ask L2 for a weight while another kernel (the decode attention) streams the KV
// cache below the copy bandwidth, so that the product after it finds its weight in L2.
// One thread per chunk issues one bulk prefetch (cp.async.bulk.prefetch.L2: no registers,
// no completion to wait for); launched overlapped, it waits for nothing (weights are constant).

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/types.h>

#include <cstdint>

#include "attention_checks.cuh"
#include "device_values.cuh"

namespace {

constexpr int kThreads = 128;

__global__ void l2_prefetch_kernel(const char* base, int64_t bytes, int64_t chunk, bool evict_last) {
  attn::let_next_kernel_start();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int64_t at = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * chunk;
  if (at >= bytes) return;
  const uint32_t size = static_cast<uint32_t>(min(chunk, bytes - at));
  if (evict_last) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(base + at),
                 "r"(size), "l"(policy) : "memory");
  } else {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(base + at), "r"(size) : "memory");
  }
#endif
}

}  // namespace

// Prefetch the first max_bytes of t (contiguous, 16-byte aligned) into L2.
void l2_prefetch(torch::Tensor t, int64_t max_bytes, int64_t chunk, bool evict_last) {
  attn::check_cuda_tensor(t, "t");
  attn::check_contiguous(t, "t");
  TORCH_CHECK_VALUE(attn::aligned16(t) && chunk % 16 == 0 && chunk > 0, "l2_prefetch: 16-byte pieces");
  const int64_t bytes = std::min<int64_t>(t.numel() * t.element_size(), max_bytes) / 16 * 16;
  if (bytes <= 0) return;
  const c10::cuda::CUDAGuard guard(t.device());
  const int64_t pieces = (bytes + chunk - 1) / chunk;
  const int blocks = attn::ceil_div(pieces, kThreads);
  attn::launch_overlapped("l2_prefetch_kernel", l2_prefetch_kernel, dim3(blocks), dim3(kThreads),
                          c10::cuda::getCurrentCUDAStream(),
                          reinterpret_cast<const char*>(t.data_ptr()), bytes, chunk, evict_last);
}
