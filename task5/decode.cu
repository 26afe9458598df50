// Task 5: the KV cache and the course's decode kernel (one new query against the whole cache).
//
// The idea. Generating a token attends ONE new query row to every cached key and value of
// its sequence. Per (batch, head) that is a dot product with each key, a softmax over them
// and a weighted sum of the values: a few FLOPs per byte, so the kernel is bound by how fast
// it reads the cache (2 * ctx * head_dim elements per head), never by arithmetic. Three
// kernels:
//   update_cache_kernel   appends the new tokens' K and V to the preallocated caches
//                         [B, max_seq_len, hidden] in place (a byte copy, 16 bytes a thread);
//   decode_split_kernel   one block per (batch*head, split of the keys): an online softmax
//                         over its keys, like one query row of task 4 (one loop fewer);
//   combine_splits_kernel merges the splits' partial results with their log-sum-exp weights.
// With one split (short contexts, or enough batch*heads to fill the GPU) the decode kernel
// writes the output itself and no combine runs: that is the course's decode kernel. Beyond
// the course, the split kernel also merges its own splits (the last block of a head to finish
// does it, merge_in_last_block), so a split decode is one launch too; the combine kernel
// remains for when no counters are at hand (a CUDA graph captured before any decode ran).
// Split-KV (FlashDecoding): with B*H = 32 heads and 132 SMs, one block per head would leave
// most of the GPU idle, so the keys of each head are cut into `num_splits` ranges, each a
// block; attention.py picks the count from the SM count, B*H and the context.
//
// The merges of split results live here, one for each form of partial result, and every
// decode path uses one of them rather than a merge of its own: combine_splits (the
// unnormalised partial states (o, m, l) above, merge_split_states; decode_grouped.cu's too)
// and, beyond the course, merge_lse_splits (section 3: normalised partial outputs and their
// log-sum-exp, what the tensor-core grouped decodes write: decode_gqa.cu, and task 4's kernel
// with a KV head's query heads as rows through merge_attention_splits).
//
// Tile shape and why. A block is 4 warps. One key row of head_dim elements is read by a group
// of LANES_PER_KEY lanes, 16 bytes (8 fp16/bf16 or 4 fp32) each, so a row is one coalesced
// read (D=128 fp16: 256 bytes = 16 lanes x 16 B, 2 keys per warp step). Each warp issues
// KEY_STEPS_IN_FLIGHT = 4 steps of K and V loads before it uses any of them (8 keys in
// flight per warp for fp16 D=128), the independent loads that keep HBM busy. The dot
// products are reduced with shuffles inside each lane group; every group keeps its own
// running max m, sum l and unnormalised output (spread over its lanes, in registers);
// the groups of a warp merge through shuffles, the warps of a block through shared memory.
// A merge of splits is one block of MERGE_THREADS (128) threads per output row, a thread per
// element d (two or more above head_dim 128), the splits' weights in shared memory (at most
// MAX_SPLITS splits). Scores are kept in
// base 2, (q . k) * log2(e)/sqrt(D), so exponentials are exp2f; for fp32 the scores, the
// softmax state and the unnormalised output are doubles (Score<T>, decode_common.cuh: why).
// Strided views are read in place: the [B, max_seq, hidden] cache is [B, H, S, D] with
// strides (max_seq*hidden, D, hidden, 1); no slice is copied per step.
//
// CUDA graphs (task 6): positions and lengths may live in device memory (RuntimeInt), so a
// captured step replays correctly as they are incremented; every kernel clamps them on the
// device so that no value can make it read or write out of bounds.
// Launched overlapped (device_values.cuh): on Hopper the split kernel starts while the kernel
// before it finishes (task 6: RoPE + cache append, which leaves HBM idle), and each block asks
// L2 for the first keys of its split meanwhile (prefetch_first_keys, beyond the course). Timed
// back to back as CUDA-graph replays, one call also starts during the previous call's merge.
//
// The other decode ideas have their own files (decode_common.cuh lists them and holds what
// they share: the block shape, 16-byte packs, Score<T>): decode_grouped.cu, the grouped-query
// decode with every attention variant on CUDA cores; decode_gqa.cu, the grouped-query decode
// on tensor cores; decode_paged.cu, the same decode through a paged KV cache's block table.
//
// Measured speed (GB/s, the fraction of copy bandwidth, against SDPA, as CUDA-graph replays
// at short contexts): python -m task5.test --decode; Results.md ("Decode kernel", "Decode at
// short contexts"), rendered from results/<gpu>.json.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>

#include "attention_checks.cuh"
#include "decode_common.cuh"
#include "device_values.cuh"

// Given, from decode_common.cuh (the decode files share it): the block shape (WARP_SIZE,
// WARPS_PER_BLOCK, THREADS_PER_BLOCK, MAX_HEAD_DIM, MAX_SPLITS; FULL_MASK for full-warp
// shuffles; LOG2_E), 16-byte packs (Pack<T, VEC>, load_pack, zero_pack, unpack), Score<T> and
// score_dtype, to_float and from_float, min64 and clamp64, DecodeTensors (the tensor fields of
// DecodeParams), SplitStates, and the layout checks (pointer_aligned, can_load_16_bytes, ...).
using namespace attn_decode;

namespace {

constexpr int KEY_STEPS_IN_FLIGHT = 4;  // warp steps of K/V loads issued before any is used
// Caps registers at 65536 / (5 * 128) = 102 per thread so at least 5 blocks (20 warps, ~80 KB
// of loads in flight) fit on an SM; ptxas reports no spills for any instantiation at sm_90.
constexpr int MIN_BLOCKS_PER_SM = 5;
// Head dims above 128 double a lane's elements (CHUNKS 2 of 16-byte packs, or 8 scalar chunks):
// their K/V packs in flight alone fill the 102 registers, so those instantiations ask for 3
// blocks per SM (up to 168 registers) and spill nothing at sm_90.
constexpr int WIDE_MIN_BLOCKS_PER_SM = 3;
constexpr int min_blocks_per_sm(int vec, int chunks) {
  return chunks > (vec == 1 ? 4 : 1) ? WIDE_MIN_BLOCKS_PER_SM : MIN_BLOCKS_PER_SM;
}
constexpr int COPY_THREADS = 256;
// The merges of split results: one block of this many threads per output row, each thread
// stepping over the elements d (head dims above 128 give a thread two or more).
constexpr int MERGE_THREADS = 128;

// ---- 1. appending to the cache ----------------------------------------------------------

// Byte pointers and strides in copy units: a copy does not care about the dtype, so the
// host picks the widest unit (16, 8, 4 or 2 bytes) that every row, stride and pointer allows.
struct CacheUpdateParams {
  char* k_cache;
  char* v_cache;
  const char* k;
  const char* v;
  int64_t batch, new_tokens, max_seq_len, units_per_row;
  int64_t k_cache_stride_b, k_cache_stride_s, v_cache_stride_b, v_cache_stride_s;
  int64_t k_stride_b, k_stride_s, v_stride_b, v_stride_s;
  RuntimeInt position;  // where token 0 of the new ones goes, per sequence
};

// One block per new row (sequence b, new token t), grid-stride over the rows; its threads
// copy the row's units. Row (b, t) of k goes to row (b, position[b] + t) of k_cache; same for v.
template <typename Unit>
__global__ void __launch_bounds__(COPY_THREADS) update_cache_kernel(const CacheUpdateParams p) {
  // BEGIN SOLUTION kernel
  // HINT: Walk the rows (b, t) of the new tokens with a grid-stride loop over blockIdx.x
  // HINT: (b = row / new_tokens, t = row % new_tokens). The destination row is
  // HINT: pos = p.position.at(b) + t; skip the row unless 0 <= pos < max_seq_len (a device
  // HINT: position was never checked on the host). Cast the byte pointers to Unit*, and let
  // HINT: the threads copy units threadIdx.x, threadIdx.x + blockDim.x, ... of k's row (b, t)
  // HINT: to k_cache's row (b, pos), and the same for v (each tensor has its strides, in units).
  Unit* k_cache = reinterpret_cast<Unit*>(p.k_cache);
  Unit* v_cache = reinterpret_cast<Unit*>(p.v_cache);
  const Unit* k = reinterpret_cast<const Unit*>(p.k);
  const Unit* v = reinterpret_cast<const Unit*>(p.v);
  const int64_t rows = p.batch * p.new_tokens;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t b = row / p.new_tokens;
    const int64_t t = row % p.new_tokens;
    const int64_t pos = p.position.at(b) + t;
    if (pos < 0 || pos >= p.max_seq_len) continue;  // device-side guard: never write outside
    const Unit* k_src = k + b * p.k_stride_b + t * p.k_stride_s;
    const Unit* v_src = v + b * p.v_stride_b + t * p.v_stride_s;
    Unit* k_dst = k_cache + b * p.k_cache_stride_b + pos * p.k_cache_stride_s;
    Unit* v_dst = v_cache + b * p.v_cache_stride_b + pos * p.v_cache_stride_s;
    for (int64_t unit = threadIdx.x; unit < p.units_per_row; unit += blockDim.x) {
      k_dst[unit] = k_src[unit];
      v_dst[unit] = v_src[unit];
    }
  }
  // END SOLUTION
}

