// LayerNorm and RMSNorm of the rows of x, optionally after the residual add that precedes
// them: a decode step's normalisations in one kernel each.
//
// Not part of the graded course: task 6's model calls it in its decode steps (the PyTorch
// twin in task5/ops.py is the reference its tests compare against).
//
// The idea. A decode step normalises a handful of rows (batch 4 x hidden 4096) several times
// per layer; each call moves a few kilobytes, so what it costs is its latency, not bandwidth.
// One block per row; each thread loads its share of the row with 16-byte loads into
// registers (x is read once), the block sums it (warp shuffles, then one shared-memory slot
// per warp), and, for LayerNorm, sums the squared deviations from the mean taken from the
// same registers (a two-pass variance, exact, without a second read). Then each thread writes
// its share normalised. Everything accumulates in fp32; the output is rounded once.
//   LayerNorm  y = (h - mean) / sqrt(var + eps) * weight + bias
//   RMSNorm    y = h / sqrt(mean(h^2) + eps) * weight          (Llama, Mistral, Qwen)
// With a residual, h = x + residual is formed in registers, rounded to the dtype (what the
// model's residual stream holds, as `x + residual` in PyTorch would), written to
// residual_out, and normalised: one kernel instead of an add and a norm.
// Tile shape: one block per row; the row's 16-byte pieces spread over the block, about 4
// per thread (a whole number of warps, 32 to 1024 threads: short rows do not idle threads),
// at most kMaxPiecesPerThread each (rows up to 32768 fp32 or 65536 fp16/bf16 features).
// Launched overlapped (device_values.cuh): on Hopper it starts while the kernel before it finishes,
// and fetches its weight and bias (constant) meanwhile.
//
// Measured: task 6's decode step (TBT and its per-kernel profile) in Results.md.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "tensor_api.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "attention_checks.cuh"
#include "device_values.cuh"

namespace {

// 16-byte pieces of the row held per thread, and threads per block (common/limits.py).
constexpr int kMaxPiecesPerThread = ATTN_NORM_MAX_PIECES_PER_THREAD;
constexpr int kMaxThreads = ATTN_NORM_MAX_THREADS;
constexpr unsigned kFullWarp = 0xffffffffu;

using attn::from_float;
using attn::to_float;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

// The sum of `v` over the block, returned to every thread. `scratch` holds one float per
// warp; the second barrier lets the next call reuse it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = lane < warps ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  __syncthreads();
  return total;
}

// One 16-byte piece: kElems elements of T as fp32.
template <typename T>
struct Piece {
  static constexpr int kElems = 16 / sizeof(T);
  float v[kElems];

  __device__ __forceinline__ void load(const T* src) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kElems; ++i) v[i] = to_float(e[i]);
  }
  __device__ __forceinline__ void store(T* dst) const {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kElems; ++i) e[i] = from_float<T>(v[i]);
    *reinterpret_cast<uint4*>(dst) = raw;
  }
  // Round to T and back: the value a tensor of dtype T would hold.
  __device__ __forceinline__ void round_to_dtype() {
#pragma unroll
    for (int i = 0; i < kElems; ++i) v[i] = to_float(from_float<T>(v[i]));
  }
};

