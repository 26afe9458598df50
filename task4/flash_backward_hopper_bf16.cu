// Instantiations of the wgmma backward for Hopper (sm_90a) for bf16: the kernel and its idea are
// flash_backward_hopper_kernel.cuh, the host entry flash_backward_hopper.cu. One file per
// element type, so that the build compiles them beside the forward's instantiation files.
// compile_check: arch sm_90a

#include "flash_backward_hopper_kernel.cuh"

namespace hopper_bwd {

template const char* launch_backward_hopper<__nv_bfloat16, 64>(const mma_bwd::BwdParams&, const BwdHopperParams&,
                                                     const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,
                                                     const CUtensorMap&, cudaStream_t);
template const char* launch_backward_hopper<__nv_bfloat16, 128>(const mma_bwd::BwdParams&, const BwdHopperParams&,
                                                      const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,
                                                      const CUtensorMap&, cudaStream_t);

}  // namespace hopper_bwd
