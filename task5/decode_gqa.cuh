// Task 5, beyond the course: grouped-query decode on tensor cores, built for the memory system.
//
// The idea. Grouped-query attention (Llama-3, Mistral, Qwen2, Gemma, GPT-OSS) gives the
// G = H_q / H_kv query heads of a group one KV head, so a decode step reads each KV head's
// cache once for G query rows. Those rows are the rows of one mma.sync.m16n8k16 tile
// (FlashAttention's "pack GQA"): row r = i * G + g is query i (of S_q <= 16, speculative
// decoding's few rows; 1 for one new token) of query head g, padded to 16 rows, and each key
// tile costs a handful of tensor-core instructions, whatever G is. A decode does ~2 FLOPs per
// byte it reads, so what decides its speed is only whether the cache streams at memory speed:
//   * split-KV: the keys of a (sequence, KV head) are cut into num_splits ranges, one block
//     each, so that batch 1 fills the GPU (8 KV heads alone would occupy 8 of 132 SMs); each
//     block writes its range's normalised output in float32 and its base-2 log-sum-exp, and
//     the last blocks of a row tile to finish merge them, a share of its rows each
//     (merge_in_last_block, one launch in all; without counters, decode.cu's merge_lse_splits,
//     the merge every such decode uses);
//   * a multi-stage pipeline: within a block, each of the kWarps warps streams its own slice of
//     the block's keys (every kWarps-th key tile) through a private ring of kStages shared-memory
//     stages filled by cp.async, so kStages - 1 K/V tiles per warp (16 per block at head dim
//     128) are in flight while it computes on one; at the end the warps' partial softmax states
//     are merged in shared memory.
// Every attention variant is the predicate of common/csrc/attention_mask.cuh (KeyMask): the
// key range [key_lo, key_hi) a tile's rows may see is computed on the device (key lengths,
// varlen or left-padded, are read there, so a captured CUDA graph stays valid as they grow)
// and clipped to the window BEFORE it is split, so a sliding window reads only its keys; key
// tiles inside the range every row sees unmasked skip the elementwise predicate. The softcap
// is applied to every tile's raw scores before the mask (softcap_score), the custom scale is
// folded into the exponent (scale_log2), a mask tensor (bool or additive) is read where it
// is, and a sink (sink_term) joins each row's denominator in split 0 only, so the merge
// counts it exactly once. A row with no visible key (an empty sequence) outputs zeros.
// The mask vote (GqaMaskVote). A mask tensor hides keys anywhere, so every tile of a masked
// decode ran the elementwise predicate, whose chain of dependent instructions per score the
// warps could not hide: ncu found the mask route's warps waiting on fixed-latency dependencies
// and the decode well behind the key-range variants at serving shapes. For a bool mask that
// every row of a tile shares (broadcast over heads, and one query per sequence or broadcast
// over queries: transformers' padding mask), a tile that only the mask may hide asks the mask
// first, a byte per lane and a warp vote, and skips the predicate where every key is kept; the
// output is the predicate's bit for bit. Its own instantiations (contiguous cache, head dims up
// to 128), so the other decodes keep their kernels (cuobjdump: unchanged); measured against the
// predicate and the structured route in results/logs/h100_s14_mask_route/.
//
// Tile shape and why. A block is kWarps warps (8 at head dim 128 where a block may have ~196 KB
// of shared memory, as on an H100; else 4) for the 16 query rows of one row tile of one
// (sequence, KV head, split); G * S_q > 16 rows take several row tiles (grid neighbours, so
// they share the K/V reads in L2). Each warp holds Q's A fragments in
// registers (head dim <= 128; 256 re-reads them from shared memory with ldmatrix, its O
// accumulator alone fills 128 registers) and an m16 x D fp32 O accumulator, and computes
// S = Q K^T (ldmatrix), the online softmax over the quad of lanes that share a row, and
// O += P V (ldmatrix.trans) as task 4's kernel does (its PTX wrappers and swizzled
// shared-memory layout are reused from task4/flash_attention_mma.cuh), with one difference:
// P is split into a 16-bit part and the 16-bit rounding of its remainder, two mma each, so
// that P carries ~16 bits instead of bf16's 8. The rounding of P alone had put the rows of
// task 4's kernel above FlashAttention-2's bound (2 x PyTorch's error) in a bf16 MQA case;
// the extra tensor-core work is cheap: a few dozen mma of the hundreds of instructions a key
// tile costs (below). A warp's key tile is kTileKeys = 16 keys (32 at head dim 64): 8 KB of
// K and V at head dim 128, so one stage is one 8 KB burst per warp. At head dim 128 a block
// is 8 warps with 3-stage rings (16 KB in flight per warp, 192 KB of rings per block), the
// other head dims 4 warps with 4 stages (3 at 256): one block per SM keeps several times the
// bandwidth-latency product in flight (nominally ~3 TB/s over 132 SMs times ~1 us of loaded
// latency: ~25 KB).
// Why per-warp rings rather than one ring per block or a producer warp: private rings need
// only __syncwarp, never a block barrier in the key loop, so no warp waits for another's
// memory latency. (The copies' instructions do take the consumers' issue slots, which is what
// limits batch 1: below.)
// Head dim 256 uses 3 stages (16 KB per warp stage; 200 KB in all).
// Why 8 warps at head dim 128, as measured on the H100. With 4 warps, ncu found one warp per
// scheduler (one block per SM) issuing an instruction every ~3 cycles, not waiting on memory:
// each warp's key tile is a chain of dependent steps (ldmatrix, mma, the row max and sum over
// shuffles, exp2, mma), and one warp per scheduler leaves that chain's latency exposed
// (results/logs/h100_gqa_b1_hkv4_ncu_sections.txt, _ncu_instructions.txt). Fewer instructions
// per tile did not help: O rescaled only when a row's maximum grows and fp16's P without its
// low-bits product changed nothing, and whole-tile copies with stepped addresses were slower
// (results/logs/h100_gqa_lean_ab.json; branch gqa-fewer-instructions). Two warps per scheduler
// did: 8 warps on 3-stage rings, one block per SM and the same split count, were faster than
// 4 warps on 4 stages on every measured shape (results/logs/h100_gqa_warps_ab.json), while
// two 4-warp blocks per SM, which double the splits and their merge, were slower at batch 1
// (results/logs/h100_gqa_d128_stages_ab.json).
// Overlapped launches (device_values.cuh, programmatic dependent launch on Hopper): a decode is
// launched so that its blocks start while the kernel before it finishes; before waiting for
// it, each block asks L2 for its warps' first tiles (prefetch_first_tiles), so the first trip
// to HBM overlaps the previous kernel's tail instead of following it. On the H100 this took
// about a microsecond off every measured decode, most where the decode is short
// (results/logs/h100_gqa_pdl_ab.json, one process, interleaved, against plain launches; it also
// holds a context sweep at batch 1: time = a fixed cost per decode + bytes / bandwidth).
// Prefetching 4 tiles per warp instead of kStages - 1 was slower at batch 64 and at batch 1 with
// 8 KV heads, and two 4-warp blocks per SM for unsplit work changed nothing measurable
// (results/logs/h100_gqa_prefetch_pair_ab.json). Fewer is better at head dim 128: each K or V
// row is one request to the SM's bulk-copy unit, and the block's threads wait for it to take
// them, so its wait returns later the more rows it asks for (per-block %globaltimer stamps, the
// timeline probe of branch gqa-timeline2: results/logs/h100_s11_prefetch/). One tile per warp
// instead of two was faster at short contexts and batch 64 and inside task 6's decode step,
// within a few tenths of a percent at 32768 keys, against cuDNN in alternating rounds
// (gqa_prefetch_tiles_ab.log in the same folder); the other head dims keep kStages - 1 (not
// measured).
// Settled tiles (GqaParams::fresh_keys; decode_attention_grouped's fresh_keys). Before the wait
// a block may read only what the kernel before does not write, and a decode cannot know which
// keys that is; its caller can. A decode step's append writes only the step's new keys, so task
// 6's model promises fresh_keys = 1, and each warp then copies into its ring, before the wait,
// its first tiles whose keys all lie below the sequence's last fresh_keys keys (real copies
// where the prefetch above only warms L2), from the plan worked out with the key lengths read
// from L2; after the wait the plan is worked out again and copies from a plan that differs are
// dropped. The output is the same bit for bit. For those copies to have time, RoPE + append lets
// the attention start before it waits itself (device_inline.cuh, rope_append.cu). In task 6's
// GQA step (one process, alternating rounds) the two together were faster than neither, the
// copies alone, with the attention starting after RoPE's wait, bought nothing, and the MHA
// course model's step (whose attention is decode.cu's) did not move
// (results/logs/h100_s12_settled/, task6/NOTES.md, which also has a third change, the products
// letting the next kernel start sooner, measured faster and left out: the parameter it took
// slowed the bf16 products' loop). As graph replays of a lone decode (its previous replay
// writes no key: fresh_keys 0) the copies were faster at the longest contexts and level
// elsewhere (call1 in the same folder); the recorded benchmark passes no promise. Not for a
// paged cache, left padding or the persistent grid.
// The block's geometry (which row tile, split and (sequence, KV head) it is: three divisions)
// and, where no key lengths are read, its plan of keys are computed before the wait too, as
// they read only blockIdx and parameters: against computing them after the wait this was
// faster on all 5 measured shapes and on the floor below, a decode of 16 keys (4.03 -> 3.63 us,
// cuDNN 2.93; H100, one process, interleaved: results/logs/h100_s8_decode_floor/
// decode_floor_ab.log, its script beside it). The same A/B found two other ideas slower on every
// shape, and they were removed: a split merge spread over the split blocks (each waiting for
// its row tile's splits, then merging a 1/num_splits share, instead of the last block merging
// all) and a split count that fills the SMs (33 instead of 32 splits at batch 1, 4 KV heads).
// Two more cuts of the fixed cost, the prologue's and the tail's: where the plan of keys is
// known before the wait (a contiguous cache, no key lengths), Q's and each warp's first K/V
// tile's copies are issued from addresses worked out before the wait (FirstCopies), so that
// after it only the cp.async instructions are left; and the merge takes only the warps that had
// key tiles, where warp 0 alone (a split of one tile, as the floor's) writes its rows from its
// registers, with no block barrier and no shared-memory round trip. Both change no output bit.
// Against the previous prologue and tail (one process, interleaved, H100) they were faster at
// short contexts, most on the floor, and no more than 1% slower elsewhere, with every check,
// bit-identity and graph replay passing
// (results/logs/h100_s8_decode_tail/decode_tail_ab.log, its script beside it).
// What is left at batch 1 is that fixed cost, not the streaming: fitted over contexts, a decode
// takes a fixed time plus its bytes at about the copy bandwidth (h100_gqa_pdl_ab.json), and the
// fixed time is a kernel launch, one trip to HBM and the split merge; a decode of 16 keys
// measures it (floor_us in results/logs/h100_gqa_varlen_splits.json, beside cuDNN's). So a
// cache that streams in a few times that fixed time (batch 1, 4 KV heads) stays well below the
// copy bandwidth, cuDNN's decode too. It is not the merge there: merges several times cheaper
// left that decode's time unchanged as graph replays (the next decode's overlapped blocks
// start while it runs), and torch.sum over the same bytes takes as long as the whole decode
// (results/logs/h100_s9_stream_refs/). Nor the split count: cutting the keys finer than one
// block per SM, so that the SMs that finish first take the later splits, was slower at every
// count (each block pays its own ramp; results/logs/h100_s9_decode_mergers/, split sweep).
// What any split-KV decode of those bytes can reach, measured without attention math
// (results/logs/h100_s10_stream_probe/: this kernel's loads alone, 128 blocks of 8 warps x 3
// stages of 8 KB, then with the split tail added): the loads alone stream near the copy
// bandwidth, but each split's partial, fence and count, and the merge after them, cost a few
// microseconds that a 64 MiB decode cannot hide, and leave even the math-free probe below
// issue 32's 0.85 at batch 1 with 4 KV heads. Two other tails measured no better
// (results/logs/h100_s11_arms/, h100_s11_run_all/): dedicated merger blocks polling per-split
// flags were much slower, and a merge with no trip through global memory (a cluster of 16
// blocks per KV head, merging in distributed shared memory) leaves 64 blocks to stream, whose
// loads alone, before any merge or math, take nearly all the time that target allows.
// ncu says the same of one such decode launched alone: its SMs hold a block for only about two
// thirds of its cycles, the rest being the ramp and the split tail
// (results/logs/h100_s13_record2/). GqaD128Compact, whose block would fit on an SM beside
// the decode products' blocks in task 6's step, measured slower alone at every shape and in
// that step (results/logs/h100_s13_gqa_compact/).
//
// A persistent grid for large batches. Unsplit work of more blocks than are resident at once
// (batch 16 and more at 8 KV heads) used to run as several waves of one-item blocks, each
// paying its own ramp (its first K/V tile's trip to HBM) and tail (the warp merge and the
// output); splitting such work further was slower at every count (results/logs/
// h100_s9_split_counts/, a batch sweep beside the batch-1 one), which put a price on that fixed
// cost of a few microseconds per block on each SM. So such a grid is one wave of blocks that
// walk the items blockIdx.x, + gridDim.x, ... (GqaParams::items), and each copies its next
// item's Q and first tiles (into the ring stages its warp merge leaves free, from
// Cfg::kFreeStage) before merging the item it has just streamed: the ramp overlaps the tail. Bit
// for bit the same output as a block per item; faster at every several-wave shape measured, most
// where the items are short (results/logs/h100_s9_persistent/). It first copied one tile; with
// the warp's staged O fitting one stage (scratch_column), it copies as many as the ring keeps in
// flight (Cfg::kPreloadTiles: 2 at head dim 128), so that the next item's loop starts with a full
// pipeline: faster again where a block walks several items, and b64 x 1024 keys went from behind
// cuDNN to ahead of it (results/logs/h100_s10_preload/). The split decodes paid for it while
// both shared one kernel: ptxas rescheduled the whole kernel, and the same log folder's A/B
// against the kernel before measured them a few percent slower, still ahead of cuDNN. So the walk
// is its own instantiation of each configuration (GqaWalk<Cfg>, Cfg::kPersistent), and the split
// and one-wave decodes run one without its code: level with the kernel before the preload on
// the split shapes, and the walk's gain kept (results/logs/h100_s11_arms/). Not compiled at head
// dim 256, whose registers it would spill (kCanWalk).
//
// The split count (task5/attention.py, choose_gqa_splits) follows FlashAttention-3's
// heuristic (hopper/heuristics.h) and FlashInfer's decode plan: no split once the
// (sequence, KV head, row tile) blocks nearly fill the GPU's resident blocks, else the fewest
// splits whose wave of blocks is within 95% of the best wave efficiency, never so many that a
// split has less than two tiles per warp; twice that where key lengths of several sequences
// may differ (so SMs whose short sequences finish early find a second wave of blocks). It
// depends on the cache's capacity (and the window), never on lengths read on the device.
//
// Where it runs (task5/attention.py, _decode_grouped_routed and attention): fp16/bf16 decode
// with G >= 2 and S_q <= 16, every variant. MHA (G = 1; the kernel takes it, and the tests
// run it) stays where it was, on the course kernel or the CUDA-core grouped kernel, until a
// measurement shows this one is not slower there (GQA_MIN_GROUP = 1 routes it here); fp32
// stays on the CUDA-core grouped kernel (decode_grouped.cu). The paged KV cache
// (decode_paged.cu) runs this kernel for every group, G = 1 included: where a K/V row lives is
// the kernel's KvLayout template parameter, a small address policy (ContiguousKv here,
// PagedKv in decode_paged.cuh) that load_kv_stage asks for each row it copies.
//
// Files. This header is the kernel and its idea, top to bottom (the configuration per head dim,
// the K/V address policies' use, the device code), and at the end which instantiation the host
// gets (gqa_kernel). decode_gqa.cu is the host side (configuration, checks, the launch, the
// entries, with torch); decode_gqa_fp16.cu and decode_gqa_bf16.cu compile the 10 instantiations
// of each element type (5 configurations x the contiguous and the paged cache), so that the
// build compiles them side by side; this header includes no torch header, which keeps them
// light (results/logs/cpu_nvcc_decode_split.txt).
//
// Measured speed (us, the fraction of copy bandwidth, against SDPA with enable_gqa, as
// CUDA-graph replays with the caches rotated beyond L2, and each variant's bandwidth against
// the plain decode's): python -m task5.test --gqa-bench; Results.md ("Grouped-query decode"),
// rendered from results/<gpu>.json.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

