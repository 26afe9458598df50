#!/bin/bash
# s14 record 2 (after the mask vote): the newcomer's main job from an empty build/ at the session's final code, task 6's
# GQA course model beside it, Results.md rendered again.
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
fin() { cp results/h100.json $OUT/h100.json; tar czf $OUT/logs.tgz -C $OUT logs; }
rm -rf build; S=$SECONDS
python -m common.tools.run_all > $L/run_all.log 2>&1; echo "run_all rc=$? wall $((SECONDS-S)) s"; fin
sed -n '/summary ####/,$p' $L/run_all.log | tail -14
grep -E "MISS" $L/run_all.log | grep -v "MISS: recorded" | cut -c1-180 | head -8
timeout 150 python -m task6.test --gqa-course > $L/task6_gqa_course.log 2>&1; echo "gqa course rc=$? $((SECONDS-S)) s"
grep -E "MISS|tbt|TBT" $L/task6_gqa_course.log | cut -c1-180 | tail -3
python -m common.tools.report > $L/report.log 2>&1; fin; echo "report $((SECONDS-S)) s"
fin; echo "done $((SECONDS-S)) s"
