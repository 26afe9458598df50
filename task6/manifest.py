"""Task 6's points, graded groups, metric names and Results.md section (see common/manifest.py).

The course run records `course_metric(dtype, field)` for every field of task6/test.py's
course group; the ones named here are those the grader and Results.md show.
"""

from common.manifest import Metric, Part, Row, Section, Table, TaskManifest

TTFT_MS = "ttft_ms"                       # prefill + first token
TBT_MS = "tbt_ms"                         # mean time per later token (CUDA-graph decode)
TBT_OVER_ROOFLINE = "tbt_over_roofline"   # TBT / the time to read every weight once
DTYPES = ("fp32", "bf16")


def course_metric(dtype: str, field: str, config: str = "") -> str:
    """task6.<dtype>.<field> for the course model; task6.<config>.<dtype>.<field> for another."""
    return f"task6.{config + '.' if config else ''}{dtype}.{field}"


TBT_OVER_BYTES = "tbt_over_bytes_roofline"   # TBT / the time to read the weights and the KV cache
UNFUSED_TBT_MS = "unfused.tbt_ms"            # TBT on the course's decode path (fused_decode=False)
TTFT_SPEEDUP_VS_TORCH = "speedup_vs_torch_path.ttft"
TTFT_ROUNDS = 5   # TTFT: the median of this many interleaved prefills per backend (task6/test.py)

# One decode step's GPU time by kind of kernel (torch.profiler, fused decode, eager steps):
# (metric id, what it covers). task6/test.py's PROFILE_KINDS says which kernels go where.
PROFILE_KINDS = (("linear", "projections and lm_head (decode_linear)"),
                 ("swiglu", "MLP gate and up + silu * up (decode_swiglu)"),
                 ("attention", "decode attention"),
                 ("norm", "norms"),
                 ("rope_append", "RoPE + cache append"),
                 ("other", "everything else (embedding, argmax, copies)"),
                 ("total", "all kernels"))


def profile_metric(dtype: str, kind: str, field: str) -> str:
    """task6.<dtype>.profile.<kind>.<us_per_step | kernels_per_step>."""
    return course_metric(dtype, f"profile.{kind}.{field}")


SECTION = Section(
    "Task 6: dummy LLM (B 4, prompt 1024, hidden 4096, 32 heads, 24 layers, vocab 8192, "
    "100 greedy tokens)",
    intro=("TBT is a whole decode step replayed as one CUDA graph. TTFT is one prefill of the "
           f"prompt, the median of {TTFT_ROUNDS} rounds that alternate ours and the PyTorch path. "
           "Both prefills run the same cuBLAS products; ours runs RoPE and the cache write on task "
           "5's rope_append kernel (fused_prefill) and the attention on task 4's kernels. "
           "In the per-kernel table "
           "(torch.profiler, eager steps) the fused decode kernels are launched overlapped "
           "(task5/device_values.cuh: each may start while the one before it finishes), so "
           "their times overlap and add up to more than the step takes.",),
    blocks=(Table(("dtype", "TTFT (ms)", "TBT (ms)", "TBT / weight-read time",
                   "TBT / weights + KV read time", "TBT unfused (ms)", "TTFT: PyTorch path / ours"),
                  tuple(Row((d, Metric(course_metric(d, TTFT_MS), "{:.1f}"),
                             Metric(course_metric(d, TBT_MS)),
                             Metric(course_metric(d, TBT_OVER_ROOFLINE), suffix="x"),
                             Metric(course_metric(d, TBT_OVER_BYTES), suffix="x"),
                             Metric(course_metric(d, UNFUSED_TBT_MS)),
                             Metric(course_metric(d, TTFT_SPEEDUP_VS_TORCH), suffix="x")))
                        for d in DTYPES)),
            Table(("one decode step, by kernel", *(f"{d} us/step" for d in DTYPES),
                   *(f"{d} kernels/step" for d in DTYPES)),
                  tuple(Row((label, *(Metric(profile_metric(d, kind, "us_per_step"), "{:.0f}")
                                      for d in DTYPES),
                             *(Metric(profile_metric(d, kind, "kernels_per_step"), "{:.0f}")
                               for d in DTYPES)), when=f"task6.fp32.profile.{kind}")
                        for kind, label in PROFILE_KINDS))),
    sources=("task6.",))

# --- training on our kernels (task6/train.py, issue 33; not graded) -------------------------

TRAIN_MODELS = ("task6", "gpt2")              # task 6's model; a random-init GPT-2 (transformers)
TRAIN_DTYPES = ("fp32", "fp16", "bf16")
# Per model and dtype: the mean of the last N losses of ours and of SDPA, the loss gap (below),
# the median step time of each (CUDA events, after warm-up), SDPA's / ours, and the attention
# calls (forward or backward) that did not run on our kernels.
TRAIN_FIELDS = ("final_loss", "final_loss_sdpa", "loss_gap", "step_ms", "step_ms_sdpa",
                "step_time_ratio_vs_sdpa", "fallbacks")
