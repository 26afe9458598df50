// Beyond the course (issue 33): the fused dK/dV/dQ backward with FlashAttention-2's 2-D warp
// layout (fp16 / bf16, mma.sync m16n8k16, sm_80+). One idea: give every warp a 32 x 32 block
// of each product instead of 16 whole rows, so that each ldmatrix fragment feeds four mma
// instead of two.
//
// Why. flash_backward_mma.cuh gives each warp 16 own rows (one m16 tile) and keeps P and dS in
// registers; each B fragment then feeds two mma, and ncu shows that kernel waiting on its
// ldmatrix loads, not on the tensor cores (task4/NOTES.md, "The backward's speed"). Here a CTA
// of 8 warps owns kBlockKeys = 128 keys of one KV head and steps kBlockQueries queries of each
// head of its GQA group; per query tile:
//
//   S^T  = K Q^T, dP^T = V dO^T    warps 4 (keys) x 2 (queries), each 32 keys x 32 (or 64)
//                                  queries: per k16 step 2 A + 2 (4) B fragments, 8 (16) mma
//   P^T, dS^T                      in registers (mask, softcap, exp2, dS = P (dP - D) slope),
//                                  rounded to 16 bits into two [keys][queries] shared tiles
//                                  (stmatrix on sm_90, 4-byte stores on sm_80 / 86 / 89)
//   --- barrier: every warp's P^T and dS^T are in shared memory ---
//   dV += P^T dO, dK += dS^T Q     warps 4 (keys) x 2 (head-dim halves), each 32 keys x D/2
//                                  columns, accumulated in registers over the whole walk
//   dQ  = dS K                     warps kBlockQueries/32 (queries) x the rest (columns), a
//                                  32 x 32 block each, added into the fp32 dq_accum by atomics
//                                  (the fused mode's accumulator and convert kernel)
//
// About 0.45 ldmatrix.x4 per mma at D = 128 (the 16-row layout: 0.65), and 8 independent mma
// per k16 step per warp. The price: P and dS go through shared memory (one extra barrier per
// query tile), and a thread holds dK and dV for 32 keys x D/2 columns (2 x 64 fp32 at D = 128).
//
// Tile shapes (Bwd2dD128, Bwd2dD64 below), both 8 warps and one CTA per SM:
//   D = 128: 128 keys x 64 queries per step. Registers: dK, dV 128 fp32 per thread, S^T and dP^T
//            32 each, the dQ block 32 (after P and dS are stored, so never with S^T and dP^T).
//            Shared memory: K, V 2 x 32 KB, Q and dO double-buffered 4 x 16 KB, P^T and dS^T
//            2 x 16 KB, lse2 and D 1 KB: about 161 KB (an A100 allows 163 KB).
//   D = 64:  128 keys x 128 queries per step (FlashAttention-2's choice on GPUs with 144 KB of
//            shared memory per block or more): dK and dV are half as large, so the same
//            registers hold twice the score tile (S^T, dP^T 64 fp32 each), which halves the
//            per-tile overheads (barriers, lse2/D loads) and gives 16 mma per k16 step of the
//            score products. Shared memory again about 161 KB. dq_accum needs 128 rows past
//            S_q (kDqAccumExtraRows).
// Two CTAs per SM would need 128 registers per thread, below the accumulators alone.
//
// Variants: every one the 16-row kernel takes (the mask, score transforms and the walk over
// (query head, query tile) are its pieces, reused by name): causal (bottom-right for
// S_q != S_k), GQA with dK/dV summed over the group in registers, window, stride, key lengths
// (right or left padded), bool and additive masks, softcap (its slope is used the moment it
// is computed: S^T and dP^T are both in registers when dS is formed), sinks (nothing to do in
// the backward), scale; head dims up to 128 padded to 64 or 128. Only the atomic dQ mode: the
// deterministic one stays on the 16-row kernels (flash_backward_mma.cu chooses).
//
// The ladder (task4/NOTES.md, "The backward's speed", has each step's measurement):
//   1. the 16-row layout (flash_backward_mma.cuh): ldmatrix-bound, each B fragment feeds 2 mma
//   2. this 2-D layout: the same ldmatrix and mma counts per query tile as FlashAttention-2
//   3. lse2 and D of a warp's columns read once per query tile (ScoreColumns), not per m16 row
//   4. P^T and dS^T by stmatrix on sm_90 (store_score_tile_row): a quarter of the store
//      instructions. Tried beside it: lse2 and D from global memory into registers instead of
//      shared memory (FlashAttention-2's way): within about 1% at D = 128, 2-7% slower at
//      D = 64, and slower with stmatrix than stmatrix alone. Tried after it: lse2 and D
//      staged by cp.async with Q and dO, so that no warp waits on their global loads mid-tile:
//      slower, and removed.
//
// Measured speed: Results.md / task4/NOTES.md. No number is written here.

#pragma once

#include "flash_backward_mma.cuh"

namespace mma_bwd {

// One tile shape of the 2-D layout: 8 warps, kBlockKeys = 128 own keys, kBlockQueries queries
// per step. kBlockOwn / kBlockStream are the names QueryTileCursor and load_tile read.
template <int kHeadDim_, int kBlockQueries_>
struct Bwd2dTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 8;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kBlockKeys = 128;
  static constexpr int kBlockQueries = kBlockQueries_;
  static constexpr int kBlockOwn = kBlockKeys;
  static constexpr int kBlockStream = kBlockQueries;

