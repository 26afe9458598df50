// Beyond the course (issue 33, not graded): FlashAttention-2's backward pass in fp32 on CUDA
// cores, the optional lesson after task 3's tile-by-tile version (task3/flash_backward.py).
//
// The idea. The forward saved its output O and, per query row, the log-sum-exp of the scores
// (base 2 here: lse2 = log2(sum_j 2^(s_ij * log2(e))), the unit of the tensor-core kernel's
// `lse` too; s_ij are the scaled logits). Given dO = dLoss/dO, Algorithm 2 of Dao (2023) gives
// dQ, dK and dV without the S x S matrix: every tile of P is recomputed from q, k and lse,
//
//   D_i  = rowsum(dO_i * O_i)                 preprocess: one warp per query row
//   P_ij = exp2(s_ij * log2(e) - lse2_i)      recomputed per tile (s from q . k in double)
//   dV_j += P_ij^T dO_i      dP_ij = dO_i V_j^T      dS_ij = P_ij * (dP_ij - D_i)
//   dK_j += dS_ij^T Q_i * scale              dQ_i += dS_ij K_j * scale
//
// One block owns a tile of keys and walks the query tiles (dK and dV stay in its registers),
// which is Algorithm 2's loop order. dQ_i sums over every key tile, so blocks that own
// different key tiles would all add into the same dQ rows.
//
// dQ: a separate pass, not atomics. A second kernel owns a tile of queries and walks the key
// tiles (the forward's loop order), recomputing P and dS to accumulate dQ in registers. It
// costs two more tile products (q . k and dO . v again: 7 products instead of 5, 1.4x the
// FLOPs of FlashAttention-2's atomics), and buys what atomics cannot: gradients that are
// bit-identical from run to run (issue 33 asks for a deterministic mode; this is the only
// mode), no fp32 accumulator to zero and convert, and no contention of many blocks adding
// into one row of dQ.
//
// GQA: the block that owns a tile of keys of KV head h_kv walks the query tiles of every query
// head of its group, so the sum of dK and dV over the group happens in its registers: no
// atomics, no [B, H_q, S_k, D] buffer to reduce afterwards, deterministic. (The price: a grid
// of B * H_kv key tiles instead of B * H_q, fewer blocks for small batches.)
//
// The tile shape and why. Both kernels are the forward's register tiling with the roles named
// "own rows" and "streamed rows": a block of 8 warps owns 64 rows (dK/dV: keys; dQ: queries)
// and streams tiles of 32 rows of the other side. A warp is 4 lanes across own rows x 8 lanes
// across streamed rows; a thread holds 2 own rows x 4 streamed rows of the score tile and the
// same 2 rows x head_dim / 8 columns of its accumulators (dK and dV: 64 floats at head_dim
// 128; dQ: 32). The scores are summed in double like the forward's (float scores round as
// much as PyTorch's fp32 and miss FlashAttention-2's criterion at large logits), and the
// exponent s * log2(e) - lse2 is taken in double; P, dP, dS and the accumulators are float.
// A thread's accumulator rows are its score rows, so P and dS travel through shared memory
// only inside a warp (__syncwarp, not __syncthreads). Shared memory at head_dim 128: own
// tiles 2 x 64 x 132 floats, streamed 2 x 32 x 132, P/dS 64 x 40: 112 KB (4 warps, 32 own
// rows, 73 KB, where that does not fit). The streamed tiles are not double-buffered: the
// loads overlap the math of the SM's other blocks where registers and shared memory let two
// share an SM (smaller head dims), and this is the lesson, kept short. Padding: rows +4
// floats, P/dS rows +8, as in the forward, so that the float4 reads of a warp hit distinct
// banks.
//
// Variants: the forward's, from attn::KeyMask (common/csrc/attention_mask.cuh): causal
// (bottom-right for S_q != S_k), GQA, windows, strides, bool or additive masks (the mask gets
// no gradient), per-sequence key lengths (also left-padded), a softmax scale, and a softcap
// (dS times the cap's slope 1 - tanh^2). Sinks need nothing here: the lse of the forward holds
// them, and they have no value. Key tiles and query tiles that the mask proves empty are never
// loaded (a block's query range is the inverse of KeyMask's key range, KeyMask::queries_seeing).
//
// Where its speed lives: Results.md, "The backward pass" (rendered from results/<gpu>.json;
// python -m task4.test --backward measures it against SDPA's efficient backend in fp32).

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "tensor_api.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_checks.cuh"
#include "attention_mask_host.cuh"
#include "device_query.cuh"
#include "fp32_tiles.cuh"

