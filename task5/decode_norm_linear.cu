// A decode step's LayerNorm / RMSNorm folded into the product that reads it:
// y = norm(h) @ W^T (+ bias) (+ residual), or SwiGLU's silu(gate) * up of norm(h), in one pass
// that streams W (decode_linear.cuh, the kNorm kernel).
//
// Not part of the graded course: task 6's model calls it in its decode steps (task5/fused.py,
// norm_linear; its PyTorch twin, a norm and then the product, is the reference).
//
// The idea. In task 6's decode step every norm sits between two products and costs a kernel:
// 4 rows of h, a few kilobytes, so all it costs is latency, and skipping the 49 norm kernels
// of a bf16 step saved 8.6 us a layer (task6/NOTES.md). Normalising h at the start of the
// next product was measured slower: every block must have the row statistics before its first
// weight load. But the statistics are not needed before the end. For LayerNorm
//   norm(h)[m, k] = gamma[k] * (h[m, k] - mean_m) * rstd_m + beta[k], so
//   y[m, n] = rstd_m * (sum_k W[n, k] gamma[k] h[m, k] - mean_m * colsum[n]) + shift[n],
// colsum = W gamma and shift = W beta + bias: per-layer constants, computed once on the host.
// The kernel streams W against gamma * h exactly as decode_linear streams it against x, and
// the first row group's warps, which read all of h anyway, also sum each row (about its first
// element, so a large mean cannot cancel the variance). The epilogue applies mean and rstd.
// RMSNorm (Llama, Mistral, Qwen) has no mean: y = rstd_m * sum_k W[n, k] gamma[k] h[m, k] + bias.
// Tile shape, k_splits and the launch: as decode_linear (decode_linear.cu's header).
// The result differs from norm-then-product by rounding only: the normalised h is not rounded
// to the dtype in between (fp32 throughout, as the product accumulates).
//
// Measured (task 6's TBT with and without the fold): Results.md and task6/NOTES.md.

#include <cmath>

#include "decode_linear.cuh"

namespace {

using decode_product::check_product;
using decode_product::FoldedNorm;
using decode_product::run_product;

// colsum / shift: fp32, one value per row of weight, on x's device.
void check_folded(const std::optional<torch::Tensor>& t, const char* name, const torch::Tensor& x,
                  int64_t weight_rows) {
  if (!t.has_value()) return;
  attn::check_cuda_tensor(*t, name);
  TORCH_CHECK_VALUE(t->device() == x.device(), attn::str(name, " is on ", t->device(), " but x is on ",
                    x.device(), "; put them on the same GPU."));
  TORCH_CHECK_TYPE(t->scalar_type() == torch::kFloat32,
                   attn::str(name, " must be float32 (it is ", t->scalar_type(),
                             "): task5.fused.fold_norm computes it."));
  attn::check_contiguous(*t, name);
  TORCH_CHECK_VALUE(t->numel() == weight_rows, attn::str(name, " has ", t->numel(),
                    " elements; expected ", weight_rows, " (one per row of weight)."));
}

}  // namespace

// x [..., K] (the norm's input h, at most 8 rows, contiguous); gamma [K] (x's dtype); colsum
// [weight rows] fp32 = weight @ gamma (LayerNorm; None for RMSNorm); shift [weight rows] fp32 =
// weight @ beta + bias, or None; weight [N, K] ([2 * width, K] gate then up rows if gated);
// residual [..., N] like the output. Returns [..., N] (or [..., width]) in x's dtype.
torch::Tensor decode_norm_linear(torch::Tensor x, torch::Tensor gamma,
                                 std::optional<torch::Tensor> colsum,
                                 std::optional<torch::Tensor> shift, double eps, bool rms,
                                 torch::Tensor weight, std::optional<torch::Tensor> residual,
                                 int64_t k_splits, bool gated) {
  const char* entry = gated ? "decode_norm_swiglu" : "decode_norm_linear";
  const auto shape = check_product(entry, x, weight, std::nullopt, residual, k_splits, gated);
  attn::check_same(gamma, "gamma (the norm's weight)", x, "x");
  attn::check_contiguous(gamma, "gamma");
  TORCH_CHECK_VALUE(gamma.numel() == shape.K && attn::aligned16(gamma),
                    attn::str("gamma (the norm's weight) has ", gamma.numel(), " elements; expected ",
                              shape.K, " (x's last dimension), 16-byte aligned."));
  TORCH_CHECK_VALUE(rms || colsum.has_value(),
                    attn::str(entry, ": a LayerNorm needs colsum = weight @ gamma "
                              "(task5.fused.fold_norm); only RMSNorm (rms=True) goes without."));
  TORCH_CHECK_VALUE(!(rms && colsum.has_value()),
                    attn::str(entry, ": RMSNorm subtracts no mean, so it takes no colsum."));
  TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps),
                    attn::str(entry, ": eps must be a finite number >= 0; got ", eps, "."));
  check_folded(colsum, "colsum", x, weight.size(0));
  check_folded(shift, "shift", x, weight.size(0));
  const auto make_norm = [&](auto zero) {
    using T = decltype(zero);
    FoldedNorm<T> norm;
    norm.gamma = reinterpret_cast<const T*>(gamma.data_ptr());
    norm.colsum = colsum.has_value() ? colsum->data_ptr<float>() : nullptr;
    norm.shift = shift.has_value() ? shift->data_ptr<float>() : nullptr;
    norm.eps = static_cast<float>(eps);
    norm.rms = rms;
    return norm;
  };
  return gated ? run_product<true, true>(x, weight, std::nullopt, residual, shape, make_norm)
               : run_product<false, true>(x, weight, std::nullopt, residual, shape, make_norm);
}
