#!/bin/bash
# Rung b3 on the H100: build, checks (both dQ modes against float64), then the timing A/B
# (2d, wgmma atomic = b2, wgmma reduce = b3, SDPA FLASH, cuDNN) and the GPU pytest.
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=.
S=$SECONDS
python -m common.tools.build_all > $OUT/build.log 2>&1; echo "build rc=$? $((SECONDS-S)) s"; grep -E "FAIL|rror" $OUT/build.log | head
timeout 120 python .scratch/bwd_b3_ab.py --checks-only > $OUT/bwd_b3_checks.log 2>&1; rc=$?; echo "checks rc=$rc $((SECONDS-S)) s"
grep -iE "^FAIL|raised|error|Timeout" $OUT/bwd_b3_checks.log | head -20 | cut -c1-240; grep "checks:" $OUT/bwd_b3_checks.log
if [ $rc -eq 0 ]; then
  timeout $((560 - (SECONDS - S))) python .scratch/bwd_b3_ab.py > $OUT/bwd_b3_ab.log 2>&1; echo "ab rc=$? $((SECONDS-S)) s"
  grep -E "checks:" $OUT/bwd_b3_ab.log; grep -E "^case|^fp16|^bf16|^FAIL" $OUT/bwd_b3_ab.log | cut -c1-200
  timeout $((590 - (SECONDS - S))) python -m pytest -q -m gpu tests/test_task4_hopper_backward.py > $OUT/pytest_gpu.log 2>&1
  echo "pytest rc=$? $((SECONDS-S)) s"; tail -4 $OUT/pytest_gpu.log | cut -c1-200
fi
# checks rc=124: a hang (the dQ full / empty named barriers are the first suspect).