// ---- 2. decoding: one query row against the cache ----------------------------------------

// q/out [B, H, 1, D] and k/v [B, H, S_max, D], any strides (in elements), last dim contiguous:
// the pointers q, k, v, out and their strides q_stride_b, q_stride_h, k_stride_b, k_stride_h,
// k_stride_s (v likewise), out_stride_b and out_stride_h are DecodeTensors' (decode_common.cuh).
template <typename T>
struct DecodeParams : DecodeTensors<T> {
  int heads, head_dim;
  int64_t max_seq_len;
  RuntimeInt seq_len;  // keys [0, seq_len) of sequence b are attended (clamped to max_seq_len)
  bool causal;
  Score<T> score_scale;  // log2(e) / sqrt(head_dim): (q . k) * score_scale is the base-2 score
  int num_splits;
  int64_t keys_per_split;
  // num_splits > 1: partial results, [B*H, num_splits, D] and [B*H, num_splits]
  Score<T>* partial_o;   // unnormalised sum of exp2(s - m) * v
  Score<T>* partial_m;   // the split's max score (base 2); -inf for a split without keys
  Score<T>* partial_l;   // sum of exp2(s - m); 0 for a split without keys
  // num_splits > 1, when not null: one zeroed counter per (batch, head). The last block of a
  // head to finish merges the splits itself (merge_in_last_block), so no combine kernel runs.
  int* split_counters;
  // Beyond the course (given): the K and V rows of its split each block asks L2 for before it
  // waits for the kernel before it (prefetch_first_keys); 0: none.
  int prefetch_keys;
};

// The steps of the decode kernel, one device function each: q into registers, a warp step's
// K/V loads, the scores (with the end of the keys masked), the online softmax, P V, and the
// merges and write-out at the end. They are inlined into the kernel, so the split costs
// nothing; it gives each idea its own name (and the student one region each).
//
// The lane layout they share: lane `lane_in_key` of a key group holds the elements
// d = (c * LANES_PER_KEY + lane_in_key) * VEC + e (c < CHUNKS, e < VEC) of q, of its key
// and value rows, and of the output accumulator; a warp step reads one key per key group.

// 1. This lane's elements of q, unscaled (the scale multiplies the finished dot product: a
//    pre-scaled q would carry a rounding in every element), as Score<T>; elements >= head_dim
//    are 0.
template <typename T, int VEC, int LANES_PER_KEY, int CHUNKS>
__device__ __forceinline__ void load_query(Score<T> (&q_reg)[VEC * CHUNKS], const T* q_row,
                                           int lane_in_key, int head_dim) {
  // BEGIN SOLUTION kernel
  // HINT: For each chunk c: d0 = (c * LANES_PER_KEY + lane_in_key) * VEC; read the pack
  // HINT: load_pack<T, VEC>(q_row + d0) (zero_pack<T, VEC>() if d0 >= head_dim), unpack it to
  // HINT: VEC floats and store q_reg[c * VEC + e] = x[e].
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int d0 = (c * LANES_PER_KEY + lane_in_key) * VEC;
    float x[VEC];
    unpack<T, VEC>(d0 < head_dim ? load_pack<T, VEC>(q_row + d0) : zero_pack<T, VEC>(), x);
#pragma unroll
    for (int e = 0; e < VEC; ++e) q_reg[c * VEC + e] = x[e];
  }
  // END SOLUTION
}

// 2. The K and V packs of KEY_STEPS_IN_FLIGHT warp steps, every load issued before any is
//    used: 2 * KEY_STEPS_IN_FLIGHT * CHUNKS independent 16-byte reads per lane in flight.
//    Step u's key is `first_key + u * keys_per_warp_step`; a key >= key_end reads nothing
//    (zeros), and neither do elements >= head_dim.
template <typename T, int VEC, int LANES_PER_KEY, int CHUNKS>
__device__ __forceinline__ void load_key_steps(
    Pack<T, VEC> (&k_frag)[KEY_STEPS_IN_FLIGHT][CHUNKS],
    Pack<T, VEC> (&v_frag)[KEY_STEPS_IN_FLIGHT][CHUNKS], const T* k_ptr, const T* v_ptr,
    int64_t k_step, int64_t v_step, int64_t first_key, int64_t key_end, int lane_in_key,
    int head_dim) {
  // BEGIN SOLUTION kernel
  // HINT: For each step u and chunk c: d0 as in load_query; if key first_key + u *
  // HINT: (WARP_SIZE / LANES_PER_KEY) is < key_end and d0 < head_dim, k_frag[u][c] =
  // HINT: load_pack<T, VEC>(k_ptr + u * k_step + d0) and likewise v_frag from v_ptr / v_step;
  // HINT: otherwise zero_pack<T, VEC>().
  constexpr int KEYS_PER_WARP_STEP = WARP_SIZE / LANES_PER_KEY;
#pragma unroll
  for (int u = 0; u < KEY_STEPS_IN_FLIGHT; ++u) {
    const bool key_ok = first_key + u * KEYS_PER_WARP_STEP < key_end;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int d0 = (c * LANES_PER_KEY + lane_in_key) * VEC;
      const bool in_range = key_ok && d0 < head_dim;
      k_frag[u][c] = in_range ? load_pack<T, VEC>(k_ptr + u * k_step + d0) : zero_pack<T, VEC>();
      v_frag[u][c] = in_range ? load_pack<T, VEC>(v_ptr + u * v_step + d0) : zero_pack<T, VEC>();
    }
  }
  // END SOLUTION
}

// 3. The base-2 score of each step's key, (q . k) * score_scale in Score<T>, the dot product
//    over the group's lanes; a key >= key_end (the mask of decode: the query is the last
//    token and sees every cached key) is -inf.
template <typename T, int VEC, int LANES_PER_KEY, int CHUNKS>
__device__ __forceinline__ void key_scores(
    Score<T> (&score)[KEY_STEPS_IN_FLIGHT], const Score<T> (&q_reg)[VEC * CHUNKS],
    const Pack<T, VEC> (&k_frag)[KEY_STEPS_IN_FLIGHT][CHUNKS], int64_t first_key,
    int64_t key_end, Score<T> score_scale) {
  // BEGIN SOLUTION kernel
  // HINT: Per step u: dot (a Score<T>) = sum of q_reg * (the unpacked k_frag[u][c] elements)
  // HINT: over your elements (fma), then a butterfly over the LANES_PER_KEY lanes of the key
  // HINT: (dot += __shfl_xor_sync(0xffffffff, dot, offset), offset = LANES_PER_KEY / 2 .. 1) so
  // HINT: every lane of the group holds the full sum; score[u] = dot * score_scale, or
  // HINT: -INFINITY if the key first_key + u * (WARP_SIZE / LANES_PER_KEY) is >= key_end.
  constexpr int KEYS_PER_WARP_STEP = WARP_SIZE / LANES_PER_KEY;
#pragma unroll
  for (int u = 0; u < KEY_STEPS_IN_FLIGHT; ++u) {
    Score<T> dot = 0;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      float kf[VEC];
      unpack<T, VEC>(k_frag[u][c], kf);
#pragma unroll
      for (int e = 0; e < VEC; ++e) dot = fma(q_reg[c * VEC + e], Score<T>(kf[e]), dot);
    }
    // Butterfly over the key's lanes: every lane of the group ends with the same full sum
    // (a + b == b + a bit for bit), so m and l stay identical across the group.
#pragma unroll
    for (int offset = LANES_PER_KEY / 2; offset > 0; offset /= 2) {
      dot += __shfl_xor_sync(FULL_MASK, dot, offset);
    }
    score[u] = first_key + u * KEYS_PER_WARP_STEP < key_end ? dot * score_scale : -INFINITY;
  }
  // END SOLUTION
}

