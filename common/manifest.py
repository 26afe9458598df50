"""What a task measures and how it is graded, declared once per task in `taskN/manifest.py`.

Each task folder holds a `manifest.py` with one `MANIFEST = TaskManifest(...)`: its points, the
test groups that are graded, the metric names its test records and the Results.md sections
that show them. The grader (`common.tools.grade`) and the Results.md renderer
(`common.tools.report`) iterate the manifests; the task's test takes its metric names from
the same file. So a metric name is written once, and adding a task or a section means
editing that task's manifest, not `common/`.

This module holds only the vocabulary (plain dataclasses); it imports no task.

    Metric(name, fmt, suffix, label)   one recorded number and how to print it
    Part(groups, points, options)      points earned when every check of these groups passes
    SpeedRule(metric, label, tiers)    performance points from one measured speedup
    Table(header, rows) / Row(cells, when) / Text(key, label)   Results.md content
    Section(title, intro, blocks, sources, where)               one Results.md section
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One recorded figure (`name` in results/<gpu>.json "metrics") and how to print it."""
    name: str
    fmt: str = "{:.2f}"
    suffix: str = ""
    label: str = ""       # a short label where a table names it (the grader's speedups column)

    def format(self, value: float) -> str:
        return self.fmt.format(value) + self.suffix


def module_metric(task: str, kind: str, mask: str, label: str) -> str:
    """The names `common.harness.module_checks` records for a module case:
    kind "speedup" (nn.MultiheadAttention time / ours), "module_ms" or "mha_ms"."""
    return f"{task}.{kind}.{mask}.{label}"


# --- grading -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Part:
    """Points earned when every check of these test groups passes (() = the test's default).

    `options` are passed to the test too (e.g. task 6 grades the fp32 course run only)."""
    groups: tuple[str, ...]
    points: float
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpeedRule:
    """Performance points from one measured speedup: the first tier reached, best first."""
    metric: str
    label: str
    tiers: tuple[tuple[float, float], ...]    # (minimum speedup, points)

    @property
    def points(self) -> float:
        return max(p for _, p in self.tiers)


# --- Results.md ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """A table row: literal text cells and Metric cells. With `when`, the row is shown only
    if some recorded metric or text starts with that prefix."""
    cells: tuple[str | Metric, ...]
    when: str = ""


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Text:
    """A recorded text (results JSON "texts"), shown as a code block under a bold label."""
    key: str
    label: str


@dataclass(frozen=True)
class Section:
    """One Results.md section. `intro` is text and Metric pieces (a number in a sentence);
    `sources` are the metric prefixes whose runs the section names ("Measured on ...");
    `where` is "course" (the course's fields) or "beyond" (beyond the course)."""
    title: str
    intro: tuple[str | Metric, ...] = ()
    blocks: tuple[Table | Text, ...] = ()
    sources: tuple[str, ...] = ()
    where: str = "course"


# --- one task ------------------------------------------------------------------------------

@dataclass(frozen=True)
class TaskManifest:
    task: int
    points: float
    needs_gpu: bool
    parts: tuple[Part, ...]
    speed: tuple[SpeedRule, ...] = ()
    shown: tuple[Metric, ...] = ()        # figures the grader's table shows (Metric.label)
    sections: tuple[Section, ...] = ()
    cpu_note: str = ""                    # why a GPU is needed, said when grading on a CPU
    # Check groups the main job (run_all without --everything) leaves out: benchmarks beyond
    # the course that the main job's time cannot afford; `python -m pytest` and
    # `run_all --everything` run them.
    everything_groups: tuple[str, ...] = ()
