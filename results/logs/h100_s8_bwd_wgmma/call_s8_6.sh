#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=.
S=$SECONDS
python -m common.tools.build_all > $OUT/build.log 2>&1; echo "build rc=$? $((SECONDS-S)) s"
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
X="gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__cycles_active.avg,sm__inst_executed_pipe_tensor_op_gmma.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,l1tex__t_requests_pipe_lsu_mem_global_op_red.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for L in wgmma 2d; do
ATTN_BWD_LAYOUT=$L timeout 100 ncu --kernel-name regex:"flash_backward_hopper_kernel|flash_backward_2d_kernel" --launch-skip 1 --launch-count 1 --metrics "$M,$X" python .scratch/ncu_bwdw.py > $OUT/ncu_bwd_m_$L.txt 2>&1; echo "ncu m $L rc=$? $((SECONDS-S)) s"
ATTN_BWD_LAYOUT=$L timeout 150 ncu --kernel-name regex:"flash_backward_hopper_kernel|flash_backward_2d_kernel" --launch-skip 1 --launch-count 1 --set full --import-source no python .scratch/ncu_bwdw.py > $OUT/ncu_bwd_$L.txt 2>&1; echo "ncu full $L rc=$? $((SECONDS-S)) s"
done
python - <<'PY'
import re, os
vals = {}; names = ("wgmma", "2d")
for w in names:
    for line in open(f"{os.environ['OUT']}/ncu_bwd_m_{w}.txt"):
        m = re.match(r"\s+(\S+)\s+(\S+)?\s+([\d,.]+)$", line)
        if m: vals.setdefault(m.group(1), {})[w] = float(m.group(3).replace(",", ""))
for k, v in sorted(vals.items()):
    if max(v.values()) > 0.02: print(f"{k.replace('smsp__average_warps_issue_stalled_','stall_').replace('_per_issue_active.ratio','')[:70]:70s}", " ".join(f"{v.get(n,0):12.4g}" for n in names))
PY
grep -E "^\s+void|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Warp Cycles Per Issued|Issue Slots Busy" $OUT/ncu_bwd_wgmma.txt | head -12 | cut -c1-200
