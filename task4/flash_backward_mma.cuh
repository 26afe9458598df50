// Beyond the course (issue 33, part 2): FlashAttention-2's backward on tensor cores (fp16 /
// bf16, mma.sync m16n8k16, sm_80+), as a template. Included by flash_backward_mma.cu (the
// host entry: validation, the idea, dispatch) and by flash_backward_mma_<dtype>.cu (the
// instantiations, one file per element type so that ninja compiles them in parallel). Read
// flash_backward_mma.cu first; this file is the machinery. The fragments, copies and the
// swizzled shared-memory layout are the forward's (flash_attention_mma.cuh), reused by name.
//
// Both kernels have one shape: a CTA owns kBlockOwn rows of one side (dK/dV kernel: keys of
// one KV head; dQ kernel: queries of one query head), each warp 16 of them (one m16 tile of
// mma.sync), and streams tiles of kBlockStream rows of the other side through shared memory.
// With the own rows as the M dimension every product of the backward is an mma whose A
// operand is either an own tile (ldmatrix from shared memory) or a score-shaped accumulator
// already in registers (rounded to 16 bits: the m16n8 accumulator is the A fragment), and
// whose B operand is a streamed tile, read plain (x ldmatrix) or transposed (ldmatrix.trans):
//
//   dK/dV kernel (own: K, V; streamed: Q, dO of one query head)
//     S^T  = K Q^T           A = K (smem),     B = Q  (plain)
//     P^T  = exp2(S^T * scale*log2(e) - lse2[query])     the mask and softcap on S^T first
//     dV  += P^T dO          A = P^T (regs),   B = dO (transposed)
//     dP^T = V dO^T          A = V (smem),     B = dO (plain)
//     dS^T = P^T * (dP^T - D[query]) * softcap slope
//     dK  += dS^T Q          A = dS^T (regs),  B = Q  (transposed)      (* scale at the end)
//   dQ kernel (own: Q, dO; streamed: K, V of the query head's KV head)
//     S = Q K^T, P, dP = dO V^T, dS as above (lse2 and D per own row, in registers)
//     dQ  += dS K            A = dS (regs),    B = K  (transposed)      (* scale at the end)
//
// So neither P nor dS ever goes through shared memory, and no warp reads another warp's
// rows: the only barriers are the ones around the streamed tiles' copies.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention_mask.cuh"
#include "flash_attention_mma.cuh"

namespace mma_bwd {

using mma_attn::cp_async_commit;
using mma_attn::cp_async_wait;
using mma_attn::ElementOps;
using mma_attn::exp2_approx;
using mma_attn::ldmatrix_x4;
using mma_attn::ldmatrix_x4_trans;
using mma_attn::load_tile;
using mma_attn::SmemLayout;
using mma_attn::smem_u32;

// Everything the three kernels need, by value. q/k/v/d_out/out: strides in elements, the last
// dimension contiguous and rows on 16 bytes (checked on the host); dq/dk/dv are new contiguous
// tensors in the element type; lse2 and delta are [B * H_q * S_q] float32 (the preprocess
// writes them).
struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* out;
  const void* d_out;
  const float* lse;  // the forward's [B, H_q, S_q] base-2 lse, any strides
  float* lse2;       // lse, or +inf where it is -inf (a row that saw no key: its P is 0)
  float* delta;      // D = rowsum(dO * O)
  void* dq;          // [B, H_q, S_q, head_dim]
  void* dk;          // [B, H_kv, S_k, head_dim], summed over the query group
  void* dv;
  int64_t q_stride_b, q_stride_h, q_stride_s;
  int64_t k_stride_b, k_stride_h, k_stride_s;
  int64_t v_stride_b, v_stride_h, v_stride_s;
  int64_t o_stride_b, o_stride_h, o_stride_s;
  int64_t do_stride_b, do_stride_h, do_stride_s;
  int64_t lse_stride_b, lse_stride_h, lse_stride_s;
  int batch, heads, kv_heads, kv_group;  // B, H_q, H_kv, H_q / H_kv
  int seq_q, seq_k, head_dim;
  float scale_log2;  // scale * log2(e), as the forward's (its lse was taken with it)
  float scale;       // dK and dQ are scaled by it once, at the end
  attn::MaskParams mask;
  // The fused (atomic) dQ: [B, H_q, dq_accum_rows, dq_accum_dim] float32, zeroed; rows past
  // S_q (up to a streamed tile beyond it) and columns past head_dim absorb zeros unguarded.
  float* dq_accum;
  int dq_accum_rows, dq_accum_dim;
};

// The head dim a backward runs at: its instantiation (64 or 128), columns past head_dim zero.
inline int padded_head_dim(int64_t head_dim) { return head_dim <= 64 ? 64 : 128; }
// Rows dq_accum has past S_q: at least any fused tile's kBlockStream (checked at the launch),
// since a query tile may start at any row below S_q and its atomics are not guarded. 128: the
// 2-D layout's head-dim-64 tile steps 128 queries (flash_backward_mma_2d.cuh).
constexpr int kDqAccumExtraRows = 128;

// One tile shape: kNWarps warps of 16 own rows each, streamed tiles of kBlockStream rows.
// load_tile (the forward's copy) reads kHeadDim and kThreads from it.
template <int kHeadDim_, int kNWarps_, int kBlockStream_, int kMinBlocksPerSM_>
struct BwdTile {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kBlockOwn = 16 * kNWarps;
  static constexpr int kBlockStream = kBlockStream_;
  static constexpr int kMinBlocksPerSM = kMinBlocksPerSM_;
  static constexpr int kSTiles = kBlockStream / 8;  // n8 tiles of a score-shaped accumulator
  static constexpr int kDTiles = kHeadDim / 8;      // n8 tiles of a gradient accumulator
  static_assert(kHeadDim % 64 == 0, "swizzled rows: head dims 64 and 128 (others are padded)");
  static_assert(kBlockStream % 16 == 0, "streamed tiles are whole k16 steps");
};

