#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
ATTN_GQA_PREFETCH=0 timeout 200 python .scratch/decode_timeline2.py > $L/decode_timeline2_no_prefetch.log 2>&1; echo "timeline rc=$? $((SECONDS-S)) s"
cp $OUT/decode_timeline2.json $L/decode_timeline2_no_prefetch.json 2>/dev/null; rm -f $OUT/decode_timeline2.json
grep -E "timeline\] fp16|span|wait for|ramp|loop end: |merge dur" $L/decode_timeline2_no_prefetch.log | cut -c1-120
timeout 300 python .scratch/t6_gqa_prefetch_off_ab.py > $L/t6_gqa_prefetch_off_ab.log 2>&1; echo "t6 ab rc=$? $((SECONDS-S)) s"
cp $OUT/t6_gqa_prefetch_off_ab.json $L/ 2>/dev/null; rm -f $OUT/t6_gqa_prefetch_off_ab.json
tail -3 $L/t6_gqa_prefetch_off_ab.log | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
