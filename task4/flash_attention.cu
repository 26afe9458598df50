// Task 4: the fused FlashAttention-2 forward kernel in fp32 (the course kernel).
//
// The idea. One thread block owns one tile of query rows of one (batch, head). It keeps
// that Q tile in shared memory and walks over the keys and values tile by tile, holding
// per query row only the running maximum m, the running sum l and the unnormalised output
// O (task 3's algorithm). The S x S score matrix never exists: each block sees one
// rows_per_q_tile x rows_per_kv_tile tile of it at a time, in registers. Per key tile:
//
//   scores = Q K^T            register-blocked like an SGEMM micro-kernel (below), summed
//                             in double: float scores round as much as PyTorch's fp32 and
//                             miss FlashAttention-2's accuracy criterion at large logits
//   mask                      only on tiles that reach the diagonal (causal) or the
//                             sequence end (tail keys >= S are set to -inf)
//   m_new = max(m, rowmax)    row max by warp shuffles: the lanes sharing a row are in one warp
//   P = exp2((scores - m_new) * scale*log2(e))   log2(e) folded into the scale, so exp2f
//   l = l * exp2((m - m_new) * scale*log2(e)) + rowsum(P);  O = O * (the same) + P V
//
// and at the end out = O / l. Scores and m stay double until score - m (exact for close
// scores); P, l and O are float (task4/NOTES.md, "fp32 accuracy at large logits", has why
// and what it costs). m stays in raw score units and the exponent is the difference
// times the scale, so the row's largest score gets exactly exp2(0) = 1 (PyTorch's softmax
// gives it exactly 1 too): a row one key dominates comes out as that key's value row.
// (One FFMA, exp2f(score * scale - max * scale) as FlashAttention-2's kernels compute it, gives
// the largest score exp2(the rounding error of max * scale), and its output two more
// roundings; task4/NOTES.md, "fp32 accuracy at large logits".) Causal: key tiles entirely
// above the diagonal are never loaded (the loop stops at the diagonal), and query tiles are
// launched heaviest first so the long ones do not start last.
//
// The tile shape and why. A block has 8 warps (256 threads); each warp is 4 lanes across
// rows x 8 lanes across keys. A thread owns 4 query rows (rows_per_thread) x 8 keys
// (keys_per_thread) of the score tile, and the same 4 rows x 16 columns of O (head_dim
// 128), so rows_per_q_tile = 8 warps x 4 x 4 = 128 and rows_per_kv_tile = 8 x 8 = 64.
// With 4 x 8 values per thread, each 4-wide step of the dot products reads 4 + 8 float4
// from shared memory for 128 FMAs, and P V reads 4 + 16 float4 for 256 FMAs: the FMA units,
// not shared memory, set the pace (a thread per row would need one shared load per FMA).
// Everything stays in natural row-major layout ([row][d], padded): the dot products run
// along head_dim, so Q and K are read as float4 along d, and tiles are copied global ->
// shared with 16-byte cp.async (no transposes). Q/K rows are padded by 4 floats and P rows
// by 8 so the float4 reads and the P writes of a warp hit 32 distinct banks. Because a
// thread's O rows are its score rows, P only travels inside a warp, and m and l live in
// registers. V of tile j is fetched while the scores of tile j are computed, and K of tile
// j+1 while P V of tile j is computed (cp.async), so loads overlap the math. Shared memory
// at head_dim 128: Q 66 KB + K 33 KB + V 32 KB + P 36 KB = 167 KB (one block per SM).
//
// Other tile configs (ATTN_FP32_CONFIG, read on every call so a test can time them all):
//   0: 8 warps, 128 x 64  (the default; 167 KB at head_dim 128, one block per SM)
//   1: 4 warps,  64 x 32  (76 KB: two blocks per SM overlap each other's barriers)
//   2: 8 warps, 128 x 32  (119 KB; shorter key tiles)
// head_dim is a template too: padded up to 32, 64 or 128, with the padding columns
// zero-filled on load (so dot products are unchanged) and never written out. Head dims above
// 128 (up to 256) pad to 192 or 256 and run one more tile, 64 x 32 with 2 rows per thread
// (ConfigWide below), whatever the config asked for.
//
// Attention variants (the reference solution's extension, beyond the course): GQA/MQA,
// S_q != S_k with bottom-right causal, sliding windows, strides, a mask tensor and
// per-sequence key lengths all come from one predicate, attn::KeyMask
// (common/csrc/attention_mask.cuh). The course's dense attention instantiates it with
// kGeneral = false: the sequence end and the causal diagonal only, as before.
//
// Measured speed, per config and against SDPA in the same run: Results.md (rendered from
// results/<gpu>.json).

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "tensor_api.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "attention_checks.cuh"
#include "attention_mask_host.cuh"
#include "device_query.cuh"
#include "fp32_tiles.cuh"

