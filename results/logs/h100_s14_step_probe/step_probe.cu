// What one persistent kernel could buy task 6's GQA decode step over its chain of kernels, in
// the memory system alone (no math): the step's byte streams, phase by phase, as
//   chain       one kernel per phase, launched overlapped (programmatic dependent launch, as
//               the step's kernels are), in a CUDA graph;
//   persistent  one kernel whose blocks run every phase, a grid barrier between phases;
//   persistent+ the same, each block issuing its first loads of the next phase (weights do not
//               depend on the phase before) before it waits at the barrier;
//   red barrier arrivals as fire-and-forget reductions, block 0 polling the count (run3, run4);
//   staged      the same, the next phase's first STAGE_KB of each block's slice copied into shared
//               memory in bulk (cp.async.bulk, mbarrier) before the barrier (run5 on);
//   dynamic     chunks of 64 KB claimed from a per-phase counter instead of fixed slices, in the
//               chain's kernels and in the persistent one (run6).
// Every stream is double-buffered (v1 of this probe, step_probe_v1.log, was not), and a phase
// reads its dependency after its first two batches of loads are issued (run3/ did it before).
// A phase reads a 32 KB activation vector written by the phase before (the dependency), then
// streams its bytes (16-byte loads, no L1 allocation, 8 in flight per thread, xor-folded) and
// writes its share of the next activation vector. One layer of the GQA course model (hidden
// 4096, 32/8 heads, B 4, ~1074 keys, bf16) is 8 phases: norm (tiny), qkv 50.3 MB, RoPE (tiny),
// attention 17.6 MB (K/V), o_proj 33.6 MB, norm (tiny), gate/up 268.4 MB, down 134.2 MB; 24 layers.
// Each figure: median of 7 alternating rounds of 5 replays; its own copy bandwidth (cudaMemcpy
// D2D, read + written bytes, as common.timing measures it).
//     nvcc -O3 -arch=sm_90a -o step_probe step_probe.cu && ./step_probe
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                 \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#ifndef THREADS
#define THREADS 512
#endif
constexpr int kThreads = THREADS;
constexpr int kUnroll = 8;
constexpr int kAct = 8192;  // floats in the activation vector (32 KB)
constexpr int kTinyBlocks = 4;
#ifndef STAGE_KB
#define STAGE_KB 160
#endif
constexpr int kStageBytes = STAGE_KB * 1024;  // persistent + staged: the next phase's first bytes per block

struct Phase {
  const uint4* w;  // the bytes it streams (null: a tiny phase)
  long long words;  // 16-byte words
};

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// The phase's dependency: every thread of the block reads its share of the activation vector.
__device__ __forceinline__ unsigned read_act(const float* act) {
  unsigned acc = 0;
  for (int i = threadIdx.x; i < kAct; i += blockDim.x) acc ^= __float_as_uint(__ldcg(act + i));
  return acc;
}

// ---- bulk copies into shared memory (the staging of persistent + staged) -----------------------
__device__ __forceinline__ void mbar_init(uint32_t mbar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(mbar) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t mbar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(mbar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t mbar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(mbar),
      "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t mbar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(mbar) : "memory");
}
__device__ __forceinline__ unsigned fold_staged(const uint4* staged, int words, uint32_t mbar, uint32_t parity) {
  mbar_wait(mbar, parity);
  unsigned acc = 0;
  for (int i = threadIdx.x; i < words; i += blockDim.x) {
    const uint4 v = staged[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc;
}

// A block's slice [lo, hi) of a phase's words, double-buffered: the next kUnroll loads of each
// thread are issued before the current ones are used, so loads stay in flight the whole way.
// `pre` holds words lo + t + u * blockDim.x (u < kUnroll), already issued when `preloaded`.
__device__ __forceinline__ void issue(uint4 (&v)[kUnroll], const uint4* w, long long i, long long hi) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (i + u * (long long)blockDim.x < hi) v[u] = ld_stream(w + i + u * blockDim.x);
}
// act_in: the phase's dependency, read after the first two batches of loads are issued (so
// that the read's trip to L2 does not leave the pipeline empty).
__device__ __forceinline__ unsigned stream(const uint4* w, long long lo, long long hi,
                                           const uint4 (&pre)[kUnroll], bool preloaded,
                                           const float* act_in, int dep_reads = 1,
                                           const uint4* staged = nullptr, int staged_words = 0,
                                           uint32_t mbar = 0, uint32_t parity = 0) {
  unsigned acc = 0;
  long long i = lo + threadIdx.x;
  uint4 cur[kUnroll] = {};
  if (preloaded) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = pre[u];
  } else {
    issue(cur, w, i, hi);
  }
  bool first = true;
  while (i < hi) {
    const long long next = i + kUnroll * (long long)blockDim.x;
    uint4 nx[kUnroll] = {};
    issue(nx, w, next, hi);
    if (first && act_in != nullptr)
      for (int r = 0; r < dep_reads; ++r) acc ^= read_act(act_in) * (2u * r + 1u);
    if (first && staged != nullptr) acc ^= fold_staged(staged, staged_words, mbar, parity);
    first = false;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i + u * (long long)blockDim.x < hi) acc ^= cur[u].x ^ cur[u].y ^ cur[u].z ^ cur[u].w;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = nx[u];
    i = next;
  }
  if (first && act_in != nullptr) acc ^= read_act(act_in);  // an empty slice
  if (first && staged != nullptr) acc ^= fold_staged(staged, staged_words, mbar, parity);
  return acc;
}

