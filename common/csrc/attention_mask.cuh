// Which keys a query row sees: the one description of every attention variant, evaluated
// tile by tile by every kernel family (task 4's fp32 and tensor-core prefill kernels, task 5's
// decode kernels). common/variants.py is the same description in Python, with its float64
// truth; read its docstring for the conventions, summarised here:
//
//   q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D]. Query row i of sequence b sits at absolute
//   position pos(i) = i + key_end_b - S_q (the queries are the last S_q positions: causal is
//   bottom-right aligned, as in FlashAttention-2 >= 2.1). Key j is visible iff
//     key_begin_b <= j < key_end_b                        per-sequence key range (lengths)
//     and (!causal  or j <= pos(i))
//     and (!window  or j > pos(i) - window)               transformers' sliding window
//                   (without causal also j < pos(i) + window: a symmetric window)
//     and (stride 1 or (pos(i) - j) % stride == 0)        strided attention
//     and mask[b, h, i, j] keeps it                       bool, or additive float (-inf drops)
//   A row with no visible key outputs zeros.
//
// Beyond visibility, three arguments change the scores (issue 31; common/variants.py has the
// formula and its sources). With s = q.k * scale (scale: 1/sqrt(D) unless given) in logits:
//     s -> softcap * tanh(s / softcap)                    softcap (Gemma-2), before the mask
//     s -> s + mask[b, h, i, j]                           an additive mask, after the softcap
//     denominator += exp(sink[h])                         sinks (GPT-OSS), no value attached
// The kernels keep raw scores q.k (the scale is folded into their exp2), so the host converts:
// a cap c in logits is c / scale in raw units (c * tanh(s / c) = scale * c' * tanh(r / c')
// with r = s / scale, c' = c / scale), and an additive mask value a is a / scale. A softcap or
// sinks run the general instantiation (general()): the softcap on every tile's scores before
// the mask (softcap_score), the sink once per row at the end (sink_term), so the dense kernels
// pay nothing for them. KeyMask itself (what the decode kernels share) does not change.
//
// Two instantiations of the predicate: KeyMask<false> knows only the sequence end and the
// causal diagonal (the course's dense attention: nothing but two comparisons, so the dense
// kernels are as fast as before), KeyMask<true> the whole description. A kernel asks it per
// query tile which key tiles can hold a visible key (the others are never loaded: a sliding
// window costs S * window, not S^2), per query tile which key tiles are visible to every row with no
// bias (then no elementwise work at all), and otherwise applies it element by element.
//
// This header is device code and plain structs only (no torch headers), so a file that only
// instantiates kernels compiles without parsing torch; the host side that checks a call's
// tensors and fills MaskParams is attention_mask_host.cuh.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace attn {

// How the optional mask tensor is stored. Additive masks are in logit units (added to the
// scaled scores, like SDPA's attn_mask); `mask_scale` converts them to a kernel's score units.
enum MaskKind : int { kNoMask = 0, kBoolMask = 1, kFloat32Mask = 2, kFloat16Mask = 3, kBFloat16Mask = 4 };

// Everything a kernel needs to know about the pattern, filled on the host (make_mask_params)
// and passed by value inside the kernel's parameters.
struct MaskParams {
  int seq_q = 0, seq_k = 0;
  int causal = 0;
  int window = 0;                      // 0: no window
  int stride = 1;                      // 1: every key
  float inv_stride = 1.f;              // 1 / stride (the divisibility test, see apply)
  const int* key_lengths = nullptr;    // [B] int32 on the device, or nullptr: all S_k keys
  int64_t key_lengths_stride = 0;      // 0: one length for every sequence
  int left_padding = 0;                // key_lengths counts the LAST keys of each sequence
  const void* mask = nullptr;          // the mask tensor's data, or nullptr
  int mask_kind = kNoMask;
  int64_t mask_stride_b = 0, mask_stride_h = 0, mask_stride_q = 0, mask_stride_k = 0;  // elements
  float mask_scale = 1.f;              // additive mask value -> the kernel's score units
  // The score transforms (set_score_transforms). softcap: 0 for none, else the cap in the
  // kernel's raw score units (logit cap / scale), and softcap_inv = 1 / softcap; double so
  // that the fp32 kernel's double scores lose nothing to them.
  double softcap = 0.0, softcap_inv = 0.0;
  const float* sinks = nullptr;        // [H_q] float32 logits on the device, or nullptr

