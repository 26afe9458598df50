// Task 2: naive multi-head attention in CUDA, one kernel per step.
//
// The idea: compute softmax(Q K^T / sqrt(d) [+ causal mask]) V the textbook way, holding the
// whole S x S score matrix of every head in global memory. With heads split into a batch of
// B*H matrices [S, D]:
//
//   scores = GEMM_NT(Q, K)            [B*H, S, S]  Q @ K^T, reading K as stored ([S, D]):
//                                                  no transposed copy of K is ever made
//   scale_and_causal_mask(scores)     in place: times 1/sqrt(D); future cells -> -inf
//   softmax(scores)                   in place, one block per row
//   out = GEMM_NN(scores, V)          [B*H, S, D]
//
// Four launches and several passes over S x S matrices: memory and traffic grow with S^2.
// That is the cost task 4 removes by fusing everything into one kernel.
//
// Tile shapes and why:
//  * softmax: one block of 256 threads (8 warps) per row. Each thread strides over the row
//    (so any row length works, longer or shorter than the block), then the block combines
//    its 256 partial results: warp shuffles inside each warp (registers only, no barrier),
//    one shared-memory slot per warp, and a final shuffle in warp 0. Twice: max, then sum.
//  * GEMMs: a 16 x 16 output tile per block, block (16, 16), one output per thread. Per
//    step along K each thread loads one element of the A tile and one of the B tile into
//    shared memory; each loaded element is then used 16 times from shared memory instead
//    of being read 16 times from global memory. Elements outside the matrices are loaded
//    as zeros, so M, N and K need not be multiples of 16.
//
// Launch geometry: GEMMs use grid (ceil(N/16), ceil(M/16), batch) with blockIdx.z = batch
// (gridDim.z <= 65535, so larger batches are launched in chunks); softmax uses grid
// (batch, rows) with blockIdx.y = row, folded into (batch * rows, 1) when rows > 65535.
//
// Measured speed (against task 4's fused kernel and SDPA): Results.md, rendered from
// results/<gpu>.json by the benchmark sweep. It also needs S x S memory, which task 4 does not.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "tensor_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "attention_checks.cuh"

