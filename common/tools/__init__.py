"""The course's tools, for instructors and for reports: one layer above the tasks.

    run_all        build and test every task, render Results.md (the main job); with
                   --everything also the benchmark sweep
    build_all      build every CUDA extension side by side
    report         render Results.md from results/<gpu>.json, using each task's manifest
    bench          the benchmark sweep and its plots
    sanitize       every kernel's small checks under compute-sanitizer
    compile_check  nvcc/g++ on every CUDA/C++ source without a GPU (CI)
    grade          score a checkout per task, from each task's manifest
    release        write the student skeleton from this repository
    manifests      find every task's manifest.py

These drive the tasks, so they may import them (`task4.attention`, `taskN.manifest`). The
machinery below them, the rest of `common/` (build, checks, timing, harness, mha, results,
limits, manifest, graphs, csrc), is what every task and every student uses: it never
imports a task or this package (tests/test_layers.py reads the imports and checks that).
"""
