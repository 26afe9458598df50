#!/bin/bash
# Next session's first call (issue 32): four decode_gqa builds in turn on one machine, each
# timing the split shapes against cuDNN (split_regress.py) and b64 x 1024 / b128 x 512 against
# cuDNN (grid128_ab.py), and the GQA check groups (persistent checks included).
#   main   : HEAD's kernel (the walk in the same kernel; preload count a run-time GqaParams field)
#   static : branch gqa-preload-static (the same, the count a compile-time constant)
#   walk   : branch gqa-walk-kernel (the walk its own instantiation; split kernels without it)
#   old    : the pre-session kernel (9c542ea: one preloaded tile)
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=.
S=$SECONDS
# The stream probe with dedicated incremental mergers added (the bound for b1 hkv4 x 32768).
nvcc -O3 -arch=sm_90a -o /tmp/stream_probe .scratch/stream_probe.cu && /tmp/stream_probe > $OUT/stream_probe.log 2>&1
grep -E "copy|128 blocks|132|MiB" $OUT/stream_probe.log | head -24
FILES="decode_gqa.cuh decode_gqa.cu decode_gqa_fp16.cu decode_gqa_bf16.cu"
mkdir -p /tmp/arm_main; for f in $FILES; do cp task5/$f /tmp/arm_main/; done
for arm in main walk static old; do
  src=.scratch/arms/$arm; [ $arm = main ] && src=/tmp/arm_main
  for f in $FILES; do cp $src/$f task5/; done
  python -c "from task5 import attention as am; am._ext()" > $OUT/build_$arm.log 2>&1; echo "build $arm rc=$? $((SECONDS-S)) s"
  timeout 60 python .scratch/split_regress.py $arm 2>&1 | grep -v Warn | tee -a $OUT/split_regress.log
  timeout 60 python .scratch/grid128_ab.py > $OUT/grid128_$arm.log 2>&1; grep -E "^b" $OUT/grid128_$arm.log | cut -c1-200
  timeout 60 python -m task5.test --gqa-small --gqa-mma > $OUT/gqa_groups_$arm.log 2>&1; echo "groups $arm rc=$?: $(tail -2 $OUT/gqa_groups_$arm.log | head -1)"
done
for f in $FILES; do cp /tmp/arm_main/$f task5/; done
echo "done $((SECONDS-S)) s"