namespace {

constexpr int kSoftmaxThreads = 256;     // threads per softmax block (one block per row)
constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kTile = 16;                // GEMM output tile kTile x kTile, block (kTile, kTile)
constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxElementwiseBlocks = 1 << 20;  // a grid-stride loop covers the rest
constexpr int64_t kMaxGridYZ = 65535;    // CUDA's limit on gridDim.y and gridDim.z
constexpr int64_t kMaxGridX = std::numeric_limits<int32_t>::max();

// ---------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------

// Numerically stable softmax of each row of a contiguous [num_rows, row_length] matrix.
// Block b handles row blockIdx.x * gridDim.y + blockIdx.y (grid (batch, rows) or
// (batch * rows, 1): the same formula covers both). blockDim.x = kSoftmaxThreads.
//
// `input` and `output` are deliberately not __restrict__: attention runs this in place
// (input == output). That is safe because the last pass reads and writes each element in
// the same thread, and every read of the first two passes is finished at the barriers.
__global__ void softmax_kernel(const float* input, float* output, int64_t row_length) {
  // BEGIN SOLUTION kernel
  // HINT: row = blockIdx.x * gridDim.y + blockIdx.y; the row starts at input + row * row_length.
  // HINT: 1. Each thread takes the max over columns threadIdx.x, threadIdx.x + blockDim.x, ...
  // HINT:    (start at -INFINITY); reduce inside each warp with __shfl_xor_sync (offsets 16..1);
  // HINT:    lane 0 of each warp writes a __shared__ slot; __syncthreads(); warp 0 reduces the
  // HINT:    slots and publishes the row max in shared memory; __syncthreads().
  // HINT: 2. The same for the sum of expf(x - row_max) (start at 0): every exponent is <= 0.
  // HINT: 3. Write expf(x - row_max) / row_sum for the thread's columns.
  __shared__ float warp_partials[kSoftmaxThreads / kWarpSize];
  __shared__ float row_max_shared;
  __shared__ float row_sum_shared;

  const int64_t row = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
  const float* in_row = input + row * row_length;
  float* out_row = output + row * row_length;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;

  // 1. Row maximum. Consecutive threads read consecutive columns (coalesced); a thread
  //    with no column at all (row shorter than the block) keeps -inf, the identity of max.
  float thread_max = -INFINITY;
  for (int64_t col = threadIdx.x; col < row_length; col += blockDim.x) {
    thread_max = fmaxf(thread_max, in_row[col]);
  }
  // xor butterfly: after offsets 16, 8, 4, 2, 1 every lane holds its warp's maximum.
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    thread_max = fmaxf(thread_max, __shfl_xor_sync(kFullWarp, thread_max, offset));
  }
  if (lane == 0) warp_partials[warp] = thread_max;
  __syncthreads();  // every warp's maximum is in shared memory
  if (warp == 0) {  // the whole of warp 0 enters, so the full-warp shuffle mask is right
    float m = lane < num_warps ? warp_partials[lane] : -INFINITY;
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      m = fmaxf(m, __shfl_xor_sync(kFullWarp, m, offset));
    }
    if (lane == 0) row_max_shared = m;
  }
  // The row max is published, and warp 0 has finished reading warp_partials, so pass 2
  // may overwrite them.
  __syncthreads();
  const float row_max = row_max_shared;

  // 2. Sum of exp(x - max). Subtracting the max keeps every exponent <= 0: no overflow
  //    even for scores like 100 (exp(100) does not fit in a float).
  float thread_sum = 0.0f;
  for (int64_t col = threadIdx.x; col < row_length; col += blockDim.x) {
    thread_sum += expf(in_row[col] - row_max);
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    thread_sum += __shfl_xor_sync(kFullWarp, thread_sum, offset);
  }
  if (lane == 0) warp_partials[warp] = thread_sum;
  __syncthreads();
  if (warp == 0) {
    float s = lane < num_warps ? warp_partials[lane] : 0.0f;
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      s += __shfl_xor_sync(kFullWarp, s, offset);
    }
    if (lane == 0) row_sum_shared = s;
  }
  __syncthreads();  // the row sum is published
  const float row_sum = row_sum_shared;

  // 3. Normalise. The max element contributes exp(0) = 1, so row_sum >= 1 whenever the row
  //    has a finite maximum (a causal row always does: it sees its own diagonal cell).
  for (int64_t col = threadIdx.x; col < row_length; col += blockDim.x) {
    out_row[col] = expf(in_row[col] - row_max) / row_sum;
  }
  // END SOLUTION
}