namespace {

using attn_fp32::component;
using attn_fp32::copy_async_commit;
using attn_fp32::copy_async_wait_all;
using attn_fp32::load_tile_async;

// ---------------------------------------------------------------------------------------
// Tile configuration and shared-memory layout
// ---------------------------------------------------------------------------------------

template <int NUM_WARPS, int ROWS_PER_THREAD, int COLS_PER_THREAD>
struct BwdConfig {
  static constexpr int num_warps = NUM_WARPS;
  static constexpr int threads = NUM_WARPS * 32;
  static constexpr int row_lanes = 4;  // lanes across own rows
  static constexpr int col_lanes = 8;  // lanes across streamed rows (low 3 bits of the lane)
  static constexpr int rows_per_thread = ROWS_PER_THREAD;
  static constexpr int cols_per_thread = COLS_PER_THREAD;
  static constexpr int rows_per_warp = row_lanes * ROWS_PER_THREAD;
  static constexpr int rows = NUM_WARPS * rows_per_warp;    // the block's own tile
  static constexpr int cols = col_lanes * COLS_PER_THREAD;  // a streamed tile
};

using BwdLarge = BwdConfig<8, 2, 4>;  // 64 own rows, 32 streamed (112 KB at head_dim 128)
using BwdSmall = BwdConfig<4, 2, 4>;  // 32 own rows, 32 streamed (73 KB at head_dim 128)

// Offsets (in floats) of the five tiles in dynamic shared memory: two own tiles (K and V, or Q
// and dO), two streamed tiles (Q and dO, or K and V) and the P/dS tile [own rows][streamed].
template <class Cfg, int HEAD_DIM_PAD>
struct BwdLayout {
  static constexpr int stride = HEAD_DIM_PAD + 4;    // every operand tile: 4 banks per row
  static constexpr int w_stride = Cfg::cols + 8;     // P/dS: the 4 row lanes 8 banks apart
  static constexpr int own_a = 0;
  static constexpr int own_b = own_a + Cfg::rows * stride;
  static constexpr int stream_a = own_b + Cfg::rows * stride;
  static constexpr int stream_b = stream_a + Cfg::cols * stride;
  static constexpr int weights = stream_b + Cfg::cols * stride;
  static constexpr int floats = weights + Cfg::rows * w_stride;
  static constexpr size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  static_assert(stride % 4 == 0 && w_stride % 4 == 0, "rows start on 16 bytes");
  static_assert(own_b % 4 == 0 && stream_a % 4 == 0 && stream_b % 4 == 0 && weights % 4 == 0,
                "tiles start on 16 bytes");
};

// Everything the three kernels need. q/k/v/d_out: any strides with a contiguous, 16-byte
// aligned last dimension (checked on the host); dq/dk/dv, lse2 and delta are contiguous.
struct BwdParams {
  const float* q;
  const float* k;
  const float* v;
  const float* out;
  const float* d_out;
  const float* lse;  // the forward's [B, H_q, S_q] base-2 lse, any strides
  float* lse2;       // [B, H_q, S_q]: lse, or +inf for a row that saw no key (its P is then 0)
  float* delta;      // [B, H_q, S_q]: D = rowsum(dO * O)
  float* dq;         // [B, H_q, S_q, head_dim]
  float* dk;         // [B, H_kv, S_k, head_dim]
  float* dv;
  int64_t q_stride_b, q_stride_h, q_stride_s;
  int64_t k_stride_b, k_stride_h, k_stride_s;
  int64_t v_stride_b, v_stride_h, v_stride_s;
  int64_t o_stride_b, o_stride_h, o_stride_s;
  int64_t do_stride_b, do_stride_h, do_stride_s;
  int64_t lse_stride_b, lse_stride_h, lse_stride_s;
  int batch, heads, kv_heads, kv_group;  // B, H_q, H_kv, H_q / H_kv
  int seq_q, seq_k, head_dim;
  float scale_log2;  // scale * log2(e), as the forward's (the lse was taken with it)
  float scale;       // the softmax scale: dK and dQ are scaled by it once, at the end
  attn::MaskParams mask;
};


// ---------------------------------------------------------------------------------------
// The preprocess: D = rowsum(dO * O) and the lse that P needs, one warp per query row
// ---------------------------------------------------------------------------------------

constexpr int kPreprocessWarps = 8;

__global__ void __launch_bounds__(kPreprocessWarps * 32)
    backward_preprocess_kernel(const BwdParams p) {
  // BEGIN SOLUTION kernel
  // HINT: Row r = blockIdx.x * kPreprocessWarps + warp (return if r >= batch * heads * seq_q):
  // HINT: batch r / (heads * seq_q), head (r / seq_q) % heads, query r % seq_q. The 32 lanes
  // HINT: walk head_dim (d = lane, lane + 32, ...) summing d_out * out in double, then reduce
  // HINT: over the warp (__shfl_xor_sync 16, 8, 4, 2, 1); lane 0 writes p.delta[r] and
  // HINT: p.lse2[r] = the forward's lse, or +INFINITY where it is -INFINITY (a row that saw no
  // HINT: key: its P = exp2(score - inf) = 0 instead of NaN).
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.seq_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kPreprocessWarps + warp;
  if (row >= rows) return;  // a whole warp returns together
  const int64_t batch = row / (static_cast<int64_t>(p.heads) * p.seq_q);
  const int64_t head = (row / p.seq_q) % p.heads;
  const int64_t query = row % p.seq_q;
  const float* out_row = p.out + batch * p.o_stride_b + head * p.o_stride_h + query * p.o_stride_s;
  const float* d_out_row =
      p.d_out + batch * p.do_stride_b + head * p.do_stride_h + query * p.do_stride_s;
  double sum = 0.0;
  for (int d = lane; d < p.head_dim; d += 32) sum = fma(double(out_row[d]), double(d_out_row[d]), sum);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    const float lse = p.lse[batch * p.lse_stride_b + head * p.lse_stride_h + query * p.lse_stride_s];
    p.delta[row] = static_cast<float>(sum);
    p.lse2[row] = lse == -INFINITY ? INFINITY : lse;
  }
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------
// The steps of one (own tile, streamed tile) pair, one device function each. Every function
// sees the tiles through this thread's coordinates: its own rows are first_row + row_lanes * i
// (i < rows_per_thread), its streamed rows col_lane + col_lanes * j (j < cols_per_thread), and
// its accumulator columns the float4 chunks c * 32 + col_lane * 4 (c < head_dim_pad / 32).
// ---------------------------------------------------------------------------------------

__device__ __forceinline__ float multiply_add(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double multiply_add(double a, double b, double c) { return fma(a, b, c); }

// acc[i][j] = own_tile[row i] . streamed_tile[row j] over head_dim, in Acc (double for the
// scores q . k, float for dP = dO . v).
template <class Cfg, int HEAD_DIM_PAD, class Acc>
__device__ __forceinline__ void dot_rows(Acc (&acc)[Cfg::rows_per_thread][Cfg::cols_per_thread],
                                         const float* own_tile, const float* streamed_tile,
                                         int first_row, int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: The forward's compute_scores with the tiles named own and streamed: zero acc, then
  // HINT: walk d 4 at a time; per step read one float4 of each of your own rows and of each of
  // HINT: your streamed rows (rows BwdLayout<Cfg, HEAD_DIM_PAD>::stride floats apart) and do the
  // HINT: 4 multiply-adds of every (own, streamed) pair in Acc (multiply_add on Acc(x) values).
  constexpr int stride = BwdLayout<Cfg, HEAD_DIM_PAD>::stride;
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::cols_per_thread; ++j) acc[i][j] = Acc(0);
#pragma unroll 4
  for (int d = 0; d < HEAD_DIM_PAD; d += 4) {
    float4 own[Cfg::rows_per_thread];
#pragma unroll
    for (int i = 0; i < Cfg::rows_per_thread; ++i)
      own[i] = *reinterpret_cast<const float4*>(
          own_tile + (first_row + Cfg::row_lanes * i) * stride + d);
#pragma unroll
    for (int j = 0; j < Cfg::cols_per_thread; ++j) {
      const float4 other = *reinterpret_cast<const float4*>(
          streamed_tile + (col_lane + Cfg::col_lanes * j) * stride + d);
#pragma unroll
      for (int i = 0; i < Cfg::rows_per_thread; ++i) {
        acc[i][j] = multiply_add(Acc(own[i].x), Acc(other.x), acc[i][j]);
        acc[i][j] = multiply_add(Acc(own[i].y), Acc(other.y), acc[i][j]);
        acc[i][j] = multiply_add(Acc(own[i].z), Acc(other.z), acc[i][j]);
        acc[i][j] = multiply_add(Acc(own[i].w), Acc(other.w), acc[i][j]);
      }
    }
  }
  // END SOLUTION
}

// The probabilities of this thread's scores: the softcap (general instantiation), the mask
// where `apply_mask`, then P = exp2(score * scale_log2 - lse2 of the query) with the exponent
// in double; `slope` receives the softcap's derivative 1 - tanh^2 (1 without a softcap).
// kRowsAreKeys: the dK/dV kernel (own rows are keys, streamed rows queries) or the dQ kernel
// (the other way round); `own_start` and `streamed_start` are the tiles' first positions, and
// `query_lse2` holds the lse of this thread's queries (indexed j or i accordingly).
template <class Cfg, bool kGeneral, bool kRowsAreKeys>
__device__ __forceinline__ void recompute_probabilities(
    const double (&score)[Cfg::rows_per_thread][Cfg::cols_per_thread],
    float (&prob)[Cfg::rows_per_thread][Cfg::cols_per_thread],
    float (&slope)[Cfg::rows_per_thread][Cfg::cols_per_thread],
    const float (&query_lse2)[kRowsAreKeys ? Cfg::cols_per_thread : Cfg::rows_per_thread],
    const attn::KeyMask<kGeneral>& mask, const attn::MaskParams& mask_params, bool apply_mask,
    int own_start, int streamed_start, int first_row, int col_lane, float scale_log2) {
  // BEGIN SOLUTION kernel
  // HINT: For each (i, j): own position own_start + first_row + Cfg::row_lanes * i, streamed
  // HINT: position streamed_start + col_lane + Cfg::col_lanes * j; the query is the streamed one
  // HINT: when kRowsAreKeys, else the own one (the key the other). s = score[i][j]; slope 1; with
  // HINT: kGeneral and mask_params.softcap > 0: t = tanh(s * softcap_inv), s = softcap * t,
  // HINT: slope = 1 - t * t. Then, if apply_mask, s = mask.apply(s, query, key). P = exp2f(float(
  // HINT: s * double(scale_log2) - double(lse2 of the query))): masked scores (-inf) give 0.
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    const int own = own_start + first_row + Cfg::row_lanes * i;
#pragma unroll
    for (int j = 0; j < Cfg::cols_per_thread; ++j) {
      const int streamed = streamed_start + col_lane + Cfg::col_lanes * j;
      double s = score[i][j];
      slope[i][j] = 1.f;
      if constexpr (kGeneral) {
        if (mask_params.softcap > 0.0) {
          const double t = tanh(s * mask_params.softcap_inv);
          s = mask_params.softcap * t;
          slope[i][j] = static_cast<float>(1.0 - t * t);
        }
      }
      if (apply_mask) s = kRowsAreKeys ? mask.apply(s, streamed, own) : mask.apply(s, own, streamed);
      const float lse2 = query_lse2[kRowsAreKeys ? j : i];
      prob[i][j] = exp2f(static_cast<float>(s * static_cast<double>(scale_log2) - static_cast<double>(lse2)));
    }
  }
  // END SOLUTION
}

