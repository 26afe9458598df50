// Grouped-query decode on tensor cores: the kernel's instantiations for fp16 (the kernel and
// its idea: decode_gqa.cuh; the host side that launches them: decode_gqa.cu).
//
// One file per element type, so that the build compiles them in parallel: the 20
// instantiations in one file were among the longest compiles of the task 5 extension. Five
// configurations (head dims 64, 96, 128 with 8 or 4 warps, 256), each for the contiguous cache
// (ContiguousKv) and the paged one (PagedKv, decode_paged.cuh); the persistent grid's (GqaWalk)
// and the mask vote's (GqaMaskVote, contiguous cache) beside them.

#include "decode_gqa.cuh"

namespace attn_gqa {

template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD64, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD96, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD128, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD128Compact, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaD256, ContiguousKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaD64, PagedKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaD96, PagedKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaD128, PagedKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaD128Compact, PagedKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaD256, PagedKv>();
// The persistent grid's kernels (GqaWalk: head dims up to 128).
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaD64>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaD96>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaD128>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaD128Compact>, ContiguousKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaWalk<GqaD64>, PagedKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaWalk<GqaD96>, PagedKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaWalk<GqaD128>, PagedKv>();
template GqaKernel<PagedKv> gqa_kernel<__half, GqaWalk<GqaD128Compact>, PagedKv>();

// The mask-vote kernels (GqaMaskVote): contiguous cache, head dims up to 128 (kCanVote).
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaMaskVote<GqaD64>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaMaskVote<GqaD96>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaMaskVote<GqaD128>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaMaskVote<GqaD128Compact>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaMaskVote<GqaD64>>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaMaskVote<GqaD96>>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaMaskVote<GqaD128>>, ContiguousKv>();
template GqaKernel<ContiguousKv> gqa_kernel<__half, GqaWalk<GqaMaskVote<GqaD128Compact>>, ContiguousKv>();

}  // namespace attn_gqa
