// Python bindings of the task 5 extension `custom_flash_attention_decode`.
//
// The kernels live in the .cu files named below; this file only exposes them. It is the one
// file that includes pybind11 (common/csrc/binding_api.h), which is slow to compile, so the
// kernel files stay quick to rebuild. task5/attention.py wraps these entries (it turns a
// Python int or a CUDA tensor into the (value, tensor) pairs below and picks num_splits).
#include "binding_api.h"

// k_cache, v_cache [B, max_seq_len, hidden]; k, v [B, n_new, hidden]: written at positions
// [current_pos, current_pos + n_new). current_pos_tensor (CUDA int32, 0-d or [B]), when given,
// replaces current_pos and is read on the device.
void update_kv_cache(torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor k, torch::Tensor v,
                     int64_t current_pos, std::optional<torch::Tensor> current_pos_tensor);
// q [B, H, 1, D]; k, v [B, H, S_max, D], any strides with a contiguous last dimension; attends
// to keys [0, seq_len). seq_len_tensor (CUDA int32, 0-d or [B]), when given, replaces seq_len.
torch::Tensor decode_attention_bhsd(torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t seq_len,
                                    std::optional<torch::Tensor> seq_len_tensor, bool causal,
                                    int64_t num_splits, std::optional<torch::Tensor> out);
// q [B, 1, hidden]; k_cache, v_cache [B, max_seq_len, hidden]: the course's layout. These three
// are the course's (decode.cu).
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                               int64_t num_heads, int64_t seq_len,
                               std::optional<torch::Tensor> seq_len_tensor, bool causal,
                               int64_t num_splits, std::optional<torch::Tensor> out);

// y = x @ weight^T (+ bias) (+ residual) for at most 8 rows of x (decode_linear.cu).
torch::Tensor decode_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> residual, int64_t k_splits);

// SwiGLU's gate and up products in one pass over their stacked weights [2 * width, K]:
// silu(x Wg^T + bg) * (x Wu^T + bu) (+ residual), [..., width] (decode_linear.cu).
torch::Tensor decode_swiglu(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                            std::optional<torch::Tensor> residual, int64_t k_splits);
// LayerNorm or RMSNorm of x's rows, after the residual add if one is given: {out} or
// {out, x + residual} (norm.cu).
std::vector<torch::Tensor> add_norm(torch::Tensor x, std::optional<torch::Tensor> residual,
                                    torch::Tensor weight, std::optional<torch::Tensor> bias,
                                    double eps, bool rms);
// RoPE on q and k and the KV-cache append of k and v in one kernel; returns the rotated q
// (rope_append.cu).
torch::Tensor rope_append(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor k_cache,
                          torch::Tensor v_cache, torch::Tensor cos, torch::Tensor sin,
                          int64_t current_pos, std::optional<torch::Tensor> current_pos_tensor);

// Beyond the course: q [B, H_q, 1, D] against k/v [B, H_kv, S, D] with every attention variant
// (common/variants.py); the query heads of a KV head share one pass over its keys
// (decode_grouped.cu).
torch::Tensor decode_attention_grouped(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                       bool causal, std::optional<int64_t> window, int64_t stride,
                                       std::optional<torch::Tensor> mask,
                                       std::optional<torch::Tensor> key_lengths,
                                       bool left_padding, int64_t num_splits,
                                       std::optional<torch::Tensor> out);

// Merge a split decode's per-range results by their log-sum-exp (the tensor-core GQA path;
// decode.cu).
void merge_attention_splits(torch::Tensor partial, torch::Tensor lse, torch::Tensor out);

// Beyond the course: q [B, H_q, S_q <= 16, D] against k/v [B, H_kv, S_k, D] on tensor cores, the
// query heads of a KV head (times S_q) as the rows of one mma tile, split-KV and a multi-stage
// cp.async pipeline; every attention variant, softcap, sinks and scale included (decode_gqa.cu).
torch::Tensor decode_attention_gqa(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal,
                                   std::optional<int64_t> window, int64_t stride,
                                   std::optional<torch::Tensor> mask,
                                   std::optional<torch::Tensor> key_lengths, bool left_padding,
                                   std::optional<double> softcap, std::optional<torch::Tensor> sinks,
                                   std::optional<double> scale, int64_t num_splits,
                                   std::optional<torch::Tensor> out, std::optional<int64_t> fresh_keys);
// Beyond the course: the same kernel through a paged KV cache, k_pages/v_pages [num_pages,
// page_size, H_kv, D] and block_table [B, max_pages] int32, seq_lens [B] int32 keys per
// sequence, read on the device (decode_paged.cu).
torch::Tensor decode_attention_paged(torch::Tensor q, torch::Tensor k_pages, torch::Tensor v_pages,
                                     torch::Tensor block_table, torch::Tensor seq_lens, bool causal,
                                     std::optional<int64_t> window, int64_t stride,
                                     std::optional<torch::Tensor> mask, std::optional<double> softcap,
                                     std::optional<torch::Tensor> sinks, std::optional<double> scale,
                                     int64_t num_splits, std::optional<torch::Tensor> out);
// RoPE and the append of new tokens' K/V into their pages (rope_append.cu, the paged policy).
torch::Tensor rope_append_paged(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                torch::Tensor k_pages, torch::Tensor v_pages,
                                torch::Tensor block_table, torch::Tensor cos, torch::Tensor sin,
                                int64_t current_pos, std::optional<torch::Tensor> current_pos_tensor);
