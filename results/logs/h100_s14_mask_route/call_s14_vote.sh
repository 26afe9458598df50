#!/bin/bash
# s14: decode_gqa.cu's mask vote (branch gqa-mask-vote): build, the GQA checks (the new shared-
# mask cases and the vote against the elementwise predicate bit for bit), then the timing.
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -c "from task5 import attention as am; am._ext()" > $L/build.log 2>&1; echo "build rc=$? $((SECONDS-S)) s"
timeout 240 python -m task5.test --gqa-small --gqa-mma --no-record > $L/task5_gqa_vote.log 2>&1; echo "checks rc=$? $((SECONDS-S)) s"
grep -E "FAIL" $L/task5_gqa_vote.log | head -5 | cut -c1-220; grep -E "passed" $L/task5_gqa_vote.log | tail -1; grep -c "mask vote" $L/task5_gqa_vote.log
MASK_ROUTE_VOTE_ARM=1 timeout 120 python results/logs/h100_s14_mask_route/mask_route_ab.py > $L/mask_route_vote_ab.log 2>&1; echo "ab rc=$? $((SECONDS-S)) s"
cp $OUT/mask_route_ab.json $L/mask_route_vote_ab.json 2>/dev/null; rm -f $OUT/mask_route_ab.json
grep -v Warn $L/mask_route_vote_ab.log | grep ctx | cut -c1-230
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
