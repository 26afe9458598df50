// Decode-time linear layers with the norm before them folded in: the kernel's instantiations
// for fp16 (the kernel and its idea: decode_linear_norm.cuh; the host side: decode_linear.cu).
// One file per element type, compiled side by side, as decode_linear_<type>.cu.

#include "decode_linear_norm.cuh"

namespace attn_linear {

template LinearNormKernel<__half> linear_norm_kernel<__half, false>(int rows, int k_splits);
template LinearNormKernel<__half> linear_norm_kernel<__half, true>(int rows, int k_splits);

}  // namespace attn_linear
