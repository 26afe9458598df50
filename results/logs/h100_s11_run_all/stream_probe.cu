// Stream probe: how fast can one kernel READ a 64 or 128 MiB buffer (and fold it to a word per
// block) on this GPU, by each structure a decode could take? Against the copy bandwidth of the
// same run. Graph replays of 8 calls over 4 rotating buffers (4x the size: beyond L2), with and
// without programmatic dependent launch (PDL), in alternating rounds; the median per call.
//
// Structures (each folds 16-byte words with xor so no load is dead):
//   regs_static  G blocks x 512 threads, one contiguous range per block, U loads in flight per thread
//   regs_many    short blocks of `chunk` bytes each (an elementwise kernel's shape)
//   regs_dyn     a persistent grid claiming `chunk`-byte pieces by atomicAdd (one claimed ahead)
//   cpasync_ring 8 warps, each a private ring of S stages of 8 KB by cp.async (the decode's loads)
//   bulk_ring    8 warps, each a private ring of S stages of B bytes by cp.async.bulk + mbarrier
// nvcc -O3 -arch=sm_90a -o stream_probe stream_probe.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

__device__ __forceinline__ uint32_t block_fold(uint32_t acc) {
  __shared__ uint32_t red[32];
  for (int o = 16; o; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) acc ^= red[w];
  }
  return acc;
}

// Contiguous range per block; U 16-byte loads per thread in flight.
template <int U>
__global__ void regs_static(const uint4* __restrict__ src, int64_t n16, uint32_t* out) {
  pdl_wait();
  pdl_launch();
  const int64_t per = (n16 + gridDim.x - 1) / gridDim.x;
  const int64_t lo = blockIdx.x * per, hi = min(n16, lo + per);
  uint32_t acc = 0;
  const int T = blockDim.x;
  int64_t i = lo + threadIdx.x;
  for (; i + (U - 1) * T < hi; i += U * T) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld_stream(src + i + u * T);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= fold(v[u]);
  }
  for (; i < hi; i += T) acc ^= fold(ld_stream(src + i));
  acc = block_fold(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

// Persistent grid, pieces of `piece16` words claimed by atomicAdd, one claimed ahead; the last
// block out resets the counters (graph replays).
template <int U>
__global__ void regs_dyn(const uint4* __restrict__ src, int64_t n16, int64_t piece16, uint32_t* out,
                         unsigned* counters) {
  pdl_wait();
  pdl_launch();
  __shared__ int64_t claim[2];
  const int64_t pieces = (n16 + piece16 - 1) / piece16;
  if (threadIdx.x == 0) claim[0] = blockIdx.x, claim[1] = gridDim.x + atomicAdd(&counters[0], 1u);
  __syncthreads();
  uint32_t acc = 0;
  const int T = blockDim.x;
  int slot = 0;
  for (;;) {
    const int64_t pc = claim[slot];
    if (pc >= pieces) break;
    const int64_t lo = pc * piece16, hi = min(n16, lo + piece16);
    int64_t i = lo + threadIdx.x;
    for (; i + (U - 1) * T < hi; i += U * T) {
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = ld_stream(src + i + u * T);
#pragma unroll
      for (int u = 0; u < U; ++u) acc ^= fold(v[u]);
    }
    for (; i < hi; i += T) acc ^= fold(ld_stream(src + i));
    __syncthreads();  // everyone has read claim[slot ^ 1]... and claim[slot]
    if (threadIdx.x == 0) claim[slot] = gridDim.x + atomicAdd(&counters[0], 1u);
    slot ^= 1;
    __syncthreads();
  }
  acc = block_fold(acc);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = acc;
    __threadfence();
    if (atomicAdd(&counters[1], 1u) == gridDim.x - 1) {
      counters[0] = 0;
      counters[1] = 0;
      __threadfence();
    }
  }
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 8 warps, each a private ring of S stages of 8 KB by cp.async (16 per lane per stage), every
// 8th stage-sized piece of the block's contiguous range. The consumer reads the stage back.
// MERGE > 0: the decode's tail as well. Blocks come in groups of 32 (a KV head's 32 splits):
// each writes a 4 KB float partial and an lse, fences, counts itself; the last MERGE blocks of a
// group wait for the count and merge the group's 32 partials, 1/MERGE of the columns each
// (lse weights, the sum), writing 1024 floats; the last merger resets the group's counters.
template <int MERGE>
__device__ __forceinline__ void split_tail(uint32_t acc, float* partial, float* lse, float* merged,
                                           unsigned* counters) {
  constexpr int kSplits = 32, kCols = 1024;
  __shared__ int ticket;
  const int group = blockIdx.x / kSplits, first = group * kSplits;
  const float v = static_cast<float>(acc & 0xffff) * 1e-4f;
  for (int c = threadIdx.x; c < kCols; c += blockDim.x) partial[blockIdx.x * kCols + c] = v + c;
  if (threadIdx.x == 0) lse[blockIdx.x] = v;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) ticket = atomicAdd(&counters[2 * group], 1u);
  __syncthreads();
  const int merger = ticket - (kSplits - MERGE);
  if (merger < 0) return;
  if (threadIdx.x == 0) {
    while (atomicAdd(&counters[2 * group], 0u) < kSplits) {
    }
  }
  __syncthreads();
  __threadfence();
  __shared__ float weight[kSplits];
  if (threadIdx.x < kSplits) {
    const float l = __ldcg(&lse[first + threadIdx.x]);
    float m = l;
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float w = exp2f(l - m);
    float sum = w;
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    weight[threadIdx.x] = w / sum;
  }
  __syncthreads();
  constexpr int kShare = kCols / MERGE;
  for (int c = merger * kShare + threadIdx.x; c < (merger + 1) * kShare; c += blockDim.x) {
    float o = 0.f;
#pragma unroll 8
    for (int s = 0; s < kSplits; ++s) o = fmaf(weight[s], __ldcg(&partial[(first + s) * kCols + c]), o);
    merged[group * kCols + c] = o;
  }
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(&counters[2 * group + 1], 1u) == MERGE - 1) {
    counters[2 * group] = 0;
    counters[2 * group + 1] = 0;
  }
}