// Dynamic balancing: a phase's words in chunks of one batch (kThreads x kUnroll words, 64 KB at
// 512 threads), claimed by the blocks from a per-phase counter as they go (two ahead, so that a
// chunk's loads are in flight while the one before is folded), instead of a fixed slice each: the
// blocks that the memory system serves first take more. `first`: a chunk claimed (and its loads
// issued into `pre`) before the phase began, or -1.
__device__ __forceinline__ int claim(unsigned* counter, int* slot) {
  __syncthreads();
  if (threadIdx.x == 0) *slot = static_cast<int>(atomicAdd(counter, 1u));
  __syncthreads();
  return *slot;
}
__device__ __forceinline__ unsigned stream_dynamic(const uint4* w, long long words, unsigned* counter,
                                                   const float* act_in, int dep_reads, int first,
                                                   const uint4 (&pre)[kUnroll]) {
  __shared__ int slot;
  const long long chunk_words = static_cast<long long>(kUnroll) * blockDim.x;
  const int chunks = static_cast<int>((words + chunk_words - 1) / chunk_words);
  unsigned acc = 0;
  uint4 cur_v[kUnroll] = {};
  int cur = first;
  if (cur >= 0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur_v[u] = pre[u];
  } else {
    cur = claim(counter, &slot);
    if (cur < chunks) issue(cur_v, w, cur * chunk_words + threadIdx.x, words);
  }
  int next = cur < chunks ? claim(counter, &slot) : chunks;
  for (int r = 0; r < dep_reads; ++r) acc ^= read_act(act_in) * (2u * r + 1u);
  while (cur < chunks) {
    uint4 nx[kUnroll] = {};
    if (next < chunks) issue(nx, w, next * chunk_words + threadIdx.x, words);
    const int after = next < chunks ? claim(counter, &slot) : chunks;
    const long long base = cur * chunk_words + threadIdx.x;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * (long long)blockDim.x < words) acc ^= cur_v[u].x ^ cur_v[u].y ^ cur_v[u].z ^ cur_v[u].w;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur_v[u] = nx[u];
    cur = next;
    next = after;
  }
  return acc;
}

__device__ __forceinline__ void slice(const Phase& ph, int block, int blocks, long long& lo, long long& hi) {
  const long long per = (ph.words + blocks - 1) / blocks;
  lo = per * block < ph.words ? per * block : ph.words;
  hi = lo + per < ph.words ? lo + per : ph.words;
}

__device__ __forceinline__ void write_act(float* act, unsigned acc, int block, int blocks) {
  // the block's share of the next activation vector (its value depends on everything read)
  for (int i = block * blockDim.x + threadIdx.x; i < kAct; i += blocks * blockDim.x)
    act[i] = __uint_as_float((acc & 0x007fffffu) | 0x3f800000u);
}