// 4. The online-softmax step of one warp iteration for this key group: m_new = max(m,
//    scores); l and acc rescaled by exp2(m - m_new); prob[u] = exp2(score[u] - m_new) added
//    to l. The differences are taken in S (Score<T>) and rounded to float after (the largest
//    score gets exactly 1); m, l and acc are S. A group that has seen no key yet (m_new =
//    -inf) changes nothing and gets prob 0.
template <int ELEMS, typename S>
__device__ __forceinline__ void online_softmax_step(float (&prob)[KEY_STEPS_IN_FLIGHT],
                                                    const S (&score)[KEY_STEPS_IN_FLIGHT],
                                                    S& m, S& l, S (&acc)[ELEMS]) {
  // BEGIN SOLUTION kernel
  // HINT: m_new = max of m and every score. If m_new is -INFINITY, set every prob to 0 and
  // HINT: return. Otherwise rescale = exp2f(float(m - m_new)) (0 before the first key);
  // HINT: l *= rescale; acc[i] *= rescale; then per step prob[u] = exp2f(float(score[u] -
  // HINT: m_new)), l += prob[u]; finally m = m_new.
  S m_new = m;
#pragma unroll
  for (int u = 0; u < KEY_STEPS_IN_FLIGHT; ++u) m_new = fmax(m_new, score[u]);
  if (m_new == -INFINITY) {  // this group has seen no key (uniform within the group)
#pragma unroll
    for (int u = 0; u < KEY_STEPS_IN_FLIGHT; ++u) prob[u] = 0.f;
    return;
  }
  const float rescale = exp2f(static_cast<float>(m - m_new));  // exp2f(-inf) = 0 at first
  l *= rescale;
#pragma unroll
  for (int i = 0; i < ELEMS; ++i) acc[i] *= rescale;
#pragma unroll
  for (int u = 0; u < KEY_STEPS_IN_FLIGHT; ++u) {
    prob[u] = exp2f(static_cast<float>(score[u] - m_new));  // past the end: exp2f(-inf) = 0
    l += prob[u];
  }
  m = m_new;
  // END SOLUTION
}

// 5. acc += prob[u] * v for each step's value row (this lane's elements), in Score<T>.
template <typename T, int VEC, int CHUNKS>
__device__ __forceinline__ void accumulate_pv(
    Score<T> (&acc)[VEC * CHUNKS], const float (&prob)[KEY_STEPS_IN_FLIGHT],
    const Pack<T, VEC> (&v_frag)[KEY_STEPS_IN_FLIGHT][CHUNKS]) {
  // BEGIN SOLUTION kernel
  // HINT: For each step u and chunk c: unpack v_frag[u][c] to VEC floats vf and
  // HINT: acc[c * VEC + e] = fma(prob[u], vf[e], acc[c * VEC + e]) (in Score<T>).
#pragma unroll
  for (int u = 0; u < KEY_STEPS_IN_FLIGHT; ++u) {
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      float vf[VEC];
      unpack<T, VEC>(v_frag[u][c], vf);
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        acc[c * VEC + e] = fma(Score<T>(prob[u]), Score<T>(vf[e]), acc[c * VEC + e]);
    }
  }
  // END SOLUTION
}

// 6. Merge the key groups of this warp into every lane: lanes `offset` apart (offset =
//    LANES_PER_KEY .. 16) hold the same elements of different groups. A state that saw no
//    key (m = -inf) gets weight 0, not exp2(nan).
template <int LANES_PER_KEY, int ELEMS, typename S>
__device__ __forceinline__ void merge_key_groups(S& m, S& l, S (&acc)[ELEMS]) {
  // BEGIN SOLUTION kernel
  // HINT: For offset = LANES_PER_KEY, 2 * LANES_PER_KEY, .. < WARP_SIZE: read the other
  // HINT: group's m, l and acc with __shfl_xor_sync(0xffffffff, x, offset); m_new = max of the
  // HINT: two; each side's weight is exp2f(float(its m - m_new)), or 0 if its m is -INFINITY;
  // HINT: l = l * w_self + l_other * w_other, acc likewise; m = m_new.
#pragma unroll
  for (int offset = LANES_PER_KEY; offset < WARP_SIZE; offset *= 2) {
    const S m_other = __shfl_xor_sync(FULL_MASK, m, offset);
    const S l_other = __shfl_xor_sync(FULL_MASK, l, offset);
    const S m_new = fmax(m, m_other);
    const S w_self = m == -INFINITY ? 0.f : exp2f(static_cast<float>(m - m_new));
    const S w_other = m_other == -INFINITY ? 0.f : exp2f(static_cast<float>(m_other - m_new));
    l = l * w_self + l_other * w_other;
#pragma unroll
    for (int i = 0; i < ELEMS; ++i) {
      const S acc_other = __shfl_xor_sync(FULL_MASK, acc[i], offset);
      acc[i] = acc[i] * w_self + acc_other * w_other;
    }
    m = m_new;
  }
  // END SOLUTION
}

// 7. Merge the warps of the block through shared memory and write: the output itself (one
//    split) or this split's partial (o, m, l, in Score<T>) for combine_splits_kernel.
template <typename T, int VEC, int LANES_PER_KEY, int CHUNKS>
__device__ __forceinline__ void merge_warps_and_write(const DecodeParams<T>& p, Score<T> m,
                                                      Score<T> l,
                                                      const Score<T> (&acc)[VEC * CHUNKS], int b,
                                                      int h) {
  // BEGIN SOLUTION kernel
  // HINT: In __shared__ arrays of Score<T>, [WARPS_PER_BLOCK][MAX_HEAD_DIM] (o) and
  // HINT: [WARPS_PER_BLOCK] (m, l): key group 0 of each warp writes its acc elements
  // HINT: d < head_dim, lane 0 its m and l; __syncthreads(). Then block_m = max of the warps' m,
  // HINT: weight_w = exp2f(float(m_w - block_m)) (0 if m_w is -INFINITY), block_l = sum
  // HINT: weight_w * l_w, and thread d (stepping by the block size) o = sum weight_w * o_w[d],
  // HINT: all in Score<T>. One split: out[b, h, d] = float(o / block_l) (0 if block_l == 0),
  // HINT: converted with from_float<T>. Several: partial_o[(bh * num_splits + split) *
  // HINT: head_dim + d] = o, and thread 0 writes partial_m and partial_l there.
  __shared__ Score<T> warp_o[WARPS_PER_BLOCK][MAX_HEAD_DIM];
  __shared__ Score<T> warp_m[WARPS_PER_BLOCK];
  __shared__ Score<T> warp_l[WARPS_PER_BLOCK];
  const int warp = threadIdx.x / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
  const int bh = blockIdx.x;
  const int split = blockIdx.y;

  // Group 0 of each warp publishes the warp's state; its lanes cover every d < head_dim, so
  // no element of warp_o is read uninitialised below.
  if (lane < LANES_PER_KEY) {
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int d = (c * LANES_PER_KEY + lane) * VEC + e;
        if (d < p.head_dim) warp_o[warp][d] = acc[c * VEC + e];
      }
    }
    if (lane == 0) {
      warp_m[warp] = m;
      warp_l[warp] = l;
    }
  }
  __syncthreads();

  Score<T> block_m = -INFINITY;
#pragma unroll
  for (int w = 0; w < WARPS_PER_BLOCK; ++w) block_m = fmax(block_m, warp_m[w]);
  Score<T> weight[WARPS_PER_BLOCK];
  Score<T> block_l = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS_PER_BLOCK; ++w) {
    weight[w] = warp_m[w] == -INFINITY ? 0.f : exp2f(static_cast<float>(warp_m[w] - block_m));
    block_l += weight[w] * warp_l[w];
  }
  for (int d = threadIdx.x; d < p.head_dim; d += THREADS_PER_BLOCK) {
    Score<T> o = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS_PER_BLOCK; ++w) o = fma(weight[w], warp_o[w][d], o);
    if (p.num_splits == 1) {
      // seq_len 0 (only possible through a device length) has no keys: write 0, not 0/0.
      p.out[b * p.out_stride_b + h * p.out_stride_h + d] =
          from_float<T>(block_l > 0.f ? static_cast<float>(o / block_l) : 0.f);
    } else {
      p.partial_o[(static_cast<int64_t>(bh) * p.num_splits + split) * p.head_dim + d] = o;
    }
  }
  if (p.num_splits > 1 && threadIdx.x == 0) {
    p.partial_m[static_cast<int64_t>(bh) * p.num_splits + split] = block_m;
    p.partial_l[static_cast<int64_t>(bh) * p.num_splits + split] = block_l;
  }
  // END SOLUTION
}

// (m, l) <- the merge of softmax states (m, l) and (m_other, l_other): the larger max, and
// each sum rescaled to it; a state that saw no key (m = -inf) adds nothing.
template <typename S>
__device__ __forceinline__ void merge_softmax_state(S& m, S& l, S m_other, S l_other) {
  const S m_new = fmax(m, m_other);
  if (m_new == -INFINITY) return;
  l = (m == -INFINITY ? 0.f : l * exp2f(static_cast<float>(m - m_new))) +
      (m_other == -INFINITY ? 0.f : l_other * exp2f(static_cast<float>(m_other - m_new)));
  m = m_new;
}

