#!/bin/bash
# s13 call 4: the GQA decode's compact configuration at head dim 128 (ATTN_GQA_COMPACT=1):
# the gqa-mma checks with it, then the GQA step and lone decodes, base against compact.
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
ATTN_GQA_COMPACT=1 timeout 150 python -m task5.test --gqa-mma --no-record > $L/gqa_mma_compact.log 2>&1; echo "gqa-mma compact rc=$? $((SECONDS-S)) s"; grep -E "FAIL" $L/gqa_mma_compact.log | head -3 | cut -c1-200; grep -E "passed" $L/gqa_mma_compact.log | tail -1
AB_ROUNDS=5 timeout 240 python results/logs/h100_s13_gqa_compact/step_ab4.py > $L/step_ab4.log 2>&1; echo "step ab rc=$? $((SECONDS-S)) s"
cp $OUT/step_ab4.json $L/ 2>/dev/null; rm -f $OUT/step_ab4.json
grep -v Warn $L/step_ab4.log | tail -8 | cut -c1-300
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
