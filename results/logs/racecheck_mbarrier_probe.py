"""Does compute-sanitizer's racecheck model mbarrier ordering? Thread 0 writes a shared word then
arrives on an mbarrier (release); warps 1..3 wait on it (acquire) and read the word. Correct by
the PTX memory model; a racecheck hazard here means the tool does not model mbarriers.
    compute-sanitizer --tool racecheck python .scratch/racecheck_mbarrier_probe.py"""
import torch
from torch.utils.cpp_extension import load_inline
cuda = r'''
#include <cstdint>
__device__ __forceinline__ uint32_t s32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__global__ void probe(int* out) {
  __shared__ __align__(8) uint64_t bar;
  __shared__ int slot;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(s32(&bar)), "r"(1));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    slot = 42;
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(s32(&bar)) : "memory");
  } else if (threadIdx.x >= 32) {
    asm volatile("{ .reg .pred P; WAIT: mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1; @!P bra WAIT; }"
                 :: "r"(s32(&bar)), "r"(0) : "memory");
    out[threadIdx.x] = slot;
  }
}
torch::Tensor run() {
  auto out = torch::zeros({128}, torch::dtype(torch::kInt32).device(torch::kCUDA));
  probe<<<1, 128>>>(out.data_ptr<int>());
  return out;
}
'''
ext = load_inline("racecheck_mbarrier_probe", cpp_sources="torch::Tensor run();", cuda_sources=cuda,
                  functions=["run"], extra_cuda_cflags=["-arch=sm_90a"])
o = ext.run(); torch.cuda.synchronize()
print("reads:", sorted(set(o[32:].tolist())))
