"""Timing: the only timing code in the repository.

GPU work is asynchronous, so a host clock read without synchronising measures the launch,
not the kernel (the course's original numbers were timed that way and meant nothing).
`time_cuda` records a CUDA event pair around every repeat, after warm-up, and reports the
median. Inputs larger than L2 can be rotated (`inputs=`) and L2 can be flushed between
repeats (`flush_l2=True`) so that a repeat never reads what the previous one left in cache.
`time_cpu` is the fallback for CPU-only tasks (1 and 3) and uses the same summary.
`TokenClock` stamps each generated token on the GPU's timeline, for TTFT and TBT (tasks 6, 7).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (p10 {self.p10_ms:.3f}, p90 {self.p90_ms:.3f}, n={self.repeats})"


def _summarise(samples: list[float]) -> Timing:
    ordered = sorted(samples)
    n = len(ordered)
    return Timing(
        median_ms=statistics.median(ordered),
        min_ms=ordered[0],
        p10_ms=ordered[int(0.1 * (n - 1))],
        p90_ms=ordered[int(0.9 * (n - 1))],
        repeats=n,
    )


_l2_flush_buffer: torch.Tensor | None = None


def _flush_l2() -> None:
    """Overwrite a buffer twice the size of L2 so the next kernel starts with a cold cache."""
    global _l2_flush_buffer
    if _l2_flush_buffer is None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2_bytes = getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20
        _l2_flush_buffer = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device="cuda")
    _l2_flush_buffer.zero_()


def time_cuda(fn: Callable[..., Any], *, inputs: Sequence[tuple] | None = None,
              warmup: int = 5, repeats: int = 30, flush_l2: bool = False,
              max_seconds: float | None = None) -> Timing:
    """Median time of `fn()` (or `fn(*inputs[i % len(inputs)])`) measured with CUDA events.

    warmup: untimed calls first (module load, autotuning, allocator growth stay out).
    repeats: timed calls, each between its own event pair; the median is reported.
    inputs: argument tuples to rotate through (several input sets bigger than L2 together).
    flush_l2: overwrite L2 before each timed call (outside the events).
    max_seconds: stop repeating early once this much GPU time was spent (at least 3 repeats),
        so a slow baseline does not blow the time budget of a run.
    """
    def call(i: int):
        return fn(*inputs[i % len(inputs)]) if inputs else fn()

    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()

    samples: list[float] = []
    spent = 0.0
    for i in range(repeats):
        if flush_l2:
            _flush_l2()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call(i)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
        spent += samples[-1] / 1000
        if max_seconds is not None and spent > max_seconds and len(samples) >= 3:
            break
    return _summarise(samples)


def time_cpu(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5) -> Timing:
    """Median wall time of a CPU-only function (synchronises CUDA too, in case it launches any)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1000)
    return _summarise(samples)


def time_any(fn: Callable[[], Any], device: torch.device | str, **kwargs) -> Timing:
    """time_cuda on a CUDA device, time_cpu otherwise (CPU ignores flush/rotation options)."""
    if torch.device(device).type == "cuda":
        return time_cuda(fn, **kwargs)
    return time_cpu(fn, warmup=min(kwargs.get("warmup", 1), 2), repeats=min(kwargs.get("repeats", 5), 5))


# --- per-token timing of a generation loop -------------------------------------------------

