// Beyond the course (issue 33): the FlashAttention backward on wgmma for Hopper (sm_90a), fp16
// and bf16, head dims 64 and 128: rung b2 of task4/NOTES.md's ladder ("A wgmma backward for
// sm_90 (design)"), the kernel its building blocks (flash_backward_hopper.cuh) were made for.
// Compile-checked; not yet run on a GPU when written.
//
// The idea. The mma.sync backward (flash_backward_mma_2d.cuh) feeds every product through
// ldmatrix into registers and stalls on those loads. Here every product is a wgmma reading
// shared memory through descriptors, and the scores are computed transposed (S^T = K Q^T,
// dP^T = V dO^T, FlashAttention-3's SdP_swapAB): a consumer's accumulator rows are its own
// keys, so P^T and dS^T, rounded to 16 bits, are already the register A operands of
// dV += P^T dO and dK += dS^T Q. Only dS goes to shared memory, for dQ = dS K.
//
// Tile shape and why (BwdTile<D>, flash_backward_hopper.cuh). A CTA owns 128 keys of one KV
// head: two consumer warpgroups of 64 keys each (wgmma's M is 64) at 240 registers, and one
// producer warpgroup at 24 whose one thread issues every copy (setmaxnreg; the forward's v3
// split). Per step it streams kBlockM queries of one query head: 64 at D 128, 128 at D 64
// (FlashAttention-3's tiles; the registers: dK and dV held for the whole walk, S^T and dP^T in
// flight together, at most 192 accumulator registers per thread either way). Q + lse2 and
// dO + D arrive by TMA and 1-D bulk copies in two stages (full / empty mbarriers); dS is
// double-buffered so that one named barrier of the 256 consumer threads per step suffices.
// 194 KB of shared memory, one CTA per SM.
//
// One step of consumer c (the design's protocol, numbered as there):
//   1. wait Q-full, issue S^T; wait dO-full, issue dP^T (two commit groups)
//   2. wait<1>: S^T is in; the mask on the tiles that need it (the causal diagonal, keys past
//      S_k) and P^T = exp2(S^T scale log2e - lse2), meant to run while dP^T computes; wait<0>:
//      dS^T = P^T (dP^T - D). (ptxas 13.0 schedules most of the exp2 after the second wait
//      anyway: the PTX has them before it, the SASS mostly after; an empty asm "using" P^T
//      before the wait changed nothing, since the reordering is ptxas's, not the front end's.)
//   3. pack both to 16 bits; dS^T into dS[step % 2] by stmatrix.trans
//   4. issue dV += P^T dO; fence.proxy.async; named barrier (both consumers' dS are in)
//      (FlashAttention-3's order. dV issued in step 2 instead, right after P^T and before
//      waiting for dP^T, was measured on the H100 no faster and removed: task4/NOTES.md)
//   5. issue dQ block = dS K (ss, 64 x 64 over the CTA's 128 keys), then dK += dS^T Q
//   6. wait<1>: dV and dQ are done: dQ into the fp32 dq_accum by float2 atomics
//   7. wait<0>: dK is done: each warp's lane 0 releases the stage (empty mbarrier)
// After the walk: dK * scale and dV rounded and stored straight from the accumulators (4-byte
// stores of column pairs; keys past S_k and columns past head_dim are not stored).
//
// The walk (QueryStepCursor). The CTA visits every query head of its KV head's group (GQA: dK
// and dV are summed over the group in registers, no atomics) and, per head, the kBlockM-row
// query tiles from the first row that sees one of its keys (KeyMask::queries_seeing, rounded
// down to kBlockM) to S_q. Only the tiles the causal diagonal crosses, and the key tile that
// holds S_k, are masked (KeyMask::unmasked_keys decides). Rows past S_q: the TMA zero-fills Q
// and dO, and the padded rows of lse2 and D hold +inf and 0 (below), so P = dS = 0 there;
// their dQ rows land in dq_accum's padding. Keys past S_k: K and V are zero-filled, which
// gives S = 0, not -inf, so the last key tile masks them (P = 0: nothing reaches dQ).
// The grid: blockIdx.x is the key tile, blockIdx.y the (batch, KV head). Blocks start in
// x-major order, so the CTAs resident at once are all the key tiles of a few heads: they read
// the same Q, dO, lse2 and D rows and add into the same dq_accum rows, which then stay in L2.
// (The other order, every head's key tile 0 first, had each resident CTA on its own head: ncu
// on the H100 found DRAM at 69% of its peak, the dq_accum's atomics and the Q/dO re-reads
// missing L2, and the kernel slower than the mma.sync one: results/logs/h100_s8_bwd_wgmma/.)
// Causal grids still run longest first within a head: key tile 0 sees every query.
//
// Scope (the router, task4/backward.py, sends everything else to the mma.sync kernels): fp16
// and bf16, head dims 64 and 128 (72..120 on the 128 tile: the TMA zero-fills columns past
// head_dim), dense or causal (bottom-right for S_q != S_k), GQA / MQA, any S_q and S_k, a
// softmax scale; not deterministic (dQ by atomics). No window, key lengths, mask tensor,
// stride or softcap.
//
// Preprocess: the mma.sync backward's (flash_backward_mma.cuh, backward_preprocess_mma_kernel:
// D = rowsum(dO O), lse2), then backward_pad_rows_kernel copies both into rows padded to a
// multiple of 128 per (batch, head) (rows >= S_q: lse2 = +inf, D = 0), since a 1-D bulk copy
// needs a 16-byte aligned source and every byte of it in bounds. Its convert pass
// (backward_dq_convert_kernel) scales and rounds dQ.

