#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -c "from task5 import attention as am; am._ext()" > $L/build.log 2>&1; echo "build rc=$? $((SECONDS-S)) s"; tail -2 $L/build.log | cut -c1-200
timeout 240 python -m task5.test --gqa-small --gqa-mma --gqa --paged-small --paged > $L/task5_groups.log 2>&1; echo "groups rc=$? $((SECONDS-S)) s"
grep -E "FAIL|16-byte boundary" $L/task5_groups.log | cut -c1-200 | head -5; tail -2 $L/task5_groups.log | cut -c1-300
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