namespace {

// ---------------------------------------------------------------------------------------
// Tile configuration and shared-memory layout
// ---------------------------------------------------------------------------------------

template <int NUM_WARPS, int ROWS_PER_THREAD, int KEYS_PER_THREAD>
struct TileConfig {
  static constexpr int num_warps = NUM_WARPS;
  static constexpr int threads = NUM_WARPS * 32;
  // A warp is row_lanes x col_lanes: the 8 lanes that share a row differ in the low 3 bits
  // of the lane id, so a row reduction is 3 __shfl_xor_sync steps (1, 2, 4).
  static constexpr int row_lanes = 4;
  static constexpr int col_lanes = 8;
  static constexpr int rows_per_thread = ROWS_PER_THREAD;
  static constexpr int keys_per_thread = KEYS_PER_THREAD;
  static constexpr int rows_per_warp = row_lanes * ROWS_PER_THREAD;
  static constexpr int rows_per_q_tile = NUM_WARPS * rows_per_warp;
  static constexpr int rows_per_kv_tile = col_lanes * KEYS_PER_THREAD;
};

using Config0 = TileConfig<8, 4, 8>;  // 128 x 64
using Config1 = TileConfig<4, 4, 4>;  //  64 x 32
using Config2 = TileConfig<8, 4, 4>;  // 128 x 32
// Head dims above 128 (padded to 192 or 256): O is 2-4x wider, so a thread holds 2 query rows,
// not 4 (64 x 32 tiles, 8 warps): the same O registers per thread as config 0 at head_dim 128
// (2 x 32 floats at 256), and Q 66 KB + K 33 KB + V 32 KB + P 10 KB = 142 KB at 256. Every
// config request runs it there (ATTN_FP32_CONFIG picks among the tiles up to 128).
using ConfigWide = TileConfig<8, 2, 4>;  // 64 x 32
constexpr int kNumConfigs = 3;
constexpr int kDefaultConfig = 0;

// Offsets (in floats) of the four tiles in dynamic shared memory.
template <class Cfg, int HEAD_DIM_PAD>
struct SmemLayout {
  // +4 floats: consecutive rows start 4 banks apart, so the 4 (Q) or 8 (K) distinct rows a
  // warp reads with one float4 instruction fall in distinct banks.
  static constexpr int qk_stride = HEAD_DIM_PAD + 4;
  // V is read as 32 consecutive floats of one row per instruction: no padding needed.
  static constexpr int v_stride = HEAD_DIM_PAD;
  // +8 floats: the 4 row lanes of a warp write P 8 banks apart, x 8 key lanes = 32 banks.
  static constexpr int p_stride = Cfg::rows_per_kv_tile + 8;
  static constexpr int q_offset = 0;
  static constexpr int k_offset = q_offset + Cfg::rows_per_q_tile * qk_stride;
  static constexpr int v_offset = k_offset + Cfg::rows_per_kv_tile * qk_stride;
  static constexpr int p_offset = v_offset + Cfg::rows_per_kv_tile * v_stride;
  static constexpr int floats = p_offset + Cfg::rows_per_q_tile * p_stride;
  static constexpr size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  // Every tile starts and every row starts on 16 bytes (cp.async and float4 need it).
  static_assert(qk_stride % 4 == 0 && v_stride % 4 == 0 && p_stride % 4 == 0, "row alignment");
  static_assert(k_offset % 4 == 0 && v_offset % 4 == 0 && p_offset % 4 == 0, "tile alignment");
};

// Everything the kernel needs about the tensors. Strides are in elements; the last
// dimension (head_dim) has stride 1 for all four tensors (checked on the host).
struct FlashParams {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  int64_t q_stride_b, q_stride_h, q_stride_s;
  int64_t k_stride_b, k_stride_h, k_stride_s;
  int64_t v_stride_b, v_stride_h, v_stride_s;
  int64_t o_stride_b, o_stride_h, o_stride_s;
  int heads;
  int seq;           // query rows (S_q)
  int head_dim;
  float scale_log2;  // log2(e) * scale (1/sqrt(head_dim) unless given): feeds exp2f
  bool causal;
  // Beyond the course (filled by the host before the course's part): keys may differ from
  // queries in number (seq_k) and heads (GQA: query head h reads K/V head h / kv_group), and
  // `mask` describes which keys each row sees (for the course: causal or not, seq_k = seq).
  int seq_k;
  int kv_group;
  attn::MaskParams mask;
  float* lse;  // beyond the course: [B, H_q, S_q] base-2 log-sum-exp per row, or nullptr
};

// The cp.async tile copies global -> shared (copy16_async, load_tile_async, ...) are in
// fp32_tiles.cuh, shared with the backward kernels (flash_backward.cu).
using attn_fp32::component;
using attn_fp32::copy_async_commit;
using attn_fp32::copy_async_wait_all;
using attn_fp32::load_tile_async;

// ---------------------------------------------------------------------------------------
// The steps of one key tile, one device function each: scores, mask, online softmax, P to
// shared memory, P V, and the write-out at the end. They are inlined into the kernel, so the
// split costs nothing; it only gives each idea its own name (and the student one region each).
//
// Every function sees the tile through this thread's coordinates: its rows of the Q tile are
// first_row + row_lanes * i (i < rows_per_thread), its keys of the K/V tile are
// col_lane + col_lanes * j (j < keys_per_thread), and its O columns are the float4 chunks
// c * 32 + col_lane * 4 (c < head_dim_pad / 32).
// ---------------------------------------------------------------------------------------

// scores = Q K^T for this thread's rows x keys, from the shared tiles (unscaled), in double:
// a product of two floats is exact in a double, and the sum keeps 29 more bits than a float
// would. Why: at large logits a float score's rounding (PyTorch's fp32 attention has as much)
// decides the output wherever a row's two largest scores are close (task4/NOTES.md, "fp32
// accuracy at large logits"); scores stay double until the row max is subtracted.
template <class Cfg, int HEAD_DIM_PAD>
__device__ __forceinline__ void compute_scores(
    double (&score)[Cfg::rows_per_thread][Cfg::keys_per_thread], const float* q_tile,
    const float* k_tile, int first_row, int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: score[i][j] = sum over d < HEAD_DIM_PAD of q_tile[row i][d] * k_tile[key j][d], with
  // HINT: row i = first_row + Cfg::row_lanes * i and key j = col_lane + Cfg::col_lanes * j, rows
  // HINT: SmemLayout<Cfg, HEAD_DIM_PAD>::qk_stride floats apart. Walk d 4 at a time: per step
  // HINT: read one float4 of each of your rows and of each of your keys, then do the 4 FMAs of
  // HINT: every (row, key) pair in double (fma on the values converted to double), so each
  // HINT: shared load feeds several FMAs.
  using Layout = SmemLayout<Cfg, HEAD_DIM_PAD>;
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::keys_per_thread; ++j) score[i][j] = 0.0;

#pragma unroll 4
  for (int d = 0; d < HEAD_DIM_PAD; d += 4) {
    float4 q_frag[Cfg::rows_per_thread];
#pragma unroll
    for (int i = 0; i < Cfg::rows_per_thread; ++i)
      q_frag[i] = *reinterpret_cast<const float4*>(
          q_tile + (first_row + Cfg::row_lanes * i) * Layout::qk_stride + d);
#pragma unroll
    for (int j = 0; j < Cfg::keys_per_thread; ++j) {
      const float4 k_frag = *reinterpret_cast<const float4*>(
          k_tile + (col_lane + Cfg::col_lanes * j) * Layout::qk_stride + d);
#pragma unroll
      for (int i = 0; i < Cfg::rows_per_thread; ++i) {
        score[i][j] = fma(double(q_frag[i].x), double(k_frag.x), score[i][j]);
        score[i][j] = fma(double(q_frag[i].y), double(k_frag.y), score[i][j]);
        score[i][j] = fma(double(q_frag[i].z), double(k_frag.z), score[i][j]);
        score[i][j] = fma(double(q_frag[i].w), double(k_frag.w), score[i][j]);
      }
    }
  }
  // END SOLUTION
}

