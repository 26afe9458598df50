// Grouped-query decode on CUDA cores: the kernel's instantiations for fp16 (the kernel and its
// idea: decode_grouped.cuh; the host side that launches them: decode_grouped.cu).
//
// One file per element type, so that the build compiles them in parallel: the 33
// instantiations in one file were among the longest compiles of the task 5 extension. Each
// grouped_kernel below instantiates the 32-lane kernel and, at head dims up to 128, the 16-lane one.

#include "decode_grouped.cuh"

namespace attn_grouped {

template GroupedKernel<__half> grouped_kernel<__half, 1, 3, MAX_ROW_NARROW>(int head_dim);
template GroupedKernel<__half> grouped_kernel<__half, 2, 3, MAX_ROW_NARROW>(int head_dim);
template GroupedKernel<__half> grouped_kernel<__half, 4, 2, MAX_ROW_NARROW>(int head_dim);
template GroupedKernel<__half> grouped_kernel<__half, 8, 2, MAX_ROW_NARROW>(int head_dim);
template GroupedKernel<__half> grouped_kernel<__half, 1, 2, GROUPED_WIDE_ROW>(int head_dim);
template GroupedKernel<__half> grouped_kernel<__half, 2, 2, GROUPED_WIDE_ROW>(int head_dim);
template GroupedKernel<__half> grouped_kernel<__half, 4, 2, GROUPED_WIDE_ROW>(int head_dim);

}  // namespace attn_grouped