  // S^T and dP^T: 4 warps along the keys x 2 along the queries.
  static constexpr int kScoreWarpsKeys = 4;
  static constexpr int kScoreKeys = kBlockKeys / kScoreWarpsKeys;
  static constexpr int kScoreQueries = kBlockQueries / (kNWarps / kScoreWarpsKeys);
  static constexpr int kScoreMTiles = kScoreKeys / 16;
  static constexpr int kScoreNTiles = kScoreQueries / 8;
  // dK and dV: 4 warps along the keys x 2 along the head dim.
  static constexpr int kGradWarpsKeys = 4;
  static constexpr int kGradKeys = kBlockKeys / kGradWarpsKeys;
  static constexpr int kGradCols = kHeadDim / (kNWarps / kGradWarpsKeys);
  static constexpr int kGradMTiles = kGradKeys / 16;
  static constexpr int kGradNTiles = kGradCols / 8;
  // dQ: blocks of 32 queries, the warps left over along the head dim.
  static constexpr int kDqQueries = 32;
  static constexpr int kDqWarpsQueries = kBlockQueries / kDqQueries;
  static constexpr int kDqCols = kHeadDim / (kNWarps / kDqWarpsQueries);
  static constexpr int kDqMTiles = kDqQueries / 16;
  static constexpr int kDqNTiles = kDqCols / 8;

  // What transform_scores / probabilities / score_gradients read: one m16 row of a warp's
  // score block is kScoreNTiles n8 tiles.
  struct WarpScoreRow {
    static constexpr int kSTiles = kScoreNTiles;
  };

  static_assert(kHeadDim == 64 || kHeadDim == 128, "swizzled rows: head dims 64 and 128");
  static_assert(kBlockQueries == 64 || kBlockQueries == 128,
                "the [keys][queries] score tiles are swizzled rows of 128 or 256 bytes");
  static_assert(kScoreKeys % 16 == 0 && kScoreQueries % 16 == 0, "whole m16 x n16 score blocks");
  static_assert(kGradKeys % 16 == 0 && kGradCols % 16 == 0, "whole m16 x n16 gradient blocks");
  static_assert(kNWarps % kDqWarpsQueries == 0 && kDqCols % 16 == 0, "whole m16 x n16 dQ blocks");
};

// Shared memory: K and V (own), two stages of Q and dO, the P^T and dS^T tiles ([kBlockKeys]
// rows of kBlockQueries 16-bit elements, swizzled like every other tile), two stages of lse2
// and D per query, kTileAlign bytes of slack for the kernel to align its base.
template <typename Cfg>
struct Bwd2dSmem {
  using Rows = SmemLayout<Cfg::kHeadDim>;         // K, V, Q, dO: [row][head dim]
  using Scores = SmemLayout<Cfg::kBlockQueries>;  // P^T, dS^T: [key][query]
  static constexpr int kKeyTileBytes = Cfg::kBlockKeys * Rows::kRowBytes;
  static constexpr int kQueryTileBytes = Cfg::kBlockQueries * Rows::kRowBytes;
  static constexpr int kScoreTileBytes = Cfg::kBlockKeys * Scores::kRowBytes;
  static constexpr int kStageBytes = 2 * kQueryTileBytes;
  static constexpr int k = 0;
  static constexpr int v = k + kKeyTileBytes;
  static constexpr int stream = v + kKeyTileBytes;  // stage s: Q, then dO
  static constexpr int p_t = stream + 2 * kStageBytes;
  static constexpr int ds_t = p_t + kScoreTileBytes;
  static constexpr int lse = ds_t + kScoreTileBytes;  // [2][kBlockQueries] float
  static constexpr int delta = lse + 2 * Cfg::kBlockQueries * 4;
  static constexpr int bytes = delta + 2 * Cfg::kBlockQueries * 4 + Rows::kTileAlign;
  static __host__ __device__ constexpr uint32_t q(int stage) {
    return static_cast<uint32_t>(stream + stage * kStageBytes);
  }
  static __host__ __device__ constexpr uint32_t d_out(int stage) {
    return static_cast<uint32_t>(stream + stage * kStageBytes + kQueryTileBytes);
  }
  static_assert(Rows::pair_step_is_offset() && Scores::pair_step_is_offset(),
                "pair_step must agree with offset");
  static_assert(Rows::kSwizzle && Scores::kSwizzle, "pair_step XORs: swizzled rows only");
  static_assert(Scores::kTileAlign <= Rows::kTileAlign &&
                    kKeyTileBytes % Rows::kTileAlign == 0 &&
                    kQueryTileBytes % Rows::kTileAlign == 0 &&
                    kScoreTileBytes % Rows::kTileAlign == 0,
                "every tile starts kTileAlign-aligned (pair_step needs it)");
};