// Hidden keys -> -inf: past the end of the keys, above the causal diagonal, and (beyond the
// course) outside a window, off a stride or masked by a mask tensor. `first_query_row` is
// the sequence position of this thread's row 0, `kv_start` that of the tile's key 0.
template <class Cfg, bool kGeneral>
__device__ __forceinline__ void mask_scores(
    double (&score)[Cfg::rows_per_thread][Cfg::keys_per_thread],
    const attn::KeyMask<kGeneral>& mask, int first_query_row, int kv_start, int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: For each of your scores: row = first_query_row + Cfg::row_lanes * i, key = kv_start +
  // HINT: col_lane + Cfg::col_lanes * j; score = mask.apply(score, row, key), which returns
  // HINT: -INFINITY for a key the row must not see (key >= seq_k, or key > row when causal)
  // HINT: and the score unchanged otherwise.
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    const int row = first_query_row + Cfg::row_lanes * i;
#pragma unroll
    for (int j = 0; j < Cfg::keys_per_thread; ++j)
      score[i][j] = mask.apply(score[i][j], row, kv_start + col_lane + Cfg::col_lanes * j);
  }
  // END SOLUTION
}

// The online-softmax step of one key tile, row by row: the new running max m (raw score
// units), the scores turned into P = exp2((score - m) * scale_log2) in place (exactly 1 for
// the row's largest score), and l and O rescaled by exp2((m_old - m_new) * scale_log2),
// l += this lane's share of rowsum(P). A row that has seen no visible key yet keeps
// m = -inf; the m_use guard keeps its P, l and O at 0 instead of NaN.
template <class Cfg, int OUT_COLUMNS>
__device__ __forceinline__ void online_softmax_step(
    double (&score)[Cfg::rows_per_thread][Cfg::keys_per_thread],
    double (&row_max)[Cfg::rows_per_thread], float (&row_sum)[Cfg::rows_per_thread],
    float (&o_acc)[Cfg::rows_per_thread][OUT_COLUMNS], float scale_log2) {
  // BEGIN SOLUTION kernel
  // HINT: Per row i: tile_max = max of your keys' scores, then the max over the Cfg::col_lanes
  // HINT: lanes that share the row (__shfl_xor_sync with offsets 1, 2, 4). new_max =
  // HINT: max(row_max[i], tile_max) (raw scores, double); m_use = new_max, or 0 if it is
  // HINT: -INFINITY; rescale = exp2f(float((row_max[i] - m_use) * scale_log2)); row_max[i] =
  // HINT: new_max; each score becomes exp2f(float((score - m_use) * scale_log2)) (subtract in
  // HINT: double first: the largest score must get exactly 1); row_sum[i] = row_sum[i] *
  // HINT: rescale + the sum of your P values (this lane's share); multiply every o_acc[i][...]
  // HINT: by rescale.
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    double tile_max = score[i][0];
#pragma unroll
    for (int j = 1; j < Cfg::keys_per_thread; ++j) tile_max = fmax(tile_max, score[i][j]);
#pragma unroll
    for (int offset = 1; offset < Cfg::col_lanes; offset *= 2)
      tile_max = fmax(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
    // m in raw score units: the exponent is (score - m) * scale_log2, which is exactly 0 for
    // the largest score. (fmaf(score, scale_log2, -m * scale_log2) saves one instruction but
    // gives the largest score exp2(the rounding error of m * scale_log2) instead of 1.)
    // The difference is taken in double (exact for close scores), the exponent in float.
    const double new_max = fmax(row_max[i], tile_max);
    const double m_use = new_max == -INFINITY ? 0.0 : new_max;
    const float rescale = exp2f(float((row_max[i] - m_use) * scale_log2));  // 0 on the first tile
    row_max[i] = new_max;
    float tile_sum = 0.f;
#pragma unroll
    for (int j = 0; j < Cfg::keys_per_thread; ++j) {
      const float prob = exp2f(float((score[i][j] - m_use) * scale_log2));  // masked: 0
      score[i][j] = prob;
      tile_sum += prob;
    }
    row_sum[i] = row_sum[i] * rescale + tile_sum;
#pragma unroll
    for (int c = 0; c < OUT_COLUMNS; ++c) o_acc[i][c] *= rescale;
  }
  // END SOLUTION
}

// Beyond the course (issue 31), the general instantiation only: Gemma-2's softcap on this
// thread's raw scores, before the mask (attn::softcap_score: softcap * tanh(score / softcap)
// in raw units, in double like the scores).
template <class Cfg>
__device__ __forceinline__ void softcap_scores(
    double (&score)[Cfg::rows_per_thread][Cfg::keys_per_thread], const attn::MaskParams& mask) {
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::keys_per_thread; ++j) score[i][j] = attn::softcap_score(score[i][j], mask);
}