// mma.sync and its element types (ElementOps), ldmatrix, cp.async, exp2_approx and the swizzled
// shared-memory layout (SmemLayout): task 4's tensor-core kernel, shared rather than copied.
#include "../task4/flash_attention_mma.cuh"
#include "attention_mask.cuh"
#include "decode_common_device.cuh"
#include "decode_paged.cuh"

namespace attn_gqa {

// MAX_SPLITS, packs, count_block_ticket (decode_common_device.cuh); PagedKv (decode_paged.cuh).
using namespace attn_decode;


using mma_attn::cp_async_16;
using mma_attn::cp_async_commit;
using mma_attn::cp_async_wait;
using mma_attn::exp2_approx;
using mma_attn::ldmatrix_x4;
using mma_attn::ldmatrix_x4_trans;
using mma_attn::smem_u32;

constexpr int kGqaMaxHeadDim = 256;  // the widest instantiation below
constexpr int kRowsPerTile = 16;     // the m16 of mma.sync.m16n8k16
constexpr int kMaxQueryRows = 16;    // S_q per sequence (speculative decoding's few rows)

// One configuration per head dim: keys per warp tile, stages of each warp's ring; kWalk_, the
// persistent grid's instantiation of it (GqaWalk below), compiled apart so that the split and
// one-wave decodes run a kernel without the walk's code (ptxas schedules the whole kernel anew
// for any code added to it: results/logs/h100_s10_preload/).
template <int kHeadDim_, int kTileKeys_, int kStages_, int kWarps_ = 4, bool kWalk_ = false,
          bool kMaskVote_ = false>
struct GqaConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kTileKeys = kTileKeys_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr bool kQInRegs = kHeadDim <= 128;
  using Smem = mma_attn::SmemLayout<kHeadDim>;
  static constexpr int kTileBytes = kTileKeys * Smem::kRowBytes;  // one K (or V) tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kWarpRingBytes = kStages * kStageBytes;
  static constexpr int kQBytes = kRowsPerTile * Smem::kRowBytes;
  // Whether this is the persistent grid's kernel (GqaParams::items): blocks that walk items.
  static constexpr bool kPersistent = kWalk_;
  // Whether a tile whose keys only a bool mask tensor may hide asks the mask first (GqaMaskVote).
  static constexpr bool kMaskVote = kMaskVote_;
  // A warp's O, staged for the merge of the warps in its own ring (floats per row). Padding each
  // row by 8 floats puts the 8 rows a warp's quads write at once in different banks; the walk
  // swizzles the columns instead (scratch_column), so that O fills exactly one stage (head dims
  // 96, 128, 256) and leaves the others to the next item's tiles.
  static constexpr int kScratchStride = kPersistent ? kHeadDim : kHeadDim + 8;
  static constexpr int kSmemBytes = Smem::kTileAlign + kQBytes + kWarps * kWarpRingBytes;
  // The first ring stage the warp merge's scratch (kRowsPerTile rows of kScratchStride floats at
  // the ring's start) leaves free: a persistent block copies its next item's first tiles there,
  // kPreloadTiles of them (as many as the pipeline keeps in flight, if the free stages hold them).
  static constexpr int kFreeStage = (kRowsPerTile * kScratchStride * 4 + kStageBytes - 1) / kStageBytes;
  static constexpr int kPreloadTiles =
      kStages - kFreeStage < kStages - 1 ? kStages - kFreeStage : kStages - 1;
  // Column `col` of row `row` of the staged O: as it is where rows are padded; in the walk, the
  // 8-float groups of the row permuted by row % 4, so that the 8 rows of a warp's quads (whose
  // lanes store float2 at columns 8 j + 2 t) fall in 32 different banks per half warp, with no
  // padding; every 8-float group stays contiguous, within its 32-float block.
  static __device__ __forceinline__ int scratch_column(int row, int col) {
    return kPersistent ? col ^ ((row & 3) << 3) : col;
  }
  static_assert(kTileKeys % 16 == 0, "whole k16 steps of P V");
  static_assert((kTileKeys * Smem::kChunks) % 32 == 0, "whole copies per lane");
  static_assert(kRowsPerTile * kScratchStride * 4 <= kWarpRingBytes, "O fits in the ring");
  static_assert(kFreeStage < kStages, "a stage is free during the warp merge");
  // The walk is not compiled at head dim 256, whose O accumulator leaves no registers for the
  // loop's state (ptxas spilled).
  static_assert(!kPersistent || (kHeadDim <= 128 && kHeadDim % 32 == 0),
                "the walk: head dims up to 128, columns swizzled within 32-float blocks");
  static_assert(!Smem::kSwizzle || (kQBytes % Smem::kTileAlign == 0 &&
                                    kTileBytes % Smem::kTileAlign == 0),
                "swizzled tiles start kTileAlign-aligned (pair_step)");
};

