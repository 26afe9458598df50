// Task 4+ (beyond the course): FlashAttention forward for Hopper (sm_90a), fp16 and bf16: the kernel.
//
// Files. This header is the kernel and its lesson, top to bottom: the ladder's explanation
// below, the tile configuration, the device code of every version, and at the end which
// instantiation runs a call (dispatch_version, dispatch_general). flash_attention_hopper.cu is
// the host entry: what the kernel takes, the tensor maps, the launch, and
// flash_attention_hopper (validation, then the dispatch). flash_attention_hopper_fp16.cu and
// flash_attention_hopper_bf16.cu compile the instantiations, one file per element type, so that
// the build compiles them in parallel; this header includes no torch header, which keeps them
// light.
//
// The idea. The mma.sync kernel (flash_attention_mma.cu) is FlashAttention-2 on the tensor-core
// instruction every GPU since Ampere has: one warp, a 16x8x16 product, operands that every
// lane first loads into its registers with ldmatrix. On an H100 that path tops out near half
// of what the chip can do, because Hopper added three things the old instruction cannot use:
//
//   wgmma.mma_async   a *warpgroup* (4 consecutive warps, 128 threads) multiplies a 64 x N x 16
//                     tile in one instruction, reading A and B straight from shared memory
//                     through 64-bit "matrix descriptors" (no ldmatrix, no register copies),
//                     asynchronously: the warps issue it and wait later (commit/wait groups);
//   TMA               the Tensor Memory Accelerator copies a whole 2D..5D box of a tensor
//                     global -> shared with one instruction from one thread, swizzling it on
//                     the way and zero-filling what lies outside the tensor, and reports the
//                     bytes it delivered to an mbarrier (a shared-memory barrier object with
//                     a transaction count) that the consumers wait on;
//   setmaxnreg        warpgroups of one CTA may hold different register budgets: a producer
//                     that only issues TMA copies gives its registers to the consumers.
//
// Tile shapes and why.
//   * 64 query rows per warpgroup: wgmma's M is always 64. A thread then holds the rows
//     16w + g and 16w + g + 8 (w = warp in the warpgroup, g = lane / 4) of every accumulator,
//     the same per-warp layout as mma.sync's m16n8 tile, so the softmax code carries over.
//   * 128 keys per tile (kBlockN): S = Q K^T is one m64n128 accumulator (64 fp32 registers per
//     thread) and the softmax's fixed cost per tile (max, shuffles, rescaling O) is spread
//     over 128 keys; O is m64n{64|128}: 32 or 64 registers. With P (32 registers) this fits
//     a consumer's 240 registers with room to spare at head_dim 128.
//   * Head_dim 256 (Gemma) has 64 keys per tile. A 128-key K or V tile is 64 KB there: two
//     stages of K and V (256 KB) beside a 128-row Q tile (64 KB) exceed an SM's 227 KB. With
//     64 keys the two stages take 128 KB and the CTA 192 KB. S = Q K^T is then m64n64 (32
//     registers, 16 k16 steps over D) and O += P V m64n256 (4 k16 steps): O's 128 registers, S's
//     32 and P's 16 fit a consumer's 240 without spilling (ptxas). FlashAttention-3 takes 80
//     keys at 256 (hopper/tile_size.h; 224 KB with two stages), which fills shared memory and
//     needs an n80 wgmma and a summary of other than 128-key blocks; 64 keys keep the wgmma
//     shapes and the summary we have. v7 (O's own 64 KB buffer) does not fit beside them, and
//     v1's copy rounds need 8 rows per round; so 256 is built for v2 and v5 only.
//     Dense attention at 256 runs on an 80-key tile after all (measured faster:
//     flash_attention_hopper.cu's d256_tile80_schedule; the 64-key tile stays for variants and
//     for ATTN_HOPPER_D256_TILE=64): S is m64n80 (40
//     registers, Wgmma<., 80>), P V 5 k16 steps; the softmax's fixed cost per tile (row max and
//     sum shuffles, O's 128-register rescale, the barriers) and Q's re-read from shared memory
//     are spread over 80 keys instead of 64. 96 keys would need 2 x 2 x 48 KB + 64 KB = 256 KB.
//     On v5 (the turns) and on v4 with kRescaleOEarly: FlashAttention-3 turns the consumers'
//     turns off above head_dim 128 (UseSchedulerBarrier) and rescales O while S computes.
//   * Head_dim 96 (Phi-3) runs on the 128 instantiation: its tensor maps describe the tensor's
//     real 96 columns while the boxes stay 64 columns wide, so the TMA writes zeros into
//     columns 96..127 of Q, K and V (v1's copies do the same). S = Q K^T is exact, O's columns
//     96..127 are P times zeros, and write_output stores only p.head_dim columns. The price:
//     the tensor cores compute 128 columns for 96 (4/3 of the products); FlashAttention-3
//     builds a kernel of its own for 96 (192 x 144 tiles), which would cost compile time.
//   * Shared memory in 128-byte swizzled rows: a [rows][D] tile is stored as D/64 "column
//     blocks" of [rows][64] 16-bit elements (128 bytes per row); inside each 1024-byte group of
//     8 rows the 16-byte chunk c of row r sits at chunk c ^ (r % 8). That is the layout both
//     the TMA (CU_TENSOR_MAP_SWIZZLE_128B) writes and wgmma (descriptor layout type 1) reads,
//     and it is free of bank conflicts. Tiles start on 1024-byte boundaries.
//
// The ladder (template parameter kVersion, host argument `version`; each stays runnable so a
// reader can time the steps with `python -m task4.hopper_ladder`; measured: Results.md, "The
// Hopper kernel", and task4/NOTES.md):
//   v1  wgmma from shared memory. One CTA = one warpgroup = 64 query rows. Q, K, V reach
//       shared memory by cp.async (every thread copies 16-byte pieces into the swizzled
//       layout) with FlashAttention-2's overlap: V[j] loads while S = Q K[j]^T runs, K[j-1]
//       while the softmax and P V[j] run. S = Q K^T: wgmma, both operands from shared memory.
//       Online softmax on the fp32 accumulators in registers. P, rounded to 16 bits in
//       registers, is the register A operand of O += P V (V from shared memory through a
//       "transposed", MN-major descriptor: V is [keys][D] with D contiguous).
//   v2  TMA + mbarrier. One thread issues the copies; the K and V tiles go through a 2-stage
//       ring of buffers, each with a "full" mbarrier that counts the bytes that landed. The
//       loads run ahead of the math by a whole tile and cost the computing threads nothing.
//       Still one warpgroup per CTA, which must also hand each buffer back (a CTA barrier).
//   v3  warp specialization: one producer warpgroup (setmaxnreg.dec to 24 registers) whose
//       one thread only issues TMA, and two consumer warpgroups (setmaxnreg.inc to 240) that
//       each own 64 query rows (128 per CTA) and share the K/V stages. A consumer hands a
//       stage back through an "empty" mbarrier; nobody waits on a CTA-wide barrier.
//   v4  intra-warpgroup overlap (consume_overlapped): a consumer issues S[j] = Q K[j]^T and
//       O += P[j-1] V[j-1] back to back, waits only for S[j], and runs the softmax of tile j
//       while the tensor cores still compute P V; P[j-1]'s fragments and S[j] are live at once.
//   v5  v4 + ping-pong: the two consumers take turns issuing their wgmma (two named barriers),
//       so one's softmax runs while the other's products hold the tensor cores
//       (FlashAttention-3's two steps beyond v3). flash_attention runs v5 at head_dim 128.
//   v6  v5 with three consumers of 160 registers (192 query rows per CTA), head_dim 64 only.
//       At 64 a tile's softmax costs what it does at 128 but its products half, so
//       instruction issue bounds the kernel; v3-v5's one CTA of 384 threads per SM (the 24/240
//       register split takes the register file) computes with 8 warps, v2's three
//       one-warpgroup CTAs with 12, and v2 was the fastest rung there (ncu figures in
//       task4/NOTES.md). v6 computes with 12 warps and keeps the turns and the overlap;
//       flash_attention runs it at 64 without a mask (with the causal mask v2 measured faster).
//   v7  v5 persistent (FlashAttention-3's tile scheduler): one CTA per SM, resident for good,
//       takes work tiles (query tile, head) one after another: the first its own, then the
//       next untaken one (an atomic counter, so short causal tiles balance). The producer
//       loads the next tile's Q once both consumers' last S = Q K^T is in (a Q-empty
//       mbarrier) and its K/V as stages free up, during this tile's last P V and epilogue;
//       O is staged in a buffer of its own. A CTA of v1-v6 spends its start and its end with
//       the tensor cores idle, which at S 1024 (8 key tiles) is a large part of its life.
//       Which rung flash_attention runs per dtype, head_dim, mask and length is measured
//       (task4/hopper_routing.json). A variant asked of v5, v6 or v7 runs the general v7
//       where it applies (ATTN_HOPPER_GENERAL_VERSION=5, read per call, keeps the general v5 for
//       A/B runs): key lengths, windows and sinks at head_dim 64/96/128 run the general v7 (Tile::kVariantSchedule), whose
//       work tiles are the aligned tiling's computing ones in an order the CTAs compute on the
//       device from the key lengths (longest batch first), and whose zero-only rows the
//       producer warpgroup's idle warps write (VariantSchedule).
//
// What this kernel takes (hopper_supports; everything else runs on the mma.sync kernel):
// fp16/bf16, head_dim 64, 96 (on the 128 tile), 128 or 256 (versions 2 and 5), causal
// (bottom-right aligned when Sq != Sk) or not, GQA/MQA, any strides with a contiguous last
// dimension that the TMA accepts (16-byte multiples). The mask semantics are
// attention_mask.cuh's KeyMask, the predicate the other kernels use: KeyMask<false> (sequence
// end and causal diagonal) for dense attention, and, instantiated with Tile::kGeneral for
// versions 2 and 5, sliding windows and key lengths (varlen and left padding) as one interval
// of visible keys per row, the softcap on every tile's scores and the sinks in the epilogue,
// and on v5 bool and additive mask tensors (broadcastable to [B, H_q, S_q, S_k], read where
// they are) through a per-tile summary that a small kernel computes first (TileKind, per
// 128-key block: empty tiles are never loaded, tiles wholly visible with no bias skip the mask
// tensor, the others apply it element by element). Key tiles no row of a CTA sees are never
// loaded (a window or a block-sparse mask costs its visible tiles) and tiles every row sees
// whole skip the mask. A stride (a per-key predicate) stays on the mma.sync kernel. A row with
// no visible key outputs zeros.
//
// Tiles aligned to what a variant sees (the general instantiation, VariantTiling). With key
// lengths or S_q != S_k the causal diagonal sits at an offset that is rarely a multiple of 128:
// tiled from row 0 and key 0, each query tile's diagonal then cuts two key tiles (two tiles
// masked element by element, one of them mostly invisible) and a left-padded sequence's first
// key tile is cut too. So the general instantiation starts the key tiles at the sequence's
// first key and the query tiles where each one's diagonal starts a key tile
// (aligned_query_tiling): one masked tile per query tile, as dense causal attention has. The
// TMA takes any row coordinate, a negative one included, and zero-fills what lies outside the
// tensor. And a query tile whose rows see no key (up to 3/4 of a padded batch's) is found at the
// CTA's start, before any barrier or copy: it writes its zeros and returns (write_zero_rows).
// (Head_dim 256 keeps tiles from zero, Tile::kAlignVariants; a mask tensor too, its summary
// being per block from zero. ATTN_HOPPER_VARIANT_ALIGN=0 restores the old tiling, for A/B runs.)
//
// Sources for the hardware facts (read, not copied; cited where used):
//   [desc]  CUTLASS include/cute/arch/mma_sm90_desc.hpp: GmmaDescriptor bit fields.
//   [canon] CUTLASS include/cute/atom/mma_traits_sm90_gmma.hpp: make_gmma_desc's canonical
//           K-major / MN-major layouts (which stride is LBO, which SBO), and CLayout_64xN /
//           ALayout_64x16 (the accumulator and register-A fragment layouts).
//   [gmma]  CUTLASS include/cute/arch/mma_sm90_gmma.hpp: wgmma asm operand order
//           (d, a, b, scale-d predicate, imm-scale-a, imm-scale-b, [imm-tnsp-a,] imm-tnsp-b).
//   [tma]   CUTLASS include/cute/arch/copy_sm90_tma.hpp (SM90_TMA_LOAD_4D) and
//           copy_sm90_desc.hpp (mbarrier init / expect_tx / try_wait.parity); cuda.h's
//           documentation of cuTensorMapEncodeTiled (box and stride rules).
//   [ptx]   PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply" and "mbarrier".


#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <algorithm>
#include <cstdint>

#include "attention_mask.cuh"
#include "flash_attention_mma.cuh"  // mma_attn::Params, ElementOps::pack, exp2_approx, cp.async

// wgmma and setmaxnreg exist only on sm_90a ("arch-specific" features). A plain sm_90 pass
// (CI's compile check) compiles the kernels' bodies away; the host refuses to launch them
// on anything but compute capability 9.0, and a build for sm_90a is what runs there.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HOPPER_ATTN_SM90A 1
#else
#define HOPPER_ATTN_SM90A 0
#endif