// A tile of weights (P or dS, this thread's own rows x streamed rows) to shared memory, where
// accumulate_product reads it back along the streamed rows. Only this warp reads these rows.
template <class Cfg, int HEAD_DIM_PAD>
__device__ __forceinline__ void store_weights(
    const float (&w)[Cfg::rows_per_thread][Cfg::cols_per_thread], float* w_tile, int first_row,
    int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: w_tile[own row][streamed row] = w[i][j], rows BwdLayout<Cfg, HEAD_DIM_PAD>::w_stride
  // HINT: floats apart.
  constexpr int w_stride = BwdLayout<Cfg, HEAD_DIM_PAD>::w_stride;
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::cols_per_thread; ++j)
      w_tile[(first_row + Cfg::row_lanes * i) * w_stride + col_lane + Cfg::col_lanes * j] = w[i][j];
  // END SOLUTION
}

// acc[i][columns] += sum over the streamed rows r of w_tile[own row i][r] * x_tile[r][columns]:
// dV += P^T dO, dK += dS^T Q (own rows keys) or dQ += dS K (own rows queries).
template <class Cfg, int HEAD_DIM_PAD>
__device__ __forceinline__ void accumulate_product(
    float (&acc)[Cfg::rows_per_thread][HEAD_DIM_PAD / Cfg::col_lanes], const float* w_tile,
    const float* x_tile, int first_row, int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: The forward's accumulate_pv: walk the streamed rows 4 at a time; read one float4 of
  // HINT: weights per own row, then for each of the 4 rows and each chunk c the float4
  // HINT: x_tile[row][c * 32 + col_lane * 4 ...] (rows BwdLayout::stride floats apart), and add
  // HINT: weight * x to acc[i][c * 4 + 0..3] with fmaf.
  using Layout = BwdLayout<Cfg, HEAD_DIM_PAD>;
  constexpr int kChunks = HEAD_DIM_PAD / (Cfg::col_lanes * 4);
#pragma unroll 2
  for (int r = 0; r < Cfg::cols; r += 4) {
    float4 weights[Cfg::rows_per_thread];
#pragma unroll
    for (int i = 0; i < Cfg::rows_per_thread; ++i)
      weights[i] = *reinterpret_cast<const float4*>(
          w_tile + (first_row + Cfg::row_lanes * i) * Layout::w_stride + r);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float4 x = *reinterpret_cast<const float4*>(
            x_tile + (r + u) * Layout::stride + c * 32 + col_lane * 4);
#pragma unroll
        for (int i = 0; i < Cfg::rows_per_thread; ++i) {
          const float weight = component(weights[i], u);
          acc[i][c * 4 + 0] = fmaf(weight, x.x, acc[i][c * 4 + 0]);
          acc[i][c * 4 + 1] = fmaf(weight, x.y, acc[i][c * 4 + 1]);
          acc[i][c * 4 + 2] = fmaf(weight, x.z, acc[i][c * 4 + 2]);
          acc[i][c * 4 + 3] = fmaf(weight, x.w, acc[i][c * 4 + 3]);
        }
      }
    }
  }
  // END SOLUTION
}