// The persistent grid's kernel of a configuration, and which configurations have one.
template <typename Cfg>
using GqaWalk = GqaConfig<Cfg::kHeadDim, Cfg::kTileKeys, Cfg::kStages, Cfg::kWarps, true, Cfg::kMaskVote>;
// A configuration's kernel for a bool mask tensor whose row every row of a tile shares (one
// query per sequence, or a mask broadcast over queries, and broadcast over heads: transformers'
// padding mask): a key tile that only the mask may hide asks the mask's kT bytes for its keys
// (a byte per lane and a warp vote) and skips the elementwise predicate when every one is kept.
// Compiled apart, as the walk is, so that the other decodes keep a kernel without its code.
// Not at head dim 256, whose kernel is at the register limit already (ptxas spilled the vote's).
template <typename Cfg>
using GqaMaskVote = GqaConfig<Cfg::kHeadDim, Cfg::kTileKeys, Cfg::kStages, Cfg::kWarps, Cfg::kPersistent, true>;
template <typename Cfg>
constexpr bool kCanVote = Cfg::kHeadDim <= 128;
template <typename Cfg>
constexpr bool kCanWalk = Cfg::kHeadDim <= 128;

using GqaD64 = GqaConfig<64, 32, 4>;
using GqaD96 = GqaConfig<96, 16, 4>;
using GqaD128 = GqaConfig<128, 16, 3, 8>;  // two warps per scheduler: see the header
// Where a block cannot have GqaD128's ~196 KB of shared memory (an A100 offers 163 KB): one
// warp per scheduler on 4-stage rings, the configuration before it.
using GqaD128Compact = GqaConfig<128, 16, 4, 4>;
using GqaD256 = GqaConfig<256, 16, 3>;

// Strides in elements (last dimension contiguous): q and out [B, H_q, S_q, D]. Where the keys
// are is the kernel's second parameter, its K/V address policy (ContiguousKv below, or the
// paged cache's PagedKv, decode_paged.cuh).
struct GqaParams {
  const void* q;
  void* out;
  int64_t q_stride_b, q_stride_h, q_stride_s;
  int64_t o_stride_b, o_stride_h, o_stride_s;
  int heads_kv, group, seq_q, head_dim;
  int rows;        // group * seq_q: the query rows of one KV head
  int row_tiles;   // ceil(rows / 16)
  int num_splits;
  float scale_log2;  // log2(e) * scale: exp(s * scale) = exp2(s * scale_log2)
  attn::MaskParams mask;
  float* partial;  // num_splits > 1: [B, H_kv, num_splits, rows, D], normalised outputs
  float* lse;      // num_splits > 1: [B, H_kv, num_splits, rows], base 2
  // num_splits > 1, when not null: zeroed counters, one per (b, kv, row tile) or two (see
  // merge_blocks); the last splits of a row tile to finish merge them (merge_in_last_block), so
  // no merge kernel runs.
  int* counters;
  int out_vec16;   // out's rows start on 16-byte boundaries: 16-byte stores
  int prefetch;    // tiles per warp asked of L2 before waiting for the kernel before (see below)
  // >= 0 (a contiguous cache, one item per block, keys not left-padded): only each sequence's
  // last fresh_keys keys may have been written by the kernel before (a decode step's append),
  // so each warp copies its first tiles below them into its ring before the wait (settled
  // tiles, see the kernel); -1: any key may be fresh, none is copied before the wait.
  int fresh_keys;
  // num_splits > 1: how many blocks of a row tile merge its splits, each a share of its rows
  // (merge_in_last_block): 1, the last to finish; H > 1, the last H, so counters holds two
  // ints per row tile (its count, and the count of its merges done). H > 1 only where every
  // block of the grid is resident at once (the first H - 1 wait for the last).
  int merge_blocks;
  // num_splits == 1 only: > 0, the grid is persistent: its gridDim.x blocks walk the items
  // blockIdx.x, + gridDim.x, ... below `items` (B * H_kv * row tiles), each item's Q and first
  // K/V tiles copied while the item before it merges its warps.
  int64_t items;
};

// The K/V address policy of a contiguous cache, k and v [B, H_kv, S_k, D] (strides in
// elements, last dimension contiguous): key `key` of (b, kv) is base + key * stride. The
// kernel asks a policy's Rows for the K and V rows of each key it copies (load_kv_stage), and
// nothing else about the layout; the paged cache's policy (decode_paged.cuh) looks the row up
// in a block table instead.
struct ContiguousKv {
  const void* k;
  const void* v;
  int64_t k_stride_b, k_stride_h, k_stride_s;
  int64_t v_stride_b, v_stride_h, v_stride_s;

  template <typename Element>
  struct Rows {
    const Element* k;  // key 0 of (b, kv)
    const Element* v;
    int64_t k_stride, v_stride;
    __device__ __forceinline__ Rows(const ContiguousKv& c, int64_t b, int kv)
        : k(static_cast<const Element*>(c.k) + b * c.k_stride_b + kv * c.k_stride_h),
          v(static_cast<const Element*>(c.v) + b * c.v_stride_b + kv * c.v_stride_h),
          k_stride(c.k_stride_s), v_stride(c.v_stride_s) {}
    __device__ __forceinline__ KvRow<Element> at(int key) const {
      return {k + static_cast<int64_t>(key) * k_stride, v + static_cast<int64_t>(key) * v_stride,
              true};
    }
  };
};

// (x, y) minus their 16-bit rounding `packed` (Ops::pack), rounded to 16 bits: P = the two
// packs to ~16 bits (the subtraction is exact in fp32).
template <typename Element>
__device__ __forceinline__ uint32_t pack_remainder(float x, float y, uint32_t packed) {
  float2 rounded;
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    rounded = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed));
  } else {
    rounded = __half22float2(*reinterpret_cast<const __half2*>(&packed));
  }
  return mma_attn::ElementOps<Element>::pack(x - rounded.x, y - rounded.y);
}

// val += w * (lo, hi): 8 consecutive elements of a row, weighted (the merges of warps and splits).
__device__ __forceinline__ void add_weighted(float (&val)[8], float w, float4 lo, float4 hi) {
  const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) val[e] = fmaf(w, x[e], val[e]);
}

// Row r's elements d0 .. d0 + 7 of sequence b's output (KV head kv), in q's dtype.
template <typename Element>
__device__ __forceinline__ void store_output(const GqaParams& p, int64_t b, int kv, int r, int d0,
                                             const float (&val)[8]) {
  using Ops = mma_attn::ElementOps<Element>;
  const int64_t head = static_cast<int64_t>(kv) * p.group + r % p.group;
  Element* dst = static_cast<Element*>(p.out) + b * p.o_stride_b + head * p.o_stride_h +
                 static_cast<int64_t>(r / p.group) * p.o_stride_s + d0;
  if (p.out_vec16) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(Ops::pack(val[0], val[1]), Ops::pack(val[2], val[3]),
                                                Ops::pack(val[4], val[5]), Ops::pack(val[6], val[7]));
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[e] = from_float<Element>(val[e]);
  }
}

// Row r's first element of sequence b's output (KV head kv), and two elements stored at dst
// (an even column): the one-warp tail's stores from warp 0's fragments (the kernel), the same
// conversions as store_output's.
template <typename Element>
__device__ __forceinline__ Element* output_row(const GqaParams& p, int64_t b, int kv, int r) {
  const int64_t head = static_cast<int64_t>(kv) * p.group + r % p.group;
  return static_cast<Element*>(p.out) + b * p.o_stride_b + head * p.o_stride_h +
         static_cast<int64_t>(r / p.group) * p.o_stride_s;
}

template <typename Element>
__device__ __forceinline__ void store_output_pair(const GqaParams& p, Element* dst, float x, float y) {
  if (p.out_vec16) {
    *reinterpret_cast<uint32_t*>(dst) = mma_attn::ElementOps<Element>::pack(x, y);
  } else {
    dst[0] = from_float<Element>(x);
    dst[1] = from_float<Element>(y);
  }
}

// Row r's elements d0 .. d0 + 3 of sequence b's output (KV head kv), in q's dtype: the split
// merge's stores (8 bytes each where out's rows are 16-byte aligned).
template <typename Element>
__device__ __forceinline__ void store_output4(const GqaParams& p, int64_t b, int kv, int r, int d0,
                                              float4 val) {
  using Ops = mma_attn::ElementOps<Element>;
  Element* const dst = output_row<Element>(p, b, kv, r) + d0;
  if (p.out_vec16) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(Ops::pack(val.x, val.y), Ops::pack(val.z, val.w));
  } else {
    dst[0] = from_float<Element>(val.x);
    dst[1] = from_float<Element>(val.y);
    dst[2] = from_float<Element>(val.z);
    dst[3] = from_float<Element>(val.w);
  }
}

// The split merge's per-row weights, by one warp: split s's weight 2^(lse_s - M) (0 for a split
// without keys) into weights[s], read back by the whole warp after the __syncwarp; returns
// 1 / sum of the weights (0 for a row without any key). Each lse is read once, its value kept
// in weights[s] until it becomes the weight.
__device__ __forceinline__ float split_weights(const float* lse_row, int64_t lse_stride,
                                               int num_splits, float* weights, int lane) {
  float m = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) {
    const float lse = __ldcg(lse_row + s * lse_stride);
    weights[s] = lse;
    m = fmaxf(m, lse);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, offset));
  float total = 0.f;
  for (int s = lane; s < num_splits; s += 32) {
    const float lse = weights[s];
    const float w = lse == -INFINITY ? 0.f : exp2f(lse - m);
    weights[s] = w;
    total += w;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(FULL_MASK, total, offset);
  __syncwarp();  // every lane's weights are seen by the whole warp
  return total > 0.f ? 1.f / total : 0.f;
}

