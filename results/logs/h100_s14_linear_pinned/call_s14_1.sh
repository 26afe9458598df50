#!/bin/bash
# s14 call 1: the bf16 products' loop pinned in a __noinline__ function (branch linear-pinned),
# its variants checked (ATTN_LINEAR_VARIANT=1..4), then timed in task 6's bf16 steps.
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
for v in 1 2 3 4; do
  ATTN_LINEAR_VARIANT=$v timeout 120 python -m task5.test --kernels --fused-small --fused --no-record > $L/task5_variant$v.log 2>&1; echo "task5 variant $v rc=$? $((SECONDS-S)) s"; grep -E "FAIL" $L/task5_variant$v.log | head -3 | cut -c1-200; grep -E "passed|swiglu at|decode_linear at" $L/task5_variant$v.log | tail -3 | cut -c1-160
done
timeout 120 python -m task5.test --kernels --fused-small --fused --no-record > $L/task5_base.log 2>&1; grep -E "passed|swiglu at|decode_linear at" $L/task5_base.log | tail -3 | cut -c1-160
AB_ROUNDS=5 timeout 300 python results/logs/h100_s14_linear_pinned/step_ab.py > $L/step_ab.log 2>&1; echo "step ab rc=$? $((SECONDS-S)) s"
cp $OUT/step_ab.json $L/ 2>/dev/null; rm -f $OUT/step_ab.json
grep -v Warn $L/step_ab.log | tail -4 | cut -c1-400
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