#pragma once

#include "flash_backward_hopper.cuh"
#include "flash_backward_mma.cuh"  // mma_bwd::BwdParams, its preprocess and dQ convert pass

namespace hopper_bwd {

// The kernel's parameters (by value). lse2 and delta are [B * H_q * seq_q_pad] float32 (the
// padded copies, backward_pad_rows_kernel); dq_accum [B, H_q, seq_q_pad, kHeadDim] float32,
// zeroed; dk and dv new contiguous [B, H_kv, S_k, head_dim] tensors of the element type.
struct BwdHopperParams {
  const float* lse2;
  const float* delta;
  float* dq_accum;
  void* dk;
  void* dv;
  int heads, kv_heads, kv_group;  // H_q, H_kv, H_q / H_kv
  int seq_q, seq_k, seq_q_pad, head_dim;
  float scale_log2;  // scale * log2(e): the forward's exponent factor
  float scale;       // dK (here) and dQ (the convert pass) are scaled by it once
  attn::MaskParams mask;  // causal and the sequence lengths (KeyMask<false>)
};

// Rows of the padded lse2 / D / dq_accum per (batch, head): a multiple of every kBlockM.
constexpr int kPadRows = 128;
inline int64_t padded_rows(int64_t seq_q) { return (seq_q + kPadRows - 1) / kPadRows * kPadRows; }

// The walk over (query head of the group, query tile): `group` indexes the head within the
// GQA group, `row0` the current tile's first row (a multiple of kBlockM), `end` the end of the
// rows that may see the CTA's keys. advance() moves to the next tile, over heads whose range
// is empty; false when the walk is done. Start from {-1, 0, 0}. The producer and the
// consumers walk it alike, so their step counters agree.
struct QueryStepCursor {
  int group, row0, end;

