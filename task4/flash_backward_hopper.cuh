// Beyond the course (issue 33): building blocks of a wgmma backward for Hopper (sm_90a),
// fp16 / bf16, head dims 64 and 128. The kernel that puts them together (rung b2 of the
// design's ladder: the walk, the mask, the epilogue) is flash_backward_hopper_kernel.cuh, its
// host entry flash_backward_hopper.cu. task4/NOTES.md, "A wgmma backward for sm_90 (design)",
// is the plan; its ladder says what comes next.
//
// What is here (everything device side, reusing flash_attention_hopper.cuh's wgmma wrappers,
// descriptors, mbarriers, TMA loads, swizzled layout and its compile-time layout proofs):
//   BwdTile<D>        the tile shape of one CTA: 128 own keys (two consumer warpgroups of 64
//                     keys each, one producer warpgroup), kBlockM streamed queries per step (64
//                     at D = 128, 128 at D = 64: FlashAttention-3's hopper/flash_bwd_launch_template.h
//                     run_mha_bwd_hdim128 causal / run_mha_bwd_hdim64), the register budget per
//                     consumer thread and the shared-memory budget, static_assert-checked;
//   BwdSmem<Cfg>      the byte offsets of every buffer (K, V, Q and dO in two stages, dS in two
//                     stages, lse2 and D per stage, the fp32 dQ staging of the TMA reduce-add
//                     rung, the mbarriers), and static_asserts that they fit 227 KB;
//   BwdLayoutProofs   every operand of the five products read through a descriptor, and the
//                     transposed stmatrix of dS, checked at compile time against the layout
//                     the TMA writes (the forward's LayoutProofs, extended);
//   produce_step      the producer's copies of one step (Q + lse2, dO + D) onto two mbarriers;
//   issue_st, _dpt    S^T = K Q^T and dP^T = V dO^T for one consumer's 64 keys (ss wgmma);
//   probabilities,    P^T = exp2(S^T scale_log2 - lse2) (while dP^T computes), then
//   score_gradients   dS^T = P^T (dP^T - D), in registers (p_and_ds: both);
//   pack_fragments    an m64 accumulator as the register A operand of the next wgmma;
//   issue_dv / dk     dV += P^T dO, dK += dS^T Q (rs wgmma: P^T and dS^T never leave registers);
//   store_ds          dS^T from registers into the [queries][keys] dS tile (stmatrix .trans);
//   issue_dq          dQ block = dS K (ss wgmma over the CTA's 128 keys);
//   add_dq            the dQ block into the fp32 dq_accum by float2 atomics (the ladder's first
//                     dQ path; the existing convert pass scales and rounds it).
// Masking, the walk over query tiles, the epilogue and the host side are the kernel file's;
// the variants beyond causal are the design's later rungs.
//
// Compile check (sm_90a, no GPU): flash_backward_hopper_fp16.cu / _bf16.cu instantiate the
// kernel (python -m common.tools.compile_check task4/flash_backward_hopper_fp16.cu); the probe
// printed in task4/NOTES.md ("Compile probe") still instantiates one step of these blocks alone.
//
// Sources: FlashAttention-3 (Dao-AILab/flash-attention, hopper/): mainloop_bwd_sm90_tma_gmma_ws.hpp
// (the products, SdP_swapAB, Mma_dKV_is_RS, the PdS named barrier, dQ by TMA reduce-add),
// flash_bwd_kernel_sm90.h (24 / 240 registers, producer warps), flash_bwd_launch_template.h
// (tiles per head dim); ThunderKittens kernels/attention/mha_h100/mha_h100.cu (bwd_attend_ker:
// the same 2 consumers x 64 keys, dQ by tma::store_add_async). Read, not copied.

#pragma once

#include "flash_attention_hopper.cuh"