// acc * factor into rows [0, seq) of a contiguous [seq, head_dim] head, columns < head_dim.
template <class Cfg, int HEAD_DIM_PAD>
__device__ __forceinline__ void write_rows(
    const float (&acc)[Cfg::rows_per_thread][HEAD_DIM_PAD / Cfg::col_lanes], float factor,
    float* head, int first_position, int seq, int head_dim, int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: For each own row i at position first_position + Cfg::row_lanes * i < seq, and each
  // HINT: chunk c whose column c * 32 + col_lane * 4 is < head_dim: one float4 store of
  // HINT: acc[i][c * 4 + 0..3] * factor (rows head_dim floats apart).
  constexpr int kChunks = HEAD_DIM_PAD / (Cfg::col_lanes * 4);
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    const int row = first_position + Cfg::row_lanes * i;
    if (row >= seq) continue;
    float* const dst = head + static_cast<int64_t>(row) * head_dim;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = c * 32 + col_lane * 4;
      if (col < head_dim) {
        *reinterpret_cast<float4*>(dst + col) =
            make_float4(acc[i][c * 4 + 0] * factor, acc[i][c * 4 + 1] * factor,
                        acc[i][c * 4 + 2] * factor, acc[i][c * 4 + 3] * factor);
      }
    }
  }
  // END SOLUTION
}

// Two tiles of ROWS rows from row `first` on (K and V, or Q and dO) into shared memory as one
// cp.async group, rows Layout::stride floats apart, zero-filled past `seq` and head_dim.
template <class Layout, int ROWS, int HEAD_DIM_PAD, int THREADS>
__device__ __forceinline__ void load_pair_async(float* a_tile, const float* a_head,
                                                int64_t a_row_stride, float* b_tile,
                                                const float* b_head, int64_t b_row_stride,
                                                int first, int seq, int head_dim, int tid) {
  load_tile_async<ROWS, HEAD_DIM_PAD, THREADS>(a_tile, Layout::stride, a_head, a_row_stride, first,
                                               seq, head_dim, tid);
  load_tile_async<ROWS, HEAD_DIM_PAD, THREADS>(b_tile, Layout::stride, b_head, b_row_stride, first,
                                               seq, head_dim, tid);
  copy_async_commit();
}


// ---------------------------------------------------------------------------------------
// The kernels
// ---------------------------------------------------------------------------------------

