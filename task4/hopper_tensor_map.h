// Task 4+ (beyond the course): the TMA tensor maps of the Hopper kernels' host entries (the
// forward's flash_attention_hopper.cu and the backward's flash_backward_hopper.cu): a
// [B, H, S, D] tensor of 16-bit elements as a 4-D map with 64-column boxes and the 128-byte
// swizzle that the kernels' shared-memory layout and wgmma descriptors read
// (flash_attention_hopper.cuh, "Shared memory in 128-byte swizzled rows").

#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes from the runtime)
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor_api.h"
#include "attention_checks.cuh"

namespace hopper_attn {

// cuTensorMapEncodeTiled, fetched from the driver through the runtime: no -lcuda at link time.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn tensor_map_encoder() {
  static const EncodeTiledFn fn = []() -> EncodeTiledFn {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                             cudaEnableDefault, &status);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &status);
#endif
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

// The tensor map of t [B, H, S, D] as a 4D tensor with dims listed innermost first
// (D, S, H, B), strides in bytes, boxes of 64 columns x box_rows rows, 128-byte swizzle,
// zeros outside the tensor (OOB_FILL_NONE fills zeros; the NaN request is the other mode).
inline CUtensorMap make_tensor_map(const torch::Tensor& t, int box_rows) {
  EncodeTiledFn encode = tensor_map_encoder();
  TORCH_CHECK(encode != nullptr, "the Hopper kernels: cuTensorMapEncodeTiled is not available "
              "from this CUDA driver (it needs CUDA 12 or newer).");
  CUtensorMap map;
  const int64_t elem = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.size(3)), static_cast<cuuint64_t>(t.size(2)),
                              static_cast<cuuint64_t>(t.size(1)), static_cast<cuuint64_t>(t.size(0))};
  // A dimension of size 1 is never stepped over: give it a legal stride whatever torch says.
  auto stride_bytes = [&](int dim) -> cuuint64_t {
    return static_cast<cuuint64_t>(t.size(dim) == 1 ? t.size(3) * elem : t.stride(dim) * elem);
  };
  const cuuint64_t strides[3] = {stride_bytes(2), stride_bytes(1), stride_bytes(0)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = encode(
      &map, t.scalar_type() == torch::kHalf ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      4, t.data_ptr(), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(result == CUDA_SUCCESS, attn::str("the Hopper kernels: cuTensorMapEncodeTiled failed (CUresult ",
              static_cast<int>(result), ") for a tensor of shape ", t.sizes(), " and strides ", t.strides(), "."));
  return map;
}

}  // namespace hopper_attn