# loss_gap = |mean of our last N losses - mean of SDPA's last N| / std of SDPA's last N (same
# init, same batches): the criterion, target <= TRAIN_GAP_TARGET.
TRAIN_GAP_TARGET = 1.0
# The issue's own names carry no dtype: they are written from runs in this dtype (fp32 runs the
# lesson backward kernel; move it to bf16 once the tensor-core backward is the one that runs).
TRAIN_HEADLINE_DTYPE = "fp32"
TRAIN_LOSS_GAP = "task6.train.loss_gap"
TRAIN_STEP_RATIO = "task6.train.step_time_ratio_vs_sdpa"
GPT2_TRAIN_FALLBACKS = "task7.hf.train.gpt2.fallbacks"
GPT2_TRAIN_LOSS_GAP = "task7.hf.train.gpt2.loss_gap"


def train_metric(model: str, dtype: str, field: str) -> str:
    """task6.train.<model>.<dtype>.<field>."""
    return f"task6.train.{model}.{dtype}.{field}"


def train_headline_metrics(model: str, fields: dict[str, float]) -> dict[str, float]:
    """The issue's names for a run of `model` in the headline dtype (fields: TRAIN_FIELDS)."""
    if model == "task6":
        return {TRAIN_LOSS_GAP: fields["loss_gap"],
                TRAIN_STEP_RATIO: fields["step_time_ratio_vs_sdpa"]}
    if model == "gpt2":
        return {GPT2_TRAIN_FALLBACKS: fields["fallbacks"], GPT2_TRAIN_LOSS_GAP: fields["loss_gap"]}
    return {}


TRAIN_SECTION = Section(
    "Training on our kernels: forward + backward against SDPA (`python -m task6.train`)",
    intro=("Task 6's model (small configuration) and a random-init GPT-2 (transformers, "
           "`attn_implementation=\"course_kernels\"`, dropout 0) trained on the repository's "
           "small text, characters as tokens, once on our forward and backward kernels and once "
           "on SDPA, from the same weights on the same batches, steps alternating in one process. "
           "Loss gap: |mean of our last 50 losses - SDPA's| / the standard deviation of SDPA's last "
           f"50 (target <= {TRAIN_GAP_TARGET:g}). Step time: median over the steps after warm-up, "
           "CUDA events. Fallbacks: attention calls, forward or backward, not on our kernels. "
           "The curves: results/train_<gpu>.png.",),
    blocks=(Table(("model", "dtype", "final loss (ours)", "final loss (SDPA)", "loss gap",
                   "step ms (ours)", "step ms (SDPA)", "SDPA / ours", "fallbacks"),
                  tuple(Row((m, d, Metric(train_metric(m, d, "final_loss"), "{:.4f}"),
                             Metric(train_metric(m, d, "final_loss_sdpa"), "{:.4f}"),
                             Metric(train_metric(m, d, "loss_gap"), "{:.2f}"),
                             Metric(train_metric(m, d, "step_ms"), "{:.2f}"),
                             Metric(train_metric(m, d, "step_ms_sdpa"), "{:.2f}"),
                             Metric(train_metric(m, d, "step_time_ratio_vs_sdpa"), suffix="x"),
                             Metric(train_metric(m, d, "fallbacks"), "{:.0f}")),
                            when=f"task6.train.{m}.{d}.")
                        for m in TRAIN_MODELS for d in TRAIN_DTYPES)),),
    sources=("task6.train", "task7.hf.train"), where="beyond")

# Issue 32: the course model with grouped-query attention (32 query heads, 8 KV heads), bf16
# (task6/test.py's gqa-course group; not in the main job: `python -m pytest` and
# `run_all --everything` run it).
GQA_CONFIG = "gqa"
GQA_SECTION = Section(
    "Task 6 with grouped-query attention (32 query heads, 8 KV heads), bf16",
    intro=("The course model (B 4, prompt 1024, hidden 4096, 24 layers, vocab 8192, 100 greedy "
           "tokens) with 8 KV heads shared by its 32 query heads, decoding on task 5's "
           "grouped-query kernel (`python -m task6.test --gqa-course`). The KV cache is a quarter "
           "of the course model's, so the weights dominate what a decode step must read; the "
           "target is TBT <= 1.10 x the time to read the weights and the KV cache once.",),
    blocks=(Table(("dtype", "TTFT (ms)", "TBT (ms)", "TBT / weights + KV read time",
                   "TBT: PyTorch path / ours"),
                  (Row(("bf16", Metric(course_metric("bf16", TTFT_MS, GQA_CONFIG), "{:.1f}"),
                        Metric(course_metric("bf16", TBT_MS, GQA_CONFIG)),
                        Metric(course_metric("bf16", TBT_OVER_BYTES, GQA_CONFIG), suffix="x"),
                        Metric(course_metric("bf16", "speedup_vs_torch_path.tbt", GQA_CONFIG),
                               suffix="x")),
                       when=course_metric("bf16", TBT_MS, GQA_CONFIG)),)),),
    sources=("task6.gqa.",), where="beyond")

MANIFEST = TaskManifest(
    task=6, points=3, needs_gpu=True, parts=(Part(("correctness", "course"), 3, ("--dtype", "fp32")),),
    everything_groups=("gqa-course",),
    shown=(Metric(course_metric("fp32", TTFT_MS), "{:.1f}", " ms", label="TTFT"),
           Metric(course_metric("fp32", TBT_MS), "{:.2f}", " ms", label="TBT")),
    sections=(SECTION, GQA_SECTION, TRAIN_SECTION),
    cpu_note="it runs on the kernels of tasks 4 and 5")