// C = A @ B^T for one matrix of the batch (blockIdx.z): A [M, K], B [N, K], C [M, N], all
// contiguous. The pointers point at the first matrix of this launch.
__global__ void gemm_nt_kernel(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ c, int M, int N, int K) {
  // BEGIN SOLUTION kernel
  // HINT: Offset a, b, c to matrix blockIdx.z. This thread computes C[row][col] with
  // HINT: row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x.
  // HINT: For each 16-wide step k0 along K: load a 16x16 tile of A (rows of this block) and
  // HINT: of B (rows blockIdx.x * 16 + threadIdx.y: B is [N, K]) into __shared__ arrays,
  // HINT: threadIdx.x walking along K so reads are coalesced; load 0.0f outside the matrix;
  // HINT: __syncthreads(); accumulate the 16 products; __syncthreads() before the next load.
  // HINT: Write C[row][col] only if row < M and col < N.
  // a_tile[i][kk] = A[block_row0 + i][k0 + kk];  b_tile[j][kk] = B[block_col0 + j][k0 + kk].
  // The inner loop reads b_tile[threadIdx.x][kk]: 16 threads of a warp read one column.
  // With rows of 16 floats they would hit only 2 of the 32 banks (an 8-way conflict); a row
  // of 17 puts each of them in its own bank.
  __shared__ float a_tile[kTile][kTile];
  __shared__ float b_tile[kTile][kTile + 1];

  const int64_t batch = blockIdx.z;
  a += batch * M * K;
  b += batch * N * K;
  c += batch * M * N;

  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty;    // row of A and C
  const int col = blockIdx.x * kTile + tx;    // column of C = row of B
  const int b_row = blockIdx.x * kTile + ty;  // the row of B this thread loads

  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    const int k = k0 + tx;  // consecutive threads read consecutive addresses (coalesced)
    a_tile[ty][tx] = (row < M && k < K) ? a[static_cast<int64_t>(row) * K + k] : 0.0f;
    b_tile[ty][tx] = (b_row < N && k < K) ? b[static_cast<int64_t>(b_row) * K + k] : 0.0f;
    __syncthreads();  // the tiles are complete before anyone reads them
    for (int kk = 0; kk < kTile; ++kk) {
      acc += a_tile[ty][kk] * b_tile[tx][kk];  // zeros past K add nothing
    }
    __syncthreads();  // everyone has read the tiles before the next step overwrites them
  }
  // Threads outside C still took part in the loads and barriers above; only now they stop.
  if (row < M && col < N) c[static_cast<int64_t>(row) * N + col] = acc;
  // END SOLUTION
}

// C = A @ B for one matrix of the batch (blockIdx.z): A [M, K], B [K, N], C [M, N], all
// contiguous. The pointers point at the first matrix of this launch.
__global__ void gemm_nn_kernel(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ c, int M, int N, int K) {
  // BEGIN SOLUTION kernel
  // HINT: As gemm_nt_kernel, but B is [K, N]: its tile is rows k0 + threadIdx.y, columns
  // HINT: blockIdx.x * 16 + threadIdx.x (coalesced along N), and the product reads
  // HINT: b_tile[kk][threadIdx.x]. Zero-fill outside the matrices; two __syncthreads per step.
  // a_tile[i][kk] = A[block_row0 + i][k0 + kk];  b_tile[kk][j] = B[k0 + kk][block_col0 + j].
  // The inner loop reads b_tile[kk][threadIdx.x]: consecutive threads, consecutive banks,
  // so no padding is needed here.
  __shared__ float a_tile[kTile][kTile];
  __shared__ float b_tile[kTile][kTile];

  const int64_t batch = blockIdx.z;
  a += batch * M * K;
  b += batch * K * N;
  c += batch * M * N;

  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty;  // row of A and C
  const int col = blockIdx.x * kTile + tx;  // column of B and C

  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    const int a_k = k0 + tx;  // column of A this thread loads
    const int b_k = k0 + ty;  // row of B this thread loads
    a_tile[ty][tx] = (row < M && a_k < K) ? a[static_cast<int64_t>(row) * K + a_k] : 0.0f;
    b_tile[ty][tx] = (b_k < K && col < N) ? b[static_cast<int64_t>(b_k) * N + col] : 0.0f;
    __syncthreads();  // the tiles are complete before anyone reads them
    for (int kk = 0; kk < kTile; ++kk) {
      acc += a_tile[ty][kk] * b_tile[kk][tx];
    }
    __syncthreads();  // everyone has read the tiles before the next step overwrites them
  }
  if (row < M && col < N) c[static_cast<int64_t>(row) * N + col] = acc;
  // END SOLUTION
}

