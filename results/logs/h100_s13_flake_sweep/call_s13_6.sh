#!/bin/bash
# s13 call 6: task 4's correctness checks over many fresh draws (flake_sweep.py).
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L; S=$SECONDS
python -c "from task4.attention import _extension; _extension()" > $L/build.log 2>&1; echo "build rc=$? $((SECONDS-S)) s"
timeout 420 python results/logs/h100_s13_flake_sweep/flake_sweep.py > $L/flake_sweep.log 2>&1; echo "sweep rc=$? $((SECONDS-S)) s"
cp $OUT/flake_sweep.json $L/ 2>/dev/null; rm -f $OUT/flake_sweep.json
grep -v Warn $L/flake_sweep.log | grep -E "draws|x " | cut -c1-260 | head -30
tar czf $OUT/logs.tgz -C $OUT logs; echo "done $((SECONDS-S)) s"
