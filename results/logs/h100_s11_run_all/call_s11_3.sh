#!/bin/bash
# s11 call 3: the stream probe with fewer streaming blocks; then the newcomer's main job from an
# empty build/ (the record); then the split shapes and batch 64 against cuDNN on that build.
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
fin() { tar czf $OUT/logs.tgz -C $OUT logs; }
nvcc -O3 -arch=sm_90a -o /tmp/stream_probe .scratch/stream_probe.cu && /tmp/stream_probe > $L/stream_probe.log 2>&1
grep -E "copy|S3 (64|96|112|120|128) blocks( \+pdl)?$|S3 [0-9]+ blocks +[0-9]|MiB" $L/stream_probe.log | head -24
fin
rm -rf build; S=$SECONDS
python -m common.tools.run_all > $L/run_all.log 2>&1; echo "run_all rc=$? wall $((SECONDS-S)) s"
cp results/h100.json $OUT/h100.json; fin
sed -n '/summary ####/,$p' $L/run_all.log | tail -16
grep -E "MISS|FAIL" $L/run_all.log | grep -v "MISS: recorded" | cut -c1-200 | head -12
timeout 60 python .scratch/split_regress.py main_s11 2>&1 | grep -v Warn | tee $L/split_regress.log
timeout 60 python .scratch/grid128_ab.py > $L/grid128.log 2>&1; grep -E "^b" $L/grid128.log | cut -c1-200
cp $OUT/split_regress.json $OUT/grid128_ab.json $L/ 2>/dev/null; rm -f $OUT/split_regress.json $OUT/grid128_ab.json
fin; echo "done $((SECONDS-S)) s"