// Beyond the course, the general instantiation only: GPT-OSS's attention sink of this head
// joins each row's max and denominator once, after the last key tile (attn::sink_term): O and
// this lane's share of l are rescaled to the new max, and the row's first lane adds the
// sink's term to its share, so that write_output's O / sum of the shares is the answer.
template <class Cfg, int OUT_COLUMNS>
__device__ __forceinline__ void add_sink(float (&o_acc)[Cfg::rows_per_thread][OUT_COLUMNS],
                                         const double (&row_max)[Cfg::rows_per_thread],
                                         float (&row_sum)[Cfg::rows_per_thread], float sink,
                                         float scale_log2, int col_lane) {
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    const attn::SinkTerm<double> t = attn::sink_term(sink, row_max[i] * scale_log2);
    row_sum[i] = row_sum[i] * t.keys + (col_lane == 0 ? t.sink : 0.f);
#pragma unroll
    for (int c = 0; c < OUT_COLUMNS; ++c) o_acc[i][c] *= t.keys;
  }
}

// Beyond the course (issue 33), when p.lse is set (the forward that autograd's backward
// needs): each row's base-2 log-sum-exp of the scaled logits, lse2 = m * scale_log2 + log2(l),
// so that the backward recomputes P = exp2(score * scale_log2 - lse2); with a sink, the top
// and the sum that add_sink left (the sink once in l); -inf for a row with neither. Its own
// function outside write_output, so the course's region is unchanged.
template <class Cfg>
__device__ __forceinline__ void write_lse(const double (&row_max)[Cfg::rows_per_thread],
                                          const float (&row_sum)[Cfg::rows_per_thread],
                                          const FlashParams& p, int batch_index, int head_index,
                                          int first_query_row, int col_lane, bool with_sink) {
  float* const lse_head = p.lse + (static_cast<int64_t>(batch_index) * p.heads + head_index) * p.seq;
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    float total = row_sum[i];
#pragma unroll
    for (int offset = 1; offset < Cfg::col_lanes; offset *= 2)
      total += __shfl_xor_sync(0xffffffffu, total, offset);
    double top = row_max[i] * p.scale_log2;
    if (with_sink) top = attn::sink_term(p.mask.sinks[head_index], top).top;
    const int row = first_query_row + Cfg::row_lanes * i;
    if (col_lane == 0 && row < p.seq)
      lse_head[row] = total > 0.f ? static_cast<float>(top + log2(static_cast<double>(total))) : -INFINITY;
  }
}

// P (this thread's rows x keys) to the shared P tile, where P V reads it back as float4s along
// the keys. Only this warp reads these rows back (a thread's O rows are its score rows).
template <class Cfg, int HEAD_DIM_PAD>
__device__ __forceinline__ void store_probabilities(
    const double (&prob)[Cfg::rows_per_thread][Cfg::keys_per_thread], float* p_tile,
    int first_row, int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: p_tile[row][key] = prob[i][j] for your rows and keys, rows
  // HINT: SmemLayout<Cfg, HEAD_DIM_PAD>::p_stride floats apart.
  using Layout = SmemLayout<Cfg, HEAD_DIM_PAD>;
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::keys_per_thread; ++j)
      p_tile[(first_row + Cfg::row_lanes * i) * Layout::p_stride + col_lane +
             Cfg::col_lanes * j] = static_cast<float>(prob[i][j]);  // a float P, exactly
  // END SOLUTION
}

// O += P V for this thread's rows and O columns, from the shared P and V tiles.
template <class Cfg, int HEAD_DIM_PAD>
__device__ __forceinline__ void accumulate_pv(
    float (&o_acc)[Cfg::rows_per_thread][HEAD_DIM_PAD / Cfg::col_lanes], const float* p_tile,
    const float* v_tile, int first_row, int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: Walk the tile's keys 4 at a time: read one float4 of P per row (P[row][key..key+3]),
  // HINT: then for each of the 4 keys and each O chunk c read the float4 V[key][c * 32 +
  // HINT: col_lane * 4 ...] (rows SmemLayout::v_stride apart) and add weight * V to
  // HINT: o_acc[i][c * 4 + 0..3] (fmaf), weight = that key's P of row i.
  using Layout = SmemLayout<Cfg, HEAD_DIM_PAD>;
  constexpr int kOutChunks = HEAD_DIM_PAD / (Cfg::col_lanes * 4);
#pragma unroll 2
  for (int key = 0; key < Cfg::rows_per_kv_tile; key += 4) {
    float4 p_frag[Cfg::rows_per_thread];
#pragma unroll
    for (int i = 0; i < Cfg::rows_per_thread; ++i)
      p_frag[i] = *reinterpret_cast<const float4*>(
          p_tile + (first_row + Cfg::row_lanes * i) * Layout::p_stride + key);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int c = 0; c < kOutChunks; ++c) {
        const float4 v_frag = *reinterpret_cast<const float4*>(
            v_tile + (key + u) * Layout::v_stride + c * 32 + col_lane * 4);
#pragma unroll
        for (int i = 0; i < Cfg::rows_per_thread; ++i) {
          const float weight = component(p_frag[i], u);
          o_acc[i][c * 4 + 0] = fmaf(weight, v_frag.x, o_acc[i][c * 4 + 0]);
          o_acc[i][c * 4 + 1] = fmaf(weight, v_frag.y, o_acc[i][c * 4 + 1]);
          o_acc[i][c * 4 + 2] = fmaf(weight, v_frag.z, o_acc[i][c * 4 + 2]);
          o_acc[i][c * 4 + 3] = fmaf(weight, v_frag.w, o_acc[i][c * 4 + 3]);
        }
      }
    }
  }
  // END SOLUTION
}