  template <typename Cfg>
  __device__ __forceinline__ bool advance(const BwdHopperParams& p, int batch, int kv_head, int kv_start) {
    row0 += Cfg::kBlockM;
    while (row0 >= end) {
      if (++group >= p.kv_group) return false;
      const attn::KeyMask<false> mask(p.mask, batch, kv_head * p.kv_group + group);
      const int2 range = mask.queries_seeing(kv_start, kv_start + Cfg::kBlockN);
      row0 = range.x - range.x % Cfg::kBlockM;
      end = range.y;
    }
    return true;
  }
};

// Whether the tile of rows [row0, row0 + kBlockM) x the CTA's keys needs the elementwise mask:
// some key of it is past S_k or past the diagonal of its first row.
template <typename Cfg>
__device__ __forceinline__ bool tile_needs_mask(const attn::KeyMask<false>& mask, int row0, int kv_start) {
  const int2 unmasked = mask.unmasked_keys(row0, row0 + Cfg::kBlockM - 1);
  return !(kv_start >= unmasked.x && kv_start + Cfg::kBlockN <= unmasked.y);
}

// Masked scores of S^T get -inf: register 4c + 2h + e is key row `key0` + 8h (key0 = the
// thread's row g of its consumer's 64 keys), query column `query0` + 8c + e (query0 = row0 +
// 2 (lane % 4)).
template <typename Cfg>
__device__ __forceinline__ void mask_scores(ScoreAcc<Cfg>& st, const attn::KeyMask<false>& mask, int key0,
                                            int query0) {
#pragma unroll
  for (int c = 0; c < Cfg::kBlockM / 8; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        st[4 * c + 2 * h + e] = mask.apply(st[4 * c + 2 * h + e], query0 + 8 * c + e, key0 + 8 * h);
}

// dK or dV of this consumer (64 keys x kHeadDim, fp32 accumulator layout: register 4c + 2h + e
// is key row 16w + g + 8h, column 8c + 2q + e) times `factor`, rounded, stored as column
// pairs into rows [key_start, seq_k) of a contiguous [seq_k][head_dim] head.
template <typename Element, typename Cfg>
__device__ __forceinline__ void store_gradient(const DkvAcc<Cfg>& acc, float factor, Element* head, int key_start,
                                               int seq_k, int head_dim, int warp, int lane) {
  using Ops = mma_attn::ElementOps<Element>;
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key_start + 16 * warp + g + 8 * h;
    if (key >= seq_k) continue;
    Element* row = head + static_cast<int64_t>(key) * head_dim;
#pragma unroll
    for (int c = 0; c < Cfg::kHeadDim / 8; ++c) {
      const int col = 8 * c + 2 * q;
      if (col < head_dim)
        *reinterpret_cast<uint32_t*>(row + col) =
            Ops::pack(acc[4 * c + 2 * h] * factor, acc[4 * c + 2 * h + 1] * factor);
    }
  }
}

// grid (ceil(S_k / 128), B * H_kv), BwdTile<kHeadDim>::kThreads threads, BwdSmem<Cfg>::kBytes of
// dynamic shared memory. map_q / map_do: [B, H_q, S_q, D] with kBlockM-row boxes; map_k / map_v:
// [B, H_kv, S_k, D] with 128-row boxes (64-column boxes, 128-byte swizzle: hopper_tensor_map.h's
// make_tensor_map).
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(BwdTile<kHeadDim>::kThreads, 1)
    flash_backward_hopper_kernel(const BwdHopperParams p, const __grid_constant__ CUtensorMap map_q,
                                 const __grid_constant__ CUtensorMap map_k,
                                 const __grid_constant__ CUtensorMap map_v,
                                 const __grid_constant__ CUtensorMap map_do) {
#if HOPPER_ATTN_SM90A
  using Cfg = BwdTile<kHeadDim>;
  using L = BwdSmem<Cfg>;
  static_assert(BwdLayoutProofs<Cfg>::kProved, "descriptor / layout proofs");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The tiles need 1024-byte alignment (the swizzle's period); the budget has the slack.
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (raw + 1023u) & ~1023u;
  const unsigned char* smem_ptr = smem_raw + (smem - raw);

  const int batch = blockIdx.y / p.kv_heads;
  const int kv_head = blockIdx.y % p.kv_heads;
  const int kv_start = blockIdx.x * Cfg::kBlockN;
  const int tid = threadIdx.x;
  // The warpgroup index, visibly warp-uniform (the forward's v3 does the same).
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);

  if (tid == 0) {
    hopper_attn::mbarrier_init(smem + L::bar_kv, 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      hopper_attn::mbarrier_init(smem + L::bar_q_full + 8 * s, 1);
      hopper_attn::mbarrier_init(smem + L::bar_do_full + 8 * s, 1);
      // Released by every consumer thread once its last wgmma reading the stage is done and its
      // own reads of the stage's lse2 and D are behind it (each thread's arrive orders its reads
      // before the producer's next bulk copy: what compute-sanitizer's racecheck follows; with
      // one lane's arrive per warp it reported the copy racing those reads, as it did for the
      // forward's v7, results/logs/h100_racecheck_v7_pattern_probe.log).
      hopper_attn::mbarrier_init(smem + L::bar_empty + 8 * s, 128 * Cfg::kConsumers);
    }
    hopper_attn::mbarrier_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: after the role split only named barriers of
                    // the consumers (id 8) and mbarriers are used

  if (warpgroup == 0) {
    // ---- producer: one thread issues every copy ----
    hopper_attn::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid == 0) {
      const uint32_t bar_kv = smem + L::bar_kv;
      hopper_attn::mbarrier_arrive_expect_tx(bar_kv, L::kBytesKv);
      hopper_attn::load_tile_tma<Cfg::kHeadDim, Cfg::kBlockN>(smem + L::k, &map_k, bar_kv, kv_start, kv_head, batch);
      hopper_attn::load_tile_tma<Cfg::kHeadDim, Cfg::kBlockN>(smem + L::v, &map_v, bar_kv, kv_start, kv_head, batch);
      QueryStepCursor cursor{-1, 0, 0};
      for (int step = 0; cursor.advance<Cfg>(p, batch, kv_head, kv_start); ++step) {
        const int head = kv_head * p.kv_group + cursor.group;
        const int64_t rows = (static_cast<int64_t>(batch) * p.heads + head) * p.seq_q_pad;
        produce_step<Cfg>(smem, step, &map_q, &map_do, p.lse2 + rows, p.delta + rows, cursor.row0, head, batch);
      }
    }
    return;  // no named barrier counts the producer, and no CTA-wide barrier follows
  }

  // ---- consumers: 64 keys each ----
  hopper_attn::setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int consumer = warpgroup - 1;
  const int warp = (tid / 32) % 4;
  const int lane = tid % 32;
  DkvAcc<Cfg> dk, dv;
#pragma unroll
  for (int i = 0; i < Cfg::kRegsDkv; ++i) dk[i] = dv[i] = 0.f;
  const int key0 = kv_start + Cfg::kKeysPerConsumer * consumer + 16 * warp + lane / 4;

  hopper_attn::mbarrier_wait(smem + L::bar_kv, 0);
  QueryStepCursor cursor{-1, 0, 0};
  for (int step = 0; cursor.advance<Cfg>(p, batch, kv_head, kv_start); ++step) {
    const int stage = step % Cfg::kStages;
    const uint32_t parity = (step / Cfg::kStages) & 1;
    const int head = kv_head * p.kv_group + cursor.group;
    const int row0 = cursor.row0;

    // 1. S^T once Q is in, dP^T once dO is.
    ScoreAcc<Cfg> st, dpt;
    hopper_attn::mbarrier_wait(smem + L::bar_q_full + 8 * stage, parity);
    issue_st<Element, Cfg>(st, smem, consumer, stage);
    hopper_attn::mbarrier_wait(smem + L::bar_do_full + 8 * stage, parity);
    issue_dpt<Element, Cfg>(dpt, smem, consumer, stage);

    // 2. The mask and P^T while dP^T computes, then dS^T.
    hopper_attn::wgmma_wait<1>();
    fence_registers(st);
    const attn::KeyMask<false> mask(p.mask, batch, head);
    if (tile_needs_mask<Cfg>(mask, row0, kv_start)) mask_scores<Cfg>(st, mask, key0, row0 + 2 * (lane % 4));
    probabilities<Cfg>(st, reinterpret_cast<const float*>(smem_ptr + L::lse2 + stage * L::kRowStats),
                       p.scale_log2, lane);
    ScoreFragments<Cfg> p_t, ds_t;
    hopper_attn::wgmma_wait<0>();
    fence_registers(dpt);
    score_gradients<Cfg>(dpt, st, reinterpret_cast<const float*>(smem_ptr + L::delta + stage * L::kRowStats),
                         lane);

    // 3. 16-bit fragments; dS into its stage.
    pack_fragments<Element, Cfg>(p_t, st);
    pack_fragments<Element, Cfg>(ds_t, dpt);
    const int ds_stage = step % Cfg::kStagesDs;
    {
      // The lane's stmatrix address from a fresh thread index (mma_attn::thread_index_fresh): held
      // across the walk it was the one register ptxas spilled at D 64.
      const int fresh = mma_attn::thread_index_fresh();
      store_ds<Cfg>(ds_t, smem, ds_stage, consumer, (fresh / 32) % 4, fresh % 32);
    }

    // 4. dV, then both consumers' dS published to the async proxy.
    issue_dv<Element, Cfg>(dv, p_t, smem, stage);
    hopper_attn::fence_proxy_async();
    consumers_barrier_sync();

    // 5. dQ block, dK.
    float dq[Cfg::kRegsDq];
    issue_dq<Element, Cfg>(dq, smem, ds_stage, consumer);
    issue_dk<Element, Cfg>(dk, ds_t, smem, stage);

    // 6. dV and dQ done (groups retire in order): dQ out. P^T's fragments are free again.
    hopper_attn::wgmma_wait<1>();
    fence_registers(dq);
    fence_registers(p_t);
    float* dq_rows = p.dq_accum + ((static_cast<int64_t>(batch) * p.heads + head) * p.seq_q_pad + row0) *
                                      Cfg::kHeadDim;
    add_dq<Cfg>(dq, dq_rows, Cfg::kHeadDim, consumer, warp, lane);

    // 7. dK done: Q, dO, lse2 and D of the stage are no longer read.
    hopper_attn::wgmma_wait<0>();
    fence_registers(dk);
    fence_registers(dv);
    fence_registers(ds_t);
    hopper_attn::mbarrier_arrive(smem + L::bar_empty + 8 * stage);
  }

  // Epilogue: dK * scale and dV, rounded, rows < S_k and columns < head_dim.
  const int64_t kv_rows = (static_cast<int64_t>(batch) * p.kv_heads + kv_head) * p.seq_k;
  const int own_start = kv_start + Cfg::kKeysPerConsumer * consumer;
  store_gradient<Element, Cfg>(dk, p.scale, static_cast<Element*>(p.dk) + kv_rows * p.head_dim, own_start,
                               p.seq_k, p.head_dim, warp, lane);
  store_gradient<Element, Cfg>(dv, 1.f, static_cast<Element*>(p.dv) + kv_rows * p.head_dim, own_start, p.seq_k,
                               p.head_dim, warp, lane);
#endif
}

// ---------------------------------------------------------------------------------------
// Preprocess: D and lse2, padded
// ---------------------------------------------------------------------------------------

constexpr int kPadThreads = 256;

// D and lse2 as the mma.sync backward's preprocess wrote them ([B * H_q * S_q] float32, its
// backward_preprocess_mma_kernel: D = rowsum(dO * O), lse2 = the forward's lse, +inf where it
// is -inf), copied into rows of seq_q_pad per (batch, head), rows >= S_q as lse2 = +inf and
// D = 0 (P = dS = 0 for the zero-filled rows the TMA delivers there). One thread per padded row.
// (A template on the element type it does not read only so that each instantiation file
// compiles its own: a plain __global__ defined in a header would be defined in every file.)
template <typename Element>
__global__ void __launch_bounds__(kPadThreads)
    backward_pad_rows_kernel(const float* lse2, const float* delta, float* lse2_padded, float* delta_padded,
                             int64_t heads_rows, int seq_q, int seq_q_pad) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kPadThreads + threadIdx.x;
  if (row >= heads_rows * seq_q_pad) return;
  const int64_t head_row = row / seq_q_pad;
  const int query = static_cast<int>(row % seq_q_pad);
  const bool real = query < seq_q;
  const int64_t from = head_row * seq_q + query;
  lse2_padded[row] = real ? lse2[from] : INFINITY;
  delta_padded[row] = real ? delta[from] : 0.f;
}

