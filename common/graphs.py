"""Capture a step as a CUDA graph, the way PyTorch's documentation says to.

    graph, out = capture_graph(step, warmup=2, reset=restore_state)
    graph.replay()          # runs the recorded kernels again; `out` holds the new result

PyTorch's rule for capture: run the code a few times first on a side stream, so that lazy
work (cuBLAS handles and heuristics, kernel module loading, allocator growth) happens
outside the capture; then record one call. Recording runs nothing and changes no state.
`reset`, when given, is called before every warm-up and once more before the capture, so a
step that advances state (a position, a token) starts each time from the same point.
Tasks 6 and 7 capture their decode steps with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def capture_graph(step: Callable[[], Any], *, warmup: int = 2,
                  reset: Callable[[], None] | None = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Warm `step` up `warmup` times on a side stream, then record one call of it in a CUDA
    graph. Returns (the graph, what the recorded call returned: its static output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            if reset is not None:
                reset()
            step()
    torch.cuda.current_stream().wait_stream(side)
    if reset is not None:
        reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):   # records only: nothing runs, no state changes
        out = step()
    return graph, out


def graph_per_call_timer(fn: Callable[..., Any], sets: list[tuple], *, calls: int = 32,
                         warmup: int = 3) -> Callable[[int], float]:
    """Capture `calls` calls of `fn` rotating over `sets` (inputs bigger than L2 together) as
    one CUDA graph; the returned `timer(repeats)` replays it and gives the median GPU time of
    one call in ms. The host's launch cost is out, as it is in a decode loop that replays a
    captured step."""
    from common.timing import time_cuda

    def step():
        for i in range(calls):
            fn(*sets[i % len(sets)])

    graph, _ = capture_graph(step, warmup=warmup)
    return lambda repeats: time_cuda(graph.replay, warmup=2, repeats=repeats).median_ms / calls


def graph_time_per_call_ms(fn: Callable[..., Any], sets: list[tuple], *, calls: int = 32,
                           warmup: int = 3, repeats: int = 20) -> float:
    """Median GPU time of one `fn(*set)` call, timed as replays of a CUDA graph
    (graph_per_call_timer)."""
    return graph_per_call_timer(fn, sets, calls=calls, warmup=warmup)(repeats)