// out = O / l for this thread's rows < seq and columns < head_dim of head (batch_index,
// head_index). l is summed over the lanes of the row first (in the same order on every lane,
// so all lanes agree bit for bit). The output pointer is formed here, after the loop: kept
// from the prologue it would hold two more registers through the whole key loop.
template <class Cfg, int HEAD_DIM_PAD>
__device__ __forceinline__ void write_output(
    const float (&o_acc)[Cfg::rows_per_thread][HEAD_DIM_PAD / Cfg::col_lanes],
    const float (&row_sum)[Cfg::rows_per_thread], const FlashParams& p, int batch_index,
    int head_index, int first_query_row, int col_lane) {
  // BEGIN SOLUTION kernel
  // HINT: Per row i: total = row_sum[i] summed over the Cfg::col_lanes lanes of the row
  // HINT: (__shfl_xor_sync, offsets 1, 2, 4); row = first_query_row + Cfg::row_lanes * i. If
  // HINT: row < p.seq, write o_acc[i][c * 4 + 0..3] / total as one float4 at column c * 32 +
  // HINT: col_lane * 4 of row `row` of the output head (p.out + the batch and head offsets,
  // HINT: rows p.o_stride_s apart), for each chunk c whose column is < p.head_dim. A row that
  // HINT: saw no visible key has total = 0 and O = 0: divide by 1.
  constexpr int kOutChunks = HEAD_DIM_PAD / (Cfg::col_lanes * 4);
  float* const out_head = p.out + batch_index * p.o_stride_b + head_index * p.o_stride_h;
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    float total = row_sum[i];
#pragma unroll
    for (int offset = 1; offset < Cfg::col_lanes; offset *= 2)
      total += __shfl_xor_sync(0xffffffffu, total, offset);
    const int row = first_query_row + Cfg::row_lanes * i;
    const float denom = total > 0.f ? total : 1.f;
    if (row < p.seq) {
      float* const out_row = out_head + static_cast<int64_t>(row) * p.o_stride_s;
#pragma unroll
      for (int c = 0; c < kOutChunks; ++c) {
        const int col = c * 32 + col_lane * 4;
        if (col < p.head_dim) {
          *reinterpret_cast<float4*>(out_row + col) =
              make_float4(o_acc[i][c * 4 + 0] / denom, o_acc[i][c * 4 + 1] / denom,
                          o_acc[i][c * 4 + 2] / denom, o_acc[i][c * 4 + 3] / denom);
        }
      }
    }
  }
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------
// The kernel: grid (batch * heads, query tiles), Cfg::threads threads
// ---------------------------------------------------------------------------------------