// Shared memory: the two own tiles, then two stages of the two streamed tiles (the next
// stage loads while the current one is computed on), then two stages of kBlockStream floats of
// lse2 and of D (the dK/dV kernel's per-column values), with kTileAlign bytes of slack so that
// the kernel can round its base up (pair_step needs aligned tiles).
template <typename Cfg>
struct BwdSmem {
  using Smem = SmemLayout<Cfg::kHeadDim>;
  static constexpr int kOwnBytes = Cfg::kBlockOwn * Smem::kRowBytes;
  static constexpr int kStreamBytes = Cfg::kBlockStream * Smem::kRowBytes;
  static constexpr int own_a = 0;
  static constexpr int own_b = own_a + kOwnBytes;
  static constexpr int stream = own_b + kOwnBytes;        // stage s: tile a, then tile b
  static constexpr int kStageBytes = 2 * kStreamBytes;
  static constexpr int lse = stream + 2 * kStageBytes;     // [2][kBlockStream] float
  static constexpr int delta = lse + 2 * Cfg::kBlockStream * 4;
  static constexpr int bytes = delta + 2 * Cfg::kBlockStream * 4 + Smem::kTileAlign;
  // The fused dQ's dS^T tile, [kBlockOwn keys][kBlockStream queries] 16-bit, each row padded by
  // 16 bytes so that the eight rows of an ldmatrix (and the stores of a warp) hit distinct banks.
  static constexpr int kDsRowBytes = Cfg::kBlockStream * 2 + 16;
  static constexpr int ds = delta + 2 * Cfg::kBlockStream * 4;
  static constexpr int fused_bytes = ds + Cfg::kBlockOwn * kDsRowBytes + Smem::kTileAlign;
  static __host__ __device__ constexpr uint32_t stream_a(int stage) {
    return static_cast<uint32_t>(stream + stage * kStageBytes);
  }
  static __host__ __device__ constexpr uint32_t stream_b(int stage) {
    return static_cast<uint32_t>(stream + stage * kStageBytes + kStreamBytes);
  }
  static_assert(Smem::pair_step_is_offset(), "pair_step must agree with offset");
  static_assert(kOwnBytes % Smem::kTileAlign == 0 && kStreamBytes % Smem::kTileAlign == 0,
                "every tile starts kTileAlign-aligned");
};

// ---------------------------------------------------------------------------------------
// Small pieces
// ---------------------------------------------------------------------------------------

// Two 16-bit elements (low half first) as floats.
template <typename Element>
__device__ __forceinline__ float2 unpack2(uint32_t bits);
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t bits) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