namespace hopper_bwd {

using hopper_attn::fence_registers;
using hopper_attn::kmajor_descriptor;
using hopper_attn::kmajor_step_offset;
using hopper_attn::mnmajor_descriptor;
using hopper_attn::mnmajor_step_offset;
using hopper_attn::swizzled_offset;
using hopper_attn::Wgmma;
using hopper_attn::wgmma_commit;
using hopper_attn::wgmma_fence;

// Dynamic shared memory one CTA may have on an H100 (cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr int kMaxSmemBytes = 227 * 1024;

// ---------------------------------------------------------------------------------------
// The tile: who owns what
// ---------------------------------------------------------------------------------------
//
// A CTA owns kBlockN = 128 keys of one KV head (the consumer warpgroup c owns keys 64c..64c+63
// of them: wgmma's M is 64) and walks the query tiles that see them, kBlockM queries per step.
// Per step and consumer (all accumulators fp32, "64 x N" = one wgmma m64nN accumulator):
//   S^T  = K_c Q^T       64 x kBlockM, ss (K-major K rows, K-major Q), D/16 k-steps
//   dP^T = V_c dO^T      64 x kBlockM, ss (K-major V rows, K-major dO), D/16 k-steps
//   dV_c += P^T dO       64 x D, rs (A = P^T's registers, B = dO MN-major), kBlockM/16 k-steps
//   dK_c += dS^T Q       64 x D, rs (A = dS^T's registers, B = Q MN-major), kBlockM/16 k-steps
//   dQ block = dS K      64 x 64, ss (A = dS K-major from shared memory, B = K MN-major),
//                        kBlockN/16 = 8 k-steps over both consumers' keys
// S^T rather than S (FlashAttention-3's SdP_swapAB = true): a consumer's accumulator rows are
// its own keys, so P^T and dS^T are already the A operand of dV and dK, register for register
// (Mma_dKV_is_RS = true there). Only dQ needs dS in shared memory, as [queries][keys].
// The dQ product of a step covers kBlockM x D = 2 blocks of 64 x 64: consumer c computes block
// (row group c / (D/64), column group c % (D/64)): the column halves at D 128 (kBlockM = 64),
// the row halves at D 64 (kBlockM = 128). Either way it reads both consumers' dS: one named
// barrier of the 256 consumer threads per step (FlashAttention-3's BwdNamedBarriers::PdS).
template <int kHeadDim_>
struct BwdTile {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128 (96 would run on 128)");

  static constexpr int kConsumers = 2;
  static constexpr int kKeysPerConsumer = 64;                       // wgmma M
  static constexpr int kBlockN = kConsumers * kKeysPerConsumer;     // own keys per CTA: 128
  static constexpr int kBlockM = kHeadDim == 128 ? 64 : 128;        // streamed queries per step
  static constexpr int kThreads = 128 * (1 + kConsumers);           // + one producer warpgroup
  static constexpr int kStages = 2;    // Q + lse2 and dO + D: two steps in flight
  static constexpr int kStagesDs = 2;  // dS: so one barrier per step suffices (see BwdSmem)

  // dQ's two 64 x 64 blocks per step.
  static constexpr int kDqColumnGroups = kHeadDim / 64;
  static constexpr int kDqRowGroups = kBlockM / 64;
  static_assert(kDqColumnGroups * kDqRowGroups == kConsumers, "one 64 x 64 dQ block per consumer");

  // Registers per consumer thread (fp32 accumulators are M * N / 128 per warpgroup).
  static constexpr int kRegsScore = kKeysPerConsumer * kBlockM / 128;   // S^T, and dP^T again
  static constexpr int kRegsDkv = kKeysPerConsumer * kHeadDim / 128;    // dK, and dV again
  static constexpr int kRegsDq = 64 * 64 / 128;                         // the dQ block
  static constexpr int kRegsPacked = kRegsScore / 2;                    // P^T or dS^T, 16-bit pairs
  // Live at the widest point (S^T and dP^T both in flight, dK and dV held for the whole walk).
  // The dQ block (32) is live only after S^T and dP^T became P^T and dS^T (2 x kRegsPacked).
  static constexpr int kRegsPeak = 2 * kRegsDkv + 2 * kRegsScore;
  static constexpr int kProducerRegs = 24;   // FlashAttention-3: LoadRegisterRequirement
  static constexpr int kConsumerRegs = 240;  //                   MmaRegisterRequirement
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
                "setmaxnreg budgets must fit the register file (64 K registers per SM)");
  static_assert(kRegsPeak <= 192, "the accumulators must leave >= 48 registers for addresses, "
                                  "lse2 / D and the loop (ptxas decides; this is the plan's bound)");
};