// ---------------------------------------------------------------------------------------
// Launch (host)
// ---------------------------------------------------------------------------------------

// The backward's launches on `stream`: the mma.sync backward's preprocess (p: out, d_out, lse;
// lse2 and delta [B * H_q * S_q]) and their copy into the padded rows the kernel reads (hp.lse2,
// hp.delta), the kernel (hp, the four tensor maps), the dQ convert pass (p: dq_accum, dq, scale).
// Returns an error sentence, or nullptr.
template <typename Element, int kHeadDim>
const char* launch_backward_hopper(const mma_bwd::BwdParams& p, const BwdHopperParams& hp, const CUtensorMap& map_q,
                                   const CUtensorMap& map_k, const CUtensorMap& map_v, const CUtensorMap& map_do,
                                   cudaStream_t stream) {
  using Cfg = BwdTile<kHeadDim>;
  constexpr int kSmem = BwdSmem<Cfg>::kBytes;
  auto kernel = flash_backward_hopper_kernel<Element, kHeadDim>;
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (configured != cudaSuccess) return "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed";
  const int64_t key_tiles = (hp.seq_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int64_t kv_rows = static_cast<int64_t>(p.batch) * hp.kv_heads;
  if (kv_rows > 65535) return "batch * kv_heads exceeds 65535 (gridDim.y); split the batch";
  if (key_tiles > INT32_MAX) return "S_k needs more key tiles of 128 than gridDim.x holds";

  const int64_t heads_rows = static_cast<int64_t>(p.batch) * p.heads;
  const int64_t pre_blocks = (heads_rows * p.seq_q + mma_bwd::kPreprocessWarps - 1) / mma_bwd::kPreprocessWarps;
  const int64_t pad_blocks = (heads_rows * hp.seq_q_pad + kPadThreads - 1) / kPadThreads;
  if (pre_blocks > INT32_MAX || pad_blocks > INT32_MAX)
    return "batch * heads * seq_q is too large for one preprocess launch";
  mma_bwd::launch_preprocess<Element>(p, pre_blocks, stream);
  backward_pad_rows_kernel<Element><<<static_cast<unsigned>(pad_blocks), kPadThreads, 0, stream>>>(
      p.lse2, p.delta, const_cast<float*>(hp.lse2), const_cast<float*>(hp.delta), heads_rows, p.seq_q,
      hp.seq_q_pad);
  if (cudaPeekAtLastError() != cudaSuccess) return "the preprocess did not launch";

  const dim3 grid(static_cast<unsigned>(key_tiles), static_cast<unsigned>(kv_rows));
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(hp, map_q, map_k, map_v, map_do);
  if (cudaPeekAtLastError() != cudaSuccess) return "flash_backward_hopper_kernel did not launch";
  mma_bwd::launch_dq_convert<Element>(p, stream);
  return nullptr;
}

// Each compiled in one file, flash_backward_hopper_fp16.cu or _bf16.cu.
extern template const char* launch_backward_hopper<__half, 64>(const mma_bwd::BwdParams&, const BwdHopperParams&,
                                                               const CUtensorMap&, const CUtensorMap&,
                                                               const CUtensorMap&, const CUtensorMap&, cudaStream_t);
extern template const char* launch_backward_hopper<__half, 128>(const mma_bwd::BwdParams&, const BwdHopperParams&,
                                                                const CUtensorMap&, const CUtensorMap&,
                                                                const CUtensorMap&, const CUtensorMap&, cudaStream_t);
extern template const char* launch_backward_hopper<__nv_bfloat16, 64>(
    const mma_bwd::BwdParams&, const BwdHopperParams&, const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,
    const CUtensorMap&, cudaStream_t);
extern template const char* launch_backward_hopper<__nv_bfloat16, 128>(
    const mma_bwd::BwdParams&, const BwdHopperParams&, const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,
    const CUtensorMap&, cudaStream_t);

}  // namespace hopper_bwd