// dK and dV: grid (B * H_kv, key tiles); a block owns Cfg::rows keys of one KV head and walks
// the query tiles (Cfg::cols rows) of every query head of its group.
template <class Cfg, int HEAD_DIM_PAD, bool kGeneral>
__global__ void __launch_bounds__(Cfg::threads)
    flash_backward_dkdv_kernel(const BwdParams p) {
  // BEGIN SOLUTION kernel
  // HINT: blockIdx.x = batch * kv_heads + kv_head, blockIdx.y the key tile (kv_start = y *
  // HINT: Cfg::rows); this thread's first_row = warp * Cfg::rows_per_warp + lane / col_lanes,
  // HINT: col_lane = lane % col_lanes. Copy K and V of the tile into the own tiles once
  // HINT: (load_pair_async, zero-filled past seq_k). dK = dV = 0 in registers. For each query head
  // HINT: of the group (head = kv_head * kv_group + g; KeyMask(p.mask, batch, head)) and each
  // HINT: query tile from mask.queries_seeing(...): __syncthreads(), copy Q and dO into the streamed
  // HINT: tiles, read the lse2 and D of your query columns (+inf and 0 past seq_q), wait,
  // HINT: __syncthreads(); scores = dot_rows<double>(K, Q); recompute_probabilities (mask only if
  // HINT: the key tile is not inside mask.unmasked_keys(q_start, q_start + cols - 1));
  // HINT: dP = dot_rows<float>(V, dO); P to the weights tile, __syncwarp, dV += P dO,
  // HINT: __syncwarp; dS = P * (dP - D) * slope to the weights tile, __syncwarp, dK += dS Q. At
  // HINT: the end write dK * scale and dV (write_rows), also where no query was visited (zeros).
  constexpr int kOutColumns = HEAD_DIM_PAD / Cfg::col_lanes;
  using Layout = BwdLayout<Cfg, HEAD_DIM_PAD>;
  static_assert(Cfg::cols % 4 == 0, "accumulate_product walks streamed rows 4 at a time");
  extern __shared__ float4 smem_float4[];  // declared float4: 16-byte aligned
  float* const smem = reinterpret_cast<float*>(smem_float4);
  float* const k_tile = smem + Layout::own_a;
  float* const v_tile = smem + Layout::own_b;
  float* const q_tile = smem + Layout::stream_a;
  float* const do_tile = smem + Layout::stream_b;
  float* const w_tile = smem + Layout::weights;

  const int batch = blockIdx.x / p.kv_heads;
  const int kv_head = blockIdx.x % p.kv_heads;
  const int kv_start = blockIdx.y * Cfg::rows;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int first_row = warp * Cfg::rows_per_warp + lane / Cfg::col_lanes;
  const int col_lane = lane % Cfg::col_lanes;

  load_pair_async<Layout, Cfg::rows, HEAD_DIM_PAD, Cfg::threads>(
      k_tile, p.k + batch * p.k_stride_b + kv_head * p.k_stride_h, p.k_stride_s, v_tile,
      p.v + batch * p.v_stride_b + kv_head * p.v_stride_h, p.v_stride_s, kv_start, p.seq_k,
      p.head_dim, tid);

  float dk_acc[Cfg::rows_per_thread][kOutColumns];
  float dv_acc[Cfg::rows_per_thread][kOutColumns];
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i)
#pragma unroll
    for (int c = 0; c < kOutColumns; ++c) dk_acc[i][c] = dv_acc[i][c] = 0.f;

  for (int g = 0; g < p.kv_group; ++g) {
    const int head = kv_head * p.kv_group + g;
    const attn::KeyMask<kGeneral> mask(p.mask, batch, head);
    const int2 queries = mask.queries_seeing(kv_start, kv_start + Cfg::rows);
    const float* q_head = p.q + batch * p.q_stride_b + head * p.q_stride_h;
    const float* do_head = p.d_out + batch * p.do_stride_b + head * p.do_stride_h;
    const int64_t row_base = (static_cast<int64_t>(batch) * p.heads + head) * p.seq_q;

    for (int q_start = queries.x; q_start < queries.y; q_start += Cfg::cols) {
      // Every warp is done with the previous Q and dO tiles: refill them.
      __syncthreads();
      load_pair_async<Layout, Cfg::cols, HEAD_DIM_PAD, Cfg::threads>(
          q_tile, q_head, p.q_stride_s, do_tile, do_head, p.do_stride_s, q_start, p.seq_q,
          p.head_dim, tid);
      float col_lse2[Cfg::cols_per_thread], col_delta[Cfg::cols_per_thread];
#pragma unroll
      for (int j = 0; j < Cfg::cols_per_thread; ++j) {
        const int query = q_start + col_lane + Cfg::col_lanes * j;
        const bool real = query < p.seq_q;  // padding columns: P = 0
        col_lse2[j] = real ? p.lse2[row_base + query] : INFINITY;
        col_delta[j] = real ? p.delta[row_base + query] : 0.f;
      }
      const int2 unmasked = mask.unmasked_keys(q_start, q_start + Cfg::cols - 1);
      const bool apply_mask = !(kv_start >= unmasked.x && kv_start + Cfg::rows <= unmasked.y);
      copy_async_wait_all();
      __syncthreads();

      double score[Cfg::rows_per_thread][Cfg::cols_per_thread];
      dot_rows<Cfg, HEAD_DIM_PAD, double>(score, k_tile, q_tile, first_row, col_lane);
      float prob[Cfg::rows_per_thread][Cfg::cols_per_thread];
      float slope[Cfg::rows_per_thread][Cfg::cols_per_thread];
      recompute_probabilities<Cfg, kGeneral, true>(score, prob, slope, col_lse2, mask, p.mask,
                                                   apply_mask, kv_start, q_start, first_row,
                                                   col_lane, p.scale_log2);
      float d_prob[Cfg::rows_per_thread][Cfg::cols_per_thread];
      dot_rows<Cfg, HEAD_DIM_PAD, float>(d_prob, v_tile, do_tile, first_row, col_lane);

      store_weights<Cfg, HEAD_DIM_PAD>(prob, w_tile, first_row, col_lane);
      __syncwarp();
      accumulate_product<Cfg, HEAD_DIM_PAD>(dv_acc, w_tile, do_tile, first_row, col_lane);
      __syncwarp();  // every lane has read P before dS overwrites it
#pragma unroll
      for (int i = 0; i < Cfg::rows_per_thread; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::cols_per_thread; ++j)
          d_prob[i][j] = prob[i][j] * (d_prob[i][j] - col_delta[j]) * slope[i][j];  // dS
      store_weights<Cfg, HEAD_DIM_PAD>(d_prob, w_tile, first_row, col_lane);
      __syncwarp();
      accumulate_product<Cfg, HEAD_DIM_PAD>(dk_acc, w_tile, q_tile, first_row, col_lane);
    }
  }
  copy_async_wait_all();  // a block that visited no query tile still has K and V in flight

  const int64_t kv_head_offset =
      (static_cast<int64_t>(batch) * p.kv_heads + kv_head) * p.seq_k * p.head_dim;
  write_rows<Cfg, HEAD_DIM_PAD>(dk_acc, p.scale, p.dk + kv_head_offset, kv_start + first_row,
                                p.seq_k, p.head_dim, col_lane);
  write_rows<Cfg, HEAD_DIM_PAD>(dv_acc, 1.f, p.dv + kv_head_offset, kv_start + first_row,
                                p.seq_k, p.head_dim, col_lane);
  // END SOLUTION
}