// ---------------------------------------------------------------------------------------
// Shared memory
// ---------------------------------------------------------------------------------------
//
// Every 16-bit tile is [rows][cols] in 128-byte swizzled column blocks (hopper_attn::
// swizzled_offset), 1024-byte aligned: what the TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and
// what a descriptor reads, K-major or MN-major. dS is [kBlockM queries][kBlockN keys] in the
// same layout (keys are its columns). lse2 and D are kBlockM floats per stage (the 1-D bulk
// copy: 16-byte aligned, hence a preprocess writing them padded per (batch, head) to a
// multiple of kBlockM rows, FlashAttention-3's seqlen_q_rounded). dq is the fp32 staging of
// the ladder's TMA reduce-add rung (2 x 64 x 64 floats, one 16 KB block per consumer),
// budgeted now so that the final layout is known to fit. dK and dV leave through K's and V's
// buffers after the walk (a consumer barrier first: dQ reads all of K until the last step).
template <typename Cfg>
struct BwdSmem {
  static constexpr int kTileK = Cfg::kBlockN * Cfg::kHeadDim * 2;   // K or V
  static constexpr int kTileQ = Cfg::kBlockM * Cfg::kHeadDim * 2;   // one stage of Q or dO
  static constexpr int kTileDs = Cfg::kBlockM * Cfg::kBlockN * 2;   // one stage of dS
  static constexpr int kTileDq = Cfg::kBlockM * Cfg::kHeadDim * 4;  // fp32 dQ staging
  static constexpr int kRowStats = Cfg::kBlockM * 4;                // lse2 or D, one stage

  static constexpr int k = 0;
  static constexpr int v = k + kTileK;
  static constexpr int q = v + kTileK;                        // [kStages]
  static constexpr int dout = q + Cfg::kStages * kTileQ;      // [kStages]
  static constexpr int ds = dout + Cfg::kStages * kTileQ;     // [kStagesDs]
  static constexpr int dq = ds + Cfg::kStagesDs * kTileDs;
  static constexpr int lse2 = dq + kTileDq;                   // [kStages]
  static constexpr int delta = lse2 + Cfg::kStages * kRowStats;  // [kStages]
  // mbarriers (8 bytes each): K and V once; per stage Q-full (Q + lse2 bytes), dO-full
  // (dO + D bytes) and empty (one arrival per consumer once its dV and dK have read the stage).
  static constexpr int bar_kv = delta + Cfg::kStages * kRowStats;
  static constexpr int bar_q_full = bar_kv + 8;
  static constexpr int bar_do_full = bar_q_full + 8 * Cfg::kStages;
  static constexpr int bar_empty = bar_do_full + 8 * Cfg::kStages;
  // Base alignment slack: the dynamic buffer is aligned up to 1024 bytes in the kernel.
  static constexpr int kBytes = bar_empty + 8 * Cfg::kStages + 1024;

  static constexpr uint32_t kBytesQStage = kTileQ + kRowStats;   // expect_tx of a Q-full phase
  static constexpr uint32_t kBytesDoStage = kTileQ + kRowStats;  // and of a dO-full phase
  static constexpr uint32_t kBytesKv = 2 * kTileK;

  static_assert(k % 1024 == 0 && v % 1024 == 0 && q % 1024 == 0 && dout % 1024 == 0 &&
                    ds % 1024 == 0 && kTileQ % 1024 == 0 && kTileDs % 1024 == 0,
                "16-bit tiles on 1024-byte boundaries (the 128-byte swizzle's period)");
  static_assert(lse2 % 16 == 0 && delta % 16 == 0 && kRowStats % 16 == 0,
                "bulk copies need 16-byte aligned, 16-byte multiple buffers");
  static_assert(bar_kv % 8 == 0, "mbarriers are 8-byte aligned");
  static_assert(kBytes <= kMaxSmemBytes, "the backward's shared memory must fit one H100 CTA");
  // The numbers the design quotes (task4/NOTES.md): 194 KB at D 128 and at D 64.
  static_assert(Cfg::kHeadDim != 128 || kBytes == 2 * 32768 + 2 * 16384 * 2 + 2 * 16384 + 32768 + 4 * 256 + 56 + 1024,
                "D 128: K, V 32 KB each; Q, dO 2 x 16 KB each; dS 2 x 16 KB; dQ 32 KB; lse2, D 2 x 256 B each");
  static_assert(Cfg::kHeadDim != 64 || kBytes == 2 * 16384 + 2 * 16384 * 2 + 2 * 32768 + 32768 + 4 * 512 + 56 + 1024,
                "D 64: K, V 16 KB each; Q, dO 2 x 16 KB each; dS 2 x 32 KB; dQ 32 KB; lse2, D 2 x 512 B each");
};