  // Anything beyond the sequence end and the causal diagonal (host side: picks the kernel).
  bool general() const {
    return window > 0 || stride > 1 || key_lengths != nullptr || mask != nullptr ||
           softcap > 0.0 || sinks != nullptr;
  }
};

__device__ __forceinline__ float mask_value(const void* base, int kind, int64_t index) {
  switch (kind) {
    case kBoolMask: return static_cast<const unsigned char*>(base)[index] ? 0.f : -INFINITY;
    case kFloat32Mask: return static_cast<const float*>(base)[index];
    case kFloat16Mask: {
      const unsigned short bits = static_cast<const unsigned short*>(base)[index];
      return __half2float(__ushort_as_half(bits));
    }
    default: {  // bf16: the high half of an fp32
      const unsigned int bits = static_cast<const unsigned short*>(base)[index];
      return __uint_as_float(bits << 16);
    }
  }
}

// The predicate for one (batch, query head). Query and key indices are tensor indices
// (0 <= i < S_q, 0 <= j < S_k); rows >= S_q (the padding of a last query tile, never stored)
// may be passed and get finite, meaningless scores.
template <bool kGeneral>
struct KeyMask {
  int seq_q, seq_k;
  int key_begin, key_end;  // this sequence's valid keys
  int offset;              // pos(i) = i + offset
  int causal;
  int window, stride;
  float inv_stride;
  const char* mask_head;   // the mask at [b, h, 0, 0], in bytes; nullptr: no mask
  int mask_kind;
  int64_t mask_stride_q, mask_stride_k;
  float mask_scale;

  __device__ __forceinline__ KeyMask(const MaskParams& p, int64_t batch, int64_t head) {
    seq_q = p.seq_q;
    seq_k = p.seq_k;
    causal = p.causal;
    key_begin = 0;
    key_end = p.seq_k;
    window = 0;
    stride = 1;
    inv_stride = 1.f;
    mask_head = nullptr;
    mask_kind = kNoMask;
    mask_stride_q = mask_stride_k = 0;
    mask_scale = 1.f;
    if constexpr (kGeneral) {
      window = p.window;
      stride = p.stride;
      inv_stride = p.inv_stride;
      if (p.key_lengths != nullptr)
        set_key_length(p.key_lengths[batch * p.key_lengths_stride], p.left_padding);
      if (p.mask != nullptr) {
        const int elem = p.mask_kind == kBoolMask ? 1 : (p.mask_kind == kFloat32Mask ? 4 : 2);
        mask_head = static_cast<const char*>(p.mask) +
                    (batch * p.mask_stride_b + head * p.mask_stride_h) * elem;
        mask_kind = p.mask_kind;
        mask_stride_q = p.mask_stride_q;
        mask_stride_k = p.mask_stride_k;
        mask_scale = p.mask_scale;
      }
    }
    offset = key_end - seq_q;
  }

  // This sequence's valid keys from its length: the first `length` keys, or with left padding
  // the last. A device value was never checked on the host: clamped to the keys that exist.
  __device__ __forceinline__ void set_key_length(int length, int left_padding) {
    length = length < 0 ? 0 : (length > seq_k ? seq_k : length);
    if (left_padding) key_begin = seq_k - length;
    else key_end = length;
    offset = key_end - seq_q;
  }

