#!/bin/bash
# s13 call 3: the decode products' release point as two instantiations chosen per launch
# (ATTN_LINEAR_EARLY_RELEASE=1: once they have waited), checked, then timed in task 6's steps.
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
ATTN_LINEAR_EARLY_RELEASE=1 timeout 200 python -m task5.test --kernels --fused-small --fused --no-record > $L/task5_early.log 2>&1; echo "task5 early rc=$? $((SECONDS-S)) s"; grep -E "FAIL" $L/task5_early.log | head -3 | cut -c1-200; grep -E "passed" $L/task5_early.log | tail -1
AB_ROUNDS=5 timeout 330 python results/logs/h100_s13_linear_early/step_ab3.py > $L/step_ab3.log 2>&1; echo "step ab rc=$? $((SECONDS-S)) s"
cp $OUT/step_ab3.json $L/ 2>/dev/null; rm -f $OUT/step_ab3.json
grep -v Warn $L/step_ab3.log | tail -4 | cut -c1-300
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