// ---------------------------------------------------------------------------------------
// Compile-time proofs: each descriptor reads what the TMA (or stmatrix) wrote
// ---------------------------------------------------------------------------------------

// A K-major operand of 64 rows starting at row `row0` of a [kRows][kCols] tile (a consumer's
// keys of K or V, or a dQ row group of dS): k-step kk starts at kmajor_step_offset<kRows>(kk)
// + row0 * 128 (row0 a multiple of 8: whole swizzle groups).
template <int kRows, int kCols>
constexpr bool kmajor_rows_read_the_layout(int row0) {
  for (int kk = 0; kk < kCols / 16; ++kk)
    for (int mn = 0; mn < 64; ++mn)
      for (int k = 0; k < 16; ++k)
        if (hopper_attn::kmajor_read(kmajor_step_offset<kRows>(kk) + row0 * 128, 1024, mn, k) !=
            hopper_attn::stored_at<kRows>(row0 + mn, 16 * kk + k))
          return false;
  return true;
}

// An MN-major operand of N = 64 columns starting at column block `block` of a [kRows][D] tile
// (K as dQ's B: reduction over its kRows keys; at D 128 each consumer reads one block).
template <int kRows>
constexpr bool mnmajor_block_reads_the_layout(int block) {
  for (int kk = 0; kk < kRows / 16; ++kk)
    for (int mn = 0; mn < 64; ++mn)
      for (int k = 0; k < 16; ++k)
        if (hopper_attn::mnmajor_read(block * kRows * 128 + mnmajor_step_offset(kk), kRows * 128, 1024, mn, k) !=
            hopper_attn::stored_at<kRows>(16 * kk + k, 64 * block + mn))
          return false;
  return true;
}

// stmatrix.m8n8.x4.trans of dS^T (store_ds below). Consumer c, warp w, lane l: for k-step kk
// of the packed fragments a[kk][i] (i = 0..3: chunk 2kk + i / 2, half h = i % 2), matrix i's
// fragment is rows g = key 64c + 16w + 8h + g, columns 2q + e = query 8(2kk + i/2) + 2q + e.
// With .trans, lane 8i + j gives the address of the stored matrix's row j, which receives the
// fragment's column j: query 8(2kk + i/2) + j, its 8 keys 64c + 16w + 8h .. + 7 contiguous,
// i.e. one 16-byte chunk of that query's row of dS.
template <typename Cfg>
__host__ __device__ constexpr uint32_t ds_store_address(int consumer, int warp, int kk, int lane) {
  const int i = lane / 8, j = lane % 8;
  const int query = 8 * (2 * kk + i / 2) + j;
  const int key0 = Cfg::kKeysPerConsumer * consumer + 16 * warp + 8 * (i % 2);
  return swizzled_offset<Cfg::kBlockM>(query, key0 / 8);
}

// Every element a thread holds lands where dQ's K-major descriptor of dS reads it: fragment
// element (row g, column 2q + e) of matrix i goes to byte 2g of row 2q + e (lane 8i + 2q + e).
template <typename Cfg>
constexpr bool ds_store_writes_the_layout() {
  for (int c = 0; c < Cfg::kConsumers; ++c)
    for (int w = 0; w < 4; ++w)
      for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
        for (int i = 0; i < 4; ++i)
          for (int g = 0; g < 8; ++g)
            for (int col = 0; col < 8; ++col) {
              const int key = Cfg::kKeysPerConsumer * c + 16 * w + 8 * (i % 2) + g;
              const int query = 8 * (2 * kk + i / 2) + col;
              if (ds_store_address<Cfg>(c, w, kk, 8 * i + col) + 2 * g !=
                  hopper_attn::stored_at<Cfg::kBlockM>(query, key))
                return false;
            }
  return true;
}

// Bank conflicts of that store: the 8 row addresses of one matrix (one 8-lane phase) must fall
// in 8 distinct 16-byte bank groups of a 128-byte line.
template <typename Cfg>
constexpr bool ds_store_is_conflict_free() {
  for (int c = 0; c < Cfg::kConsumers; ++c)
    for (int w = 0; w < 4; ++w)
      for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
        for (int i = 0; i < 4; ++i) {
          unsigned seen = 0;
          for (int j = 0; j < 8; ++j) seen |= 1u << ((ds_store_address<Cfg>(c, w, kk, 8 * i + j) >> 4) & 7);
          if (seen != 0xFFu) return false;
        }
  return true;
}