// Splits s0 .. s0 + kLoads - 1's partials of one lane's 4 columns (those below num_splits), asked
// of L2 at once.
template <int kLoads>
__device__ __forceinline__ void load_partials(float4 (&part)[kLoads], const float* src,
                                              int64_t split_stride, int s0, int num_splits,
                                              bool active) {
#pragma unroll
  for (int i = 0; i < kLoads; ++i)
    if (active && s0 + i < num_splits)
      part[i] = __ldcg(reinterpret_cast<const float4*>(src + (s0 + i) * split_stride));
}

// val + w * part, elementwise, in that order (fmaf): a split's term in the merge.
__device__ __forceinline__ float4 add_weighted4(float4 val, float w, float4 part) {
  return make_float4(fmaf(w, part.x, val.x), fmaf(w, part.y, val.y), fmaf(w, part.z, val.z),
                     fmaf(w, part.w, val.w));
}

// Spin until *counter reaches `blocks` (read with acquire: every counted block's writes, made
// before its count, are then visible to this thread).
__device__ __forceinline__ void wait_for_count(const int* counter, int blocks) {
  int seen = 0;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen < blocks);
}

// Beyond the kernel's own work (given): the split merge, at the end of the kernel, so a split
// decode is one launch (at batch 1 the merge kernel's launch is a sizeable part of a short
// decode), as decode.cu's merge_in_last_block does for the course kernel. Each block counts
// itself after its partials and lse are written (count_block_ticket); the last `mergers` to
// count merge the row tile's splits, the k-th last its rows k - 1, k - 1 + mergers, ...: the
// last one at once, the others once the count is complete (wait_for_count). Each row is
// weighed by 2^(lse_s - M) / sum and added in split order, exactly as merge_splits_kernel, so
// which blocks merge changes no bit; the last merger to finish zeroes the counters.
// One warp per row and a lane per 4 columns: the warp turns its row's lse into weights in
// shared memory (the start of the kernel's dynamic shared memory, [rows of the tile][num_splits]
// floats, num_splits <= MAX_SPLITS: 64 KB), so no block barrier stands between the weights and
// the sums, and each lane asks L2 for its first kMergeLoads splits' partials before the lse.
// How many merge (decode_gqa.cu, merge_blocks): one per 4 splits, at most one row each, where
// a split's key range is short (its blocks then finish close together) and the whole grid is
// resident at once (a waiting merger must not hold an SM that a block it waits for needs);
// else the last block alone. Against the merge before it (the last block alone, a block
// barrier between the weights and the sums, 8 columns per thread) and against one merger, in
// one process on the H100 (results/logs/h100_s9_decode_mergers/, its script beside it): faster
// where a row tile has many partials (MQA at batch 1, 4 KV heads at 8192 keys) or few splits'
// partials that one trip to L2 now reads (8 KV heads), bit for bit the same output. More
// mergers were slower where the splits are few or their key ranges long: a waiting merger
// holds its SM, which the next kernel's blocks (launched overlapped) would have used.
template <typename Cfg, typename Element>
__device__ __forceinline__ void merge_in_last_block(const GqaParams& p) {
  static_assert(kRowsPerTile * MAX_SPLITS * 4 <= Cfg::kSmemBytes, "the weights fit");
  extern __shared__ __align__(128) unsigned char smem_weights[];
  float* const smem = reinterpret_cast<float*>(smem_weights);
  __shared__ int ticket_shared;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t block = blockIdx.x;
  const int row_tile = static_cast<int>(block % p.row_tiles);
  const int64_t b_kv = block / p.row_tiles / p.num_splits;
  const int64_t tile = b_kv * p.row_tiles + row_tile;
  const int row0 = row_tile * kRowsPerTile;
  const int rows_here = min(kRowsPerTile, p.rows - row0);
  const int num_splits = p.num_splits;
  // The last `mergers` blocks to count merge, the k-th last (rank k - 1) rows rank, rank +
  // mergers, ...; with one, counters holds one int per row tile, else two.
  const int mergers = min(p.merge_blocks, rows_here);
  int* const count = p.counters + (p.merge_blocks > 1 ? 2 * tile : tile);
  __syncthreads();  // the block's partials and lse are written, and nobody reads smem any more
  if (tid == 0) ticket_shared = count_block_ticket(count, num_splits);
  __syncthreads();
  const int rank = num_splits - 1 - ticket_shared;  // 0: the last block to count
  if (rank >= mergers) return;
  if (rank > 0) {
    if (tid == 0) wait_for_count(count, num_splits);  // the last block's count
    __syncthreads();
  }
  const int64_t first = b_kv * p.num_splits * p.rows + row0;  // split 0's row row0
  const int64_t split_stride = static_cast<int64_t>(p.rows) * p.head_dim;  // one split's rows
  const int64_t b = b_kv / p.heads_kv;
  const int kv = static_cast<int>(b_kv % p.heads_kv);
  const int weights_stride = (num_splits + 3) & ~3;  // rows of weights start 16-byte aligned
  constexpr int kChunks4 = Cfg::kHeadDim / 4;  // a lane's 4 columns
  constexpr int kMergeLoads = 16;              // splits' partials in flight per lane
  for (int rr = rank + warp * mergers; rr < rows_here; rr += Cfg::kWarps * mergers) {
    float* const weights = smem + rr * weights_stride;
    float row_scale = 0.f;
    for (int c0 = 0; c0 < kChunks4; c0 += 32) {  // warp-uniform: one pass, two at head dim 256
      const int d0 = (c0 + lane) * 4;
      const bool active = c0 + lane < kChunks4 && d0 < p.head_dim;
      const float* const src = p.partial + (first + rr) * p.head_dim + d0;
      float4 part[kMergeLoads];
      load_partials(part, src, split_stride, 0, num_splits, active);
      if (c0 == 0) row_scale = split_weights(p.lse + first + rr, p.rows, num_splits, weights, lane);
      float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s0 = 0; s0 < num_splits; s0 += kMergeLoads) {
        if (s0 > 0) load_partials(part, src, split_stride, s0, num_splits, active);
        if (s0 + kMergeLoads <= num_splits) {
          // A whole group: its weights read as float4s, then the products, none predicated (a
          // predicated shared-memory load per split compiled to a chain of load, wait, multiply).
          float4 w4[kMergeLoads / 4];
#pragma unroll
          for (int j = 0; j < kMergeLoads / 4; ++j) w4[j] = *reinterpret_cast<const float4*>(weights + s0 + 4 * j);
#pragma unroll
          for (int i = 0; i < kMergeLoads; ++i) {
            const float4 q = w4[i / 4];
            const float w = i % 4 == 0 ? q.x : i % 4 == 1 ? q.y : i % 4 == 2 ? q.z : q.w;
            val = add_weighted4(val, w, part[i]);
          }
        } else {
#pragma unroll
          for (int i = 0; i < kMergeLoads; ++i)
            if (s0 + i < num_splits) val = add_weighted4(val, weights[s0 + i], part[i]);
        }
      }
      if (active)
        store_output4<Element>(p, b, kv, row0 + rr, d0,
                               make_float4(val.x * row_scale, val.y * row_scale,
                                           val.z * row_scale, val.w * row_scale));
    }
  }
  // Zeroed for the next decode (and graph replay), once no merger reads the count any more.
  if (mergers == 1) {
    if (tid == 0) count[0] = 0;
  } else {
    __syncthreads();
    if (tid == 0 && atomicAdd(count + 1, 1) == mergers - 1) {
      count[0] = 0;
      count[1] = 0;
    }
  }
}

// Q copy `idx` of this row tile (row idx / kChunks of the tile, its 16-byte chunk
// idx % kChunks): where it reads (any valid address, p.q, when it zero-fills: past the real
// rows or past head_dim), where it lands in the Q tile, and whether it reads. The copies of
// load_q_tile and of FirstCopies.
struct QChunk {
  const void* src;
  uint32_t offset;  // from the Q tile's start
  bool pred;
};

template <typename Cfg, typename Element>
__device__ __forceinline__ QChunk q_chunk(const GqaParams& p, int64_t b, int kv, int row0,
                                          int rows_here, int idx) {
  using Smem = typename Cfg::Smem;
  const int rr = idx / Smem::kChunks, chunk = idx % Smem::kChunks;
  const int r = row0 + rr;
  const bool pred = rr < rows_here && chunk * 8 < p.head_dim;
  const void* src = p.q;
  if (pred) {
    const int64_t head = static_cast<int64_t>(kv) * p.group + r % p.group;
    src = static_cast<const Element*>(p.q) + b * p.q_stride_b + head * p.q_stride_h +
          static_cast<int64_t>(r / p.group) * p.q_stride_s + chunk * 8;
  }
  return QChunk{src, Smem::offset(rr, chunk), pred};
}

// The Q rows of this row tile into shared memory (16 rows, zero-filled past the real rows
// and past head_dim), one 16-byte cp.async per chunk, all threads.
template <typename Cfg, typename Element>
__device__ __forceinline__ void load_q_tile(uint32_t smem_q, const GqaParams& p, int64_t b,
                                            int kv, int row0, int rows_here, int tid) {
  constexpr int kTotal = kRowsPerTile * Cfg::Smem::kChunks;
  for (int idx = tid; idx < kTotal; idx += Cfg::kThreads) {
    const QChunk c = q_chunk<Cfg, Element>(p, b, kv, row0, rows_here, idx);
    cp_async_16(smem_q + c.offset, c.src, c.pred);
  }
}

// One warp copies keys [key0, key0 + kTileKeys) of one (sequence, KV head) into a stage: K
// into k_tile, V into v_tile, each row's address from the layout's Rows (contiguous or
// paged, looked up once for K and V). Keys >= key_end, keys whose page does not exist and
// columns >= head_dim are zero-filled and read nothing (a zero key gives a finite score,
// masked afterwards; stale shared memory could hold NaN, and 0 * NaN = NaN).
template <typename Cfg, typename Element, typename Rows>
__device__ __forceinline__ void load_kv_stage(uint32_t k_tile, uint32_t v_tile, const Rows& rows,
                                              const void* any_valid, int key0, int key_end,
                                              int head_dim, int lane) {
  using Smem = typename Cfg::Smem;
  constexpr int kIters = Cfg::kTileKeys * Smem::kChunks / 32;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int idx = lane + 32 * i;
    const int row = idx / Smem::kChunks, chunk = idx % Smem::kChunks;
    const bool in_range = key0 + row < key_end && chunk * 8 < head_dim;
    KvRow<Element> kv_row{nullptr, nullptr, false};
    if (in_range) kv_row = rows.at(key0 + row);
    const bool pred = in_range && kv_row.valid;
    const uint32_t offset = Smem::offset(row, chunk);
    cp_async_16(k_tile + offset, pred ? static_cast<const void*>(kv_row.k + chunk * 8) : any_valid, pred);
    cp_async_16(v_tile + offset, pred ? static_cast<const void*>(kv_row.v + chunk * 8) : any_valid, pred);
  }
}