// ---- the chain: one kernel per phase --------------------------------------------------------
__global__ void __launch_bounds__(kThreads) phase_kernel(Phase ph, const float* act_in, float* act_out,
                                                         unsigned* counter) {
  pdl_wait();
  unsigned acc = 0;
  const uint4 none[kUnroll] = {};
  if (ph.w != nullptr && counter != nullptr) {
    acc = stream_dynamic(ph.w, ph.words, counter, act_in, 1, -1, none);
  } else if (ph.w != nullptr) {
    long long lo, hi;
    slice(ph, blockIdx.x, gridDim.x, lo, hi);
    acc ^= stream(ph.w, lo, hi, none, false, act_in);
  } else {
    acc = read_act(act_in);
  }
  pdl_release();  // as the step's products: once the bytes are streamed
  write_act(act_out, acc, blockIdx.x, gridDim.x);
}

// ---- the persistent kernel ------------------------------------------------------------------
struct Barrier {
  unsigned count;
  unsigned generation;
};

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void grid_barrier(Barrier* bar, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire(&bar->generation);
    __threadfence();
    if (atomicAdd(&bar->count, 1u) == blocks - 1) {
      bar->count = 0;
      st_release(&bar->generation, gen + 1);
    } else {
      while (ld_acquire(&bar->generation) == gen) {
      }
    }
  }
  __syncthreads();
}

// The big phases only: a tiny phase (a norm, RoPE) is done by every block itself, redundantly,
// before the big phase after it (as a persistent step would: each block reads the 32 KB it needs),
// so a layer has one barrier per big phase.
// The same barrier with fire-and-forget arrivals (red.release): block 0 polls the count, resets
// it and releases the others by bumping the generation they spin on.
__device__ __forceinline__ void grid_barrier_red(Barrier* bar, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = ld_acquire(&bar->generation);
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(&bar->count) : "memory");
    if (blockIdx.x == 0) {
      while (ld_acquire(&bar->count) < blocks) {
      }
      bar->count = 0;
      st_release(&bar->generation, gen + 1);
    } else {
      while (ld_acquire(&bar->generation) == gen) {
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) persistent_kernel(const Phase* phases, int num_phases,
                                                              float* act0, float* act1, Barrier* bar,
                                                              int preload_next, int red_barrier,
                                                              int stage_words_max, unsigned* counters) {
  const int blocks = gridDim.x;
  extern __shared__ __align__(128) uint4 stage[];
  __shared__ __align__(8) unsigned long long stage_bar;
  const uint32_t mbar = static_cast<uint32_t>(__cvta_generic_to_shared(&stage_bar));
  const uint32_t stage_smem = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
  if (preload_next == 2 && threadIdx.x == 0) mbar_init(mbar);
  __syncthreads();
  uint32_t parity = 0;
  int staged_words = 0;   // words of this phase's slice already in `stage` (or on their way)
  uint4 pre[kUnroll] = {};
  bool preloaded = false;
  int first_chunk = -1;
  int big = 0;
  for (int p = 0; p < num_phases; ++p) {
    const Phase ph = phases[p];
    if (ph.w == nullptr) continue;
    const float* act_in = (big & 1) ? act1 : act0;
    float* act_out = (big & 1) ? act0 : act1;
    // A tiny phase before (a norm, RoPE) is one more read of the dependency by every block.
    const int dep_reads = p > 0 && phases[p - 1].w == nullptr ? 2 : 1;
    long long lo, hi;
    slice(ph, blockIdx.x, blocks, lo, hi);
    unsigned acc;
    if (preload_next >= 3) {
      acc = stream_dynamic(ph.w, ph.words, counters + p, act_in, dep_reads, preloaded ? first_chunk : -1, pre);
      write_act(act_out, acc, blockIdx.x, blocks);
      preloaded = false;
      if (preload_next == 4) {  // claim the next big phase's first chunk and issue its loads
        int q = p + 1;
        while (q < num_phases && phases[q].w == nullptr) ++q;
        if (q < num_phases) {
          const Phase nx = phases[q];
          __shared__ int slot;
          first_chunk = claim(counters + q, &slot);
          const long long chunk_words = static_cast<long long>(kUnroll) * blockDim.x;
          if (first_chunk * chunk_words < nx.words) issue(pre, nx.w, first_chunk * chunk_words + threadIdx.x, nx.words);
          preloaded = true;
        }
      }
      grid_barrier(bar, blocks);
      ++big;
      continue;
    }
    if (staged_words > 0) {
      acc = stream(ph.w, lo + staged_words, hi, pre, false, act_in, dep_reads, stage, staged_words, mbar, parity);
      parity ^= 1u;
    } else {
      acc = stream(ph.w, lo, hi, pre, preloaded, act_in, dep_reads);
    }
    write_act(act_out, acc, blockIdx.x, blocks);
    preloaded = false;
    staged_words = 0;
    if (preload_next == 2) {  // the next big phase's first bytes into shared memory, in bulk
      int q = p + 1;
      while (q < num_phases && phases[q].w == nullptr) ++q;
      if (q < num_phases) {
        const Phase nx = phases[q];
        slice(nx, blockIdx.x, blocks, lo, hi);
        staged_words = static_cast<int>(hi - lo < stage_words_max ? hi - lo : stage_words_max);
        __syncthreads();  // every thread has folded the stage of this phase
        if (threadIdx.x == 0 && staged_words > 0) {
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          mbar_expect(mbar, staged_words * 16u);
          for (int w0 = 0; w0 < staged_words; w0 += 1024)  // 16 KB per copy
            bulk_copy(stage_smem + w0 * 16u, nx.w + lo + w0, (staged_words - w0 < 1024 ? staged_words - w0 : 1024) * 16u, mbar);
        }
      }
    } else if (preload_next) {  // the next big phase's first loads: weights do not depend on this phase
      int q = p + 1;
      while (q < num_phases && phases[q].w == nullptr) ++q;
      if (q < num_phases) {
        const Phase nx = phases[q];
        slice(nx, blockIdx.x, blocks, lo, hi);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const long long i = lo + threadIdx.x + u * (long long)blockDim.x;
          if (i < hi) pre[u] = ld_stream(nx.w + i);
        }
        preloaded = true;
      }
    }
    if (red_barrier) grid_barrier_red(bar, blocks); else grid_barrier(bar, blocks);
    ++big;
  }
}

