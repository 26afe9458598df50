// RoPE and the KV-cache append in one kernel: q and k rotated, k and v written into the cache.
//
// Not part of the graded course: task 6's model calls it in its decode steps and its prefills,
// in place of task 6's apply_rope (3 kernels, on q and k together) plus task 5's
// update_kv_cache (1), and, in decode, of the per-step gathers of the cos/sin rows (the
// position is read here, on the device).
// The PyTorch twin in task5/ops.py is the reference its tests compare against.
//
// The idea. At position p, RoPE rotates point i = (x[i], x[i + D/2]) of a head vector by the
// angle p * theta_i (rotate-half form; task6/rope.py explains it):
//     y[i]       = x[i] cos - x[i + D/2] sin
//     y[i + D/2] = x[i + D/2] cos + x[i] sin
// One thread per point of one head of one token: the q heads are rotated into q_out, the k
// heads rotated into the cache at row p, the v heads copied there. The cos/sin tables are
// the model's fp32 tables [max_len, D] (column i and i + D/2 hold the same angle), read at
// row p = current_pos + s, with current_pos a host int or a CUDA int32 tensor read when the
// kernel runs (so a captured CUDA graph replays it at each new position). A position outside
// the cache or the tables (a device value cannot be checked on the host) writes nothing to
// the cache and zeros to q_out.
// Tile shape: 128 threads per block; grid (tokens, ceil(points per token / 128)). A decode
// step moves a few kilobytes: this kernel is latency, and one launch instead of five is the
// point.
// Launched overlapped (device_values.cuh): on Hopper it starts while the kernel before it finishes,
// and fetches the cos/sin rows of its position meanwhile (prefetch_table_rows).
//
// Measured: task 6's decode step (TBT and its per-kernel profile) in Results.md.
//
// Two caches, one kernel body: where a token's K/V row goes is a policy chosen by a template
// parameter, ContiguousCache ([B, max_len, kv_heads * D], rope_append) or the paged cache's
// PagedKv (decode_paged.cuh: pages [num_pages, page_size, kv_heads, D] through a block
// table, rope_append_paged). A position whose page the table does not have writes nothing.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "tensor_api.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "attention_checks.cuh"
#include "decode_common.cuh"  // paged_kv (decode_paged.cu)
#include "decode_paged.cuh"
#include "device_values.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxGridY = 65535;

using attn::from_float;
using attn::RuntimeInt;
using attn::to_float;

// Element strides of the inputs ([B, S, heads, D], last dim contiguous). Where the caches are
// is the kernel's second parameter (ContiguousCache, or PagedKv).
struct RopeAppendParams {
  const void* q;
  const void* k;
  const void* v;
  void* q_out;    // [B, S, q_heads, D] contiguous
  const float* cos;  // [table_len, D] contiguous
  const float* sin;
  int64_t q_strides[3], k_strides[3], v_strides[3];  // batch, token, head
  int seq, q_heads, kv_heads, head_dim;
  int64_t max_position;  // min(cache length, table length): positions must be below it
  RuntimeInt current_pos;
  bool prefetch_tables;  // prefetch_table_rows before the wait (ATTN_ROPE_PREFETCH=0: off)
  bool release_early;    // let the next kernel start before this one waits (see the kernel)
};

// The contiguous caches [B, max_len, kv_heads * D] (last dim contiguous; k and v caches alike
// strided): head `head` of the row at `position` of sequence b.
struct ContiguousCache {
  void* k_cache;
  void* v_cache;
  int64_t stride_b, stride_position;
  int head_dim;
  template <typename T>
  __device__ __forceinline__ T* cache_row(bool is_key, int64_t b, int64_t position, int head) const {
    return static_cast<T*>(is_key ? k_cache : v_cache) + b * stride_b + position * stride_position +
           static_cast<int64_t>(head) * head_dim;
  }
};

// (x1, x2) rotated by the angle whose cosine and sine are (c, s), rounded as task 6's
// apply_rope rounds it in fp32: out = x * cos is one kernel (x1 cos rounded), then PyTorch's
// addcmul computes fma(value, t1 * t2, out), which for value = -1 rounds x2 sin first and
// for value = +1 is one fma(x1, s, x2 cos). The _rn intrinsics keep nvcc from contracting
// the separately rounded products into other fused multiply-adds.
__device__ __forceinline__ float2 rotate(float x1, float x2, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)), fmaf(x1, s, __fmul_rn(x2, c)));
}