// 8. Merge the num_splits partial states of one (batch, head) and write its output row:
// out = sum_s w_s o_s / sum_s w_s l_s with w_s = exp2(m_s - M), M = max_s m_s (w_s = 0 for a
// split that saw no key, m_s = -inf). The threads of the block share the work: the max and
// the weights are computed in parallel (weights into shared memory), then each output element
// is an unrolled sum of independent loads, not a chain of dependent ones. The partials are
// read with __ldcg (from L2): other blocks of the same kernel may have just written them.
template <typename T>
__device__ __forceinline__ void merge_split_states(const Score<T>* m_split,
                                                   const Score<T>* l_split,
                                                   const Score<T>* o_split, int num_splits,
                                                   int head_dim, T* out_row) {
  // BEGIN SOLUTION kernel
  // HINT: M = max over splits of m_split; each split's weight is exp2f(float(m_s - M)), or 0
  // HINT: for an empty split (m_s = -INFINITY); L = sum weight * l_split; element d of the
  // HINT: output is (sum over splits of weight * o_split[s * head_dim + d]) / L, or 0 when
  // HINT: L == 0 (no keys at all), summed in Score<T>, rounded to float once and converted
  // HINT: with from_float<T>. Share the splits between the threads of the block (a block
  // HINT: reduction for M and L, weights in __shared__ memory, at most MAX_SPLITS), then each
  // HINT: thread sums the splits for its elements d.
  __shared__ float weight[MAX_SPLITS];  // the weight of split s
  __shared__ Score<T> warp_max[WARP_SIZE];
  __shared__ Score<T> warp_sum[WARP_SIZE];
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int warps = blockDim.x / WARP_SIZE;

  // One pass over m and l, their loads in flight together: each thread keeps the running
  // (max, sum) of its splits s = tid + k * blockDim, l rescaled as the max grows (task 3's
  // merge of two softmax states); the warps, then the block, merge these states.
  Score<T> m_max = -INFINITY, l_total = 0.f;
  for (int s = threadIdx.x; s < num_splits; s += blockDim.x) {
    const Score<T> m_s = __ldcg(m_split + s), l_s = __ldcg(l_split + s);
    merge_softmax_state(m_max, l_total, m_s, l_s);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const Score<T> m_other = __shfl_xor_sync(FULL_MASK, m_max, offset);
    const Score<T> l_other = __shfl_xor_sync(FULL_MASK, l_total, offset);
    merge_softmax_state(m_max, l_total, m_other, l_other);
  }
  if (lane == 0) {
    warp_max[warp] = m_max;
    warp_sum[warp] = l_total;
  }
  __syncthreads();
  m_max = -INFINITY, l_total = 0.f;
  for (int w = 0; w < warps; ++w) merge_softmax_state(m_max, l_total, warp_max[w], warp_sum[w]);
  for (int s = threadIdx.x; s < num_splits; s += blockDim.x) {  // this thread's own m_s again
    const Score<T> m_s = __ldcg(m_split + s);
    weight[s] = m_s == -INFINITY ? 0.f : exp2f(static_cast<float>(m_s - m_max));
  }
  __syncthreads();  // publishes weight[]

  // The weighted sum of the partial rows. Up to 16 splits: each thread sums its elements d
  // over every split, 16 loads in flight (one L2 round trip). More splits (a short context
  // with few heads: 64 at B 1, H 8, 4096 keys): warp w sums 16-byte pieces (4 elements d, one
  // per lane) of splits w, w + 4, ..., 16 loads in flight per lane, and the warps' sums are
  // added in shared memory, so 64 splits are one round trip instead of four. (Measured against
  // the per-element loop in one process: faster at 64 splits, slower at 16; task6/NOTES.md.)
  // fp32's partials are doubles: they take the per-element loop.
  constexpr int kLoadsInFlight = 16;
  __shared__ float4 warp_o[WARPS_PER_BLOCK][WARP_SIZE];
  const bool by_pieces = std::is_same_v<Score<T>, float> && num_splits > kLoadsInFlight &&
                         head_dim % 4 == 0 && head_dim <= 4 * WARP_SIZE &&
                         warps == WARPS_PER_BLOCK && reinterpret_cast<uintptr_t>(o_split) % 16 == 0;
  if constexpr (std::is_same_v<Score<T>, float>) if (by_pieces) {
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lane < head_dim / 4) {
      for (int base = warp; base < num_splits; base += WARPS_PER_BLOCK * kLoadsInFlight) {
        float4 piece[kLoadsInFlight];  // all loaded before any is used: a fixed count
#pragma unroll
        for (int j = 0; j < kLoadsInFlight; ++j) {
          const int s = base + j * WARPS_PER_BLOCK;
          const float* row = o_split + static_cast<int64_t>(s) * head_dim;
          piece[j] = s < num_splits ? __ldcg(reinterpret_cast<const float4*>(row) + lane)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < kLoadsInFlight; ++j) {
          const int s = base + j * WARPS_PER_BLOCK;
          const float w = s < num_splits ? weight[s] : 0.f;
          o = make_float4(fmaf(w, piece[j].x, o.x), fmaf(w, piece[j].y, o.y),
                          fmaf(w, piece[j].z, o.z), fmaf(w, piece[j].w, o.w));
        }
      }
    }
    warp_o[warp][lane] = o;
    __syncthreads();
  }
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    Score<T> o = 0.f;
    if (by_pieces) {
#pragma unroll
      for (int from = 0; from < WARPS_PER_BLOCK; ++from)  // in warp order
        o += reinterpret_cast<const float*>(&warp_o[from][d / 4])[d % 4];
    } else {
#pragma unroll 16
      for (int s = 0; s < num_splits; ++s)
        o = fma(Score<T>(weight[s]), __ldcg(o_split + static_cast<int64_t>(s) * head_dim + d), o);
    }
    // no visible key: 0
    out_row[d] = from_float<T>(l_total > 0.f ? static_cast<float>(o / l_total) : 0.f);
  }
  // END SOLUTION
}

// The splits of (batch, head) bh, merged into its output row: what the combine kernel and the
// split kernel's last block each do. States is DecodeParams, or SplitStates (decode_common.cuh)
// for another decode path's partial states: the fields have the same names.
template <typename T, template <typename> class States>
__device__ __forceinline__ void merge_head_splits(const States<T>& p, int64_t bh) {
  const int64_t state = bh * p.num_splits;
  merge_split_states<T>(p.partial_m + state, p.partial_l + state, p.partial_o + state * p.head_dim,
                        p.num_splits, p.head_dim,
                        p.out + (bh / p.heads) * p.out_stride_b + (bh % p.heads) * p.out_stride_h);
}

// Beyond the course's two kernels (given): the split kernel merges its own splits. Every
// block publishes its partial (o, m, l), then counts itself on its head's counter; the block
// that arrives last (it sees num_splits - 1) merges every split in split order, so the
// result does not depend on which block that is, and resets the counter for the next decode.
// At short contexts this saves the combine kernel's launch, about as long as the work.
// count_block_is_last (decode_common_device.cuh) publishes a block's writes and counts it.
template <typename T>
__device__ __forceinline__ void merge_in_last_block(const DecodeParams<T>& p) {
  __shared__ bool is_last;
  const int64_t bh = blockIdx.x;
  __syncthreads();  // the block's partial is written
  if (threadIdx.x == 0) is_last = count_block_is_last(p.split_counters + bh, p.num_splits);
  __syncthreads();
  if (!is_last) return;
  merge_head_splits(p, bh);  // the other blocks' partials are visible since the count
  if (threadIdx.x == 0) p.split_counters[bh] = 0;
}

// Beyond the course (given). Launched overlapped (task 6's decode step), the split kernel starts
// while the kernel before it, RoPE + cache append, is still running: a few microseconds in
// which HBM has nothing to do. Meanwhile each block asks L2 for the first p.prefetch_keys K and
// V rows of its split, one bulk prefetch per row (no registers), so that its first loads after
// the wait come from L2. This is safe before the wait for any row, the one being appended
// included: a prefetch only copies HBM into L2, and every write lands in L2, so no load can see
// an older value because of it. The length is only peeked at (RuntimeInt::peek), to bound the rows.
// The host sets prefetch_keys only for the 16-byte path (rows 16-byte aligned, whole pieces).
template <typename T>
__device__ __forceinline__ void prefetch_first_keys(const DecodeParams<T>& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.prefetch_keys <= 0) return;
  const int b = blockIdx.x / p.heads;
  const int h = blockIdx.x % p.heads;
  const int64_t seq_len = clamp64(p.seq_len.peek(b), 0, p.max_seq_len);
  const int64_t key_begin = static_cast<int64_t>(blockIdx.y) * p.keys_per_split;
  const int64_t key_end =
      min64(key_begin + min64(p.prefetch_keys, p.keys_per_split), seq_len);
  const unsigned row_bytes = static_cast<unsigned>(p.head_dim * sizeof(T));
  for (int64_t row = threadIdx.x; row < 2 * (key_end - key_begin); row += blockDim.x) {
    const int64_t key = key_begin + row / 2;
    const T* ptr = row % 2 == 0 ? p.k + b * p.k_stride_b + h * p.k_stride_h + key * p.k_stride_s
                                : p.v + b * p.v_stride_b + h * p.v_stride_h + key * p.v_stride_s;
    attn::prefetch_to_l2(ptr, row_bytes);
  }
