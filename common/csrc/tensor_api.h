// The part of torch's C++ API our extensions use, from its lightest headers: at::Tensor with
// its methods, the three factories we call (empty, empty_like, zeros), TORCH_CHECK, and (in
// .cu files) c10's CUDA stream and device guard. `torch::` names (torch::Tensor, torch::kFloat,
// torch::empty) resolve to the same `at::` ones, as they do under <torch/types.h>.
//
// Why not <torch/types.h>: every file of an extension parses torch's headers three times
// (cudafe++, cicc, the host compiler), and a cold build is bound by that CPU work: these
// headers take about half of <torch/types.h>'s share of a kernel file's compile time
// (results/logs/cpu_nvcc_tensor_api_header.txt, before and after, file by file). The bindings
// add pybind11's casters for tensors (binding_api.h), not the whole of <torch/extension.h>.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#ifdef __CUDACC__  // kernel files; the bindings (g++) need no CUDA header
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

// What <torch/types.h> adds to at:: and we use: the namespace and the sized dtype names. (A file
// that includes both headers gets a redefinition error: include this one alone.)
namespace torch {
using namespace at;  // torch::Tensor, torch::kHalf, torch::empty
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kInt32 = at::kInt;
constexpr auto kFloat64 = at::kDouble;
constexpr auto kUInt8 = at::kByte;
}  // namespace torch
