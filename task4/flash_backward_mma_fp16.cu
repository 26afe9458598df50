// Instantiations of the tensor-core FlashAttention-2 backward for fp16 (see
// flash_backward_mma.cu for the idea and flash_backward_mma.cuh for the kernels). One file per
// element type so the build compiles them in parallel.
//
// Measured: Results.md (rendered from results/<gpu>.json).

#include "flash_backward_mma.cuh"

namespace mma_bwd {

const char* backward_fp16_d64(const BwdParams& p, bool deterministic, cudaStream_t stream) {
  return run_backward<__half, BwdKVD64, BwdKVD64, BwdQD64, BwdFusedD64>(p, deterministic, stream);
}

const char* backward_fp16_d128(const BwdParams& p, bool deterministic, cudaStream_t stream) {
  return run_backward<__half, BwdKVD128, BwdKVD128G, BwdQD128, BwdFusedD128>(
      p, deterministic, stream);
}

void preprocess_fp16(const BwdParams& p, int64_t blocks, cudaStream_t stream) {
  launch_preprocess<__half>(p, blocks, stream);
}

}  // namespace mma_bwd