// In place on contiguous scores [batch, seq, seq]: multiply by `scale`; when `causal`, set
// the cells above the diagonal (key col > query row: the future) to -inf, so softmax gives
// them weight exp(-inf) = 0. -inf rather than a finite "large negative" number matches
// task 1 exactly; it is safe because no row is fully masked (row i always keeps column i),
// so every row max is finite and exp(-inf - max) is exactly 0, never NaN.
// One thread per element, in a grid-stride loop so that any size fits any grid.
__global__ void scale_and_causal_mask_kernel(float* scores, int64_t total, int64_t seq,
                                             float scale, bool causal) {
  // BEGIN SOLUTION kernel
  // HINT: Grid-stride loop over i = blockIdx.x * blockDim.x + threadIdx.x (64-bit), step
  // HINT: gridDim.x * blockDim.x, while i < total. Column = i % seq, row = (i / seq) % seq.
  // HINT: Masked (causal and column > row): -INFINITY; otherwise scores[i] * scale.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t col = i % seq;          // key position
    const int64_t row = (i / seq) % seq;  // query position
    scores[i] = (causal && col > row) ? -INFINITY : scores[i] * scale;
  }
  // END SOLUTION
}

// ---------------------------------------------------------------------------------------
// Launchers: the launch geometry of each kernel (inputs already validated and contiguous).
// ---------------------------------------------------------------------------------------

// Softmax over the last dimension of contiguous `input` into contiguous `output` (same
// shape; may be the same tensor).
void launch_softmax(const torch::Tensor& input, const torch::Tensor& output) {
  const int64_t row_length = input.size(-1);
  const int64_t rows = input.dim() >= 2 ? input.size(-2) : 1;
  const int64_t batch = input.numel() / (rows * row_length);
  TORCH_CHECK_VALUE(batch * rows <= kMaxGridX, attn::str("softmax: ", batch * rows,
                    " rows are more than one launch can cover (", kMaxGridX, ")."));
  // The course's grid is (batch, rows); gridDim.y is limited to 65535, so more rows than
  // that are folded into x. The kernel's row = blockIdx.x * gridDim.y + blockIdx.y is the
  // same row either way.
  const dim3 grid = rows <= kMaxGridYZ
                        ? dim3(static_cast<unsigned>(batch), static_cast<unsigned>(rows))
                        : dim3(static_cast<unsigned>(batch * rows), 1);
  softmax_kernel<<<grid, kSoftmaxThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      input.data_ptr<float>(), output.data_ptr<float>(), row_length);
  attn::check_launch("softmax_kernel");
}

enum class GemmLayout { kNN, kNT };  // C = A @ B (B [K, N]) or C = A @ B^T (B [N, K])

// c[i] = a[i] @ b[i] (kNN) or a[i] @ b[i]^T (kNT) for every i; all three contiguous 3-D.
void launch_gemm(GemmLayout layout, const torch::Tensor& a, const torch::Tensor& b,
                 const torch::Tensor& c) {
  const int64_t batch = a.size(0);
  const int64_t M = a.size(1);
  const int64_t K = a.size(2);
  const int64_t N = c.size(2);
  TORCH_CHECK_VALUE(attn::ceil_div(M, kTile) <= kMaxGridYZ, attn::str("M = ", M,
                    " rows need more than 65535 tiles of ", kTile, " (gridDim.y's limit)."));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dim3 block(kTile, kTile);
  // gridDim.z is at most 65535: launch the batch in chunks, each starting at its own
  // matrix (blockIdx.z restarts at 0 in every chunk).
  for (int64_t first = 0; first < batch; first += kMaxGridYZ) {
    const int64_t count = std::min(kMaxGridYZ, batch - first);
    const dim3 grid(attn::ceil_div(N, kTile), attn::ceil_div(M, kTile),
                    static_cast<unsigned>(count));
    const float* a_ptr = a.data_ptr<float>() + first * M * K;
    const float* b_ptr = b.data_ptr<float>() + first * K * N;  // [K, N] or [N, K]: same size
    float* c_ptr = c.data_ptr<float>() + first * M * N;
    if (layout == GemmLayout::kNN) {
      gemm_nn_kernel<<<grid, block, 0, stream>>>(a_ptr, b_ptr, c_ptr, static_cast<int>(M),
                                                 static_cast<int>(N), static_cast<int>(K));
      attn::check_launch("gemm_nn_kernel");
    } else {
      gemm_nt_kernel<<<grid, block, 0, stream>>>(a_ptr, b_ptr, c_ptr, static_cast<int>(M),
                                                 static_cast<int>(N), static_cast<int>(K));
      attn::check_launch("gemm_nt_kernel");
    }
  }
}

