// Instantiations of the tensor-core backward with FlashAttention-2's 2-D warp layout for fp16
// (flash_backward_mma_2d.cuh: the idea and the kernel; flash_backward_mma.cu chooses it when
// ATTN_BWD_LAYOUT=2d). Its own file so that the build compiles it beside the others.
//
// Measured: Results.md / task4/NOTES.md.

#include "flash_backward_mma_2d.cuh"

namespace mma_bwd {

const char* backward_2d_fp16_d64(const BwdParams& p, cudaStream_t stream) {
  return run_backward_2d<__half, Bwd2dD64, Bwd2dD64General>(p, stream);
}

const char* backward_2d_fp16_d128(const BwdParams& p, cudaStream_t stream) {
  return run_backward_2d<__half, Bwd2dD128, Bwd2dD128>(p, stream);
}

}  // namespace mma_bwd
