#!/bin/bash
# s14: task 7's transformers table recorded again with the leaner decode plan.
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
timeout 300 python -m task7.models --model all --device cuda --record > $L/task7_models_record.log 2>&1; echo "task7.models rc=$? $((SECONDS-S)) s"
grep -E "TBT" $L/task7_models_record.log | sed 's/.*| TBT/TBT/' | cut -c1-120; tail -1 $L/task7_models_record.log
cp results/h100.json $OUT/h100.json; tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
