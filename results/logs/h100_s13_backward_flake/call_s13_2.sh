#!/bin/bash
# s13 call 2: how often each fp16/bf16 backward case misses FA2's criterion over fresh draws
# (ours, and SDPA's FlashAttention-2 and cuDNN backwards on the same inputs), then the
# backward-half group once with its seed printed.
export ATTN_COMMIT=$(cat .scratch/commit_id)-dirty PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -c "from task4.attention import _extension; _extension()" > $L/build.log 2>&1; echo "build rc=$? $((SECONDS-S)) s"
DRAWS_TINY=1000 DRAWS_ALL=20 BUDGET_S=300 timeout 420 python results/logs/h100_s13_backward_flake/backward_flake.py > $L/backward_flake.log 2>&1; echo "probe rc=$? $((SECONDS-S)) s"
cp $OUT/backward_flake.json $L/ 2>/dev/null
grep -v Warn $L/backward_flake.log | grep -E "fails \{'ours': \{'|Sq7|budget" | cut -c1-330 | head -30
timeout 60 python -m task4.test --backward-half --no-record > $L/backward_half.log 2>&1; echo "backward-half rc=$? $((SECONDS-S)) s"; grep -E "seed|passed|FAIL" $L/backward_half.log | head -5
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
