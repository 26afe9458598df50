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


SECTION = Section(
    "Task 6: dummy LLM (B 4, prompt 1024, hidden 4096, 32 heads, 24 layers, vocab 8192, "
    "100 greedy tokens)",
    blocks=(Table(("dtype", "TTFT (ms)", "TBT (ms)", "TBT / weight-read time"),
                  tuple(Row((d, Metric(course_metric(d, TTFT_MS), "{:.1f}"),
                             Metric(course_metric(d, TBT_MS)),
                             Metric(course_metric(d, TBT_OVER_ROOFLINE), suffix="x")))
                        for d in DTYPES)),),
    sources=("task6.",))

MANIFEST = TaskManifest(
    task=6, points=3, needs_gpu=True, parts=(Part(("correctness", "course"), 3, ("--dtype", "fp32")),),
    shown=(Metric(course_metric("fp32", TTFT_MS), "{:.1f}", " ms", label="TTFT"),
           Metric(course_metric("fp32", TBT_MS), "{:.2f}", " ms", label="TBT")),
    sections=(SECTION,),
    cpu_note="it runs on the kernels of tasks 4 and 5")