// The tail's floor: the partial and lse written, the fence, the count; no merge at all (the
// last block of a group only resets the count). MERGE = -1 below.
__device__ __forceinline__ void split_ticket_only(uint32_t acc, float* partial, float* lse,
                                                  unsigned* counters) {
  constexpr int kSplits = 32, kCols = 1024;
  const int group = blockIdx.x / kSplits;
  const float v = static_cast<float>(acc & 0xffff) * 1e-4f;
  for (int c = threadIdx.x; c < kCols; c += blockDim.x) partial[blockIdx.x * kCols + c] = v + c;
  if (threadIdx.x == 0) lse[blockIdx.x] = v;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(&counters[2 * group], 1u) == kSplits - 1) counters[2 * group] = 0;
}

// A merge with every load in flight at once (MERGE = -8: 8 mergers): each merger's 256 threads
// read its 128 columns of the 32 partials as float4 (4 each) and the 32 lse together, weight,
// and reduce over the splits in shared memory.
__device__ __forceinline__ void split_tail_fast(uint32_t acc, float* partial, float* lse, float* merged,
                                                unsigned* counters) {
  constexpr int kSplits = 32, kCols = 1024, kMergers = 8, kShare = kCols / kMergers;  // 128
  __shared__ int ticket;
  __shared__ float weight[kSplits];
  __shared__ float4 sums[8][kShare / 4];
  const int group = blockIdx.x / kSplits, first = group * kSplits;
  const float v = static_cast<float>(acc & 0xffff) * 1e-4f;
  for (int c = threadIdx.x; c < kCols; c += blockDim.x) partial[blockIdx.x * kCols + c] = v + c;
  if (threadIdx.x == 0) lse[blockIdx.x] = v;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) ticket = atomicAdd(&counters[2 * group], 1u);
  __syncthreads();
  const int merger = ticket - (kSplits - kMergers);
  if (merger < 0) return;
  if (threadIdx.x == 0) {
    while (atomicAdd(&counters[2 * group], 0u) < kSplits) {
    }
  }
  __syncthreads();
  __threadfence();
  const int col4 = threadIdx.x & 31, split_lo = threadIdx.x >> 5;  // splits split_lo + 8 j
  float4 part[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    part[j] = __ldcg(reinterpret_cast<const float4*>(&partial[(first + split_lo + 8 * j) * kCols +
                                                              merger * kShare]) + col4);
  if (threadIdx.x < kSplits) {
    const float l = __ldcg(&lse[first + threadIdx.x]);
    float m = l;
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float w = exp2f(l - m);
    float sum = w;
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    weight[threadIdx.x] = w / sum;
  }
  __syncthreads();
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float w = weight[split_lo + 8 * j];
    o.x = fmaf(w, part[j].x, o.x), o.y = fmaf(w, part[j].y, o.y);
    o.z = fmaf(w, part[j].z, o.z), o.w = fmaf(w, part[j].w, o.w);
  }
  sums[split_lo][col4] = o;
  __syncthreads();
  if (threadIdx.x < 32) {
    float4 t = sums[0][threadIdx.x];
    for (int r = 1; r < 8; ++r) {
      const float4 u = sums[r][threadIdx.x];
      t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
    }
    reinterpret_cast<float4*>(&merged[group * kCols + merger * kShare])[threadIdx.x] = t;
  }
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(&counters[2 * group + 1], 1u) == kMergers - 1) {
    counters[2 * group] = 0;
    counters[2 * group + 1] = 0;
  }
}

