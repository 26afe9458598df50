"""Task 1's points and graded groups (see common/manifest.py); it records no figures."""

from common.manifest import Part, TaskManifest

MANIFEST = TaskManifest(task=1, points=2, needs_gpu=False, parts=(Part(("attention",), 2),))