// This lane's ldmatrix addresses (chunk 0 or 1 of its row; pair_step moves along the row):
// `own` the A operand (this warp's 16 own rows), `plain` the streamed tile as the B operand of
// A * streamed^T (".col": rows are the N dimension), `trans` the streamed tile as the B operand
// of W * streamed (rows are the K dimension, read with ldmatrix.trans). The same lane patterns
// as the forward's LaneAddresses q, k and v.
template <typename Cfg>
struct BwdLane {
  using Smem = SmemLayout<Cfg::kHeadDim>;
  static __device__ __forceinline__ uint32_t own(uint32_t tile, int warp, int lane) {
    return tile + Smem::offset(warp * 16 + (lane & 15), lane >> 4);
  }
  static __device__ __forceinline__ uint32_t plain(uint32_t tile, int lane) {
    return tile + Smem::offset((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  }
  static __device__ __forceinline__ uint32_t trans(uint32_t tile, int lane) {
    return tile + Smem::offset((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
  }
};

// acc = own (this warp's 16 rows) x streamed^T over the head dim: a [16, kBlockStream] fp32
// accumulator (S, S^T, dP or dP^T).
template <typename Element, typename Cfg>
__device__ __forceinline__ void warp_product_nt(float (&acc)[Cfg::kSTiles][4], uint32_t own_addr,
                                                uint32_t plain_addr) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: acc = own x streamed^T on tensor cores. Zero acc; per k16 step
  // HINT: of the head dim, ldmatrix_x4 this warp's A fragment (pair_step(own_addr, kk)) and, per
  // HINT: pair of n8 tiles np, the B fragments (pair_step(plain_addr, kk) + np * 16 rows), then two
  // HINT: ElementOps<Element>::mma (the forward's S = Q K^T, one m16 tile).
  using Smem = SmemLayout<Cfg::kHeadDim>;
  constexpr uint32_t kRows16 = 16 * Smem::kRowBytes;
#pragma unroll
  for (int j = 0; j < Cfg::kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, Smem::pair_step(own_addr, kk));
#pragma unroll
    for (int np = 0; np < Cfg::kSTiles / 2; ++np) {
      uint32_t b[4];  // b0 b1 of n8 tile 2np, then of 2np + 1
      ldmatrix_x4(b, Smem::pair_step(plain_addr, kk) + np * kRows16);
      ElementOps<Element>::mma(acc[2 * np], a, b[0], b[1]);
      ElementOps<Element>::mma(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
  // END SOLUTION
}

// acc += W x streamed: W a [16, kBlockStream] fp32 accumulator (P^T, dS^T or dS) rounded to
// 16 bits as the A operand (k16 step kk is W's n8 tiles 2kk and 2kk + 1), the streamed tile
// read transposed; acc a [16, kHeadDim] gradient accumulator.
template <typename Element, typename Cfg>
__device__ __forceinline__ void warp_product_nn(float (&acc)[Cfg::kDTiles][4],
                                                const float (&w)[Cfg::kSTiles][4],
                                                uint32_t trans_addr) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: acc += W x streamed. Per k16 step kk of the streamed rows, pack W's
  // HINT: n8 tiles 2kk and 2kk + 1 into the A fragment (as the forward packs P), then per pair of
  // HINT: d tiles ldmatrix_x4_trans the B fragments (pair_step(trans_addr, dp) + kk * 16 rows) and
  // HINT: mma (the forward's O += P V).
  using Smem = SmemLayout<Cfg::kHeadDim>;
  using Ops = ElementOps<Element>;
  constexpr uint32_t kRows16 = 16 * Smem::kRowBytes;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockStream / 16; ++kk) {
    uint32_t a[4];
    a[0] = Ops::pack(w[2 * kk][0], w[2 * kk][1]);
    a[1] = Ops::pack(w[2 * kk][2], w[2 * kk][3]);
    a[2] = Ops::pack(w[2 * kk + 1][0], w[2 * kk + 1][1]);
    a[3] = Ops::pack(w[2 * kk + 1][2], w[2 * kk + 1][3]);
#pragma unroll
    for (int dp = 0; dp < Cfg::kDTiles / 2; ++dp) {
      uint32_t b[4];  // b0 b1 of d tile 2dp, then of 2dp + 1
      ldmatrix_x4_trans(b, Smem::pair_step(trans_addr, dp) + kk * kRows16);
      Ops::mma(acc[2 * dp], a, b[0], b[1]);
      Ops::mma(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
  // END SOLUTION
}

// The score transforms of one score-shaped accumulator, in place: the softcap (general
// instantiation; `slope` receives its derivative 1 - tanh^2, which dS is multiplied by), then
// the mask where `apply_mask` (-inf where hidden, plus an additive mask's bias). Element
// (row r, column c) of n8 tile j is acc[j][2h + e] with r = g + 8h, c = 8j + 2t + e (g = lane/4,
// t = lane%4). kRowsAreKeys: rows are keys and columns queries (dK/dV kernel), else the
// other way round (dQ kernel); row0 / col0 are the positions of row 0 and column 0.
template <typename Cfg, bool kGeneral, bool kRowsAreKeys>
__device__ __forceinline__ void transform_scores(float (&s)[Cfg::kSTiles][4],
                                                 float (&slope)[kGeneral ? Cfg::kSTiles : 1][4],
                                                 const attn::KeyMask<kGeneral>& mask,
                                                 const attn::MaskParams& mp, bool apply_mask,
                                                 int row0, int col0, int lane) {
  if constexpr (kGeneral) {
    const bool capped = mp.softcap > 0.0;
    const float cap = static_cast<float>(mp.softcap);
    const float cap_inv = static_cast<float>(mp.softcap_inv);
#pragma unroll
    for (int j = 0; j < Cfg::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float t = capped ? tanhf(s[j][e] * cap_inv) : 0.f;
        if (capped) s[j][e] = cap * t;
        slope[j][e] = 1.f - t * t;
      }
  }
  if (!apply_mask) return;
  const int g = lane >> 2;
  const int t2 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::kSTiles; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = row0 + g + 8 * h;
        const int col = col0 + 8 * j + t2 + e;
        s[j][2 * h + e] = kRowsAreKeys ? mask.apply(s[j][2 * h + e], col, row)
                                       : mask.apply(s[j][2 * h + e], row, col);
      }
}

// P = exp2(s * scale_log2 - lse2) in place; lse2 of the element's query: the dK/dV kernel's
// per column (shared memory, `col_lse2` indexed by the column within the tile), the dQ
// kernel's per row (`row_lse2[h]`). Masked scores (-inf) and rows without keys (lse2 +inf)
// give 0.
template <typename Cfg, bool kRowsAreKeys>
__device__ __forceinline__ void probabilities(float (&s)[Cfg::kSTiles][4], const float* col_lse2,
                                              const float (&row_lse2)[2], float scale_log2,
                                              int lane) {
  const int t2 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::kSTiles; ++j) {
    // The two columns of this lane in n8 tile j, one 8-byte shared-memory load.
    const float2 cols = kRowsAreKeys ? *reinterpret_cast<const float2*>(col_lse2 + 8 * j + t2)
                                     : make_float2(0.f, 0.f);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float lse2 = kRowsAreKeys ? (e ? cols.y : cols.x) : row_lse2[h];
        s[j][2 * h + e] = exp2_approx(fmaf(s[j][2 * h + e], scale_log2, -lse2));
      }
  }
}

// dP becomes dS = P * (dP - D) * slope in place; D of the element's query as lse2 above.
template <typename Cfg, bool kGeneral, bool kRowsAreKeys>
__device__ __forceinline__ void score_gradients(float (&dp)[Cfg::kSTiles][4],
                                                const float (&p)[Cfg::kSTiles][4],
                                                const float (&slope)[kGeneral ? Cfg::kSTiles : 1][4],
                                                bool capped, const float* col_delta,
                                                const float (&row_delta)[2], int lane) {
  const int t2 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::kSTiles; ++j) {
    const float2 cols = kRowsAreKeys ? *reinterpret_cast<const float2*>(col_delta + 8 * j + t2)
                                     : make_float2(0.f, 0.f);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float d = kRowsAreKeys ? (e ? cols.y : cols.x) : row_delta[h];
        float ds = p[j][2 * h + e] * (dp[j][2 * h + e] - d);
        if constexpr (kGeneral) {
          if (capped) ds *= slope[j][2 * h + e];
        }
        dp[j][2 * h + e] = ds;
      }
  }
}

// Write this warp's 16 rows of a gradient accumulator times `factor`, in the element type, to
// a contiguous [seq, head_dim] head: rows >= seq and columns >= head_dim are not written.
template <typename Element, typename Cfg>
__device__ __forceinline__ void store_rows(const float (&acc)[Cfg::kDTiles][4], float factor,
                                           Element* head, int row0, int seq, int head_dim,
                                           int lane) {
  using Ops = ElementOps<Element>;
  const int g = lane >> 2;
  const int t2 = 2 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
    if (row >= seq) continue;
    Element* out_row = head + static_cast<int64_t>(row) * head_dim;
#pragma unroll
    for (int j = 0; j < Cfg::kDTiles; ++j)
      if (8 * j < head_dim)
        *reinterpret_cast<uint32_t*>(out_row + 8 * j + t2) =
            Ops::pack(acc[j][2 * h] * factor, acc[j][2 * h + 1] * factor);
  }
}

// The fused dQ (FlashAttention-2's): after dS^T of a query tile, dQ[tile] += dS K over the
// CTA's keys. dS^T goes through shared memory (each warp holds 16 keys of it, the product sums
// over all kBlockOwn), the warps split the [kBlockStream, head_dim] product into a
// kWarpsM x kWarpsN grid of [kRows, kCols] blocks, and each adds its block into the fp32
// dq_accum with atomics (another CTA's keys add into the same rows).
template <typename Cfg>
struct FusedDqSplit {
  static constexpr int kWarpsN =
      Cfg::kNWarps < Cfg::kHeadDim / 16 ? Cfg::kNWarps : Cfg::kHeadDim / 16;
  static constexpr int kWarpsM = Cfg::kNWarps / kWarpsN;
  static constexpr int kCols = Cfg::kHeadDim / kWarpsN;
  static constexpr int kRows = Cfg::kBlockStream / kWarpsM;
  static constexpr int kMTiles = kRows / 16;
  static constexpr int kNTiles = kCols / 8;
  static_assert(kWarpsM * kWarpsN == Cfg::kNWarps && kRows % 16 == 0 && kCols % 16 == 0,
                "the dQ product splits into whole m16 x n16 blocks per warp");
};

