#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -c "from task5 import attention as am; am._ext()" > $L/build.log 2>&1; echo "build rc=$? $((SECONDS-S)) s"; tail -2 $L/build.log | cut -c1-200
timeout 200 python .scratch/decode_timeline2.py > $L/decode_timeline2.log 2>&1; echo "timeline rc=$? $((SECONDS-S)) s"
cp $OUT/decode_timeline2.json $L/ 2>/dev/null; rm -f $OUT/decode_timeline2.json
grep -v "^\s*$" $L/decode_timeline2.log | tail -50 | cut -c1-170
timeout 100 python -m task5.test --gqa-small > $L/gqa_small.log 2>&1; echo "gqa-small rc=$?: $(tail -1 $L/gqa_small.log)"
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
