"""Shared machinery of the course: build, timing, checks, the baseline, results, grading, release.

These modules are the only copies of this machinery; tasks, tests and benchmarks import them.
"""