// This warp's 16 rows of dS^T (a score-shaped accumulator, keys x queries), rounded to 16 bits
// as the dK product's A operand is, into the dS^T tile.
template <typename Element, typename Cfg>
__device__ __forceinline__ void store_ds_tile(const float (&ds)[Cfg::kSTiles][4],
                                              unsigned char* ds_tile, int warp, int lane) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the atomic dQ): write this warp's 16 rows of dS^T, rounded with
  // HINT: ElementOps<Element>::pack per pair of columns, at row warp * 16 + g + 8h and column
  // HINT: 8j + 2t of the dS^T tile (rows kDsRowBytes apart).
  using Ops = ElementOps<Element>;
  constexpr int kRowBytes = BwdSmem<Cfg>::kDsRowBytes;
  const int g = lane >> 2;
  const int t2 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Cfg::kSTiles; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<uint32_t*>(ds_tile + (warp * 16 + g + 8 * h) * kRowBytes +
                                   (8 * j + t2) * 2) = Ops::pack(ds[j][2 * h], ds[j][2 * h + 1]);
  // END SOLUTION
}

// acc = this warp's block of dS K: A = dS (the dS^T tile read with ldmatrix.trans: its rows
// are the K dimension), B = the own K tile read transposed (rows are the K dimension).
template <typename Element, typename Cfg>
__device__ __forceinline__ void dq_block_product(
    float (&acc)[FusedDqSplit<Cfg>::kMTiles][FusedDqSplit<Cfg>::kNTiles][4], uint32_t ds_tile,
    uint32_t k_tile, int warp, int lane) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the atomic dQ): zero acc; per k16 step of the CTA's keys,
  // HINT: ldmatrix_x4_trans the A fragments of dS (the dS^T tile: keys are its rows, this warp's
  // HINT: kRows queries its columns) and the B fragments of K (BwdLane::trans on the own K
  // HINT: tile, pair_step to this warp's columns), then mma, as warp_product_nn does.
  using Split = FusedDqSplit<Cfg>;
  using Smem = SmemLayout<Cfg::kHeadDim>;
  constexpr int kRowBytes = BwdSmem<Cfg>::kDsRowBytes;
  constexpr uint32_t kRows16 = 16 * Smem::kRowBytes;
  const int block_m = warp / Split::kWarpsN, block_n = warp % Split::kWarpsN;
#pragma unroll
  for (int mi = 0; mi < Split::kMTiles; ++mi)
#pragma unroll
    for (int ni = 0; ni < Split::kNTiles; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
  // Matrix i = lane / 8 of an A fragment: keys +8 for i >= 2, queries +8 for odd i.
  const uint32_t a_lane = ds_tile + ((lane & 7) + ((lane >> 4) << 3)) * kRowBytes +
                          (block_m * Split::kRows + (((lane >> 3) & 1) << 3)) * 2;
  const uint32_t b_lane = BwdLane<Cfg>::trans(k_tile, lane);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockOwn / 16; ++kk) {
    uint32_t a[Split::kMTiles][4];
#pragma unroll
    for (int mi = 0; mi < Split::kMTiles; ++mi)
      ldmatrix_x4_trans(a[mi], a_lane + kk * 16 * kRowBytes + mi * 16 * 2);
#pragma unroll
    for (int np = 0; np < Split::kNTiles / 2; ++np) {
      uint32_t b[4];  // b0 b1 of n8 tile 2np, then of 2np + 1
      ldmatrix_x4_trans(b, Smem::pair_step(b_lane, block_n * (Split::kCols / 16) + np) +
                               kk * kRows16);
#pragma unroll
      for (int mi = 0; mi < Split::kMTiles; ++mi) {
        ElementOps<Element>::mma(acc[mi][2 * np], a[mi], b[0], b[1]);
        ElementOps<Element>::mma(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
  // END SOLUTION
}

// at[0] += x and at[1] += y in fp32 memory that other CTAs add into too (dq_accum): one vector
// atomic on sm_90, two scalar ones before it. Both dQ-by-atomics kernels add through it.
__device__ __forceinline__ void atomic_add_pair(float* at, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(at), make_float2(x, y));
#else
  atomicAdd(at, x);
  atomicAdd(at + 1, y);
#endif
}

// Add this warp's block into dq_accum (the query head's [dq_accum_rows, dq_accum_dim] fp32
// rows; the query tile starts at row q0): pairs of columns, one vector atomic each on sm_90.
template <typename Cfg>
__device__ __forceinline__ void add_dq_block(
    const float (&acc)[FusedDqSplit<Cfg>::kMTiles][FusedDqSplit<Cfg>::kNTiles][4], float* head,
    int q0, int warp, int lane) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the atomic dQ): atomic_add_pair each accumulator pair (row q0 + this
  // HINT: warp's rows, columns of this warp's block) into the query head's fp32 rows.
  using Split = FusedDqSplit<Cfg>;
  const int row0 = q0 + (warp / Split::kWarpsN) * Split::kRows + (lane >> 2);
  const int col0 = (warp % Split::kWarpsN) * Split::kCols + 2 * (lane & 3);
#pragma unroll
  for (int mi = 0; mi < Split::kMTiles; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* row = head + static_cast<int64_t>(row0 + 16 * mi + 8 * h) * Cfg::kHeadDim + col0;
#pragma unroll
      for (int ni = 0; ni < Split::kNTiles; ++ni)
        atomic_add_pair(row + 8 * ni, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
    }
  // END SOLUTION
}

// dQ = dq_accum * scale in the element type: one thread per pair of columns.
template <typename Element>
__global__ void backward_dq_convert_kernel(const BwdParams p) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (the atomic dQ): dq[row][col..col+1] = dq_accum * scale, packed.
  const int64_t pairs_per_row = p.head_dim / 2;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.seq_q;
  if (pair >= rows * pairs_per_row) return;
  const int64_t row = pair / pairs_per_row;            // (batch * heads + head) * seq_q + query
  const int col = static_cast<int>(pair % pairs_per_row) * 2;
  const int64_t head_row = row / p.seq_q, query = row % p.seq_q;
  const float2 v = *reinterpret_cast<const float2*>(
      p.dq_accum + (head_row * p.dq_accum_rows + query) * p.dq_accum_dim + col);
  *reinterpret_cast<uint32_t*>(static_cast<Element*>(p.dq) + row * p.head_dim + col) =
      ElementOps<Element>::pack(v.x * p.scale, v.y * p.scale);
  // END SOLUTION
}

// The CTA's shared memory, its base rounded up to kTileAlign.
template <typename Cfg>
__device__ __forceinline__ uint32_t aligned_smem_base(unsigned char* smem_raw,
                                                      unsigned char** aligned_ptr) {
  constexpr uint32_t kAlign = SmemLayout<Cfg::kHeadDim>::kTileAlign;
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + (kAlign - 1)) & ~(kAlign - 1);
  *aligned_ptr = smem_raw + (base - raw);
  return base;
}

