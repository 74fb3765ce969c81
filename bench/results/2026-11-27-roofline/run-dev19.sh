#!/bin/bash
# device run 19 (H200): issue 26's table with floors (roof + peer) on HEAD; Nsight Compute of the persistent fp16 wgmma kernel at 8 q
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
mkdir -p $OUT/l
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
T0=$(date +%s)
meson setup ba $OPTS > /dev/null 2>&1 && meson compile -C ba qk-bench > $OUT/l/build_a.log 2>&1; echo "build rc $? $(( $(date +%s) - T0 )) s"; cat .peer/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
QA=$(find ba -name qk-bench -type f | head -1)
COMMIT=$(cat .peer/commit) B=ba CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 280 bash bench/run.sh gpu-bench $OUT/roof > $OUT/roof.txt 2>&1; echo "roof rc $?"
cat $OUT/roof/roofline.md
echo "roof done $(( $(date +%s) - T0 )) s"
timeout 60 $QA --cases small --json $OUT/l/small.json > $OUT/l/small.log 2>&1; grep -E "write floor|cfg=8" $OUT/l/small.log | grep -E "floor|Gpairs" | sed -E "s/ +\| out.*//"
timeout 150 ncu -k regex:qk__k_wg16p -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats $QA --cases tc8 --reps 1 > $OUT/l/ncu_wg16p.txt 2>&1; echo "ncu rc $?"
grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Registers Per|highest-utilized|Tensor|Achieved Occupancy" $OUT/l/ncu_wg16p.txt | head -20
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf res.tgz l roof roof.txt && rm -rf l roof
