"""Task 7's points, graded groups, metric names and Results.md section (see common/manifest.py).

`python -m task7.inference --record` records these (task7/inference.py).
"""

from common.manifest import Metric, Part, Row, Section, Table, TaskManifest, Text

TEXT_SAMPLED, TEXT_GREEDY = "task7.text.sampled", "task7.text.greedy"
TBT_MS, REF_TBT_MS, TBT_SPEEDUP = "task7.tbt_ms", "task7.ref_tbt_ms", "task7.speedup_vs_ref.tbt"
TTFT_MS, REF_TTFT_MS, TTFT_SPEEDUP = "task7.ttft_ms", "task7.ref_ttft_ms", "task7.speedup_vs_ref.ttft"
TOKENS_PER_S, REF_TOKENS_PER_S = "task7.tokens_per_s", "task7.ref_tokens_per_s"
CUDA_GRAPH = "task7.cuda_graph"

SECTION = Section(
    "Task 7: GPT-2 generation with our kernels",
    blocks=(Text(TEXT_SAMPLED, "Sampled (top-k 10, temperature 0.95)"), Text(TEXT_GREEDY, "Greedy"),
            Table(("our TBT (ms)", "HF generate TBT (ms)", "speedup"),
                  (Row((Metric(TBT_MS), Metric(REF_TBT_MS), Metric(TBT_SPEEDUP, suffix="x"))),))),
    sources=("task7.",))

# `python -m task7.models --record`: transformers models on our kernels through the
# attention interface (task7/hf_attention.py), one row per model and case.
HF_MODELS = ("gpt2", "llama", "mistral", "qwen2", "gemma2", "gemma3", "gptoss", "phi3")
HF_CASES = ("single", "padded")
HF_FIELDS = ("fallbacks", "tokens_equal", "chunked_ok", "fp16_logits_ok", "fp16_logits_err",
             "tbt_ms", "sdpa_tbt_ms", "tbt_speedup")


def hf(model: str, case: str, field: str) -> str:
    """task7.hf.<model>.<single|padded>.<field> (HF_FIELDS): task7.models' figures."""
    return f"task7.hf.{model}.{case}.{field}"


def _hf_row(model: str, case: str) -> Row:
    return Row((model, case, Metric(hf(model, case, "fallbacks"), "{:.0f}"),
                Metric(hf(model, case, "tokens_equal"), "{:.0f}"),
                Metric(hf(model, case, "chunked_ok"), "{:.0f}"),
                Metric(hf(model, case, "fp16_logits_ok"), "{:.0f}"),
                Metric(hf(model, case, "tbt_ms")), Metric(hf(model, case, "sdpa_tbt_ms")),
                Metric(hf(model, case, "tbt_speedup"), suffix="x")),
               when=f"task7.hf.{model}.{case}.")


HF_SECTION = Section(
    "transformers models on our kernels (`python -m task7.models`)",
    intro=("Small random-weight GPT-2, Llama (GQA 4:1), Mistral (sliding window 16, shorter than "
           "the prompt) and Qwen2 (GQA 7:1), one prompt (single) and a left-padded batch of "
           "three (padded), stock `generate` with attn_implementation 'course_kernels' against "
           "'sdpa'. fallbacks: attention calls that did not run on our kernels (target 0); "
           "tokens: fp32 greedy ids over 40 new tokens equal sdpa's (1/0); chunked: the prompt "
           "in two chunks through the cache gives the one-pass logits (1/0); fp16: first-step "
           "logits within 2x sdpa's own fp16 error plus one fp16 ulp (1/0); TBT: ms per token "
           "after the first (median step; fp16 on a GPU, fp32 on a CPU); speedup = sdpa TBT / "
           "ours. The models are tiny, so TBT is mostly generate()'s own per-step work.",),
    blocks=(Table(("model", "case", "fallbacks", "fp32 tokens = sdpa", "chunked = one pass",
                   "fp16 logits ok", "our TBT (ms)", "sdpa TBT (ms)", "speedup"),
                  tuple(_hf_row(m, c) for m in HF_MODELS for c in HF_CASES)),),
    sources=("task7.hf.",), where="beyond")

MANIFEST = TaskManifest(
    task=7, points=1, needs_gpu=True, parts=(Part(("parity",), 1),),
    sections=(SECTION, HF_SECTION),
    cpu_note="the grade is for our CUDA kernels generating Hugging Face's tokens; on a CPU "
             "`python -m task7.test` runs the same loop with PyTorch's SDPA, which checks the "
             "loop but not the kernels")


def parity(key: str, field: str) -> str:
    """task7.parity.<key>.<field>: `python -m task7.compare`'s figures (tokens_equal,
    max_logit_diff, hf_interface_tokens_equal, cuda_graph) for one model and dtype."""
    return f"task7.parity.{key}.{field}"