// dQ: grid (B * H_q, query tiles); a block owns Cfg::rows queries of one head and walks the key
// tiles they may see (the forward's loop), recomputing P and dS.
template <class Cfg, int HEAD_DIM_PAD, bool kGeneral>
__global__ void __launch_bounds__(Cfg::threads)
    flash_backward_dq_kernel(const BwdParams p) {
  // BEGIN SOLUTION kernel
  // HINT: blockIdx.x = batch * heads + head (KV head head / kv_group), blockIdx.y the query tile
  // HINT: (reversed when causal: the heaviest first). Copy Q and dO into the own tiles once;
  // HINT: read the lse2 and D of your rows (+inf and 0 past seq_q). Walk the keys from
  // HINT: mask.keys_begin(q_start) (at least 0) to mask.keys_end(q_last), Cfg::cols at a time:
  // HINT: __syncthreads(), copy K and V into the streamed tiles, wait, __syncthreads(); scores =
  // HINT: dot_rows<double>(Q, K); recompute_probabilities<..., false> (mask where the tile is not
  // HINT: inside unmasked_keys); dP = dot_rows<float>(dO, V); dS = P * (dP - D) * slope to the
  // HINT: weights tile, __syncwarp, dQ += dS K. At the end write dQ * scale.
  constexpr int kOutColumns = HEAD_DIM_PAD / Cfg::col_lanes;
  using Layout = BwdLayout<Cfg, HEAD_DIM_PAD>;
  extern __shared__ float4 smem_float4[];
  float* const smem = reinterpret_cast<float*>(smem_float4);
  float* const q_tile = smem + Layout::own_a;
  float* const do_tile = smem + Layout::own_b;
  float* const k_tile = smem + Layout::stream_a;
  float* const v_tile = smem + Layout::stream_b;
  float* const w_tile = smem + Layout::weights;

  const int batch = blockIdx.x / p.heads;
  const int head = blockIdx.x % p.heads;
  const int kv_head = head / p.kv_group;
  const int q_tile_index = p.mask.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int q_start = q_tile_index * Cfg::rows;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int first_row = warp * Cfg::rows_per_warp + lane / Cfg::col_lanes;
  const int col_lane = lane % Cfg::col_lanes;

  load_pair_async<Layout, Cfg::rows, HEAD_DIM_PAD, Cfg::threads>(
      q_tile, p.q + batch * p.q_stride_b + head * p.q_stride_h, p.q_stride_s, do_tile,
      p.d_out + batch * p.do_stride_b + head * p.do_stride_h, p.do_stride_s, q_start, p.seq_q,
      p.head_dim, tid);

  const int64_t row_base = (static_cast<int64_t>(batch) * p.heads + head) * p.seq_q;
  float row_lse2[Cfg::rows_per_thread], row_delta[Cfg::rows_per_thread];
  float dq_acc[Cfg::rows_per_thread][kOutColumns];
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    const int query = q_start + first_row + Cfg::row_lanes * i;
    const bool real = query < p.seq_q;
    row_lse2[i] = real ? p.lse2[row_base + query] : INFINITY;
    row_delta[i] = real ? p.delta[row_base + query] : 0.f;
#pragma unroll
    for (int c = 0; c < kOutColumns; ++c) dq_acc[i][c] = 0.f;
  }

  const attn::KeyMask<kGeneral> mask(p.mask, batch, head);
  const int q_last = q_start + Cfg::rows - 1;
  const int key_first = max(mask.keys_begin(q_start), 0);
  const int key_end = mask.keys_end(q_last);
  const int2 unmasked = mask.unmasked_keys(q_start, q_last);
  const float* k_head = p.k + batch * p.k_stride_b + kv_head * p.k_stride_h;
  const float* v_head = p.v + batch * p.v_stride_b + kv_head * p.v_stride_h;

  for (int kv_start = key_first; kv_start < key_end; kv_start += Cfg::cols) {
    // Every warp is done with the previous K and V tiles (and its own weights rows).
    __syncthreads();
    load_pair_async<Layout, Cfg::cols, HEAD_DIM_PAD, Cfg::threads>(
        k_tile, k_head, p.k_stride_s, v_tile, v_head, p.v_stride_s, kv_start, p.seq_k, p.head_dim,
        tid);
    copy_async_wait_all();
    __syncthreads();

    const bool apply_mask = !(kv_start >= unmasked.x && kv_start + Cfg::cols <= unmasked.y);
    double score[Cfg::rows_per_thread][Cfg::cols_per_thread];
    dot_rows<Cfg, HEAD_DIM_PAD, double>(score, q_tile, k_tile, first_row, col_lane);
    float prob[Cfg::rows_per_thread][Cfg::cols_per_thread];
    float slope[Cfg::rows_per_thread][Cfg::cols_per_thread];
    recompute_probabilities<Cfg, kGeneral, false>(score, prob, slope, row_lse2, mask, p.mask,
                                                  apply_mask, q_start, kv_start, first_row,
                                                  col_lane, p.scale_log2);
    float d_score[Cfg::rows_per_thread][Cfg::cols_per_thread];
    dot_rows<Cfg, HEAD_DIM_PAD, float>(d_score, do_tile, v_tile, first_row, col_lane);
#pragma unroll
    for (int i = 0; i < Cfg::rows_per_thread; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::cols_per_thread; ++j)
        d_score[i][j] = prob[i][j] * (d_score[i][j] - row_delta[i]) * slope[i][j];
    store_weights<Cfg, HEAD_DIM_PAD>(d_score, w_tile, first_row, col_lane);
    __syncwarp();
    accumulate_product<Cfg, HEAD_DIM_PAD>(dq_acc, w_tile, k_tile, first_row, col_lane);
  }
  copy_async_wait_all();  // a block that visited no key tile still has Q and dO in flight

  write_rows<Cfg, HEAD_DIM_PAD>(
      dq_acc, p.scale, p.dq + (static_cast<int64_t>(batch) * p.heads + head) * p.seq_q * p.head_dim,
      q_start + first_row, p.seq_q, p.head_dim, col_lane);
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------
// Host side: choosing the instantiation, validating, launching
// ---------------------------------------------------------------------------------------

using BwdKernelFn = void (*)(BwdParams);

