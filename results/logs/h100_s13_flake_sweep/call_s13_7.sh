#!/bin/bash
# s13 call 7: task 5's and task 6's correctness groups again and again, each run on a new seed
# (their CLI, --no-record), counting failed checks per run.
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
i=0
while [ $((SECONDS-S)) -lt 330 ]; do
  i=$((i+1)); seed=$((9100000+i))
  timeout 120 python -m task5.test --kernels --small --gqa-small --gqa --gqa-mma --paged-small --paged --fused-small --fused --no-record --seed $seed > $L/task5_seed$seed.log 2>&1; rc5=$?
  timeout 90 python -m task6.test --small --correctness --no-record --seed $seed > $L/task6_seed$seed.log 2>&1; rc6=$?
  echo "seed $seed: task5 rc=$rc5 $(grep -E '^  [0-9]+/[0-9]+ passed|failed' $L/task5_seed$seed.log | tail -1 | cut -c1-80); task6 rc=$rc6 $(grep -E '^  [0-9]+/[0-9]+ passed|failed' $L/task6_seed$seed.log | tail -1 | cut -c1-80); $((SECONDS-S)) s"
  grep -E "^  FAIL" $L/task5_seed$seed.log $L/task6_seed$seed.log | cut -c1-240 | head -4
done
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