// MERGE = -2: no ticket. Each split block writes its partial and lse, then raises its own flag
// (release: its writes are visible before the flag); a dedicated merger block per 32-split group,
// resident from the start on an SM the split grid leaves free, folds the partials in as their
// flags rise (online lse rescaling), so that after the last split only its own partial is read.
__device__ __forceinline__ void split_flag(uint32_t acc, float* partial, float* lse, unsigned* flags) {
  constexpr int kCols = 1024;
  const float v = static_cast<float>(acc & 0xffff) * 1e-4f;
  for (int c = threadIdx.x; c < kCols; c += blockDim.x) partial[blockIdx.x * kCols + c] = v + c;
  if (threadIdx.x == 0) lse[blockIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + 64 + blockIdx.x), "r"(1u) : "memory");
  }
}

__device__ __forceinline__ void incremental_merge(const float* partial, const float* lse, float* merged,
                                                  unsigned* flags, int group) {
  constexpr int kSplits = 32, kCols = 1024;
  const int first = group * kSplits;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float m = -INFINITY, l = 0.f;
  for (int s = 0; s < kSplits; ++s) {
    if (threadIdx.x == 0) {
      unsigned f = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(flags + 64 + first + s) : "memory");
      } while (f == 0);
    }
    __syncthreads();
    const float ls = __ldcg(&lse[first + s]);
    const float4 p = __ldcg(reinterpret_cast<const float4*>(&partial[(first + s) * kCols]) + threadIdx.x);
    const float m_new = fmaxf(m, ls);
    const float a = m == -INFINITY ? 0.f : exp2f(m - m_new), w = exp2f(ls - m_new);
    acc.x = fmaf(acc.x, a, w * p.x), acc.y = fmaf(acc.y, a, w * p.y);
    acc.z = fmaf(acc.z, a, w * p.z), acc.w = fmaf(acc.w, a, w * p.w);
    l = fmaf(l, a, w);
    m = m_new;
  }
  reinterpret_cast<float4*>(&merged[group * kCols])[threadIdx.x] =
      make_float4(acc.x / l, acc.y / l, acc.z / l, acc.w / l);
  __syncthreads();
  if (threadIdx.x < kSplits) flags[64 + first + threadIdx.x] = 0;  // for the next launch
}

