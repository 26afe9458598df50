// Task 4+: the FlashAttention-2 forward kernel on tensor cores (fp16 / bf16), as a template.
//
// Included by flash_attention_mma.cu (the host entry: validation, dispatch) and by the
// flash_attention_mma_<dtype>.cu files that instantiate it (split so ninja compiles them in
// parallel). Read flash_attention_mma.cu first for the idea; this file is the machinery.
//
// One CTA = one (batch, head, tile of kBlockM query rows). Warp w owns kRowsPerWarp
// consecutive query rows (16 or 32: one or two m16 tiles of mma.sync.m16n8k16). The loop
// walks the key/value tiles of kBlockN rows from the last one down to the first (as
// FlashAttention-2 does: the tiles that need a mask, the sequence tail and the causal
// diagonal, come first), and per tile:
//
//   S = Q K^T            mma.sync, fp32 accumulators; K from shared memory with ldmatrix
//   mask                 only on tiles that cross the diagonal or hold keys >= seq
//   online softmax       row max over the quad of 4 lanes that share a row (2 shuffles);
//                        p = exp2(s * scale*log2(e) - m * scale*log2(e)): one FFMA + one EX2
//   P = S (registers)    the m16n8 fp32 accumulator, rounded pairwise to fp16/bf16, is
//                        exactly the A fragment of m16n8k16: P never touches shared memory
//   O += P V             V from shared memory with ldmatrix.trans
//
// Loads overlap compute with one K buffer and one V buffer (FlashAttention-2's pipeline):
// V[j] is fetched (cp.async) while S = Q K[j]^T runs, and K[j-1] is fetched while the
// softmax and P V[j] run. Shared memory rows are XOR-swizzled (16-byte chunk ^ row % 8) so
// that cp.async stores and ldmatrix loads are free of bank conflicts; head dims that are not
// a multiple of 64 use one 16-byte pad per row instead (the XOR would leave the row).

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <optional>

#include "attention_mask.cuh"

namespace mma_attn {

// Everything the kernel needs, passed by value (it lives in the constant bank). Strides are
// in elements; the last dimension is contiguous (stride 1), checked on the host.
struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t batch_heads;  // B * H_q
  int heads;            // H_q, the query heads
  int kv_group;         // H_q / H_kv: query head h reads K/V head h / kv_group (GQA, MQA)
  int seq_q, seq_k;     // queries and keys; the queries are the last seq_q positions
  int head_dim;         // D, a multiple of 8, <= the kernel's kHeadDim (the rest is zero-filled)
  float scale_log2;     // log2(e) * scale: exp(x * scale) == exp2(x * scale_log2)
  attn::MaskParams mask;  // which keys each query sees (causal, window, ...); softcap, sinks
  // Optional [B * H_q, seq_q] float32: base-2 log-sum-exp per row, with the row's sink (if
  // any) counted once: a split of the keys merged by lse must pass the sinks to one split.
  float* lse;
  // Optional: write O / l as float32 here (strides o_*) instead of `out` in q's dtype. A
  // split-KV decode merges its partial outputs by their lse; partials rounded to 16 bits
  // first would be rounded twice (once here, once after the merge).
  float* out_float;
};

// One tile configuration. kRowsPerWarp = kBlockM / kNWarps query rows per warp (16 or 32).
// kQInRegs: Q's A fragments are loaded into registers once (costs kRowsPerWarp*kHeadDim/32
// registers per thread); otherwise they are re-read from shared memory for every key tile.
// kStatsInSmem: the running row max and row sum (touched once per key tile) live in shared
// memory instead of registers, for the tiles whose accumulators fill the 255 registers
// (otherwise ptxas spills a few values to local memory, which costs more).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, bool kQInRegs_,
          bool kStatsInSmem_, int kMinBlocksPerSM_>
struct TileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr bool kStatsInSmem = kStatsInSmem_;
  static constexpr int kMinBlocksPerSM = kMinBlocksPerSM_;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 tiles per warp
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dims 32, 64, 96, 128, 192, 256");
  static_assert(kRowsPerWarp == 16 || kRowsPerWarp == 32, "a warp owns 16 or 32 query rows");
  static_assert(kBlockN % 16 == 0, "key tiles are whole k16 steps of the P V product");
};

// The shared-memory layout of a [rows][kHeadDim] tile of 16-bit elements, in 16-byte chunks
// of 8 elements. The one place where the swizzle is written: every store (cp.async, the
// output staging) and every load (ldmatrix, the output copy) goes through `offset`, or
// through `pair_step`, which is `offset` moved along a row (proved equal below).
template <int kHeadDim>
struct SmemLayout {
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  // Rows of 128, 256 or 512 bytes: XOR the chunk index with row % 8. The 8 rows that one 8x8
  // ldmatrix reads (same logical chunk) then sit in 8 different 16-byte bank groups.
  // Other rows (64, 192, 384 bytes) get 16 bytes of padding: row r starts at bank group
  // (r * (kChunks + 1)) % 8, which is again 8 different groups for 8 consecutive rows
  // because kChunks + 1 is odd. (The swizzle needs a power-of-two row: pair_step XORs the
  // chunk bits of the address, which a row of 384 bytes would carry into.)
  static constexpr bool kSwizzle = kHeadDim % 64 == 0 && (kHeadDim & (kHeadDim - 1)) == 0;
  static constexpr int kRowBytes = kSwizzle ? kHeadDim * 2 : kHeadDim * 2 + 16;
  // Tiles start at multiples of this (see pair_step): a swizzled row's chunk bits must be
  // zero in the tile's base, so rows of 512 bytes need 512-byte tiles.
  static constexpr int kTileAlign = kSwizzle && kRowBytes > 256 ? kRowBytes : 256;

