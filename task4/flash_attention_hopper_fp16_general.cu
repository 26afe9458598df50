// Task 4+: the Hopper kernel's general (variant) instantiations for fp16 (the kernel and its
// lesson: flash_attention_hopper.cuh; the host entry that launches them:
// flash_attention_hopper.cu; the dense instantiations: flash_attention_hopper_fp16.cu).
// compile_check: arch sm_90a
//
// A file of their own so that the build compiles them beside the dense ones: each
// dispatch_general below instantiates every general kernel it can pick for its head dim.

#include "flash_attention_hopper.cuh"

namespace hopper_attn {

template Launcher dispatch_general<__half, 64>(const Params& p, int64_t version);
template Launcher dispatch_general<__half, 128>(const Params& p, int64_t version);
template Launcher dispatch_general<__half, 256>(const Params& p, int64_t version);

}  // namespace hopper_attn
