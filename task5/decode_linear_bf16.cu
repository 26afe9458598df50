// Instantiations of the decode-time linear layers' kernels for bf16 (see decode_linear.cu for
// the idea and decode_linear.cuh for the kernel). One file per element type so the build
// compiles them in parallel.

#include "decode_linear.cuh"

namespace attn_linear {

void launch_bf16(const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& bias,
                 const std::optional<torch::Tensor>& residual, const torch::Tensor& out, int rows,
                 int N, int K, int k_splits, bool gated, cudaStream_t stream) {
  launch_type<__nv_bfloat16>(x, w, bias, residual, out, rows, N, K, k_splits, gated, stream);
}

}  // namespace attn_linear
