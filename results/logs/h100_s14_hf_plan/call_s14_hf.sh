#!/bin/bash
# s14: task 7's leaner decode plan on the GPU: its checks, every model's checks, then the A/B.
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
timeout 150 python -m task7.test > $L/task7_test.log 2>&1; echo "task7.test rc=$? $((SECONDS-S)) s"; tail -2 $L/task7_test.log
timeout 200 python -m task7.models --model all --no-timing > $L/task7_models.log 2>&1; echo "task7.models rc=$? $((SECONDS-S)) s"; tail -1 $L/task7_models.log
AB_ROUNDS=5 timeout 240 python results/logs/h100_s14_hf_plan/plan_ab.py > $L/plan_ab.log 2>&1; echo "plan ab rc=$? $((SECONDS-S)) s"
cp $OUT/plan_ab.json $L/ 2>/dev/null; rm -f $OUT/plan_ab.json
grep -v Warn $L/plan_ab.log | grep padded | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
