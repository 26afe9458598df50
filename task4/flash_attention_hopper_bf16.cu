// Instantiations of the Hopper FlashAttention kernel for bf16, every version and head dim (see
// flash_attention_hopper.cu for the idea and flash_attention_hopper.cuh for the kernel). One file
// per element type so the build compiles them in parallel.
// compile_check: arch sm_90a

#include "flash_attention_hopper.cuh"

namespace hopper_attn {

HOPPER_ATTN_DISPATCH(, __nv_bfloat16, 64)
HOPPER_ATTN_DISPATCH(, __nv_bfloat16, 128)

}  // namespace hopper_attn