#endif
}

// grid (B*H, num_splits), WARPS_PER_BLOCK warps. The host guarantees LANES_PER_KEY * VEC *
// CHUNKS >= head_dim and, when VEC > 1, 16-byte alignment and head_dim % VEC == 0.
template <typename T, int VEC, int LANES_PER_KEY, int CHUNKS>
__global__ void __launch_bounds__(THREADS_PER_BLOCK, min_blocks_per_sm(VEC, CHUNKS))
    decode_split_kernel(const DecodeParams<T> p) {
  prefetch_first_keys(p);               // given: while the kernel before finishes
  attn::wait_for_previous_kernel();     // given: q and the newest key come from it
  // BEGIN SOLUTION kernel
  // HINT: Block (bh, split) handles keys [split * keys_per_split, +keys_per_split) clipped to
  // HINT: seq_len (read it with p.seq_len.at(b), clamp it to [0, max_seq_len]); a causal flag
  // HINT: masks nothing: the query is the last token, it sees every cached key.
  // HINT: Loop over the keys: each warp takes KEY_STEPS_IN_FLIGHT steps of (WARP_SIZE /
  // HINT: LANES_PER_KEY) keys per iteration, the warps of the block consecutive ranges, the block
  // HINT: KEYS_PER_BLOCK_ITER keys per iteration. This lane's key of step 0 is base + key_group
  // HINT: (key_group = lane / LANES_PER_KEY), keys of the next step KEYS_PER_WARP_STEP rows
  // HINT: further. Issue the first iteration's load_key_steps, then load_query (both trips to
  // HINT: memory overlap); m = -inf, l = 0, acc = 0; per iteration: key_scores,
  // HINT: online_softmax_step, accumulate_pv, then load_key_steps for the next iteration. Keep
  // HINT: every lane of a warp in the loop for the same iterations (the shuffles are
  // HINT: full-warp). At the end: merge_key_groups, then merge_warps_and_write.
  constexpr int KEYS_PER_WARP_STEP = WARP_SIZE / LANES_PER_KEY;  // key groups in a warp
  constexpr int ELEMS = VEC * CHUNKS;                             // row elements per lane
  constexpr int KEYS_PER_WARP_ITER = KEYS_PER_WARP_STEP * KEY_STEPS_IN_FLIGHT;
  constexpr int KEYS_PER_BLOCK_ITER = KEYS_PER_WARP_ITER * WARPS_PER_BLOCK;
  static_assert(WARP_SIZE % LANES_PER_KEY == 0, "a key group must not straddle warps");
  static_assert(LANES_PER_KEY * VEC * CHUNKS >= 128 || VEC > 1,
                "the scalar path covers 128 dimensions or more (the host picks one that holds D)");

  const int bh = blockIdx.x;
  const int split = blockIdx.y;
  const int b = bh / p.heads;
  const int h = bh % p.heads;
  const int warp = threadIdx.x / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
  const int key_group = lane / LANES_PER_KEY;  // which key of a warp step this lane reads
  const int lane_in_key = lane % LANES_PER_KEY;

  // Keys this block attends to. seq_len may come from device memory: clamp it so that no
  // value can make us read past the cache. The query is token seq_len - 1, so a causal mask
  // (key j visible iff j <= seq_len - 1) keeps every key below seq_len: nothing is masked.
  const int64_t seq_len = clamp64(p.seq_len.at(b), 0, p.max_seq_len);
  const int64_t query_pos = seq_len - 1;
  const int64_t visible = p.causal ? min64(seq_len, query_pos + 1) : seq_len;  // == seq_len
  const int64_t key_begin = static_cast<int64_t>(split) * p.keys_per_split;
  const int64_t key_end = min64(key_begin + p.keys_per_split, visible);

  // This lane's first key row; the pointers advance by a block's keys per iteration. `base`
  // depends only on the warp, so every lane of a warp runs the same iterations and the
  // full-mask shuffles are legal.
  const T* k_head = p.k + b * p.k_stride_b + h * p.k_stride_h;
  const T* v_head = p.v + b * p.v_stride_b + h * p.v_stride_h;
  int64_t base = key_begin + warp * KEYS_PER_WARP_ITER;
  const T* k_ptr = k_head + (base + key_group) * p.k_stride_s;
  const T* v_ptr = v_head + (base + key_group) * p.v_stride_s;
  const int64_t k_step = KEYS_PER_WARP_STEP * p.k_stride_s;  // to this lane's next key
  const int64_t v_step = KEYS_PER_WARP_STEP * p.v_stride_s;
  const int64_t k_advance = KEYS_PER_BLOCK_ITER * p.k_stride_s;  // to the next iteration
  const int64_t v_advance = KEYS_PER_BLOCK_ITER * p.v_stride_s;

  // The first iteration's K and V go out before q: the two trips to memory overlap. At short
  // contexts a block makes only a few such trips, so one fewer is felt (keys past key_end
  // read nothing, so this is safe for a warp without keys).
  Pack<T, VEC> k_frag[KEY_STEPS_IN_FLIGHT][CHUNKS];
  Pack<T, VEC> v_frag[KEY_STEPS_IN_FLIGHT][CHUNKS];
  load_key_steps<T, VEC, LANES_PER_KEY, CHUNKS>(k_frag, v_frag, k_ptr, v_ptr, k_step, v_step,
                                                base + key_group, key_end, lane_in_key, p.head_dim);
  Score<T> q_reg[ELEMS];
  load_query<T, VEC, LANES_PER_KEY, CHUNKS>(q_reg, p.q + b * p.q_stride_b + h * p.q_stride_h,
                                            lane_in_key, p.head_dim);

  // State of this lane's key group: m, l (the same in every lane of the group) and acc (this
  // lane's output elements).
  Score<T> m = -INFINITY, l = 0.f;
  Score<T> acc[ELEMS];
#pragma unroll
  for (int i = 0; i < ELEMS; ++i) acc[i] = 0.f;

  while (base < key_end) {
    Score<T> score[KEY_STEPS_IN_FLIGHT];
    key_scores<T, VEC, LANES_PER_KEY, CHUNKS>(score, q_reg, k_frag, base + key_group, key_end,
                                              p.score_scale);
    float prob[KEY_STEPS_IN_FLIGHT];
    online_softmax_step<ELEMS>(prob, score, m, l, acc);
    accumulate_pv<T, VEC, CHUNKS>(acc, prob, v_frag);
    base += KEYS_PER_BLOCK_ITER;
    k_ptr += k_advance;
    v_ptr += v_advance;
    if (base < key_end)  // the next iteration's keys (the same on every lane of the warp)
      load_key_steps<T, VEC, LANES_PER_KEY, CHUNKS>(k_frag, v_frag, k_ptr, v_ptr, k_step, v_step,
                                                    base + key_group, key_end, lane_in_key,
                                                    p.head_dim);
  }

  merge_key_groups<LANES_PER_KEY, ELEMS>(m, l, acc);
  merge_warps_and_write<T, VEC, LANES_PER_KEY, CHUNKS>(p, m, l, acc, b, h);
  // END SOLUTION
  // The cache is read: a kernel launched overlapped after this one (task 6's o_proj) may now be
  // scheduled into the merge below; it waits for this kernel to finish before it reads.
  attn::let_next_kernel_start();
  if (p.num_splits > 1 && p.split_counters != nullptr) merge_in_last_block(p);
}

// grid (B*H), MERGE_THREADS threads: block bh merges the splits of (batch, head) bh. run_decode
// launches it with its DecodeParams, combine_splits (below) with another path's SplitStates.
template <typename T, template <typename> class States>
__global__ void __launch_bounds__(MERGE_THREADS) combine_splits_kernel(const States<T> p) {
  merge_head_splits(p, blockIdx.x);
}

// ---- 3. beyond the course: merging normalised partial outputs by their log-sum-exp -------

// The grouped decodes on tensor cores (decode_gqa.cu; task 4's kernel on the query heads of a
// KV head packed as rows) write each key range's normalised output and its base-2 log-sum-exp
// (MergeParams, decode_common.cuh); out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M).
// One block per output row r of a KV head (r = i * group + g: query i of query head g).

