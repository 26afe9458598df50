// What an extension's binding.cpp needs: tensor_api.h and pybind11 with torch's casters
// (at::Tensor, std::optional, c10::ScalarType to and from Python), for PYBIND11_MODULE and
// TORCH_EXTENSION_NAME. <torch/extension.h> gives the same plus the whole C++ frontend
// (torch::nn, optimizers, data loaders), which more than doubled a binding's compile time
// (results/logs/cpu_nvcc_tensor_api_header.txt).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include "tensor_api.h"