// ---------------------------------------------------------------------------------------
// The kernels
// ---------------------------------------------------------------------------------------

constexpr int kPreprocessWarps = 8;

// D = rowsum(dO * O) in float32 and lse2 (the forward's lse, +inf where it is -inf), one warp
// per query row; each lane reads pairs of elements.
template <typename Element>
__global__ void __launch_bounds__(kPreprocessWarps * 32)
    backward_preprocess_mma_kernel(const BwdParams p) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: one warp per query row: D = sum over head_dim of dO * O (pairs of
  // HINT: elements per lane, a warp shuffle reduction) and lse2 = lse (+inf where -inf).
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.seq_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kPreprocessWarps + warp;
  if (row >= rows) return;  // a whole warp returns together
  const int64_t batch = row / (static_cast<int64_t>(p.heads) * p.seq_q);
  const int64_t head = (row / p.seq_q) % p.heads;
  const int64_t query = row % p.seq_q;
  const Element* o_row = static_cast<const Element*>(p.out) + batch * p.o_stride_b +
                         head * p.o_stride_h + query * p.o_stride_s;
  const Element* do_row = static_cast<const Element*>(p.d_out) + batch * p.do_stride_b +
                          head * p.do_stride_h + query * p.do_stride_s;
  float sum = 0.f;
  for (int d = 2 * lane; d < p.head_dim; d += 64) {
    const float2 o = unpack2<Element>(*reinterpret_cast<const uint32_t*>(o_row + d));
    const float2 g = unpack2<Element>(*reinterpret_cast<const uint32_t*>(do_row + d));
    sum = fmaf(o.x, g.x, fmaf(o.y, g.y, sum));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    const float lse = p.lse[batch * p.lse_stride_b + head * p.lse_stride_h + query * p.lse_stride_s];
    p.delta[row] = sum;
    p.lse2[row] = lse == -INFINITY ? INFINITY : lse;
  }
  // END SOLUTION
}

// The dK/dV kernel's walk over (query head of the group, query tile): `group` indexes the
// head within the GQA group, [start, end) the query rows of that head that may see the CTA's
// keys, `start` the current tile. advance() moves to the next tile, over heads whose range is
// empty; false when the walk is done. Start from {-1, 0, 0}.
struct QueryTileCursor {
  int group, start, end;

  template <typename Cfg, bool kGeneral>
  __device__ __forceinline__ bool advance(const BwdParams& p, int batch, int kv_head, int kv_start) {
    start += Cfg::kBlockStream;
    while (start >= end) {
      if (++group >= p.kv_group) return false;
      const attn::KeyMask<kGeneral> mask(p.mask, batch, kv_head * p.kv_group + group);
      const int2 range = mask.queries_seeing(kv_start, kv_start + Cfg::kBlockOwn);
      start = range.x;
      end = range.y;
    }
    return true;
  }
};

// Issue the copies of one query tile's Q and dO rows to q_dst and do_dst (cp.async, one commit
// group) and write its lse2 and D to lse2_dst and delta_dst (+inf and 0 past seq_q: P = 0 and
// dS = 0 there). kRows rows: the kernel's streamed tile (this file) or query step (the 2-D one).
template <typename Element, typename Cfg, int kRows>
__device__ __forceinline__ void load_query_rows(const BwdParams& p, uint32_t q_dst, uint32_t do_dst,
                                                float* lse2_dst, float* delta_dst, int batch,
                                                int kv_head, const QueryTileCursor& tile, int tid) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: load_tile Q and dO of the query head (kv_head * kv_group +
  // HINT: tile.group) at rows tile.start into q_dst and do_dst, cp_async_commit, then write the
  // HINT: tile's lse2 and D values (+inf and 0 for rows >= seq_q).
  const int head = kv_head * p.kv_group + tile.group;
  const Element* q_head = static_cast<const Element*>(p.q) + batch * p.q_stride_b +
                          head * p.q_stride_h;
  const Element* do_head = static_cast<const Element*>(p.d_out) + batch * p.do_stride_b +
                           head * p.do_stride_h;
  load_tile<Cfg, kRows>(q_dst, q_head, p.q, p.q_stride_s, tile.start, p.seq_q, p.head_dim, tid);
  load_tile<Cfg, kRows>(do_dst, do_head, p.d_out, p.do_stride_s, tile.start, p.seq_q, p.head_dim, tid);
  cp_async_commit();
  const int64_t row_base = (static_cast<int64_t>(batch) * p.heads + head) * p.seq_q;
  for (int c = tid; c < kRows; c += Cfg::kThreads) {
    const int query = tile.start + c;
    const bool real = query < p.seq_q;
    lse2_dst[c] = real ? p.lse2[row_base + query] : INFINITY;
    delta_dst[c] = real ? p.delta[row_base + query] : 0.f;
  }
  // END SOLUTION
}

// One query tile into `stage` of this kernel's shared memory (load_query_rows).
template <typename Element, typename Cfg>
__device__ __forceinline__ void load_query_tile(const BwdParams& p, uint32_t smem,
                                                unsigned char* smem_ptr, int stage, int batch,
                                                int kv_head, const QueryTileCursor& tile, int tid) {
  using Layout = BwdSmem<Cfg>;
  load_query_rows<Element, Cfg, Cfg::kBlockStream>(
      p, smem + Layout::stream_a(stage), smem + Layout::stream_b(stage),
      reinterpret_cast<float*>(smem_ptr + Layout::lse) + stage * Cfg::kBlockStream,
      reinterpret_cast<float*>(smem_ptr + Layout::delta) + stage * Cfg::kBlockStream, batch,
      kv_head, tile, tid);
}