  // Every key that a query in [q_first, q_last] may see is in [keys_begin(q_first),
  // keys_end(q_last)); outside it no key tile needs to be loaded.
  __device__ __forceinline__ int keys_begin(int q_first) const {
    int begin = key_begin;
    if (kGeneral && window > 0) begin = max(begin, q_first + offset - window + 1);
    return begin;
  }
  __device__ __forceinline__ int keys_end(int q_last) const {
    q_last = min(q_last, seq_q - 1);
    int end = key_end;
    if (causal) end = min(end, q_last + offset + 1);
    else if (kGeneral && window > 0) end = min(end, q_last + offset + window);
    return end;
  }

  // The inverse, for the backward passes: the query rows [x, y) that may see one of the keys
  // [key_first, key_end) (keys_begin and keys_end are non-decreasing in the query), in 64-bit
  // arithmetic (a window of 2^30 plus an offset must not wrap). Empty (x >= y) when no query
  // can; rows of the range may still see none of these keys where a stride or a mask tensor
  // hides them (the per-element mask handles those).
  __device__ __forceinline__ int2 queries_seeing(int key_first, int key_end) const {
    const int64_t k0 = max(key_first, key_begin);
    const int64_t k1 = min(key_end, this->key_end);
    if (k0 >= k1) return make_int2(0, 0);
    int64_t first = 0, end = seq_q;
    // keys_end(q) > k0: causal, q + offset + 1 > k0; a window without causal, q + offset + window > k0.
    if (causal) first = k0 - offset;
    else if (kGeneral && window > 0) first = k0 - offset - window + 1;
    // keys_begin(q) < k1: a window, q + offset - window + 1 < k1.
    if (kGeneral && window > 0) end = k1 - offset + window - 1;
    first = first < 0 ? 0 : first;
    end = end > seq_q ? seq_q : end;
    if (first >= end) return make_int2(0, 0);
    return make_int2(static_cast<int>(first), static_cast<int>(end));
  }

  // Keys [lo, hi) are visible to every query in [q_first, q_last] with no additive bias: a
  // key tile inside that range needs no elementwise work. Empty (lo >= hi) when a mask
  // tensor or a stride makes every tile elementwise.
  __device__ __forceinline__ int2 unmasked_keys(int q_first, int q_last) const {
    q_last = min(q_last, seq_q - 1);
    int lo = key_begin, hi = key_end;
    if (causal) hi = min(hi, q_first + offset + 1);
    if constexpr (kGeneral) {
      if (window > 0) {
        lo = max(lo, q_last + offset - window + 1);
        if (!causal) hi = min(hi, q_first + offset + window);
      }
      if (mask_head != nullptr || stride > 1) hi = lo;
    }
    return make_int2(lo, hi);
  }

  // Without a mask tensor or a stride, the keys query q sees are one interval [x, y): a kernel
  // can mask a row with two comparisons per key, as the dense kernels do.
  __device__ __forceinline__ int2 visible_keys(int q) const {
    const int pos = q + offset;
    int lo = key_begin, hi = key_end;
    if (causal) hi = min(hi, pos + 1);
    if (kGeneral && window > 0) {
      lo = max(lo, pos - window + 1);
      if (!causal) hi = min(hi, pos + window);
    }
    return make_int2(lo, hi);
  }