  // Byte offset of chunk `chunk` (elements 8*chunk .. 8*chunk+7) of row `row`.
  static __host__ __device__ constexpr uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>(row * kRowBytes + (kSwizzle ? (chunk ^ (row & 7)) : chunk) * 16);
  }

  // Given addr = tile + offset(row, c) with c in {0, 1} and a kTileAlign-aligned tile, the
  // address tile + offset(row, 2 * pair + c): one instruction instead of redoing the swizzle.
  // Why it holds (swizzled): 2*pair + c == (2*pair) ^ c, so the physical chunk
  // (2*pair + c) ^ (row & 7) is (c ^ (row & 7)) ^ (2*pair); and tile + row * kRowBytes has
  // zero bits where the chunk index sits (bits 4 .. 4 + log2(kChunks) - 1), so XOR-ing the
  // chunk index is XOR-ing the address with (2*pair) << 4. Adding a multiple of 8 rows to
  // `row` keeps row & 7, so row steps are plain additions (folded into ldmatrix offsets).
  static __host__ __device__ constexpr uint32_t pair_step(uint32_t addr, int pair) {
    return kSwizzle ? (addr ^ static_cast<uint32_t>(pair << 5))
                    : addr + static_cast<uint32_t>(pair << 5);
  }

  // Compile-time proof of pair_step for every row residue, c and pair (tile at 0 and at an
  // aligned non-zero base).
  static constexpr bool pair_step_is_offset() {
    for (int b = 0; b < 2; ++b) {
      const uint32_t base = b * 7u * kTileAlign;
      for (int row = 0; row < 16; ++row)
        for (int c = 0; c < 2; ++c)
          for (int pair = 0; pair < kChunks / 2; ++pair)
            if (pair_step(base + offset(row, c), pair) != base + offset(row, 2 * pair + c))
              return false;
    }
    return true;
  }
};

// Bytes of the row statistics in shared memory (kStatsInSmem): per thread and m16 tile one
// float4 {max row g, max row g+8, sum row g, sum row g+8}, laid out [m tile][thread] so that
// a warp's 16-byte accesses are contiguous (no bank conflicts).
template <typename Cfg>
constexpr int stats_bytes() {
  return Cfg::kStatsInSmem ? Cfg::kMTiles * Cfg::kThreads * 16 : 0;
}

// Q, K and V tiles, the statistics, and kTileAlign bytes of slack so the kernel can round its
// base up to kTileAlign.
template <typename Cfg>
constexpr int smem_bytes() {
  using Smem = SmemLayout<Cfg::kHeadDim>;
  static_assert(Smem::pair_step_is_offset(), "pair_step must agree with offset");
  static_assert(!Smem::kSwizzle || ((Cfg::kBlockM * Smem::kRowBytes) % Smem::kTileAlign == 0 &&
                                    (Cfg::kBlockN * Smem::kRowBytes) % Smem::kTileAlign == 0 &&
                                    Smem::kTileAlign % Smem::kRowBytes == 0),
                "swizzled tiles start kTileAlign-aligned");
  return (Cfg::kBlockM + 2 * Cfg::kBlockN) * Smem::kRowBytes + stats_bytes<Cfg>() +
         Smem::kTileAlign;
}

// ---------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------

// threadIdx.x read afresh: volatile, so the compiler can neither hoist it nor what is computed
// from it (load addresses, mask rows) out of the key loop, where such loop-invariant values
// would hold registers through the whole loop; recomputing them per tile costs a few integer
// instructions, while the registers are what the 255-register budget is short of.
__device__ __forceinline__ int thread_index_fresh() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  return tid;
}

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16 bytes global -> shared, bypassing L1 (.cg). With pred false, src-size 0 makes the
// hardware write 16 zero bytes and read nothing; the caller still passes a valid address.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the row addresses of matrix i,
// and register i receives matrix i: lane l holds row l/4, columns 2*(l%4) and 2*(l%4)+1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same, transposed: lane l receives rows 2*(l%4), 2*(l%4)+1 of column l/4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// exp2 on the special-function unit (MUFU.EX2); exp2(-inf) = +0, which the masks rely on.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The element type's two operations: D += A*B on tensor cores, and packing two fp32 values
// into one 32-bit register of two 16-bit values (the first one in the low half, which is
// the lower column index in every mma fragment).
template <typename Element>
struct ElementOps;

template <>
struct ElementOps<__half> {
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // .x = lo (low 16 bits), .y = hi
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

template <>
struct ElementOps<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

// 16 bytes global -> shared when the source is known to be in bounds (no zero-fill operand).
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
}

