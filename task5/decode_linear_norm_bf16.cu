// Decode-time linear layers with the norm before them folded in: the kernel's instantiations
// for bf16 (the kernel and its idea: decode_linear_norm.cuh; the host side: decode_linear.cu).
// One file per element type, compiled side by side, as decode_linear_<type>.cu.

#include "decode_linear_norm.cuh"

namespace attn_linear {

template LinearNormKernel<__nv_bfloat16> linear_norm_kernel<__nv_bfloat16, false>(int rows, int k_splits);
template LinearNormKernel<__nv_bfloat16> linear_norm_kernel<__nv_bfloat16, true>(int rows, int k_splits);

}  // namespace attn_linear