// This lane's ldmatrix address in a tile of layout `Layout` (a SmemLayout), for a fragment
// whose first tile row is row0 (a multiple of 8) and first column 0; pair_step then moves it
// along the row by 16 columns per pair. Which lanes give which rows, per operand:
//   a_rows: the A operand, tile rows = M (plain ldmatrix): lanes 0-15 rows 0-15 columns 0-7,
//           lanes 16-31 rows 0-15 columns 8-15
//   b_rows: the B operand of A x tile^T, tile rows = N (plain): matrices {rows 0-7, 8-15} x
//           {columns 0-7, 8-15} in the order b0 b1 of n8 tile 0, b0 b1 of n8 tile 1
//   b_cols: the B operand of A x tile, tile rows = K (ldmatrix.trans): b0 b1 of n8 tile 0
//           (rows 0-7, 8-15 at columns 0-7), then of n8 tile 1 (columns 8-15)
//   a_cols: the A operand A = tile^T, tile rows = K (ldmatrix.trans): a0 = rows 0-7 x
//           columns 0-7, a1 = rows 0-7 x columns 8-15 (M + 8), a2 = rows 8-15 x columns 0-7
//           (K + 8), a3 = rows 8-15 x columns 8-15. (The same lanes as b_rows.)
template <typename Layout>
struct FragmentLanes {
  static __device__ __forceinline__ uint32_t a_rows(uint32_t tile, int row0, int lane) {
    return tile + Layout::offset(row0 + (lane & 15), lane >> 4);
  }
  static __device__ __forceinline__ uint32_t b_rows(uint32_t tile, int row0, int lane) {
    return tile + Layout::offset(row0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  }
  static __device__ __forceinline__ uint32_t b_cols(uint32_t tile, int row0, int lane) {
    return tile + Layout::offset(row0 + (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
  }
  static __device__ __forceinline__ uint32_t a_cols(uint32_t tile, int row0, int lane) {
    return b_rows(tile, row0, lane);
  }
};

// ---------------------------------------------------------------------------------------
// The three warp products
// ---------------------------------------------------------------------------------------

// acc = a x b^T over the head dim, a warp's [kScoreKeys, kScoreQueries] block of S^T (a = K,
// b = Q) or dP^T (a = V, b = dO): a_addr = a_rows at the warp's first key, b_addr = b_rows at
// its first query. Each A fragment feeds kScoreNTiles mma, each B fragment kScoreMTiles x 2.
template <typename Element, typename Cfg>
__device__ __forceinline__ void score_block_product(
    float (&acc)[Cfg::kScoreMTiles][Cfg::kScoreNTiles][4], uint32_t a_addr, uint32_t b_addr) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): zero acc; per k16 step of the head dim,
  // HINT: ldmatrix_x4 the A fragment of each m16 tile (pair_step(a_addr, kk) + 16 rows per tile)
  // HINT: and the B fragments of each pair of n8 tiles (pair_step(b_addr, kk) + 16 rows per
  // HINT: pair), then one mma per (m16 tile, n8 tile).
  using Rows = SmemLayout<Cfg::kHeadDim>;
  constexpr uint32_t kRows16 = 16 * Rows::kRowBytes;
#pragma unroll
  for (int mi = 0; mi < Cfg::kScoreMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::kScoreNTiles; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
    uint32_t a[Cfg::kScoreMTiles][4];
#pragma unroll
    for (int mi = 0; mi < Cfg::kScoreMTiles; ++mi)
      ldmatrix_x4(a[mi], Rows::pair_step(a_addr, kk) + mi * kRows16);
#pragma unroll
    for (int np = 0; np < Cfg::kScoreNTiles / 2; ++np) {
      uint32_t b[4];  // b0 b1 of n8 tile 2np, then of 2np + 1
      ldmatrix_x4(b, Rows::pair_step(b_addr, kk) + np * kRows16);
#pragma unroll
      for (int mi = 0; mi < Cfg::kScoreMTiles; ++mi) {
        ElementOps<Element>::mma(acc[mi][2 * np], a[mi], b[0], b[1]);
        ElementOps<Element>::mma(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
  // END SOLUTION
}

// acc += w x b over the query tile, a warp's [kGradKeys, kGradCols] block of dV (w = P^T,
// b = dO) or dK (w = dS^T, b = Q): w_addr = a_rows of the score tile at the warp's first key,
// b_addr = b_cols of the query tile at row 0, col_pair0 = the warp's first column / 16.
template <typename Element, typename Cfg>
__device__ __forceinline__ void gradient_block_product(
    float (&acc)[Cfg::kGradMTiles][Cfg::kGradNTiles][4], uint32_t w_addr, uint32_t b_addr,
    int col_pair0) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): per k16 step kk of the queries, ldmatrix_x4
  // HINT: the A fragment of each m16 tile from the score tile (pair_step(w_addr, kk)), and
  // HINT: ldmatrix_x4_trans the B fragments of each pair of n8 tiles (pair_step(b_addr,
  // HINT: col_pair0 + np) + kk * 16 rows), then one mma per (m16 tile, n8 tile).
  using Rows = SmemLayout<Cfg::kHeadDim>;
  using Scores = SmemLayout<Cfg::kBlockQueries>;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockQueries / 16; ++kk) {
    uint32_t a[Cfg::kGradMTiles][4];
#pragma unroll
    for (int mi = 0; mi < Cfg::kGradMTiles; ++mi)
      ldmatrix_x4(a[mi], Scores::pair_step(w_addr, kk) + mi * 16 * Scores::kRowBytes);
#pragma unroll
    for (int np = 0; np < Cfg::kGradNTiles / 2; ++np) {
      uint32_t b[4];  // b0 b1 of n8 tile 2np, then of 2np + 1
      ldmatrix_x4_trans(b, Rows::pair_step(b_addr, col_pair0 + np) + kk * 16 * Rows::kRowBytes);
#pragma unroll
      for (int mi = 0; mi < Cfg::kGradMTiles; ++mi) {
        ElementOps<Element>::mma(acc[mi][2 * np], a[mi], b[0], b[1]);
        ElementOps<Element>::mma(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
  // END SOLUTION
}

// acc = dS K over the CTA's keys, a warp's [kDqQueries, kDqCols] block of the query tile's dQ:
// ds_addr = a_cols of the dS^T tile at row 0 (its rows are keys, the K dimension),
// query_pair0 = the warp's first query / 16, k_addr = b_cols of the K tile at row 0,
// col_pair0 = the warp's first column / 16.
template <typename Element, typename Cfg>
__device__ __forceinline__ void dq_block_product_2d(
    float (&acc)[Cfg::kDqMTiles][Cfg::kDqNTiles][4], uint32_t ds_addr, int query_pair0,
    uint32_t k_addr, int col_pair0) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): zero acc; per k16 step kk of the keys,
  // HINT: ldmatrix_x4_trans the A fragment of each m16 tile of queries from the dS^T tile
  // HINT: (pair_step(ds_addr, query_pair0 + mi) + kk * 16 rows) and the B fragments of K
  // HINT: (pair_step(k_addr, col_pair0 + np) + kk * 16 rows), then mma.
  using Rows = SmemLayout<Cfg::kHeadDim>;
  using Scores = SmemLayout<Cfg::kBlockQueries>;
#pragma unroll
  for (int mi = 0; mi < Cfg::kDqMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::kDqNTiles; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockKeys / 16; ++kk) {
    uint32_t a[Cfg::kDqMTiles][4];
#pragma unroll
    for (int mi = 0; mi < Cfg::kDqMTiles; ++mi)
      ldmatrix_x4_trans(a[mi], Scores::pair_step(ds_addr, query_pair0 + mi) +
                                   kk * 16 * Scores::kRowBytes);
#pragma unroll
    for (int np = 0; np < Cfg::kDqNTiles / 2; ++np) {
      uint32_t b[4];  // b0 b1 of n8 tile 2np, then of 2np + 1
      ldmatrix_x4_trans(b, Rows::pair_step(k_addr, col_pair0 + np) + kk * 16 * Rows::kRowBytes);
#pragma unroll
      for (int mi = 0; mi < Cfg::kDqMTiles; ++mi) {
        ElementOps<Element>::mma(acc[mi][2 * np], a[mi], b[0], b[1]);
        ElementOps<Element>::mma(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------
// Small pieces
// ---------------------------------------------------------------------------------------

// One m16 row of a warp's score block (kScoreNTiles n8 tiles; element (g + 8h, 8j + 2t + e) is
// acc[j][2h + e]), rounded to 16 bits, into a [key][query] score tile at (key_row0,
// query_col0): the layout a_rows / a_cols read back. One 4-byte store per pair of queries;
// the 8 rows g of a store sit in 8 different 16-byte bank groups (the swizzle).
template <typename Element, typename Cfg>
__device__ __forceinline__ void store_score_row(const float (&acc)[Cfg::kScoreNTiles][4],
                                                unsigned char* tile, int key_row0,
                                                int query_col0, int lane) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): per n8 tile j and half h, pack the lane's two
  // HINT: values with ElementOps<Element>::pack and store them at row key_row0 + g + 8h, column
  // HINT: query_col0 + 8j + 2t (SmemLayout<kBlockQueries>::offset of its chunk, plus 2 bytes a column).
  using Scores = SmemLayout<Cfg::kBlockQueries>;
  const int g = lane >> 2;
  const int t2 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::kScoreNTiles; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = key_row0 + g + 8 * h;
      const int col = query_col0 + 8 * j + t2;
      *reinterpret_cast<uint32_t*>(tile + Scores::offset(row, col >> 3) + (col & 7) * 2) =
          ElementOps<Element>::pack(acc[j][2 * h], acc[j][2 * h + 1]);
    }
  // END SOLUTION
}

// stmatrix is an sm_90 instruction (PTX ISA 7.8): store_score_tile_row uses it where it
// exists and the 4-byte stores above elsewhere.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kHaveStmatrix = true;
#else
constexpr bool kHaveStmatrix = false;
#endif

// Four 8x8 matrices of 16-bit elements from registers to shared memory, ldmatrix_x4 run
// backwards: lanes 8i..8i+7 give the row addresses of matrix i, and register i holds matrix i
// (lane l: row l/4, columns 2*(l%4) and 2*(l%4)+1).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#else
  __trap();  // kHaveStmatrix keeps callers off this path
#endif
}

// store_score_row by stmatrix (sm_90): the same 16-bit values at the same addresses, one
// stmatrix.x4 per 16 x 16 block instead of four 4-byte stores (a quarter of the shared-memory
// store instructions; measured 3-5% faster on the H100, results/logs/h100_bwd_opts_ab.log,
// where this was the "stmatrix" option). The accumulator
// of an m16n8 tile is two 8x8 matrices in exactly the layout stmatrix takes (lane l: row l/4 =
// g, columns 2t, 2t + 1), so the block's n8 tiles 2jp, 2jp + 1 are the registers
//   r0 = rows 0-7 x columns 0-7 (acc[2jp][0..1]),   r1 = rows 8-15 x columns 0-7 (acc[2jp][2..3]),
//   r2 = rows 0-7 x columns 8-15 (acc[2jp+1][0..1]), r3 = rows 8-15 x columns 8-15 (acc[2jp+1][2..3]),
// whose row addresses are a_rows' (lanes 0-15 rows 0-15 at columns 0-7, lanes 16-31 at 8-15):
// the addresses gradient_block_product's ldmatrix reads back. tile_addr: the score tile's
// shared-memory address; query_col0 a multiple of 16.
template <typename Element, typename Cfg>
__device__ __forceinline__ void store_score_row_stmatrix(const float (&acc)[Cfg::kScoreNTiles][4],
                                                         uint32_t tile_addr, int key_row0,
                                                         int query_col0, int lane) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): per pair jp of n8 tiles, stmatrix_x4 at
  // HINT: pair_step(a_rows(tile_addr, key_row0), query_col0 / 16 + jp) the packed pairs of
  // HINT: n8 tile 2jp (rows g, g + 8), then of 2jp + 1.
  using Scores = SmemLayout<Cfg::kBlockQueries>;
  const uint32_t addr = FragmentLanes<Scores>::a_rows(tile_addr, key_row0, lane);
#pragma unroll
  for (int jp = 0; jp < Cfg::kScoreNTiles / 2; ++jp)
    stmatrix_x4(Scores::pair_step(addr, query_col0 / 16 + jp),
                ElementOps<Element>::pack(acc[2 * jp][0], acc[2 * jp][1]),
                ElementOps<Element>::pack(acc[2 * jp][2], acc[2 * jp][3]),
                ElementOps<Element>::pack(acc[2 * jp + 1][0], acc[2 * jp + 1][1]),
                ElementOps<Element>::pack(acc[2 * jp + 1][2], acc[2 * jp + 1][3]));
  // END SOLUTION
}

// One m16 row of P^T or dS^T into its score tile: by stmatrix where the GPU has it (sm_90),
// else by 4-byte stores. Either way the same bytes at the same addresses.
template <typename Element, typename Cfg>
__device__ __forceinline__ void store_score_tile_row(const float (&acc)[Cfg::kScoreNTiles][4],
                                                     uint32_t tile_addr, unsigned char* tile_ptr,
                                                     int key_row0, int query_col0, int lane) {
  if constexpr (kHaveStmatrix)
    store_score_row_stmatrix<Element, Cfg>(acc, tile_addr, key_row0, query_col0, lane);
  else
    store_score_row<Element, Cfg>(acc, tile_ptr, key_row0, query_col0, lane);
}

// lse2 and D (the preprocess's per-query values) of this lane's columns of a warp's score
// block, in registers: per n8 tile j, columns 8j + 2t and 8j + 2t + 1, one 8-byte
// shared-memory load each from the stage load_query_rows wrote (+inf and 0 past seq_q), read
// once per query tile for all m16 rows of the block. (Reading them from global memory instead,
// FlashAttention-2's way, measured no faster: results/logs/h100_bwd_opts_ab.log, "lse_regs".)
// kInRegisters false: nothing (the caller reads them per row).
template <typename Cfg, bool kInRegisters>
struct ScoreColumns {
  float2 lse2[Cfg::kScoreNTiles];
  float2 delta[Cfg::kScoreNTiles];
  // col_lse2 / col_delta: the stage's values at the warp's first query column.
  __device__ __forceinline__ void load_shared(const float* col_lse2, const float* col_delta,
                                              int lane) {
    // BEGIN SOLUTION kernel
    // HINT: Optional extension (the 2-D backward): per n8 tile j, the float2 at column 8j + 2t.
    const int t2 = 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < Cfg::kScoreNTiles; ++j) {
      lse2[j] = *reinterpret_cast<const float2*>(col_lse2 + 8 * j + t2);
      delta[j] = *reinterpret_cast<const float2*>(col_delta + 8 * j + t2);
    }
    // END SOLUTION
  }
};

template <typename Cfg>
struct ScoreColumns<Cfg, false> {};

// probabilities (flash_backward_mma.cuh) of one m16 row of a warp's score block with lse2 of
// the columns from registers: P = exp2(s * scale_log2 - lse2) in place, the same operations.
template <typename Cfg>
__device__ __forceinline__ void column_probabilities(float (&s)[Cfg::kScoreNTiles][4],
                                                     const ScoreColumns<Cfg, true>& cols,
                                                     float scale_log2) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): element (h, e) of n8 tile j uses column e of
  // HINT: cols.lse2[j].
#pragma unroll
  for (int j = 0; j < Cfg::kScoreNTiles; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float lse2 = e ? cols.lse2[j].y : cols.lse2[j].x;
        s[j][2 * h + e] = exp2_approx(fmaf(s[j][2 * h + e], scale_log2, -lse2));
      }
  // END SOLUTION
}

