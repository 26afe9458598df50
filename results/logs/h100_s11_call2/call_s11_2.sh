#!/bin/bash
# s11 call 2: build everything; compute-sanitizer on the walk kernel's small group; task 4's kernel
# group with the fp32 timing interleaved (branch fp32-kernel-interleaved); the o_proj L2 prefetch
# on the GQA course model (branch t6-gqa-oproj-prefetch). Logs tarred (8 files at most come back).
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
left() { echo $((560 - SECONDS + S)); }
fin() { tar czf $OUT/logs.tgz -C $OUT logs; }
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"; tail -3 $L/build_all.log | cut -c1-200
for tool in racecheck memcheck; do
  timeout 150 compute-sanitizer --tool $tool python -m task5.test --gqa-small > $L/sanitizer_$tool.log 2>&1; echo "$tool rc=$? $((SECONDS-S)) s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" $L/sanitizer_$tool.log | tail -2
done
fin
cp task4/test.py /tmp/task4_test_main.py; cp .scratch/arms/fp32/test.py task4/test.py
timeout 150 python -m task4.test --kernel > $L/task4_kernel_interleaved.log 2>&1; echo "task4 --kernel (interleaved) rc=$? $((SECONDS-S)) s"
grep -E "fp32|MISS|FAIL|passed" $L/task4_kernel_interleaved.log | grep -iE "timing|ratio|MISS|FAIL|passed" | cut -c1-220 | tail -8
cp /tmp/task4_test_main.py task4/test.py
fin
mkdir -p /tmp/orig/task5 /tmp/orig/task6; for f in task5/binding.cpp task5/compile.py task6/model.py; do cp $f /tmp/orig/$f; done
for f in task5/binding.cpp task5/compile.py task5/l2_prefetch.cu task6/model.py; do cp .scratch/arms/t6pf/$f $f; done
python -c "from task5 import attention as am; am._ext()" > $L/build_t6pf.log 2>&1; echo "build t6pf rc=$? $((SECONDS-S)) s"
timeout $(( $(left) )) python .scratch/t6_gqa_prefetch_ab.py > $L/t6_gqa_prefetch_ab.log 2>&1; echo "t6 prefetch rc=$? $((SECONDS-S)) s"
cp $OUT/t6_gqa_prefetch_ab.json $L/ 2>/dev/null; tail -12 $L/t6_gqa_prefetch_ab.log | cut -c1-200
for f in task5/binding.cpp task5/compile.py task6/model.py; do cp /tmp/orig/$f $f; done; rm -f task5/l2_prefetch.cu
fin; echo "done $((SECONDS-S)) s"