// Consecutive k-steps of that store are 16 query rows = 2048 bytes apart, whatever the lane:
// store_ds computes one address per thread and steps it (8 addresses held across the walk at
// D 64 made ptxas spill).
template <typename Cfg>
constexpr bool ds_store_steps_by_16_rows() {
  for (int c = 0; c < Cfg::kConsumers; ++c)
    for (int w = 0; w < 4; ++w)
      for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
        for (int lane = 0; lane < 32; ++lane)
          if (ds_store_address<Cfg>(c, w, kk, lane) != ds_store_address<Cfg>(c, w, 0, lane) + kk * 16 * 128)
            return false;
  return true;
}

template <typename Cfg>
struct BwdLayoutProofs {
  // S^T = K_c Q^T and dP^T = V_c dO^T: each consumer's 64 rows of K / V (A, K-major) ...
  static_assert(kmajor_rows_read_the_layout<Cfg::kBlockN, Cfg::kHeadDim>(0) &&
                    kmajor_rows_read_the_layout<Cfg::kBlockN, Cfg::kHeadDim>(Cfg::kKeysPerConsumer),
                "K, V: a consumer's 64 key rows as the K-major A of S^T / dP^T");
  // ... and all kBlockM rows of Q / dO (B, K-major: the forward's proof of Q and K).
  static_assert(hopper_attn::kmajor_descriptors_read_the_layout<Cfg::kBlockM, Cfg::kHeadDim>(),
                "Q, dO: the K-major B of S^T / dP^T");
  // dV += P^T dO, dK += dS^T Q: Q / dO as MN-major B, reduction over the kBlockM queries.
  static_assert(hopper_attn::mnmajor_descriptors_read_the_layout<Cfg::kBlockM, Cfg::kHeadDim>(),
                "Q, dO: the MN-major B of dK / dV");
  // dQ = dS K: K as MN-major B (one 64-column block per consumer at D 128, the only one at 64) ...
  static_assert(mnmajor_block_reads_the_layout<Cfg::kBlockN>(0) &&
                    (Cfg::kDqColumnGroups < 2 || mnmajor_block_reads_the_layout<Cfg::kBlockN>(1)),
                "K: the MN-major B of dQ");
  // ... and dS as K-major A: 64 query rows (a row group) x kBlockN keys.
  static_assert(kmajor_rows_read_the_layout<Cfg::kBlockM, Cfg::kBlockN>(0) &&
                    (Cfg::kDqRowGroups < 2 || kmajor_rows_read_the_layout<Cfg::kBlockM, Cfg::kBlockN>(64)),
                "dS: the K-major A of dQ");
  static_assert(ds_store_writes_the_layout<Cfg>(), "stmatrix.trans of dS^T must write dS's layout");
  static_assert(ds_store_is_conflict_free<Cfg>(), "stmatrix.trans of dS^T: one wavefront per matrix");
  static_assert(ds_store_steps_by_16_rows<Cfg>(), "stmatrix.trans of dS^T: k-steps 2048 bytes apart");
  static constexpr bool kProved = true;
};

// ---------------------------------------------------------------------------------------
// PTX the forward does not have
// ---------------------------------------------------------------------------------------

// 1-D bulk copy global -> shared completing `bytes` on mbarrier `bar` (lse2, D of a step):
// both addresses 16-byte aligned, bytes a multiple of 16 [ptx: cp.async.bulk].
__device__ __forceinline__ void bulk_load_1d(uint32_t smem_dst, const void* gmem_src,
                                             uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_dst),
      "l"(reinterpret_cast<uint64_t>(gmem_src)), "r"(bytes), "r"(bar)
      : "memory");
}

