#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
AB_ROUNDS=5 timeout 200 python .scratch/step_ab2.py > $L/step_ab2.log 2>&1; echo "ab rc=$? $((SECONDS-S)) s"
cp $OUT/step_ab2.json $L/ 2>/dev/null; rm -f $OUT/step_ab2.json
grep -v Warn $L/step_ab2.log | tail -4 | cut -c1-400
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