template <int S, int MERGE = 0>
__global__ void __launch_bounds__(256, 1) cpasync_ring(const uint4* __restrict__ src, int64_t n16,
                                                        uint32_t* out, float* partial, float* lse, float* merged,
                                                        unsigned* counters) {
  extern __shared__ __align__(128) unsigned char smem[];
  pdl_wait();
  pdl_launch();
  constexpr int kStage16 = 8192 / 16;  // 512 words
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // MERGE == -2: the last 4 blocks are dedicated mergers (one per 32-split group), the others split.
  const int split_blocks = MERGE == -2 ? gridDim.x - 4 : gridDim.x;
  if (MERGE == -2 && blockIdx.x >= split_blocks) {
    incremental_merge(partial, lse, merged, counters, blockIdx.x - split_blocks);
    return;
  }
  const int64_t total = n16 / kStage16;  // whole stages, spread evenly over the blocks
  const int64_t lo = blockIdx.x * total / split_blocks * kStage16;
  const int64_t hi = (blockIdx.x + 1) * total / split_blocks * kStage16;
  const int64_t tiles = (hi - lo) / kStage16;
  const int64_t mine = tiles > warp ? (tiles - warp + 7) / 8 : 0;
  uint4* ring = reinterpret_cast<uint4*>(smem) + warp * S * kStage16;
  auto load = [&](int stage, int64_t t) {
    const int64_t base = lo + (warp + t * 8) * kStage16;
    for (int j = lane; j < kStage16; j += 32) {
      const int64_t g = base + j;
      const uint32_t dst = smem_u32(ring + stage * kStage16 + j);
      const int bytes = g < hi ? 16 : 0;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src + min(g, hi - 1)),
                   "r"(bytes));
    }
  };
  for (int s = 0; s < S - 1; ++s) {
    if (s < mine) load(s, s);
    asm volatile("cp.async.commit_group;");
  }
  uint32_t acc = 0;
  for (int64_t it = 0; it < mine; ++it) {
    const int64_t next = it + S - 1;
    if (next < mine) load(next % S, next);
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group %0;" ::"n"(S - 1));
    __syncwarp();
    const uint4* st = ring + (it % S) * kStage16;
    for (int j = lane; j < kStage16; j += 32) acc ^= fold(st[j]);
    __syncwarp();
  }
  asm volatile("cp.async.wait_group 0;");
  acc = block_fold(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
  if constexpr (MERGE != 0) {
    __shared__ uint32_t acc_all;
    if (threadIdx.x == 0) acc_all = acc;
    __syncthreads();
    if constexpr (MERGE > 0) split_tail<MERGE>(acc_all, partial, lse, merged, counters);
    if constexpr (MERGE == -1) split_ticket_only(acc_all, partial, lse, counters);
    if constexpr (MERGE == -8) split_tail_fast(acc_all, partial, lse, merged, counters);
    if constexpr (MERGE == -2) split_flag(acc_all, partial, lse, counters);
  }
}