// Copy rows [row0, row0 + kRows) of one head ([seq, head_dim], row stride `row_stride`) into
// a shared tile, 16 bytes per cp.async. Rows >= seq and columns >= head_dim are zero-filled:
// zero keys give finite scores (masked afterwards) and zero values add nothing, whereas
// stale shared memory could hold NaN, and 0 * NaN = NaN. `any_valid` is any readable address
// (the tensor's start, straight from the kernel parameters: no register): zero-filled copies
// read nothing, but are still given an address inside the allocation.
template <typename Cfg, int kRows, typename Element>
__device__ __forceinline__ void load_tile(uint32_t smem_tile, const Element* head_base,
                                          const void* any_valid, int64_t row_stride, int row0,
                                          int seq, int head_dim, int tid) {
  using Smem = SmemLayout<Cfg::kHeadDim>;
  constexpr int kChunks = Smem::kChunks;
  constexpr int kThreads = Cfg::kThreads;
  // Every tile but the last one (and any head_dim that fills the kernel's) is in bounds.
  const bool in_bounds = row0 + kRows <= seq && head_dim == Cfg::kHeadDim;
  if constexpr (kThreads % kChunks == 0 && kRows % (kThreads / kChunks) == 0 &&
                (!Smem::kSwizzle || (kThreads / kChunks) % 8 == 0)) {
    // Each thread keeps one column chunk and steps down the rows by kRowStep, a multiple of
    // 8 where the layout is swizzled (so row % 8, hence the swizzle, stays the same): the
    // addresses of its copies are one base plus constant (shared) or uniform (global) steps.
    constexpr int kRowStep = kThreads / kChunks;
    constexpr int kIters = kRows / kRowStep;
    const int row = tid / kChunks;
    const int chunk = tid % kChunks;
    const Element* src = head_base + (row0 + row) * row_stride + chunk * 8;
    const uint32_t dst = smem_tile + Smem::offset(row, chunk);
    if (in_bounds) {
#pragma unroll
      for (int i = 0; i < kIters; ++i)
        cp_async_16(dst + i * kRowStep * Smem::kRowBytes, src + i * kRowStep * row_stride);
    } else {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const bool pred = row0 + row + i * kRowStep < seq && chunk * 8 < head_dim;
        cp_async_16(dst + i * kRowStep * Smem::kRowBytes,
                    pred ? static_cast<const void*>(src + i * kRowStep * row_stride) : any_valid,
                    pred);
      }
    }
  } else {
    // General case (e.g. head dim 96: 12 chunks per row do not divide the thread count).
    constexpr int kTotal = kRows * kChunks;
    constexpr int kIters = (kTotal + kThreads - 1) / kThreads;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = tid + i * kThreads;
      if (kTotal % kThreads != 0 && idx >= kTotal) break;
      const int row = idx / kChunks;
      const int chunk = idx % kChunks;
      const bool pred = in_bounds || (row0 + row < seq && chunk * 8 < head_dim);
      const void* src = pred ? static_cast<const void*>(head_base + (row0 + row) * row_stride +
                                                        chunk * 8)
                             : any_valid;
      cp_async_16(smem_tile + Smem::offset(row, chunk), src, pred);
    }
  }
}

// ---------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------

// What one CTA needs in the key loop (uniform over the CTA).
template <typename Element>
struct CtaTiles {
  const Element* k_head;  // K and V of this (batch, head)
  const Element* v_head;
  uint32_t smem_q, smem_k, smem_v;  // shared tiles, kTileAlign-aligned
  float* stats;                     // shared row statistics (kStatsInSmem), else unused
  int m_start;                      // first query row of the tile
  int n_block_min;                  // the lowest key tile any row of the tile sees
  int n_block_unmasked_begin;       // key tiles in [begin, end) need no elementwise mask
  int n_block_unmasked_end;
};

