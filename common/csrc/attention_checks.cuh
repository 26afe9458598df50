// Input validation and launch checking shared by every extension (tasks 2, 4 and 5).
//
// Each check raises a Python exception with a sentence a student can act on:
// TORCH_CHECK_VALUE -> ValueError, TORCH_CHECK_TYPE -> TypeError, TORCH_CHECK -> RuntimeError.
// Only light headers are included (tensor_api.h, no torch/extension.h): kernel files compile
// in seconds, and the CPU-only CI can compile them with the CPU build of torch.
#pragma once

#include <cuda_runtime.h>
#include "tensor_api.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

namespace attn {

// Error messages are assembled by attn::str, never by streaming numbers into std::ostream:
// on our H100 image (torch 2.11+cu130, Python 3.12) an integer or a shape streamed by
// c10::str inside an extension crashed the process (segfault) while the exception was being
// built; strings and devices streamed fine. Every TORCH_CHECK_* message in this repository
// is therefore a single attn::str(...) string: it formats integers with std::to_string and
// shapes by hand, which works everywhere.
namespace detail {
inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, char v) { s += v; }
inline void append(std::string& s, bool v) { s += v ? "true" : "false"; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline void append(std::string& s, T v) {
  s += std::to_string(v);
}
inline void append(std::string& s, double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  s += buffer;
}
inline void append(std::string& s, c10::IntArrayRef shape) {
  s += '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += ']';
}
inline void append(std::string& s, const c10::Device& device) { s += device.str(); }
inline void append(std::string& s, c10::ScalarType dtype) { s += c10::toString(dtype); }
}  // namespace detail

// Concatenate strings, integers, floats, shapes (t.sizes()), devices and dtypes.
template <typename... Args>
std::string str(const Args&... args) {
  std::string s;
  (detail::append(s, args), ...);
  return s;
}

// A measurement switch: the environment variable `name` names one of `values`, read on every
// call (a getenv is cheap) so that one process can time the choices side by side. Returns the
// index of its value; unset or empty, `default_index`; anything else raises a sentence that lists
// the choices.
inline int env_choice(const char* name, std::initializer_list<const char*> values, int default_index) {
  const char* env = std::getenv(name);
  if (env == nullptr || env[0] == '\0') return default_index;
  int index = 0;
  for (const char* value : values) {
    if (std::strcmp(env, value) == 0) return index;
    ++index;
  }
  std::string names;
  index = 0;
  for (const char* value : values) {
    if (index > 0) names += index + 1 == static_cast<int>(values.size()) ? " or " : ", ";
    names += attn::str("\"", value, "\"");
    ++index;
  }
  TORCH_CHECK_VALUE(false, attn::str(name, " must be ", names, " (or unset) but is \"", env, "\"."));
  return default_index;
}

// An integer measurement switch: the environment variable `name`, read on every call (a getenv
// is cheap) so that one process can time several values side by side. Unset or empty:
// `default_value`; not a whole number in [min_value, max_value] raises a sentence naming the
// variable, its range and `meaning` (what the number counts or selects).
inline int env_int(const char* name, int default_value, int min_value, int max_value, const char* meaning) {
  const char* env = std::getenv(name);
  if (env == nullptr || env[0] == '\0') return default_value;
  char* end = nullptr;
  const long value = std::strtol(env, &end, 10);
  TORCH_CHECK_VALUE(*end == '\0' && value >= min_value && value <= max_value,
                    attn::str(name, "=", env, " is not ", meaning, ": use a whole number from ", min_value,
                              " to ", max_value, ", or unset it for the default (", default_value, ")."));
  return static_cast<int>(value);
}

// t [B, H, S, D] of 16-bit elements itself where its rows can be read in 16-byte pieces (a
// contiguous last dimension, the other strides multiples of 8 elements, a 16-byte aligned start;
// with positive_strides, as a TMA descriptor needs, no stride 0 either), else a contiguous copy.
// Autograd's dO is often a strided or expanded view. The backwards' inputs (task 4's
// flash_backward_mma.cu for cp.async, flash_backward_hopper.cu for the TMA).
inline torch::Tensor with_16_byte_rows(const torch::Tensor& t, bool positive_strides = false) {
  bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int dim = 0; dim < 3 && ok; ++dim)
    ok = t.size(dim) == 1 || ((!positive_strides || t.stride(dim) > 0) && t.stride(dim) % 8 == 0);
  return ok ? t : t.clone(at::MemoryFormat::Contiguous);
}

