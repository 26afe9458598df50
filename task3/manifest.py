"""Task 3's points and graded groups (see common/manifest.py); it records no figures."""

from common.manifest import Part, TaskManifest

MANIFEST = TaskManifest(task=3, points=3, needs_gpu=False, parts=(Part(("module", "tiles"), 3),))