// score_gradients (flash_backward_mma.cuh) of one m16 row with D of the columns from
// registers: dP becomes dS = P * (dP - D) * slope in place, the same operations.
template <typename Cfg, bool kGeneral>
__device__ __forceinline__ void column_score_gradients(
    float (&dp)[Cfg::kScoreNTiles][4], const float (&p)[Cfg::kScoreNTiles][4],
    const float (&slope)[kGeneral ? Cfg::kScoreNTiles : 1][4], bool capped,
    const ScoreColumns<Cfg, true>& cols) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): as column_probabilities, with cols.delta.
#pragma unroll
  for (int j = 0; j < Cfg::kScoreNTiles; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float d = e ? cols.delta[j].y : cols.delta[j].x;
        float ds = p[j][2 * h + e] * (dp[j][2 * h + e] - d);
        if constexpr (kGeneral) {
          if (capped) ds *= slope[j][2 * h + e];
        }
        dp[j][2 * h + e] = ds;
      }
  // END SOLUTION
}

// Add a warp's dQ block into the query head's fp32 dq_accum rows ([dq_accum_rows][kHeadDim]),
// the block's first element at (row0, col0): atomic_add_pair per pair of columns.
template <typename Cfg>
__device__ __forceinline__ void add_dq_block_2d(const float (&acc)[Cfg::kDqMTiles][Cfg::kDqNTiles][4],
                                                float* head, int row0, int col0, int lane) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): atomic_add_pair each accumulator pair at row
  // HINT: row0 + 16 mi + g + 8h, columns col0 + 8 ni + 2t.
  const int g = lane >> 2;
  const int t2 = 2 * (lane & 3);
