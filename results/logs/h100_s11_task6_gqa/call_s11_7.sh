#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
timeout 300 python .scratch/t6_gqa_step_timeline.py > $L/t6_gqa_step_timeline.log 2>&1; echo "timeline rc=$? $((SECONDS-S)) s"
cp $OUT/t6_gqa_step_timeline.json $L/ 2>/dev/null; rm -f $OUT/t6_gqa_step_timeline.json
tail -40 $L/t6_gqa_step_timeline.log | cut -c1-160
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
