#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
ATTN_LINEAR_RELEASE_EARLY=1 ATTN_GQA_FRESH_KEYS=1 ATTN_ROPE_RELEASE_EARLY=1 timeout 120 python -m task5.test --fused-small --fused --no-record > $L/fused_both.log 2>&1; echo "fused both rc=$? $((SECONDS-S)) s"; grep -E "passed|FAIL" $L/fused_both.log | tail -4 | cut -c1-200
AB_ROUNDS=5 timeout 300 python .scratch/settled_ab.py --no-decode > $L/settled_ab.log 2>&1; echo "ab rc=$? $((SECONDS-S)) s"
cp $OUT/settled_ab.json $L/ 2>/dev/null; rm -f $OUT/settled_ab.json
grep -v Warn $L/settled_ab.log | tail -9 | cut -c1-300
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