// This lane's ldmatrix addresses (see ldmatrix_x4 for which lanes address which matrix), of
// chunk 0 or 1 of the lane's row; pair_step moves them along the row, and multiples of 16
// rows are added as constants. Warp w owns query rows [w * kRowsPerWarp, +kRowsPerWarp).
template <typename Cfg>
struct LaneAddresses {
  uint32_t q, k, v;
  template <typename Element>
  __device__ __forceinline__ LaneAddresses(const CtaTiles<Element>& cta, int tid) {
    using Smem = SmemLayout<Cfg::kHeadDim>;
    const int lane = tid & 31;
    // Q, the A operand (16x16, row-major): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) in
    // the order a0 a1 a2 a3 = (r0-7,k0-7) (r8-15,k0-7) (r0-7,k8-15) (r8-15,k8-15).
    q = cta.smem_q + Smem::offset((tid >> 5) * Cfg::kRowsPerWarp + (lane & 15), lane >> 4);
    // K, the B operand of S (".col" = K stored [key][d]): matrices (keys 0-7,d 0-7)
    // (keys 0-7,d 8-15) (keys 8-15,d 0-7) (keys 8-15,d 8-15) = b0 b1 of n8 tile 2i, of 2i+1.
    k = cta.smem_k + Smem::offset((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    // V, the B operand of P V (V stored [key][d], read transposed): matrices (keys 0-7,d 0-7)
    // (keys 8-15,d 0-7) (keys 0-7,d 8-15) (keys 8-15,d 8-15) = b0 b1 of d tile 2i, of 2i+1.
    v = cta.smem_v + Smem::offset((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
  }
};

// The running state of one warp's rows, carried from key tile to key tile.
template <typename Cfg>
struct RowState {
  // O accumulator fragments (m16n8, fp32): lane l holds rows g = l/4 and g + 8 of each m16
  // tile, columns 2*(l%4) and 2*(l%4)+1 of each n8 tile: [0], [1] on row g, [2], [3] on g + 8.
  float o[Cfg::kMTiles][Cfg::kHeadDim / 8][4];
  // Running max of the raw scores of rows g and g + 8, and this lane's share of the running
  // sum (the quad's 4 shares are added at the end). In registers unless kStatsInSmem.
  float row_max[Cfg::kStatsInSmem ? 1 : Cfg::kMTiles][2];
  float row_sum[Cfg::kStatsInSmem ? 1 : Cfg::kMTiles][2];
};

template <typename Cfg>
__device__ __forceinline__ float4* stats_slot(float* stats, int mt, int tid) {
  return reinterpret_cast<float4*>(stats) + mt * Cfg::kThreads + tid;
}

// Zero the output, -inf / 0 the statistics.
template <typename Cfg>
__device__ __forceinline__ void init_row_state(RowState<Cfg>& st, float* stats, int tid) {
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < Cfg::kHeadDim / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[mt][j][e] = 0.f;
    if constexpr (Cfg::kStatsInSmem) {
      *stats_slot<Cfg>(stats, mt, tid) = make_float4(-INFINITY, -INFINITY, 0.f, 0.f);
    } else {
      st.row_max[mt][0] = st.row_max[mt][1] = -INFINITY;
      st.row_sum[mt][0] = st.row_sum[mt][1] = 0.f;
    }
  }
}

// One key tile: S = Q K^T, the mask (on the tiles that need it), online softmax, O += P V,
// with the loads of V[n_block] and K[n_block - 1] overlapped. __forceinline__ so that the state arrays stay in
// registers (every index below is a compile-time constant after unrolling).
template <typename Element, typename Cfg, bool kGeneral, typename QFrag>
__device__ __forceinline__ void process_key_tile(const Params& p, const CtaTiles<Element>& cta,
                                                 const QFrag& q_frag, RowState<Cfg>& st,
                                                 int n_block) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (beyond the graded course): one key/value tile on tensor cores.
  // HINT: S = Q K^T with mma.sync m16n8k16 (K fragments by ldmatrix from shared memory), the
  // HINT: causal/tail mask on tiles that cross the diagonal or the sequence end, the online
  // HINT: softmax per row over the quad of lanes that share it (exp2 with the scale folded in),
  // HINT: then O += P V with the S accumulators repacked as the A operand (V by ldmatrix.trans).
  using Smem = SmemLayout<Cfg::kHeadDim>;
  using Ops = ElementOps<Element>;
  constexpr int kMTiles = Cfg::kMTiles;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kNTiles = kBlockN / 8;          // n8 tiles of S
  constexpr int kQKSteps = Cfg::kHeadDim / 16;  // k16 steps of S = Q K^T
  constexpr int kPVSteps = kBlockN / 16;        // k16 steps of O += P V
  constexpr int kDTiles = Cfg::kHeadDim / 8;    // n8 tiles of O
  constexpr uint32_t kRows16 = 16 * Smem::kRowBytes;  // 16 rows, in bytes

  // Everything derived from the thread index is recomputed here, per tile: see
  // thread_index_fresh.
  const int tid = thread_index_fresh();
  const LaneAddresses<Cfg> lane_addr(cta, tid);

  // K[n_block] has landed for every thread, and every warp is done with V[n_block + 1].
  cp_async_wait<0>();
  __syncthreads();
  load_tile<Cfg, kBlockN>(cta.smem_v, cta.v_head, p.v, p.v_row_stride, n_block * kBlockN, p.seq_k,
                          p.head_dim, tid);
  cp_async_commit();

  // ---- S = Q K^T (fp32) ----
  float s[kMTiles][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kQKSteps; ++kk) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (Cfg::kQInRegs) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[mt][r] = q_frag[mt][kk][r];
      } else {
        ldmatrix_x4(a[mt], Smem::pair_step(lane_addr.q, kk) + mt * kRows16);
      }
    }
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];  // b0 b1 of n8 tile 2*np, then of 2*np + 1
      ldmatrix_x4(b, Smem::pair_step(lane_addr.k, kk) + np * kRows16);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        Ops::mma(s[mt][2 * np], a[mt], b[0], b[1]);
        Ops::mma(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }

  // ---- softcap (Gemma-2): every visited tile's raw scores, before the mask adds its bias.
  // A uniform branch of the general instantiation only: the dense kernels have no such code.
  if constexpr (kGeneral) {
    if (p.mask.softcap > 0.0) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][j][e] = attn::softcap_score(s[mt][j][e], p.mask);
    }
  }

  // ---- mask: the one predicate of attention_mask.cuh (sequence end, causal, window,
  // lengths, stride, mask tensor), only on the tiles that need it (a uniform branch): the
  // tail tile and the tiles across the diagonal or the window's edge.
  // (Dense attention has no lower edge: tiles below unmasked_begin do not exist.)
  if ((kGeneral && n_block < cta.n_block_unmasked_begin) || n_block >= cta.n_block_unmasked_end) {
    const int64_t bh = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
    const attn::KeyMask<kGeneral> mask(p.mask, bh / p.heads, bh % p.heads);
    const int lane = tid & 31;
    const int row_base = cta.m_start + (tid >> 5) * Cfg::kRowsPerWarp + (lane >> 2);
    const int col0 = n_block * kBlockN + 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_base + mt * 16 + h * 8;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            s[mt][j][2 * h + e] = mask.apply(s[mt][j][2 * h + e], row, col0 + j * 8 + e);
      }
  }

  // V[n_block] has landed for every thread, and every warp is done reading K[n_block]: K's
  // buffer is free, and K[n_block - 1] loads during the softmax and P V.
  cp_async_wait<0>();
  __syncthreads();
  if (n_block > (kGeneral ? cta.n_block_min : 0)) {
    load_tile<Cfg, kBlockN>(cta.smem_k, cta.k_head, p.k, p.k_row_stride, (n_block - 1) * kBlockN,
                            p.seq_k, p.head_dim, tid);
    cp_async_commit();
  }

  // ---- online softmax (the softmax scale folded into exp2) ----
  const float scale_log2 = p.scale_log2;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    float row_max[2], row_sum[2];
    if constexpr (Cfg::kStatsInSmem) {
      const float4 stats = *stats_slot<Cfg>(cta.stats, mt, tid);
      row_max[0] = stats.x;
      row_max[1] = stats.y;
      row_sum[0] = stats.z;
      row_sum[1] = stats.w;
    } else {
      row_max[0] = st.row_max[mt][0];
      row_max[1] = st.row_max[mt][1];
      row_sum[0] = st.row_sum[mt][0];
      row_sum[1] = st.row_sum[mt][1];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_new = row_max[h];
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
        m_new = fmaxf(m_new, fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]));
      // The 4 lanes of a quad hold the 4 column pairs of the same two rows.
      m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
      m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
      // A row with no visible key yet (causal, first tiles) keeps m = -inf: subtract 0
      // instead, so that exp2(-inf - (-inf)) = NaN never happens; its p and correction are
      // then exp2(-inf) = 0, and its o and l stay 0.
      const float m_scaled = m_new == -INFINITY ? 0.f : m_new * scale_log2;
      const float correction = exp2_approx(fmaf(row_max[h], scale_log2, -m_scaled));
      row_max[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const float p0 = exp2_approx(fmaf(s[mt][j][2 * h], scale_log2, -m_scaled));
        const float p1 = exp2_approx(fmaf(s[mt][j][2 * h + 1], scale_log2, -m_scaled));
        s[mt][j][2 * h] = p0;
        s[mt][j][2 * h + 1] = p1;
        sum += p0 + p1;
      }
      row_sum[h] = row_sum[h] * correction + sum;
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        st.o[mt][j][2 * h] *= correction;
        st.o[mt][j][2 * h + 1] *= correction;
      }
    }
    if constexpr (Cfg::kStatsInSmem) {
      *stats_slot<Cfg>(cta.stats, mt, tid) =
          make_float4(row_max[0], row_max[1], row_sum[0], row_sum[1]);
    } else {
      st.row_max[mt][0] = row_max[0];
      st.row_max[mt][1] = row_max[1];
      st.row_sum[mt][0] = row_sum[0];
      st.row_sum[mt][1] = row_sum[1];
    }
  }

  // ---- O += P V ----
  // For the k16 step kk (keys 16kk .. 16kk+15) the A fragment of P is the accumulator of the
  // n8 tiles 2kk (a0: row g, a1: row g + 8) and 2kk + 1 (a2: row g, a3: row g + 8), rounded.
