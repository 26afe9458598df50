#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
timeout 150 python -m task5.test --gqa-small --gqa --gqa-mma --fused-small --fused --paged-small --paged --no-record > $L/task5_groups.log 2>&1; echo "task5 groups rc=$? $((SECONDS-S)) s"
grep -E "FAIL" $L/task5_groups.log | cut -c1-220 | head -5; grep -E "passed|settled" $L/task5_groups.log | tail -3 | cut -c1-220
timeout 120 python -m task6.test --small --correctness --no-record > $L/task6_small.log 2>&1; echo "task6 small rc=$? $((SECONDS-S)) s"; grep -E "FAIL" $L/task6_small.log | head -3 | cut -c1-200; grep passed $L/task6_small.log | tail -1
for t in racecheck memcheck synccheck; do timeout 120 compute-sanitizer --tool $t python .scratch/settled_sanitize.py > $L/sanitizer_$t.log 2>&1; echo "$t rc=$? $((SECONDS-S)) s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|settled sanitize' $L/sanitizer_$t.log | tr '\n' ' ')"; done
AB_ROUNDS=5 timeout 280 python .scratch/step_ab.py > $L/step_ab.log 2>&1; echo "step ab rc=$? $((SECONDS-S)) s"
cp $OUT/step_ab.json $L/ 2>/dev/null; rm -f $OUT/step_ab.json
grep -v Warn $L/step_ab.log | tail -5 | cut -c1-400
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
