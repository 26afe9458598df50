// cp.async tile copies global -> shared for the fp32 attention kernels of task 4: the forward
// (flash_attention.cu) and the backward (flash_backward.cu) stage their tiles the same way
// (row-major [rows][head_dim padded], 16-byte copies, zero fill past the sequence end and
// past head_dim), so the copies live here once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace attn_fp32 {

// Copies 16 bytes, or writes 16 zero bytes when !valid (src-size 0 reads nothing). Zeros are
// what the padding needs: zero head_dim columns leave dot products unchanged, and zero V rows
// past the sequence end keep 0 * V finite.
__device__ __forceinline__ void copy16_async(float* smem_dst, const float* gmem_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
#else
  *reinterpret_cast<float4*>(smem_dst) =
      valid ? *reinterpret_cast<const float4*>(gmem_src) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}

__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until every copy this thread issued has landed. Other threads' copies are visible
// only after the __syncthreads() that must follow.
__device__ __forceinline__ void copy_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// Copy rows [first_row, first_row + ROWS) of one head ([seq, head_dim], row stride
// src_row_stride) into a shared tile [ROWS][dst_stride], HEAD_DIM_PAD columns, 16 bytes per
// copy, consecutive threads on consecutive 16-byte chunks of a row (coalesced). Rows >= seq
// and columns >= head_dim are zero-filled; the source pointer of a skipped copy is the head's
// first element, which always exists.
template <int ROWS, int HEAD_DIM_PAD, int THREADS>
__device__ __forceinline__ void load_tile_async(float* dst, int dst_stride, const float* head,
                                                int64_t src_row_stride, int first_row, int seq,
                                                int head_dim, int tid) {
  constexpr int chunks_per_row = HEAD_DIM_PAD / 4;
  constexpr int chunks = ROWS * chunks_per_row;
  static_assert(chunks % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int step = 0; step < chunks / THREADS; ++step) {
    const int c = tid + step * THREADS;
    const int r = c / chunks_per_row;
    const int col = (c % chunks_per_row) * 4;
    const int row = first_row + r;
    // head_dim is a multiple of 8, so a 4-float chunk is entirely inside or entirely padding.
    const bool valid = row < seq && col < head_dim;
    const float* src = valid ? head + static_cast<int64_t>(row) * src_row_stride + col : head;
    copy16_async(dst + r * dst_stride + col, src, valid);
  }
}

__device__ __forceinline__ float component(const float4& f, int i) {
  return i == 0 ? f.x : i == 1 ? f.y : i == 2 ? f.z : f.w;  // i is a constant once unrolled
}

}  // namespace attn_fp32
