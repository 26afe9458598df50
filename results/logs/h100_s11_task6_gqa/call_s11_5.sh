#!/bin/bash
# s11 call 5: task 6's GQA course model, the step with the norms and RoPE skipped and the
# attention kept, or reduced to its first 16 keys (its fixed cost inside the step).
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
timeout 400 python .scratch/t6_gqa_whatif2.py > $L/t6_gqa_whatif2.log 2>&1; echo "whatif rc=$? $((SECONDS-S)) s"
cp $OUT/t6_gqa_whatif2.json $L/ 2>/dev/null; rm -f $OUT/t6_gqa_whatif2.json
tail -9 $L/t6_gqa_whatif2.log | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
