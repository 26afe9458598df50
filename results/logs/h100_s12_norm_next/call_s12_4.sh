#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
AB_ROUNDS=5 timeout 300 python .scratch/norm_next_ab.py > $L/norm_next_ab.log 2>&1; echo "ab rc=$? $((SECONDS-S)) s"
cp $OUT/norm_next_ab.json $L/ 2>/dev/null; rm -f $OUT/norm_next_ab.json
grep -v Warn $L/norm_next_ab.log | tail -5 | cut -c1-400
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