namespace hopper_attn {

// The mma.sync kernel's parameters, plus the per-tile summary of a mask tensor.
//
// A mask tensor (bool, or additive float; broadcastable to [B, H_q, S_q, S_k]) is summarised
// before the attention kernel runs, by tile_summary_kernel below: one byte per (mask batch,
// mask head, query tile of the CTA's kBlockM rows, key block of kSummaryKeys = 128 keys):
//   kTileEmpty    no element of the block keeps its key: the tile is never loaded nor computed;
//   kTileVisible  every element keeps its key with no bias: no per-element work for the mask
//                 tensor (the interval of windows, causal, key lengths may still need its two
//                 comparisons per key, CtaWork::needs_mask);
//   kTilePartial  anything else (some elements dropped, or a finite nonzero bias, or NaN): the
//                 mask tensor is applied element by element on that tile.
// Query rows >= S_q and keys >= S_k are left out of a block's summary (the interval masks them).
// The producer and the consumers walk the same list of key tiles: the interval's tiles, highest
// first, less the empty ones (visited_tile).
enum TileKind : int { kTileEmpty = 0, kTileVisible = 1, kTilePartial = 2 };
// Keys per block of the summary: the 128-key tile of head_dims 64 and 128. The 64-key tiles of
// head_dim 256 read the byte of the block they lie in, which is exact for an empty or visible
// block and conservative (the per-element path) for a partial one.
constexpr int kSummaryKeys = 128;

struct Params : mma_attn::Params {
  // [mask batches][mask heads][query tiles][key tiles] bytes (TileKind), or nullptr: no mask
  // tensor (the general v5, Tile::kMaskTensor, gets one whenever p.mask.mask is set; the host
  // sends a mask tensor to no other instantiation).
  const uint8_t* tile_summary = nullptr;
  int64_t summary_batch_stride = 0;  // bytes between batches' summaries; 0: broadcast mask
  int64_t summary_head_stride = 0;   // bytes between heads' summaries; 0: broadcast mask
  int summary_key_tiles = 0;         // key blocks per query tile (ceil(S_k / kSummaryKeys))
  // v7: the work tiles handed out so far beyond the first gridDim.x (zeroed before the launch).
  int* tile_counter = nullptr;
  // How the general instantiation tiles a variant (VariantTiling, below); the host reads it from
  // ATTN_HOPPER_VARIANT_ALIGN on every call, so that one process can time the tilings side by side.
  int variant_tiling = 1;
  // Which persistent-or-not kernel runs a general call of version 5, 6 or 7: 5 (the general v5)
  // or 7 (the general v7, Tile::kVariantSchedule, where it takes the call: the host's default): the host sets it from
  // ATTN_HOPPER_GENERAL_VERSION on every call, where the general v7 takes the call.
  int general_version = 5;
};

// How the general instantiation places its tiles on a variant (Params::variant_tiling).
//   kTilingFromZero   query tile m is rows [m * kBlockM, ...) and key tile n keys
//                     [n * kBlockN, ...), whatever the variant (before issue 31's alignment);
//   kTilingAligned    key tiles start at the sequence's first key and query tiles where the
//                     causal diagonal (or a window's lower edge) starts a key tile
//                     (aligned_query_tiling), and CTAs whose rows see no key only write zeros
//                     (CtaWork::computes): a padded batch's query tiles then have one masked
//                     key tile each, as dense causal attention's, and its empty ones no prologue;
//   kTilingSkipEmpty  tiles from zero, but the CTAs whose rows see no key only write zeros
//                     (the second half of kTilingAligned alone, for measuring each).
// A mask tensor keeps tiles from zero: its summary is per 128 x 128 block from zero.
enum VariantTiling : int { kTilingFromZero = 0, kTilingAligned = 1, kTilingSkipEmpty = 2 };

// Where one sequence's query tiles start in the aligned tiling. A slanted edge of the visible
// region (the causal diagonal: row q's last key q + offset; a window's lower edge) crosses
// 128 keys over a 128-row query tile: two key tiles when it starts inside one, one when it
// starts on a tile boundary. Key tiles start at key_begin (so a left-padded sequence's first
// key starts one), and so query tile t is rows [base + t * kBlockM, ...) with base + offset -
// key_begin a multiple of min(kBlockM, kBlockN): each query tile's diagonal then cuts one key
// tile, as in dense causal attention at S_q = S_k. Base is the first row that sees a key,
// moved back to that alignment (rows below 0 exist in no tensor: the TMA zero-fills them and
// they are never stored); the rows before it see no key at all and are only written as zeros.
struct QueryTiling {
  int base;        // first row of work tile 0 (may be negative)
  int work_tiles;  // query tiles that compute: rows [base + t * block_m, ...), t < work_tiles
  int zero_rows;   // rows [0, zero_rows) see no key: zeros, block_m rows per CTA
};

__host__ __device__ inline QueryTiling aligned_query_tiling(int seq_q, int key_begin, int key_end,
                                                            bool causal, int window, int block_m,
                                                            int block_n) {
  // 64-bit: a window near INT_MAX plus an offset must not wrap.
  const int64_t offset = static_cast<int64_t>(key_end) - seq_q;  // row q sits at key q + offset
  // The first row that sees a key (attention_mask.cuh's visibility): causal, the row whose
  // diagonal reaches key_begin; a symmetric window, the row whose upper edge does; else row 0.
  int64_t first = 0;
  if (key_begin >= key_end) first = seq_q;
  else if (causal) first = key_begin - offset;
  else if (window > 0) first = key_begin - offset - window + 1;
  first = first < 0 ? 0 : (first > seq_q ? seq_q : first);
  QueryTiling t;
  if (first >= seq_q) {  // no row sees a key: every row is zeros
    t.base = seq_q;
    t.work_tiles = 0;
    t.zero_rows = seq_q;
    return t;
  }
  // The row the tiling is anchored on (mod `align`): the diagonal of row `anchor` is key_begin;
  // without causal a window's lower edge (rows [anchor, anchor + 128) have their first keys in
  // one key tile); without either nothing is slanted, and tiles start at the first row.
  const int64_t anchor = causal ? key_begin - offset : (window > 0 ? key_begin - offset + window : first);
  const int align = block_m < block_n ? block_m : block_n;
  int64_t shift = (first - anchor) % align;
  if (shift < 0) shift += align;
  int64_t base = first - shift;
  // Unless that takes one query tile more than tiles from zero do: after a long cache (a chunk
  // of S_q 1024 at an offset of 5976) the extra tile's rows see the whole cache, some 47 key
  // tiles, to save one masked tile in each of 8 query tiles. Then tiles from zero, from the
  // first that has a row seeing a key.
  const int64_t base_from_zero = first - first % block_m;
  if ((seq_q - base + block_m - 1) / block_m > (seq_q - base_from_zero + block_m - 1) / block_m)
    base = base_from_zero;
  t.base = static_cast<int>(base);
  t.work_tiles = static_cast<int>((seq_q - base + block_m - 1) / block_m);
  t.zero_rows = t.base > 0 ? t.base : 0;
  return t;
}

// The general v7's order of work tiles (Tile::kVariantSchedule), computed at each CTA's start
// from the key lengths (which only the device has) into shared memory, by build_variant_schedule:
//   * the computing tiles of the aligned tiling (QueryTiling::work_tiles per head of each batch)
//     are numbered batch by batch, the batches in longest-first order (their heaviest work
//     tile's keys, ties by index: FlashAttention-3's LPT order for varlen, which sorts the
//     batches by work), so the tiles handed out last (the atomic counter's) are the lightest;
//   * inside a batch, heads in sections whose K/V fit in a share of L2 (kL2Bytes), and in a
//     section the query tiles last (heaviest under causal) to first, the section's heads
//     innermost (FlashAttention-3's L2 swizzle): the CTAs at work at one time read few heads'
//     K/V, which stay in L2;
//   * the zero-only rows (rows [0, zero_rows) of each batch, kBlockM rows of one head per chunk)
//     numbered batch by batch, written by the producer warpgroup's three idle warps of CTA
//     z % gridDim.x with 16-byte stores (write_zero_rows), overlapped with the work tiles.
// At most kMaxScheduledBatches batches (the host runs the general v5 beyond).
constexpr int kMaxScheduledBatches = 256;
constexpr int64_t kL2Bytes = 32ll << 20;  // FlashAttention-3's L2 share for a section's K/V
struct VariantSchedule {
  int batches;                                // B
  int tile_prefix[kMaxScheduledBatches + 1];  // work tiles numbered before the rank-r batch
  int order[kMaxScheduledBatches];            // the batch of rank r (longest first)
  int zero_prefix[kMaxScheduledBatches + 1];  // zero chunks numbered before batch b
  int work_tiles[kMaxScheduledBatches];       // batch b's work tiles per head
  int tiling_base[kMaxScheduledBatches];      // batch b's QueryTiling::base
  int zero_rows[kMaxScheduledBatches];        // batch b's rows [0, zero_rows) see no key
  int section_heads[kMaxScheduledBatches];    // batch b's heads per L2 section
  int sort_key[kMaxScheduledBatches];         // batch b's heaviest work tile's keys (the build's)
};
constexpr int kVariantScheduleBytes = static_cast<int>((sizeof(VariantSchedule) + 15) / 16 * 16);

// ---------------------------------------------------------------------------------------
// Tile configuration
// ---------------------------------------------------------------------------------------

// kBlockN_: keys per tile, 0 = the head_dim's own (128; 64 at 256). Head_dim 256 also has an
// 80-key tile (FlashAttention-3's), for dense attention on v4 (the default at 256) and v5
// (ATTN_HOPPER_D256_TILE=80; flash_attention_hopper.cu, d256_tile80_schedule).
template <int kHeadDim_, int kVersion_, bool kGeneral_ = false, bool kSoftcap_ = false, int kBlockN_ = 0>
struct Tile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kVersion = kVersion_;
  // The variant predicate: false = attention_mask.cuh's KeyMask<false> (sequence end, causal
  // diagonal: the dense kernels), true = KeyMask<true> (windows, key lengths, masks, strides)
  // plus the softcap and the sinks.
  static constexpr bool kGeneral = kGeneral_;
  // The softcap (Gemma-2) is its own instantiation of the general v5: its 64 tanh per thread
  // and tile, inlined in the key loop of every general kernel, cost the kernels that never
  // use it 5-7% (Results.md, "The Hopper kernel on the variants").
  static constexpr bool kSoftcap = kSoftcap_;
  // A mask tensor (through its per-tile summary) runs on the general v5 alone: v2's one
  // warpgroup has no registers to spare for the mask's loads (at head_dim 64 three v2 CTAs
  // share an SM at <= 168 registers a thread; with the loads ptxas spilled there).
  static constexpr bool kMaskTensor = kGeneral && kVersion == 5;
  // The aligned variant tiling (VariantTiling): each CTA's first query row and first key then
  // come from the key lengths, two values a consumer keeps through its key loop instead of
  // recomputing them from blockIdx. Head_dim 256's general v5 has no registers for them (ptxas:
  // 32 bytes of spills, where its consumers already use 237 of their 240), so it tiles variants
  // from zero; its empty CTAs are still skipped.
  static constexpr bool kAlignVariants = kGeneral && kHeadDim != 256;
  static constexpr bool kTma = kVersion >= 2;
  static constexpr bool kWarpSpecialized = kVersion >= 3;
  static constexpr bool kIntraOverlap = kVersion >= 4;  // softmax[j] overlaps P[j-1] V[j-1]
  static constexpr bool kPingPong = kVersion >= 5;      // the consumers take turns at wgmma
  // v7: v5's CTA resident for good, walking work tiles (query tile, head) in turn, with O
  // staged in its own buffer so the next tile's Q and K/V load during this one's epilogue.
  static constexpr bool kPersistent = kVersion == 7;
  // The general v7 (key lengths, windows, sinks; no mask tensor, no softcap: those run v5): its
  // work tiles are the aligned tiling's computing ones, in an order computed on the device from
  // the key lengths (VariantSchedule, kept in shared memory), and the query rows that see no key
  // are written as zeros by the producer warpgroup's idle warps, never taking a work tile's turn.
  static constexpr bool kVariantSchedule = kPersistent && kGeneral;
  // The general v5's key loop without a mask tensor (consume_overlapped) runs the tiles the
  // interval cuts and the tiles every row sees whole in loops of their own, as FlashAttention-3
  // does: a wholly visible tile then pays no per-tile test (needs_mask, the summary's kind, the
  // next visited tile), which it did on every tile of a variant that needs none of them; and a
  // cut tile whose rows' first keys lie before it compares each score once (apply_mask). (The
  // loop before the split was kept for an A/B run, ATTN_HOPPER_GENERAL_LOOP=old, until the H100
  // measured the split faster: results/logs/h100_gen_lean_ab.log.)
  static constexpr bool kSplitKeyLoop = kGeneral && kIntraOverlap;
  // The split loop's cut tiles compare each score with the one end of its row's visible keys
  // that can cut the tile (mask_edges): the tiles at the top only with the upper end (the causal
  // diagonal, a symmetric window's upper edge, the sequence end), those at the bottom only with
  // the lower end (a window's lower edge, left padding's first key), and only the tiles both
  // ends may cut (a window narrower than about two tiles) with both; each thread's row bounds
  // computed once per CTA (RowEdges). (The split loop before that, every cut tile rebuilding the
  // predicate and comparing with both ends, was kept for an A/B run, ATTN_HOPPER_EDGE_MASK=
  // two_sided, until the H100 measured the one-sided masks never slower:
  // results/logs/h100_s8_win_edge/win_edge_ab.log.)
  static constexpr bool kEdgeMasks = kSplitKeyLoop;
  // Warpgroups that compute: 1, then 2; v6 (head_dim 64 only) 3, each at 160 registers.
  static constexpr int kConsumers = kVersion == 6 ? 3 : kWarpSpecialized ? 2 : 1;
  static constexpr int kThreads = 128 * (kConsumers + (kWarpSpecialized ? 1 : 0));

  static constexpr int kBlockM = 64 * kConsumers;  // query rows per CTA
  // Keys per tile: 128, but 64 at head_dim 256, where a 128-key K or V tile is 64 KB and two
  // stages of both beside a 128-row Q tile (64 KB) would not fit shared memory (see the header);
  // or kBlockN_ (80 at head_dim 256: 40 KB per K or V tile, the CTA 224 KB of the 227).
  static constexpr int kBlockN = kBlockN_ != 0 ? kBlockN_ : (kHeadDim == 256 ? 64 : 128);
  static constexpr int kStages = kTma ? 2 : 1;     // K/V buffers in the ring
  static constexpr int kColBlocks = kHeadDim / 64;  // 128-byte column blocks of a row
  // The mask tensor's summary is kept per 128-key block whatever the tile (kSummaryKeys): a
  // key tile reads the byte of the block it lies in (visited_tile). An 80-key tile may straddle
  // two blocks, so it never meets a mask tensor (dense instantiations only, asserted below).
  static constexpr int kTilesPerSummaryBlock = kMaskTensor ? kSummaryKeys / kBlockN : 1;
  static_assert(!kMaskTensor || kSummaryKeys % kBlockN == 0, "a key tile lies inside one summary block");
  // v4 at head_dim 256 (the 80-key tile's FlashAttention-3 schedule, no turns) scales O by the
  // previous tile's correction between issuing S[j] = Q K[j]^T and P[j-1] V[j-1], so that O's
  // 128 multiplies per thread run while the tensor cores compute S instead of between two
  // products (FlashAttention-3's RescaleOBeforeGemm, on for head dims above 128). With turns
  // (v5) the rescale would hold the turn, so v5 keeps it after the wait for P V.
  static constexpr bool kRescaleOEarly = kIntraOverlap && !kPingPong && kHeadDim > 128;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K (or V) tile
  // Shared memory: Q | K stages | V stages | mbarriers. Every tile offset is a multiple of
  // 1024 bytes (the 128-byte swizzle repeats every 8 rows = 1024 bytes and is computed by the
  // hardware from the address bits, so a tile must start on such a boundary).
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKVBytes;
  static constexpr int kOffO = kOffV + kStages * kKVBytes;  // v7: O's staging (else in Q's)
  static constexpr int kOffBarriers = kOffO + (kPersistent ? kQBytes : 0);
  // Q full, K/V full, K/V empty; v7 also Q empty and (8 bytes) the next work tile's index.
  static constexpr int kNumBarriers = 1 + 4 * kStages + (kPersistent ? 2 : 0);
  // The general v7: the work tile the producer computed (WorkSlot) and the schedule.
  static constexpr int kOffWorkSlot = (kOffBarriers + 8 * kNumBarriers + 127) / 128 * 128;
  static constexpr int kWorkSlotBytes = kVariantSchedule ? 128 : 0;
  static constexpr int kOffSchedule = kOffWorkSlot + kWorkSlotBytes;
  static constexpr int kScheduleBytes = kVariantSchedule ? kVariantScheduleBytes : 0;
  static constexpr int kSmemBytes = (kVariantSchedule ? kOffSchedule + kScheduleBytes
                                                      : kOffBarriers + 8 * kNumBarriers) + 1024;  // + alignment slack
  // Registers a warpgroup keeps after setmaxnreg (v3-v6): 128 * (24 + 2 * 240) <= 65536 with
  // two consumers, 128 * (24 + 3 * 160) <= 65536 with three.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 160 : 240;
  static_assert(128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 65536 || !kWarpSpecialized,
                "the warpgroups' registers fit the register file");
  // (head_dim 96 runs on the 128 instantiation: the TMA zero-fills columns 96..127.)
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim 64, 128 or 256");
  static_assert(kHeadDim != 256 || kVersion == 2 || kVersion == 5 || (kVersion == 4 && kBlockN == 80),
                "head_dim 256 is instantiated for versions 2 and 5 (v1's copy rounds and v7's O "
                "buffer do not fit it), and v4 for the 80-key tile's schedule");
  static_assert(kBlockN_ == 0 || (kHeadDim == 256 && kBlockN_ == 80 && !kGeneral &&
                                  (kVersion == 4 || kVersion == 5)),
                "the 80-key tile is head_dim 256's, dense, on v4 and v5 (Wgmma<., 80> has ss only)");
  static_assert(kBlockN % 16 == 0, "O += P V steps over the tile's keys in k16");
  static_assert(kVersion != 6 || kHeadDim == 64, "v6's 160-register consumers hold head_dim 64 only");
  static_assert(!kVariantSchedule || (!kSoftcap && kAlignVariants),
                "the general v7 has no softcap (v5's instantiation runs it) and tiles aligned");
  static_assert(!kSoftcap || (kGeneral && kVersion == 5), "the softcap runs on the general v5");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles stay 1024-byte aligned");
  static_assert(kSmemBytes <= 227 * 1024, "fits an H100 CTA's shared memory");
};

// ---------------------------------------------------------------------------------------
// The shared-memory layout (the one place the swizzle is written)
// ---------------------------------------------------------------------------------------

// Byte offset of 16-byte chunk `chunk` (elements 8*chunk .. 8*chunk+7) of row `row` of a
// [kRows][D] tile stored as column blocks of [kRows][64] with the 128-byte swizzle:
// Swizzle<3,4,3> on the byte address, i.e. address bits [4,7) ^= bits [7,10) [canon:
// Layout_K_SW128_Atom_Bits / Layout_MN_SW128_Atom_Bits]; with 128-byte rows and a
// 1024-aligned tile, bits [7,10) are row % 8 and bits [4,7) the chunk within the row.
template <int kRows>
__host__ __device__ constexpr uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * (kRows * 128) + row * 128 +
                               (((chunk & 7) ^ (row & 7)) << 4));
}

// Where the k16 step `kk` of a wgmma operand starts, in bytes from its tile.
//   K-major [kRows][D] tile (Q, K): 16 elements = 32 bytes along the 128-byte row; every 4
//   steps (64 elements) the next column block of kRows * 128 bytes.
template <int kRows>
__host__ __device__ constexpr uint32_t kmajor_step_offset(int kk) {
  return static_cast<uint32_t>((kk >> 2) * kRows * 128 + (kk & 3) * 32);
}
//   MN-major [keys][D] tile (V): 16 key rows = 2048 bytes (two 1024-byte swizzle groups).
__host__ __device__ constexpr uint32_t mnmajor_step_offset(int kk) {
  return static_cast<uint32_t>(kk * 16 * 128);
}

// ---- a compile-time proof that the descriptors read the layout the loads write ----
// The address wgmma reads for element (mn, k) (k < 16) of one k16 step, following [canon]'s
// canonical 128B-swizzle layouts in bytes (T = 8 elements = 16 bytes):
//   K-major:  ((8,m),(T,2)) : ((128 B, SBO), (2 B, 16 B))
//   MN-major: ((T,8,n),(8,k)) : ((2 B, 16 B, LBO), (128 B, SBO))
// and then Swizzle<3,4,3> on the address (bits [4,7) ^= bits [7,10)), the tile's base being
// 1024-byte aligned. swizzled_offset must give the same byte for every element: if it does
// not, the build fails here instead of the first GPU run computing garbage.
constexpr uint32_t swizzle_128b(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

constexpr uint32_t kmajor_read(uint32_t start, uint32_t sbo, int mn, int k) {
  return swizzle_128b(start + (mn % 8) * 128 + (mn / 8) * sbo + (k / 8) * 16 + (k % 8) * 2);
}

constexpr uint32_t mnmajor_read(uint32_t start, uint32_t lbo, uint32_t sbo, int mn, int k) {
  return swizzle_128b(start + (mn % 8) * 2 + ((mn % 64) / 8) * 16 + (mn / 64) * lbo +
                      (k % 8) * 128 + (k / 8) * sbo);
}

// Element (row, col) of a [kRows][D] tile, as the loads place it.
template <int kRows>
constexpr uint32_t stored_at(int row, int col) {
  return swizzled_offset<kRows>(row, col / 8) + (col % 8) * 2;
}

// Q or K as a K-major operand: rows mn, columns (the reduction dim) 16 kk + k.
template <int kRows, int kHeadDim>
constexpr bool kmajor_descriptors_read_the_layout() {
  for (int kk = 0; kk < kHeadDim / 16; ++kk)
    for (int mn = 0; mn < kRows; ++mn)
      for (int k = 0; k < 16; ++k)
        if (kmajor_read(kmajor_step_offset<kRows>(kk), 1024, mn, k) != stored_at<kRows>(mn, 16 * kk + k))
          return false;
  return true;
}

// V as an MN-major operand: reduction rows (keys) 16 kk + k, columns mn < kHeadDim.
template <int kKeys, int kHeadDim>
constexpr bool mnmajor_descriptors_read_the_layout() {
  for (int kk = 0; kk < kKeys / 16; ++kk)
    for (int mn = 0; mn < kHeadDim; ++mn)
      for (int k = 0; k < 16; ++k)
        if (mnmajor_read(mnmajor_step_offset(kk), kKeys * 128, 1024, mn, k) != stored_at<kKeys>(16 * kk + k, mn))
          return false;
  return true;
}

// Checked for every tile configuration that is launched (see launch_hopper).
template <typename Cfg>
struct LayoutProofs {
  static_assert(kmajor_descriptors_read_the_layout<Cfg::kBlockM, Cfg::kHeadDim>(),
                "Q: the K-major descriptors must read what the loads wrote");
  static_assert(kmajor_descriptors_read_the_layout<Cfg::kBlockN, Cfg::kHeadDim>(),
                "K: the K-major descriptors must read what the loads wrote");
  static_assert(mnmajor_descriptors_read_the_layout<Cfg::kBlockN, Cfg::kHeadDim>(),
                "V: the MN-major descriptors must read what the loads wrote");
  static constexpr bool kProved = true;
};

// ---------------------------------------------------------------------------------------
// PTX wrappers: wgmma, descriptors, mbarriers, TMA
// ---------------------------------------------------------------------------------------

// The 64-bit shared-memory matrix descriptor of wgmma [desc]:
//   bits  0-13  start address >> 4
//   bits 16-29  leading dimension byte offset (LBO) >> 4
//   bits 32-45  stride dimension byte offset (SBO) >> 4
//   bits 49-51  base offset (0: our tiles are 1024-byte aligned)
//   bits 62-63  layout type: 1 = SWIZZLE_128B (2 = 64B, 3 = 32B, 0 = none)
// What LBO and SBO mean depends on the operand's major-ness [canon, make_gmma_desc]:
//   K-major (Q as A, K as B of S = Q K^T: the reduction dim D is contiguous),
//     128B swizzle: ((8,m),(T,2)):((8T,SBO),(1,T)) -> SBO = bytes between groups of 8 rows
//     (1024 for our dense tiles); LBO is unused ("assumed 1").
//   MN-major (V as B of O = P V: N = D is contiguous, the reduction dim is the key row),
//     128B swizzle: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) -> LBO = bytes between 64-element
//     column blocks along N (kBlockN * 128 for our V tiles), SBO = bytes between groups of
//     8 key rows (1024).
__device__ __forceinline__ uint64_t make_smem_descriptor(uint32_t smem_addr,
                                                         uint32_t leading_byte_offset,
                                                         uint32_t stride_byte_offset) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr >> 4) & 0x3FFFu);
  desc |= static_cast<uint64_t>((leading_byte_offset >> 4) & 0x3FFFu) << 16;
  desc |= static_cast<uint64_t>((stride_byte_offset >> 4) & 0x3FFFu) << 32;
  desc |= static_cast<uint64_t>(1) << 62;  // SWIZZLE_128B
  return desc;
}

