"""Task 2's points and graded groups (see common/manifest.py): each group scores on its own."""

from common.manifest import Part, TaskManifest

MANIFEST = TaskManifest(task=2, points=3, needs_gpu=True,
                        parts=(Part(("softmax",), 1), Part(("gemm",), 1), Part(("attention",), 1)),
                        cpu_note="its kernels are CUDA")