// ---- timing -----------------------------------------------------------------------------------
float time_graph(cudaGraphExec_t exec, cudaStream_t s, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, s));
  for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(exec, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms / reps;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  printf("device %s, %d SMs, L2 %d MB; %d threads per block\n", prop.name, sms, prop.l2CacheSize >> 20, kThreads);

  // copy bandwidth: read + written bytes of a 2 GiB copy
  const size_t copy_bytes = size_t(2) << 30;
  void *ca, *cb;
  CK(cudaMalloc(&ca, copy_bytes));
  CK(cudaMalloc(&cb, copy_bytes));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < 3; ++i) CK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice, s));
  std::vector<float> cms;
  for (int i = 0; i < 9; ++i) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, s));
    CK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    cms.push_back(ms);
  }
  std::sort(cms.begin(), cms.end());
  const double copy_gbps = 2.0 * copy_bytes / (cms[4] * 1e-3) / 1e9;
  CK(cudaFree(ca));
  CK(cudaFree(cb));
  printf("copy bandwidth %.0f GB/s\n", copy_gbps);

  const int layers = 24;
  double mb[8] = {0, 50.33, 0, 17.60, 33.55, 0, 268.44, 134.22};
  // PROBE_PHASE_MB=x: every big phase streams x MB instead (x small: the fixed cost per phase)
  if (const char* e = getenv("PROBE_PHASE_MB"))
    for (double& m : mb) m = m > 0 ? atof(e) : 0;
  std::vector<Phase> phases;
  double total_bytes = 0;
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < 8; ++k) {
      Phase ph{nullptr, 0};
      if (mb[k] > 0) {
        const long long words = (long long)(mb[k] * 1e6 / 16);
        void* buf;
        CK(cudaMalloc(&buf, words * 16));
        CK(cudaMemset(buf, (l * 8 + k) & 0xff, words * 16));
        ph.w = static_cast<const uint4*>(buf);
        ph.words = words;
        total_bytes += words * 16.0;
      }
      phases.push_back(ph);
    }
  const int num_phases = (int)phases.size();
  const double roofline_us = total_bytes / (copy_gbps * 1e9) * 1e6;
  printf("%d phases, %.2f GB streamed: %.1f us at the copy bandwidth\n", num_phases, total_bytes / 1e9, roofline_us);

  float *act0, *act1;
  CK(cudaMalloc(&act0, kAct * 4));
  CK(cudaMalloc(&act1, kAct * 4));
  CK(cudaMemset(act0, 0, kAct * 4));
  CK(cudaMemset(act1, 0, kAct * 4));
  Phase* d_phases;
  CK(cudaMalloc(&d_phases, sizeof(Phase) * num_phases));
  CK(cudaMemcpy(d_phases, phases.data(), sizeof(Phase) * num_phases, cudaMemcpyHostToDevice));
  unsigned* counters;
  CK(cudaMalloc(&counters, sizeof(unsigned) * num_phases));
  Barrier* bar;
  CK(cudaMalloc(&bar, sizeof(Barrier)));
  CK(cudaMemset(bar, 0, sizeof(Barrier)));

  // chain graphs: big phases on `per_sm` blocks per SM, tiny ones on kTinyBlocks
  auto chain_graph = [&](int per_sm, bool tiny, bool dynamic = false) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    if (dynamic) CK(cudaMemsetAsync(counters, 0, sizeof(unsigned) * num_phases, s));
    for (int p = 0; p < num_phases; ++p) {
      if (!tiny && phases[p].w == nullptr) continue;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(phases[p].w ? sms * per_sm : kTinyBlocks);
      cfg.blockDim = dim3(kThreads);
      cfg.stream = s;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, phase_kernel, phases[p], (p & 1) ? (const float*)act1 : (const float*)act0,
                            (p & 1) ? act0 : act1, dynamic ? counters + p : nullptr));
    }
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, 0));
    return e;
  };
  int resident = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persistent_kernel, kThreads, 0));
  printf("persistent kernel: %d blocks of %d threads per SM resident\n", resident, kThreads);
  auto persistent_graph = [&](int per_sm, int preload, int red) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemsetAsync(counters, 0, sizeof(unsigned) * num_phases, s));
    persistent_kernel<<<sms * per_sm, kThreads, preload == 2 ? kStageBytes : 0, s>>>(d_phases, num_phases, act0, act1, bar, preload, red, kStageBytes / 16, counters);
    CK(cudaGetLastError());
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, 0));
    return e;
  };
  struct Arm {
    const char* name;
    cudaGraphExec_t exec;
    std::vector<float> us;
  };
  std::vector<Arm> arms;
  int chain_resident = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&chain_resident, phase_kernel, kThreads, 0));
  printf("chain kernel: %d blocks of %d threads per SM resident\n", chain_resident, kThreads);
  static char cnames[4][80];
  snprintf(cnames[0], 80, "chain, %d blocks/SM", chain_resident);
  snprintf(cnames[1], 80, "chain, %d blocks/SM", 2 * chain_resident);
  snprintf(cnames[2], 80, "chain without tiny kernels, %d blocks/SM", chain_resident);
  arms.push_back({cnames[0], chain_graph(chain_resident, true), {}});
  arms.push_back({cnames[1], chain_graph(2 * chain_resident, true), {}});
  arms.push_back({cnames[2], chain_graph(chain_resident, false), {}});
  snprintf(cnames[3], 80, "chain, dynamic chunks, %d blocks/SM", chain_resident);
  arms.push_back({cnames[3], chain_graph(chain_resident, true, true), {}});
  static char names[16][96];
  int n = 0;
  CK(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kStageBytes));
  for (int per_sm = resident; per_sm <= resident; ++per_sm)
    for (int preload = 0; preload < 5; ++preload) {
      const char* what[5] = {"", " + next loads", " + next bytes staged in smem", ", dynamic chunks",
                             ", dynamic chunks + next chunk's loads"};
      snprintf(names[n], 96, "persistent%s, %d block/SM", what[preload], per_sm);
      arms.push_back({names[n++], persistent_graph(per_sm, preload, 0), {}});
    }
  int staged_resident = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&staged_resident, persistent_kernel, kThreads, kStageBytes));
  printf("persistent + staged: %d KB of shared memory per block, %d blocks per SM resident\n", STAGE_KB, staged_resident);
  if (staged_resident < resident) { printf("staged arm does not fit the grid; stop\n"); return 1; }
  for (auto& a : arms) time_graph(a.exec, s, 2);  // warm-up
  for (int round = 0; round < 7; ++round)
    for (auto& a : arms) a.us.push_back(time_graph(a.exec, s, 5) * 1e3f);
  printf("\n%-40s %10s %10s %8s\n", "arm (one decode step's streams)", "us", "x roofline", "spread");
  for (auto& a : arms) {
    std::vector<float> v = a.us;
    std::sort(v.begin(), v.end());
    printf("%-40s %10.1f %10.3f %7.1f%%\n", a.name, v[3], v[3] / roofline_us, 100.0 * (v.back() - v.front()) / v[3]);
  }
  return 0;
}
