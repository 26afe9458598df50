// Task 4+: the Hopper kernel's instantiations for bf16 (the kernel and its lesson:
// flash_attention_hopper.cuh; the host entry that launches them: flash_attention_hopper.cu).
// compile_check: arch sm_90a
//
// One file per element type, so that the build compiles them in parallel: the 46
// instantiations in one file were the longest single compile of the repository. Each
// dispatch_version / dispatch_general below instantiates every kernel it can pick for its head
// dim (head_dim 96 runs on 128's); flash_attention_hopper_fp16.cu does the same for fp16.

#include "flash_attention_hopper.cuh"

namespace hopper_attn {

template Launcher dispatch_version<__nv_bfloat16, 64>(int64_t version);
template Launcher dispatch_general<__nv_bfloat16, 64>(const Params& p, int64_t version);
template Launcher dispatch_version<__nv_bfloat16, 128>(int64_t version);
template Launcher dispatch_general<__nv_bfloat16, 128>(const Params& p, int64_t version);
template Launcher dispatch_version<__nv_bfloat16, 256>(int64_t version);
template Launcher dispatch_general<__nv_bfloat16, 256>(const Params& p, int64_t version);
template Launcher dispatch_d256_tile80<__nv_bfloat16>(int schedule);

}  // namespace hopper_attn
