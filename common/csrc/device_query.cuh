// What host code asks of the GPU on every call (an attribute, how many blocks of a kernel fit at
// once, a kernel's shared-memory opt-in), done once per device: each is a driver call, and a
// decode's host time counts.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "attention_checks.cuh"

namespace attn {

// A device attribute (cudaDeviceGetAttribute: shared memory to opt in to, SM count, compute
// capability), looked up once per device and attribute. Devices numbered 64 or more, and
// attributes numbered 128 or more, ask every time. Two threads may both look up a missing
// entry; they store the same value.
inline int device_attribute(cudaDeviceAttr attribute, int device) {
  constexpr int kDevices = 64, kAttributes = 128;
  static int known[kDevices][kAttributes] = {};  // the value + 1 (attributes are >= 0); 0: not yet
  const int a = static_cast<int>(attribute);
  int* slot = device >= 0 && device < kDevices && a >= 0 && a < kAttributes ? &known[device][a] : nullptr;
  if (slot != nullptr) {
    const int cached = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (cached > 0) return cached - 1;
  }
  int value = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&value, attribute, device);
  TORCH_CHECK(err == cudaSuccess, attn::str("cudaDeviceGetAttribute(", a, ", device ", device,
                                            ") failed: ", cudaGetErrorString(err)));
  if (slot != nullptr && value >= 0) __atomic_store_n(slot, value + 1, __ATOMIC_RELAXED);
  return value;
}

// How many blocks of `kernel` (launched with `threads` threads and `smem_bytes` of dynamic
// shared memory) fit on `device` at once: a grid's first wave. Looked up once per kernel and
// device.
inline int resident_blocks(const void* kernel, int threads, size_t smem_bytes, int device) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  auto found = known.find(key);
  if (found == known.end()) {
    int per_sm = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
    TORCH_CHECK(err == cudaSuccess, attn::str("cudaOccupancyMaxActiveBlocksPerMultiprocessor failed: ",
                                              cudaGetErrorString(err)));
    const int sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
    found = known.emplace(key, per_sm * sms).first;
  }
  return found->second;
}

// Let `kernel` launch with `smem_bytes` of dynamic shared memory on `device` (above 48 KB a
// kernel must opt in, cudaFuncSetAttribute), once per kernel, size and device. The caller has
// made `device` current.
inline void allow_dynamic_smem(const void* kernel, int smem_bytes, int device) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, int>> allowed;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(kernel, smem_bytes, device);
  if (allowed.count(key) != 0) return;
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  TORCH_CHECK(err == cudaSuccess, attn::str("cudaFuncSetAttribute(MaxDynamicSharedMemorySize, ", smem_bytes,
                                            ") failed: ", cudaGetErrorString(err)));
  allowed.insert(key);
}

}  // namespace attn