// The copies of the prologue's first two commit groups, Q's (load_q_tile's) and the warp's
// first K/V tile's (load_kv_stage's), with their sources, destinations and predicates worked
// out before the wait for the kernel before (addresses only: they read parameters, never
// memory that kernel writes), so that after the wait only the cp.async instructions are left.
// The same copies as load_q_tile and load_kv_stage, so the same bytes land in shared memory.
// A contiguous cache whose plan of keys is known before the wait only (no key lengths; a paged
// cache reads its block table).
template <typename Cfg, typename Element>
struct FirstCopies {
  using Smem = typename Cfg::Smem;
  static constexpr int kQTotal = kRowsPerTile * Smem::kChunks;
  static constexpr int kQIters = (kQTotal + Cfg::kThreads - 1) / Cfg::kThreads;
  static constexpr int kKvIters = Cfg::kTileKeys * Smem::kChunks / 32;
  static_assert(kQIters <= 16 && kKvIters <= 32, "the predicates fit their masks");
  const void* q_src[kQIters];
  uint32_t q_dst[kQIters];
  const void* k_src[kKvIters];
  const void* v_src[kKvIters];
  uint32_t k_dst;            // the stage's K tile (V: + kTileBytes)
  uint32_t q_pred, q_issue;  // bit i: copy i has a source / is issued at all (idx < kQTotal)
  uint32_t kv_pred;          // bit i: K/V copy i has a source
  bool kv_issue;             // the warp has a first tile

  __device__ __forceinline__ FirstCopies() : q_pred(0u), q_issue(0u), kv_pred(0u), kv_issue(false) {}
  __device__ __forceinline__ FirstCopies(uint32_t smem_q, uint32_t k_tile, const GqaParams& p,
                                         const ContiguousKv& layout, int64_t b, int kv, int row0,
                                         int rows_here, int key0, int key_end, bool has_tile,
                                         int tid) {
#pragma unroll
    for (int i = 0; i < kQIters; ++i) {  // load_q_tile's loop
      const int idx = tid + i * Cfg::kThreads;
      const QChunk c = q_chunk<Cfg, Element>(p, b, kv, row0, rows_here, idx);
      q_src[i] = c.src;
      q_dst[i] = smem_q + c.offset;
      if (i == 0) q_pred = q_issue = 0u;
      q_pred |= (c.pred ? 1u : 0u) << i;
      q_issue |= (kQTotal % Cfg::kThreads == 0 || idx < kQTotal ? 1u : 0u) << i;
    }
    const int lane = tid & 31;
    const typename ContiguousKv::template Rows<Element> rows(layout, b, kv);
    k_dst = k_tile;
    kv_issue = has_tile;
    kv_pred = 0u;
#pragma unroll
    for (int i = 0; i < kKvIters; ++i) {  // load_kv_stage's loop
      const int idx = lane + 32 * i;
      const int row = idx / Smem::kChunks, chunk = idx % Smem::kChunks;
      const bool in_range = key0 + row < key_end && chunk * 8 < p.head_dim;
      KvRow<Element> kv_row{nullptr, nullptr, false};
      if (in_range) kv_row = rows.at(key0 + row);
      const bool pred = in_range && kv_row.valid;
      k_src[i] = pred ? static_cast<const void*>(kv_row.k + chunk * 8) : p.q;
      v_src[i] = pred ? static_cast<const void*>(kv_row.v + chunk * 8) : p.q;
      kv_pred |= (pred ? 1u : 0u) << i;
    }
  }

  // Q's copies, then a commit, then the first K/V tile's (if any), then a commit: the first
  // two commit groups of the general prologue (the kernel).
  __device__ __forceinline__ void issue(int lane) const {
#pragma unroll
    for (int i = 0; i < kQIters; ++i)
      if ((q_issue >> i) & 1u) cp_async_16(q_dst[i], q_src[i], (q_pred >> i) & 1u);
    cp_async_commit();
    if (kv_issue) {
#pragma unroll
      for (int i = 0; i < kKvIters; ++i) {
        const int idx = lane + 32 * i;
        const uint32_t offset = Smem::offset(idx / Smem::kChunks, idx % Smem::kChunks);
        cp_async_16(k_dst + offset, k_src[i], (kv_pred >> i) & 1u);
        cp_async_16(k_dst + Cfg::kTileBytes + offset, v_src[i], (kv_pred >> i) & 1u);
      }
    }
    cp_async_commit();
  }
};

// Given: which block blockIdx.x is (row tiles fastest, then splits, then sequence x KV head)
// and its query rows; and a split's share [x, y) of a block's n_tiles key tiles.
struct GqaBlock {
  int row_tile, split, kv;
  int64_t b_kv, b;
  int row0, rows_here;  // the tile's first query row (of the KV head's rows) and how many
  __device__ __forceinline__ explicit GqaBlock(const GqaParams& p) : GqaBlock(p, blockIdx.x) {}
  __device__ __forceinline__ GqaBlock(const GqaParams& p, int64_t block) {
    row_tile = static_cast<int>(block % p.row_tiles);
    block /= p.row_tiles;
    split = static_cast<int>(block % p.num_splits);
    b_kv = block / p.num_splits;
    b = b_kv / p.heads_kv;
    kv = static_cast<int>(b_kv % p.heads_kv);
    row0 = row_tile * kRowsPerTile;
    rows_here = min(kRowsPerTile, p.rows - row0);
  }
};

__device__ __forceinline__ int2 split_tiles(int n_tiles, int split, int num_splits) {
  const int per_split = (n_tiles + num_splits - 1) / num_splits;
  const int begin = min(split * per_split, n_tiles);
  return make_int2(begin, min(begin + per_split, n_tiles));
}

// A block's keys (uniform over the block): [key_lo, key_hi) some row of its tile may see (a
// window: only the window's), its split's tiles [tile_begin, tile_end) of kT keys from key_lo,
// and the keys [unmasked.x, unmasked.y) every row sees with no bias.
struct GqaPlan {
  int key_lo, key_hi, tile_begin, tile_end;
  int2 unmasked;
};

template <int kT>
__device__ __forceinline__ GqaPlan plan_keys(const GqaParams& p, const GqaBlock& at,
                                             const attn::KeyMask<true>& range) {
  const int q_first = at.row0 / p.group, q_last = (at.row0 + at.rows_here - 1) / p.group;
  GqaPlan plan;
  plan.key_lo = max(range.keys_begin(q_first), 0);
  plan.key_hi = range.keys_end(q_last);
  plan.unmasked = range.unmasked_keys(q_first, q_last);
  const int n_tiles = plan.key_hi > plan.key_lo ? (plan.key_hi - plan.key_lo + kT - 1) / kT : 0;
  const int2 split_range = split_tiles(n_tiles, at.split, p.num_splits);
  plan.tile_begin = split_range.x;
  plan.tile_end = split_range.y;
  return plan;
}

// The block's plan of keys before the wait for the kernel before, its key length (if any) read
// from L2 (__ldcg, never kept in L1: the kernel's own read after the wait cannot meet a stale
// line), for work that the plan after the wait checks or that cannot go wrong (a prefetch).
// *sequence_end: the end of the sequence's keys (its length, or S_k).
template <int kT>
__device__ __forceinline__ GqaPlan plan_keys_peeked(const GqaParams& p, const GqaBlock& at,
                                                    int* sequence_end) {
  attn::MaskParams mask = p.mask;
  mask.key_lengths = nullptr;
  attn::KeyMask<true> range(mask, at.b, static_cast<int64_t>(at.kv) * p.group);
  if (p.mask.key_lengths != nullptr)  // as KeyMask reads it, but from L2
    range.set_key_length(__ldcg(p.mask.key_lengths + at.b * p.mask.key_lengths_stride),
                         p.mask.left_padding);
  *sequence_end = range.key_end;
  return plan_keys<kT>(p, at, range);
}

// Given: what a block does while the kernel before it in the stream finishes (an overlapped
// launch, device_values.cuh): it asks L2 for the first p.prefetch tiles of each of its warps,
// which HBM can fetch meanwhile, and the kernel's loads then find them in L2. A prefetch is a
// hint and cannot make a load see an old value, so the key lengths it needs are read from L2
// (__ldcg, never kept in L1: the kernel's own read after the wait cannot meet a stale line).
// A contiguous cache only: the paged cache's block table would be read before the wait.
template <typename Cfg, typename Element, typename KvLayout>
__device__ __forceinline__ void prefetch_first_tiles(const GqaParams& p, const KvLayout& kv_layout) {
  if constexpr (std::is_same_v<KvLayout, ContiguousKv>) {
    if (p.prefetch <= 0) return;
    constexpr int kT = Cfg::kTileKeys;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const GqaBlock at(p);
    const int64_t b = at.b;
    const int kv = at.kv;
    int sequence_end;
    const GqaPlan plan = plan_keys_peeked<kT>(p, at, &sequence_end);
    const int key_lo = plan.key_lo, key_hi = plan.key_hi;
    const int tile_begin = plan.tile_begin, tile_end = plan.tile_end;
    const typename ContiguousKv::template Rows<Element> rows(kv_layout, b, kv);
    const unsigned row_bytes = static_cast<unsigned>(p.head_dim * sizeof(Element));
    for (int s = 0; s < p.prefetch; ++s) {
      const int tile = tile_begin + warp + s * Cfg::kWarps;
      for (int r = lane; r < 2 * kT && tile < tile_end; r += 32) {
        const int key = key_lo + tile * kT + r % kT;
        if (key >= key_hi) continue;
        const KvRow<Element> row = rows.at(key);
        attn::prefetch_to_l2(r < kT ? row.k : row.v, row_bytes);
      }
    }
  }
}