// K-major operand tile (Q or K): rows of 128 bytes, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t kmajor_descriptor(uint32_t smem_addr) {
  return make_smem_descriptor(smem_addr, 16, 1024);
}

// MN-major operand tile (V): `column_block_bytes` between the 64-wide column blocks.
__device__ __forceinline__ uint64_t mnmajor_descriptor(uint32_t smem_addr,
                                                       uint32_t column_block_bytes) {
  return make_smem_descriptor(smem_addr, column_block_bytes, 1024);
}

// wgmma.fence: orders this thread's earlier register writes (the accumulators, P) before the
// next wgmma reads them [ptx]. commit closes a group of issued wgmma; wait<N> blocks until at
// most N groups are still running.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The asm statement of a wgmma "writes" its accumulators when it is issued, but the tensor
// cores write them until the wait. This empty asm (CUTLASS's warpgroup_fence_operand) keeps
// the compiler from moving reads or writes of `r` across the points where it is placed.
template <int kN>
__device__ __forceinline__ void fence_registers(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kRows, int kCols>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[kRows][kCols]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int j = 0; j < kCols; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// wgmma m64nNk16 with fp32 accumulators, for N in {64, 128} (and 256, rs only: O at head_dim
// 256; 80, ss only: S on head_dim 256's 80-key tile): ss takes A and B from shared memory
// (descriptors), rs takes A from registers. `accumulate` = 0 overwrites D.
// kTransposeB = 0: B is K-major; 1: B is MN-major [gmma: imm-tnsp-b].
template <typename Element, int kN>
struct Wgmma;

template <>
struct Wgmma<__half, 64> {
  static constexpr int kRegs = 32;
  // D[64 x 64] (+)= A[64 x 16] (shared, descriptor) * B[16 x 64] (shared, descriptor).
  template <int kTransposeB>
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
  // D[64 x 64] += A[64 x 16] (registers, 4 x f16x2 per thread) * B[16 x 64] (shared).
  template <int kTransposeB>
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
};

template <>
struct Wgmma<__half, 128> {
  static constexpr int kRegs = 64;
  // D[64 x 128] (+)= A[64 x 16] (shared, descriptor) * B[16 x 128] (shared, descriptor).
  template <int kTransposeB>
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
  // D[64 x 128] += A[64 x 16] (registers, 4 x f16x2 per thread) * B[16 x 128] (shared).
  template <int kTransposeB>
  static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
};

template <>
struct Wgmma<__nv_bfloat16, 64> {
  static constexpr int kRegs = 32;
  // D[64 x 64] (+)= A[64 x 16] (shared, descriptor) * B[16 x 64] (shared, descriptor).
  template <int kTransposeB>
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
  // D[64 x 64] += A[64 x 16] (registers, 4 x bf16x2 per thread) * B[16 x 64] (shared).
  template <int kTransposeB>
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
};

template <>
struct Wgmma<__nv_bfloat16, 128> {
  static constexpr int kRegs = 64;
  // D[64 x 128] (+)= A[64 x 16] (shared, descriptor) * B[16 x 128] (shared, descriptor).
  template <int kTransposeB>
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
  // D[64 x 128] += A[64 x 16] (registers, 4 x bf16x2 per thread) * B[16 x 128] (shared).
  template <int kTransposeB>
  static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
};

template <>
struct Wgmma<__half, 80> {
  static constexpr int kRegs = 40;
  // D[64 x 80] (+)= A[64 x 16] (shared, descriptor) * B[16 x 80] (shared, descriptor). Only
  // S = Q K^T of head_dim 256's 80-key tile uses N = 80 (a multiple of 8, as wgmma's N must be
  // for 16-bit inputs [ptx]), so only ss.
  template <int kTransposeB>
  static __device__ __forceinline__ void ss(float (&d)[40], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39"
        "}, %40, %41, p, 1, 1, 0, %43;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
};

template <>
struct Wgmma<__nv_bfloat16, 80> {
  static constexpr int kRegs = 40;
  // D[64 x 80] (+)= A[64 x 16] (shared, descriptor) * B[16 x 80] (shared, descriptor). Only
  // S = Q K^T of head_dim 256's 80-key tile uses N = 80 (a multiple of 8, as wgmma's N must be
  // for 16-bit inputs [ptx]), so only ss.
  template <int kTransposeB>
  static __device__ __forceinline__ void ss(float (&d)[40], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39"
        "}, %40, %41, p, 1, 1, 0, %43;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
};

template <>
struct Wgmma<__half, 256> {
  static constexpr int kRegs = 128;
  // D[64 x 256] += A[64 x 16] (registers, 4 x f16x2 per thread) * B[16 x 256] (shared).
  // Only O += P V at head_dim 256 uses N = 256 (S = Q K^T is m64n64 there), so only rs.
  template <int kTransposeB>
  static __device__ __forceinline__ void rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
};

template <>
struct Wgmma<__nv_bfloat16, 256> {
  static constexpr int kRegs = 128;
  // D[64 x 256] += A[64 x 16] (registers, 4 x bf16x2 per thread) * B[16 x 256] (shared).
  // Only O += P V at head_dim 256 uses N = 256 (S = Q K^T is m64n64 there), so only rs.
  template <int kTransposeB>
  static __device__ __forceinline__ void rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransposeB));
  }
};