// In place on contiguous scores [batch, seq, seq].
void launch_scale_and_causal_mask(const torch::Tensor& scores, float scale, bool causal) {
  const int64_t total = scores.numel();
  const int64_t seq = scores.size(-1);
  const int64_t blocks = std::min<int64_t>(
      (total + kElementwiseThreads - 1) / kElementwiseThreads, kMaxElementwiseBlocks);
  scale_and_causal_mask_kernel<<<static_cast<unsigned>(blocks), kElementwiseThreads, 0,
                                 c10::cuda::getCurrentCUDAStream()>>>(
      scores.data_ptr<float>(), total, seq, scale, causal);
  attn::check_launch("scale_and_causal_mask_kernel");
}

// ---------------------------------------------------------------------------------------
// Input checks shared by the entry points
// ---------------------------------------------------------------------------------------

void check_float_cuda(const torch::Tensor& t, const char* name) {
  attn::check_cuda_tensor(t, name);
  attn::check_dtype(t, name, {torch::kFloat32});
}

void check_fits_int(int64_t size, const char* what) {
  TORCH_CHECK_VALUE(size <= std::numeric_limits<int32_t>::max(), attn::str(what, " = ", size,
                    " is too large for this kernel (at most 2^31 - 1)."));
}

// The caller's `out` after checking it can hold the result, or a new contiguous tensor.
torch::Tensor output_tensor(const std::optional<torch::Tensor>& out, torch::IntArrayRef shape,
                            const torch::Tensor& like, const char* like_name) {
  if (!out.has_value()) return torch::empty(shape, like.options());
  const torch::Tensor& o = *out;
  attn::check_cuda_tensor(o, "out");
  attn::check_same(like, like_name, o, "out");
  TORCH_CHECK_VALUE(o.sizes().equals(shape), attn::str("out has shape ", o.sizes(),
                    " but the result has shape ", shape, "; pass a tensor of that shape or None."));
  attn::check_contiguous(o, "out");
  return o;
}