#pragma unroll
  for (int kk = 0; kk < kPVSteps; ++kk) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      a[mt][0] = Ops::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      a[mt][1] = Ops::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      a[mt][2] = Ops::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      a[mt][3] = Ops::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      uint32_t b[4];  // b0 b1 of d tile 2*dp, then of 2*dp + 1
      ldmatrix_x4_trans(b, Smem::pair_step(lane_addr.v, dp) + kk * kRows16);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        Ops::mma(st.o[mt][2 * dp], a[mt], b[0], b[1]);
        Ops::mma(st.o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
  // END SOLUTION
}

template <typename Element, typename Cfg, bool kGeneral>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSM)
    flash_attention_mma_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: load this CTA's Q tile (cp.async), walk the key/value tiles with
  // HINT: process_key_tile while the next tile loads, then write O / l for the rows < seq.
  // HINT: (in float32 to p.out_float instead when it is set: a split decode's partials), and
  // HINT: each row's base-2 log-sum-exp to p.lse when it is set.
  using Smem = SmemLayout<Cfg::kHeadDim>;
  using Ops = ElementOps<Element>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kMTiles = Cfg::kMTiles;
  constexpr int kQKSteps = Cfg::kHeadDim / 16;
  constexpr int kDTiles = Cfg::kHeadDim / 8;
  constexpr uint32_t kRows16 = 16 * Smem::kRowBytes;

  extern __shared__ __align__(128) unsigned char smem_raw[];

  // Grid: x = query tiles (fastest, so the CTAs resident together share one head's K/V in
  // L2), y/z = batch * heads split under the 65535 limit of gridDim.y.
  const int64_t bh = static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y;
  if (bh >= p.batch_heads) return;  // whole CTA, before any barrier
  const int64_t batch = bh / p.heads;
  const int64_t head = bh % p.heads;
  // Heaviest query tiles first: under the causal mask the last tiles see the most keys, and
  // starting them first keeps the final wave short.
  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int seq_q = p.seq_q;
  const int tid = threadIdx.x;

  CtaTiles<Element> cta;
  cta.m_start = m_block * kBlockM;
  const int64_t kv_head = head / p.kv_group;  // GQA: the query heads of a group share K/V
  cta.k_head = static_cast<const Element*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
  cta.v_head = static_cast<const Element*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
  const Element* q_head =
      static_cast<const Element*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;

  // Round the base up to kTileAlign (smem_bytes reserved the slack) so pair_step holds.
  const uint32_t smem_raw_u32 = smem_u32(smem_raw);
  const uint32_t smem_q =
      (smem_raw_u32 + (Smem::kTileAlign - 1)) & ~static_cast<uint32_t>(Smem::kTileAlign - 1);
  unsigned char* smem_q_ptr = smem_raw + (smem_q - smem_raw_u32);  // smem_q, as a pointer
  cta.smem_q = smem_q;
  cta.smem_k = smem_q + kBlockM * Smem::kRowBytes;
  cta.smem_v = cta.smem_k + kBlockN * Smem::kRowBytes;
  cta.stats = reinterpret_cast<float*>(smem_q_ptr + (kBlockM + 2 * kBlockN) * Smem::kRowBytes);

  // Key tiles [n_block_min, n_block_max) hold every key some row of this query tile may see
  // (causal: up to its last row; a window: from its first row's window on). Tiles in
  // [unmasked_begin, unmasked_end) are visible to every row: no elementwise mask there.
  int n_block_min, n_block_max;
  {
    const attn::KeyMask<kGeneral> mask(p.mask, batch, head);
    const int q_last = cta.m_start + kBlockM - 1;
    n_block_min = max(mask.keys_begin(cta.m_start), 0) / kBlockN;
    n_block_max = (mask.keys_end(q_last) + kBlockN - 1) / kBlockN;
    n_block_max = max(n_block_max, n_block_min);  // no visible key: no tile, the rows are 0
    const int2 unmasked = mask.unmasked_keys(cta.m_start, q_last);
    cta.n_block_unmasked_begin = (unmasked.x + kBlockN - 1) / kBlockN;
    cta.n_block_unmasked_end = unmasked.y >= unmasked.x ? unmasked.y / kBlockN : 0;
  }
  cta.n_block_min = n_block_min;

  // Prologue: Q and the first (highest) K tile in flight, as two commit groups (the second
  // empty when no key is visible, so that the waits below count the same).
  load_tile<Cfg, kBlockM>(smem_q, q_head, p.q, p.q_row_stride, cta.m_start, seq_q, p.head_dim, tid);
  cp_async_commit();
  if (n_block_max > n_block_min)
    load_tile<Cfg, kBlockN>(cta.smem_k, cta.k_head, p.k, p.k_row_stride, (n_block_max - 1) * kBlockN,
                            p.seq_k, p.head_dim, tid);
  cp_async_commit();

  uint32_t q_frag[Cfg::kQInRegs ? kMTiles : 1][Cfg::kQInRegs ? kQKSteps : 1][4];
  if constexpr (Cfg::kQInRegs) {
    cp_async_wait<1>();  // the Q group has landed (K may still be in flight) ...
    __syncthreads();     // ... for every thread's share of it
    const LaneAddresses<Cfg> lane_addr(cta, tid);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int kk = 0; kk < kQKSteps; ++kk)
        ldmatrix_x4(q_frag[mt][kk], Smem::pair_step(lane_addr.q, kk) + mt * kRows16);
  } else {
    q_frag[0][0][0] = q_frag[0][0][1] = q_frag[0][0][2] = q_frag[0][0][3] = 0u;  // unused
  }

  RowState<Cfg> st;
  init_row_state<Cfg>(st, cta.stats, tid);

  // Key tiles from the last down to the first: the masked ones (the tail tile, the tiles
  // across the diagonal) come first.
  for (int n_block = n_block_max - 1; n_block >= (kGeneral ? n_block_min : 0); --n_block)
    process_key_tile<Element, Cfg, kGeneral>(p, cta, q_frag, st, n_block);

  // ---- epilogue: O / l -> Element, staged through this warp's rows of the Q buffer ----
  // No cp.async is in flight (the last tile loads no K and waited for V). Each warp only
  // ever read its own rows of Q, so a warp barrier is enough before overwriting them. A tile
  // that saw no key at all (every row's keys masked away) never waited for its Q copies:
  // they must land before the staging overwrites them.
  if (n_block_max == n_block_min) {
    cp_async_wait<0>();
    __syncthreads();
  }
  __syncwarp();
  const int lane = tid & 31;
  const int warp_row0 = (tid >> 5) * Cfg::kRowsPerWarp;  // this warp's first row in the tile
  const int g = lane >> 2;
  const int t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    float row_sum[2], row_max[2];
    if constexpr (Cfg::kStatsInSmem) {
      const float4 stats = *stats_slot<Cfg>(cta.stats, mt, tid);
      row_max[0] = stats.x;
      row_max[1] = stats.y;
      row_sum[0] = stats.z;
      row_sum[1] = stats.w;
    } else {
      row_max[0] = st.row_max[mt][0];
      row_max[1] = st.row_max[mt][1];
      row_sum[0] = st.row_sum[mt][0];
      row_sum[1] = st.row_sum[mt][1];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      // l >= 1 for a row that saw a key (its maximum contributes exp2(0) = 1); 0 otherwise.
      float inv_l = l > 0.f ? __fdividef(1.f, l) : 0.f;
      // An attention sink joins the max and the denominator once, here: O's factor becomes
      // keys / total, and the lse top + log2(total) (attn::sink_term; base 2).
      [[maybe_unused]] float sink_top = 0.f, sink_total = 0.f;
      if constexpr (kGeneral) {
        if (p.mask.sinks != nullptr) {
          const auto sink = attn::sink_term(p.mask.sinks[head], row_max[h] * p.scale_log2);
          sink_top = sink.top;
          sink_total = fmaf(l, sink.keys, sink.sink);
          inv_l = sink_total > 0.f ? sink.keys / sink_total : 0.f;
        }
      }
      const int row = warp_row0 + mt * 16 + g + h * 8;
      // Optional: the row's log-sum-exp in base 2 (what a split-KV decode needs to merge the
      // results of several key ranges); -inf for a row without a visible key (nor sink).
      if (p.lse != nullptr && t == 0 && cta.m_start + row < seq_q) {
        float lse2 = l > 0.f ? fmaf(row_max[h], p.scale_log2, __log2f(l)) : -INFINITY;
        if constexpr (kGeneral) {
          if (p.mask.sinks != nullptr)
            lse2 = sink_total > 0.f ? sink_top + __log2f(sink_total) : -INFINITY;
        }
        p.lse[(static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * seq_q + cta.m_start + row] =
            lse2;
      }
      if (p.out_float != nullptr) {  // float32 partials: straight from the registers
        if (cta.m_start + row < seq_q) {
          float* o_row = p.out_float + batch * p.o_batch_stride + head * p.o_head_stride +
                         static_cast<int64_t>(cta.m_start + row) * p.o_row_stride;
#pragma unroll
          for (int j = 0; j < kDTiles; ++j)
            if (8 * j + 2 * t < p.head_dim)
              *reinterpret_cast<float2*>(o_row + 8 * j + 2 * t) =
                  make_float2(st.o[mt][j][2 * h] * inv_l, st.o[mt][j][2 * h + 1] * inv_l);
        }
        continue;
      }
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        const uint32_t packed =
            Ops::pack(st.o[mt][j][2 * h] * inv_l, st.o[mt][j][2 * h + 1] * inv_l);
        // columns 8j + 2t, 8j + 2t + 1 = chunk j, bytes 4t .. 4t + 3
        *reinterpret_cast<uint32_t*>(smem_q_ptr + Smem::offset(row, j) + 4 * t) = packed;
      }
    }
  }
  if (p.out_float != nullptr) return;
  __syncwarp();
  // 16-byte coalesced stores of this warp's rows; rows >= seq and columns >= head_dim are
  // never written.
  Element* o_head =
      static_cast<Element*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride;
  constexpr int kOutChunks = Cfg::kRowsPerWarp * Smem::kChunks;
  static_assert(kOutChunks % 32 == 0, "whole warp iterations");