// The cos and sin rows of this block's token, fetched into L1 while the kernel before finishes,
// so that the rotation after the wait does not wait on memory for them (between two layers,
// the weights streamed through L2 have pushed them out). The tables are constant; the position
// is only peeked at (RuntimeInt::peek) to choose the rows, and is read again after the wait,
// so a position still being written costs only a useless prefetch.
__device__ __forceinline__ void prefetch_table_rows(const RopeAppendParams& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kLineFloats = 128 / sizeof(float);
  const int lines_per_row = (p.head_dim + kLineFloats - 1) / kLineFloats;
  if (!p.prefetch_tables || threadIdx.x >= 2 * lines_per_row) return;
  const int64_t b = blockIdx.x / p.seq, s = blockIdx.x % p.seq;
  const int64_t position = p.current_pos.peek(b) + s;
  if (position < 0 || position >= p.max_position) return;
  const float* table = threadIdx.x < lines_per_row ? p.cos : p.sin;
  const float* line = table + position * p.head_dim + (threadIdx.x % lines_per_row) * kLineFloats;
  attn::prefetch_to_l1(line);
#endif
}

template <typename T, typename Cache>
__global__ void __launch_bounds__(kThreads) rope_append_kernel(const RopeAppendParams p,
                                                              const Cache cache) {
  prefetch_table_rows(p);
  // The next kernel (a decode step's attention) may start at once: this one is short, and what
  // the attention reads before its own wait, the cache rows settled before this step and the
  // lengths, no kernel of this layer writes (device_inline.cuh). Its blocks then copy their
  // first K/V tiles while this kernel and the product before it finish.
  if (p.release_early) attn::let_next_kernel_start();
  attn::wait_for_previous_kernel();  // q, k, v and the position come from the kernels before
  if (!p.release_early) attn::let_next_kernel_start();
  const int half = p.head_dim / 2;
  const int64_t token = blockIdx.x;          // b * seq + s
  const int64_t b = token / p.seq, s = token % p.seq;
  const int64_t point = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  const int head_row = static_cast<int>(point / half);  // q heads, then k heads, then v heads
  const int i = static_cast<int>(point % half);
  if (head_row >= p.q_heads + 2 * p.kv_heads) return;

  const int64_t position = p.current_pos.at(b) + s;
  const bool in_range = position >= 0 && position < p.max_position;
  if (head_row < p.q_heads) {
    const T* src = static_cast<const T*>(p.q) + b * p.q_strides[0] + s * p.q_strides[1] +
                   head_row * p.q_strides[2];
    T* dst = static_cast<T*>(p.q_out) + ((b * p.seq + s) * p.q_heads + head_row) * p.head_dim;
    float2 y = make_float2(0.0f, 0.0f);
    if (in_range) {
      const int64_t angle = position * p.head_dim + i;
      y = rotate(to_float(src[i]), to_float(src[i + half]), p.cos[angle], p.sin[angle]);
    }
    dst[i] = from_float<T>(y.x);
    dst[i + half] = from_float<T>(y.y);
    return;
  }
  if (!in_range) return;
  const bool is_key = head_row < p.q_heads + p.kv_heads;
  const int kv_head = head_row - p.q_heads - (is_key ? 0 : p.kv_heads);
  const int64_t* strides = is_key ? p.k_strides : p.v_strides;
  const T* src = static_cast<const T*>(is_key ? p.k : p.v) + b * strides[0] + s * strides[1] +
                 kv_head * strides[2];
  T* dst = cache.template cache_row<T>(is_key, b, position, kv_head);
  if (dst == nullptr) return;  // a paged cache without a page for this position
  if (is_key) {
    const int64_t angle = position * p.head_dim + i;
    const float2 y = rotate(to_float(src[i]), to_float(src[i + half]), p.cos[angle], p.sin[angle]);
    dst[i] = from_float<T>(y.x);
    dst[i + half] = from_float<T>(y.y);
  } else {
    dst[i] = src[i];
    dst[i + half] = src[i + half];
  }
}

void copy_strides(const torch::Tensor& t, int64_t (&out)[3]) {
  for (int d = 0; d < 3; ++d) out[d] = t.stride(d);
}