// dK and dV: grid (key tiles, B * H_kv); a CTA owns kBlockOwn keys of one KV head and walks
// the query tiles of every query head of its group, so dK and dV are summed over the group in
// its registers. The next query tile loads while the current one is computed on.
// kFusedDq: also dQ, FlashAttention-2's way (store_ds_tile, dq_block_product, add_dq_block per
// query tile: 5 tile products instead of 7, atomics in the order CTAs arrive).
template <typename Element, typename Cfg, bool kGeneral, bool kFusedDq>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSM)
    flash_backward_dkdv_mma_kernel(const BwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: load K and V of the key tile; walk the (query head, query tile)
  // HINT: pairs with QueryTileCursor, the next tile loading into the other stage; per tile:
  // HINT: S^T = K Q^T (warp_product_nt), transform_scores, probabilities, dV += P^T dO
  // HINT: (warp_product_nn), dP^T = V dO^T, score_gradients, dK += dS^T Q. Store dK * scale, dV.
  using Layout = BwdSmem<Cfg>;
  using Lane = BwdLane<Cfg>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem_ptr;
  const uint32_t smem = aligned_smem_base<Cfg>(smem_raw, &smem_ptr);

  const int kv_start = blockIdx.x * Cfg::kBlockOwn;
  const int batch = blockIdx.y / p.kv_heads;
  const int kv_head = blockIdx.y % p.kv_heads;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  // K and V of the tile, and the first query tile: one commit group each.
  const Element* k_head = static_cast<const Element*>(p.k) + batch * p.k_stride_b +
                          kv_head * p.k_stride_h;
  const Element* v_head = static_cast<const Element*>(p.v) + batch * p.v_stride_b +
                          kv_head * p.v_stride_h;
  load_tile<Cfg, Cfg::kBlockOwn>(smem + Layout::own_a, k_head, p.k, p.k_stride_s, kv_start,
                                 p.seq_k, p.head_dim, tid);
  load_tile<Cfg, Cfg::kBlockOwn>(smem + Layout::own_b, v_head, p.v, p.v_stride_s, kv_start,
                                 p.seq_k, p.head_dim, tid);
  cp_async_commit();
  QueryTileCursor tile{-1, 0, 0};
  bool have = tile.advance<Cfg, kGeneral>(p, batch, kv_head, kv_start);
  if (have) load_query_tile<Element, Cfg>(p, smem, smem_ptr, 0, batch, kv_head, tile, tid);

  float dk[Cfg::kDTiles][4], dv[Cfg::kDTiles][4];
#pragma unroll
  for (int j = 0; j < Cfg::kDTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;
  const float no_row_values[2] = {0.f, 0.f};  // this kernel's lse2 and D are per column

  for (int stage = 0; have; stage ^= 1) {
    QueryTileCursor next = tile;
    const bool have_next = next.advance<Cfg, kGeneral>(p, batch, kv_head, kv_start);
    // This stage has landed for every thread, and every warp is done with the other stage
    // (the previous tile): the next tile may overwrite it.
    cp_async_wait<0>();
    __syncthreads();
    if (have_next) load_query_tile<Element, Cfg>(p, smem, smem_ptr, stage ^ 1, batch, kv_head, next, tid);

    const attn::KeyMask<kGeneral> mask(p.mask, batch, kv_head * p.kv_group + tile.group);
    const int2 unmasked = mask.unmasked_keys(tile.start, tile.start + Cfg::kBlockStream - 1);
    const bool apply_mask =
        !(kv_start >= unmasked.x && kv_start + Cfg::kBlockOwn <= unmasked.y);
    const float* col_lse2 = reinterpret_cast<const float*>(smem_ptr + Layout::lse) +
                            stage * Cfg::kBlockStream;
    const float* col_delta = reinterpret_cast<const float*>(smem_ptr + Layout::delta) +
                             stage * Cfg::kBlockStream;
    const uint32_t q_tile = smem + Layout::stream_a(stage);
    const uint32_t do_tile = smem + Layout::stream_b(stage);
    // S^T = K Q^T, its transforms, P^T; dV += P^T dO.
    float s[Cfg::kSTiles][4];
    float slope[kGeneral ? Cfg::kSTiles : 1][4];
    warp_product_nt<Element, Cfg>(s, Lane::own(smem + Layout::own_a, warp, lane),
                                  Lane::plain(q_tile, lane));
    transform_scores<Cfg, kGeneral, true>(s, slope, mask, p.mask, apply_mask, kv_start + warp * 16,
                                          tile.start, lane);
    probabilities<Cfg, true>(s, col_lse2, no_row_values, p.scale_log2, lane);
    warp_product_nn<Element, Cfg>(dv, s, Lane::trans(do_tile, lane));
    // dP^T = V dO^T; dS^T; dK += dS^T Q.
    float ds[Cfg::kSTiles][4];
    warp_product_nt<Element, Cfg>(ds, Lane::own(smem + Layout::own_b, warp, lane),
                                  Lane::plain(do_tile, lane));
    score_gradients<Cfg, kGeneral, true>(ds, s, slope, kGeneral && p.mask.softcap > 0.0, col_delta,
                                         no_row_values, lane);
    // The dS^T tile is free: every warp passed this step's barrier after the last step's dQ.
    if constexpr (kFusedDq) store_ds_tile<Element, Cfg>(ds, smem_ptr + Layout::ds, warp, lane);
    warp_product_nn<Element, Cfg>(dk, ds, Lane::trans(q_tile, lane));
    if constexpr (kFusedDq) {
      __syncthreads();  // every warp's dS^T rows are in the tile
      float dq[FusedDqSplit<Cfg>::kMTiles][FusedDqSplit<Cfg>::kNTiles][4];
      dq_block_product<Element, Cfg>(dq, smem + Layout::ds, smem + Layout::own_a, warp, lane);
      const int head = kv_head * p.kv_group + tile.group;
      add_dq_block<Cfg>(dq, p.dq_accum + (static_cast<int64_t>(batch) * p.heads + head) *
                                             p.dq_accum_rows * p.dq_accum_dim,
                        tile.start, warp, lane);
    }
    tile = next;
    have = have_next;
  }
  cp_async_wait<0>();  // a CTA that visited no query tile still has K and V in flight

  const int64_t kv_row_base = (static_cast<int64_t>(batch) * p.kv_heads + kv_head) * p.seq_k;
  const int row0 = kv_start + warp * 16;
  store_rows<Element, Cfg>(dk, p.scale, static_cast<Element*>(p.dk) + kv_row_base * p.head_dim,
                           row0, p.seq_k, p.head_dim, lane);
  store_rows<Element, Cfg>(dv, 1.f, static_cast<Element*>(p.dv) + kv_row_base * p.head_dim, row0,
                           p.seq_k, p.head_dim, lane);
  // END SOLUTION
#else
  __trap();  // built for a GPU older than sm_80: the host refuses to launch
#endif
}

// Issue the copies of one key tile (K and V by cp.async, one commit group) into `stage`.
template <typename Element, typename Cfg>
__device__ __forceinline__ void load_key_tile(const BwdParams& p, uint32_t smem, int stage,
                                              const Element* k_head, const Element* v_head,
                                              int kv_start, int tid) {
  using Layout = BwdSmem<Cfg>;
  load_tile<Cfg, Cfg::kBlockStream>(smem + Layout::stream_a(stage), k_head, p.k, p.k_stride_s,
                                    kv_start, p.seq_k, p.head_dim, tid);
  load_tile<Cfg, Cfg::kBlockStream>(smem + Layout::stream_b(stage), v_head, p.v, p.v_stride_s,
                                    kv_start, p.seq_k, p.head_dim, tid);
  cp_async_commit();
}

// dQ: grid (query tiles, B * H_q); a CTA owns kBlockOwn queries of one head and walks the key
// tiles they see (the forward's loop order), recomputing P and dS; dQ stays in registers. The
// next key tile loads while the current one is computed on.
template <typename Element, typename Cfg, bool kGeneral>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSM)
    flash_backward_dq_mma_kernel(const BwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: load Q and dO of the query tile; walk the key tiles the tile
  // HINT: sees (double-buffered); per tile S = Q K^T, transform_scores, probabilities, dP = dO V^T,
  // HINT: score_gradients, dQ += dS K. Store dQ * scale.
  using Layout = BwdSmem<Cfg>;
  using Lane = BwdLane<Cfg>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem_ptr;
  const uint32_t smem = aligned_smem_base<Cfg>(smem_raw, &smem_ptr);

  // Heaviest query tiles first: under a causal mask the last ones see the most keys.
  const int q_start = (gridDim.x - 1 - blockIdx.x) * Cfg::kBlockOwn;
  const int batch = blockIdx.y / p.heads;
  const int head = blockIdx.y % p.heads;
  const int kv_head = head / p.kv_group;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  const attn::KeyMask<kGeneral> mask(p.mask, batch, head);
  const int q_last = q_start + Cfg::kBlockOwn - 1;
  const int key_first = max(mask.keys_begin(q_start), 0);
  const int key_end = mask.keys_end(q_last);
  const int2 unmasked = mask.unmasked_keys(q_start, q_last);
  const Element* k_head = static_cast<const Element*>(p.k) + batch * p.k_stride_b +
                          kv_head * p.k_stride_h;
  const Element* v_head = static_cast<const Element*>(p.v) + batch * p.v_stride_b +
                          kv_head * p.v_stride_h;

  // Q and dO of the tile, and the first key tile: one commit group each.
  const Element* q_head = static_cast<const Element*>(p.q) + batch * p.q_stride_b +
                          head * p.q_stride_h;
  const Element* do_head = static_cast<const Element*>(p.d_out) + batch * p.do_stride_b +
                           head * p.do_stride_h;
  load_tile<Cfg, Cfg::kBlockOwn>(smem + Layout::own_a, q_head, p.q, p.q_stride_s, q_start,
                                 p.seq_q, p.head_dim, tid);
  load_tile<Cfg, Cfg::kBlockOwn>(smem + Layout::own_b, do_head, p.d_out, p.do_stride_s, q_start,
                                 p.seq_q, p.head_dim, tid);
  cp_async_commit();
  if (key_first < key_end)
    load_key_tile<Element, Cfg>(p, smem, 0, k_head, v_head, key_first, tid);

  const int64_t row_base = (static_cast<int64_t>(batch) * p.heads + head) * p.seq_q;
  const int row0 = q_start + warp * 16;
  float row_lse2[2], row_delta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int query = row0 + (lane >> 2) + 8 * h;
    const bool real = query < p.seq_q;
    row_lse2[h] = real ? p.lse2[row_base + query] : INFINITY;
    row_delta[h] = real ? p.delta[row_base + query] : 0.f;
  }
  float dq[Cfg::kDTiles][4];
