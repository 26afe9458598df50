// Python bindings of the task 4 extension `custom_flash_attention`.
//
// The kernels live in flash_attention.cu (fp32, the course kernel) and
// flash_attention_mma.cu (fp16/bf16 on tensor cores); this file only exposes them. It is
// the one file that includes pybind11 (common/csrc/binding_api.h), which is slow to compile,
// so the kernel files stay quick to rebuild.
#include "binding_api.h"

// fp32, q/k/v [B, S, hidden] (projected, heads interleaved in hidden): the course's entry.
// Every entry returns the output; `out`, when given, is written instead of a new tensor
// (the tests pass a NaN-poisoned one to catch elements the kernel never writes).
torch::Tensor custom_flash_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                     int64_t num_heads, bool causal,
                                     std::optional<torch::Tensor> out);
// fp32, q/k/v [B, H, S, D] with any strides whose last dimension is contiguous.
torch::Tensor flash_attention_fp32(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal,
                                   std::optional<torch::Tensor> out, std::optional<int64_t> window,
                                   int64_t stride, std::optional<torch::Tensor> mask,
                                   std::optional<torch::Tensor> key_lengths, bool left_padding,
                                   std::optional<double> softcap, std::optional<torch::Tensor> sinks,
                                   std::optional<double> scale, std::optional<torch::Tensor> lse);
// fp16 or bf16, q/k/v [B, H, S, D] with any strides whose last dimension is contiguous.
// Both take attention variants (common/variants.py): q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D],
// window (None = none), stride, a mask tensor, per-sequence key lengths, softcap (logits),
// sinks ([H_q] logits) and scale (None = 1/sqrt(D)).
// lse, when given ([B, H_q, S_q] float32, contiguous), receives each row's base-2 log-sum-exp
// (the backward's input; task4/backward.py asks for it only when autograd needs it).
torch::Tensor flash_attention_mma(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal,
                                  std::optional<torch::Tensor> out, std::optional<int64_t> window,
                                  int64_t stride, std::optional<torch::Tensor> mask,
                                  std::optional<torch::Tensor> key_lengths, bool left_padding,
                                  std::optional<torch::Tensor> lse, std::optional<double> softcap,
                                  std::optional<torch::Tensor> sinks, std::optional<double> scale);

// Beyond the course (issue 33): the backward of flash_attention_fp32 / flash_attention_mma
// (task4/flash_backward.cu), fp32, from the forward's saved out and base-2 lse ([B, H_q, S_q]).
// Returns [dq, dk, dv]; dk and dv summed over each KV head's query group. Deterministic.
std::vector<torch::Tensor> flash_attention_backward_fp32(
    torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor out, torch::Tensor lse,
    torch::Tensor d_out, bool causal, std::optional<int64_t> window, int64_t stride,
    std::optional<torch::Tensor> mask, std::optional<torch::Tensor> key_lengths,
    bool left_padding, std::optional<double> softcap, std::optional<double> scale);

// The same on tensor cores, fp16/bf16 (task4/flash_backward_mma.cu): dq, dk, dv in q's dtype;
// dQ by atomics (FlashAttention-2's) unless `deterministic` (a separate dQ pass).
std::vector<torch::Tensor> flash_attention_backward_mma(
    torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor out, torch::Tensor lse,
    torch::Tensor d_out, bool causal, std::optional<int64_t> window, int64_t stride,
    std::optional<torch::Tensor> mask, std::optional<torch::Tensor> key_lengths,
    bool left_padding, std::optional<double> softcap, std::optional<double> scale,
    bool deterministic);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Task 4: fused FlashAttention-2 forward kernels";
  m.def("custom_flash_attention", &custom_flash_attention,
        "FlashAttention-2 forward, fp32, q/k/v [B, S, hidden]", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("num_heads"), py::arg("causal") = false, py::arg("out") = py::none());
  m.def("flash_attention_fp32", &flash_attention_fp32,
        "FlashAttention-2 forward, fp32 CUDA cores, q/k/v [B, H, S, D]", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("out") = py::none(),
        py::arg("window") = py::none(), py::arg("stride") = 1, py::arg("mask") = py::none(),
        py::arg("key_lengths") = py::none(), py::arg("left_padding") = false,
        py::arg("softcap") = py::none(), py::arg("sinks") = py::none(), py::arg("scale") = py::none(),
        py::arg("lse") = py::none());
  m.def("flash_attention_backward_fp32", &flash_attention_backward_fp32,
        "FlashAttention-2 backward, fp32 CUDA cores: (dq, dk, dv) from q, k, v, out, the "
        "forward's base-2 lse and d_out", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("lse"), py::arg("d_out"), py::arg("causal") = false, py::arg("window") = py::none(),
        py::arg("stride") = 1, py::arg("mask") = py::none(), py::arg("key_lengths") = py::none(),
        py::arg("left_padding") = false, py::arg("softcap") = py::none(),
        py::arg("scale") = py::none());
  m.def("flash_attention_backward_mma", &flash_attention_backward_mma,
        "FlashAttention-2 backward, fp16/bf16 tensor cores: (dq, dk, dv) from q, k, v, out, the "
        "forward's base-2 lse and d_out; deterministic=True: bit-identical gradients (a "
        "separate dQ pass instead of atomics)", py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("d_out"), py::arg("causal") = false,
        py::arg("window") = py::none(), py::arg("stride") = 1, py::arg("mask") = py::none(),
        py::arg("key_lengths") = py::none(), py::arg("left_padding") = false,
        py::arg("softcap") = py::none(), py::arg("scale") = py::none(),
        py::arg("deterministic") = false);
  m.def("flash_attention_mma", &flash_attention_mma,
        "FlashAttention-2 forward, fp16/bf16 tensor cores, q/k/v [B, H, S, D]", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("out") = py::none(),
        py::arg("window") = py::none(), py::arg("stride") = 1, py::arg("mask") = py::none(),
        py::arg("key_lengths") = py::none(), py::arg("left_padding") = false,
        py::arg("lse") = py::none(), py::arg("softcap") = py::none(), py::arg("sinks") = py::none(),
        py::arg("scale") = py::none());
}
