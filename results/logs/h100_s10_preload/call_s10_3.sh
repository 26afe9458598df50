#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=.
S=$SECONDS
python -c "from task5 import attention as am; am._ext()" > $OUT/build.log 2>&1; echo "build rc=$? $((SECONDS-S)) s"
timeout 200 python .scratch/preload_ab.py > $OUT/preload_ab.log 2>&1; echo "ab rc=$? $((SECONDS-S)) s"
timeout 150 python -m task5.test --gqa-small --gqa-mma > $OUT/gqa_groups.log 2>&1; echo "groups rc=$? $((SECONDS-S)) s"
tail -2 $OUT/gqa_groups.log | cut -c1-300
for tool in racecheck memcheck; do
  timeout 150 compute-sanitizer --tool $tool python -m task5.test --gqa-small > $OUT/sanitizer_$tool.log 2>&1; echo "$tool rc=$? $((SECONDS-S)) s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" $OUT/sanitizer_$tool.log | tail -3
done
grep -E "checks|FAIL" $OUT/preload_ab.log | head -5
grep -E "^b[0-9]" $OUT/preload_ab.log