// x, residual, out, residual_out [rows, hidden] contiguous; weight, bias [hidden]. residual,
// residual_out and bias may be null (residual_out is written iff residual is given).
template <typename T, bool kRms>
__global__ void norm_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                            const T* __restrict__ weight, const T* __restrict__ bias,
                            T* __restrict__ out, T* __restrict__ residual_out, int hidden,
                            float eps, int prefetch_constants) {
  __shared__ float scratch[kMaxThreads / 32];
  constexpr int kElems = Piece<T>::kElems;
  const int pieces = hidden / kElems;
  // The weight and bias do not depend on the kernel before: this thread's pieces are fetched
  // into the SM's L1 while that kernel finishes, so the last step below does not wait on a trip
  // to memory (ATTN_NORM_PREFETCH=0 switches it off, to measure it: task6/NOTES.md).
  if (prefetch_constants) {
#pragma unroll
    for (int p = 0; p < kMaxPiecesPerThread; ++p) {
      const int piece = threadIdx.x + p * blockDim.x;
      if (piece >= pieces) break;
      attn::prefetch_to_l1(weight + piece * kElems);
      if (bias != nullptr) attn::prefetch_to_l1(bias + piece * kElems);
    }
  }
  attn::wait_for_previous_kernel();  // x and residual come from the kernel before
  attn::let_next_kernel_start();
  const int64_t row_start = static_cast<int64_t>(blockIdx.x) * hidden;
  // LayerNorm sums h - shift, shift = the row's first h (every thread reads it; one cached
  // load): rows with a large common offset (h = 300 + noise) then sum small deviations, and
  // h - shift is exact near the offset, so the mean loses no digits to the offset (summed raw, its fp32
  // rounding alone was 4x PyTorch's Welford error).
  float shift = 0.0f;
  if constexpr (!kRms) {
    shift = to_float(x[row_start]);
    if (residual != nullptr) shift += to_float(residual[row_start]);
  }

  // Load the row (and add the residual): piece p of this thread is threadIdx.x + p * blockDim.x.
  Piece<T> h[kMaxPiecesPerThread];
  float sum = 0.0f;
#pragma unroll
  for (int p = 0; p < kMaxPiecesPerThread; ++p) {
    const int piece = threadIdx.x + p * blockDim.x;
    if (piece >= pieces) break;
    const int64_t at = row_start + static_cast<int64_t>(piece) * kElems;
    h[p].load(x + at);
    if (residual != nullptr) {
      Piece<T> r;
      r.load(residual + at);
#pragma unroll
      for (int i = 0; i < kElems; ++i) h[p].v[i] += r.v[i];
      h[p].round_to_dtype();
      h[p].store(residual_out + at);
    }
#pragma unroll
    for (int i = 0; i < kElems; ++i) sum += kRms ? h[p].v[i] * h[p].v[i] : h[p].v[i] - shift;
  }

  // The statistics: RMSNorm's mean square, or LayerNorm's mean (as mean - shift) and then its
  // variance from the deviations (the registers still hold the row).
  const float inv_hidden = 1.0f / static_cast<float>(hidden);
  float mean = 0.0f, rstd;  // LayerNorm: mean - shift
  if constexpr (kRms) {
    rstd = rsqrtf(block_sum(sum, scratch) * inv_hidden + eps);
  } else {
    mean = block_sum(sum, scratch) * inv_hidden;
    float squares = 0.0f;
#pragma unroll
    for (int p = 0; p < kMaxPiecesPerThread; ++p) {
      if (threadIdx.x + p * blockDim.x >= pieces) break;
#pragma unroll
      for (int i = 0; i < kElems; ++i) {
        const float d = (h[p].v[i] - shift) - mean;
        squares += d * d;
      }
    }
    rstd = rsqrtf(block_sum(squares, scratch) * inv_hidden + eps);
  }

  // Normalise, scale, shift, write.
#pragma unroll
  for (int p = 0; p < kMaxPiecesPerThread; ++p) {
    const int piece = threadIdx.x + p * blockDim.x;
    if (piece >= pieces) break;
    const int column = piece * kElems;
    Piece<T> w, b;
    w.load(weight + column);
    if (bias != nullptr) b.load(bias + column);
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      const float bias_i = bias != nullptr ? b.v[i] : 0.0f;
      h[p].v[i] = ((h[p].v[i] - shift) - mean) * rstd * w.v[i] + bias_i;
    }
    h[p].store(out + row_start + column);
  }
}

// Threads for a row of `pieces` 16-byte pieces: about 4 pieces each (enough loads in flight
// per thread, few idle threads on short rows), a whole number of warps, at most 1024.
int threads_for_row(int64_t pieces) {
  const int64_t wanted = (pieces + 3) / 4;
  return static_cast<int>(std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, (wanted + 31) / 32 * 32)));
}

template <typename T>
T* data_or_null(const std::optional<torch::Tensor>& t) {
  return t.has_value() ? reinterpret_cast<T*>(t->data_ptr()) : nullptr;
}

// ATTN_NORM_PREFETCH=0 (read on every call) leaves the weight and bias to be loaded where they
// are used, as the kernel did before.
int norm_prefetch_enabled() { return attn::switched_off("ATTN_NORM_PREFETCH") ? 0 : 1; }