template <class Cfg, int HEAD_DIM_PAD, bool kGeneral>
__global__ void __launch_bounds__(Cfg::threads, 1)
    flash_attention_fp32_kernel(const FlashParams p) {
  // BEGIN SOLUTION kernel
  // HINT: One block = one tile of rows_per_q_tile query rows of one (batch, head):
  // HINT: blockIdx.x is batch * heads + head, blockIdx.y the query tile (reversed when causal,
  // HINT: heaviest first); K and V come from head head / p.kv_group. This thread's coordinates:
  // HINT: first_row = warp * Cfg::rows_per_warp + lane / Cfg::col_lanes, col_lane = lane %
  // HINT: Cfg::col_lanes. Build attn::KeyMask<kGeneral> mask(p.mask, batch, head); the key
  // HINT: tiles to visit run from mask.keys_begin(q_start) to mask.keys_end(q_last), and tiles
  // HINT: inside mask.unmasked_keys(q_start, q_last) need no mask. Start m = -inf, l = 0, O = 0,
  // HINT: copy the Q tile to shared memory once (load_tile_async). For each key/value tile: copy
  // HINT: K and V (rows >= p.seq_k and columns >= head_dim are zero-filled), wait and
  // HINT: __syncthreads(), compute_scores, mask_scores where needed, online_softmax_step,
  // HINT: store_probabilities, __syncthreads(), accumulate_pv; a barrier must also separate the
  // HINT: last reads of a K/V/P tile from its next refill. At the end, write_output. (Beyond the
  // HINT: course, the general instantiation also calls softcap_scores and add_sink, and a call
  // HINT: with p.lse set, write_lse.)
  constexpr int kRowsPerQTile = Cfg::rows_per_q_tile;
  constexpr int kRowsPerKvTile = Cfg::rows_per_kv_tile;
  // O columns per thread come in float4 chunks: a warp row covers 8 lanes x 4 = 32 columns.
  constexpr int kOutColumns = HEAD_DIM_PAD / Cfg::col_lanes;
  using Layout = SmemLayout<Cfg, HEAD_DIM_PAD>;
  static_assert(HEAD_DIM_PAD % 32 == 0, "head_dim is padded to a multiple of 32");
  static_assert(kRowsPerKvTile % 4 == 0, "P V walks keys 4 at a time");

  extern __shared__ float4 smem_float4[];  // declared float4: 16-byte aligned
  float* const smem = reinterpret_cast<float*>(smem_float4);
  float* const q_tile = smem + Layout::q_offset;  // [rows_per_q_tile][qk_stride]
  float* const k_tile = smem + Layout::k_offset;  // [rows_per_kv_tile][qk_stride]
  float* const v_tile = smem + Layout::v_offset;  // [rows_per_kv_tile][v_stride]
  float* const p_tile = smem + Layout::p_offset;  // [rows_per_q_tile][p_stride]

  const int seq = p.seq;
  const int batch_index = blockIdx.x / p.heads;
  const int head_index = blockIdx.x % p.heads;
  // Causal: tile t needs t + 1 key tiles, so launch the last (heaviest) tiles first.
  const int q_tile_index = p.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int q_start = q_tile_index * kRowsPerQTile;

  const float* q_head = p.q + batch_index * p.q_stride_b + head_index * p.q_stride_h;
  const int kv_head_index = head_index / p.kv_group;  // GQA: a group shares K and V
  const float* k_head = p.k + batch_index * p.k_stride_b + kv_head_index * p.k_stride_h;
  const float* v_head = p.v + batch_index * p.v_stride_b + kv_head_index * p.v_stride_h;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  // This thread's rows in the tile: first_row + 4 * i. Interleaved (not 4 consecutive rows)
  // so that the 4 row lanes of a warp read 4 consecutive rows: distinct banks.
  const int first_row = warp * Cfg::rows_per_warp + lane / Cfg::col_lanes;
  // The 8 lanes that share a row: keys col_lane + 8 * j (8 consecutive keys per instruction).
  const int col_lane = lane % Cfg::col_lanes;

  // Key tiles to visit: those holding a key some row of this tile sees (causal: up to the
  // tile's last row; a window: from its first row's window on). Tiles in
  // [unmasked_begin, unmasked_end) are visible to every row: no mask there.
  const attn::KeyMask<kGeneral> mask(p.mask, batch_index, head_index);
  const int q_last = q_start + kRowsPerQTile - 1;
  const int first_kv_tile = max(mask.keys_begin(q_start), 0) / kRowsPerKvTile;
  const int end_kv_tile =
      max(first_kv_tile, (mask.keys_end(q_last) + kRowsPerKvTile - 1) / kRowsPerKvTile);
  const int2 unmasked = mask.unmasked_keys(q_start, q_last);
  const int unmasked_begin = (unmasked.x + kRowsPerKvTile - 1) / kRowsPerKvTile;
  const int unmasked_end = unmasked.y >= unmasked.x ? unmasked.y / kRowsPerKvTile : 0;

  float o_acc[Cfg::rows_per_thread][kOutColumns];
  double row_max[Cfg::rows_per_thread];  // m, raw score units; the same on all 8 lanes of a row
  float row_sum[Cfg::rows_per_thread];  // l, this lane's share (its keys); summed at the end
#pragma unroll
  for (int i = 0; i < Cfg::rows_per_thread; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.f;
#pragma unroll
    for (int c = 0; c < kOutColumns; ++c) o_acc[i][c] = 0.f;
  }

  // Prologue: Q tile and the first K tile in one group.
  load_tile_async<kRowsPerQTile, HEAD_DIM_PAD, Cfg::threads>(
      q_tile, Layout::qk_stride, q_head, p.q_stride_s, q_start, seq, p.head_dim, tid);
  load_tile_async<kRowsPerKvTile, HEAD_DIM_PAD, Cfg::threads>(
      k_tile, Layout::qk_stride, k_head, p.k_stride_s, first_kv_tile * kRowsPerKvTile, p.seq_k,
      p.head_dim, tid);
  copy_async_commit();

  for (int kv_tile = first_kv_tile; kv_tile < end_kv_tile; ++kv_tile) {
    const int kv_start = kv_tile * kRowsPerKvTile;

    // K of this tile has landed (our copies) and is visible (everyone's, after the barrier).
    // The barrier also means every warp is done with the previous V and P, so V can be refilled.
    copy_async_wait_all();
    __syncthreads();
    load_tile_async<kRowsPerKvTile, HEAD_DIM_PAD, Cfg::threads>(
        v_tile, Layout::v_stride, v_head, p.v_stride_s, kv_start, p.seq_k, p.head_dim, tid);
    copy_async_commit();

    double score[Cfg::rows_per_thread][Cfg::keys_per_thread];  // then P, in place
    compute_scores<Cfg, HEAD_DIM_PAD>(score, q_tile, k_tile, first_row, col_lane);
    if (kGeneral && p.mask.softcap > 0.0) softcap_scores<Cfg>(score, p.mask);  // beyond the course
    // Mask only where it can matter: the tile holding the sequence end (keys >= seq_k are
    // zero-filled padding), tiles across the causal diagonal or a window's edge, and every
    // tile of a stride or a mask tensor.
    if (kv_tile < unmasked_begin || kv_tile >= unmasked_end)
      mask_scores<Cfg, kGeneral>(score, mask, q_start + first_row, kv_start, col_lane);
    online_softmax_step<Cfg, kOutColumns>(score, row_max, row_sum, o_acc, p.scale_log2);
    // The barrier below orders these writes before the reads of P V.
    store_probabilities<Cfg, HEAD_DIM_PAD>(score, p_tile, first_row, col_lane);

    // V has landed and is visible; every warp is done reading K, so K can be refilled with
    // the next tile while we compute P V.
    copy_async_wait_all();
    __syncthreads();
    if (kv_tile + 1 < end_kv_tile) {
      load_tile_async<kRowsPerKvTile, HEAD_DIM_PAD, Cfg::threads>(
          k_tile, Layout::qk_stride, k_head, p.k_stride_s, kv_start + kRowsPerKvTile, p.seq_k,
          p.head_dim, tid);
      copy_async_commit();
    }
    accumulate_pv<Cfg, HEAD_DIM_PAD>(o_acc, p_tile, v_tile, first_row, col_lane);
  }

  if (kGeneral && p.mask.sinks != nullptr)  // beyond the course
    add_sink<Cfg>(o_acc, row_max, row_sum, p.mask.sinks[head_index], p.scale_log2, col_lane);
  write_output<Cfg, HEAD_DIM_PAD>(o_acc, row_sum, p, batch_index, head_index, q_start + first_row,
                                  col_lane);
  if (p.lse != nullptr)  // beyond the course: the forward that autograd saves for the backward
    write_lse<Cfg>(row_max, row_sum, p, batch_index, head_index, q_start + first_row, col_lane,
                   kGeneral && p.mask.sinks != nullptr);
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------
// Host side: choosing the instantiation, validating, launching
// ---------------------------------------------------------------------------------------

using KernelFn = void (*)(FlashParams);

struct KernelChoice {
  KernelFn kernel;
  int config;
  int rows_per_q_tile;
  int threads;
  size_t smem_bytes;
};

template <class Cfg, int HEAD_DIM_PAD, bool kGeneral>
KernelChoice make_choice(int config) {
  return {flash_attention_fp32_kernel<Cfg, HEAD_DIM_PAD, kGeneral>, config, Cfg::rows_per_q_tile,
          Cfg::threads, SmemLayout<Cfg, HEAD_DIM_PAD>::bytes};
}

template <class Cfg, bool kGeneral = false>
KernelChoice choice_for_head_dim(int config, int64_t head_dim) {
  if (head_dim <= 32) return make_choice<Cfg, 32, kGeneral>(config);
  if (head_dim <= 64) return make_choice<Cfg, 64, kGeneral>(config);
  if (head_dim <= 128) return make_choice<Cfg, 128, kGeneral>(config);
  // Above 128: the wide tile, whatever the config (its registers hold 2 rows, not 4).
  if (head_dim <= 192) return make_choice<ConfigWide, 192, kGeneral>(config);
  return make_choice<ConfigWide, 256, kGeneral>(config);
}

// A pattern beyond causal (window, stride, lengths, a mask tensor) runs the general
// predicate, instantiated for configs 0 and 1 (1 where 0's shared memory does not fit).
KernelChoice choice_for(int config, int64_t head_dim, bool general) {
  if (general) {
    return config == 1 ? choice_for_head_dim<Config1, true>(config, head_dim)
                       : choice_for_head_dim<Config0, true>(0, head_dim);
  }
  switch (config) {
    case 1: return choice_for_head_dim<Config1>(config, head_dim);
    case 2: return choice_for_head_dim<Config2>(config, head_dim);
    default: return choice_for_head_dim<Config0>(config, head_dim);
  }
}

// ATTN_FP32_CONFIG, read on every call (a getenv is cheap) so a test can time each config.
int requested_config() {
  return attn::env_int("ATTN_FP32_CONFIG", kDefaultConfig, 0, kNumConfigs - 1,
                       "a tile config of the fp32 kernel (0: 128x64, 1: 64x32, 2: 128x32)");
}

// The requested config if its shared memory fits this GPU, else config 1 (the smallest).
KernelChoice choose_kernel(int64_t head_dim, int device, bool general) {
  const int limit = attn::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  KernelChoice choice = choice_for(requested_config(), head_dim, general);
  if (choice.smem_bytes > static_cast<size_t>(limit)) choice = choice_for(1, head_dim, general);
  TORCH_CHECK(choice.smem_bytes <= static_cast<size_t>(limit), attn::str("flash_attention_fp32 needs ",
              choice.smem_bytes, " bytes of shared memory per block at head_dim ", head_dim,
              " but this GPU allows ", limit, "."));
  return choice;
}

void check_bhsd(const torch::Tensor& t, const char* name) {
  attn::check_cuda_tensor(t, name);
  attn::check_dtype(t, name, {torch::kFloat32});
  attn::check_dim(t, name, 4, "[batch, heads, seq, head_dim]");
  TORCH_CHECK_VALUE(t.stride(3) == 1, attn::str(name,
                    " must have a contiguous last dimension (head_dim stride 1) but its strides "
                    "are ",
                    t.strides(), "; call .contiguous() first."));
}

// cp.async and float4 need every row to start on 16 bytes: an aligned pointer and strides
// that are multiples of 4 floats (dimensions of size 1 have no meaningful stride).
bool rows_are_16_byte_aligned(const torch::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int dim = 0; dim < 3; ++dim) {
    if (t.size(dim) > 1 && t.stride(dim) % 4 != 0) return false;
  }
  return true;
}