// mbarrier: a 64-bit shared-memory object with an arrival count and a transaction (byte)
// count; a phase completes when both reach zero, and its parity bit flips [ptx, tma].
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the other threads and to the async proxy (TMA).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` more bytes the TMA will deliver in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Wait until the phase with parity `parity` has completed (try_wait suspends the thread for a
// hardware-chosen time before returning false, so this loop does not spin hot).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// TMA: copy the box at coordinates (col, row, head, batch) of the 4D tensor `map` describes
// (dims D, S, H, B) into shared memory at `smem_dst`, completing `bytes` on mbarrier `bar`
// [tma: SM90_TMA_LOAD_4D]. Out-of-bounds elements are written as zeros.
__device__ __forceinline__ void tma_load_tile(uint32_t smem_dst, const CUtensorMap* map,
                                              uint32_t bar, int col, int row, int head,
                                              int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(col), "r"(row), "r"(head), "r"(batch)
      : "memory");
}

// Shared memory written by ordinary stores (cp.async included) that wgmma (the async proxy)
// reads next: each writing thread fences before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A barrier among the 128 threads of one consumer warpgroup: named barrier 1 + warpgroup (0 is
// __syncthreads's). Immediate ids, so that ptxas sees which of the 16 barriers are used.
__device__ __forceinline__ void warpgroup_barrier_sync(int warpgroup) {
  if (warpgroup == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else if (warpgroup == 1) asm volatile("bar.sync 2, 128;\n" ::: "memory");
  else asm volatile("bar.sync 3, 128;\n" ::: "memory");
}

// v5/v6's turns: the consumer warpgroups take turns issuing their wgmma, in a cycle. Named
// barrier 4 + c is consumer c's turn: c waits on it (bar.sync, 256 = its 128 threads + 128
// arrivals), and the consumer before it in the cycle arrives on it (bar.arrive, no wait) once
// it has issued.
__device__ __forceinline__ void wait_for_turn(int consumer) {
  if (consumer == 0) asm volatile("bar.sync 4, 256;\n" ::: "memory");
  else if (consumer == 1) asm volatile("bar.sync 5, 256;\n" ::: "memory");
  else asm volatile("bar.sync 6, 256;\n" ::: "memory");
}
template <int kConsumers>
__device__ __forceinline__ void pass_turn(int consumer) {  // to the next consumer in the cycle
  const int next = consumer + 1 == kConsumers ? 0 : consumer + 1;
  if (next == 0) asm volatile("bar.arrive 4, 256;\n" ::: "memory");
  else if (next == 1) asm volatile("bar.arrive 5, 256;\n" ::: "memory");
  else asm volatile("bar.arrive 6, 256;\n" ::: "memory");
}

// setmaxnreg: the executing warpgroup's register budget shrinks / grows to kRegs [ptx].
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if HOPPER_ATTN_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if HOPPER_ATTN_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// ---------------------------------------------------------------------------------------
// Loads
// ---------------------------------------------------------------------------------------

// v1: rows [row0, row0 + kRows) of one head into a swizzled [kRows][D] tile, 16 bytes per
// cp.async, by `kCopyThreads` threads. Rows >= seq are zero-filled (src-size 0): zero keys
// give finite scores (masked afterwards) and zero values add nothing, whereas stale shared
// memory could hold NaN. So are columns >= cols (the tensor's head_dim, 96 on the 128 tile),
// as the TMA does: zero columns of Q and K add nothing to S, of V give O zero columns.
template <int kHeadDim, int kRows, int kCopyThreads, typename Element>
__device__ __forceinline__ void load_tile_cp_async(uint32_t smem_tile, const Element* head_base,
                                                   const void* any_valid, int64_t row_stride,
                                                   int row0, int seq, int cols, int tid) {
  constexpr int kChunks = kHeadDim / 8;                 // 16-byte chunks per row
  constexpr int kRowsPerRound = kCopyThreads / kChunks;  // rows one round of copies covers
  static_assert(kRows % kRowsPerRound == 0 && kRowsPerRound % 8 == 0,
                "whole rounds, each a whole number of 8-row swizzle groups");
  // A thread always copies the same chunk of rows r, r + kRowsPerRound, ...: since
  // kRowsPerRound is a multiple of 8, row % 8 and so the swizzled chunk never change, and each
  // round is one pointer step in global memory and 128 * kRowsPerRound bytes in shared memory.
  const int row = tid / kChunks;
  const int chunk = tid % kChunks;
  const Element* src = head_base + (row0 + row) * row_stride + chunk * 8;
  const uint32_t dst = smem_tile + swizzled_offset<kRows>(row, chunk);
  const bool in_columns = chunk * 8 < cols;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerRound; ++i) {
    const bool in_bounds = in_columns && row0 + row + i * kRowsPerRound < seq;
    mma_attn::cp_async_16(dst + i * kRowsPerRound * 128,
                          in_bounds ? static_cast<const void*>(src + i * kRowsPerRound * row_stride) : any_valid,
                          in_bounds);
  }
}

// v2, v3: one TMA box per 64-column block (the 128-byte swizzle takes boxes at most 128 bytes
// wide [tma, cuda.h: "bounding box inner dimension <= 128"]), all completing on `bar`.
template <int kHeadDim, int kRows>
__device__ __forceinline__ void load_tile_tma(uint32_t smem_tile, const CUtensorMap* map,
                                              uint32_t bar, int row0, int head, int batch) {
#pragma unroll
  for (int block = 0; block < kHeadDim / 64; ++block)
    tma_load_tile(smem_tile + block * kRows * 128, map, bar, block * 64, row0, head, batch);
}

// ---------------------------------------------------------------------------------------
// The math of one warpgroup (64 query rows)
// ---------------------------------------------------------------------------------------
//
// Accumulator layout of wgmma m64nN (fp32) [canon: CLayout_64xN = ((4,8,4),(2,2,N/8)) :
// ((128,1,16),(64,8,512)) over the column-major (m, n) index m + 64 n]: thread t of the
// warpgroup (warp w = t / 32, lane l, g = l / 4, q = l % 4) holds N/2 registers; register
// i = 4c + 2h + e holds row 16w + g + 8h, column 8c + 2q + e. So for each 8-column chunk c a
// thread has two adjacent columns of rows g and g + 8, exactly mma.sync's m16n8 layout.
//
// Register-A layout of wgmma m64nNk16 for 16-bit types [canon: ALayout_64x16 = ((4,8,4),
// (2,2,2)) : ((128,1,16),(64,8,512))]: 4 registers of two elements; a0 = (row g, k 2q..2q+1),
// a1 = (row g + 8, k 2q..), a2 = (row g, k 2q+8..), a3 = (row g + 8, k 2q+8..), rows offset
// by 16w. So for the k16 step kk of O += P V, S's registers 8kk .. 8kk+7 (chunks 2kk and
// 2kk+1) packed pairwise are exactly a0..a3: P never leaves the registers and needs no shuffle.

template <typename Cfg>
struct RowState {
  float o[Cfg::kHeadDim / 2];  // O accumulator, m64 x kHeadDim
  float row_max[2];            // running max of rows g and g + 8 (raw score units)
  float row_sum[2];            // this thread's share of their running sums
};

template <typename Cfg>
__device__ __forceinline__ void init_row_state(RowState<Cfg>& st) {
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) st.o[i] = 0.f;
  st.row_max[0] = st.row_max[1] = -INFINITY;
  st.row_sum[0] = st.row_sum[1] = 0.f;
}

// S = Q K^T for this warpgroup's 64 rows: D/16 wgmma steps of k16. Q and K are K-major;
// stepping k16 inside a 128-byte row is +32 bytes on the start address (the hardware applies
// the swizzle to the final address, which is why tiles are 1024-aligned), and every 64
// elements the next column block starts. issue_scores only issues (one commit group); the
// scores are there after a wgmma_wait that covers the group (compute_scores waits at once).
template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_scores(float (&s)[Cfg::kBlockN / 2], uint32_t q_rows,
                                             uint32_t k_tile) {
  // BEGIN SOLUTION kernel
  // HINT: S = Q K^T: Cfg::kHeadDim / 16 wgmma_ss steps (K-major descriptors of Q and K, +32 bytes
  // HINT: per k16 inside a 128-byte row, next column block every 64 elements), then commit.
  fence_registers(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
    const uint64_t desc_q = kmajor_descriptor(q_rows + kmajor_step_offset<Cfg::kBlockM>(kk));
    const uint64_t desc_k = kmajor_descriptor(k_tile + kmajor_step_offset<Cfg::kBlockN>(kk));
    Wgmma<Element, Cfg::kBlockN>::template ss<0>(s, desc_q, desc_k, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
  fence_registers(s);
  // END SOLUTION
}

template <typename Element, typename Cfg>
__device__ __forceinline__ void compute_scores(float (&s)[Cfg::kBlockN / 2], uint32_t q_rows,
                                               uint32_t k_tile) {
  issue_scores<Element, Cfg>(s, q_rows, k_tile);
  wgmma_wait<0>();
  fence_registers(s);
}

// The mask (sequence end, causal diagonal) on a tile that needs it: keys a row may not see
// get -inf. `row0` is the query index of this thread's row g, `col0` the key index of its
// column 2q of chunk 0. The general predicate: each row's visible keys are one interval
// (windows, key lengths, causal: two comparisons per key), and with kMaskKind (a tile the
// summary calls partial) the mask tensor's element of each key inside it: -inf drops the key,
// an additive value is added in the kernel's score units (mask_scale), as KeyMask::apply.
template <typename Cfg, int kMaskKind = attn::kNoMask>
__device__ __forceinline__ void apply_mask(float (&s)[Cfg::kBlockN / 2],
                                           const attn::KeyMask<Cfg::kGeneral>& mask, int row0, int col0) {
  // BEGIN SOLUTION kernel
  // HINT: s[4c + 2h + e] is row row0 + 8h, key col0 + 8c + e: mask.apply each.
  if constexpr (Cfg::kGeneral) {
    // (A stride, the one per-key predicate left, is refused by the host: it runs on the
    // mma.sync kernel.)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      const int2 keys = mask.visible_keys(row);
      // The row's visible keys counted from this thread's first column (col0): each element
      // compares its column 8c + e, a constant, with them: two comparisons and a select. (With
      // key = col0 + 8c + e compared instead, the SASS also computed each of the thread's 32 keys
      // with an add of its own, on every masked tile.)
      const int lo = keys.x - col0, hi = keys.y - col0;
      if constexpr (kMaskKind == attn::kNoMask) {
        // A row whose first visible key is at or before this thread's first column (every
        // row of a causal diagonal tile without a window's lower edge in it): only the upper
        // end cuts, one comparison per element as the dense kernels have. The same elements
        // become -inf as below.
        if (lo <= 0) {
#pragma unroll
          for (int c = 0; c < Cfg::kBlockN / 8; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (8 * c + e >= hi) s[4 * c + 2 * h + e] = -INFINITY;
          continue;
        }
      }
      // Rows >= S_q (the padding of the last query tile, never stored) read no mask element.
      const bool read_tensor = kMaskKind != attn::kNoMask && row < mask.seq_q;
      const int64_t row_offset = static_cast<int64_t>(row) * mask.mask_stride_q;
#pragma unroll
      for (int c = 0; c < Cfg::kBlockN / 8; ++c)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * c + e;
          float& score = s[4 * c + 2 * h + e];
          if (col < lo || col >= hi) {
            score = -INFINITY;
          } else if (read_tensor) {  // key < S_k here: the element exists
            const int key = col0 + col;
            const float bias = attn::mask_value(mask.mask_head, kMaskKind, row_offset + key * mask.mask_stride_k);
            if (bias == -INFINITY) score = -INFINITY;
            else if (kMaskKind != attn::kBoolMask) score = fmaf(bias, mask.mask_scale, score);
          }
        }
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < Cfg::kBlockN / 8; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        s[4 * c + 2 * h + e] = mask.apply(s[4 * c + 2 * h + e], row0 + 8 * h, col0 + 8 * c + e);
  // END SOLUTION
}

// One step of the online softmax on S, in two parts so that v4 can run the first while the
// tensor cores still write O:
//   softmax_update: S becomes P = exp2(s*scale - m*scale) in place; new row max (over this
//     thread's columns, then the 4 lanes of the quad that share the row), the running sum
//     rescaled by exp2(m_old - m_new) plus this tile's sum; returns those two factors;
//   rescale_o: O *= the factor of its row.
// The 1/sqrt(D) scale and log2(e) are folded into one FFMA before the EX2, as in the mma.sync
// kernel.
template <typename Cfg>
__device__ __forceinline__ void softmax_update(float (&s)[Cfg::kBlockN / 2], RowState<Cfg>& st,
                                               float scale_log2, float (&correction)[2]) {
  // BEGIN SOLUTION kernel
  // HINT: Per row h: max over the thread's columns and the quad (2 shuffles), correction[h] =
  // HINT: exp2((m_old - m_new) * scale), p = exp2(s * scale - m_new * scale), rescale row_sum.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m_new = st.row_max[h];
#pragma unroll
    for (int c = 0; c < Cfg::kBlockN / 8; ++c)
      m_new = fmaxf(m_new, fmaxf(s[4 * c + 2 * h], s[4 * c + 2 * h + 1]));
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
    // A row with no visible key yet keeps m = -inf: subtract 0 instead so that
    // exp2(-inf - (-inf)) = NaN never happens; its p and correction are then 0.
    const float m_scaled = m_new == -INFINITY ? 0.f : m_new * scale_log2;
    correction[h] = mma_attn::exp2_approx(fmaf(st.row_max[h], scale_log2, -m_scaled));
    st.row_max[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < Cfg::kBlockN / 8; ++c)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = mma_attn::exp2_approx(fmaf(s[4 * c + 2 * h + e], scale_log2, -m_scaled));
        s[4 * c + 2 * h + e] = p;
        sum += p;
      }
    st.row_sum[h] = st.row_sum[h] * correction[h] + sum;
  }
  // END SOLUTION
}

template <typename Cfg>
__device__ __forceinline__ void rescale_o(RowState<Cfg>& st, const float (&correction)[2]) {
#pragma unroll
  for (int c = 0; c < Cfg::kHeadDim / 8; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.o[4 * c + 2 * h] *= correction[h];
      st.o[4 * c + 2 * h + 1] *= correction[h];
    }
}

// kRescaleOEarly (Tile): O *= the last tile's correction right after S = Q K^T was issued, so
// that the multiplies run while the tensor cores compute S. The fence pins them there: the
// compiler may not hoist them above the issue (an asm volatile it cannot reorder with
// fence_registers's) and issue_pv's fence keeps them before the next P V.
template <typename Cfg>
__device__ __forceinline__ void rescale_o_during_scores(RowState<Cfg>& st, const float (&correction)[2]) {
  fence_registers(st.o);
  rescale_o<Cfg>(st, correction);
}

template <typename Cfg>
__device__ __forceinline__ void online_softmax_step(float (&s)[Cfg::kBlockN / 2],
                                                    RowState<Cfg>& st, float scale_log2) {
  float correction[2];
  softmax_update<Cfg>(s, st, scale_log2, correction);
  rescale_o<Cfg>(st, correction);
}

// O += P V: kBlockN/16 wgmma steps of k16 with P from registers (see the layout note above)
// and V through an MN-major descriptor: a k16 step is 16 key rows = 2048 bytes further.
// pack_p rounds P to the element type as the register A fragments; issue_pv issues the steps
// (one commit group). The tensor cores read the fragments and write O until a wgmma_wait
// covers the group: until then neither may be touched (v4 fences both after its wait).
template <typename Cfg>
using PFragments = uint32_t[Cfg::kBlockN / 16][4];

template <typename Element, typename Cfg>
__device__ __forceinline__ void pack_p(PFragments<Cfg>& a, const float (&p)[Cfg::kBlockN / 2]) {
  // BEGIN SOLUTION kernel
  // HINT: a[kk][r] = S's registers 8kk + 2r and 8kk + 2r + 1 packed into one 32-bit pair.
  using Ops = mma_attn::ElementOps<Element>;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = Ops::pack(p[8 * kk + 2 * r], p[8 * kk + 2 * r + 1]);
  // END SOLUTION
}

template <typename Element, typename Cfg>
__device__ __forceinline__ void issue_pv(RowState<Cfg>& st, const PFragments<Cfg>& a, uint32_t v_tile) {
  // BEGIN SOLUTION kernel
  // HINT: Cfg::kBlockN / 16 wgmma_rs steps (A = a[kk], B = an MN-major descriptor of V, 2048 bytes
  // HINT: further per step), then commit.
  fence_registers(st.o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    const uint64_t desc_v = mnmajor_descriptor(v_tile + mnmajor_step_offset(kk), Cfg::kBlockN * 128);
    Wgmma<Element, Cfg::kHeadDim>::template rs<1>(st.o, a[kk], desc_v, 1);
  }
  wgmma_commit();
  fence_registers(st.o);
  // END SOLUTION
}

template <typename Element, typename Cfg>
__device__ __forceinline__ void compute_pv(RowState<Cfg>& st, const float (&p)[Cfg::kBlockN / 2],
                                           uint32_t v_tile) {
  PFragments<Cfg> a;
  pack_p<Element, Cfg>(a, p);
  issue_pv<Element, Cfg>(st, a, v_tile);
  wgmma_wait<0>();
  fence_registers(st.o);
}

// The epilogue of one warpgroup: O / l rounded to the element type, staged through this
// warpgroup's rows of the (no longer needed) Q tile in the same swizzled layout (the 4-byte
// stores of a warp hit 8 rows in 8 different bank groups), then copied out with coalesced
// 16-byte stores; rows outside [0, seq_q) are not written, nor columns >= p.head_dim (head_dim 96 on
// the 128 tile: its columns 96..127 are P times V's zero-filled columns). Also the base-2 LSE
// when asked for.
template <typename Element, typename Cfg>
__device__ __forceinline__ void write_output(const Params& p, const RowState<Cfg>& st,
                                             unsigned char* smem_q_ptr, int warpgroup,
                                             int m_start, int64_t bh, int64_t batch,
                                             int64_t head, int thread_in_wg) {
  // BEGIN SOLUTION kernel
  // HINT: O / l (l summed over the quad) rounded to Element, staged in the Q tile's rows of this
  // HINT: warpgroup, then 16-byte stores of the rows in [0, seq_q); the LSE when p.lse is set.
  using Ops = mma_attn::ElementOps<Element>;
  const int warp = thread_in_wg >> 5;
  const int lane = thread_in_wg & 31;
  const int g = lane >> 2;
  const int q = lane & 3;
  const int wg_row0 = warpgroup * 64;  // this warpgroup's first row in the CTA tile
  // Every warp of the warpgroup is done reading Q (its last wgmma has completed).
  warpgroup_barrier_sync(warpgroup);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    // l >= 1 for a row that saw a key (its maximum contributes exp2(0) = 1); 0 otherwise.
    float inv_l = l > 0.f ? __fdividef(1.f, l) : 0.f;
    float lse2 = l > 0.f ? fmaf(st.row_max[h], p.scale_log2, __log2f(l)) : -INFINITY;
    if constexpr (Cfg::kGeneral) {
      // An attention sink joins the max and the denominator once, here (attn::sink_term).
      if (p.mask.sinks != nullptr) {
        const auto sink = attn::sink_term(p.mask.sinks[head], st.row_max[h] * p.scale_log2);
        const float total = fmaf(l, sink.keys, sink.sink);
        inv_l = total > 0.f ? sink.keys / total : 0.f;
        lse2 = total > 0.f ? sink.top + __log2f(total) : -INFINITY;
      }
    }
    const int row = wg_row0 + 16 * warp + g + 8 * h;
    // (An aligned variant tiling's first tile may start above row 0: rows < 0 are not stored.)
    const int grow = m_start + row;
    const bool stored = (!Cfg::kAlignVariants || grow >= 0) && grow < p.seq_q;
    if (p.lse != nullptr && q == 0 && stored) p.lse[bh * p.seq_q + grow] = lse2;
#pragma unroll
    for (int c = 0; c < Cfg::kHeadDim / 8; ++c) {
      const uint32_t packed = Ops::pack(st.o[4 * c + 2 * h] * inv_l, st.o[4 * c + 2 * h + 1] * inv_l);
      *reinterpret_cast<uint32_t*>(smem_q_ptr + swizzled_offset<Cfg::kBlockM>(row, c) + 4 * q) = packed;
    }
  }
  warpgroup_barrier_sync(warpgroup);
  Element* o_head = static_cast<Element*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride;
  constexpr int kChunks = Cfg::kHeadDim / 8;
  const int chunks = p.head_dim / 8;  // the tensor's (host: a multiple of 8, <= kHeadDim)
#pragma unroll
  for (int i = 0; i < 64 * kChunks / 128; ++i) {
    const int idx = thread_in_wg + i * 128;
    const int row = wg_row0 + idx / kChunks;
    const int chunk = idx % kChunks;
    const int grow = m_start + row;
    if ((!Cfg::kAlignVariants || grow >= 0) && grow < p.seq_q && chunk < chunks) {
      const uint4 value =
          *reinterpret_cast<const uint4*>(smem_q_ptr + swizzled_offset<Cfg::kBlockM>(row, chunk));
      *reinterpret_cast<uint4*>(o_head + grow * p.o_row_stride + chunk * 8) = value;
    }
  }
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------
// The kernels
// ---------------------------------------------------------------------------------------

// What one CTA works on (uniform over the CTA).
struct CtaWork {
  int64_t bh, batch, head, kv_head;
  int m_start;         // first query row of the CTA tile (negative rows are never stored)
  int key_base;        // key tile n is keys [key_base + n * kBlockN, ...): 0, or aligned tiling's
                       // first key of the sequence (VariantTiling)
  // False: no row of the CTA sees a key. It writes zeros to rows [m_start, zero_end) (possibly
  // none) and returns before any barrier or copy (write_zero_rows): an empty query tile of a
  // padded batch costs its stores, not a prologue.
  bool computes;
  int zero_end;
  int n_first;         // the lowest key tile any row of the CTA sees (a window's, left padding's)
  int n_tiles;         // key tiles of the interval: n_block = n_first + n_tiles - 1 down to n_first
  int unmasked_begin;  // key tiles in [unmasked_begin, unmasked_end) are visible to every row
  int unmasked_end;    // with no bias, as far as the interval goes (the summary says the rest)
  // The mask tensor's summary of this CTA's query tile: key tile n's TileKind at summary[n];
  // nullptr without a mask tensor (then every tile of the interval is visited).
  const uint8_t* summary;
  // Key tile of the j-th step of the interval (highest first: the masked tiles at the
  // diagonal come first).
  __device__ __forceinline__ int n_block(int j) const { return n_first + n_tiles - 1 - j; }
  // Whether a visited tile needs the per-element predicate: the interval cuts it, or the
  // summary calls it partial (`kind`, from visited_tile).
  __device__ __forceinline__ bool needs_mask(int n_block, int kind) const {
    return n_block >= unmasked_end || n_block < unmasked_begin || kind == kTilePartial;
  }
};

// The first key of key tile n_block (the TMA's row coordinate of K and V, the mask's column).
template <typename Cfg>
__device__ __forceinline__ int first_key(const CtaWork& w, int n_block) {
  return w.key_base + n_block * Cfg::kBlockN;
}

// A CTA with no key to compute: `rows` query rows from `first_row` on, to become zeros.
__device__ __forceinline__ void set_zero_rows(CtaWork& w, int first_row, int rows) {
  w.computes = false;
  w.m_start = first_row;
  w.zero_end = first_row + max(rows, 0);
  w.n_first = w.n_tiles = w.unmasked_begin = w.unmasked_end = 0;
}

// The work of query tile m_tile of (batch, head) bh = batch * heads + head. The general v7
// passes its schedule, which holds the batch's aligned tiling (`sched`: computed once per batch
// there, where its 64-bit arithmetic does not fit the producer's 24 registers).
template <typename Cfg>
__device__ __forceinline__ CtaWork cta_work_at(const Params& p, int m_tile, int64_t bh, int64_t batch,
                                               int64_t head, int64_t kv_head,
                                               const VariantSchedule* sched = nullptr) {
  CtaWork w;
  w.bh = bh;
  w.batch = batch;
  w.head = head;
  w.kv_head = kv_head;
  w.m_start = m_tile * Cfg::kBlockM;
  w.key_base = 0;
  w.computes = true;
  w.zero_end = 0;
  w.summary = nullptr;
  attn::KeyMask<Cfg::kGeneral> mask(p.mask, w.batch, w.head);
  if constexpr (Cfg::kMaskTensor) {
    if (p.tile_summary != nullptr) {
      w.summary = p.tile_summary + w.batch * p.summary_batch_stride + w.head * p.summary_head_stride +
                  static_cast<int64_t>(m_tile) * p.summary_key_tiles;
      // The summary speaks for the mask tensor: the interval below is the rest of the predicate.
      mask.mask_head = nullptr;
    }
  }
  if constexpr (Cfg::kVariantSchedule) {
    // The general v7 runs no mask tensor, no stride, and the aligned tiling (the host's
    // general_version_for): said to the compiler, which then keeps none of their parameters
    // live in the producer's 24 registers.
    mask.mask_head = nullptr;
    mask.stride = 1;
  }
  if constexpr (Cfg::kAlignVariants) {
    if (Cfg::kVariantSchedule || (p.variant_tiling == kTilingAligned && p.mask.mask == nullptr)) {
      // Tiles aligned to this sequence's visible keys (aligned_query_tiling). The grid has a
      // CTA for each work tile and each kBlockM rows before them that see no key, and spares
      // (the host cannot read the key lengths): m_tile numbers the work tiles, then the zeros.
      QueryTiling t;
      if constexpr (Cfg::kVariantSchedule) {
        t.base = sched->tiling_base[batch];
        t.work_tiles = sched->work_tiles[batch];
        t.zero_rows = sched->zero_rows[batch];
      } else {
        t = aligned_query_tiling(mask.seq_q, mask.key_begin, mask.key_end, mask.causal, mask.window,
                                 Cfg::kBlockM, Cfg::kBlockN);
      }
      w.key_base = mask.key_begin;
      if (m_tile >= t.work_tiles) {
        const int first_row = min((m_tile - t.work_tiles) * Cfg::kBlockM, t.zero_rows);
        set_zero_rows(w, first_row, min(Cfg::kBlockM, t.zero_rows - first_row));
        return w;
      }
      w.m_start = t.base + m_tile * Cfg::kBlockM;
    }
  }
  const int q_last = w.m_start + Cfg::kBlockM - 1;
  // Key tiles that no row of the CTA can see are never loaded (a window costs its tiles). Tile
  // indices count from key_base (keys_begin and the unmasked range start at or after it).
  w.n_first = max(mask.keys_begin(w.m_start) - w.key_base, 0) / Cfg::kBlockN;
  const int n_end = max(w.n_first, (mask.keys_end(q_last) - w.key_base + Cfg::kBlockN - 1) / Cfg::kBlockN);
  w.n_tiles = n_end - w.n_first;
  const int2 unmasked = mask.unmasked_keys(w.m_start, q_last);
  w.unmasked_begin = (unmasked.x - w.key_base + Cfg::kBlockN - 1) / Cfg::kBlockN;
  w.unmasked_end = unmasked.y >= unmasked.x ? (unmasked.y - w.key_base) / Cfg::kBlockN : 0;
  if constexpr (Cfg::kGeneral) {
    // No key tile in the interval: no row of the CTA sees a key (a mask tensor only hides more).
    if (w.n_tiles == 0 && (Cfg::kVariantSchedule || p.variant_tiling != kTilingFromZero))
      set_zero_rows(w, max(w.m_start, 0), min(w.m_start + Cfg::kBlockM, mask.seq_q) - max(w.m_start, 0));
  }
  return w;
}
template <typename Cfg>
__device__ __forceinline__ CtaWork cta_work_at(const Params& p, int m_tile, int64_t bh) {
  const int64_t head = bh % p.heads;
  return cta_work_at<Cfg>(p, m_tile, bh, bh / p.heads, head, head / p.kv_group);  // GQA: a group shares K/V
}

// v1-v6: the CTA's own tile. Grid: x = query tiles, heaviest (last, under the causal mask)
// first; y/z = batch * heads.
template <typename Cfg>
__device__ __forceinline__ CtaWork cta_work(const Params& p) {
  return cta_work_at<Cfg>(p, static_cast<int>(gridDim.x - 1 - blockIdx.x),
                          static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y);
}

// v7: the work tiles, numbered heads-major with each head's query tiles heaviest first (the
// order v1-v6's grid launches them in, so the CTAs at work at one time share few heads' K/V in
// L2). CTA c starts with tile c; each later tile is the next one not yet taken (an atomic
// counter): greedy, so a CTA that drew short causal tiles takes more of them. (Dealt in turn,
// c, c + gridDim.x, ..., a CTA at S 1024 saw only two of the 8 query tiles of a head, always
// the same two: up to twice another CTA's work under the causal mask.)
template <typename Cfg>
__device__ __forceinline__ int64_t work_tiles(const Params& p) {
  return static_cast<int64_t>((p.seq_q + Cfg::kBlockM - 1) / Cfg::kBlockM) * p.batch_heads;
}
template <typename Cfg>
__device__ __forceinline__ CtaWork work_tile(const Params& p, int64_t tile) {
  const int m_tiles = (p.seq_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  return cta_work_at<Cfg>(p, m_tiles - 1 - static_cast<int>(tile % m_tiles), tile / m_tiles);
}

// The highest key tile <= n that the CTA visits, or a value below w.n_first when none is left;
// `kind` gets its TileKind (that of the 128-key summary block the tile lies in). Without a
// summary that is n itself (kTileVisible: the interval alone decides); with one, the tiles the
// summary calls empty are passed over. The producer and the consumers call it on the same
// arguments, so they walk the same list; the stage and parity counters count visited tiles. (A
// CTA's row of the summary is a few bytes that stay in L1.)
template <typename Cfg>
__device__ __forceinline__ int visited_tile(const CtaWork& w, int n, int& kind) {
  kind = kTileVisible;
  if constexpr (Cfg::kMaskTensor) {
    if (w.summary != nullptr) {
      for (; n >= w.n_first; --n) {
        kind = __ldg(w.summary + n / Cfg::kTilesPerSummaryBlock);
        if (kind != kTileEmpty) break;
      }
    }
  }
  return n;
}

// The softcap (Gemma-2; the general instantiation's softcap one): every tile's scores, before
// a mask's bias.
template <typename Cfg>
__device__ __forceinline__ void softcap_scores(float (&s)[Cfg::kBlockN / 2], const Params& p) {
  if constexpr (Cfg::kSoftcap) {
#pragma unroll
    for (int i = 0; i < Cfg::kBlockN / 2; ++i) s[i] = attn::softcap_score_fast(s[i], p.mask);
  }
}

// The mask on a tile that needs it (CtaWork::needs_mask): the per-element predicate, and a mask
// tensor's elements where the summary calls the tile partial (`kind`).
template <typename Cfg>
__device__ __forceinline__ void mask_scores(float (&s)[Cfg::kBlockN / 2], const Params& p,
                                            const CtaWork& w, const attn::KeyMask<Cfg::kGeneral>& mask,
                                            int n_block, int kind, int row0, int col_in_tile) {
  const int col0 = first_key<Cfg>(w, n_block) + col_in_tile;
  if constexpr (Cfg::kGeneral) {
    // The general predicate is rebuilt here, on the tiles that need it, from the kernel's
    // parameters (constant memory): kept live across the key loop its ~17 registers made
    // v5's consumers spill (ptxas), and most tiles need none of them.
    const attn::KeyMask<true> tile_mask(p.mask, w.batch, w.head);
    // The mask tensor on the tiles its summary calls partial, one instantiation per storage
    // type (a uniform branch per tile); on the others the interval alone.
    if constexpr (Cfg::kMaskTensor) {
      if (kind == kTilePartial && tile_mask.mask_head != nullptr) {
        switch (tile_mask.mask_kind) {
          case attn::kBoolMask: return apply_mask<Cfg, attn::kBoolMask>(s, tile_mask, row0, col0);
          case attn::kFloat32Mask: return apply_mask<Cfg, attn::kFloat32Mask>(s, tile_mask, row0, col0);
          case attn::kFloat16Mask: return apply_mask<Cfg, attn::kFloat16Mask>(s, tile_mask, row0, col0);
          default: return apply_mask<Cfg, attn::kBFloat16Mask>(s, tile_mask, row0, col0);
        }
      }
    }
    apply_mask<Cfg>(s, tile_mask, row0, col0);
  } else {
    apply_mask<Cfg>(s, mask, row0, col0);
  }
}

// What a tile's scores need before the softmax: the softcap and the mask, on the tiles that
// need it (a uniform branch: tiles inside [unmasked_begin, unmasked_end) skip the per-element
// predicate).
template <typename Cfg>
__device__ __forceinline__ void prepare_scores(float (&s)[Cfg::kBlockN / 2], const Params& p,
                                               const CtaWork& w,
                                               const attn::KeyMask<Cfg::kGeneral>& mask,
                                               int n_block, int kind, int row0, int col_in_tile) {
  softcap_scores<Cfg>(s, p);
  if (!w.needs_mask(n_block, kind)) return;
  mask_scores<Cfg>(s, p, w, mask, n_block, kind, row0, col_in_tile);
}

// The split key loop's cut tiles on one-sided masks (Tile::kEdgeMasks). Without a mask tensor
// each row's visible keys are one interval [lo, hi) (KeyMask::visible_keys), and a CTA's key
// tiles fall in ranges that CtaWork already knows: tile n >= unmasked_begin starts at or after
// every row's lo (the lower end cuts nothing there), tile n < unmasked_end ends before every
// row's hi (the upper end cuts nothing). So the cut tiles at the top (n >= max(unmasked_end,
// unmasked_begin): the causal diagonal, a symmetric window's upper edge, the sequence end) need
// the upper end alone and those at the bottom below unmasked_end (a window's lower edge, left
// padding's first key) the lower end alone; only the tiles in [unmasked_end, unmasked_begin),
// which a window narrower than about two tiles (or left padding and causal in one tile) cuts at
// both ends, compare with both. (Rows >= S_q, never stored, are left out of unmasked_begin: they
// may keep keys below their lo on an upper-only tile; every stored row gets the same -inf as
// with both comparisons, so the results are the same bit for bit.)
//
// A thread's two rows' ends, counted from its first column of key tile 0 (key key_base +
// col_in_tile): key tile n's column 8c + e is visible to row h iff lo[h] - n * kBlockN <= 8c + e
// < hi[h] - n * kBlockN (apply_mask's comparisons on the same integers). Computed once per CTA,
// four registers through the key loop, where a cut tile rebuilt the predicate from the
// parameters (the key length loaded again) and both ends of each row.
struct RowEdges {
  int lo[2];
  int hi[2];
};

template <typename Cfg>
__device__ __forceinline__ RowEdges row_edges(const attn::KeyMask<Cfg::kGeneral>& mask, const CtaWork& w,
                                              int row0, int col_in_tile) {
  RowEdges e{};
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: each row's visible_keys minus (key_base + col_in_tile).
  const int col0 = w.key_base + col_in_tile;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int2 keys = mask.visible_keys(row0 + 8 * h);
    e.lo[h] = keys.x - col0;
    e.hi[h] = keys.y - col0;
  }
  // END SOLUTION
  return e;
}

// Which ends of the rows' intervals can cut a key tile (mask_edges).
enum TileEdges : int { kUpperEdge = 1, kLowerEdge = 2, kBothEdges = 3 };

// The mask of a cut key tile n_block from the rows' ends (RowEdges): -inf where the column lies
// at or above the row's hi (kUpperEdge) or below its lo (kLowerEdge): one comparison and a select
// per score on a tile one end cuts, as the dense kernels' diagonal tile.
template <typename Cfg, int kEdges>
__device__ __forceinline__ void mask_edges(float (&s)[Cfg::kBlockN / 2], const RowEdges& edges, int n_block) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: as apply_mask, with the row's ends less n_block * kBlockN.
  const int shift = n_block * Cfg::kBlockN;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int lo = edges.lo[h] - shift, hi = edges.hi[h] - shift;
#pragma unroll
    for (int c = 0; c < Cfg::kBlockN / 8; ++c)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * c + e;
        if (((kEdges & kUpperEdge) && col >= hi) || ((kEdges & kLowerEdge) && col < lo))
          s[4 * c + 2 * h + e] = -INFINITY;
      }
  }
  // END SOLUTION
}

// A key tile outside the key loop's split (the CTA's first): the ends that cut it, by a uniform
// test (CtaWork::needs_mask's two comparisons, without a mask tensor).
template <typename Cfg>
__device__ __forceinline__ void mask_tile_edges(float (&s)[Cfg::kBlockN / 2], const CtaWork& w,
                                                const RowEdges& edges, int n_block) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: mask_edges with the ends of [unmasked_begin, unmasked_end) it lies outside.
  const bool above = n_block >= w.unmasked_end, below = n_block < w.unmasked_begin;
  if (above && below) mask_edges<Cfg, kBothEdges>(s, edges, n_block);
  else if (above) mask_edges<Cfg, kUpperEdge>(s, edges, n_block);
  else if (below) mask_edges<Cfg, kLowerEdge>(s, edges, n_block);
  // END SOLUTION
}

// The general v7's hand-over of a work tile from the producer to the consumers (written before
// q_full's arrival, read after its wait, released through q_empty as v7's tile index): the
// CtaWork the producer computed (so the consumers, whose time between two tiles is the tensor
// cores' idle time, do not compute it again) and what to do with it.
enum WorkState : int { kWorkCompute = 0, kWorkZeros = 1, kWorkEnd = 2 };
struct WorkSlot {
  CtaWork work;
  int state;  // WorkState
};
static_assert(sizeof(WorkSlot) <= 128, "the work slot fits its 128 bytes (Tile::kWorkSlotBytes)");

// The shared-memory addresses of one CTA (the dynamic allocation rounded up to 1024 bytes).
template <typename Cfg>
struct SmemTiles {
  unsigned char* q_ptr;  // the Q tile, as a pointer (the epilogue stages O there)
  unsigned char* o_ptr;  // where the epilogue stages O: Q's tile, or v7's own buffer
  uint32_t q, k, v, barriers;
  __device__ __forceinline__ uint32_t k_stage(int s) const { return k + s * Cfg::kKVBytes; }
  __device__ __forceinline__ uint32_t v_stage(int s) const { return v + s * Cfg::kKVBytes; }
  // mbarriers: [0] Q full, then K full, V full, K empty, V empty (kStages each).
  __device__ __forceinline__ uint32_t q_full() const { return barriers; }
  __device__ __forceinline__ uint32_t k_full(int s) const { return barriers + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const { return barriers + 8 * (1 + Cfg::kStages + s); }
  __device__ __forceinline__ uint32_t k_empty(int s) const { return barriers + 8 * (1 + 2 * Cfg::kStages + s); }
  __device__ __forceinline__ uint32_t v_empty(int s) const { return barriers + 8 * (1 + 3 * Cfg::kStages + s); }
  // v7: the consumers are done reading Q (a completion per work tile).
  __device__ __forceinline__ uint32_t q_empty() const { return barriers + 8 * (1 + 4 * Cfg::kStages); }
  // v7: the work tile the producer loaded Q for (written before q_full's arrival, read after
  // its wait).
  __device__ __forceinline__ volatile int64_t* work_tile_slot() const {
    return reinterpret_cast<volatile int64_t*>(q_ptr + Cfg::kOffBarriers + 8 * (2 + 4 * Cfg::kStages));
  }
  // The general v7 (Tile::kVariantSchedule): the work tile the producer computed, and the schedule.
  __device__ __forceinline__ WorkSlot* work_slot() const {
    return reinterpret_cast<WorkSlot*>(q_ptr + Cfg::kOffWorkSlot);
  }
  __device__ __forceinline__ VariantSchedule* schedule() const {
    return reinterpret_cast<VariantSchedule*>(q_ptr + Cfg::kOffSchedule);
  }

  __device__ __forceinline__ explicit SmemTiles(unsigned char* raw) {
    const uint32_t raw_u32 = mma_attn::smem_u32(raw);
    const uint32_t base = (raw_u32 + 1023u) & ~1023u;
    q_ptr = raw + (base - raw_u32);
    o_ptr = q_ptr + (Cfg::kPersistent ? Cfg::kOffO : Cfg::kOffQ);
    q = base + Cfg::kOffQ;
    k = base + Cfg::kOffK;
    v = base + Cfg::kOffV;
    barriers = base + Cfg::kOffBarriers;
  }
};

// v2, v3: the producer's copy of key tile n_block into stage s (K or V): announce the bytes,
// then issue the boxes.
template <typename Cfg>
__device__ __forceinline__ void issue_kv_tile(uint32_t smem_stage, const CUtensorMap* map,
                                              uint32_t full_bar, int n_block, const CtaWork& w) {
  mbarrier_arrive_expect_tx(full_bar, Cfg::kKVBytes);
  load_tile_tma<Cfg::kHeadDim, Cfg::kBlockN>(smem_stage, map, full_bar, first_key<Cfg>(w, n_block),
                                             static_cast<int>(w.kv_head), static_cast<int>(w.batch));
}

// The lse of a row that sees no key, as write_output computes it from l = 0 and row max -inf:
// -inf, or with an attention sink the sink's alone (attn::sink_term; keys = 0).
__device__ __forceinline__ float empty_row_lse2(const Params& p, int64_t head) {
  if (p.mask.sinks == nullptr) return -INFINITY;
  const auto sink = attn::sink_term(p.mask.sinks[head], -INFINITY);
  return sink.sink > 0.f ? sink.top + __log2f(sink.sink) : -INFINITY;
}

// A CTA whose rows see no key (CtaWork::computes false): zeros into rows [w.m_start, w.zero_end)
// of O, 16 bytes per store from every thread, and the empty row's lse when one is asked for.
// No barrier, no copy, no shared memory: the whole CTA returns right after.
// (`thread` of `threads` doing it: the whole CTA, or in the general v7 the consumers or the
// producer warpgroup's idle warps.)
template <typename Element>
__device__ __forceinline__ void write_zero_rows(const Params& p, const CtaWork& w, int thread, int threads) {
  Element* o_head = static_cast<Element*>(p.out) + w.batch * p.o_batch_stride + w.head * p.o_head_stride;
  const int chunks = p.head_dim / 8;  // 16-byte chunks of a row
  const int rows = w.zero_end - w.m_start;
  for (int idx = thread; idx < rows * chunks; idx += threads) {
    const int row = w.m_start + idx / chunks;
    *reinterpret_cast<uint4*>(o_head + static_cast<int64_t>(row) * p.o_row_stride + (idx % chunks) * 8) =
        make_uint4(0u, 0u, 0u, 0u);
  }
  if (p.lse != nullptr) {
    const float lse2 = empty_row_lse2(p, w.head);
    for (int r = thread; r < rows; r += threads) p.lse[w.bh * p.seq_q + w.m_start + r] = lse2;
  }
}
template <typename Element, typename Cfg>
__device__ __forceinline__ void write_zero_rows(const Params& p, const CtaWork& w) {
  write_zero_rows<Element>(p, w, threadIdx.x, Cfg::kThreads);
}

// ---- the general v7's schedule (VariantSchedule says what it holds and why) ----
// Built by every thread of the CTA at its start (after the mbarriers' init, before the CTA-wide
// barrier that follows it): per batch its aligned tiling (one key length each), then each
// batch's rank in the longest-first order and the prefix counts, by counting (B^2 / 384
// comparisons a thread: nothing at B <= 64, a few microseconds at the limit of 256). Ends with a
// CTA-wide barrier between its two passes; the caller's barrier closes the second.
template <typename Cfg>
__device__ __forceinline__ void build_variant_schedule(const Params& p, VariantSchedule& sched, int tid) {
  const int batches = static_cast<int>(p.batch_heads / p.heads);
  if (tid == 0) sched.batches = batches;
  for (int b = tid; b < batches; b += Cfg::kThreads) {
    const attn::KeyMask<true> mask(p.mask, b, 0);
    const QueryTiling t = aligned_query_tiling(mask.seq_q, mask.key_begin, mask.key_end, mask.causal != 0,
                                               mask.window, Cfg::kBlockM, Cfg::kBlockN);
    // The keys of the batch's last work tile: its heaviest under causal (a window's or a
    // non-causal batch's tiles are as heavy, but its first, which the window or padding cuts).
    int keys = 0;
    if (t.work_tiles > 0) {
      const int q_first = max(t.base + (t.work_tiles - 1) * Cfg::kBlockM, 0);
      keys = max(mask.keys_end(mask.seq_q - 1) - mask.keys_begin(q_first), 0);
    }
    sched.work_tiles[b] = t.work_tiles;
    sched.tiling_base[b] = t.base;
    sched.zero_rows[b] = t.zero_rows;
    sched.sort_key[b] = keys;
    // The heads whose K/V (keys x kHeadDim x 2 tensors x 2 bytes; a GQA group shares one) fit
    // kL2Bytes: one L2 section.
    const int64_t kv_bytes = static_cast<int64_t>(max(keys, 1)) * Cfg::kHeadDim * 4;
    sched.section_heads[b] = static_cast<int>(
        min(static_cast<int64_t>(p.heads), max(int64_t{1}, kL2Bytes / kv_bytes * p.kv_group)));
  }
  __syncthreads();
  for (int b = tid; b < batches; b += Cfg::kThreads) {
    const int key = sched.sort_key[b];
    int rank = 0, tiles_before = 0, zeros_before = 0;
    for (int o = 0; o < batches; ++o) {
      const int other = sched.sort_key[o];
      if (other > key || (other == key && o < b)) {
        ++rank;
        tiles_before += sched.work_tiles[o];
      }
      if (o < b) zeros_before += (sched.zero_rows[o] + Cfg::kBlockM - 1) / Cfg::kBlockM;
    }
    sched.order[rank] = b;
    sched.tile_prefix[rank] = tiles_before * p.heads;
    sched.zero_prefix[b] = zeros_before * p.heads;
    if (rank == batches - 1) sched.tile_prefix[batches] = (tiles_before + sched.work_tiles[b]) * p.heads;
    if (b == batches - 1)
      sched.zero_prefix[batches] = (zeros_before + (sched.zero_rows[b] + Cfg::kBlockM - 1) / Cfg::kBlockM) * p.heads;
  }
}

// The general v7's work tile number `tile` (< tile_prefix[batches]): its batch (rank: the rank
// of this CTA's previous tile, from which the search goes on, a CTA's tiles only growing), its
// L2 section, query tile (last first) and head: (x, y, z) = (query tile, batch, head), for
// cta_work_at. The producer computes it (WorkSlot).
__device__ __forceinline__ int3 scheduled_tile(const Params& p, const VariantSchedule& sched, int tile, int& rank) {
  while (tile >= sched.tile_prefix[rank + 1]) ++rank;
  const int b = sched.order[rank];
  const int m_tiles = sched.work_tiles[b];
  const int section_heads = sched.section_heads[b];
  int r = tile - sched.tile_prefix[rank];
  const int section = r / (section_heads * m_tiles);
  r -= section * section_heads * m_tiles;
  const int heads_here = min(section_heads, p.heads - section * section_heads);
  return make_int3(m_tiles - 1 - r / heads_here, b, section * section_heads + r % heads_here);
}

// The general v7's zero-only rows: chunk z (kBlockM rows of one head of one batch, batch by
// batch) is written by CTA z % gridDim.x's `kThreads` threads (`thread` of them: the producer
// warpgroup's idle warps, at its 24 registers: no division in the store loop), 16 bytes per
// store, while the consumers compute. The same stores as write_zero_rows.
template <typename Element, typename Cfg, int kThreads>
__device__ __forceinline__ void write_zero_chunks(const Params& p, const VariantSchedule& sched, int thread) {
  constexpr int kRowChunks = Cfg::kHeadDim / 8;  // 16-byte chunks of a row of the tile
  static_assert(kThreads % kRowChunks == 0, "a thread stores one chunk of each of its rows");
  const int chunk = thread % kRowChunks;
  const int64_t row_step = (kThreads / kRowChunks) * p.o_row_stride;
  const int chunks = sched.zero_prefix[sched.batches];
  int b = 0;
  for (int z = blockIdx.x; z < chunks; z += gridDim.x) {
    while (z >= sched.zero_prefix[b + 1]) ++b;
    const int rows = sched.zero_rows[b];
    const int per_head = (rows + Cfg::kBlockM - 1) / Cfg::kBlockM;
    const int r = z - sched.zero_prefix[b];
    const int head = r / per_head;
    const int first = (r - head * per_head) * Cfg::kBlockM;
    const int count = min(Cfg::kBlockM, rows - first);
    // Thread t stores chunk t % kRowChunks of rows t / kRowChunks, + kThreads / kRowChunks, ...
    // (head_dim 96 on the 128 tile: 12 of the 16 chunks).
    if (chunk * 8 < p.head_dim) {
      Element* o = static_cast<Element*>(p.out) + b * p.o_batch_stride + head * p.o_head_stride +
                   static_cast<int64_t>(first + thread / kRowChunks) * p.o_row_stride + chunk * 8;
      for (int row = thread / kRowChunks; row < count; row += kThreads / kRowChunks, o += row_step)
        *reinterpret_cast<uint4*>(o) = make_uint4(0u, 0u, 0u, 0u);
    }
    if (p.lse != nullptr) {
      const float lse2 = empty_row_lse2(p, head);
      float* lse = p.lse + (static_cast<int64_t>(b) * p.heads + head) * p.seq_q + first;
      for (int i = thread; i < count; i += kThreads) lse[i] = lse2;
    }
  }
}

// ---- v1: wgmma from shared memory, cp.async loads, one warpgroup ----
template <typename Element, typename Cfg>
__device__ __forceinline__ void attention_v1(const Params& p, const CtaWork& w, unsigned char* smem_raw) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: Q and K[last] by cp.async, then per key tile (last to first): wait +
  // HINT: fence.proxy.async + barrier, load V, S = Q K^T, mask, wait + barrier, load the next K,
  // HINT: softmax, O += P V; then write_output.
  static_assert(!Cfg::kGeneral, "v1 runs dense attention only (its K prefetch assumes every tile)");
  constexpr int D = Cfg::kHeadDim;
  const int tid = threadIdx.x;
  const SmemTiles<Cfg> smem(smem_raw);
  const Element* q_head = static_cast<const Element*>(p.q) + w.batch * p.q_batch_stride + w.head * p.q_head_stride;
  const Element* k_head = static_cast<const Element*>(p.k) + w.batch * p.k_batch_stride + w.kv_head * p.k_head_stride;
  const Element* v_head = static_cast<const Element*>(p.v) + w.batch * p.v_batch_stride + w.kv_head * p.v_head_stride;

  // Prologue: Q and the first (highest) K tile in flight.
  load_tile_cp_async<D, Cfg::kBlockM, 128>(smem.q, q_head, p.q, p.q_row_stride, w.m_start, p.seq_q,
                                           p.head_dim, tid);
  mma_attn::cp_async_commit();
  if (w.n_tiles > 0)
    load_tile_cp_async<D, Cfg::kBlockN, 128>(smem.k, k_head, p.k, p.k_row_stride,
                                             w.n_block(0) * Cfg::kBlockN, p.seq_k, p.head_dim, tid);
  mma_attn::cp_async_commit();

  RowState<Cfg> st;
  init_row_state(st);
  const attn::KeyMask<Cfg::kGeneral> mask(p.mask, w.batch, w.head);
  const int row0 = w.m_start + 16 * (tid >> 5) + ((tid & 31) >> 2);  // this thread's row g
  const int col_in_tile = 2 * (tid & 3);

  for (int j = 0; j < w.n_tiles; ++j) {
    const int n_block = w.n_block(j);
    // K[n_block] (and Q) landed for every thread, and everyone is done with V[n_block + 1].
    mma_attn::cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    load_tile_cp_async<D, Cfg::kBlockN, 128>(smem.v, v_head, p.v, p.v_row_stride, n_block * Cfg::kBlockN,
                                             p.seq_k, p.head_dim, mma_attn::thread_index_fresh());
    mma_attn::cp_async_commit();

    float s[Cfg::kBlockN / 2];
    compute_scores<Element, Cfg>(s, smem.q, smem.k);
    prepare_scores<Cfg>(s, p, w, mask, n_block, kTileVisible, row0, col_in_tile);

    // V[n_block] landed, and everyone is done with K[n_block]: K[n_block - 1] loads during
    // the softmax and P V.
    mma_attn::cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (n_block > w.n_first)
      load_tile_cp_async<D, Cfg::kBlockN, 128>(smem.k, k_head, p.k, p.k_row_stride,
                                               (n_block - 1) * Cfg::kBlockN, p.seq_k, p.head_dim,
                                               mma_attn::thread_index_fresh());
    mma_attn::cp_async_commit();

    online_softmax_step<Cfg>(s, st, p.scale_log2);
    compute_pv<Element, Cfg>(st, s, smem.v);
  }
  // Without any key tile the Q copies were never waited for: they land before the epilogue
  // overwrites the Q tile.
  mma_attn::cp_async_wait<0>();
  __syncthreads();
  write_output<Element, Cfg>(p, st, smem.q_ptr, 0, w.m_start, w.bh, w.batch, w.head, tid);
  // END SOLUTION
}

// ---- v2: TMA + mbarrier, 2-stage K/V ring, one warpgroup ----
template <typename Element, typename Cfg>
__device__ __forceinline__ void attention_v2(const Params& p, const CtaWork& w, unsigned char* smem_raw,
                                             const CUtensorMap* map_q, const CUtensorMap* map_k,
                                             const CUtensorMap* map_v) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: one thread initialises the mbarriers and issues the TMA copies of Q
  // HINT: and the first kStages K/V tiles; per tile wait on the stage's full barrier (parity (j /
  // HINT: kStages) & 1), compute, and after a CTA barrier refill the stage with tile j + kStages.
  constexpr int kStages = Cfg::kStages;
  const int tid = threadIdx.x;
  const SmemTiles<Cfg> smem(smem_raw);

  if (tid == 0) {
    mbarrier_init(smem.q_full(), 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(smem.k_full(s), 1);
      mbarrier_init(smem.v_full(s), 1);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // One thread fills the ring: Q, then the first kStages K/V tiles. Every thread keeps the
  // cursor of the next tile to load (n_load: the visited tile kStages ahead of the one computed).
  int kind;
  int n_load = visited_tile<Cfg>(w, w.n_block(0), kind);
  if (tid == 0) {
    mbarrier_arrive_expect_tx(smem.q_full(), Cfg::kQBytes);
    load_tile_tma<Cfg::kHeadDim, Cfg::kBlockM>(smem.q, map_q, smem.q_full(), w.m_start,
                                               static_cast<int>(w.head), static_cast<int>(w.batch));
  }
  for (int j = 0; j < kStages && n_load >= w.n_first; ++j) {
    if (tid == 0) {
      issue_kv_tile<Cfg>(smem.k_stage(j), map_k, smem.k_full(j), n_load, w);
      issue_kv_tile<Cfg>(smem.v_stage(j), map_v, smem.v_full(j), n_load, w);
    }
    int ignored;
    n_load = visited_tile<Cfg>(w, n_load - 1, ignored);
  }

  RowState<Cfg> st;
  init_row_state(st);
  const attn::KeyMask<Cfg::kGeneral> mask(p.mask, w.batch, w.head);
  const int row0 = w.m_start + 16 * (tid >> 5) + ((tid & 31) >> 2);
  const int col_in_tile = 2 * (tid & 3);

  mbarrier_wait(smem.q_full(), 0);
  int j = 0;
  for (int n_block = visited_tile<Cfg>(w, w.n_block(0), kind); n_block >= w.n_first;
       n_block = visited_tile<Cfg>(w, n_block - 1, kind), ++j) {
    const int stage = j % kStages;
    // Tile j is the (j / kStages)-th use of its stage: that phase's parity.
    const uint32_t parity = (j / kStages) & 1;
    const bool refill = n_load >= w.n_first;  // a visited tile kStages ahead of this one
    mbarrier_wait(smem.k_full(stage), parity);
    float s[Cfg::kBlockN / 2];
    compute_scores<Element, Cfg>(s, smem.q, smem.k_stage(stage));
    prepare_scores<Cfg>(s, p, w, mask, n_block, kind, row0, col_in_tile);
    // Every warp is done with K[stage]: refill it with the visited tile kStages ahead.
    __syncthreads();
    if (tid == 0 && refill)
      issue_kv_tile<Cfg>(smem.k_stage(stage), map_k, smem.k_full(stage), n_load, w);

    online_softmax_step<Cfg>(s, st, p.scale_log2);
    mbarrier_wait(smem.v_full(stage), parity);
    compute_pv<Element, Cfg>(st, s, smem.v_stage(stage));
    __syncthreads();
    if (refill) {
      if (tid == 0) issue_kv_tile<Cfg>(smem.v_stage(stage), map_v, smem.v_full(stage), n_load, w);
      int ignored;
      n_load = visited_tile<Cfg>(w, n_load - 1, ignored);
    }
  }
  write_output<Element, Cfg>(p, st, smem.q_ptr, 0, w.m_start, w.bh, w.batch, w.head, tid);
  // END SOLUTION
}

// A consumer warp is done reading a K or V stage (its wgmma that read it has completed): one
// lane arrives on the stage's empty barrier, which completes once every consumer warp has.
__device__ __forceinline__ void release_stage(uint32_t empty_bar, int lane) {
  __syncwarp();
  if (lane == 0) mbarrier_arrive(empty_bar);
}

// v7: a consumer thread is done with the work tile's Q and its index in the slot. Every thread
// arrives (q_empty counts 32 per consumer warp), so each read of the slot is ordered before the
// producer's next write by that thread's own release: compute-sanitizer's racecheck follows that,
// and not __syncwarp + one lane's arrive (results/logs/h100_racecheck_v7_pattern_probe.log).
// Once per work tile, so the extra arrivals cost nothing measurable.
__device__ __forceinline__ void release_q(uint32_t q_empty) { mbarrier_arrive(q_empty); }

// ---- v4, v5: one consumer warpgroup's key loop with the softmax overlapping the tensor cores ----
// v3 waits for each wgmma it issues, so a warpgroup's tensor-core work and its softmax never
// overlap. Here (FlashAttention-3's intra-warpgroup overlap) an iteration issues S[j] = Q K[j]^T
// and then O += P[j-1] V[j-1], waits only for S[j] (wgmma_wait<1>: the older group), and runs
// the softmax of tile j while the P V product is still running; then it waits for that, scales
// O by the new correction and packs P[j]. The price: P[j-1]'s fragments and S[j] are live at
// once (32 + 64 registers beside O). v5 adds the turns (FlashAttention-3's ping-pong): the
// consumers issue their wgmma in turn, so one's softmax runs while another's products occupy
// the tensor cores. The last consumer hands consumer 0 the first turn, and skips its last
// hand-over, so that every named barrier ends with as many arrivals as waits. v6 is v5 with
// three consumers (head_dim 64). With Tile::kRescaleOEarly (v4 on head_dim 256's 80-key tile)
// O is scaled by tile j-1's correction between the issues of S[j] and P[j-1] V[j-1] instead
// of after the wait for P[j-2] V[j-2]: the same products, in the same order. v7 calls it once per work tile: j0 is the key tiles the CTA
// visited before (the ring's stages and parities go on from there), `visited` gets this
// tile's count, and each thread arrives on q_empty (when not 0) once its last S = Q K^T is in.

// The turns of v5/v6 (Tile::kPingPong; v4 has none): wait for this consumer's, and hand it on
// after an issue point, but the last consumer's last one (see above).
template <typename Cfg>
__device__ __forceinline__ void take_turn(int consumer) {
  if constexpr (Cfg::kPingPong) wait_for_turn(consumer);
}
template <typename Cfg>
__device__ __forceinline__ void end_turn(int consumer, bool last) {
  if constexpr (Cfg::kPingPong) {
    if (consumer != Cfg::kConsumers - 1 || !last) pass_turn<Cfg::kConsumers>(consumer);
  }
}

// The K/V ring position of the t-th key tile a CTA visits (t counts over v7's work tiles too):
// its stage, and the parity of that stage's phase.
template <typename Cfg>
__device__ __forceinline__ int ring_stage(int t) { return t % Cfg::kStages; }
template <typename Cfg>
__device__ __forceinline__ uint32_t ring_parity(int t) { return static_cast<uint32_t>((t / Cfg::kStages) & 1); }

// What the overlapped loop does to one key tile's scores before its softmax:
//   kAnyTile      decides per tile (the mask where CtaWork::needs_mask says, a mask tensor's
//                 elements where the summary calls the tile partial): the loop with a summary,
//                 and the dense kernels;
//   kVisibleTile  every row sees the whole tile: nothing but the softcap;
//   kUpperCutTile, kLowerCutTile, kBothCutTile  (Tile::kEdgeMasks) the interval cuts the tile
//                 at the top, at the bottom, or both: mask_edges with those ends, no test.
enum TilePath : int { kAnyTile = 0, kVisibleTile = 2, kUpperCutTile = 3, kLowerCutTile = 4, kBothCutTile = 5 };

// The consumer's state that goes from one key tile to the next in the overlapped loop.
template <typename Cfg>
struct OverlapCarry {
  float s[Cfg::kBlockN / 2];  // S[j], then P[j] in fp32
  PFragments<Cfg> a;          // P[j-1], the register A operand of P V
  float correction[2];        // the last softmax step's factors of O's rows
};

// One key tile j >= 1 of the overlapped loop (the t-th the CTA visits, t = j0 + j; key tile
// n_block, its summary `kind`): S[j] and P[j-1] V[j-1] issued on the consumer's turn, S[j]'s
// mask (kPath) and softmax while P V runs, then O rescaled and P[j] packed. kAnyTile also looks
// the next visited tile up while the tensor cores run (next, next_kind).
template <typename Element, typename Cfg, int kPath>
__device__ __forceinline__ void overlapped_tile(const Params& p, const CtaWork& w, const SmemTiles<Cfg>& smem,
                                                RowState<Cfg>& st, OverlapCarry<Cfg>& c,
                                                const attn::KeyMask<Cfg::kGeneral>& mask, const RowEdges& edges,
                                                uint32_t q_rows, int row0, int col_in_tile, int consumer, int lane,
                                                int t, int n_block, int kind, int& next, int& next_kind) {
  // BEGIN SOLUTION kernel
  // HINT: Wait K[t] and V[t-1], on the turn issue S[t] and O += P[t-1] V[t-1], wgmma_wait<1>,
  // HINT: release K, mask (kPath) + softmax_update, wgmma_wait<0>, release V, rescale_o, pack P.
  mbarrier_wait(smem.k_full(ring_stage<Cfg>(t)), ring_parity<Cfg>(t));
  mbarrier_wait(smem.v_full(ring_stage<Cfg>(t - 1)), ring_parity<Cfg>(t - 1));
  take_turn<Cfg>(consumer);
  issue_scores<Element, Cfg>(c.s, q_rows, smem.k_stage(ring_stage<Cfg>(t)));
  if constexpr (Cfg::kRescaleOEarly) rescale_o_during_scores<Cfg>(st, c.correction);
  issue_pv<Element, Cfg>(st, c.a, smem.v_stage(ring_stage<Cfg>(t - 1)));
  end_turn<Cfg>(consumer, false);
  if constexpr (kPath == kAnyTile) next = visited_tile<Cfg>(w, n_block - 1, next_kind);
  wgmma_wait<1>();  // S[j] is in; P[j-1] V[j-1] may still run
  fence_registers(c.s);
  release_stage(smem.k_empty(ring_stage<Cfg>(t)), lane);
  if (kPath == kAnyTile && kind == kTilePartial) {
    // A tile that reads the mask tensor element by element waits for P[j-1] V[j-1] first:
    // P's fragments are then free for the mask's loads (overlapping both, v5's consumers
    // spilled, ptxas said). Only the tiles the summary calls partial pay this.
    wgmma_wait<0>();
    fence_registers(st.o);
    fence_registers(c.a);
    release_stage(smem.v_empty(ring_stage<Cfg>(t - 1)), lane);
    prepare_scores<Cfg>(c.s, p, w, mask, n_block, kind, row0, col_in_tile);
    softmax_update<Cfg>(c.s, st, p.scale_log2, c.correction);
  } else {
    if constexpr (kPath == kAnyTile) {
      prepare_scores<Cfg>(c.s, p, w, mask, n_block, kind, row0, col_in_tile);
    } else {
      softcap_scores<Cfg>(c.s, p);
      if constexpr (kPath == kUpperCutTile) mask_edges<Cfg, kUpperEdge>(c.s, edges, n_block);
      if constexpr (kPath == kLowerCutTile) mask_edges<Cfg, kLowerEdge>(c.s, edges, n_block);
      if constexpr (kPath == kBothCutTile) mask_edges<Cfg, kBothEdges>(c.s, edges, n_block);
    }
    softmax_update<Cfg>(c.s, st, p.scale_log2, c.correction);
    wgmma_wait<0>();  // O is written and P[j-1]'s fragments are read
    fence_registers(st.o);
    fence_registers(c.a);
    release_stage(smem.v_empty(ring_stage<Cfg>(t - 1)), lane);
  }
  if constexpr (!Cfg::kRescaleOEarly) rescale_o<Cfg>(st, c.correction);
  pack_p<Element, Cfg>(c.a, c.s);
  // END SOLUTION
}

template <typename Element, typename Cfg>
__device__ __forceinline__ void consume_overlapped(const Params& p, const CtaWork& w,
                                                   const SmemTiles<Cfg>& smem, RowState<Cfg>& st,
                                                   const attn::KeyMask<Cfg::kGeneral>& mask, uint32_t q_rows,
                                                   int row0, int col_in_tile, int consumer, int lane,
                                                   int j0, int& visited, uint32_t q_empty) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: tile 0: S, softmax, pack P. Then per tile j >= 1 (overlapped_tile):
  // HINT: wait K[j] and V[j-1], issue S[j] and O += P[j-1] V[j-1], wgmma_wait<1>, release K[j], mask +
  // HINT: softmax_update, wgmma_wait<0>, release V[j-1], rescale_o, pack P[j]; without a mask tensor
  // HINT: the cut tiles and the wholly visible ones in loops of their own (kVisibleTile, and each
  // HINT: cut loop on the ends that cut its tiles: kUpperCutTile etc., row_edges, mask_edges).
  // HINT: Last: O += P V of the last tile.
  // HINT: Tile j uses stage (j0 + j) % kStages, parity ((j0 + j) / kStages) & 1; set `visited`
  // HINT: and release q_empty (when not 0) once the last S is in, and when no tile is visited.
  // The visited key tiles, highest first (visited_tile): j counts them, n_block is the j-th.
  int kind;
  int n_block = visited_tile<Cfg>(w, w.n_block(0), kind);
  visited = 0;
  if (n_block < w.n_first) {  // no key tile: zeros (uniform over the CTA)
    if (q_empty != 0) release_q(q_empty);
    return;
  }
  if constexpr (Cfg::kPingPong) {
    if (consumer == Cfg::kConsumers - 1) pass_turn<Cfg::kConsumers>(consumer);  // consumer 0 starts
  }

  // The rows' ends for the cut tiles' one-sided masks (Tile::kEdgeMasks; the loop without a
  // mask tensor), computed while the first K tile lands.
  RowEdges edges{};
  if constexpr (Cfg::kEdgeMasks) edges = row_edges<Cfg>(mask, w, row0, col_in_tile);

  OverlapCarry<Cfg> c;
  // Tile 0 (the highest key block): scores, mask, softmax; O is still zero.
  mbarrier_wait(smem.k_full(ring_stage<Cfg>(j0)), ring_parity<Cfg>(j0));
  take_turn<Cfg>(consumer);
  issue_scores<Element, Cfg>(c.s, q_rows, smem.k_stage(ring_stage<Cfg>(j0)));
  end_turn<Cfg>(consumer, false);
  // The next visited tile is looked up while the tensor cores run (the summary's bytes).
  int next_kind;
  int next = visited_tile<Cfg>(w, n_block - 1, next_kind);
  wgmma_wait<0>();
  fence_registers(c.s);
  release_stage(smem.k_empty(ring_stage<Cfg>(j0)), lane);
  if (Cfg::kEdgeMasks && w.summary == nullptr) {
    softcap_scores<Cfg>(c.s, p);
    mask_tile_edges<Cfg>(c.s, w, edges, n_block);
  } else {
    prepare_scores<Cfg>(c.s, p, w, mask, n_block, kind, row0, col_in_tile);
  }
  softmax_update<Cfg>(c.s, st, p.scale_log2, c.correction);
  pack_p<Element, Cfg>(c.a, c.s);

  int j = 1;
  if (Cfg::kSplitKeyLoop && w.summary == nullptr) {
    // Without a mask tensor the tiles are n_block - 1 down to n_first, and those the interval
    // cuts lie at its two ends (the causal diagonal or a window's upper edge; a window's lower
    // edge or left padding's first key): three loops, in the order the tiles come, the middle
    // one over the tiles every row sees whole. A tile is cut where CtaWork::needs_mask says
    // (n >= unmasked_end or n < unmasked_begin), so the middle is empty when unmasked_end <=
    // unmasked_begin. The tiles at the top are cut by the upper ends alone (n >= unmasked_begin),
    // and those at the bottom by the lower ends alone where n < unmasked_end; the bottom tiles in
    // [unmasked_end, unmasked_begin) (the middle is empty then) by both (mask_edges' note).
    const int cut_above = max(max(w.unmasked_end, w.unmasked_begin), w.n_first);
    const int visible_from = max(w.unmasked_begin, w.n_first);
    int n = next;
    for (; n >= cut_above; --n, ++j)
      overlapped_tile<Element, Cfg, kUpperCutTile>(p, w, smem, st, c, mask, edges, q_rows, row0, col_in_tile,
                                                   consumer, lane, j0 + j, n, kTileVisible, next, next_kind);
    for (; n >= visible_from; --n, ++j)
      overlapped_tile<Element, Cfg, kVisibleTile>(p, w, smem, st, c, mask, edges, q_rows, row0, col_in_tile,
                                                  consumer, lane, j0 + j, n, kTileVisible, next, next_kind);
    for (const int cut_both_from = max(w.unmasked_end, w.n_first); n >= cut_both_from; --n, ++j)
      overlapped_tile<Element, Cfg, kBothCutTile>(p, w, smem, st, c, mask, edges, q_rows, row0, col_in_tile,
                                                  consumer, lane, j0 + j, n, kTileVisible, next, next_kind);
    for (; n >= w.n_first; --n, ++j)
      overlapped_tile<Element, Cfg, kLowerCutTile>(p, w, smem, st, c, mask, edges, q_rows, row0, col_in_tile,
                                                   consumer, lane, j0 + j, n, kTileVisible, next, next_kind);
  } else {
    for (; next >= w.n_first; ++j) {
      n_block = next;
      kind = next_kind;
      overlapped_tile<Element, Cfg, kAnyTile>(p, w, smem, st, c, mask, edges, q_rows, row0, col_in_tile,
                                              consumer, lane, j0 + j, n_block, kind, next, next_kind);
    }
  }
  // Q is read no more (the last S is in): v7's producer may load the next tile's.
  if (q_empty != 0) release_q(q_empty);
  visited = j;
  // The last tile's P V (tile j - 1: j tiles were visited).
  mbarrier_wait(smem.v_full(ring_stage<Cfg>(j0 + j - 1)), ring_parity<Cfg>(j0 + j - 1));
  take_turn<Cfg>(consumer);
  if constexpr (Cfg::kRescaleOEarly) rescale_o<Cfg>(st, c.correction);
  issue_pv<Element, Cfg>(st, c.a, smem.v_stage(ring_stage<Cfg>(j0 + j - 1)));
  end_turn<Cfg>(consumer, true);
  wgmma_wait<0>();
  fence_registers(st.o);
  fence_registers(c.a);
  release_stage(smem.v_empty(ring_stage<Cfg>(j0 + j - 1)), lane);
  // END SOLUTION
}

// ---- v3: warp specialization: 1 producer warpgroup (TMA), 2 consumer warpgroups ----
template <typename Element, typename Cfg>
__device__ __forceinline__ void attention_v3(const Params& p, const CtaWork& work, unsigned char* smem_raw,
                                             const CUtensorMap* map_q, const CUtensorMap* map_k,
                                             const CUtensorMap* map_v) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: mbarriers as in v2 plus empty barriers; warpgroup 0 (setmaxnreg.dec)
  // HINT: has one thread issue every copy after waiting for the stage's release, warpgroups 1 and
  // HINT: 2 (setmaxnreg.inc) compute 64 rows each and release each stage with one arrive per warp.
  constexpr int kStages = Cfg::kStages;
  constexpr int kConsumerWarps = 4 * Cfg::kConsumers;
  const int tid = threadIdx.x;
  // The warpgroup index, made visibly warp-uniform (a shuffle from lane 0) so the compiler
  // keeps the role branch uniform.
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
  const CtaWork w = work;  // the kernel's
  const SmemTiles<Cfg> smem(smem_raw);

  if (tid == 0) {
    mbarrier_init(smem.q_full(), 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(smem.k_full(s), 1);
      mbarrier_init(smem.v_full(s), 1);
      // Released by one lane of every consumer warp once its wgmma reading the stage is done.
      mbarrier_init(smem.k_empty(s), kConsumerWarps);
      mbarrier_init(smem.v_empty(s), kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();  // the last CTA-wide barrier: the roles never wait for each other again

  if (warpgroup == 0) {
    // ---- producer: gives its registers away, one thread issues every copy ----
    setmaxnreg_dec<Cfg::kProducerRegisters>();
    if (tid == 0) {
      mbarrier_arrive_expect_tx(smem.q_full(), Cfg::kQBytes);
      load_tile_tma<Cfg::kHeadDim, Cfg::kBlockM>(smem.q, map_q, smem.q_full(), w.m_start,
                                                 static_cast<int>(w.head), static_cast<int>(w.batch));
      // The consumers' list of tiles (visited_tile), j counting them.
      int kind, j = 0;
      for (int n_block = visited_tile<Cfg>(w, w.n_block(0), kind); n_block >= w.n_first;
           n_block = visited_tile<Cfg>(w, n_block - 1, kind), ++j) {
        const int stage = j % kStages;
        // Tile j reuses the stage of tile j - kStages: wait until the consumers released it,
        // the (j / kStages - 1)-th completion of the stage's empty barrier.
        const uint32_t parity = ((j / kStages) - 1) & 1;
        if (j >= kStages) mbarrier_wait(smem.k_empty(stage), parity);
        issue_kv_tile<Cfg>(smem.k_stage(stage), map_k, smem.k_full(stage), n_block, w);
        if (j >= kStages) mbarrier_wait(smem.v_empty(stage), parity);
        issue_kv_tile<Cfg>(smem.v_stage(stage), map_v, smem.v_full(stage), n_block, w);
      }
    }
  } else {
    // ---- consumers: 64 query rows each ----
    setmaxnreg_inc<Cfg::kConsumerRegisters>();
    const int consumer = warpgroup - 1;
    const int thread_in_wg = tid - 128 * warpgroup;
    const int lane = tid & 31;
    RowState<Cfg> st;
    init_row_state(st);
    const attn::KeyMask<Cfg::kGeneral> mask(p.mask, w.batch, w.head);
    const int row0 = w.m_start + 64 * consumer + 16 * (thread_in_wg >> 5) + (lane >> 2);
    const int col_in_tile = 2 * (lane & 3);
    const uint32_t q_rows = smem.q + consumer * 64 * 128;  // this warpgroup's rows of each column block

    mbarrier_wait(smem.q_full(), 0);
    if constexpr (Cfg::kIntraOverlap) {
      int visited = 0;
      consume_overlapped<Element, Cfg>(p, w, smem, st, mask, q_rows, row0, col_in_tile, consumer, lane,
                                       0, visited, 0);
    } else {
      int kind, j = 0;
      for (int n_block = visited_tile<Cfg>(w, w.n_block(0), kind); n_block >= w.n_first;
           n_block = visited_tile<Cfg>(w, n_block - 1, kind), ++j) {
        const int stage = j % kStages;
        const uint32_t parity = (j / kStages) & 1;
        mbarrier_wait(smem.k_full(stage), parity);
        float s[Cfg::kBlockN / 2];
        compute_scores<Element, Cfg>(s, q_rows, smem.k_stage(stage));
        release_stage(smem.k_empty(stage), lane);
        prepare_scores<Cfg>(s, p, w, mask, n_block, kind, row0, col_in_tile);
        online_softmax_step<Cfg>(s, st, p.scale_log2);
        mbarrier_wait(smem.v_full(stage), parity);
        compute_pv<Element, Cfg>(st, s, smem.v_stage(stage));
        release_stage(smem.v_empty(stage), lane);
      }
    }
    write_output<Element, Cfg>(p, st, smem.q_ptr, consumer, w.m_start, w.bh, w.batch, w.head,
                               thread_in_wg);
  }
  // END SOLUTION
}

// The general v7's producer thread (Tile::kVariantSchedule): v7's, with the work tiles from the
// schedule (scheduled_tile), each one's CtaWork handed to the consumers in the WorkSlot (int
// indices: it runs at 24 registers).
template <typename Cfg>
__device__ __forceinline__ void produce_scheduled(const Params& p, const SmemTiles<Cfg>& smem,
                                                  const VariantSchedule& sched, const CUtensorMap* map_q,
                                                  const CUtensorMap* map_k, const CUtensorMap* map_v) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: v7's producer loop, the tile's CtaWork (scheduled_tile, cta_work_at) written to
  // HINT: the WorkSlot (state kWorkCompute / kWorkZeros / kWorkEnd) before q_full's arrival.
  constexpr int kStages = Cfg::kStages;
  WorkSlot* slot = smem.work_slot();
  // (What the loop reads again from shared memory instead of keeping in registers.)
  const volatile WorkSlot* held = slot;
  const volatile int* scheduled = &sched.tile_prefix[sched.batches];
  int j = 0;     // key tiles loaded so far, over every work tile
  int rank = 0;  // the schedule's batch rank of the last tile
  int tile = blockIdx.x;
  for (int i = 0;; ++i) {
    // The consumers are done with the previous tile's Q and have read its slot.
    if (i > 0) mbarrier_wait(smem.q_empty(), static_cast<uint32_t>((i - 1) & 1));
    if (tile >= *scheduled) {  // no work left: wake the consumers to read that and stop
      slot->state = kWorkEnd;
      mbarrier_arrive(smem.q_full());
      break;
    }
    {
      // The CtaWork field by field (volatile: each value's register is free once stored, where a
      // struct copy held all 18 until one vector store), the tile's indices first.
      const int3 at = scheduled_tile(p, sched, tile, rank);
      volatile CtaWork& out = slot->work;
      out.bh = static_cast<int64_t>(at.y) * p.heads + at.z;
      out.batch = at.y;
      out.head = at.z;
      out.kv_head = at.z / p.kv_group;
      out.summary = nullptr;
      const CtaWork w = cta_work_at<Cfg>(p, at.x, static_cast<int64_t>(at.y) * p.heads + at.z, at.y, at.z,
                                         at.z / p.kv_group, &sched);
      out.key_base = w.key_base;
      out.m_start = w.m_start;
      out.n_first = w.n_first;
      out.n_tiles = w.n_tiles;
      out.unmasked_begin = w.unmasked_begin;
      out.unmasked_end = w.unmasked_end;
      out.zero_end = w.zero_end;
      out.computes = w.computes;
      slot->state = w.computes ? kWorkCompute : kWorkZeros;
    }
    // The tile's loads, its CtaWork read back from the slot (the producer's 24 registers).
    const bool computes = held->work.computes;
    const int batch = static_cast<int>(held->work.batch);
    if (computes) {
      mbarrier_arrive_expect_tx(smem.q_full(), Cfg::kQBytes);
      load_tile_tma<Cfg::kHeadDim, Cfg::kBlockM>(smem.q, map_q, smem.q_full(), held->work.m_start,
                                                 static_cast<int>(held->work.head), batch);
    } else {  // no key (not expected of the aligned tiling's work tiles): the consumers write zeros
      mbarrier_arrive(smem.q_full());
    }
    // The next tile is claimed now; the atomic's round trip overlaps this tile's loads. (gridDim.x
    // read here, by an asm the compiler cannot hoist: held through the loop, ptxas spilled it.)
    uint32_t ctas;
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(ctas));
    const int next = atomicAdd(p.tile_counter, 1) + static_cast<int>(ctas);
    const int n_first = held->work.n_first;
    const int key_base = held->work.key_base;
    const int kv_head = static_cast<int>(held->work.kv_head);
    for (int n_block = computes ? n_first + held->work.n_tiles - 1 : -1; n_block >= n_first; --n_block, ++j) {
      const int stage = j % kStages;
      const uint32_t parity = ((j / kStages) - 1) & 1;
      const int key = key_base + n_block * Cfg::kBlockN;  // first_key
      if (j >= kStages) mbarrier_wait(smem.k_empty(stage), parity);
      mbarrier_arrive_expect_tx(smem.k_full(stage), Cfg::kKVBytes);  // issue_kv_tile's
      load_tile_tma<Cfg::kHeadDim, Cfg::kBlockN>(smem.k_stage(stage), map_k, smem.k_full(stage), key, kv_head, batch);
      if (j >= kStages) mbarrier_wait(smem.v_empty(stage), parity);
      mbarrier_arrive_expect_tx(smem.v_full(stage), Cfg::kKVBytes);
      load_tile_tma<Cfg::kHeadDim, Cfg::kBlockN>(smem.v_stage(stage), map_v, smem.v_full(stage), key, kv_head, batch);
    }
    tile = next;
  }
  // END SOLUTION
}

// ---- v7: v5 persistent: one CTA per SM walks the work tiles ----
// v1-v6 launch one CTA per (query tile, head): it starts by loading its Q and first K/V tiles
// and ends writing O, and while it does either, the SM's tensor cores wait (at S 1024 a CTA
// visits only 8 key tiles, so that start and end are a large part of its time). v7's CTAs stay
// resident and take the work tiles in turn (work_tile): the producer loads the next tile's Q
// as soon as both consumers' last S = Q K^T is in (q_empty), and the next K/V tiles as stages
// free up, so they arrive during this tile's last P V and its epilogue; O is staged in a buffer
// of its own (the next Q lands in Q's). The consumers' key loop is v5's (consume_overlapped),
// the ring's stage and parity counters running on across tiles (j0).
// The general v7 (Tile::kVariantSchedule: key lengths, windows, sinks) takes its work tiles from
// the schedule every CTA builds at its start (VariantSchedule: the aligned tiling's computing
// tiles, longest batch first); the producer computes each one's CtaWork and hands it over in the
// WorkSlot, and the producer warpgroup's three idle warps write the rows that see no key.
template <typename Element, typename Cfg>
__device__ __forceinline__ void attention_v7(const Params& p, unsigned char* smem_raw,
                                             const CUtensorMap* map_q, const CUtensorMap* map_k,
                                             const CUtensorMap* map_v) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: v5's roles in a loop over work tiles (work_tile): blockIdx.x first,
  // HINT: then atomicAdd(p.tile_counter, 1) + gridDim.x. Producer: before tile i's Q, wait q_empty's
  // HINT: (i-1)-th completion and write the tile's index to work_tile_slot (past the last: plain
  // HINT: arrive on q_full, stop); count K/V tiles across work tiles. Consumers: wait q_full's i-th
  // HINT: completion, read the slot, consume_overlapped with j0 and q_empty, write_output to o_ptr.
  // HINT: The general v7: build_variant_schedule first; the producer (produce_scheduled) hands over a
  // HINT: CtaWork in the WorkSlot (zeros: the consumers write them), warps 1-3 write_zero_chunks.
  constexpr int kStages = Cfg::kStages;
  constexpr int kConsumerWarps = 4 * Cfg::kConsumers;
  const int tid = threadIdx.x;
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
  const SmemTiles<Cfg> smem(smem_raw);
  const int64_t tiles = work_tiles<Cfg>(p);

  if (tid == 0) {
    mbarrier_init(smem.q_full(), 1);
    mbarrier_init(smem.q_empty(), 32 * kConsumerWarps);  // release_q: every consumer thread
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(smem.k_full(s), 1);
      mbarrier_init(smem.v_full(s), 1);
      mbarrier_init(smem.k_empty(s), kConsumerWarps);
      mbarrier_init(smem.v_empty(s), kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  // The general v7's schedule, in shared memory (closed by the barrier below).
  const VariantSchedule& sched = *smem.schedule();
  if constexpr (Cfg::kVariantSchedule) build_variant_schedule<Cfg>(p, *smem.schedule(), tid);
  __syncthreads();

  if (warpgroup == 0) {
    setmaxnreg_dec<Cfg::kProducerRegisters>();
    if constexpr (Cfg::kVariantSchedule) {
      if (tid == 0) produce_scheduled<Cfg>(p, smem, sched, map_q, map_k, map_v);
      // The producer warpgroup's other three warps: the rows that see no key.
      else if (tid >= 32) write_zero_chunks<Element, Cfg, 96>(p, sched, tid - 32);
    } else if (tid == 0) {
      int j = 0;  // key tiles loaded so far, over every work tile
      int64_t tile = blockIdx.x;
      for (int i = 0;; ++i) {
        // The consumers are done with the previous tile's Q and have read its index.
        if (i > 0) mbarrier_wait(smem.q_empty(), static_cast<uint32_t>((i - 1) & 1));
        *smem.work_tile_slot() = tile;
        if (tile >= tiles) {  // no work left: wake the consumers to read that and stop
          mbarrier_arrive(smem.q_full());
          break;
        }
        const CtaWork w = work_tile<Cfg>(p, tile);
        mbarrier_arrive_expect_tx(smem.q_full(), Cfg::kQBytes);
        load_tile_tma<Cfg::kHeadDim, Cfg::kBlockM>(smem.q, map_q, smem.q_full(), w.m_start,
                                                   static_cast<int>(w.head), static_cast<int>(w.batch));
        // The next tile is claimed now; the atomic's round trip overlaps this tile's loads.
        const int64_t next = atomicAdd(p.tile_counter, 1) + static_cast<int64_t>(gridDim.x);
        int kind;
        for (int n_block = visited_tile<Cfg>(w, w.n_block(0), kind); n_block >= w.n_first;
             n_block = visited_tile<Cfg>(w, n_block - 1, kind), ++j) {
          const int stage = j % kStages;
          const uint32_t parity = ((j / kStages) - 1) & 1;
          if (j >= kStages) mbarrier_wait(smem.k_empty(stage), parity);
          issue_kv_tile<Cfg>(smem.k_stage(stage), map_k, smem.k_full(stage), n_block, w);
          if (j >= kStages) mbarrier_wait(smem.v_empty(stage), parity);
          issue_kv_tile<Cfg>(smem.v_stage(stage), map_v, smem.v_full(stage), n_block, w);
        }
        tile = next;
      }
    }
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegisters>();
    const int consumer = warpgroup - 1;
    const int thread_in_wg = tid - 128 * warpgroup;
    const int lane = tid & 31;
    const uint32_t q_rows = smem.q + consumer * 64 * 128;
    int j0 = 0;  // key tiles visited so far, over every work tile
    for (int i = 0;; ++i) {
      mbarrier_wait(smem.q_full(), static_cast<uint32_t>(i & 1));
      CtaWork w;
      if constexpr (Cfg::kVariantSchedule) {
        const WorkSlot* slot = smem.work_slot();
        const int state = slot->state;
        if (state == kWorkEnd) break;
        w = slot->work;
        if (state == kWorkZeros) {
          write_zero_rows<Element>(p, w, tid - 128, 128 * Cfg::kConsumers);
          release_q(smem.q_empty());
          continue;
        }
      } else {
        const int64_t tile = *smem.work_tile_slot();
        if (tile >= tiles) break;
        w = work_tile<Cfg>(p, tile);
      }
      RowState<Cfg> st;
      init_row_state(st);
      const attn::KeyMask<Cfg::kGeneral> mask(p.mask, w.batch, w.head);
      const int row0 = w.m_start + 64 * consumer + 16 * (thread_in_wg >> 5) + (lane >> 2);
      const int col_in_tile = 2 * (lane & 3);
      int visited = 0;
      consume_overlapped<Element, Cfg>(p, w, smem, st, mask, q_rows, row0, col_in_tile, consumer, lane,
                                       j0, visited, smem.q_empty());
      write_output<Element, Cfg>(p, st, smem.o_ptr, consumer, w.m_start, w.bh, w.batch, w.head,
                                 thread_in_wg);
      j0 += visited;
    }
  }
  // END SOLUTION
}

template <typename Element, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    flash_attention_hopper_kernel(const Params p, const __grid_constant__ CUtensorMap map_q,
                                  const __grid_constant__ CUtensorMap map_k,
                                  const __grid_constant__ CUtensorMap map_v) {
#if HOPPER_ATTN_SM90A
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // batch * heads above 65535 spill into gridDim.z, which can overshoot: whole CTA, before any
  // barrier.
  if (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y >= p.batch_heads) return;
  if constexpr (Cfg::kPersistent) {
    attention_v7<Element, Cfg>(p, smem_raw, &map_q, &map_k, &map_v);
  } else {
    // The CTA's work, computed once here for the version (its start, until the producer's
    // first copy, is time the SM's tensor cores wait; computed again by the version, as
    // before, the general kernel's ran twice: the compiler did not merge them).
    const CtaWork w = cta_work<Cfg>(p);
    if constexpr (Cfg::kGeneral) {
      // A variant's query tile whose rows see no key (a padded sequence's first rows, the spare
      // CTAs of the aligned tiling) is decided here, before any barrier, copy or setmaxnreg: it
      // writes its zeros and the whole CTA returns.
      if (!w.computes) {
        write_zero_rows<Element, Cfg>(p, w);
        return;
      }
    }
    if constexpr (Cfg::kVersion == 1) {
      attention_v1<Element, Cfg>(p, w, smem_raw);
    } else if constexpr (Cfg::kVersion == 2) {
      attention_v2<Element, Cfg>(p, w, smem_raw, &map_q, &map_k, &map_v);
    } else {  // v3, v4, v5: the same roles, v4 and v5 differ in the consumers' key loop
      attention_v3<Element, Cfg>(p, w, smem_raw, &map_q, &map_k, &map_v);
    }
  }
#else
  // Not built for sm_90a (no wgmma): the host never launches this.
  __trap();
#endif
}

// ---- the mask tensor's per-tile summary (TileKind, beside Params, says what it holds) ----
// One CTA of 256 threads per block of kRows query rows x 128 keys (a grid-stride loop over the
// blocks of every mask batch and head): thread t reads key column t % 128 of rows t / 128,
// t / 128 + 2, ... (a warp reads 32 consecutive elements of a row when the keys are
// contiguous), and the CTA ORs what its threads saw. It reads the mask once, a cost well under
// the attention's (an [8192, 8192] bool mask is 64 MiB).
template <int kMaskKind>
__global__ void __launch_bounds__(256)
    tile_summary_kernel(const attn::MaskParams m, uint8_t* out, int64_t mask_heads, int q_tiles,
                        int k_tiles, int rows, int64_t blocks) {
  constexpr int kCols = kSummaryKeys;
  static_assert(kCols == Tile<64, 2>::kBlockN && kCols % Tile<256, 5>::kBlockN == 0,
                "a kernel's key tile is a summary block or lies inside one");
  const int elem = kMaskKind == attn::kBoolMask ? 1 : (kMaskKind == attn::kFloat32Mask ? 4 : 2);
  const int col = threadIdx.x % kCols;
  const int row_lane = threadIdx.x / kCols;
  for (int64_t idx = blockIdx.x; idx < blocks; idx += gridDim.x) {
    const int kt = static_cast<int>(idx % k_tiles);
    int64_t rest = idx / k_tiles;
    const int qt = static_cast<int>(rest % q_tiles);
    rest /= q_tiles;
    const int64_t mh = rest % mask_heads, mb = rest / mask_heads;
    const char* head = static_cast<const char*>(m.mask) + (mb * m.mask_stride_b + mh * m.mask_stride_h) * elem;
    const int q_end = min(qt * rows + rows, m.seq_q);
    const int key = kt * kCols + col;
    bool visible = false, other = false;  // some element keeps its key / drops it or has a bias
    if (key < m.seq_k) {
      const int64_t key_offset = static_cast<int64_t>(key) * m.mask_stride_k;
#pragma unroll 8
      for (int q = qt * rows + row_lane; q < q_end; q += 256 / kCols) {
        const float value = attn::mask_value(head, kMaskKind, q * m.mask_stride_q + key_offset);
        visible |= value != -INFINITY;  // NaN too: it reaches the elementwise path (kTilePartial)
        other |= value != 0.f;
      }
    }
    const bool any_visible = __syncthreads_or(visible);
    const bool any_other = __syncthreads_or(other);
    if (threadIdx.x == 0) out[idx] = !any_visible ? kTileEmpty : (any_other ? kTilePartial : kTileVisible);
  }
}


// ---------------------------------------------------------------------------------------
// Which instantiation runs a call, and its launch
// ---------------------------------------------------------------------------------------
// The host entry (flash_attention_hopper.cu, with torch) builds the tensor maps, a mask
// tensor's summary and the grid from an instantiation's tile shape, and launches it through
// a Launcher: what the host needs of one instantiation. The instantiations themselves are
// compiled in flash_attention_hopper_fp16.cu and flash_attention_hopper_bf16.cu (the extern
// declarations at the end of this file), each exactly once.
struct Launcher {
  int block_m = 0;           // Cfg::kBlockM: query rows per CTA (Q's TMA box, the grid)
  int block_n = 0;           // Cfg::kBlockN: keys per tile (K's and V's TMA boxes)
  bool tma = false;          // Cfg::kTma: the kernel reads tensor maps
  bool mask_tensor = false;  // Cfg::kMaskTensor: a mask tensor reaches it with its summary
  bool persistent = false;   // Cfg::kPersistent: one CTA per SM and a zeroed tile counter
  bool align_variants = false;  // Cfg::kAlignVariants: may tile a variant aligned (VariantTiling)
  // What cudaFuncSetAttribute said to the kernel's opt-in to Cfg::kSmemBytes of dynamic
  // shared memory (asked once per process and instantiation).
  cudaError_t configured = cudaSuccess;
  // The launch: flash_attention_hopper_kernel<Element, Cfg> on `grid`, Cfg::kThreads threads
  // and Cfg::kSmemBytes of dynamic shared memory.
  void (*launch)(const Params& p, const CUtensorMap& map_q, const CUtensorMap& map_k,
                 const CUtensorMap& map_v, dim3 grid, cudaStream_t stream) = nullptr;
};

template <typename Element, typename Cfg>
void launch_kernel(const Params& p, const CUtensorMap& map_q, const CUtensorMap& map_k,
                   const CUtensorMap& map_v, dim3 grid, cudaStream_t stream) {
  flash_attention_hopper_kernel<Element, Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      p, map_q, map_k, map_v);
}

template <typename Element, typename Cfg>
Launcher launcher() {
  static_assert(LayoutProofs<Cfg>::kProved, "descriptor / layout proofs");
  // Above 48 KB a kernel must opt in to more dynamic shared memory (once per process and
  // instantiation; every Hopper GPU has the same 227 KB limit).
  static const cudaError_t configured = cudaFuncSetAttribute(
      flash_attention_hopper_kernel<Element, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      Cfg::kSmemBytes);
  Launcher l;
  l.block_m = Cfg::kBlockM;
  l.block_n = Cfg::kBlockN;
  l.tma = Cfg::kTma;
  l.mask_tensor = Cfg::kMaskTensor;
  l.persistent = Cfg::kPersistent;
  l.align_variants = Cfg::kAlignVariants;
  l.configured = configured;
  l.launch = &launch_kernel<Element, Cfg>;
  return l;
}

// Dense attention (KeyMask<false>): the instantiation of `version` (the host checked it; an
// empty Launcher for a version this head_dim does not have).
template <typename Element, int kHeadDim>
Launcher dispatch_version(int64_t version) {
  // Head_dim 256 has versions 2 and 5 alone (the host checked `version`): every instantiation
  // costs compile time, and v1 (copy rounds) and v7 (O's own buffer) do not fit it.
  if constexpr (kHeadDim == 256) {
    if (version == 2) return launcher<Element, Tile<kHeadDim, 2>>();
    return launcher<Element, Tile<kHeadDim, 5>>();
  } else {
    switch (version) {
      case 1: return launcher<Element, Tile<kHeadDim, 1>>();
      case 2: return launcher<Element, Tile<kHeadDim, 2>>();
      case 3: return launcher<Element, Tile<kHeadDim, 3>>();
      case 4: return launcher<Element, Tile<kHeadDim, 4>>();
      case 5: return launcher<Element, Tile<kHeadDim, 5>>();
      case 7: return launcher<Element, Tile<kHeadDim, 7>>();
      default:
        if constexpr (kHeadDim == 64) return launcher<Element, Tile<kHeadDim, 6>>();
    }
  }
  return Launcher{};
}

// The general predicate (windows, key lengths, mask tensors, softcap, sinks) is instantiated for
// the versions flash_attention routes to: 2, and 5 (which also takes v6's and v7's calls: v6's
// 160-register consumers would spill the predicate's state, ptxas says, where v5's 240 hold it).
// A softcap runs on v5's softcap instantiation, whichever of them was asked for, and a mask
// tensor on v5 (Tile::kMaskTensor: v2 has no registers for its loads). The general v7
// (Tile::kVariantSchedule) runs a call of version 5, 6 or 7 where the host set
// Params::general_version to 7 (ATTN_HOPPER_GENERAL_VERSION, where the general v7 takes the call:
// head_dim 64, 96 or 128, no mask tensor, no softcap, the aligned tiling, at most
// kMaxScheduledBatches batches; flash_attention_hopper.cu, general_version_for).
template <typename Element, int kHeadDim>
Launcher dispatch_general(const Params& p, int64_t version) {
  if (p.mask.softcap > 0.0) return launcher<Element, Tile<kHeadDim, 5, true, true>>();
  // (Head_dim 256 has the general v5 alone: a general v2 call runs as v5 there.)
  if constexpr (kHeadDim != 256) {
    if (version == 2 && p.mask.mask == nullptr) return launcher<Element, Tile<kHeadDim, 2, true>>();
    if (version != 2 && p.general_version == 7 && p.mask.mask == nullptr)
      return launcher<Element, Tile<kHeadDim, 7, true>>();
  }
  return launcher<Element, Tile<kHeadDim, 5, true>>();
}

// Head_dim 256's 80-key tile (FlashAttention-3's), dense attention only: `schedule` 5 = v5 (the
// consumers' turns), 4 = v4 with O rescaled while S computes (FlashAttention-3's schedule at
// 256, what a dense v5 call at 256 runs). ATTN_HOPPER_D256_TILE=80 picks v5's, for A/B runs.
template <typename Element>
Launcher dispatch_d256_tile80(int schedule) {
  if (schedule == 4) return launcher<Element, Tile<256, 4, false, false, 80>>();
  return launcher<Element, Tile<256, 5, false, false, 80>>();
}

// Each compiled in one file, flash_attention_hopper_fp16.cu or _bf16.cu; a file that includes
// this header instantiates none of them (head_dim 96 runs on 128's).
extern template Launcher dispatch_version<__half, 64>(int64_t version);
extern template Launcher dispatch_general<__half, 64>(const Params& p, int64_t version);
extern template Launcher dispatch_version<__half, 128>(int64_t version);
extern template Launcher dispatch_general<__half, 128>(const Params& p, int64_t version);
extern template Launcher dispatch_version<__half, 256>(int64_t version);
extern template Launcher dispatch_general<__half, 256>(const Params& p, int64_t version);
extern template Launcher dispatch_d256_tile80<__half>(int schedule);
extern template Launcher dispatch_version<__nv_bfloat16, 64>(int64_t version);
extern template Launcher dispatch_general<__nv_bfloat16, 64>(const Params& p, int64_t version);
extern template Launcher dispatch_version<__nv_bfloat16, 128>(int64_t version);
extern template Launcher dispatch_general<__nv_bfloat16, 128>(const Params& p, int64_t version);
extern template Launcher dispatch_version<__nv_bfloat16, 256>(int64_t version);
extern template Launcher dispatch_general<__nv_bfloat16, 256>(const Params& p, int64_t version);
extern template Launcher dispatch_d256_tile80<__nv_bfloat16>(int schedule);

}  // namespace hopper_attn
