"""v7's work-tile slot protocol alone, for racecheck (next session's first probe): thread 0 (the
producer) writes the slot, arrives on q_full; 8 consumer warps wait on q_full, every lane reads
the slot, __syncwarp, lane 0 arrives on q_empty (count 8); the producer waits on q_empty before
the next write. Correct by the PTX memory model; if racecheck reports hazards here, it does not
follow __syncwarp + one lane's arrive (the tool); if not, v7's report is something else.
    compute-sanitizer --tool racecheck python .scratch/racecheck_v7_pattern_probe.py"""
import torch
from torch.utils.cpp_extension import load_inline
cuda = r'''
#include <cstdint>
__device__ __forceinline__ uint32_t s32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void arrive(uint64_t* b) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(s32(b)) : "memory"); }
__device__ __forceinline__ void wait(uint64_t* b, uint32_t parity) {
  asm volatile("{ .reg .pred P; WAIT: mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1; @!P bra WAIT; }"
               :: "r"(s32(b)), "r"(parity) : "memory"); }
__global__ void probe(int* out, int tiles, int every_lane) {
  __shared__ __align__(8) uint64_t q_full, q_empty;
  __shared__ int slot;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(s32(&q_full)), "r"(1));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(s32(&q_empty)), "r"(every_lane ? 256 : 8));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    if (threadIdx.x == 0) {
      for (int i = 0;; ++i) {
        if (i > 0) wait(&q_empty, (i - 1) & 1);
        slot = i < tiles ? i : -1;
        arrive(&q_full);
        if (i >= tiles) break;
      }
    }
  } else {
    int sum = 0;
    for (uint32_t parity = 0;; parity ^= 1) {
      wait(&q_full, parity);
      const int tile = slot;
      if (tile < 0) break;
      sum += tile;
      if (every_lane) { arrive(&q_empty); }
      else { __syncwarp(); if ((threadIdx.x & 31) == 0) arrive(&q_empty); }
    }
    out[threadIdx.x] = sum;
  }
}
torch::Tensor run(int64_t tiles, int64_t every_lane) {
  auto out = torch::zeros({384}, torch::dtype(torch::kInt32).device(torch::kCUDA));
  probe<<<1, 384>>>(out.data_ptr<int>(), static_cast<int>(tiles), static_cast<int>(every_lane));
  return out;
}
'''
ext = load_inline("racecheck_v7_pattern_probe", cpp_sources="torch::Tensor run(int64_t tiles, int64_t every_lane);",
                  cuda_sources=cuda, functions=["run"], extra_cuda_cflags=["-arch=sm_90a"])
import sys
every_lane = int(sys.argv[1]) if len(sys.argv) > 1 else 0
o = ext.run(5, every_lane); torch.cuda.synchronize()
print("every_lane", every_lane, "sums:", sorted(set(o[128:].tolist())), "(expected [10])")