#pragma unroll
  for (int j = 0; j < Cfg::kDTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[j][e] = 0.f;

  int stage = 0;
  for (int kv_start = key_first; kv_start < key_end; kv_start += Cfg::kBlockStream, stage ^= 1) {
    // This stage has landed for every thread, and every warp is done with the other one.
    cp_async_wait<0>();
    __syncthreads();
    if (kv_start + Cfg::kBlockStream < key_end)
      load_key_tile<Element, Cfg>(p, smem, stage ^ 1, k_head, v_head, kv_start + Cfg::kBlockStream,
                                  tid);

    const bool apply_mask =
        !(kv_start >= unmasked.x && kv_start + Cfg::kBlockStream <= unmasked.y);
    const uint32_t k_tile = smem + Layout::stream_a(stage);
    const uint32_t v_tile = smem + Layout::stream_b(stage);
    float s[Cfg::kSTiles][4];
    float slope[kGeneral ? Cfg::kSTiles : 1][4];
    warp_product_nt<Element, Cfg>(s, Lane::own(smem + Layout::own_a, warp, lane),
                                  Lane::plain(k_tile, lane));
    transform_scores<Cfg, kGeneral, false>(s, slope, mask, p.mask, apply_mask, row0, kv_start,
                                           lane);
    probabilities<Cfg, false>(s, nullptr, row_lse2, p.scale_log2, lane);
    float ds[Cfg::kSTiles][4];
    warp_product_nt<Element, Cfg>(ds, Lane::own(smem + Layout::own_b, warp, lane),
                                  Lane::plain(v_tile, lane));
    score_gradients<Cfg, kGeneral, false>(ds, s, slope, kGeneral && p.mask.softcap > 0.0, nullptr,
                                          row_delta, lane);
    warp_product_nn<Element, Cfg>(dq, ds, Lane::trans(k_tile, lane));
  }
  cp_async_wait<0>();  // a CTA that visited no key tile still has Q and dO in flight

  store_rows<Element, Cfg>(dq, p.scale, static_cast<Element*>(p.dq) + row_base * p.head_dim, row0,
                           p.seq_q, p.head_dim, lane);
  // END SOLUTION
#else
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------
// Launch (host)
// ---------------------------------------------------------------------------------------

// Allow `bytes` of dynamic shared memory for `kernel` (needed above 48 KB). nullptr or an error.
template <typename Kernel>
const char* allow_smem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return nullptr;
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return "cudaGetDevice failed";
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (optin < bytes) return "the GPU has less shared memory per block than this tile needs";
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
    return "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed";
  return nullptr;
}