template <typename T, typename Partial>
__global__ void __launch_bounds__(MERGE_THREADS) merge_splits_kernel(const MergeParams<T, Partial> p) {
  // BEGIN SOLUTION kernel
  // HINT: Optional extension: the merge of a split-KV decode from each split's LSE.
  __shared__ float weight[MAX_SPLITS];
  __shared__ float warp_val[MERGE_THREADS / WARP_SIZE];
  constexpr int WARPS = MERGE_THREADS / WARP_SIZE;
  const int rows = p.group * p.seq_q;  // the rows of one KV head
  const int64_t b_kv = blockIdx.x / rows;
  const int r = blockIdx.x % rows;
  const int heads_kv = p.heads_q / p.group;
  const int64_t b = b_kv / heads_kv;
  const int h = static_cast<int>(b_kv % heads_kv) * p.group + r % p.group, i = r / p.group;
  const int64_t first = b_kv * p.num_splits * rows + r;
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < p.num_splits; s += blockDim.x) m = fmaxf(m, p.lse[first + s * rows]);
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, offset));
  if (lane == 0) warp_val[warp] = m;
  __syncthreads();
  m = warp_val[0];
#pragma unroll
  for (int w = 1; w < WARPS; ++w) m = fmaxf(m, warp_val[w]);
  __syncthreads();
  float total = 0.f;
  for (int s = threadIdx.x; s < p.num_splits; s += blockDim.x) {
    const float lse = p.lse[first + s * rows];
    const float w = lse == -INFINITY ? 0.f : exp2f(lse - m);
    weight[s] = w;
    total += w;
  }
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(FULL_MASK, total, offset);
  if (lane == 0) warp_val[warp] = total;
  __syncthreads();
  total = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) total += warp_val[w];
  const float inv_total = total > 0.f ? 1.f / total : 0.f;  // no visible key anywhere: 0
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float o = 0.f;
#pragma unroll 8
    for (int s = 0; s < p.num_splits; ++s)
      o = fmaf(weight[s], to_float(p.partial[(first + static_cast<int64_t>(s) * rows) * p.head_dim + d]), o);
    p.out[b * p.out_stride_b + h * p.out_stride_h + i * p.out_stride_s + d] = from_float<T>(o * inv_total);
  }
  // END SOLUTION
}

// ---- host side: layout choices and launches (given) ---------------------------------------

bool multiple_of(int64_t bytes, int64_t unit) { return bytes % unit == 0; }

}  // namespace

namespace attn_decode {

// The counters of the merges in a split's last block (merge_in_last_block: one int per
// (batch, head) for the split kernel, per (batch, KV head, row tile) for decode_gqa.cu),
// allocated and zeroed once per device and left zeroed by every decode, so a captured CUDA
// graph can keep using them. Allocation cannot happen inside a capture: then (and past the
// capacity) the answer is nullptr and a merge kernel merges instead. Decodes on one device
// share the counters, so they must not run at the same time on two streams (they are
// stream-ordered in a model's decode loop, captured or not). ATTN_DECODE_COMBINE_KERNEL=1
// (read on every call, so a test can check both paths) always answers nullptr.
int* split_counters(cudaStream_t stream, int64_t count) {
  constexpr int64_t kCapacity = 1 << 16;
  constexpr int kMaxDevices = 64;
  static int* buffers[kMaxDevices] = {};
  static std::mutex mutex;
  if (attn::env_choice("ATTN_DECODE_COMBINE_KERNEL", {"0", "1"}, 0) == 1) return nullptr;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  if (count > kCapacity || device >= kMaxDevices) return nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (buffers[device] == nullptr) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return nullptr;
    int* buffer = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&buffer, kCapacity * sizeof(int)));  // kept for the process
    // Zeroed on this stream and waited for: the first decode of any stream finds zeros.
    C10_CUDA_CHECK(cudaMemsetAsync(buffer, 0, kCapacity * sizeof(int), stream));
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    buffers[device] = buffer;
  }
  return buffers[device];
}

}  // namespace attn_decode

namespace {

// How many K and V rows of its split each block asks L2 for before its wait (prefetch_first_keys):
// ATTN_DECODE_PREFETCH_KEYS, read on every call so that one process can compare settings;
// without it, kDefaultPrefetchKeys, the best of 0 to 128 at the short contexts and in task 6's
// step (task6/NOTES.md). Only an overlapped launch has a kernel before it to overlap.
int decode_prefetch_keys() {
  constexpr int kDefaultPrefetchKeys = 32;
  if (!attn::overlapped_launches_enabled()) return 0;
  return attn::env_int("ATTN_DECODE_PREFETCH_KEYS", kDefaultPrefetchKeys, 0, 1 << 20,
                       "a count of K and V rows to prefetch");
}

template <typename T>
void launch_split_kernel(DecodeParams<T> p, dim3 grid, cudaStream_t stream, bool wide) {
  constexpr int VEC = 16 / sizeof(T);  // 8 fp16/bf16 or 4 fp32 elements = 16 bytes
  const dim3 block(THREADS_PER_BLOCK);
  if (!wide) {  // scalar loads: 32 lanes per key, 4 chunks cover head_dim <= 128, 8 up to 256
    p.prefetch_keys = 0;  // the bulk prefetch needs 16-byte rows
    attn::launch_overlapped("decode_split_kernel",
                            p.head_dim <= 128 ? decode_split_kernel<T, 1, WARP_SIZE, 4>
                                              : decode_split_kernel<T, 1, WARP_SIZE, 8>,
                            grid, block, stream, p);
    return;
  }
  p.prefetch_keys = decode_prefetch_keys();
  // The fewest lanes (a power of two, at least 4) whose 16-byte packs cover head_dim.
  const int lanes_needed = attn::ceil_div(p.head_dim, VEC);
  auto kernel = lanes_needed <= 4    ? decode_split_kernel<T, VEC, 4, 1>
                : lanes_needed <= 8  ? decode_split_kernel<T, VEC, 8, 1>
                : lanes_needed <= 16 ? decode_split_kernel<T, VEC, 16, 1>
                                     : decode_split_kernel<T, VEC, 32, 1>;  // fp32 D in (64, 128], 16-bit D > 128
  if constexpr (VEC == 4) {  // fp32, D in (128, 256]: two 16-byte packs per lane
    if (lanes_needed > WARP_SIZE) kernel = decode_split_kernel<T, VEC, 32, 2>;
  }
  attn::launch_overlapped("decode_split_kernel", kernel, grid, block, stream, p);
}

// The decode pipeline for one dtype. q/out [B, H, 1, D], k/v [B, H, S_max, D], validated.
// `split_context` is the number of keys the splits cover: seq_len for a host length, S_max
// for a device length (the split layout must not depend on a value the host cannot see).
template <typename T>
void run_decode(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                torch::Tensor& out, RuntimeInt seq_len, int64_t split_context, bool causal,
                int num_splits) {
  const int batch = static_cast<int>(q.size(0));
  const int heads = static_cast<int>(q.size(1));
  const int head_dim = static_cast<int>(q.size(3));
  const int64_t batch_heads = static_cast<int64_t>(batch) * heads;
  const bool wide = can_load_16_bytes(q, k, v);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  DecodeParams<T> p{};
  // Beyond the course (given): the split kernel merges its own splits when it has counters.
  p.split_counters = num_splits > 1 ? split_counters(stream, batch_heads) : nullptr;
  // BEGIN SOLUTION
  // HINT: Fill the rest of p (pointers from data_ptr, strides from stride(), score_scale =
  // HINT: LOG2_E / sqrt(head_dim) in double, as a Score<T>, keys_per_split = ceil(split_context
  // HINT: / num_splits)). With num_splits > 1 allocate the partials of Score<T> (float64 for
  // HINT: fp32, else float32): o: B*H*num_splits*head_dim, m and l: B*H*num_splits each.
  // HINT: Launch launch_split_kernel with grid (B*H, num_splits), then,
  // HINT: with several splits and no p.split_counters, combine_splits_kernel with grid B*H and
  // HINT: MERGE_THREADS threads; attn::check_launch after each launch.
  p.q = reinterpret_cast<const T*>(q.data_ptr());
  p.k = reinterpret_cast<const T*>(k.data_ptr());
  p.v = reinterpret_cast<const T*>(v.data_ptr());
  p.out = reinterpret_cast<T*>(out.data_ptr());
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.k_stride_b = k.stride(0);
  p.k_stride_h = k.stride(1);
  p.k_stride_s = k.stride(2);
  p.v_stride_b = v.stride(0);
  p.v_stride_h = v.stride(1);
  p.v_stride_s = v.stride(2);
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.heads = heads;
  p.head_dim = head_dim;
  p.max_seq_len = k.size(2);
  p.seq_len = seq_len;
  p.causal = causal;
  p.score_scale = static_cast<Score<T>>(LOG2_E / std::sqrt(static_cast<double>(head_dim)));
  p.num_splits = num_splits;
  p.keys_per_split = (split_context + num_splits - 1) / num_splits;

  // The partials live only until the combine has run; the caching allocator reuses the
  // memory in stream order (and inside a CUDA graph capture, from the graph's pool).
  torch::Tensor workspace;
  if (num_splits > 1) {
    const int64_t states = batch_heads * num_splits;
    workspace = torch::empty({states * (head_dim + 2)}, q.options().dtype(score_dtype<T>()));
    p.partial_o = workspace.data_ptr<Score<T>>();
    p.partial_m = p.partial_o + states * head_dim;
    p.partial_l = p.partial_m + states;
  }

  const dim3 grid(static_cast<unsigned>(batch_heads), static_cast<unsigned>(num_splits));
  launch_split_kernel<T>(p, grid, stream, wide);
  attn::check_launch("decode_split_kernel");
  if (num_splits > 1 && p.split_counters == nullptr) {
    combine_splits_kernel<T><<<static_cast<unsigned>(batch_heads), MERGE_THREADS, 0, stream>>>(p);
    attn::check_launch("combine_splits_kernel");
  }
  // END SOLUTION
}

}  // namespace