torch::Tensor aligned_or_copy(const torch::Tensor& t) {
  // A rare view at an odd offset (e.g. a slice x[..., 1:]) gets a fresh, aligned copy.
  return rows_are_16_byte_aligned(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

}  // namespace

// fp32, q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D] with any strides whose last dimension is
// contiguous, and the attention variants of common/variants.py (attention_mask.cuh).
torch::Tensor flash_attention_fp32(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal,
                                   std::optional<torch::Tensor> out, std::optional<int64_t> window,
                                   int64_t stride, std::optional<torch::Tensor> mask,
                                   std::optional<torch::Tensor> key_lengths, bool left_padding,
                                   std::optional<double> softcap, std::optional<torch::Tensor> sinks,
                                   std::optional<double> scale, std::optional<torch::Tensor> lse) {
  check_bhsd(q, "q");
  check_bhsd(k, "k");
  check_bhsd(v, "v");
  attn::check_same(q, "q", k, "k");
  attn::check_same(q, "q", v, "v");
  const int kv_group = attn::check_qkv_shapes(q, k, v);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), head_dim = q.size(3);
  TORCH_CHECK_VALUE(k.size(2) <= INT32_MAX / 2, attn::str("seq_k ", k.size(2), " must fit in 31 bits."));
  attn::check_head_dim(head_dim);
  static_assert(attn::kMaxHeadDim <= 256, "choice_for_head_dim pads head dims up to 256");
  TORCH_CHECK_VALUE(batch * heads <= INT32_MAX && seq <= INT32_MAX,
                    attn::str("batch * heads (", batch * heads, ") and seq (", seq,
                    ") must each fit in 32 bits."));
  if (out.has_value()) {
    check_bhsd(*out, "out");
    attn::check_same(q, "q", *out, "out");
    TORCH_CHECK_VALUE(out->sizes() == q.sizes(), attn::str("out must have the shape of q ", q.sizes(),
                      " but has ", out->sizes(), "."));
  }

  // The softmax scale (1/sqrt(D) unless given). An additive mask value a (logit units) is
  // a / scale in the kernel's raw score units; softcap and sinks run the general
  // instantiation, and the float32 sinks live until the launch below.
  const double scale_value = attn::softmax_scale(scale, head_dim);
  attn::MaskParams mask_params = attn::make_mask_params(q, k, causal, window, stride, mask,
      key_lengths, left_padding, static_cast<float>(1.0 / scale_value));
  const std::optional<torch::Tensor> sink_values =
      attn::set_score_transforms(mask_params, q, softcap, sinks, scale_value);

  const c10::cuda::CUDAGuard device_guard(q.device());
  const KernelChoice choice = choose_kernel(head_dim, q.get_device(), mask_params.general());
  const int64_t num_q_tiles = (seq + choice.rows_per_q_tile - 1) / choice.rows_per_q_tile;
  TORCH_CHECK_VALUE(num_q_tiles <= 65535, attn::str("seq ", seq, " needs ", num_q_tiles,
                    " query tiles but a grid holds at most 65535 (gridDim.y); split the sequence."));

  const torch::Tensor qa = aligned_or_copy(q), ka = aligned_or_copy(k), va = aligned_or_copy(v);
  torch::Tensor result = out.has_value() ? *out : torch::empty(q.sizes(), q.options());
  // Write straight into `result` unless it is misaligned; then into a fresh tensor, copied after.
  torch::Tensor target =
      rows_are_16_byte_aligned(result) ? result : torch::empty(q.sizes(), q.options());

  FlashParams params;
  params.seq_k = static_cast<int>(k.size(2));
  params.kv_group = kv_group;
  params.mask = mask_params;
  params.lse = nullptr;
  if (lse.has_value()) {  // beyond the course: autograd's forward saves each row's lse
    attn::check_cuda_tensor(*lse, "lse");
    attn::check_dtype(*lse, "lse", {torch::kFloat32});
    TORCH_CHECK_VALUE(lse->device() == q.device() && lse->is_contiguous() && lse->dim() == 3 &&
                      lse->size(0) == batch && lse->size(1) == heads && lse->size(2) == seq,
                      attn::str("lse must be a contiguous float32 [", batch, ", ", heads, ", ", seq,
                      "] tensor on q's device but has shape ", lse->sizes(), "."));
    params.lse = lse->data_ptr<float>();
  }

  // BEGIN SOLUTION
  // HINT: Fill a FlashParams (data pointers, the batch/head/seq strides of qa, ka, va and
  // HINT: target, heads, seq, head_dim, scale_log2 = log2(e) * scale_value, causal). Allow the
  // HINT: kernel choice.smem_bytes of dynamic shared memory with cudaFuncSetAttribute(
  // HINT: choice.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ...), launch it on
  // HINT: c10::cuda::getCurrentCUDAStream() with grid (batch * heads, num_q_tiles) and
  // HINT: choice.threads threads, then call attn::check_launch("flash_attention_fp32_kernel").
  params.q = qa.data_ptr<float>();
  params.k = ka.data_ptr<float>();
  params.v = va.data_ptr<float>();
  params.out = target.data_ptr<float>();
  params.q_stride_b = qa.stride(0);
  params.q_stride_h = qa.stride(1);
  params.q_stride_s = qa.stride(2);
  params.k_stride_b = ka.stride(0);
  params.k_stride_h = ka.stride(1);
  params.k_stride_s = ka.stride(2);
  params.v_stride_b = va.stride(0);
  params.v_stride_h = va.stride(1);
  params.v_stride_s = va.stride(2);
  params.o_stride_b = target.stride(0);
  params.o_stride_h = target.stride(1);
  params.o_stride_s = target.stride(2);
  params.heads = static_cast<int>(heads);
  params.seq = static_cast<int>(seq);
  params.head_dim = static_cast<int>(head_dim);
  params.scale_log2 = static_cast<float>(1.4426950408889634 * scale_value);
  params.causal = causal;

  const cudaError_t attr_err = cudaFuncSetAttribute(
      choice.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(choice.smem_bytes));
  TORCH_CHECK(attr_err == cudaSuccess, attn::str("cudaFuncSetAttribute(MaxDynamicSharedMemorySize, ",
              choice.smem_bytes, ") failed: ", cudaGetErrorString(attr_err)));
  // batch * heads on x (up to 2^31 - 1 blocks), query tiles on y (checked <= 65535 above).
  const dim3 grid(static_cast<unsigned>(batch * heads), static_cast<unsigned>(num_q_tiles));
  choice.kernel<<<grid, choice.threads, choice.smem_bytes, c10::cuda::getCurrentCUDAStream()>>>(params);
  attn::check_launch("flash_attention_fp32_kernel");
  // END SOLUTION

  if (!target.is_same(result)) result.copy_(target);
  return result;
}