// dQ = dq_accum * scale in the element type, after the kernel that added into dq_accum.
template <typename Element>
void launch_dq_convert(const BwdParams& p, cudaStream_t stream) {
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.heads * p.seq_q * (p.head_dim / 2);
  constexpr int kConvertThreads = 256;
  backward_dq_convert_kernel<Element>
      <<<static_cast<unsigned>((pairs + kConvertThreads - 1) / kConvertThreads), kConvertThreads,
         0, stream>>>(p);
}

// The backward's kernels on `stream` (the preprocess has run): deterministic, the dK/dV kernel
// (CfgKV) then the dQ kernel (CfgQ); otherwise the fused dK/dV/dQ kernel (CfgFused, dQ by
// atomics into p.dq_accum, zeroed by the caller) then the conversion of dQ. Returns an error
// string, or nullptr.
template <typename Element, typename CfgKV, typename CfgQ, typename CfgFused, bool kGeneral>
const char* launch_backward_mma(const BwdParams& p, bool deterministic, cudaStream_t stream) {
  const int64_t kv_rows = static_cast<int64_t>(p.batch) * p.kv_heads;
  const int64_t q_rows = static_cast<int64_t>(p.batch) * p.heads;
  if (q_rows > 65535) return "batch * heads exceeds 65535 (gridDim.y); split the batch";
  if (!deterministic) {
    static_assert(CfgFused::kHeadDim == CfgKV::kHeadDim, "one head dim per launch");
    static_assert(CfgFused::kBlockStream <= kDqAccumExtraRows, "dq_accum rows past S_q");
    if (p.dq_accum == nullptr || p.dq_accum_dim != CfgFused::kHeadDim ||
        p.dq_accum_rows < p.seq_q + kDqAccumExtraRows)
      return "the fused dQ needs a zeroed float32 dq_accum [B, H_q, S_q + kDqAccumExtraRows, "
             "padded_head_dim(head_dim)]";
    constexpr int kSmem = BwdSmem<CfgFused>::fused_bytes;
    auto fused = flash_backward_dkdv_mma_kernel<Element, CfgFused, kGeneral, true>;
    if (const char* err = allow_smem(fused, kSmem)) return err;
    const dim3 grid((p.seq_k + CfgFused::kBlockOwn - 1) / CfgFused::kBlockOwn,
                    static_cast<unsigned>(kv_rows));
    fused<<<grid, CfgFused::kThreads, kSmem, stream>>>(p);
    if (cudaPeekAtLastError() != cudaSuccess) return "the fused dK/dV/dQ kernel did not launch";
    launch_dq_convert<Element>(p, stream);
    return nullptr;
  }
  constexpr int kSmemKV = BwdSmem<CfgKV>::bytes;
  constexpr int kSmemQ = BwdSmem<CfgQ>::bytes;
  auto dkdv = flash_backward_dkdv_mma_kernel<Element, CfgKV, kGeneral, false>;
  auto dq = flash_backward_dq_mma_kernel<Element, CfgQ, kGeneral>;
  if (const char* err = allow_smem(dkdv, kSmemKV)) return err;
  if (const char* err = allow_smem(dq, kSmemQ)) return err;
  const dim3 kv_grid((p.seq_k + CfgKV::kBlockOwn - 1) / CfgKV::kBlockOwn,
                     static_cast<unsigned>(kv_rows));
  dkdv<<<kv_grid, CfgKV::kThreads, kSmemKV, stream>>>(p);
  if (cudaPeekAtLastError() != cudaSuccess) return "the dK/dV kernel did not launch";
  const dim3 q_grid((p.seq_q + CfgQ::kBlockOwn - 1) / CfgQ::kBlockOwn, static_cast<unsigned>(q_rows));
  dq<<<q_grid, CfgQ::kThreads, kSmemQ, stream>>>(p);
  return nullptr;
}

template <typename Element>
void launch_preprocess(const BwdParams& p, int64_t blocks, cudaStream_t stream) {
  backward_preprocess_mma_kernel<Element>
      <<<static_cast<unsigned>(blocks), kPreprocessWarps * 32, 0, stream>>>(p);
}

// ---------------------------------------------------------------------------------------
// The tile shapes (flash_backward_mma.cu says why)
// ---------------------------------------------------------------------------------------
//                          head_dim warps stream CTAs/SM
using BwdKVD128 = BwdTile<128, 4, 32, 2>;   // dK/dV: 64 keys x 32 queries per step
using BwdKVD128G = BwdTile<128, 4, 32, 2>;  // general: the softcap slope needs registers
using BwdQD128 = BwdTile<128, 4, 64, 2>;    // dQ: 64 queries x 64 keys per step
using BwdKVD64 = BwdTile<64, 4, 64, 2>;
using BwdQD64 = BwdTile<64, 4, 64, 2>;
// The fused dK/dV/dQ kernel. D = 128: 128 keys per CTA (8 warps), so each query tile's dQ block
// is added half as often as with 64 (the atomics' traffic is S_k / kBlockOwn x the size of dQ);
// D = 64: the dK/dV tile (2 CTAs of 4 warps per SM), which measured faster there than 8 warps
// (results/logs/h100_backward_dq_modes_ab.txt). Both use all 255 registers; ptxas -v reports a
// few bytes spilled by the general instantiations and at D = 64.
using BwdFusedD128 = BwdTile<128, 8, 32, 1>;
using BwdFusedD64 = BwdTile<64, 4, 64, 2>;

// One entry per (element type, head dim), defined in flash_backward_mma_<dtype>.cu; `general`
// picks the instantiation for patterns beyond causal and softcap (p.mask.general()).
const char* backward_fp16_d64(const BwdParams& p, bool deterministic, cudaStream_t stream);
const char* backward_fp16_d128(const BwdParams& p, bool deterministic, cudaStream_t stream);
const char* backward_bf16_d64(const BwdParams& p, bool deterministic, cudaStream_t stream);
const char* backward_bf16_d128(const BwdParams& p, bool deterministic, cudaStream_t stream);
void preprocess_fp16(const BwdParams& p, int64_t blocks, cudaStream_t stream);
void preprocess_bf16(const BwdParams& p, int64_t blocks, cudaStream_t stream);

template <typename Element, typename CfgKV, typename CfgKVG, typename CfgQ, typename CfgFused>
const char* run_backward(const BwdParams& p, bool deterministic, cudaStream_t stream) {
  if (p.mask.general())
    return launch_backward_mma<Element, CfgKVG, CfgQ, CfgFused, true>(p, deterministic, stream);
  return launch_backward_mma<Element, CfgKV, CfgQ, CfgFused, false>(p, deterministic, stream);
}

}  // namespace mma_bwd