namespace attn_decode {

template <typename T>
void combine_splits(const SplitStates<T>& states, int64_t rows, cudaStream_t stream) {
  combine_splits_kernel<T><<<static_cast<unsigned>(rows), MERGE_THREADS, 0, stream>>>(states);
  attn::check_launch("combine_splits_kernel");
}

template void combine_splits<float>(const SplitStates<float>&, int64_t, cudaStream_t);
template void combine_splits<__half>(const SplitStates<__half>&, int64_t, cudaStream_t);
template void combine_splits<__nv_bfloat16>(const SplitStates<__nv_bfloat16>&, int64_t, cudaStream_t);

template <typename T>
void merge_lse_splits(const MergeParams<T, float>& params, int64_t rows, cudaStream_t stream) {
  merge_splits_kernel<T, float><<<static_cast<unsigned>(rows), MERGE_THREADS, 0, stream>>>(params);
  attn::check_launch("merge_splits_kernel");
}

template void merge_lse_splits<float>(const MergeParams<float, float>&, int64_t, cudaStream_t);
template void merge_lse_splits<__half>(const MergeParams<__half, float>&, int64_t, cudaStream_t);
template void merge_lse_splits<__nv_bfloat16>(const MergeParams<__nv_bfloat16, float>&, int64_t,
                                              cudaStream_t);

}  // namespace attn_decode

// ---- entry points (declared in binding.cpp) ----------------------------------------------

// Write k, v [B, n_new, hidden] into k_cache, v_cache [B, max_seq_len, hidden] at positions
// [current_pos, current_pos + n_new). current_pos_tensor, when given, replaces current_pos
// and is read on the device (0-d or [B], int32); rows it sends outside the cache are skipped.
void update_kv_cache(torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor k, torch::Tensor v,
                     int64_t current_pos, std::optional<torch::Tensor> current_pos_tensor) {
  attn::check_cuda_tensor(k_cache, "k_cache");
  attn::check_cuda_tensor(v_cache, "v_cache");
  attn::check_cuda_tensor(k, "k");
  attn::check_cuda_tensor(v, "v");
  check_float_dtype(k_cache, "k_cache");
  attn::check_same(k_cache, "k_cache", v_cache, "v_cache");
  attn::check_same(k_cache, "k_cache", k, "k");
  attn::check_same(k_cache, "k_cache", v, "v");
  attn::check_dim(k_cache, "k_cache", 3, "[batch, max_seq_len, hidden]");
  attn::check_dim(v_cache, "v_cache", 3, "[batch, max_seq_len, hidden]");
  attn::check_dim(k, "k", 3, "[batch, new_tokens, hidden]");
  attn::check_dim(v, "v", 3, "[batch, new_tokens, hidden]");
  TORCH_CHECK_VALUE(k_cache.sizes() == v_cache.sizes(), attn::str("k_cache ", k_cache.sizes(),
                    " and v_cache ", v_cache.sizes(), " must have the same shape."));
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), attn::str("k ", k.sizes(), " and v ", v.sizes(),
                    " must have the same shape."));
  attn::check_nonempty(k_cache, "k_cache");
  attn::check_nonempty(k, "k");
  const int64_t batch = k_cache.size(0), max_seq_len = k_cache.size(1), hidden = k_cache.size(2);
  const int64_t new_tokens = k.size(1);
  TORCH_CHECK_VALUE(k.size(0) == batch && k.size(2) == hidden, attn::str("k/v have shape ", k.sizes(),
                    " but the caches are ", k_cache.sizes(), "; k/v must be [", batch,
                    ", new_tokens, ", hidden, "] (same batch and hidden as the cache)."));
  for (const auto& [t, name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"},
                                std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_last_dim_contiguous(*t, name);
  }
  if (!current_pos_tensor.has_value()) {
    TORCH_CHECK_VALUE(current_pos >= 0, attn::str("current_pos must be >= 0 but is ", current_pos, "."));
    TORCH_CHECK_VALUE(current_pos + new_tokens <= max_seq_len, attn::str("current_pos ", current_pos, " + ",
                      new_tokens, " new token(s) overflows the cache: max_seq_len is ", max_seq_len,
                      "; allocate a longer cache or stop generating."));
  }
  const RuntimeInt position =
      runtime_int(current_pos, current_pos_tensor, "current_pos", batch, k_cache.device());
  c10::cuda::CUDAGuard guard(k_cache.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  // BEGIN SOLUTION
  // HINT: Pick the widest copy unit (16, 8, 4 or 2 bytes, at least the element size) that
  // HINT: divides the row bytes (hidden * element_size), every data_ptr and every batch/token
  // HINT: stride in bytes; fill CacheUpdateParams with strides in units; launch
  // HINT: update_cache_kernel<uint4 / uint2 / unsigned / unsigned short> with COPY_THREADS
  // HINT: threads and one block per new row (at most 65535: the kernel loops over rows),
  // HINT: then attn::check_launch.
  const int64_t elem = k.element_size();
  const torch::Tensor* tensors[] = {&k_cache, &v_cache, &k, &v};
  int64_t unit = 16;
  for (; unit > elem; unit /= 2) {
    bool fits = multiple_of(hidden * elem, unit);
    for (const torch::Tensor* t : tensors) {
      fits = fits && pointer_aligned(t->data_ptr(), unit) &&
             multiple_of(t->stride(0) * elem, unit) && multiple_of(t->stride(1) * elem, unit);
    }
    if (fits) break;
  }
  const int64_t per_unit = unit / elem;  // elements per copy unit
  CacheUpdateParams p{};
  p.k_cache = static_cast<char*>(k_cache.data_ptr());
  p.v_cache = static_cast<char*>(v_cache.data_ptr());
  p.k = static_cast<const char*>(k.data_ptr());
  p.v = static_cast<const char*>(v.data_ptr());
  p.batch = batch;
  p.new_tokens = new_tokens;
  p.max_seq_len = max_seq_len;
  p.units_per_row = hidden / per_unit;
  p.k_cache_stride_b = k_cache.stride(0) / per_unit;
  p.k_cache_stride_s = k_cache.stride(1) / per_unit;
  p.v_cache_stride_b = v_cache.stride(0) / per_unit;
  p.v_cache_stride_s = v_cache.stride(1) / per_unit;
  p.k_stride_b = k.stride(0) / per_unit;
  p.k_stride_s = k.stride(1) / per_unit;
  p.v_stride_b = v.stride(0) / per_unit;
  p.v_stride_s = v.stride(1) / per_unit;
  p.position = position;

  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(batch * new_tokens, 65535));
  switch (unit) {
    case 16: update_cache_kernel<uint4><<<blocks, COPY_THREADS, 0, stream>>>(p); break;
    case 8: update_cache_kernel<uint2><<<blocks, COPY_THREADS, 0, stream>>>(p); break;
    case 4: update_cache_kernel<unsigned><<<blocks, COPY_THREADS, 0, stream>>>(p); break;
    default: update_cache_kernel<unsigned short><<<blocks, COPY_THREADS, 0, stream>>>(p); break;
  }
  attn::check_launch("update_cache_kernel");
  // END SOLUTION
}