// 8 warps, each a private ring of S stages of B bytes filled by one cp.async.bulk (lane 0) that
// completes on the stage's mbarrier; the warp reads the stage back, then lane 0 refills it.
template <int S, int B>
__global__ void __launch_bounds__(256, 1) bulk_ring(const uint4* __restrict__ src, int64_t n16,
                                                     uint32_t* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[8][S];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    for (int s = 0; s < S; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[warp][s])));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncwarp();
  pdl_wait();
  pdl_launch();
  constexpr int kStage16 = B / 16;
  const int64_t total = n16 / kStage16;  // whole stages, spread evenly over the blocks
  const int64_t lo = blockIdx.x * total / gridDim.x * kStage16;
  const int64_t hi = (blockIdx.x + 1) * total / gridDim.x * kStage16;
  const int64_t tiles = (hi - lo) / kStage16;
  const int64_t mine = tiles > warp ? (tiles - warp + 7) / 8 : 0;
  uint4* ring = reinterpret_cast<uint4*>(smem) + warp * S * kStage16;
  auto load = [&](int stage, int64_t t) {
    const uint4* g = src + lo + (warp + t * 8) * kStage16;
    const uint32_t bar = smem_u32(&full[warp][stage]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(B));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(ring + stage * kStage16)),
        "l"(g), "r"(B), "r"(bar)
        : "memory");
  };
  if (lane == 0)
    for (int s = 0; s < S && s < mine; ++s) load(s, s);
  uint32_t acc = 0;
  for (int64_t it = 0; it < mine; ++it) {
    const int stage = it % S;
    const uint32_t phase = (it / S) & 1;
    const uint32_t bar = smem_u32(&full[warp][stage]);
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(bar), "r"(phase));
    }
    const uint4* st = ring + stage * kStage16;
    for (int j = lane; j < kStage16; j += 32) acc ^= fold(st[j]);
    __syncwarp();
    if (lane == 0 && it + S < mine) load(stage, it + S);
  }
  acc = block_fold(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

struct Launch {
  std::string name;
  std::function<void(cudaStream_t, const uint4*, bool)> fn;
};

template <typename... KArgs, typename... Args>
void launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl,
            Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, k, static_cast<KArgs>(args)...));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  uint32_t* out;
  unsigned* counters;
  CK(cudaMalloc(&out, 1 << 20));
  CK(cudaMalloc(&counters, 64));
  CK(cudaMemset(counters, 0, 64));

  // Copy bandwidth as common.timing measures it: 2 GiB, read + written bytes.
  const size_t big = size_t(2) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, big));
  CK(cudaMalloc(&b, big));
  CK(cudaMemset(a, 1, big));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> cts;
  for (int r = 0; r < 23; ++r) {
    CK(cudaEventRecord(e0, st));
    CK(cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 3) cts.push_back(ms);
  }
  std::sort(cts.begin(), cts.end());
  const double copy_gbs = 2.0 * big / (cts[cts.size() / 2] * 1e-3) / 1e9;
  printf("copy bandwidth %.0f GB/s\n", copy_gbs);
  CK(cudaFree(b));

  CK(cudaFuncSetAttribute(cpasync_ring<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * 8192));
  CK(cudaFuncSetAttribute(cpasync_ring<3, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * 8192));
  CK(cudaFuncSetAttribute(cpasync_ring<3, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * 8192));
  CK(cudaFuncSetAttribute(cpasync_ring<3, -1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * 8192));
  CK(cudaFuncSetAttribute(cpasync_ring<3, -8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * 8192));
  CK(cudaFuncSetAttribute(cpasync_ring<3, -2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * 8192));
  float *partial, *lse, *merged;
  unsigned* gcounters;
  CK(cudaMalloc(&partial, 128 * 1024 * 4));
  CK(cudaMalloc(&lse, 128 * 4));
  CK(cudaMalloc(&merged, 4 * 1024 * 4));
  CK(cudaMalloc(&gcounters, 1024));
  CK(cudaMemset(gcounters, 0, 1024));
  CK(cudaFuncSetAttribute(bulk_ring<3, 8192>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 3 * 8192));
  CK(cudaFuncSetAttribute(bulk_ring<2, 12288>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 2 * 12288));
  CK(cudaFuncSetAttribute(bulk_ring<6, 4096>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * 6 * 4096));

  for (size_t mib : {64, 128}) {
    const size_t bytes = mib << 20;
    const int64_t n16 = bytes / 16;
    const uint4* bufs[4];
    for (int i = 0; i < 4; ++i) bufs[i] = reinterpret_cast<const uint4*>(static_cast<char*>(a) + i * bytes);
    std::vector<Launch> ls;
    for (int g : {1, 2, 4}) {
      ls.push_back({"regs_static U8 G" + std::to_string(g) + "xSM", [=](cudaStream_t s, const uint4* p, bool pdl) {
                      launch(regs_static<8>, dim3(g * sms), dim3(512), 0, s, pdl, p, n16, out);
                    }});
    }
    ls.push_back({"regs_static U16 G1xSM", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(regs_static<16>, dim3(sms), dim3(512), 0, s, pdl, p, n16, out);
                  }});
    for (int kb : {32, 128}) {
      const int64_t blocks = bytes / (kb << 10);
      ls.push_back({"regs_many " + std::to_string(kb) + "KB blocks", [=](cudaStream_t s, const uint4* p, bool pdl) {
                      launch(regs_static<4>, dim3(blocks), dim3(512), 0, s, pdl, p, n16, out);
                    }});
    }
    for (int kb : {32, 128}) {
      for (int g : {1, 2}) {
        const int64_t piece16 = (int64_t(kb) << 10) / 16;
        ls.push_back({"regs_dyn " + std::to_string(kb) + "KB G" + std::to_string(g) + "xSM",
                      [=](cudaStream_t s, const uint4* p, bool pdl) {
                        launch(regs_dyn<8>, dim3(g * sms), dim3(512), 0, s, pdl, p, n16, piece16, out, counters);
                      }});
      }
    }
    ls.push_back({"cpasync_ring S3 (decode-like)", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(cpasync_ring<3>, dim3(sms), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out, nullptr, nullptr,
                           nullptr, nullptr);
                  }});
    ls.push_back({"cpasync_ring S3 128 blocks", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(cpasync_ring<3>, dim3(128), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out, nullptr, nullptr,
                           nullptr, nullptr);
                  }});
    for (int nb : {64, 96, 112, 120}) {  // fewer SMs streaming: what a cluster-per-head merge would leave
      ls.push_back({"cpasync_ring S3 " + std::to_string(nb) + " blocks", [=](cudaStream_t s, const uint4* p, bool pdl) {
                      launch(cpasync_ring<3>, dim3(nb), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out, nullptr, nullptr,
                             nullptr, nullptr);
                    }});
    }
    ls.push_back({"cpasync_ring S3 128 blocks + split merge (1 merger)", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(cpasync_ring<3, 1>, dim3(128), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out, partial, lse,
                           merged, gcounters);
                  }});
    ls.push_back({"cpasync_ring S3 128 blocks + split merge (8 mergers)", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(cpasync_ring<3, 8>, dim3(128), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out, partial, lse,
                           merged, gcounters);
                  }});
    ls.push_back({"cpasync_ring S3 128 blocks + partial, fence, count only", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(cpasync_ring<3, -1>, dim3(128), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out, partial, lse,
                           merged, gcounters);
                  }});
    ls.push_back({"cpasync_ring S3 128 blocks + split merge (8 mergers, float4, one trip)", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(cpasync_ring<3, -8>, dim3(128), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out, partial, lse,
                           merged, gcounters);
                  }});
    ls.push_back({"cpasync_ring S3 128 blocks + 4 dedicated incremental mergers (flags, no ticket)",
                  [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(cpasync_ring<3, -2>, dim3(132), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out, partial, lse,
                           merged, gcounters);
                  }});
    ls.push_back({"bulk_ring S3 8KB", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(bulk_ring<3, 8192>, dim3(sms), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out);
                  }});
    ls.push_back({"bulk_ring S3 8KB 128 blocks", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(bulk_ring<3, 8192>, dim3(128), dim3(256), 8 * 3 * 8192, s, pdl, p, n16, out);
                  }});
    ls.push_back({"bulk_ring S6 4KB", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(bulk_ring<6, 4096>, dim3(sms), dim3(256), 8 * 6 * 4096, s, pdl, p, n16, out);
                  }});
    ls.push_back({"bulk_ring S2 12KB", [=](cudaStream_t s, const uint4* p, bool pdl) {
                    launch(bulk_ring<2, 12288>, dim3(sms), dim3(256), 8 * 2 * 12288, s, pdl, p, n16, out);
                  }});
    ls.push_back({"memcpy half->half (reads+writes these bytes)", [=](cudaStream_t s, const uint4* p, bool) {
                    CK(cudaMemcpyAsync(const_cast<uint4*>(p), p + n16 / 2, bytes / 2, cudaMemcpyDeviceToDevice, s));
                  }});

    // One graph per (launch, pdl): 8 calls over the 4 buffers.
    constexpr int kCalls = 8;
    std::map<std::string, cudaGraphExec_t> graphs;
    std::vector<std::string> order;
    for (auto& l : ls) {
      for (bool pdl : {false, true}) {
        if (pdl && l.name.rfind("memcpy", 0) == 0) continue;
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int c = 0; c < kCalls; ++c) l.fn(st, bufs[c % 4], pdl);
        CK(cudaStreamEndCapture(st, &g));
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, g, 0));
        const std::string key = l.name + (pdl ? " +pdl" : "");
        graphs[key] = ge;
        order.push_back(key);
        CK(cudaGraphLaunch(ge, st));  // warm-up
      }
    }
    CK(cudaStreamSynchronize(st));
    std::map<std::string, std::vector<float>> samples;
    for (int round = 0; round < 7; ++round) {
      for (auto& key : order) {
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < 10; ++r) CK(cudaGraphLaunch(graphs[key], st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        samples[key].push_back(ms * 1e3f / (10 * kCalls));
      }
    }
    printf("\n%zu MiB read per call; us per call (median of 7 alternating rounds; bytes / time / copy bandwidth)\n", mib);
    for (auto& key : order) {
      auto v = samples[key];
      std::sort(v.begin(), v.end());
      const double us = v[v.size() / 2];
      printf("  %-48s %8.2f  (%.3f)  [%.2f..%.2f]\n", key.c_str(), us, bytes / (us * 1e-6) / (copy_gbs * 1e9),
             v.front(), v.back());
    }
  }
  CK(cudaGetLastError());
  printf("done\n");
  return 0;
}
