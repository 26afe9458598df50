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

MANIFEST = TaskManifest(
    task=7, points=1, needs_gpu=True, parts=(Part(("parity",), 1),), sections=(SECTION,),
    cpu_note="the grade is for our CUDA kernels generating Hugging Face's tokens; on a CPU "
             "`python -m task7.test` runs the same loop with PyTorch's SDPA, which checks the "
             "loop but not the kernels")


def parity(key: str, field: str) -> str:
    """task7.parity.<key>.<field>: `python -m task7.compare`'s figures (tokens_equal,
    max_logit_diff, hf_interface_tokens_equal, cuda_graph) for one model and dtype."""
    return f"task7.parity.{key}.{field}"
