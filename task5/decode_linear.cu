// Decode-time linear layers: y = x @ W^T (+ bias) (+ residual) for a few rows of x.
//
// Not part of the graded course: the task 6 and task 7 models use it in their decode steps.
//
// The idea. A decode step multiplies a handful of token vectors (batch 4: M = 4 rows) by every
// weight matrix of the model. Each weight element is used M times per load, so the step is
// bound by reading the weights once, and the whole game is to stream W at the memory
// bandwidth. cuBLAS does not, at M = 4: in task 6's profile its fp32 kernel (gemmSN_TN) and
// its bf16 kernels streamed the weights well below the copy bandwidth (the figures, measured
// beside this kernel's, are in Results.md). This kernel:
//   * gives each warp kRowsPerWarp rows of W (output features); its 32 lanes walk along K
//     with 16-byte loads (4 fp32 or 8 fp16/bf16), a warp reading 512 contiguous bytes of a
//     row per step, 4 steps unrolled so that many loads are in flight; W is read once, with
//     loads that do not allocate in L1 (.nc, L1::no_allocate);
//   * reads the matching 16 bytes of each of the M rows of x with ordinary loads: x is tiny
//     and every warp reads all of it, so it stays in L1 while W streams past;
//   * accumulates in fp32, reduces each (row, m) over the warp with shuffles, and adds the
//     bias and the residual in the epilogue (one kernel instead of a GEMM and two adds).
//   * decode_swiglu, the same kernel with kGated: the MLP's gate and up products in one pass
//     over their stacked weights, silu(gate) * up in the epilogue (SwiGLU's [M, 2 * width]
//     intermediate is never written, and two elementwise kernels are gone).
// No shared memory and no barrier: a first version staged x in shared memory chunk by chunk,
// and its barriers stalled the weight stream (below cuBLAS in bf16 on the H100; the log of
// that run is results/logs/h100_decode_linear_v1.log).
// Tile shape: 4 warps x 4 rows = 16 output features per block. That alone leaves too few
// loads in flight where N is small: N = 4096 (o_proj, and the down projection with K = 16384)
// gives 256 blocks, 8 warps per SM, each warp latency-bound on a long walk along K. So the
// block's warps may also split K (k_splits = 2 or 4: k_splits warps share their rows, each
// taking every k_splits-th 512-byte step along K, and add their sums in shared memory): the
// same bytes, k_splits times the blocks. The host picks the largest split that leaves each
// warp two rounds of kUnroll steps (bf16 at K = 4096: 2; fp32 at 4096 and both at 16384: 4),
// within 5% of the best split at every product of task 6's decode step in a sweep of
// k_splits 1, 2, 4 (Results.md, "Decode-step products"; task6/NOTES.md), and well ahead of
// no split where N is small: o_proj, and the down projection with its long K.
// Tried and left out: loading the first kUnroll steps of weights before waiting for the
// kernel before (they do not depend on it), to keep the memory busy through its tail: task
// 6's bf16 TBT did not improve beyond run-to-run noise (task6/NOTES.md).
// Launched overlapped (device_values.cuh): on Hopper the next kernel is launched once every
// warp here has streamed its weights, so its blocks are resident when this one's tail ends.
// (Prefetching the next kernel's first weights into L2 before its wait was tried: ptxas then
// scheduled the bf16 main loop with fewer loads in flight, and the step got slower. A bulk
// prefetch of each row's first round, which holds no registers, gained nothing either;
// task6/NOTES.md.)
//
// Measured speed (GB/s of weights read, against cuBLAS; task 6's TBT against its roofline):
// Results.md, rendered from results/<gpu>.json.

#include "decode_linear.cuh"

namespace {

using decode_product::check_product;
using decode_product::FoldedNorm;
using decode_product::run_product;

// The two entries' shared checks and launch: `gated` halves the output features.
torch::Tensor run(const torch::Tensor& x, const torch::Tensor& weight,
                  const std::optional<torch::Tensor>& bias,
                  const std::optional<torch::Tensor>& residual, int64_t k_splits, bool gated) {
  const auto shape = check_product(gated ? "decode_swiglu" : "decode_linear", x, weight, bias,
                                   residual, k_splits, gated);
  const auto no_norm = [](auto zero) { return FoldedNorm<decltype(zero)>{}; };
  return gated ? run_product<true, false>(x, weight, bias, residual, shape, no_norm)
               : run_product<false, false>(x, weight, bias, residual, shape, no_norm);
}

}  // namespace

// x [..., K] with at most 8 rows in all (contiguous); weight [N, K] (contiguous); bias [N];
// residual [..., N] like the output; k_splits: 1, 2 or 4 warps per row along K, 0 to choose.
// Returns [..., N] in x's dtype.
torch::Tensor decode_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> residual, int64_t k_splits) {
  return run(x, weight, bias, residual, k_splits, /*gated=*/false);
}

// SwiGLU's first half in one pass: weight [2 * width, K] holds the gate rows then the up rows
// (bias [2 * width] likewise); returns silu(x Wg^T + bg) * (x Wu^T + bu) (+ residual), [..., width].
torch::Tensor decode_swiglu(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> residual, int64_t k_splits) {
  return run(x, weight, bias, residual, k_splits, /*gated=*/true);
}