// Whether two plans give a block's warps the same tiles of the same keys (settled tiles).
__device__ __forceinline__ bool same_tiles(const GqaPlan& a, const GqaPlan& b) {
  return a.key_lo == b.key_lo && a.key_hi == b.key_hi && a.tile_begin == b.tile_begin &&
         a.tile_end == b.tile_end;
}

// cp_async_wait<n> for a count known at run time (n <= 3: the rings' stages minus one).
__device__ __forceinline__ void cp_async_wait_newest(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// Before the wait (the kernel's settled tiles, p.fresh_keys >= 0): this warp's first tiles, up to
// kStages - 1 of them and while every key of the tile is below the sequence's last fresh_keys,
// copied into the ring stages the key loop will read them from, one commit group each; returns
// how many, and the plan they follow in *plan.
template <typename Cfg, typename Element>
__device__ __forceinline__ int copy_settled_tiles(const GqaParams& p, const ContiguousKv& kv_layout,
                                                  const GqaBlock& at, GqaPlan* plan) {
  constexpr int kT = Cfg::kTileKeys;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int sequence_end;
  *plan = plan_keys_peeked<kT>(p, at, &sequence_end);
  const int settled_end = sequence_end - p.fresh_keys;
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t smem_q = (raw + (Cfg::Smem::kTileAlign - 1)) &
                          ~static_cast<uint32_t>(Cfg::Smem::kTileAlign - 1);
  const uint32_t ring = smem_q + Cfg::kQBytes + warp * Cfg::kWarpRingBytes;
  const typename ContiguousKv::template Rows<Element> rows(kv_layout, at.b, at.kv);
  int copied = 0;
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    const int tile = plan->tile_begin + warp + s * Cfg::kWarps;
    const int key0 = plan->key_lo + tile * kT;
    if (copied < s || tile >= plan->tile_end || min(key0 + kT, plan->key_hi) > settled_end) break;
    const uint32_t k_tile = ring + s * Cfg::kStageBytes;
    load_kv_stage<Cfg, Element>(k_tile, k_tile + Cfg::kTileBytes, rows, p.q, key0, plan->key_hi,
                                p.head_dim, lane);
    cp_async_commit();
    ++copied;
  }
  return copied;
}

// grid (B * H_kv * num_splits * row_tiles), Cfg::kThreads threads: block ((b, kv), split,
// row tile), the row tile fastest; or, persistent (p.items > 0, one split), fewer blocks, each
// walking the items blockIdx.x, + gridDim.x, ... See the top of the file.
// KvLayout: where the keys are (ContiguousKv, or PagedKv of decode_paged.cuh).
template <typename Element, typename Cfg, typename KvLayout>
__global__ void __launch_bounds__(Cfg::kThreads, 1) decode_gqa_kernel(const GqaParams p,
                                                                     const KvLayout kv_layout) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  prefetch_first_tiles<Cfg, Element>(p, kv_layout);  // given: while the kernel before finishes
  // Given: the block's geometry and, without key lengths (the only memory a plan of keys
  // reads), its plan of keys, before the wait: they read only blockIdx and parameters, so
  // they are off the path from the wait to the first copy (see the header).
  const GqaBlock at(p);
  const bool plan_before_wait = p.mask.key_lengths == nullptr;
  GqaPlan early_plan{};
  if (plan_before_wait) {
    early_plan = plan_keys<Cfg::kTileKeys>(
        p, at, attn::KeyMask<true>(p.mask, at.b, static_cast<int64_t>(at.kv) * p.group));
  }
  // BEGIN SOLUTION kernel
  // HINT: (Optional: addresses that read only parameters may be worked out here, before the wait.)
  // Where the plan of keys is known (a contiguous cache, no key lengths): the first copies'
  // addresses too, before the wait (FirstCopies).
  constexpr bool kContiguous = std::is_same_v<KvLayout, ContiguousKv>;
  // Settled tiles (p.fresh_keys >= 0): each warp's first tiles whose keys all lie below the
  // sequence's last fresh_keys keys were written before the kernel before began (the caller's
  // promise: a decode step's append writes only its new keys), so they are copied into the
  // warp's ring now, from the plan worked out with the key length read from L2, while that
  // kernel finishes; after the wait the plan is worked out again, and copies made from a plan
  // that differs (a length still being written) are waited for and dropped.
  const bool settle = kContiguous && !Cfg::kPersistent && p.fresh_keys >= 0;
  int settled_tiles = 0;  // a prefix of this warp's first kStages - 1 tiles (uniform per warp)
  GqaPlan settled_plan{};
  if constexpr (kContiguous && !Cfg::kPersistent) {
    if (settle) settled_tiles = copy_settled_tiles<Cfg, Element>(p, kv_layout, at, &settled_plan);
  }
  const bool copies_early = kContiguous && plan_before_wait && !settle;
  FirstCopies<Cfg, Element> first;
  if constexpr (kContiguous) {
    if (copies_early) {
      extern __shared__ __align__(128) unsigned char smem_raw[];
      const int w = threadIdx.x >> 5;
      const uint32_t raw = smem_u32(smem_raw);
      const uint32_t smem_q = (raw + (Cfg::Smem::kTileAlign - 1)) &
                              ~static_cast<uint32_t>(Cfg::Smem::kTileAlign - 1);
      const uint32_t k_tile = smem_q + Cfg::kQBytes + w * Cfg::kWarpRingBytes;  // stage 0
      const int tile = early_plan.tile_begin + w;
      first = FirstCopies<Cfg, Element>(smem_q, k_tile, p, kv_layout, at.b, at.kv, at.row0,
                                        at.rows_here, early_plan.key_lo + tile * Cfg::kTileKeys,
                                        early_plan.key_hi, tile < early_plan.tile_end, threadIdx.x);
    }
  }
  // END SOLUTION
  attn::wait_for_previous_kernel();  // given: q, the cache and the key lengths come from it
  attn::let_next_kernel_start();
  // BEGIN SOLUTION kernel
  // HINT: Optional extension (beyond the graded course): task 4's tensor-core tile with the
  // HINT: query heads of a KV head as its 16 rows; the block's key range (KeyMask, the window
  // HINT: clipped before splitting) cut into splits, each warp streaming every kWarps-th key tile
  // HINT: (rows addressed by KvLayout's Rows: load_kv_stage) through its own cp.async ring of
  // HINT: kStages stages, then the warps merged in shared memory and the normalised output
  // HINT: (one split) or float32 partial and lse written.
  using Smem = typename Cfg::Smem;
  using Ops = mma_attn::ElementOps<Element>;
  constexpr int kT = Cfg::kTileKeys;
  constexpr int kW = Cfg::kWarps;
  constexpr int kStages = Cfg::kStages;
  constexpr int kNTiles = kT / 8;               // n8 tiles of S
  constexpr int kQKSteps = Cfg::kHeadDim / 16;  // k16 steps of S = Q K^T
  constexpr int kPVSteps = kT / 16;             // k16 steps of O += P V
  constexpr int kDTiles = Cfg::kHeadDim / 8;    // n8 tiles of O
  constexpr uint32_t kRows16 = 16 * Smem::kRowBytes;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ float warp_max[kW][kRowsPerTile];    // each warp's row max, base 2 (-inf: no key)
  __shared__ float warp_sum[kW][kRowsPerTile];    // each warp's row sum relative to it
  __shared__ float warp_weight[kW][kRowsPerTile]; // each warp's factor in the final row

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // Shared memory: Q, then each warp's ring of kStages (K tile, V tile) stages.
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t smem_q = (raw + (Smem::kTileAlign - 1)) & ~static_cast<uint32_t>(Smem::kTileAlign - 1);
  unsigned char* const smem_q_ptr = smem_raw + (smem_q - raw);
  const uint32_t ring = smem_q + Cfg::kQBytes + warp * Cfg::kWarpRingBytes;

  // A persistent grid (p.items > 0) walks its items; else the block is one item.
  int64_t item = blockIdx.x;
  GqaBlock cur = at;
  GqaPlan cur_plan = early_plan;
  bool first_item = true;
  bool preloaded = false;  // this item's Q and first tile were copied during the item before
  int base = 0;            // the ring stage of this item's first tile
  for (;;) {
    const int split = cur.split, kv = cur.kv, row0 = cur.row0, rows_here = cur.rows_here;
    const int64_t b_kv = cur.b_kv, b = cur.b;

    // The keys some row of this tile may see, [key_lo, key_hi) (a window: only the window's),
    // in kT-key tiles from key_lo; this split's tiles; keys [unmasked.x, unmasked.y) are
    // visible to every row with no bias (plan_keys). Uniform over the block.
    const GqaPlan plan = (first_item && plan_before_wait) || preloaded
        ? cur_plan
        : plan_keys<kT>(p, cur, attn::KeyMask<true>(p.mask, b, static_cast<int64_t>(kv) * p.group));
    const int key_lo = plan.key_lo, key_hi = plan.key_hi;
    const int2 unmasked = plan.unmasked;
    const int tile_begin = plan.tile_begin, tile_end = plan.tile_end;
    // This warp's tiles: tile_begin + warp, + kW, + 2 kW, ...
    const int my_tiles = tile_end - tile_begin > warp ? (tile_end - tile_begin - warp + kW - 1) / kW : 0;

    const typename KvLayout::template Rows<Element> kv_rows(kv_layout, b, kv);
    auto load_stage = [&](int stage, int tile) {
      const uint32_t k_tile = ring + ((base + stage) % kStages) * Cfg::kStageBytes;
      load_kv_stage<Cfg, Element>(k_tile, k_tile + Cfg::kTileBytes, kv_rows, p.q, key_lo + tile * kT,
                                  key_hi, p.head_dim, lane);
    };

    // Prologue: Q (one commit group), then the first kStages - 1 tiles of this warp (one group
    // each, empty past its last tile, so that the waits below count the same). The first two
    // groups from addresses worked out before the wait where there are (copies_early), else here:
    // a paged cache, or key lengths read after the wait.
    // Settled tiles copied from another plan than this one are dropped (their copies landed).
    if (settled_tiles > 0 && !same_tiles(plan, settled_plan)) {
      cp_async_wait<0>();
      settled_tiles = 0;
    }
    if (first_item && copies_early) {
      first.issue(lane);  // the same copies and commit groups as the branch below
    } else if (!preloaded) {
      load_q_tile<Cfg, Element>(smem_q, p, b, kv, row0, rows_here, tid);
      cp_async_commit();
      if (0 < my_tiles && settled_tiles == 0) load_stage(0, tile_begin + warp);
      if (settled_tiles == 0) cp_async_commit();
    }
    // (A preloaded item's first kPreloadTiles tiles are in flight already, their groups
    // committed; so are settled tiles, before Q's group.)
#pragma unroll
    for (int s = 1; s < kStages - 1; ++s) {
      if (Cfg::kPersistent && preloaded && s < Cfg::kPreloadTiles) continue;
      if (s < settled_tiles) continue;
      if (s < my_tiles) load_stage(s, tile_begin + warp + s * kW);
      cp_async_commit();
    }
    // Q has landed (this thread's copies: its group is followed by kStages - 1 - settled_tiles
    // tiles' groups) ...
    if (settled_tiles == 0) {
      cp_async_wait<kStages - 1>();
    } else {
      cp_async_wait_newest(kStages - 1 - settled_tiles);
    }
    __syncthreads();               // ... and everyone's

    const uint32_t q_lane = smem_q + Smem::offset(lane & 15, lane >> 4);
    uint32_t q_frag[Cfg::kQInRegs ? kQKSteps : 1][4];
    if constexpr (Cfg::kQInRegs) {
#pragma unroll
      for (int kk = 0; kk < kQKSteps; ++kk) ldmatrix_x4(q_frag[kk], Smem::pair_step(q_lane, kk));
    }
    // This lane's ldmatrix addresses within a K or V tile (see task 4's LaneAddresses).
    const uint32_t k_lane = Smem::offset((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    const uint32_t v_lane = Smem::offset((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);

    float o[kDTiles][4];
    float row_max[2] = {-INFINITY, -INFINITY};  // raw scores
    float row_sum[2] = {0.f, 0.f};              // this lane's share
#pragma unroll
    for (int j = 0; j < kDTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
    const float scale_log2 = p.scale_log2;
    // GqaMaskVote: the keys where nothing but the mask tensor may hide a key from a row of this
    // tile (the key range, causal, the window), and the mask's row, the same for every row.
    int2 vote_keys = make_int2(0, 0);
    const unsigned char* vote_row = nullptr;
    if constexpr (Cfg::kMaskVote) {
      attn::MaskParams without_tensor = p.mask;
      without_tensor.mask = nullptr;
      const int q_first = row0 / p.group, q_last = (row0 + rows_here - 1) / p.group;
      vote_keys = attn::KeyMask<true>(without_tensor, b, static_cast<int64_t>(kv) * p.group)
                      .unmasked_keys(q_first, q_last);
      vote_row = reinterpret_cast<const unsigned char*>(
          attn::KeyMask<true>(p.mask, b, static_cast<int64_t>(kv) * p.group).mask_head);
    }

    for (int it = 0; it < my_tiles; ++it) {
      // Refill the stage tile it - 1 used (every lane finished it: __syncwarp at loop end).
      const int next = it + kStages - 1;
      if (next < my_tiles) load_stage(next % kStages, tile_begin + warp + next * kW);
      cp_async_commit();
      cp_async_wait<kStages - 1>();  // tile it has landed (this lane's copies) ...
      __syncwarp();                  // ... and the warp's
      const uint32_t k_tile = ring + ((base + it) % kStages) * Cfg::kStageBytes;
      const uint32_t v_tile = k_tile + Cfg::kTileBytes;
      const int key0 = key_lo + (tile_begin + warp + it * kW) * kT;

      // ---- S = Q K^T (fp32) ----
      float s[kNTiles][4];
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kQKSteps; ++kk) {
        uint32_t a[4];
        if constexpr (Cfg::kQInRegs) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[r] = q_frag[kk][r];
        } else {
          ldmatrix_x4(a, Smem::pair_step(q_lane, kk));
        }
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t bk[4];  // b0 b1 of n8 tile 2 np, then of 2 np + 1
          ldmatrix_x4(bk, Smem::pair_step(k_tile + k_lane, kk) + np * kRows16);
          Ops::mma(s[2 * np], a, bk[0], bk[1]);
          Ops::mma(s[2 * np + 1], a, bk[2], bk[3]);
        }
      }

      // ---- softcap (before the mask), then the predicate where some key may be hidden ----
      if (p.mask.softcap > 0.0) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[j][e] = attn::softcap_score(s[j][e], p.mask);
      }
      bool masked_tile = !(key0 >= unmasked.x && key0 + kT <= unmasked.y);
      if constexpr (Cfg::kMaskVote) {
        // Only the mask may hide a key of this tile: lane i asks its byte for key key0 + i.
        if (masked_tile && key0 >= vote_keys.x && key0 + kT <= vote_keys.y) {
          const bool kept =
              lane >= kT || vote_row[static_cast<int64_t>(key0 + lane) * p.mask.mask_stride_k] != 0;
          masked_tile = !__all_sync(0xffffffffu, kept);
        }
      }
      if (masked_tile) {
        const int col0 = key0 + 2 * (lane & 3);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          // This lane's row (lane / 4 or lane / 4 + 8 of the tile): its query and query head.
          // Padding rows borrow the last real row's (their outputs are never written).
          const int r = min(row0 + (lane >> 2) + 8 * hh, p.rows - 1);
          const attn::KeyMask<true> mask(p.mask, b, kv * p.group + r % p.group);
          const int query = r / p.group;
#pragma unroll
          for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              s[j][2 * hh + e] = mask.apply(s[j][2 * hh + e], query, col0 + j * 8 + e);
        }
      }

      // ---- online softmax (the scale folded into exp2), as task 4's kernel ----
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float m_new = row_max[hh];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) m_new = fmaxf(m_new, fmaxf(s[j][2 * hh], s[j][2 * hh + 1]));
        m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
        m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
        // A row with no visible key yet keeps m = -inf: subtract 0 instead (no -inf - -inf).
        const float m_scaled = m_new == -INFINITY ? 0.f : m_new * scale_log2;
        const float correction = exp2_approx(fmaf(row_max[hh], scale_log2, -m_scaled));
        row_max[hh] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          const float p0 = exp2_approx(fmaf(s[j][2 * hh], scale_log2, -m_scaled));
          const float p1 = exp2_approx(fmaf(s[j][2 * hh + 1], scale_log2, -m_scaled));
          s[j][2 * hh] = p0;
          s[j][2 * hh + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[hh] = fmaf(row_sum[hh], correction, sum);
#pragma unroll
        for (int j = 0; j < kDTiles; ++j) {
          o[j][2 * hh] *= correction;
          o[j][2 * hh + 1] *= correction;
        }
      }

      // ---- O += P V: P's accumulators, rounded pairwise, are the A fragments; the rounding's
      // remainder, rounded again, is a second A fragment (see the top of the file) ----