struct BwdChoice {
  BwdKernelFn dkdv;
  BwdKernelFn dq;
  int rows;  // own rows per block (both kernels)
  int threads;
  size_t smem_bytes;
};

template <class Cfg, int HEAD_DIM_PAD, bool kGeneral>
BwdChoice make_bwd_choice() {
  return {flash_backward_dkdv_kernel<Cfg, HEAD_DIM_PAD, kGeneral>,
          flash_backward_dq_kernel<Cfg, HEAD_DIM_PAD, kGeneral>, Cfg::rows, Cfg::threads,
          BwdLayout<Cfg, HEAD_DIM_PAD>::bytes};
}

template <class Cfg, bool kGeneral>
BwdChoice bwd_choice_for_head_dim(int64_t head_dim) {
  if (head_dim <= 32) return make_bwd_choice<Cfg, 32, kGeneral>();
  if (head_dim <= 64) return make_bwd_choice<Cfg, 64, kGeneral>();
  return make_bwd_choice<Cfg, 128, kGeneral>();
}

template <class Cfg>
BwdChoice bwd_choice(int64_t head_dim, bool general) {
  return general ? bwd_choice_for_head_dim<Cfg, true>(head_dim)
                 : bwd_choice_for_head_dim<Cfg, false>(head_dim);
}

// The 8-warp tiles where their shared memory fits this GPU, else the 4-warp ones.
BwdChoice choose_bwd_kernels(int64_t head_dim, int device, bool general) {
  const int limit = attn::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  BwdChoice choice = bwd_choice<BwdLarge>(head_dim, general);
  if (choice.smem_bytes > static_cast<size_t>(limit)) choice = bwd_choice<BwdSmall>(head_dim, general);
  TORCH_CHECK(choice.smem_bytes <= static_cast<size_t>(limit), attn::str("flash_attention_backward_fp32 "
              "needs ", choice.smem_bytes, " bytes of shared memory per block at head_dim ", head_dim,
              " but this GPU allows ", limit, "."));
  return choice;
}

void check_bhsd_fp32(const torch::Tensor& t, const char* name) {
  attn::check_cuda_tensor(t, name);
  attn::check_dtype(t, name, {torch::kFloat32});
  attn::check_dim(t, name, 4, "[batch, heads, seq, head_dim]");
}

// What the kernels read with cp.async and float4: a contiguous last dimension and rows on 16
// bytes. Anything else (dO from autograd is often a strided or expanded view) is copied.
torch::Tensor rows_ready(const torch::Tensor& t) {
  bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int dim = 0; dim < 3 && ok; ++dim) ok = t.size(dim) == 1 || t.stride(dim) % 4 == 0;
  return ok ? t : t.clone(at::MemoryFormat::Contiguous);  // clone: a misaligned view stays one under contiguous()
}

}  // namespace