// The checks of q [B, S, Hq, D], k and v [B, S, Hkv, D], cos and sin [table_len, D] (fp32,
// contiguous) that both caches share.
void check_rope_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& cos, const torch::Tensor& sin) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"},
                                std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    attn::check_cuda_tensor(*t, name);
    attn::check_nonempty(*t, name);
  }
  attn::check_dtype(q, "q", {torch::kFloat32, torch::kFloat16, torch::kBFloat16});
  attn::check_same(k, "k", q, "q");
  attn::check_same(v, "v", q, "q");
  attn::check_dim(q, "q", 4, "[batch, tokens, q_heads, head_dim]");
  attn::check_dim(k, "k", 4, "[batch, tokens, kv_heads, head_dim]");
  attn::check_dim(v, "v", 4, "[batch, tokens, kv_heads, head_dim]");
  attn::check_dim(cos, "cos", 2, "[max_len, head_dim]");
  attn::check_dim(sin, "sin", 2, "[max_len, head_dim]");
  const int64_t batch = q.size(0), seq = q.size(1), head_dim = q.size(3);
  TORCH_CHECK_VALUE(head_dim % 2 == 0, attn::str("RoPE rotates pairs: head_dim must be even, but is ",
                    head_dim, "."));
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(0) == batch && k.size(1) == seq &&
                    k.size(3) == head_dim,
                    attn::str("k and v must be [", batch, ", ", seq, ", kv_heads, ", head_dim,
                              "] like q, but are ", k.sizes(), " and ", v.sizes(), "."));
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    attn::check_dtype(*t, name, {torch::kFloat32});
    attn::check_contiguous(*t, name);
    TORCH_CHECK_VALUE(t->size(1) == head_dim && t->sizes() == cos.sizes(),
                      attn::str("cos and sin must both be [max_len, ", head_dim, "] but are ",
                                cos.sizes(), " and ", sin.sizes(), "."));
  }
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    attn::check_last_dim_contiguous(*t, name);
  }
}

// Fill the parameters of checked inputs, check the positions an int current_pos writes
// (below max_position: the cache's or the table's length, whichever is shorter), and launch
// the kernel for `cache`. Returns q rotated.
template <typename Cache>
torch::Tensor launch_rope_append(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& cos, const torch::Tensor& sin,
                                 const Cache& cache, int64_t cache_len, const char* cache_name,
                                 int64_t current_pos, const std::optional<torch::Tensor>& current_pos_tensor) {
  const int64_t batch = q.size(0), seq = q.size(1), q_heads = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = k.size(2);
  const int64_t max_position = std::min(cache_len, cos.size(0));
  if (!current_pos_tensor.has_value()) {
    TORCH_CHECK_VALUE(current_pos >= 0 && current_pos + seq <= max_position,
                      attn::str("positions [", current_pos, ", ", current_pos + seq, ") do not fit: "
                                "the ", cache_name, " ", cache_len, " positions and the RoPE tables ",
                                cos.size(0), "."));
  }
  const int64_t points = (q_heads + 2 * kv_heads) * (head_dim / 2);
  const int64_t blocks_per_token = (points + kThreads - 1) / kThreads;
  TORCH_CHECK_VALUE(blocks_per_token <= kMaxGridY && batch * seq <= INT32_MAX,
                    "rope_append: too many heads or tokens for one launch.");

  RopeAppendParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  const torch::Tensor q_out = torch::empty({batch, seq, q_heads, head_dim}, q.options());
  p.q_out = q_out.data_ptr();
  p.cos = cos.data_ptr<float>();
  p.sin = sin.data_ptr<float>();
  copy_strides(q, p.q_strides);
  copy_strides(k, p.k_strides);
  copy_strides(v, p.v_strides);
  p.seq = static_cast<int>(seq);
  p.q_heads = static_cast<int>(q_heads);
  p.kv_heads = static_cast<int>(kv_heads);
  p.head_dim = static_cast<int>(head_dim);
  p.max_position = max_position;
  p.current_pos = attn::runtime_int(current_pos, current_pos_tensor, "current_pos", batch, q.device());
  p.prefetch_tables = !attn::switched_off("ATTN_ROPE_PREFETCH");  // read on every call
  // Read on every call so that one process can compare: ATTN_ROPE_EARLY_RELEASE=0 lets the next
  // kernel start only once this one has waited.
  p.release_early = !attn::switched_off("ATTN_ROPE_EARLY_RELEASE");

  const c10::cuda::CUDAGuard guard(q.device());
  const dim3 grid(static_cast<unsigned>(batch * seq), static_cast<unsigned>(blocks_per_token));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto kernel = q.scalar_type() == torch::kFloat32   ? rope_append_kernel<float, Cache>
                      : q.scalar_type() == torch::kFloat16 ? rope_append_kernel<__half, Cache>
                                                           : rope_append_kernel<__nv_bfloat16, Cache>;
  attn::launch_overlapped("rope_append_kernel", kernel, grid, dim3(kThreads), stream, p, cache);
  return q_out;
}

}  // namespace