#pragma unroll
      for (int kk = 0; kk < kPVSteps; ++kk) {
        uint32_t a[4], a_rest[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float* pair = &s[2 * kk + (r >> 1)][2 * (r & 1)];  // a0 a1 a2 a3: see task 4
          a[r] = Ops::pack(pair[0], pair[1]);
          a_rest[r] = pack_remainder<Element>(pair[0], pair[1], a[r]);
        }
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t bv[4];  // b0 b1 of d tile 2 dp, then of 2 dp + 1
          ldmatrix_x4_trans(bv, Smem::pair_step(v_tile + v_lane, dp) + kk * kRows16);
          Ops::mma(o[2 * dp], a, bv[0], bv[1]);
          Ops::mma(o[2 * dp + 1], a, bv[2], bv[3]);
          Ops::mma(o[2 * dp], a_rest, bv[0], bv[1]);
          Ops::mma(o[2 * dp + 1], a_rest, bv[2], bv[3]);
        }
      }
      __syncwarp();  // every lane has read this stage before it is refilled
    }
    cp_async_wait<0>();  // only empty groups can be left; the ring is free
    __syncwarp();

    // A persistent block: the next item's Q and first kPreloadTiles tiles (into the stages the
    // warp merge leaves free) are copied now, in the prologue's first commit groups, while this
    // item merges, so that its pipeline is as full when its loop starts as in the loop itself.
    const int64_t next_item = Cfg::kPersistent && p.items > 0 ? item + gridDim.x : p.items;
    if (Cfg::kPersistent && next_item < p.items) {
      const GqaBlock nxt(p, next_item);
      cur_plan = plan_keys<kT>(p, nxt, attn::KeyMask<true>(p.mask, nxt.b, static_cast<int64_t>(nxt.kv) * p.group));
      __syncthreads();  // every warp is past its reads of Q (head dim 256 reads it in the loop)
      load_q_tile<Cfg, Element>(smem_q, p, nxt.b, nxt.kv, nxt.row0, nxt.rows_here, tid);
      cp_async_commit();
      const typename KvLayout::template Rows<Element> next_rows(kv_layout, nxt.b, nxt.kv);
#pragma unroll
      for (int t = 0; t < Cfg::kPreloadTiles; ++t) {
        if (warp + t * kW < cur_plan.tile_end - cur_plan.tile_begin) {
          const uint32_t k_tile = ring + (Cfg::kFreeStage + t) * Cfg::kStageBytes;
          load_kv_stage<Cfg, Element>(k_tile, k_tile + Cfg::kTileBytes, next_rows, p.q,
                                      cur_plan.key_lo + (cur_plan.tile_begin + warp + t * kW) * kT,
                                      cur_plan.key_hi, p.head_dim, lane);
        }
        cp_async_commit();
      }
    }

    // ---- merge the warps ----
    // Only the warps that had key tiles (the first with_tiles) are merged. The others hold O = 0
    // and row max -inf (weight 0), so the sums below would gain nothing from them (x + 0 * 0 = x;
    // a sum that starts at +0 is never -0): leaving them out changes no bit. Where warp 0 is the
    // only one (a split of one tile: the floor's decode of 16 keys), it finishes its rows from
    // its registers with the merge's arithmetic for one term and no block barrier, and the other
    // warps go straight to the end; else each merged warp stages its O (relative to its row max)
    // in its own ring and the block merges them.
    const int g = lane >> 2, t = lane & 3;
    const int with_tiles = min(kW, tile_end - tile_begin);
    if (with_tiles <= 1) {
      if (warp == 0) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int rr = g + 8 * hh;
          float l_warp = row_sum[hh];
          l_warp += __shfl_xor_sync(0xffffffffu, l_warp, 1);
          l_warp += __shfl_xor_sync(0xffffffffu, l_warp, 2);
          const float m_warp = row_max[hh] == -INFINITY ? -INFINITY : row_max[hh] * scale_log2;
          const float m = fmaxf(-INFINITY, m_warp);  // the merge's per-row code, one warp
          const float weight = m_warp == -INFINITY ? 0.f : exp2f(m_warp - m);
          const float l = fmaf(weight, l_warp, 0.f);
          float factor = l > 0.f ? 1.f / l : 0.f;  // no visible key: 0
          float lse = l > 0.f ? m + log2f(l) : -INFINITY;
          if (rr >= rows_here) continue;  // padding rows are never written
          if (p.mask.sinks != nullptr && split == 0) {
            const int head = kv * p.group + (row0 + rr) % p.group;
            const auto sink = attn::sink_term(p.mask.sinks[head], m);
            const float total = fmaf(l, sink.keys, sink.sink);
            factor = total > 0.f ? sink.keys / total : 0.f;
            lse = total > 0.f ? sink.top + log2f(total) : -INFINITY;
          }
          const float w0 = weight * factor;
          const int r = row0 + rr;
          if (p.num_splits == 1) {
            Element* const dst = output_row<Element>(p, b, kv, r);
#pragma unroll
            for (int j = 0; j < kDTiles; ++j) {
              if (8 * j >= p.head_dim) continue;
              store_output_pair<Element>(p, dst + 8 * j + 2 * t, fmaf(w0, o[j][2 * hh], 0.f),
                                         fmaf(w0, o[j][2 * hh + 1], 0.f));
            }
          } else {
            if (t == 0) p.lse[(b_kv * p.num_splits + split) * p.rows + r] = lse;
            float* const dst = p.partial + ((b_kv * p.num_splits + split) * p.rows + r) * p.head_dim;
#pragma unroll
            for (int j = 0; j < kDTiles; ++j) {
              if (8 * j >= p.head_dim) continue;
              *reinterpret_cast<float2*>(dst + 8 * j + 2 * t) =
                  make_float2(fmaf(w0, o[j][2 * hh], 0.f), fmaf(w0, o[j][2 * hh + 1], 0.f));
            }
          }
        }
      }
    } else {
      const int merged = with_tiles;  // warps 0 .. merged - 1
      float* const scratch = reinterpret_cast<float*>(smem_q_ptr + Cfg::kQBytes + warp * Cfg::kWarpRingBytes);
      if (warp < merged) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = g + 8 * hh;
#pragma unroll
          for (int j = 0; j < kDTiles; ++j)
            *reinterpret_cast<float2*>(scratch + row * Cfg::kScratchStride + Cfg::scratch_column(row, 8 * j + 2 * t)) =
                make_float2(o[j][2 * hh], o[j][2 * hh + 1]);
          float l = row_sum[hh];
          l += __shfl_xor_sync(0xffffffffu, l, 1);
          l += __shfl_xor_sync(0xffffffffu, l, 2);
          if (t == 0) {
            warp_max[warp][row] = row_max[hh] == -INFINITY ? -INFINITY : row_max[hh] * scale_log2;
            warp_sum[warp][row] = l;
          }
        }
      }
      __syncthreads();

      // Per row: the block's max and sum, each warp's weight, the sink (split 0 only) and lse.
      if (tid < kRowsPerTile) {
        const int rr = tid;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < kW; ++w)
          if (w < merged) m = fmaxf(m, warp_max[w][rr]);
        float weight[kW], l = 0.f;