template <typename T>
void launch(const torch::Tensor& x, const std::optional<torch::Tensor>& residual,
            const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
            const torch::Tensor& out, const std::optional<torch::Tensor>& residual_out,
            int64_t rows, int hidden, float eps, bool rms) {
  const int threads = threads_for_row(hidden / Piece<T>::kElems);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto* x_ptr = reinterpret_cast<const T*>(x.data_ptr());
  const auto* w_ptr = reinterpret_cast<const T*>(weight.data_ptr());
  auto* out_ptr = reinterpret_cast<T*>(out.data_ptr());
  const T* res_ptr = data_or_null<const T>(residual);
  const T* bias_ptr = data_or_null<const T>(bias);
  T* res_out_ptr = data_or_null<T>(residual_out);
  const dim3 grid(static_cast<unsigned>(rows));
  attn::launch_overlapped("norm_kernel", rms ? norm_kernel<T, true> : norm_kernel<T, false>, grid,
                          dim3(threads), stream, x_ptr, res_ptr, w_ptr, bias_ptr, out_ptr,
                          res_out_ptr, hidden, eps, norm_prefetch_enabled());
}

void check_row_vector(const torch::Tensor& t, const char* name, const torch::Tensor& x,
                      int64_t hidden) {
  attn::check_same(t, name, x, "x");
  attn::check_contiguous(t, name);
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == hidden, attn::str(name, " must be [", hidden,
                    "] (one per feature of x) but is ", t.sizes(), "."));
  TORCH_CHECK_VALUE(attn::aligned16(t), attn::str(name, " must start 16-byte aligned."));
}

}  // namespace

// LayerNorm (rms = false) or RMSNorm (rms = true) over the last dimension of x [..., hidden]
// (contiguous), with weight [hidden] and, for LayerNorm, an optional bias [hidden]. With a
// residual (x's shape), h = x + residual is normalised and returned too: {out} or {out, h}.
std::vector<torch::Tensor> add_norm(torch::Tensor x, std::optional<torch::Tensor> residual,
                                    torch::Tensor weight, std::optional<torch::Tensor> bias,
                                    double eps, bool rms) {
  attn::check_cuda_tensor(x, "x");
  attn::check_dtype(x, "x", {torch::kFloat32, torch::kFloat16, torch::kBFloat16});
  attn::check_contiguous(x, "x");
  attn::check_nonempty(x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x must have at least one dimension.");
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  const int64_t elems_per_piece = 16 / x.element_size();
  TORCH_CHECK_VALUE(hidden % elems_per_piece == 0 && attn::aligned16(x),
                    attn::str("the norm kernel reads 16-byte pieces: the last dimension of x (",
                              hidden, ") must be a multiple of ", elems_per_piece,
                              " and x must start 16-byte aligned."));
  TORCH_CHECK_VALUE(hidden / elems_per_piece <= int64_t{kMaxThreads} * kMaxPiecesPerThread,
                    attn::str("the norm kernel holds a row in registers: at most ",
                              int64_t{kMaxThreads} * kMaxPiecesPerThread * elems_per_piece,
                              " features for this dtype, but x has ", hidden, "."));
  TORCH_CHECK_VALUE(rows <= INT32_MAX, "the norm kernel takes at most 2^31 - 1 rows.");
  TORCH_CHECK_VALUE(eps >= 0.0, attn::str("eps must be >= 0 but is ", eps, "."));
  check_row_vector(weight, "weight", x, hidden);
  if (bias.has_value()) {
    TORCH_CHECK_VALUE(!rms, "RMSNorm has no bias (pass bias=None).");
    check_row_vector(*bias, "bias", x, hidden);
  }
  if (residual.has_value()) {
    attn::check_same(*residual, "residual", x, "x");
    attn::check_contiguous(*residual, "residual");
    TORCH_CHECK_VALUE(residual->sizes() == x.sizes(), attn::str("residual is ", residual->sizes(),
                      " but x is ", x.sizes(), "; they must have the same shape."));
    TORCH_CHECK_VALUE(attn::aligned16(*residual), "residual must start 16-byte aligned.");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const torch::Tensor out = torch::empty_like(x);
  const std::optional<torch::Tensor> sum =
      residual.has_value() ? std::optional<torch::Tensor>(torch::empty_like(x)) : std::nullopt;
  const int h = static_cast<int>(hidden);
  const float e = static_cast<float>(eps);
  switch (x.scalar_type()) {
    case torch::kFloat32: launch<float>(x, residual, weight, bias, out, sum, rows, h, e, rms); break;
    case torch::kFloat16: launch<__half>(x, residual, weight, bias, out, sum, rows, h, e, rms); break;
    default: launch<__nv_bfloat16>(x, residual, weight, bias, out, sum, rows, h, e, rms); break;
  }
  if (sum.has_value()) return {out, *sum};
  return {out};
}
