// Decode-time linear layers: the kernel's instantiations for bf16 (the kernel and its idea:
// decode_linear.cuh; the host side that launches them: decode_linear.cu).
//
// One file per element type, so that the build compiles them in parallel: the 144
// instantiations in one file were among the longest compiles of the task 5 extension. Each
// linear_kernel below instantiates decode_linear_kernel for M = 1..8 rows and k_splits 1, 2, 4.

#include "decode_linear.cuh"

namespace attn_linear {

template LinearKernel<__nv_bfloat16> linear_kernel<__nv_bfloat16, false>(int rows, int k_splits);
template LinearKernel<__nv_bfloat16> linear_kernel<__nv_bfloat16, true>(int rows, int k_splits);

}  // namespace attn_linear