#pragma unroll
  for (int mi = 0; mi < Cfg::kDqMTiles; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* row = head + static_cast<int64_t>(row0 + 16 * mi + g + 8 * h) * Cfg::kHeadDim + col0 + t2;
#pragma unroll
      for (int ni = 0; ni < Cfg::kDqNTiles; ++ni)
        atomic_add_pair(row + 8 * ni, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
    }
  // END SOLUTION
}

// Write a warp's [kGradKeys, kGradCols] block of dK or dV times `factor`, in the element type,
// into a contiguous [seq, head_dim] head at (row0, col0): rows >= seq and columns >= head_dim
// (the padding of the instantiation) are not written.
template <typename Element, typename Cfg>
__device__ __forceinline__ void store_gradient_block(
    const float (&acc)[Cfg::kGradMTiles][Cfg::kGradNTiles][4], float factor, Element* head,
    int row0, int col0, int seq, int head_dim, int lane) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): per m16 tile and half, the row row0 + 16 mi +
  // HINT: g + 8h (skip it past seq); per n8 tile inside head_dim, the packed pair at column
  // HINT: col0 + 8 ni + 2t.
  const int g = lane >> 2;
  const int t2 = 2 * (lane & 3);
#pragma unroll
  for (int mi = 0; mi < Cfg::kGradMTiles; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * mi + g + 8 * h;
      if (row >= seq) continue;
      Element* out_row = head + static_cast<int64_t>(row) * head_dim;
#pragma unroll
      for (int ni = 0; ni < Cfg::kGradNTiles; ++ni)
        if (col0 + 8 * ni < head_dim)
          *reinterpret_cast<uint32_t*>(out_row + col0 + 8 * ni + t2) = ElementOps<Element>::pack(
              acc[mi][ni][2 * h] * factor, acc[mi][ni][2 * h + 1] * factor);
    }
  // END SOLUTION
}

