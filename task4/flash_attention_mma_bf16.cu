// Instantiations of the tensor-core FlashAttention-2 kernel for bf16 (see flash_attention_mma.cu
// for the idea and flash_attention_mma.cuh for the kernel). One file per element type so the
// build compiles them in parallel.
//
// Measured: Results.md (rendered from results/<gpu>.json).

#include "flash_attention_mma.cuh"

namespace mma_attn {

const char* run_bf16_d32(const Params& p, int, cudaStream_t stream) {
  return run_config<__nv_bfloat16, ConfigD32_G, ConfigD32_0>(p, 0, stream);
}

const char* run_bf16_d64(const Params& p, int config, cudaStream_t stream) {
  return run_config<__nv_bfloat16, ConfigD64_G, ConfigD64_0, ConfigD64_1, ConfigD64_2,
                    ConfigD64_Rows16>(p, config, stream);
}

const char* run_bf16_d96(const Params& p, int, cudaStream_t stream) {
  return run_config<__nv_bfloat16, ConfigD96_G, ConfigD96_0>(p, 0, stream);
}

const char* run_bf16_d128(const Params& p, int config, cudaStream_t stream) {
  return run_config<__nv_bfloat16, ConfigD128_G, ConfigD128_0, ConfigD128_1, ConfigD128_2,
                    ConfigD128_Rows16>(p, config, stream);
}

// Above 128: one configuration per head dim (its registers allow no other).
const char* run_bf16_d192(const Params& p, int, cudaStream_t stream) {
  return run_config<__nv_bfloat16, ConfigD192_G, ConfigD192_0>(p, 0, stream);
}

const char* run_bf16_d256(const Params& p, int, cudaStream_t stream) {
  return run_config<__nv_bfloat16, ConfigD256_G, ConfigD256_0>(p, 0, stream);
}

}  // namespace mma_attn
