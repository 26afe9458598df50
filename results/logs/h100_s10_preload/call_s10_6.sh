#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=.
S=$SECONDS
python -c "from task5 import attention as am; am._ext()" > $OUT/build_new.log 2>&1; echo "build new rc=$? $((SECONDS-S)) s"
timeout 60 python .scratch/split_regress.py new_8515224 2>&1 | tee $OUT/split_regress.log | grep -v Warn
cp task5/decode_gqa.cuh /tmp/new.cuh; cp task5/decode_gqa.cu /tmp/new.cu
cp .scratch/old/decode_gqa.cuh task5/decode_gqa.cuh; cp .scratch/old/decode_gqa.cu task5/decode_gqa.cu
python -c "from task5 import attention as am; am._ext()" > $OUT/build_old.log 2>&1; echo "build old rc=$? $((SECONDS-S)) s"
timeout 60 python .scratch/split_regress.py old_9c542ea 2>&1 | tee -a $OUT/split_regress.log | grep -v Warn
cp /tmp/new.cuh task5/decode_gqa.cuh; cp /tmp/new.cu task5/decode_gqa.cu
echo "done $((SECONDS-S)) s"
