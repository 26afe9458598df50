"""The machinery every task uses: build, timing, CUDA graphs, checks, argument checks, the
kernels' limits, the baseline, the test harness, results recording, the manifest vocabulary.

These modules are the only copies of this machinery; tasks, tests and tools import them, and
they import no task and nothing of `common.tools` (the instructor and reporting tools, one
layer above the tasks; tests/test_layers.py checks it).
"""
