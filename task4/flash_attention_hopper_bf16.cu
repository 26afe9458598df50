// Task 4+: the Hopper kernel's instantiations for bf16 (the kernel and its lesson:
// flash_attention_hopper.cuh; the host entry that launches them: flash_attention_hopper.cu).
// compile_check: arch sm_90a
//
// Two files per element type, so that the build compiles them in parallel: the instantiations in
// one file were the longest single compile of the repository. Each dispatch_version below
// instantiates every dense kernel it can pick for its head dim (head_dim 96 runs on 128's);
// flash_attention_hopper_bf16_general.cu holds the general (variant) ones, and the _fp16 files
// do the same for fp16.

#include "flash_attention_hopper.cuh"

namespace hopper_attn {

template Launcher dispatch_version<__nv_bfloat16, 64>(int64_t version);
template Launcher dispatch_version<__nv_bfloat16, 128>(int64_t version);
template Launcher dispatch_version<__nv_bfloat16, 256>(int64_t version);
template Launcher dispatch_d256_tile80<__nv_bfloat16>(int schedule);

}  // namespace hopper_attn