torch::Tensor gemm(GemmLayout layout, const torch::Tensor& a, const torch::Tensor& b,
                   const std::optional<torch::Tensor>& out) {
  const bool nn = layout == GemmLayout::kNN;
  check_float_cuda(a, "a");
  check_float_cuda(b, "b");
  attn::check_same(a, "a", b, "b");
  TORCH_CHECK_VALUE(a.dim() == 2 || a.dim() == 3,
                    attn::str("a must have 3 dimensions [batch, M, K] (or 2: [M, K]) but has shape ",
                    a.sizes(), "."));
  TORCH_CHECK_VALUE(b.dim() == a.dim(), attn::str("b must have as many dimensions as a (", a.dim(),
                    ") but has shape ", b.sizes(), "."));
  const c10::cuda::CUDAGuard guard(a.device());

  const bool batched = a.dim() == 3;
  // The kernels index contiguous row-major matrices: a strided view (a transpose, a slice)
  // is copied into that layout first; a contiguous input is used as is.
  const torch::Tensor a3 = (batched ? a : a.unsqueeze(0)).contiguous();
  const torch::Tensor b3 = (batched ? b : b.unsqueeze(0)).contiguous();
  const int64_t batch = a3.size(0);
  const int64_t M = a3.size(1);
  const int64_t K = a3.size(2);
  const int64_t b_inner = nn ? b3.size(1) : b3.size(2);
  const int64_t N = nn ? b3.size(2) : b3.size(1);
  TORCH_CHECK_VALUE(b3.size(0) == batch, attn::str("a and b must have the same batch size, but a has ",
                    batch, " and b has ", b3.size(0), " (no broadcasting)."));
  TORCH_CHECK_VALUE(b_inner == K, attn::str("a is [.., M, K] with K = ", K, " but b has shape ", b.sizes(),
                    nn ? "; gemm_nn needs b = [.., K, N]." : "; gemm_nt needs b = [.., N, K]."));
  TORCH_CHECK_VALUE(a.numel() > 0 && b.numel() > 0, attn::str("a (shape ", a.sizes(), ") and b (shape ",
                    b.sizes(), ") must not be empty: M, N and K must be at least 1."));
  check_fits_int(M, "M");
  check_fits_int(N, "N");
  check_fits_int(K, "K");

  const std::vector<int64_t> c_shape =
      batched ? std::vector<int64_t>{batch, M, N} : std::vector<int64_t>{M, N};
  const torch::Tensor c = output_tensor(out, c_shape, a, "a");
  launch_gemm(layout, a3, b3, batched ? c : c.unsqueeze(0));
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Entry points (bound to Python in binding.cpp)
// ---------------------------------------------------------------------------------------

// softmax(x, dim): any rank >= 1, fp32. A non-last `dim` is moved last by a transpose (and
// a contiguous copy), normalised row by row, and transposed back into the result.
torch::Tensor softmax_cuda(torch::Tensor x, int64_t dim, std::optional<torch::Tensor> out) {
  check_float_cuda(x, "x");
  const int64_t rank = x.dim();
  TORCH_CHECK_VALUE(rank >= 1, attn::str("x must have at least one dimension (it is a 0-d scalar)."));
  TORCH_CHECK_VALUE(x.numel() > 0, attn::str("x is empty (shape ", x.sizes(),
                    "); softmax needs at least one element."));
  TORCH_CHECK_VALUE(dim >= -rank && dim < rank, attn::str("dim = ", dim, " is out of range for x of shape ",
                    x.sizes(), " (valid: ", -rank, " .. ", rank - 1, ")."));
  const int64_t d = dim < 0 ? dim + rank : dim;
  const c10::cuda::CUDAGuard guard(x.device());

  const torch::Tensor result = output_tensor(out, x.sizes(), x, "x");
  const bool last = d == rank - 1;
  const torch::Tensor rows_in = (last ? x : x.transpose(d, rank - 1)).contiguous();
  // With dim last the kernel writes straight into the result (contiguous, same shape);
  // otherwise into a buffer in the transposed layout, copied back below.
  const torch::Tensor rows_out = last ? result : torch::empty_like(rows_in);
  launch_softmax(rows_in, rows_out);
  if (!last) result.copy_(rows_out.transpose(d, rank - 1));
  return result;
}

// a [batch, M, K] @ b [batch, K, N] (or 2-D [M, K] @ [K, N]); any strides.
torch::Tensor gemm_nn_cuda(torch::Tensor a, torch::Tensor b, std::optional<torch::Tensor> out) {
  return gemm(GemmLayout::kNN, a, b, out);
}

// a [batch, M, K] @ b [batch, N, K]^T (or 2-D [M, K] @ [N, K]^T); any strides.
torch::Tensor gemm_nt_cuda(torch::Tensor a, torch::Tensor b, std::optional<torch::Tensor> out) {
  return gemm(GemmLayout::kNT, a, b, out);
}

// In place on contiguous fp32 scores [batch, S, S]: scores *= scale; if causal, the cells
// above the diagonal become -inf. Returns `scores`.
torch::Tensor scale_and_causal_mask_cuda(torch::Tensor scores, double scale, bool causal) {
  check_float_cuda(scores, "scores");
  attn::check_dim(scores, "scores", 3, "[batch, S, S]");
  TORCH_CHECK_VALUE(scores.size(1) == scores.size(2),
                    attn::str("scores must be square [batch, S, S] (self-attention) but has shape ",
                    scores.sizes(), "."));
  TORCH_CHECK_VALUE(scores.numel() > 0, attn::str("scores is empty (shape ", scores.sizes(), ")."));
  attn::check_contiguous(scores, "scores");  // it is modified in place: no copy can stand in
  const c10::cuda::CUDAGuard guard(scores.device());
  launch_scale_and_causal_mask(scores, static_cast<float>(scale), causal);
  return scores;
}

// The course entry: q, k, v [B, S, hidden] fp32 (projected; head h is hidden columns
// h*D .. h*D + D-1). Returns attention [B, S, hidden], heads merged the same way.
torch::Tensor custom_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               int64_t num_heads, bool causal, std::optional<torch::Tensor> out) {
  check_float_cuda(q, "q");
  check_float_cuda(k, "k");
  check_float_cuda(v, "v");
  attn::check_same(q, "q", k, "k");
  attn::check_same(q, "q", v, "v");
  attn::check_dim(q, "q", 3, "[B, S, hidden]");
  TORCH_CHECK_VALUE(k.sizes().equals(q.sizes()) && v.sizes().equals(q.sizes()),
                    attn::str("q, k and v must have the same shape [B, S, hidden] (self-attention), but "
                    "they are ", q.sizes(), ", ", k.sizes(), " and ", v.sizes(), "."));
  attn::check_nonempty(q, "q");
  TORCH_CHECK_VALUE(num_heads > 0 && q.size(2) % num_heads == 0, attn::str("num_heads = ", num_heads,
                    " must be positive and divide hidden = ", q.size(2), "."));
  const c10::cuda::CUDAGuard guard(q.device());

  const int64_t batch = q.size(0);
  const int64_t seq = q.size(1);
  const int64_t hidden = q.size(2);
  const int64_t head_dim = hidden / num_heads;
  check_fits_int(seq, "S");
  const torch::Tensor result = output_tensor(out, q.sizes(), q, "q");
  // BEGIN SOLUTION
  // HINT: Split the heads of q, k, v: [B, S, hidden] -> [B, S, H, D] -> [B, H, S, D] ->
  // HINT: [B*H, S, D], contiguous (reshape, permute, reshape, .contiguous()).
  // HINT: scores = torch::empty({B*H, S, S}, q.options()); launch_gemm(GemmLayout::kNT, ...);
  // HINT: launch_scale_and_causal_mask(scores, 1/sqrt(D), causal); launch_softmax(scores,
  // HINT: scores) (in place); launch_gemm(GemmLayout::kNN, scores, v_heads, heads_out);
  // HINT: then merge the heads back ([B*H, S, D] -> [B, S, hidden]) into `result` with copy_.
  const auto split_heads = [&](const torch::Tensor& t) {
    return t.reshape({batch, seq, num_heads, head_dim})
        .permute({0, 2, 1, 3})
        .reshape({batch * num_heads, seq, head_dim})
        .contiguous();
  };
  const torch::Tensor q_heads = split_heads(q);
  const torch::Tensor k_heads = split_heads(k);
  const torch::Tensor v_heads = split_heads(v);

  // The S x S score matrix of every head: the memory task 4 never allocates.
  const torch::Tensor scores = torch::empty({batch * num_heads, seq, seq}, q.options());
  launch_gemm(GemmLayout::kNT, q_heads, k_heads, scores);  // Q K^T, K read as stored
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  launch_scale_and_causal_mask(scores, scale, causal);
  launch_softmax(scores, scores);  // in place: scores become probabilities
  const torch::Tensor heads_out = torch::empty({batch * num_heads, seq, head_dim}, q.options());
  launch_gemm(GemmLayout::kNN, scores, v_heads, heads_out);  // P V

  // Merge the heads: [B*H, S, D] -> [B, H, S, D] -> [B, S, H, D], copied into the
  // contiguous result viewed as [B, S, H, D] (that is [B, S, hidden]).
  result.view({batch, seq, num_heads, head_dim})
      .copy_(heads_out.view({batch, num_heads, seq, head_dim}).permute({0, 2, 1, 3}));
  // END SOLUTION
  return result;
}