// A CUDA tensor on the current device, of one of the listed dtypes.
inline void check_cuda_tensor(const torch::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), attn::str(name, " is undefined (None); pass a tensor."));
  TORCH_CHECK_VALUE(t.is_cuda(), attn::str(name, " must be a CUDA tensor but is on ", t.device(),
                    "; move it with .cuda()."));
}

inline void check_dtype(const torch::Tensor& t, const char* name,
                        std::initializer_list<c10::ScalarType> allowed) {
  for (auto dtype : allowed) {
    if (t.scalar_type() == dtype) return;
  }
  std::string names;
  for (auto dtype : allowed) {
    if (!names.empty()) names += ", ";
    names += c10::toString(dtype);
  }
  TORCH_CHECK_TYPE(false, attn::str(name, " has dtype ", t.scalar_type(), " but this kernel takes ", names,
                   "; convert it with .to(...)."));
}

inline void check_dim(const torch::Tensor& t, const char* name, int64_t dims, const char* layout) {
  TORCH_CHECK_VALUE(t.dim() == dims, attn::str(name, " must have ", dims, " dimensions ", layout,
                    " but has shape ", t.sizes(), "."));
}

inline void check_contiguous(const torch::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), attn::str(name,
                    " must be contiguous (it is a strided view); call .contiguous() first."));
}

inline void check_same(const torch::Tensor& a, const char* a_name, const torch::Tensor& b,
                       const char* b_name) {
  TORCH_CHECK_VALUE(a.device() == b.device(), attn::str(a_name, " is on ", a.device(), " but ", b_name,
                    " is on ", b.device(), "; put them on the same GPU."));
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), attn::str(a_name, " has dtype ", a.scalar_type(),
                   " but ", b_name, " has ", b.scalar_type(), "; use one dtype."));
}

inline void check_nonempty(const torch::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.numel() > 0, attn::str(name, " is empty (shape ", t.sizes(),
                    "); attention needs at least one token."));
}

// Call right after every kernel launch: a bad launch configuration raises at once, with the
// kernel's name, instead of surfacing later as an unrelated error.
inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, attn::str(kernel, " failed to launch: ", cudaGetErrorString(err)));
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The kernels' limits: defined once, in common/limits.py, and passed to every build by
// common.build as -D defines (the Python side imports the same module).
#if !defined(ATTN_MAX_HEAD_DIM) || !defined(ATTN_HEAD_DIM_MULTIPLE) || \
    !defined(ATTN_BACKWARD_MAX_HEAD_DIM) || \
    !defined(ATTN_DECODE_LINEAR_MAX_ROWS) || !defined(ATTN_NORM_MAX_THREADS) || \
    !defined(ATTN_NORM_MAX_PIECES_PER_THREAD)
#error "The kernels' limits (ATTN_MAX_HEAD_DIM, ...) are undefined: build through common.build (python -m taskN.compile), which passes common/limits.py's values"
#endif
constexpr int kMaxHeadDim = ATTN_MAX_HEAD_DIM;
constexpr int kHeadDimMultiple = ATTN_HEAD_DIM_MULTIPLE;
constexpr int kBackwardMaxHeadDim = ATTN_BACKWARD_MAX_HEAD_DIM;  // task4/flash_backward.cu

inline void check_head_dim(int64_t head_dim) {
  TORCH_CHECK_VALUE(head_dim > 0 && head_dim <= kMaxHeadDim && head_dim % kHeadDimMultiple == 0,
                    attn::str("head_dim ", head_dim, " is not supported: the kernels take a multiple of ",
                    kHeadDimMultiple, " up to ", kMaxHeadDim, " (registers and shared memory are sized "
                    "for it; rows move in 16-byte pieces); split the heads, pad "
                    "head_dim, or use torch's scaled_dot_product_attention."));
}

// The backward kernels' tiles stop at kBackwardMaxHeadDim (the forward's go further).
inline void check_backward_head_dim(int64_t head_dim) {
  check_head_dim(head_dim);
  TORCH_CHECK_VALUE(head_dim <= kBackwardMaxHeadDim, attn::str("head_dim ", head_dim,
                    " is not supported by the backward: its kernels take head dims up to ",
                    kBackwardMaxHeadDim, " (the forward takes up to ", kMaxHeadDim,
                    "); use torch's scaled_dot_product_attention for training at this head_dim."));
}

}  // namespace attn