#pragma unroll
  for (int i = 0; i < kOutChunks / 32; ++i) {
    const int idx = lane + i * 32;
    const int row = warp_row0 + idx / Smem::kChunks;
    const int chunk = idx % Smem::kChunks;
    const int grow = cta.m_start + row;
    if (grow < seq_q && chunk * 8 < p.head_dim) {
      const uint4 value = *reinterpret_cast<const uint4*>(smem_q_ptr + Smem::offset(row, chunk));
      *reinterpret_cast<uint4*>(o_head + grow * p.o_row_stride + chunk * 8) = value;
    }
  }
  // END SOLUTION
#else
  // Built for a GPU older than sm_80 (no cp.async, no bf16 mma): the host refuses to launch.
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------
// Launch (host)
// ---------------------------------------------------------------------------------------

// Launch one instantiation on `stream`. Returns an error string, or nullptr on success (the
// caller turns it into a Python exception with attn::check_launch and TORCH_CHECK).
template <typename Element, typename Cfg, bool kGeneral = false>
const char* launch_flash_attention_mma(const Params& p, cudaStream_t stream) {
  constexpr int kSmem = smem_bytes<Cfg>();
  auto kernel = flash_attention_mma_kernel<Element, Cfg, kGeneral>;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return "cudaGetDevice failed";
  if (kSmem > 48 * 1024) {
    // Above 48 KB a kernel must opt in to more dynamic shared memory, once per device.
    static unsigned long long configured = 0;  // bit d: done on device d (d < 64)
    const unsigned long long bit = device < 64 ? (1ull << device) : 0ull;
    if (bit == 0 || !(__atomic_load_n(&configured, __ATOMIC_ACQUIRE) & bit)) {
      int optin = 0;
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      if (optin < kSmem) return "the GPU has less shared memory per block than this tile needs";
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) !=
          cudaSuccess)
        return "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed";
      __atomic_fetch_or(&configured, bit, __ATOMIC_ACQ_REL);
    }
  }
  const int num_m_blocks = static_cast<int>((p.seq_q + Cfg::kBlockM - 1) / Cfg::kBlockM);
  constexpr int64_t kMaxGridY = 65535;
  const int64_t grid_y = p.batch_heads < kMaxGridY ? p.batch_heads : kMaxGridY;
  const int64_t grid_z = (p.batch_heads + kMaxGridY - 1) / kMaxGridY;
  if (grid_z > kMaxGridY) return "batch * heads exceeds 65535 * 65535";
  const dim3 grid(num_m_blocks, static_cast<unsigned>(grid_y), static_cast<unsigned>(grid_z));
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  return nullptr;
}

