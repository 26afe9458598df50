#!/bin/bash
# s11 call 4: the host-code change (device_query.cuh, env_int) on the GPU beyond run_all: the
# GQA check groups (a malformed switch now raises), the backward and Hopper pytest files, and
# task 4's Hopper variants.
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS; L=$OUT/logs; mkdir -p $L
left() { echo $((570 - SECONDS + S)); }
fin() { tar czf $OUT/logs.tgz -C $OUT logs; }
python -m common.tools.build_all > $L/build_all.log 2>&1; echo "build_all rc=$? $((SECONDS-S)) s"
timeout 120 python -m task5.test --gqa-small --gqa-mma > $L/task5_gqa_groups.log 2>&1; echo "gqa groups rc=$? $((SECONDS-S)) s: $(grep -c PASS $L/task5_gqa_groups.log) PASS"
grep -E "FAIL|PERSISTENT_GRID" $L/task5_gqa_groups.log | cut -c1-220 | head -5; fin
timeout 300 python -m pytest -q -x tests/test_task4_backward.py tests/test_task4_hopper_backward.py tests/test_task4_mma.py tests/test_task4_hopper.py tests/test_task5.py tests/test_task5_paged.py > $L/pytest_gpu.log 2>&1; echo "pytest rc=$? $((SECONDS-S)) s"; tail -1 $L/pytest_gpu.log; fin
timeout $(left) python -m task4.hopper_variants > $L/hopper_variants.log 2>&1; echo "hopper_variants rc=$? $((SECONDS-S)) s"
grep -E "MISS|FAIL|passed" $L/hopper_variants.log | cut -c1-160 | tail -5
fin; echo "done $((SECONDS-S)) s"