  // The score of pair (q, k) in the kernel's units: `score` plus the mask's bias, or -inf
  // when k is not visible to q. Score is float, or double (the fp32 prefill's scores).
  template <class Score>
  __device__ __forceinline__ Score apply(Score score, int q, int k) const {
    if constexpr (!kGeneral) {
      // Dense: one comparison per element against the row's first invisible key (the
      // compiler hoists the limit out of a loop over the keys of a row).
      return k >= (causal ? min(key_end, q + offset + 1) : key_end) ? -INFINITY : score;
    } else {
      if (k >= key_end || k < key_begin) return -INFINITY;
      const int pos = q + offset;
      if (causal && k > pos) return -INFINITY;
      if (window > 0 && (k <= pos - window || (!causal && k >= pos + window))) return -INFINITY;
      if (stride > 1) {
        // distance % stride without an integer division (~20 instructions per element):
        // the nearest integer to distance / stride times stride is distance exactly when
        // stride divides it; exact for distance < 2^22 (the host checks seq_k < 2^22).
        const int distance = pos >= k ? pos - k : k - pos;
        const int quotient = __float2int_rn(__int2float_rn(distance) * inv_stride);
        if (quotient * stride != distance) return -INFINITY;
      }
      if (mask_head != nullptr && q < seq_q) {
        const float bias = mask_value(mask_head, mask_kind, q * mask_stride_q + k * mask_stride_k);
        if (bias == -INFINITY) return -INFINITY;
        if (mask_kind != kBoolMask) score = fma(Score(bias), Score(mask_scale), score);
      }
      return score;
    }
  }
};

// The softcap of p (p.softcap > 0; the caller checks): softcap * tanh(score / softcap) in raw
// score units, on every tile's scores before the mask is applied (transformers' Gemma-2
// order). An accurate tanh (tanhf: 2 ulp; double for the fp32 kernel's double scores): the
// capped logit's absolute error, the cap times tanh's, is what the softmax sees.
template <class Score>
__device__ __forceinline__ Score softcap_score(Score score, const MaskParams& p) {
  if constexpr (std::is_same_v<Score, double>) {
    return p.softcap * tanh(score * p.softcap_inv);
  } else {
    return static_cast<float>(p.softcap) * tanhf(score * static_cast<float>(p.softcap_inv));
  }
}

// The same with the hardware's tanh (tanh.approx.f32: one MUFU instruction, relative error
// about 2^-11, as FlashAttention-2/3's softcap, cutlass::fast_tanh), for kernels whose scores
// become 16-bit P right after (the Hopper kernel): tanhf's ~20 instructions per score cost more
// than the rest of a tile's softmax there. sm_75 and newer.
__device__ __forceinline__ float softcap_score_fast(float score, const MaskParams& p) {
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(score * static_cast<float>(p.softcap_inv)));
  return static_cast<float>(p.softcap) * t;
}

// An attention sink (GPT-OSS) joins a row's softmax once, at the end, as a term with no value:
// given the row's running max in base-2 logit units (m2 = m_raw * scale_log2; -inf when the
// row saw no key), the sink takes part in the max, top = max(m2, sink2), and the row's
// unnormalised output O and sum l (both relative to m2) become relative to top:
//     out = O * keys / (l * keys + sink),   lse2 = top + log2(l * keys + sink)
// with keys = exp2(m2 - top), sink = exp2(sink2 - top). A row without keys gets out 0 and
// lse2 = sink2; with a -inf sink too, keys = sink = 0 (the caller writes 0 and -inf). Max is
// float, or double (the fp32 kernel's row max): the differences are taken in it, the
// exponents in float.
template <class Max>
struct SinkTerm {
  Max top;     // max(m2, sink2), base 2
  float keys;  // exp2(m2 - top): the factor of the keys' sum and output
  float sink;  // exp2(sink2 - top): the sink's term of the denominator
};

template <class Max>
__device__ __forceinline__ SinkTerm<Max> sink_term(float sink_logit, Max m2) {
  SinkTerm<Max> t;
  const Max sink2 = static_cast<Max>(sink_logit) * static_cast<Max>(1.4426950408889634);  // log2(e)
  t.top = m2 > sink2 ? m2 : sink2;  // a NaN sink gives NaN below, not a silent 0
  if (t.top == -INFINITY) {
    t.keys = t.sink = 0.f;
  } else {
    t.keys = exp2f(static_cast<float>(m2 - t.top));
    t.sink = exp2f(static_cast<float>(sink2 - t.top));
  }
  return t;
}

}  // namespace attn