// ---------------------------------------------------------------------------------------
// The configurations (ATTN_MMA_CONFIG=<index> picks one; unset = 0). Mirrored, for printing
// only, by CONFIGS in task4/mma_checks.py: keep the two in step.
// ---------------------------------------------------------------------------------------
//                              head_dim blockM blockN warps Q-in-regs stats-in-smem CTAs/SM
// head_dim 128: 0 = FlashAttention-2's tile (128 x 64, 4 warps of 32 rows, Q re-read from
// shared memory, 2 CTAs = 8 warps per SM); 1 = 8 warps of 16 rows with Q in registers (1 CTA
// per SM); 2 = 64 x 64, 4 warps of 16 rows, Q in registers, 168 registers so that 3 CTAs =
// 12 warps fit per SM (more warps to hide latency, twice the K/V traffic per query row).
using ConfigD128_0 = TileConfig<128, 128, 64, 4, false, true, 2>;
using ConfigD128_1 = TileConfig<128, 128, 64, 8, true, false, 1>;
using ConfigD128_2 = TileConfig<128, 64, 64, 4, true, true, 3>;
// head_dim 64: 0 = FlashAttention-2's tile (128 x 128, 4 warps of 32 rows, Q from shared
// memory); 1 = 128 x 64 with Q in registers; 2 = 8 warps of 16 rows with Q in registers.
using ConfigD64_0 = TileConfig<64, 128, 128, 4, false, false, 2>;
using ConfigD64_1 = TileConfig<64, 128, 64, 4, true, false, 2>;
using ConfigD64_2 = TileConfig<64, 128, 128, 8, true, false, 1>;
// head_dim 32 and 96: one configuration each.
using ConfigD32_0 = TileConfig<32, 128, 128, 4, true, false, 2>;
using ConfigD96_0 = TileConfig<96, 128, 64, 4, false, false, 2>;
// head_dim 192 and 256 (every head dim above 128: the next one up, zero-filled): a warp's O
// is 16 rows x 256 fp32 = 128 registers per thread, so 4 warps of 16 rows (not 32), Q re-read
// from shared memory, the row statistics in shared memory; 64 x 64 tiles at 192, 64 x 32 at
// 256 (with 64 keys ptxas spilled the dense instantiation at 256). One configuration each,
// dense and general alike: no spills at sm_90.
using ConfigD192_0 = TileConfig<192, 64, 64, 4, false, true, 2>;
using ConfigD256_0 = TileConfig<256, 64, 32, 4, false, true, 2>;