#pragma unroll
        for (int w = 0; w < kW; ++w) {
          if (w >= merged) continue;
          weight[w] = warp_max[w][rr] == -INFINITY ? 0.f : exp2f(warp_max[w][rr] - m);
          l = fmaf(weight[w], warp_sum[w][rr], l);
        }
        float factor = l > 0.f ? 1.f / l : 0.f;  // no visible key: 0
        float lse = l > 0.f ? m + log2f(l) : -INFINITY;
        if (p.mask.sinks != nullptr && split == 0 && rr < rows_here) {
          const int head = kv * p.group + (row0 + rr) % p.group;
          const auto sink = attn::sink_term(p.mask.sinks[head], m);
          const float total = fmaf(l, sink.keys, sink.sink);
          factor = total > 0.f ? sink.keys / total : 0.f;
          lse = total > 0.f ? sink.top + log2f(total) : -INFINITY;
        }
#pragma unroll
        for (int w = 0; w < kW; ++w)
          if (w < merged) warp_weight[w][rr] = weight[w] * factor;
        if (p.num_splits > 1 && rr < rows_here)
          p.lse[(b_kv * p.num_splits + split) * p.rows + row0 + rr] = lse;
      }
      __syncthreads();

      // The rows' outputs, 8 elements per thread and step: normalised in q's dtype (one split) or
      // float32 partials. Padding rows and columns >= head_dim are never written.
      constexpr int kChunks8 = Cfg::kHeadDim / 8;
      for (int idx = tid; idx < kRowsPerTile * kChunks8; idx += Cfg::kThreads) {
        const int rr = idx / kChunks8, d0 = (idx % kChunks8) * 8;
        if (rr >= rows_here || d0 >= p.head_dim) continue;
        float val[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) val[e] = 0.f;
#pragma unroll
        for (int w = 0; w < kW; ++w) {
          if (w >= merged) continue;
          const float weight = warp_weight[w][rr];
          const float* src = reinterpret_cast<const float*>(smem_q_ptr + Cfg::kQBytes + w * Cfg::kWarpRingBytes) +
                             rr * Cfg::kScratchStride + Cfg::scratch_column(rr, d0);
          add_weighted(val, weight, *reinterpret_cast<const float4*>(src),
                       *reinterpret_cast<const float4*>(src + 4));
        }
        const int r = row0 + rr;
        if (p.num_splits == 1) {
          store_output<Element>(p, b, kv, r, d0, val);
        } else {
          float* dst = p.partial + ((b_kv * p.num_splits + split) * p.rows + r) * p.head_dim + d0;
          *reinterpret_cast<float4*>(dst) = make_float4(val[0], val[1], val[2], val[3]);
          *reinterpret_cast<float4*>(dst + 4) = make_float4(val[4], val[5], val[6], val[7]);
        }
      }
    }
    if (!Cfg::kPersistent || next_item >= p.items) break;
    __syncthreads();  // the merge's scratch has been read before the next item's copies land
    item = next_item;
    cur = GqaBlock(p, item);
    first_item = false;
    preloaded = true;
    base = Cfg::kFreeStage;
  }
  // END SOLUTION
  if (p.num_splits > 1 && p.counters != nullptr) {
    merge_in_last_block<Cfg, Element>(p);
  }
#else
  // Built for a GPU older than sm_80 (no cp.async, no bf16 mma): the host refuses to launch.
  __trap();
#endif
}

// ---- which instantiation the host launches ------------------------------------------------

// decode_gqa_kernel<Element, Cfg, KvLayout>, as the host side (decode_gqa.cu) configures,
// queries and launches it. Each element type's 10 instantiations are compiled in one file,
// decode_gqa_fp16.cu or decode_gqa_bf16.cu (the extern declarations below); a file that
// includes this header instantiates none of them.
template <typename KvLayout>
using GqaKernel = void (*)(const GqaParams, const KvLayout);

template <typename Element, typename Cfg, typename KvLayout>
GqaKernel<KvLayout> gqa_kernel() {
  return decode_gqa_kernel<Element, Cfg, KvLayout>;
}

extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD64, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD96, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD128, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD128Compact, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD256, ContiguousKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaD64, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaD96, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaD128, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaD128Compact, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaD256, PagedKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaD64, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaD96, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaD128, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaD128Compact, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaD256, ContiguousKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaD64, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaD96, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaD128, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaD128Compact, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaD256, PagedKv>();
// The mask-vote kernels (GqaMaskVote), for the contiguous cache: every configuration up to head
// dim 128 (kCanVote), and its persistent grid's.
#define ATTN_GQA_VOTE_EXTERNS(E)                                                                  \
  extern template GqaKernel<ContiguousKv> gqa_kernel<E, GqaMaskVote<GqaD64>, ContiguousKv>();            \
  extern template GqaKernel<ContiguousKv> gqa_kernel<E, GqaMaskVote<GqaD96>, ContiguousKv>();            \
  extern template GqaKernel<ContiguousKv> gqa_kernel<E, GqaMaskVote<GqaD128>, ContiguousKv>();           \
  extern template GqaKernel<ContiguousKv> gqa_kernel<E, GqaMaskVote<GqaD128Compact>, ContiguousKv>();    \
  extern template GqaKernel<ContiguousKv> gqa_kernel<E, GqaWalk<GqaMaskVote<GqaD64>>, ContiguousKv>();   \
  extern template GqaKernel<ContiguousKv> gqa_kernel<E, GqaWalk<GqaMaskVote<GqaD96>>, ContiguousKv>();   \
  extern template GqaKernel<ContiguousKv> gqa_kernel<E, GqaWalk<GqaMaskVote<GqaD128>>, ContiguousKv>();  \
  extern template GqaKernel<ContiguousKv> gqa_kernel<E, GqaWalk<GqaMaskVote<GqaD128Compact>>, ContiguousKv>();
ATTN_GQA_VOTE_EXTERNS(__half)
ATTN_GQA_VOTE_EXTERNS(__nv_bfloat16)
#undef ATTN_GQA_VOTE_EXTERNS
// The persistent grid's kernels (GqaWalk), where a configuration has one (kCanWalk).
extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaD64>, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaD96>, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaD128>, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaD128Compact>, ContiguousKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaWalk<GqaD64>, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaWalk<GqaD96>, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaWalk<GqaD128>, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__half, GqaWalk<GqaD128Compact>, PagedKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaWalk<GqaD64>, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaWalk<GqaD96>, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaWalk<GqaD128>, ContiguousKv>();
extern template GqaKernel<ContiguousKv> gqa_kernel<__nv_bfloat16, GqaWalk<GqaD128Compact>, ContiguousKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaWalk<GqaD64>, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaWalk<GqaD96>, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaWalk<GqaD128>, PagedKv>();
extern template GqaKernel<PagedKv> gqa_kernel<__nv_bfloat16, GqaWalk<GqaD128Compact>, PagedKv>();

}  // namespace attn_gqa