// fp32 FlashAttention-2 backward: q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D], out and d_out like
// q (any strides), lse [B, H_q, S_q] float32, the forward's base-2 log-sum-exp (what
// flash_attention_fp32 and flash_attention_mma write into `lse`), and the forward's variant
// arguments (the sinks are inside lse already). Returns {dq, dk, dv}, new contiguous float32
// tensors; dk and dv are summed over each KV head's query group. Deterministic.
std::vector<torch::Tensor> flash_attention_backward_fp32(
    torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor out, torch::Tensor lse,
    torch::Tensor d_out, bool causal, std::optional<int64_t> window, int64_t stride,
    std::optional<torch::Tensor> mask, std::optional<torch::Tensor> key_lengths,
    bool left_padding, std::optional<double> softcap, std::optional<double> scale) {
  check_bhsd_fp32(q, "q");
  check_bhsd_fp32(k, "k");
  check_bhsd_fp32(v, "v");
  check_bhsd_fp32(out, "out");
  check_bhsd_fp32(d_out, "d_out");
  attn::check_cuda_tensor(lse, "lse");
  attn::check_dtype(lse, "lse", {torch::kFloat32});
  for (const auto& [t, name] : {std::pair<const torch::Tensor&, const char*>{k, "k"}, {v, "v"},
                                {out, "out"}, {d_out, "d_out"}, {lse, "lse"}}) {
    attn::check_same(q, "q", t, name);
  }
  const int kv_group = attn::check_qkv_shapes(q, k, v);
  const int64_t batch = q.size(0), heads = q.size(1), seq_q = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = k.size(1), seq_k = k.size(2);
  attn::check_backward_head_dim(head_dim);
  static_assert(attn::kBackwardMaxHeadDim <= 128, "bwd_choice_for_head_dim pads head dims up to 128");
  TORCH_CHECK_VALUE(out.sizes() == q.sizes() && d_out.sizes() == q.sizes(), attn::str("out and d_out "
                    "must have the shape of q ", q.sizes(), " but have ", out.sizes(), " and ",
                    d_out.sizes(), "."));
  TORCH_CHECK_VALUE(lse.dim() == 3 && lse.size(0) == batch && lse.size(1) == heads &&
                    lse.size(2) == seq_q, attn::str("lse must have shape [", batch, ", ", heads, ", ",
                    seq_q, "] (one base-2 log-sum-exp per query row, as the forward wrote it) but "
                    "has shape ", lse.sizes(), "."));
  TORCH_CHECK_VALUE(seq_k <= INT32_MAX / 2 && seq_q <= INT32_MAX / 2 && batch * heads <= INT32_MAX,
                    attn::str("seq_q (", seq_q, "), seq_k (", seq_k, ") and batch * heads (",
                    batch * heads, ") must fit in 31 bits."));

  const double scale_value = attn::softmax_scale(scale, head_dim);
  attn::MaskParams mask_params = attn::make_mask_params(q, k, causal, window, stride, mask,
      key_lengths, left_padding, static_cast<float>(1.0 / scale_value));
  attn::set_score_transforms(mask_params, q, softcap, std::nullopt, scale_value);

  const c10::cuda::CUDAGuard device_guard(q.device());
  const BwdChoice choice = choose_bwd_kernels(head_dim, q.get_device(), mask_params.general());
  const int64_t q_tiles = (seq_q + choice.rows - 1) / choice.rows;
  const int64_t kv_tiles = (seq_k + choice.rows - 1) / choice.rows;
  TORCH_CHECK_VALUE(q_tiles <= 65535 && kv_tiles <= 65535, attn::str("seq_q ", seq_q, " and seq_k ",
                    seq_k, " need ", q_tiles, " and ", kv_tiles, " tiles of ", choice.rows,
                    " rows but a grid holds at most 65535 (gridDim.y); split the sequence."));

  const torch::Tensor qa = rows_ready(q), ka = rows_ready(k), va = rows_ready(v);
  const torch::Tensor oa = rows_ready(out), doa = rows_ready(d_out);
  const auto f32 = q.options().dtype(torch::kFloat32);
  torch::Tensor lse2 = torch::empty({batch, heads, seq_q}, f32);
  torch::Tensor delta = torch::empty({batch, heads, seq_q}, f32);
  torch::Tensor dq = torch::empty({batch, heads, seq_q, head_dim}, f32);
  torch::Tensor dk = torch::empty({batch, kv_heads, seq_k, head_dim}, f32);
  torch::Tensor dv = torch::empty({batch, kv_heads, seq_k, head_dim}, f32);

  BwdParams params;
  params.mask = mask_params;

  // BEGIN SOLUTION
  // HINT: Fill a BwdParams: the pointers (qa, ka, va, oa, doa, lse, lse2, delta, dq, dk, dv), the
  // HINT: batch/head/seq strides of qa, ka, va, oa, doa and lse, batch, heads, kv_heads,
  // HINT: kv_group, seq_q, seq_k, head_dim, scale = scale_value and scale_log2 = log2(e) *
  // HINT: scale_value (as float, like the forward's). Launch on c10::cuda::getCurrentCUDAStream():
  // HINT: backward_preprocess_kernel, grid ceil(batch * heads * seq_q / kPreprocessWarps) blocks
  // HINT: of kPreprocessWarps * 32 threads; then choice.dkdv, grid (batch * kv_heads, kv_tiles),
  // HINT: and choice.dq, grid (batch * heads, q_tiles), each with choice.threads threads and
  // HINT: choice.smem_bytes of dynamic shared memory (allow it first with cudaFuncSetAttribute(
  // HINT: kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)); attn::check_launch after
  // HINT: each launch.
  params.q = qa.data_ptr<float>();
  params.k = ka.data_ptr<float>();
  params.v = va.data_ptr<float>();
  params.out = oa.data_ptr<float>();
  params.d_out = doa.data_ptr<float>();
  params.lse = lse.data_ptr<float>();
  params.lse2 = lse2.data_ptr<float>();
  params.delta = delta.data_ptr<float>();
  params.dq = dq.data_ptr<float>();
  params.dk = dk.data_ptr<float>();
  params.dv = dv.data_ptr<float>();
  params.q_stride_b = qa.stride(0);
  params.q_stride_h = qa.stride(1);
  params.q_stride_s = qa.stride(2);
  params.k_stride_b = ka.stride(0);
  params.k_stride_h = ka.stride(1);
  params.k_stride_s = ka.stride(2);
  params.v_stride_b = va.stride(0);
  params.v_stride_h = va.stride(1);
  params.v_stride_s = va.stride(2);
  params.o_stride_b = oa.stride(0);
  params.o_stride_h = oa.stride(1);
  params.o_stride_s = oa.stride(2);
  params.do_stride_b = doa.stride(0);
  params.do_stride_h = doa.stride(1);
  params.do_stride_s = doa.stride(2);
  params.lse_stride_b = lse.stride(0);
  params.lse_stride_h = lse.stride(1);
  params.lse_stride_s = lse.stride(2);
  params.batch = static_cast<int>(batch);
  params.heads = static_cast<int>(heads);
  params.kv_heads = static_cast<int>(kv_heads);
  params.kv_group = kv_group;
  params.seq_q = static_cast<int>(seq_q);
  params.seq_k = static_cast<int>(seq_k);
  params.head_dim = static_cast<int>(head_dim);
  params.scale = static_cast<float>(scale_value);
  params.scale_log2 = static_cast<float>(1.4426950408889634 * scale_value);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t rows = batch * heads * seq_q;
  const int64_t preprocess_blocks = (rows + kPreprocessWarps - 1) / kPreprocessWarps;
  TORCH_CHECK_VALUE(preprocess_blocks <= INT32_MAX, attn::str("batch * heads * seq_q (", rows,
                    ") is too large for one launch; split the batch."));
  backward_preprocess_kernel<<<static_cast<unsigned>(preprocess_blocks), kPreprocessWarps * 32, 0,
                               stream>>>(params);
  attn::check_launch("backward_preprocess_kernel");

  for (BwdKernelFn kernel : {choice.dkdv, choice.dq}) {
    const cudaError_t attr_err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(choice.smem_bytes));
    TORCH_CHECK(attr_err == cudaSuccess, attn::str("cudaFuncSetAttribute(MaxDynamicSharedMemorySize, ",
                choice.smem_bytes, ") failed: ", cudaGetErrorString(attr_err)));
  }
  const dim3 dkdv_grid(static_cast<unsigned>(batch * kv_heads), static_cast<unsigned>(kv_tiles));
  choice.dkdv<<<dkdv_grid, choice.threads, choice.smem_bytes, stream>>>(params);
  attn::check_launch("flash_backward_dkdv_kernel");
  const dim3 dq_grid(static_cast<unsigned>(batch * heads), static_cast<unsigned>(q_tiles));
  choice.dq<<<dq_grid, choice.threads, choice.smem_bytes, stream>>>(params);
  attn::check_launch("flash_backward_dq_kernel");
  // END SOLUTION

  return {dq, dk, dv};
}