// softmax(q k^T / sqrt(D)) v for one query per (batch, head) against keys [0, seq_len) of the
// cache. q [B, H, 1, D], k/v [B, H, S_max, D], any strides with a contiguous last dimension
// (the [B, S_max, hidden] cache viewed per head, or Hugging Face's [B, H, S, D] cache).
// seq_len_tensor, when given, replaces seq_len and is read on the device (0-d or [B], int32).
torch::Tensor decode_attention_bhsd(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                    int64_t seq_len,
                                    std::optional<torch::Tensor> seq_len_tensor, bool causal,
                                    int64_t num_splits, std::optional<torch::Tensor> out) {
  check_decode_qkv(q, k, v, "[batch, heads, max_seq_len, head_dim]");
  TORCH_CHECK_VALUE(q.size(2) == 1, attn::str("decode attends one new query per sequence: q must be [batch, "
                    "heads, 1, head_dim] but has shape ", q.sizes(),
                    "; run a prompt through prefill (task 4's flash_attention) instead."));
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), attn::str("k ", k.sizes(), " and v ", v.sizes(),
                    " must have the same shape."));
  TORCH_CHECK_VALUE(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
                    attn::str("q ", q.sizes(), " does not match the cache ", k.sizes(),
                    ": batch, heads and head_dim must agree."));
  attn::check_nonempty(q, "q");
  attn::check_nonempty(k, "k");
  attn::check_head_dim(q.size(3));
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k, "k");
  check_last_dim_contiguous(v, "v");
  const int64_t batch = q.size(0), max_seq_len = k.size(2);
  TORCH_CHECK_VALUE(batch * q.size(1) <= std::numeric_limits<int32_t>::max() &&
                    max_seq_len <= std::numeric_limits<int32_t>::max(),
                    attn::str("batch * heads and max_seq_len must each fit in int32."));
  if (!seq_len_tensor.has_value()) {
    TORCH_CHECK_VALUE(seq_len >= 1, attn::str("seq_len must be at least 1 (the new token itself) but is ",
                      seq_len, "."));
    TORCH_CHECK_VALUE(seq_len <= max_seq_len, attn::str("seq_len ", seq_len,
                      " is beyond the cache: max_seq_len is ", max_seq_len, "."));
  }
  TORCH_CHECK_VALUE(num_splits >= 1 && num_splits <= MAX_SPLITS, attn::str("num_splits must be in [1, ",
                    MAX_SPLITS, "] but is ", num_splits, "."));
  const RuntimeInt length = runtime_int(seq_len, seq_len_tensor, "seq_len", batch, q.device());
  check_out_like_q(out, q);
  c10::cuda::CUDAGuard guard(q.device());

  torch::Tensor result = out.has_value() ? *out : torch::empty(q.sizes(), q.options());
  const int64_t split_context = seq_len_tensor.has_value() ? max_seq_len : seq_len;
  const int splits = static_cast<int>(num_splits);
  switch (q.scalar_type()) {
    case torch::kFloat32:
      run_decode<float>(q, k, v, result, length, split_context, causal, splits);
      break;
    case torch::kFloat16:
      run_decode<__half>(q, k, v, result, length, split_context, causal, splits);
      break;
    default:
      run_decode<__nv_bfloat16>(q, k, v, result, length, split_context, causal, splits);
      break;
  }
  return result;
}

// The course's layout: q [B, 1, hidden] against k_cache/v_cache [B, max_seq_len, hidden]
// (heads interleaved in hidden). The per-head views are made here, without copies.
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                               int64_t num_heads, int64_t seq_len,
                               std::optional<torch::Tensor> seq_len_tensor, bool causal,
                               int64_t num_splits, std::optional<torch::Tensor> out) {
  attn::check_cuda_tensor(q, "q");
  attn::check_cuda_tensor(k_cache, "k_cache");
  attn::check_cuda_tensor(v_cache, "v_cache");
  attn::check_dim(q, "q", 3, "[batch, 1, hidden]");
  attn::check_dim(k_cache, "k_cache", 3, "[batch, max_seq_len, hidden]");
  attn::check_dim(v_cache, "v_cache", 3, "[batch, max_seq_len, hidden]");
  TORCH_CHECK_VALUE(q.size(1) == 1, attn::str("decode takes one new token per sequence: q must be [batch, 1, "
                    "hidden] but has shape ", q.sizes(), "; run a prompt through prefill instead."));
  const int64_t hidden = q.size(2);
  TORCH_CHECK_VALUE(num_heads >= 1 && hidden % num_heads == 0, attn::str("hidden ", hidden,
                    " is not divisible by num_heads ", num_heads, "."));
  TORCH_CHECK_VALUE(k_cache.size(2) == hidden && v_cache.size(2) == hidden, attn::str("q has hidden ", hidden,
                    " but the caches are ", k_cache.sizes(), " and ", v_cache.sizes(), "."));
  check_last_dim_contiguous(q, "q");
  check_last_dim_contiguous(k_cache, "k_cache");
  check_last_dim_contiguous(v_cache, "v_cache");
  const int64_t head_dim = hidden / num_heads;
  // [B, S, hidden] -> [B, S, H, D] -> [B, H, S, D]: splitting a stride-1 dimension is always
  // a view, so the kernel reads the cache where it is.
  auto per_head = [&](const torch::Tensor& t) {
    return t.view({t.size(0), t.size(1), num_heads, head_dim}).transpose(1, 2);
  };
  check_out_like_q(out, q);
  torch::Tensor result = out.has_value() ? *out : torch::empty(q.sizes(), q.options());
  decode_attention_bhsd(per_head(q), per_head(k_cache), per_head(v_cache), seq_len, seq_len_tensor,
                        causal, num_splits, per_head(result));
  return result;
}

// Merge the key ranges of a split decode (see merge_splits_kernel): partial [B, H_kv, splits,
// G, D] (contiguous, out's dtype or float32), lse [B, H_kv, splits, G] float32 (contiguous), into out
// [B, H_kv * G, 1, D] (any strides with a contiguous last dimension).
void merge_attention_splits(torch::Tensor partial, torch::Tensor lse, torch::Tensor out) {
  attn::check_cuda_tensor(partial, "partial");
  attn::check_cuda_tensor(lse, "lse");
  attn::check_cuda_tensor(out, "out");
  check_float_dtype(partial, "partial");
  // float32 partials (the tensor-core decode's) merge into any dtype; else one dtype.
  if (partial.scalar_type() != torch::kFloat32) attn::check_same(partial, "partial", out, "out");
  TORCH_CHECK_VALUE(partial.device() == out.device(), attn::str("partial is on ", partial.device(),
                    " but out is on ", out.device(), "; put them on the same GPU."));
  TORCH_CHECK_TYPE(lse.scalar_type() == torch::kFloat32, attn::str("lse must be float32 but has dtype ",
                   lse.scalar_type(), "."));
  attn::check_dim(partial, "partial", 5, "[batch, kv_heads, splits, group, head_dim]");
  attn::check_dim(lse, "lse", 4, "[batch, kv_heads, splits, group]");
  attn::check_dim(out, "out", 4, "[batch, heads, 1, head_dim]");
  TORCH_CHECK_VALUE(partial.is_contiguous() && lse.is_contiguous(), attn::str("partial and lse must be contiguous."));
  const int64_t batch = partial.size(0), heads_kv = partial.size(1), splits = partial.size(2);
  const int64_t group = partial.size(3), head_dim = partial.size(4);
  TORCH_CHECK_VALUE(lse.sizes() == partial.sizes().slice(0, 4), attn::str("lse has shape ", lse.sizes(),
                    " but partial is ", partial.sizes(), "."));
  TORCH_CHECK_VALUE(out.size(0) == batch && out.size(1) == heads_kv * group && out.size(2) == 1 &&
                    out.size(3) == head_dim, attn::str("out has shape ", out.sizes(), " but must be [", batch,
                    ", ", heads_kv * group, ", 1, ", head_dim, "]."));
  TORCH_CHECK_VALUE(splits >= 1 && splits <= MAX_SPLITS && head_dim <= MAX_HEAD_DIM,
                    attn::str("splits must be in [1, ", MAX_SPLITS, "] and head_dim at most ", MAX_HEAD_DIM, "."));
  check_last_dim_contiguous(out, "out");
  c10::cuda::CUDAGuard guard(out.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const unsigned blocks = static_cast<unsigned>(batch * heads_kv * group);
  const bool float_partials = partial.scalar_type() == torch::kFloat32;
  auto launch_with = [&](auto* out_tag, auto* partial_tag) {
    using T = std::remove_pointer_t<decltype(out_tag)>;
    using Partial = std::remove_pointer_t<decltype(partial_tag)>;
    MergeParams<T, Partial> p{reinterpret_cast<const Partial*>(partial.data_ptr()),
                              lse.data_ptr<float>(), reinterpret_cast<T*>(out.data_ptr()),
                              out.stride(0), out.stride(1), static_cast<int>(heads_kv * group),
                              static_cast<int>(group), static_cast<int>(splits),
                              static_cast<int>(head_dim)};
    merge_splits_kernel<T, Partial><<<blocks, MERGE_THREADS, 0, stream>>>(p);
  };
  auto launch = [&](auto* out_tag) {
    using T = std::remove_pointer_t<decltype(out_tag)>;
    if (float_partials) launch_with(out_tag, static_cast<float*>(nullptr));
    else launch_with(out_tag, static_cast<T*>(nullptr));
  };
  switch (out.scalar_type()) {
    case torch::kFloat32: launch(static_cast<float*>(nullptr)); break;
    case torch::kFloat16: launch(static_cast<__half*>(nullptr)); break;
    default: launch(static_cast<__nv_bfloat16*>(nullptr)); break;
  }
  attn::check_launch("merge_splits_kernel");
}
