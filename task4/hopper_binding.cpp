// Python bindings of the optional extension `custom_flash_attention_hopper`: the Hopper
// (sm_90a) FlashAttention forward kernel of task4/flash_attention_hopper.cu. It is its own
// extension because it is built for sm_90a only (wgmma, setmaxnreg), while
// `custom_flash_attention` is built for whatever GPU is present; task4/hopper.py loads it on
// Hopper GPUs alone.
#include "binding_api.h"

// fp16/bf16, q [B, H_q, S_q, D], k/v [B, H_kv, S_k, D], D in {64, 96, 128, 256} (256: versions
// 2 and 5), any strides with a contiguous last dimension that are multiples of 16 bytes.
// version: 1 (wgmma, cp.async), 2 (TMA + mbarrier pipeline), 3 (warp-specialized
// producer/consumers), 4 (3 + softmax overlapping P V), 5 (4 + the consumers taking turns),
// 6 (5 with three consumers, head_dim 64), 7 (5 persistent). Writes `out` when
// given; `lse` ([B, H_q, S_q] float32) receives each row's base-2 log-sum-exp; `scale` is the
// softmax scale (None = 1/sqrt(D)).
// The variants of common/variants.py but a stride (window, mask, key_lengths, left_padding,
// softcap, sinks) run the general instantiation of versions 2 and 5 (6 as 5); a mask tensor
// runs on v5, summarised per tile first (empty key tiles are never loaded).
torch::Tensor flash_attention_hopper(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal,
                                     int64_t version, std::optional<torch::Tensor> out,
                                     std::optional<torch::Tensor> lse, std::optional<double> scale,
                                     std::optional<int64_t> window, int64_t stride,
                                     std::optional<torch::Tensor> mask,
                                     std::optional<torch::Tensor> key_lengths, bool left_padding,
                                     std::optional<double> softcap,
                                     std::optional<torch::Tensor> sinks);
// The per-tile summary of a mask tensor that flash_attention_hopper builds (for the tests):
// uint8 [mask batches, mask heads, query tiles of block_m rows, key tiles of 128], 0 = no key
// kept, 1 = every key kept with no bias, 2 = partial.
torch::Tensor hopper_tile_summary(torch::Tensor q, torch::Tensor k, torch::Tensor mask, int64_t block_m);
// Whether flash_attention_hopper takes these inputs on this GPU (never raises).
bool hopper_supports(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                     std::optional<torch::Tensor> out, int64_t stride,
                     std::optional<torch::Tensor> mask);

// The backward on wgmma (task4/flash_backward_hopper.cu): fp16/bf16, q [B, H_q, S_q, D], k/v
// [B, H_kv, S_k, D], out and d_out like q, lse [B, H_q, S_q] float32 (the forward's base-2
// log-sum-exp), dense or causal, D a multiple of 8 from 64 to 128. Returns {dq, dk, dv}.
std::vector<torch::Tensor> flash_attention_backward_hopper(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                                           torch::Tensor out, torch::Tensor lse,
                                                           torch::Tensor d_out, bool causal,
                                                           std::optional<double> scale);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Task 4+: FlashAttention forward for Hopper (wgmma, TMA, warp specialization)";
  m.def("flash_attention_hopper", &flash_attention_hopper,
        "FlashAttention forward on sm_90a, fp16/bf16, q/k/v [B, H, S, D]", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("version") = 3,
        py::arg("out") = py::none(), py::arg("lse") = py::none(), py::arg("scale") = py::none(),
        py::arg("window") = py::none(), py::arg("stride") = 1, py::arg("mask") = py::none(),
        py::arg("key_lengths") = py::none(), py::arg("left_padding") = false,
        py::arg("softcap") = py::none(), py::arg("sinks") = py::none());
  m.def("hopper_tile_summary", &hopper_tile_summary,
        "The per-tile summary (0 empty, 1 visible, 2 partial) of a mask tensor", py::arg("q"),
        py::arg("k"), py::arg("mask"), py::arg("block_m") = 128);
  m.def("flash_attention_backward_hopper", &flash_attention_backward_hopper,
        "FlashAttention backward on sm_90a (wgmma), fp16/bf16, dense or causal: [dq, dk, dv]",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("d_out"),
        py::arg("causal") = false, py::arg("scale") = py::none());
  m.def("hopper_supports", &hopper_supports,
        "True when flash_attention_hopper takes these inputs on this GPU", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("out") = py::none(), py::arg("stride") = 1,
        py::arg("mask") = py::none());
}