// One query tile into `stage` of the 2-D kernel's shared memory (load_query_rows): Q and dO by
// cp.async, lse2 and D by plain loads and stores.
template <typename Element, typename Cfg>
__device__ __forceinline__ void load_query_tile_2d(const BwdParams& p, uint32_t smem,
                                                   unsigned char* smem_ptr, int stage, int batch,
                                                   int kv_head, const QueryTileCursor& tile,
                                                   int tid) {
  using Layout = Bwd2dSmem<Cfg>;
  load_query_rows<Element, Cfg, Cfg::kBlockQueries>(
      p, smem + Layout::q(stage), smem + Layout::d_out(stage),
      reinterpret_cast<float*>(smem_ptr + Layout::lse) + stage * Cfg::kBlockQueries,
      reinterpret_cast<float*>(smem_ptr + Layout::delta) + stage * Cfg::kBlockQueries, batch,
      kv_head, tile, tid);
}

// ---------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------

// A warp's block of each product, as tile-relative first rows / columns, and its lane.
template <typename Cfg>
struct WarpBlocks2d {
  int lane;
  int score_key0, score_query0;  // S^T, dP^T, P^T, dS^T
  int grad_key0, grad_col0;      // dK, dV
  int dq_query0, dq_col0;        // dQ
  __device__ __forceinline__ explicit WarpBlocks2d(int tid) {
    const int warp = tid >> 5;
    lane = tid & 31;
    score_key0 = (warp % Cfg::kScoreWarpsKeys) * Cfg::kScoreKeys;
    score_query0 = (warp / Cfg::kScoreWarpsKeys) * Cfg::kScoreQueries;
    grad_key0 = (warp % Cfg::kGradWarpsKeys) * Cfg::kGradKeys;
    grad_col0 = (warp / Cfg::kGradWarpsKeys) * Cfg::kGradCols;
    dq_query0 = (warp % Cfg::kDqWarpsQueries) * Cfg::kDqQueries;
    dq_col0 = (warp / Cfg::kDqWarpsQueries) * Cfg::kDqCols;
  }
};

// dV += P^T dO and dK += dS^T Q, this warp's keys and columns: the score tiles (complete: after
// the tile's second barrier) against the stage's Q and dO.
template <typename Element, typename Cfg>
__device__ __forceinline__ void accumulate_dv_dk(
    float (&dv)[Cfg::kGradMTiles][Cfg::kGradNTiles][4],
    float (&dk)[Cfg::kGradMTiles][Cfg::kGradNTiles][4], uint32_t smem, uint32_t q_tile,
    uint32_t do_tile, const WarpBlocks2d<Cfg>& w) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): gradient_block_product of dV from the P^T tile
  // HINT: (a_rows at the warp's first key) and dO (b_cols at row 0), then of dK from the dS^T
  // HINT: tile and Q, at the warp's first column / 16.
  using Layout = Bwd2dSmem<Cfg>;
  using Rows = FragmentLanes<SmemLayout<Cfg::kHeadDim>>;
  using Scores = FragmentLanes<SmemLayout<Cfg::kBlockQueries>>;
  gradient_block_product<Element, Cfg>(dv, Scores::a_rows(smem + Layout::p_t, w.grad_key0, w.lane),
                                       Rows::b_cols(do_tile, 0, w.lane), w.grad_col0 / 16);
  gradient_block_product<Element, Cfg>(dk, Scores::a_rows(smem + Layout::ds_t, w.grad_key0, w.lane),
                                       Rows::b_cols(q_tile, 0, w.lane), w.grad_col0 / 16);
  // END SOLUTION
}

// dQ[tile] += dS K, this warp's queries and columns over the CTA's keys, added into the query
// head's rows of the fp32 dq_accum (head: the query head, query_start: the tile's first query).
template <typename Element, typename Cfg>
__device__ __forceinline__ void add_tile_dq(const BwdParams& p, uint32_t smem, int batch, int head,
                                            int query_start, const WarpBlocks2d<Cfg>& w) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): dq_block_product_2d from the dS^T tile (a_cols
  // HINT: at row 0) and K (b_cols at row 0) at the warp's first query / 16 and column / 16, then
  // HINT: add_dq_block_2d into the head's dq_accum rows at query_start + the warp's first query.
  using Layout = Bwd2dSmem<Cfg>;
  using Rows = FragmentLanes<SmemLayout<Cfg::kHeadDim>>;
  using Scores = FragmentLanes<SmemLayout<Cfg::kBlockQueries>>;
  float dq[Cfg::kDqMTiles][Cfg::kDqNTiles][4];
  dq_block_product_2d<Element, Cfg>(dq, Scores::a_cols(smem + Layout::ds_t, 0, w.lane),
                                    w.dq_query0 / 16, Rows::b_cols(smem + Layout::k, 0, w.lane),
                                    w.dq_col0 / 16);
  add_dq_block_2d<Cfg>(dq, p.dq_accum + (static_cast<int64_t>(batch) * p.heads + head) *
                                            p.dq_accum_rows * p.dq_accum_dim,
                       query_start + w.dq_query0, w.dq_col0, w.lane);
  // END SOLUTION
}