// Four 8x8 16-bit matrices, stored transposed: register i is matrix i's fragment (lane l: row
// l / 4, columns 2(l % 4), 2(l % 4) + 1); lane 8i + j gives the address of the stored row j,
// which holds the fragment's column j [ptx: stmatrix; CUTLASS SM90_U16x8_STSM_T].
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1,
                                                  uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Named barrier of the 256 consumer threads: dS of this step is in shared memory (id 8; 0 is
// __syncthreads', 1..6 the forward's, kept distinct so the two kernels read alike).
__device__ __forceinline__ void consumers_barrier_sync() {
  asm volatile("bar.sync 8, 256;\n" ::: "memory");
}

// ---------------------------------------------------------------------------------------
// The producer: one thread, one step
// ---------------------------------------------------------------------------------------

// Step `step` of the walk: wait for its stage to be empty (both consumers released it two steps
// ago; the first kStages steps find fresh barriers, parity trick as in the forward), then Q and
// lse2 onto Q-full and dO and D onto dO-full. Q, dO: [B, S, H, D] tensor maps with kBlockM-row
// boxes (flash_attention_hopper.cu's make_tensor_map(t, Cfg::kBlockM)); lse2, D: padded rows
// (`row0` a multiple of kBlockM and kBlockM floats in bounds).
template <typename Cfg>
__device__ __forceinline__ void produce_step(uint32_t smem, int step, const CUtensorMap* map_q,
                                             const CUtensorMap* map_do, const float* lse2_rows,
                                             const float* delta_rows, int row0, int head, int batch) {
  using L = BwdSmem<Cfg>;
  const int stage = step % Cfg::kStages;
  if (step >= Cfg::kStages)
    hopper_attn::mbarrier_wait(smem + L::bar_empty + 8 * stage, ((step / Cfg::kStages) - 1) & 1);
  const uint32_t bar_q = smem + L::bar_q_full + 8 * stage;
  const uint32_t bar_do = smem + L::bar_do_full + 8 * stage;
  hopper_attn::mbarrier_arrive_expect_tx(bar_q, L::kBytesQStage);
  hopper_attn::load_tile_tma<Cfg::kHeadDim, Cfg::kBlockM>(smem + L::q + stage * L::kTileQ, map_q, bar_q,
                                                          row0, head, batch);
  bulk_load_1d(smem + L::lse2 + stage * L::kRowStats, lse2_rows + row0, L::kRowStats, bar_q);
  hopper_attn::mbarrier_arrive_expect_tx(bar_do, L::kBytesDoStage);
  hopper_attn::load_tile_tma<Cfg::kHeadDim, Cfg::kBlockM>(smem + L::dout + stage * L::kTileQ, map_do, bar_do,
                                                          row0, head, batch);
  bulk_load_1d(smem + L::delta + stage * L::kRowStats, delta_rows + row0, L::kRowStats, bar_do);
}

// ---------------------------------------------------------------------------------------
// A consumer's step
// ---------------------------------------------------------------------------------------

template <typename Cfg>
using ScoreAcc = float[Cfg::kRegsScore];
template <typename Cfg>
using ScoreFragments = uint32_t[Cfg::kBlockM / 16][4];
template <typename Cfg>
using DkvAcc = float[Cfg::kRegsDkv];

// acc = this consumer's 64 rows of an own tile (K or V: `own_tile` = its start, 64 c rows =
// 8192 c bytes into each column block) times the stage's streamed tile (Q or dO) transposed:
// S^T = K_c Q^T or dP^T = V_c dO^T, ss, D/16 k-steps, one commit group (wait<N> covers it).
template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_transposed_scores(ScoreAcc<Cfg>& acc, uint32_t own_tile,
                                                        uint32_t stream_tile) {
  fence_registers(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk)
    Wgmma<Element, Cfg::kBlockM>::template ss<0>(
        acc, kmajor_descriptor(own_tile + kmajor_step_offset<Cfg::kBlockN>(kk)),
        kmajor_descriptor(stream_tile + kmajor_step_offset<Cfg::kBlockM>(kk)), kk > 0 ? 1 : 0);
  wgmma_commit();
  fence_registers(acc);
}

// The two score products of a consumer's step: S^T = K_c Q^T, then dP^T = V_c dO^T, two commit
// groups (wait<1>: S^T is in; wait<0>: both). The caller has waited on the stage's Q-full
// (before S^T) and dO-full (before dP^T) barriers.
template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_st(ScoreAcc<Cfg>& st, uint32_t smem, int consumer, int stage) {
  using L = BwdSmem<Cfg>;
  const uint32_t own = static_cast<uint32_t>(consumer * Cfg::kKeysPerConsumer * 128);
  issue_transposed_scores<Element, Cfg>(st, smem + L::k + own, smem + L::q + stage * L::kTileQ);
}
template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_dpt(ScoreAcc<Cfg>& dpt, uint32_t smem, int consumer, int stage) {
  using L = BwdSmem<Cfg>;
  const uint32_t own = static_cast<uint32_t>(consumer * Cfg::kKeysPerConsumer * 128);
  issue_transposed_scores<Element, Cfg>(dpt, smem + L::v + own, smem + L::dout + stage * L::kTileQ);
}
template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_st_dpt(ScoreAcc<Cfg>& st, ScoreAcc<Cfg>& dpt, uint32_t smem,
                                             int consumer, int stage) {
  issue_st<Element, Cfg>(st, smem, consumer, stage);
  issue_dpt<Element, Cfg>(dpt, smem, consumer, stage);
}

// In place: st becomes P^T = exp2(S^T scale_log2 - lse2[query]). Register 4c + 2h + e is key
// row 16w + g + 8h, query column 8c + 2q + e: the row statistic is per column, read as a
// float2 from the stage's buffer (the 8 lanes of a quad column read the same 8 bytes: a
// broadcast). Masked scores must already be -inf (the mask goes between S^T's wait and this
// call); lse2 is +inf for a query that saw no key (and for the padding past S_q), so its P is
// 0. Called while dP^T still computes (only S^T's group waited for).
template <typename Cfg>
__device__ __forceinline__ void probabilities(ScoreAcc<Cfg>& st, const float* lse2_stage, float scale_log2,
                                              int lane) {
  const int q = lane % 4;
#pragma unroll
  for (int c = 0; c < Cfg::kBlockM / 8; ++c) {
    const float2 l2 = *reinterpret_cast<const float2*>(lse2_stage + 8 * c + 2 * q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 4 * c + 2 * h;
      st[r] = mma_attn::exp2_approx(fmaf(st[r], scale_log2, -l2.x));
      st[r + 1] = mma_attn::exp2_approx(fmaf(st[r + 1], scale_log2, -l2.y));
    }
  }
}

// In place: dpt becomes dS^T = P^T (dP^T - D[query]) (p_t: probabilities' result), D per column
// as lse2 above. The softcap's slope, where used, would multiply dS^T here (FlashAttention-3's
// dtanh, computed before the mask).
template <typename Cfg>
__device__ __forceinline__ void score_gradients(ScoreAcc<Cfg>& dpt, const ScoreAcc<Cfg>& p_t,
                                                const float* delta_stage, int lane) {
  const int q = lane % 4;
#pragma unroll
  for (int c = 0; c < Cfg::kBlockM / 8; ++c) {
    const float2 d = *reinterpret_cast<const float2*>(delta_stage + 8 * c + 2 * q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 4 * c + 2 * h;
      dpt[r] = p_t[r] * (dpt[r] - d.x);
      dpt[r + 1] = p_t[r + 1] * (dpt[r + 1] - d.y);
    }
  }
}

// Both of the above, once both products are in (the design's probe calls this).
template <typename Cfg>
__device__ __forceinline__ void p_and_ds(ScoreAcc<Cfg>& st, ScoreAcc<Cfg>& dpt, const float* lse2_stage,
                                         const float* delta_stage, float scale_log2, int lane) {
  probabilities<Cfg>(st, lse2_stage, scale_log2, lane);
  score_gradients<Cfg>(dpt, st, delta_stage, lane);
}

// An m64 x kBlockM accumulator as the A operand of k-steps over its columns (the forward's
// pack_p): a[kk][r] = registers 8kk + 2r, 8kk + 2r + 1 rounded to 16 bits and packed.
template <typename Element, typename Cfg>
__device__ __forceinline__ void pack_fragments(ScoreFragments<Cfg>& a, const ScoreAcc<Cfg>& acc) {
  using Ops = mma_attn::ElementOps<Element>;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = Ops::pack(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
}

// acc (dV or dK, 64 own keys x D) += a (P^T or dS^T, 64 x kBlockM) times the stage's tile
// (dO or Q, kBlockM x D, MN-major: the reduction runs down its rows). One commit group.
template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_accumulate(DkvAcc<Cfg>& acc, const ScoreFragments<Cfg>& a,
                                                 uint32_t streamed_tile) {
  fence_registers(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
    Wgmma<Element, Cfg::kHeadDim>::template rs<1>(
        acc, a[kk], mnmajor_descriptor(streamed_tile + mnmajor_step_offset(kk), Cfg::kBlockM * 128), 1);
  wgmma_commit();
  fence_registers(acc);
}

template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_dv(DkvAcc<Cfg>& dv, const ScoreFragments<Cfg>& p_t, uint32_t smem,
                                         int stage) {
  issue_accumulate<Element, Cfg>(dv, p_t, smem + BwdSmem<Cfg>::dout + stage * BwdSmem<Cfg>::kTileQ);
}

template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_dk(DkvAcc<Cfg>& dk, const ScoreFragments<Cfg>& ds_t, uint32_t smem,
                                         int stage) {
  issue_accumulate<Element, Cfg>(dk, ds_t, smem + BwdSmem<Cfg>::q + stage * BwdSmem<Cfg>::kTileQ);
}

// dS^T's packed fragments into dS stage `ds_stage` ([kBlockM queries][kBlockN keys]): one
// stmatrix.x4.trans per k-step (4 at D 128, 8 at D 64). The caller then fences the async proxy
// (hopper_attn::fence_proxy_async: wgmma reads it next) and meets the other consumer at
// consumers_barrier_sync().
template <typename Cfg>
__device__ __forceinline__ void store_ds(const ScoreFragments<Cfg>& ds_t, uint32_t smem, int ds_stage,
                                         int consumer, int warp, int lane) {
  // k-step kk is 2048 kk bytes past k-step 0 (BwdLayoutProofs: ds_store_steps_by_16_rows).
  const uint32_t at = smem + BwdSmem<Cfg>::ds + ds_stage * BwdSmem<Cfg>::kTileDs +
                      ds_store_address<Cfg>(consumer, warp, 0, lane);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
    stmatrix_x4_trans(at + kk * 16 * 128, ds_t[kk][0], ds_t[kk][1], ds_t[kk][2], ds_t[kk][3]);
}

// This consumer's 64 x 64 block of dQ = dS K over the CTA's kBlockN keys (8 k-steps): rows
// 64 (c / kDqColumnGroups) of the step's queries, columns 64 (c % kDqColumnGroups). A = dS
// (K-major), B = K (MN-major). One commit group; zero-initialised by the first k-step.
template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_dq(float (&dq)[Cfg::kRegsDq], uint32_t smem, int ds_stage, int consumer) {
  using L = BwdSmem<Cfg>;
  const int row_group = consumer / Cfg::kDqColumnGroups;
  const int column_group = consumer % Cfg::kDqColumnGroups;
  const uint32_t a_tile = smem + L::ds + ds_stage * L::kTileDs + row_group * 64 * 128;
  const uint32_t b_block = smem + L::k + column_group * Cfg::kBlockN * 128;
  fence_registers(dq);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk)
    Wgmma<Element, 64>::template ss<1>(dq, kmajor_descriptor(a_tile + kmajor_step_offset<Cfg::kBlockM>(kk)),
                                       mnmajor_descriptor(b_block + mnmajor_step_offset(kk), Cfg::kBlockN * 128),
                                       kk > 0 ? 1 : 0);
  wgmma_commit();
  fence_registers(dq);
}

// The dQ block into dq_accum (fp32, row-major, `row_stride` floats per query row; the mma.sync
// backward's accumulator, zeroed, with rows past S_q to absorb the last tile's padding, which
// its convert pass then scales and rounds). Register 4c + 2h + e is row 16w + g + 8h, column
// 8c + 2q + e of the block: one float2 atomic (REDG.F32x2) per pair.
template <typename Cfg>
__device__ __forceinline__ void add_dq(const float (&dq)[Cfg::kRegsDq], float* dq_accum_step_rows,
                                       int64_t row_stride, int consumer, int warp, int lane) {
  const int row_group = consumer / Cfg::kDqColumnGroups;
  const int column_group = consumer % Cfg::kDqColumnGroups;
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* row = dq_accum_step_rows + (64 * row_group + 16 * warp + g + 8 * h) * row_stride + 64 * column_group;
#pragma unroll
    for (int c = 0; c < 8; ++c)
      atomicAdd(reinterpret_cast<float2*>(row + 8 * c + 2 * q), make_float2(dq[4 * c + 2 * h], dq[4 * c + 2 * h + 1]));
  }
}

}  // namespace hopper_bwd
