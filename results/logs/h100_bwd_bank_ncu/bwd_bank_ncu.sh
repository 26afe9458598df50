#!/bin/bash
# Attribute the 2-D backward's shared-load "bank conflicts" (ncu's hardware counter) on a GPU:
#   bash .scratch/bwd_bank_ncu.sh        (PYTHONPATH=. ; writes under $OUT; about 9 ncu runs, ~5 min)
# 1. hardware and SASS-level counts of shared loads / stores / ldmatrix, ours and FA2 at D 128;
# 2. per-SASS-instruction source counters (L1 wavefronts shared, ideal, excessive) of ours at D128,
#    so that an access with excess wavefronts is named by its instruction (.scratch/bwd_bank_model.py
#    predicts none from the addresses).
export PYTHONPATH=.
OUT=${OUT:-.}
python -c "from task4.attention import _extension; _extension()" || exit 1   # the build, outside ncu
# H: metrics already collected on this H100 (results/logs/h100_backward_ncu_conflicts_*.txt);
# W: the per-op wavefronts, in their own run so that a name this ncu lacks costs only that run.
H="l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,gpu__time_duration.sum"
W="l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"
# B: the hardware count split by operation class (names as printed by ncu on sm_90 in
# NVIDIA/Fuser#3499): whether cp.async (ldgsts), atomics or "misc" carry conflicts of their own.
B="l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldgsts.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_misc.sum"
S="smsp__sass_inst_executed_op_ldsm.sum,smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum,smsp__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum,smsp__sass_inst_executed_op_global_red.sum"
run() {  # who D kernel-regex
  timeout 150 ncu --kernel-name "$3" --launch-skip 1 --launch-count 1 --metrics "$H" \
      python .scratch/ncu_bwd2d.py $1 $2 > $OUT/bank_hw_$1_$2.txt 2>&1; echo "hw $1 $2 rc=$?"
  timeout 150 ncu --kernel-name "$3" --launch-skip 1 --launch-count 1 --metrics "$W" \
      python .scratch/ncu_bwd2d.py $1 $2 > $OUT/bank_waves_$1_$2.txt 2>&1; echo "waves $1 $2 rc=$?"
  timeout 150 ncu --kernel-name "$3" --launch-skip 1 --launch-count 1 --metrics "$B" \
      python .scratch/ncu_bwd2d.py $1 $2 > $OUT/bank_ops_$1_$2.txt 2>&1; echo "ops $1 $2 rc=$?"
  timeout 150 ncu --kernel-name "$3" --launch-skip 1 --launch-count 1 --metrics "$S" \
      python .scratch/ncu_bwd2d.py $1 $2 > $OUT/bank_sass_$1_$2.txt 2>&1; echo "sass $1 $2 rc=$?"
}
run ours 128 regex:flash_backward_2d
# run ours 64 regex:flash_backward_2d   # (D 64 too, if time allows: about 1 min)
run fa2 128 regex:flash_bwd_dq_dk_dv
grep -h "Metric\|conflicts\|wavefronts\|inst_executed\|duration\|void" $OUT/bank_hw_*.txt $OUT/bank_waves_*.txt $OUT/bank_ops_*.txt $OUT/bank_sass_*.txt | cut -c1-140

timeout 240 ncu --kernel-name regex:flash_backward_2d --launch-skip 1 --launch-count 1 \
    --section SourceCounters -f -o $OUT/bank_src_ours_128 python .scratch/ncu_bwd2d.py ours 128 \
    > $OUT/bank_src_ours_128.log 2>&1; echo "source counters rc=$?"
ncu -i $OUT/bank_src_ours_128.ncu-rep --page source --csv --print-source sass \
    > $OUT/bank_src_ours_128.csv 2>&1; echo "source page rc=$?"
python - "$OUT/bank_src_ours_128.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head_i = next((i for i, r in enumerate(rows) if any("Source" in c for c in r) and len(r) > 5), None)
if head_i is None:
    print("no table in", sys.argv[1]); print("\n".join(",".join(r)[:200] for r in rows[:20])); sys.exit()
head = rows[head_i]
def col(*words):
    return next((i for i, c in enumerate(head) if all(w.lower() in c.lower() for w in words)), None)
src, exc = col("source"), col("shared", "excessive")
wav, ide = col("wavefronts", "shared"), col("shared", "ideal")
print("columns:", [head[i] for i in (src, wav, ide, exc) if i is not None])
tot, hits = 0.0, []
for r in rows[head_i + 1:]:
    if exc is None or len(r) <= exc: continue
    try: e = float(r[exc].replace(",", "") or 0)
    except ValueError: continue
    tot += e
    if e > 0: hits.append((e, r[src] if src is not None else "?", r[wav] if wav is not None else "", r[ide] if ide is not None else ""))
print(f"excessive shared wavefronts, all instructions: {tot:,.0f}")
for e, s, w, i in sorted(hits, reverse=True)[:40]:
    print(f"{e:14,.0f}  wavefronts {w:>14s} ideal {i:>14s}  {s[:90]}")
PY
