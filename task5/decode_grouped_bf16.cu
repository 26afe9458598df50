// Instantiations of the grouped-query decode kernel for bf16 (see decode_grouped.cu for the
// idea and decode_grouped.cuh for the kernel). One file per element type so the build
// compiles them in parallel.

#include "decode_grouped.cuh"

namespace attn_decode {

void launch_decode_grouped(const GroupedDecodeParams<__nv_bfloat16>& p, int tile, dim3 grid,
                           cudaStream_t stream) {
  launch_grouped_tiles<__nv_bfloat16>(p, tile, grid, stream);
}

}  // namespace attn_decode