// dK, dV and (by atomics) dQ: grid (key tiles of 128, B * H_kv). A CTA owns 128 keys of one KV
// head and walks the query tiles of every query head of its group (QueryTileCursor, the next
// tile's copies in flight under the current one's math). Two barriers per query tile: one
// before the tile's Q and dO are read (its copies landed; every warp is done with the previous
// tile's stage and score tiles), one between writing P^T and dS^T and reading them.
template <typename Element, typename Cfg, bool kGeneral>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    flash_backward_2d_kernel(const BwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the 2-D backward): load K and V; walk the query tiles with
  // HINT: QueryTileCursor (the next one loading into the other stage); per tile S^T and dP^T
  // HINT: (score_block_product), per m16 row transform_scores, probabilities, score_gradients,
  // HINT: store_score_tile_row of P^T and dS^T; barrier; dV and dK (accumulate_dv_dk), dQ
  // HINT: (add_tile_dq). Store dK * scale and dV.
  using Layout = Bwd2dSmem<Cfg>;
  using Rows = FragmentLanes<SmemLayout<Cfg::kHeadDim>>;
  using ScoreRow = typename Cfg::WarpScoreRow;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem_ptr;
  const uint32_t smem = aligned_smem_base<Cfg>(smem_raw, &smem_ptr);

  const int kv_start = blockIdx.x * Cfg::kBlockKeys;
  const int batch = blockIdx.y / p.kv_heads;
  const int kv_head = blockIdx.y % p.kv_heads;
  const int tid = threadIdx.x;

  // K and V of the tile, and the first query tile: one commit group each.
  const Element* k_head = static_cast<const Element*>(p.k) + batch * p.k_stride_b +
                          kv_head * p.k_stride_h;
  const Element* v_head = static_cast<const Element*>(p.v) + batch * p.v_stride_b +
                          kv_head * p.v_stride_h;
  load_tile<Cfg, Cfg::kBlockKeys>(smem + Layout::k, k_head, p.k, p.k_stride_s, kv_start, p.seq_k,
                                  p.head_dim, tid);
  load_tile<Cfg, Cfg::kBlockKeys>(smem + Layout::v, v_head, p.v, p.v_stride_s, kv_start, p.seq_k,
                                  p.head_dim, tid);
  cp_async_commit();
  QueryTileCursor tile{-1, 0, 0};
  bool have = tile.advance<Cfg, kGeneral>(p, batch, kv_head, kv_start);
  if (have) load_query_tile_2d<Element, Cfg>(p, smem, smem_ptr, 0, batch, kv_head, tile, tid);

  float dk[Cfg::kGradMTiles][Cfg::kGradNTiles][4], dv[Cfg::kGradMTiles][Cfg::kGradNTiles][4];
#pragma unroll
  for (int mi = 0; mi < Cfg::kGradMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::kGradNTiles; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[mi][ni][e] = dv[mi][ni][e] = 0.f;
  const bool capped = kGeneral && p.mask.softcap > 0.0;

  for (int stage = 0; have; stage ^= 1) {
    QueryTileCursor next = tile;
    const bool have_next = next.advance<Cfg, kGeneral>(p, batch, kv_head, kv_start);
    // This stage has landed for every thread, and every warp is done with the other stage and
    // with the score tiles (the previous tile's products): both may be overwritten.
    cp_async_wait<0>();
    __syncthreads();
    if (have_next)
      load_query_tile_2d<Element, Cfg>(p, smem, smem_ptr, stage ^ 1, batch, kv_head, next, tid);
    const uint32_t q_tile = smem + Layout::q(stage);
    const uint32_t do_tile = smem + Layout::d_out(stage);
    // This warp's blocks, from a fresh thread index: values derived from it are recomputed
    // per tile rather than held in registers through the loop (thread_index_fresh says why).
    const WarpBlocks2d<Cfg> w(mma_attn::thread_index_fresh());
    const int lane = w.lane;

    // S^T = K Q^T and dP^T = V dO^T, this warp's block of each.
    float s[Cfg::kScoreMTiles][Cfg::kScoreNTiles][4];
    float ds[Cfg::kScoreMTiles][Cfg::kScoreNTiles][4];
    score_block_product<Element, Cfg>(s, Rows::a_rows(smem + Layout::k, w.score_key0, lane),
                                      Rows::b_rows(q_tile, w.score_query0, lane));
    score_block_product<Element, Cfg>(ds, Rows::a_rows(smem + Layout::v, w.score_key0, lane),
                                      Rows::b_rows(do_tile, w.score_query0, lane));

    // P^T and dS^T (the softcap's slope used at once: no registers held for it), rounded into
    // the score tiles. The mask only where this warp's block is not wholly visible.
    const attn::KeyMask<kGeneral> mask(p.mask, batch, kv_head * p.kv_group + tile.group);
    const int key0 = kv_start + w.score_key0;
    const int query0 = tile.start + w.score_query0;
    const int2 unmasked = mask.unmasked_keys(query0, query0 + Cfg::kScoreQueries - 1);
    const bool apply_mask = !(key0 >= unmasked.x && key0 + Cfg::kScoreKeys <= unmasked.y);
    const float* col_lse2 = reinterpret_cast<const float*>(smem_ptr + Layout::lse) +
                            stage * Cfg::kBlockQueries + w.score_query0;
    const float* col_delta = reinterpret_cast<const float*>(smem_ptr + Layout::delta) +
                             stage * Cfg::kBlockQueries + w.score_query0;
    // The default instantiation reads lse2 and D of its columns once per tile (ScoreColumns):
    // read per m16 row, the score-tile stores between the rows make the compiler read them
    // again. The general one keeps the per-row reads (ptxas spilled at sm_80 with the values
    // held beside its mask fields).
    ScoreColumns<Cfg, !kGeneral> cols;
    if constexpr (!kGeneral) cols.load_shared(col_lse2, col_delta, lane);
#pragma unroll
    for (int mi = 0; mi < Cfg::kScoreMTiles; ++mi) {
      float slope[kGeneral ? Cfg::kScoreNTiles : 1][4];
      transform_scores<ScoreRow, kGeneral, true>(s[mi], slope, mask, p.mask, apply_mask,
                                                 key0 + 16 * mi, query0, lane);
      if constexpr (kGeneral) {
        const float no_row_values[2] = {0.f, 0.f};  // lse2 and D are per column (query) here
        probabilities<ScoreRow, true>(s[mi], col_lse2, no_row_values, p.scale_log2, lane);
        score_gradients<ScoreRow, kGeneral, true>(ds[mi], s[mi], slope, capped, col_delta,
                                                  no_row_values, lane);
      } else {
        column_probabilities<Cfg>(s[mi], cols, p.scale_log2);
        column_score_gradients<Cfg, kGeneral>(ds[mi], s[mi], slope, capped, cols);
      }
      store_score_tile_row<Element, Cfg>(s[mi], smem + Layout::p_t, smem_ptr + Layout::p_t,
                                         w.score_key0 + 16 * mi, w.score_query0, lane);
      store_score_tile_row<Element, Cfg>(ds[mi], smem + Layout::ds_t, smem_ptr + Layout::ds_t,
                                         w.score_key0 + 16 * mi, w.score_query0, lane);
    }
    __syncthreads();  // every warp's P^T and dS^T are in the score tiles

    // dV and dK, then dQ into the fp32 accumulator by atomics. (ptxas moves the dQ product and
    // its atomic adds among the first of dV's and dK's mma by itself: with the calls swapped
    // the SASS at sm_90 has the same instructions in nearly the same order.)
    accumulate_dv_dk<Element, Cfg>(dv, dk, smem, q_tile, do_tile, w);
    add_tile_dq<Element, Cfg>(p, smem, batch, kv_head * p.kv_group + tile.group, tile.start, w);
    tile = next;
    have = have_next;
  }
  cp_async_wait<0>();  // a CTA that visited no query tile still has K and V in flight

  const int64_t kv_row_base = (static_cast<int64_t>(batch) * p.kv_heads + kv_head) * p.seq_k;
  const WarpBlocks2d<Cfg> w(tid);
  store_gradient_block<Element, Cfg>(dk, p.scale,
                                     static_cast<Element*>(p.dk) + kv_row_base * p.head_dim,
                                     kv_start + w.grad_key0, w.grad_col0, p.seq_k, p.head_dim,
                                     w.lane);
  store_gradient_block<Element, Cfg>(dv, 1.f,
                                     static_cast<Element*>(p.dv) + kv_row_base * p.head_dim,
                                     kv_start + w.grad_key0, w.grad_col0, p.seq_k, p.head_dim,
                                     w.lane);
  // END SOLUTION
#else
  __trap();  // built for a GPU older than sm_80: the host refuses to launch
#endif
}