class TokenClock:
    """A timestamp when each token's logits are ready, on the GPU's own timeline.

    CUDA: one event recorded on the current stream at start() and at each mark(); nothing
    waits until times() synchronises once at the end, so timing adds no host sync to the
    loop. Events are created up front (`capacity` marks) to keep the loop lean. On a CPU,
    where every op has finished when it returns, the host clock is the honest clock.

    TTFT = start -> first mark (prompt processed, first logits ready).
    TBT  = mean gap between consecutive marks (one decode step each).
    """

    def __init__(self, device: torch.device, capacity: int):
        self.cuda = torch.device(device).type == "cuda"
        self.capacity = capacity
        self._n = 0
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(capacity)]
        else:
            self._stamps: list[float] = []

    def start(self) -> None:
        self._n = 0
        if self.cuda:
            self._start.record()
        else:
            self._t0 = time.perf_counter()
            self._stamps = []

    def mark(self) -> None:
        if self._n >= self.capacity:
            raise RuntimeError(f"TokenClock holds {self.capacity} marks; one more was recorded.")
        if self.cuda:
            self._events[self._n].record()
        else:
            self._stamps.append(time.perf_counter())
        self._n += 1

    def wait(self, index: int) -> None:
        """Block until mark `index` has happened (e.g. to advance a progress bar one step
        behind the GPU, so the next step is already queued and no idle time is added)."""
        if self.cuda and 0 <= index < self._n:
            self._events[index].synchronize()

    def times_ms(self) -> list[float]:
        """Milliseconds from start() to each mark (synchronises once)."""
        if self.cuda:
            self._events[self._n - 1].synchronize() if self._n else torch.cuda.synchronize()
            return [self._start.elapsed_time(e) for e in self._events[:self._n]]
        return [(s - self._t0) * 1e3 for s in self._stamps]


@dataclass
class TokenTiming:
    ttft_ms: float
    tbt_ms: float          # mean over the decode steps (nan with a single token)
    tokens_per_s: float
    steps: int
    step_ms: list[float]   # each decode step: the gaps between consecutive marks

    @classmethod
    def from_marks(cls, marks_ms: list[float]) -> TokenTiming:
        gaps = [b - a for a, b in zip(marks_ms[:-1], marks_ms[1:], strict=True)]
        tbt = sum(gaps) / len(gaps) if gaps else float("nan")
        total = marks_ms[-1] if marks_ms else float("nan")
        return cls(marks_ms[0] if marks_ms else float("nan"), tbt,
                   len(marks_ms) / (total / 1e3) if total and total > 0 else float("nan"),
                   len(marks_ms), gaps)

    def line(self, clock: str) -> str:
        return (f"TTFT {self.ttft_ms:.2f} ms, TBT {self.tbt_ms:.3f} ms (mean of {self.steps - 1} "
                f"decode steps), {self.tokens_per_s:.1f} tokens/s ({clock})")


# --- the two ceilings (METHOD.md: "two numbers first") ------------------------------------

def attention_flops(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int,
                    causal: bool) -> float:
    """FLOPs of attention forward: 2 matmuls of 2*Sq*Sk*D each per head; causal halves it
    (the convention FlashAttention's benchmarks use, for square attention)."""
    flops = 4.0 * batch * heads * seq_q * seq_k * head_dim
    return flops / 2 if causal else flops


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def measure_copy_bandwidth(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    t = time_cuda(lambda: dst.copy_(src), warmup=3, repeats=20)
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e9


def measure_matmul_tflops(dtype: torch.dtype, n: int = 8192) -> float:
    """Dense n x n x n matmul rate (TFLOP/s) on random data, as cuBLAS runs it for `dtype`."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    t = time_cuda(lambda: a @ b, warmup=3, repeats=10)
    return tflops(2.0 * n**3, t.median_ms)


def interleaved_samples(timers: dict[str, Callable[[int], float]], *, rounds: int = 5,
                        repeats: int = 20) -> dict[str, list[float]]:
    """Each timer(repeats) once per round, in turn, `rounds` rounds: {name: its round times}.
    Contenders a few percent apart need this: the GPU's clock drifts over a run by more than
    that, and timing one contender after the other would measure the drift."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name].append(timer(repeats))
    return samples


def interleaved_medians(timers: dict[str, Callable[[int], float]], *, rounds: int = 5,
                        repeats: int = 20) -> dict[str, float]:
    """The median over the rounds of each timer, timed as interleaved_samples does."""
    samples = interleaved_samples(timers, rounds=rounds, repeats=repeats)
    return {name: statistics.median(values) for name, values in samples.items()}
