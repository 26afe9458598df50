#!/bin/bash
export ATTN_COMMIT=$(cat .scratch/commit_id) PYTHONPATH=.
S=$SECONDS
[ -d build ] || true
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
X="gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__grid_size,launch__registers_per_thread,sm__cycles_active.avg,sm__cycles_elapsed.avg,sm__cycles_active.max,sm__cycles_active.min,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
for w in dense keyfull winfull varlen leftpad dense16k window; do
  timeout 60 ncu --kernel-name regex:flash_attention_hopper_kernel --nvtx --nvtx-include "profile/" --launch-count 1 --metrics "$M,$X" python .scratch/ncu_variants.py $w > $OUT/ncu_var_$w.txt 2>&1; echo "ncu $w rc=$?"
done
python - <<'PY'
import re, os
vals = {}; names = ("dense", "keyfull", "winfull", "varlen", "leftpad", "dense16k", "window")
for w in names:
    for line in open(f"{os.environ['OUT']}/ncu_var_{w}.txt"):
        m = re.match(r"\s+(\S+)\s+(\S+)\s+([\d,.]+)$", line)
        if m: vals.setdefault(m.group(1), {})[w] = float(m.group(3).replace(",", ""))
print(f"{'metric':58s}", " ".join(f"{n:>12s}" for n in names))
for k, v in sorted(vals.items()):
    if max(v.values()) > 0.05: print(f"{k.replace('smsp__average_warps_issue_stalled_','stall_').replace('_per_issue_active.ratio','')[:58]:58s}", " ".join(f"{v.get(n,0):12.4g}" for n in names))
PY
grep -m3 "flash_attention_hopper_kernel" $OUT/ncu_var_varlen.txt | cut -c1-200