// ---------------------------------------------------------------------------------------
// Launch (host)
// ---------------------------------------------------------------------------------------

// The 2-D kernel then the conversion of dQ on `stream` (the preprocess has run; p.dq_accum
// zeroed). Returns an error sentence, or nullptr.
template <typename Element, typename Cfg, bool kGeneral>
const char* launch_backward_2d(const BwdParams& p, cudaStream_t stream) {
  static_assert(Cfg::kBlockQueries <= kDqAccumExtraRows, "dq_accum rows past S_q");
  const int64_t kv_rows = static_cast<int64_t>(p.batch) * p.kv_heads;
  if (kv_rows > 65535) return "batch * kv_heads exceeds 65535 (gridDim.y); split the batch";
  if (p.dq_accum == nullptr || p.dq_accum_dim != Cfg::kHeadDim ||
      p.dq_accum_rows < p.seq_q + kDqAccumExtraRows)
    return "the 2-D backward needs a zeroed float32 dq_accum [B, H_q, S_q + kDqAccumExtraRows, "
           "padded_head_dim(head_dim)]";
  constexpr int kSmem = Bwd2dSmem<Cfg>::bytes;
  auto kernel = flash_backward_2d_kernel<Element, Cfg, kGeneral>;
  if (const char* err = allow_smem(kernel, kSmem)) return err;
  const dim3 grid((p.seq_k + Cfg::kBlockKeys - 1) / Cfg::kBlockKeys, static_cast<unsigned>(kv_rows));
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  if (cudaPeekAtLastError() != cudaSuccess) return "the 2-D dK/dV/dQ kernel did not launch";
  launch_dq_convert<Element>(p, stream);
  return nullptr;
}

// CfgGeneral: the tile of the general instantiation (p.mask.general(): window, key lengths,
// mask tensor, stride, softcap, sinks), whose mask fields and softcap slope need registers.
template <typename Element, typename Cfg, typename CfgGeneral>
const char* run_backward_2d(const BwdParams& p, cudaStream_t stream) {
  if (p.mask.general()) return launch_backward_2d<Element, CfgGeneral, true>(p, stream);
  return launch_backward_2d<Element, Cfg, false>(p, stream);
}

// The tile shapes (the top of this file says why). At head dim 64 the general instantiation
// steps 64 queries: with 128, ptxas spilled (its mask fields beside the 64 + 64 score values).
//                             head_dim queries per step
using Bwd2dD128 = Bwd2dTile<128, 64>;
using Bwd2dD64 = Bwd2dTile<64, 128>;
using Bwd2dD64General = Bwd2dTile<64, 64>;

// The dynamic shared memory the 2-D kernel needs for this padded head dim (general: the
// instantiation of windows, key lengths, masks, ...): the host runs the 16-row kernel instead
// on a GPU whose blocks cannot have that much (the consumer GPUs' ~100 KB).
inline int backward_2d_smem_bytes(int padded_dim, bool general) {
  if (padded_dim == 64) return general ? Bwd2dSmem<Bwd2dD64General>::bytes : Bwd2dSmem<Bwd2dD64>::bytes;
  return Bwd2dSmem<Bwd2dD128>::bytes;
}

// One entry per (element type, head dim), defined in flash_backward_mma_2d_<dtype>.cu.
const char* backward_2d_fp16_d64(const BwdParams& p, cudaStream_t stream);
const char* backward_2d_fp16_d128(const BwdParams& p, cudaStream_t stream);
const char* backward_2d_bf16_d64(const BwdParams& p, cudaStream_t stream);
const char* backward_2d_bf16_d128(const BwdParams& p, cudaStream_t stream);

}  // namespace mma_bwd