// Patterns beyond causal (window, stride, lengths, a mask tensor) evaluate a longer predicate
// on their masked tiles, whose registers the 32-rows-per-warp tiles above do not have (ptxas
// spilled hundreds of bytes): they run 4 warps of 16 query rows on 64 x 64 tiles.
using ConfigD128_G = TileConfig<128, 64, 64, 4, true, true, 2>;
using ConfigD96_G = TileConfig<96, 64, 64, 4, true, true, 2>;
using ConfigD64_G = TileConfig<64, 64, 64, 4, true, false, 2>;
using ConfigD32_G = TileConfig<32, 64, 64, 4, true, false, 2>;
using ConfigD192_G = ConfigD192_0;
using ConfigD256_G = ConfigD256_0;

// At most 16 query rows (a decode step whose query heads share a KV head, packed as rows:
// task 5's grouped decode): one warp of 16 rows per CTA, so that a tile's tensor-core work is
// not 8x larger than its 8 real rows need, and many CTAs per SM keep K/V loads in flight.
using ConfigD128_Rows16 = TileConfig<128, 16, 64, 1, true, false, 4>;
using ConfigD64_Rows16 = TileConfig<64, 16, 64, 1, true, false, 4>;

constexpr int kNumConfigs = 3;  // per head dim 64 / 128; head dims 32, 96, 192, 256 always use 0

// One entry point per (element type, head dim), defined in flash_attention_mma_<dtype>.cu:
// `config` is already validated (0 .. kNumConfigs - 1).
const char* run_fp16_d32(const Params& p, int config, cudaStream_t stream);
const char* run_fp16_d64(const Params& p, int config, cudaStream_t stream);
const char* run_fp16_d96(const Params& p, int config, cudaStream_t stream);
const char* run_fp16_d128(const Params& p, int config, cudaStream_t stream);
const char* run_fp16_d192(const Params& p, int config, cudaStream_t stream);
const char* run_fp16_d256(const Params& p, int config, cudaStream_t stream);
const char* run_bf16_d32(const Params& p, int config, cudaStream_t stream);
const char* run_bf16_d64(const Params& p, int config, cudaStream_t stream);
const char* run_bf16_d96(const Params& p, int config, cudaStream_t stream);
const char* run_bf16_d128(const Params& p, int config, cudaStream_t stream);
const char* run_bf16_d192(const Params& p, int config, cudaStream_t stream);
const char* run_bf16_d256(const Params& p, int config, cudaStream_t stream);

// The body of each run_<dtype>_d<head_dim>: pick the instantiation. A pattern beyond causal
// (window, stride, lengths, a mask tensor) or a softcap or sinks runs the general
// instantiation on configuration G.
template <typename Element, typename CG, typename C0, typename C1 = C0, typename C2 = C0,
          typename C16 = C0>
const char* run_config(const Params& p, int config, cudaStream_t stream) {
  if (p.mask.general()) return launch_flash_attention_mma<Element, CG, true>(p, stream);
  if (p.seq_q <= 16 && config == 0) return launch_flash_attention_mma<Element, C16>(p, stream);
  switch (config) {
    case 1: return launch_flash_attention_mma<Element, C1>(p, stream);
    case 2: return launch_flash_attention_mma<Element, C2>(p, stream);
    default: return launch_flash_attention_mma<Element, C0>(p, stream);
  }
}

}  // namespace mma_attn
