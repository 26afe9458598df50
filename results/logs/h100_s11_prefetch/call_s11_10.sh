#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
timeout 420 python .scratch/gqa_prefetch_tiles_ab.py > $L/gqa_prefetch_tiles_ab.log 2>&1; echo "ab rc=$? $((SECONDS-S)) s"
cp $OUT/gqa_prefetch_tiles_ab.json $L/ 2>/dev/null; rm -f $OUT/gqa_prefetch_tiles_ab.json
grep -v Warn $L/gqa_prefetch_tiles_ab.log | tail -9 | cut -c1-260
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