// {keys per warp tile, warps per block, resident blocks per SM (0: not on this GPU)} of that
// kernel for head_dim (decode_gqa.cu): what task5/attention.py's split heuristic needs.
std::vector<int64_t> decode_gqa_geometry(int64_t head_dim, bool bf16, int64_t device);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Task 5: KV cache update and decode (split-KV FlashDecoding) kernels";
  m.def("update_kv_cache", &update_kv_cache,
        "Write new K/V rows [B, n_new, hidden] into the caches [B, max_seq_len, hidden]",
        py::arg("k_cache"), py::arg("v_cache"), py::arg("k"), py::arg("v"),
        py::arg("current_pos") = 0, py::arg("current_pos_tensor") = py::none());
  m.def("decode_attention_bhsd", &decode_attention_bhsd,
        "One query per (batch, head) against a strided cache, q [B, H, 1, D], k/v [B, H, S, D]",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("seq_len") = 0,
        py::arg("seq_len_tensor") = py::none(), py::arg("causal") = false,
        py::arg("num_splits") = 1, py::arg("out") = py::none());
  m.def("decode_attention", &decode_attention,
        "One query per sequence against the cache, q [B, 1, hidden], caches [B, max_seq_len, hidden]",
        py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("num_heads"),
        py::arg("seq_len") = 0, py::arg("seq_len_tensor") = py::none(), py::arg("causal") = false,
        py::arg("num_splits") = 1, py::arg("out") = py::none());
  m.def("decode_attention_grouped", &decode_attention_grouped,
        "One query per (batch, query head) against k/v [B, H_kv, S, D], GQA and every variant",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
        py::arg("window") = py::none(), py::arg("stride") = 1, py::arg("mask") = py::none(),
        py::arg("key_lengths") = py::none(), py::arg("left_padding") = false,
        py::arg("num_splits") = 1, py::arg("out") = py::none());
  m.def("merge_attention_splits", &merge_attention_splits,
        "out[b, h] = the LSE-weighted merge of partial [B, H_kv, splits, G, D] over the splits",
        py::arg("partial"), py::arg("lse"), py::arg("out"));
  m.def("decode_attention_gqa", &decode_attention_gqa,
        "S_q <= 16 query rows per (batch, query head) against k/v [B, H_kv, S, D] on tensor cores, "
        "GQA packed as rows, split-KV, every variant",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
        py::arg("window") = py::none(), py::arg("stride") = 1, py::arg("mask") = py::none(),
        py::arg("key_lengths") = py::none(), py::arg("left_padding") = false,
        py::arg("softcap") = py::none(), py::arg("sinks") = py::none(), py::arg("scale") = py::none(),
        py::arg("num_splits") = 1, py::arg("out") = py::none(), py::arg("fresh_keys") = py::none());
  m.def("decode_attention_paged", &decode_attention_paged,
        "S_q <= 16 query rows per (batch, query head) against a paged cache k/v_pages [num_pages, "
        "page_size, H_kv, D] through block_table [B, max_pages], seq_lens [B] keys, every variant",
        py::arg("q"), py::arg("k_pages"), py::arg("v_pages"), py::arg("block_table"),
        py::arg("seq_lens"), py::arg("causal") = false, py::arg("window") = py::none(),
        py::arg("stride") = 1, py::arg("mask") = py::none(), py::arg("softcap") = py::none(),
        py::arg("sinks") = py::none(), py::arg("scale") = py::none(), py::arg("num_splits") = 1,
        py::arg("out") = py::none());
  m.def("rope_append_paged", &rope_append_paged,
        "RoPE on q [B, S, Hq, D] and k, k and v appended to their pages at current_pos; returns q "
        "rotated",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("k_pages"), py::arg("v_pages"),
        py::arg("block_table"), py::arg("cos"), py::arg("sin"), py::arg("current_pos") = 0,
        py::arg("current_pos_tensor") = py::none());
  m.def("decode_gqa_geometry", &decode_gqa_geometry,
        "[keys per warp tile, warps per block, blocks per SM] of decode_attention_gqa's kernel",
        py::arg("head_dim"), py::arg("bf16"), py::arg("device"));
  m.def("decode_linear", &decode_linear,
        "y = x @ weight^T (+ bias) (+ residual) for at most 8 rows of x, streaming the weight",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(),
        py::arg("residual") = py::none(), py::arg("k_splits") = 0);
  m.def("decode_swiglu", &decode_swiglu,
        "silu(x Wg^T + bg) * (x Wu^T + bu) (+ residual) for at most 8 rows of x, weight [2*width, K]",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(),
        py::arg("residual") = py::none(), py::arg("k_splits") = 0);
  m.def("add_norm", &add_norm,
        "LayerNorm (rms=False) or RMSNorm of x's rows, after adding residual if given: [out] or "
        "[out, x + residual]",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("bias"), py::arg("eps"),
        py::arg("rms"));
  m.def("rope_append", &rope_append,
        "RoPE on q [B, S, Hq, D] and k, k and v appended to the caches at current_pos; returns q rotated",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("cos"), py::arg("sin"), py::arg("current_pos") = 0,
        py::arg("current_pos_tensor") = py::none());
}