// q [B, S, Hq, D], k and v [B, S, Hkv, D] (any strides, last dim contiguous); k_cache, v_cache
// [B, max_len, Hkv * D]; cos, sin [table_len, D] float32 contiguous. Rotates q (returned,
// [B, S, Hq, D] contiguous) and k by RoPE at positions current_pos + s, and writes the rotated
// k and v into the caches at those positions. current_pos_tensor (CUDA int32, 0-d or [B]),
// when given, replaces current_pos and is read on the device.
torch::Tensor rope_append(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor k_cache,
                          torch::Tensor v_cache, torch::Tensor cos, torch::Tensor sin,
                          int64_t current_pos, std::optional<torch::Tensor> current_pos_tensor) {
  check_rope_inputs(q, k, v, cos, sin);
  for (const auto& [t, name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    attn::check_cuda_tensor(*t, name);
    attn::check_nonempty(*t, name);
    attn::check_same(*t, name, q, "q");
    attn::check_dim(*t, name, 3, "[batch, max_len, kv_heads * head_dim]");
    attn::check_last_dim_contiguous(*t, name);
  }
  const int64_t batch = q.size(0), head_dim = q.size(3), kv_heads = k.size(2);
  TORCH_CHECK_VALUE(k_cache.sizes() == v_cache.sizes() && k_cache.size(0) == batch &&
                    k_cache.size(2) == kv_heads * head_dim,
                    attn::str("the caches must be [", batch, ", max_len, ", kv_heads * head_dim,
                              "] (kv_heads * head_dim) but are ", k_cache.sizes(), " and ",
                              v_cache.sizes(), "."));
  TORCH_CHECK_VALUE(k_cache.strides() == v_cache.strides(),
                    "k_cache and v_cache must have the same strides.");
  const ContiguousCache cache{k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0),
                              k_cache.stride(1), static_cast<int>(head_dim)};
  return launch_rope_append(q, k, v, cos, sin, cache, k_cache.size(1), "cache holds", current_pos,
                            current_pos_tensor);
}

// The same into a paged cache (decode_paged.cuh): k_pages, v_pages [num_pages, page_size, Hkv,
// D] (contiguous, q's dtype), block_table [B, max_pages] int32 on the GPU. Token s of sequence
// b goes to position current_pos + s (its length before the append: an int, or CUDA int32, 0-d
// or [B], read on the device), row position % page_size of page block_table[b][position /
// page_size]; the caller has given the sequence that page (task5/ops.py's PageAllocator). A
// position past the table, or whose entry is not a page, writes nothing (q is still rotated).
torch::Tensor rope_append_paged(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                torch::Tensor k_pages, torch::Tensor v_pages,
                                torch::Tensor block_table, torch::Tensor cos, torch::Tensor sin,
                                int64_t current_pos, std::optional<torch::Tensor> current_pos_tensor) {
  check_rope_inputs(q, k, v, cos, sin);
  const attn_decode::PagedKv pages =
      attn_decode::paged_kv(k_pages, v_pages, block_table, q, q.size(0), q.size(3));
  TORCH_CHECK_VALUE(k_pages.size(2) == k.size(2), attn::str("k has ", k.size(2), " KV heads but the "
                    "pages hold ", k_pages.size(2), "; they must match."));
  const int64_t capacity = static_cast<int64_t>(pages.max_pages) << pages.page_shift;
  return launch_rope_append(q, k, v, cos, sin, pages, capacity, "block table holds", current_pos,
                            current_pos_tensor);
}