// fp32, q/k/v [B, S, hidden] (projected, heads interleaved in hidden): the course's entry.
// It is a view: [B, S, hidden] -> [B, S, H, D] -> [B, H, S, D] (strides, no copy), and the
// output is written through the same view, so it comes back as [B, S, hidden].
torch::Tensor custom_flash_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                     int64_t num_heads, bool causal,
                                     std::optional<torch::Tensor> out) {
  const char* layout = "[batch, seq, hidden]";
  auto check_bsh = [&](const torch::Tensor& t, const char* name) {
    attn::check_cuda_tensor(t, name);
    attn::check_dtype(t, name, {torch::kFloat32});
    attn::check_dim(t, name, 3, layout);
  };
  check_bsh(q, "q");
  check_bsh(k, "k");
  check_bsh(v, "v");
  TORCH_CHECK_VALUE(k.sizes() == q.sizes() && v.sizes() == q.sizes(),
                    attn::str("q, k and v must have the same shape [batch, seq, hidden] but q is ", q.sizes(),
                    ", k ", k.sizes(), " and v ", v.sizes(), "."));
  const int64_t hidden = q.size(2);
  TORCH_CHECK_VALUE(num_heads > 0 && hidden % num_heads == 0, attn::str("num_heads (", num_heads,
                    ") must be positive and divide hidden (", hidden, ")."));
  if (out.has_value()) {
    attn::check_cuda_tensor(*out, "out");
    attn::check_dim(*out, "out", 3, layout);
    TORCH_CHECK_VALUE(out->sizes() == q.sizes(), attn::str("out must have the shape of q ", q.sizes(),
                      " but has ", out->sizes(), "."));
  }
  const int64_t head_dim = hidden / num_heads;
  auto heads_view = [&](const torch::Tensor& t) {
    return t.unflatten(2, {num_heads, head_dim}).transpose(1, 2);
  };
  torch::Tensor result = out.has_value() ? *out : torch::empty(q.sizes(), q.options());
  flash_attention_fp32(heads_view(q), heads_view(k), heads_view(v), causal, heads_view(result),
                       std::nullopt, 1, std::nullopt, std::nullopt, false, std::nullopt,
                       std::nullopt, std::nullopt, std::nullopt);
  return result;
}
