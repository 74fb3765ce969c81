#!/bin/bash
# device run 17 (H100): issue 26's table with floors (roof + peer) on HEAD; Nsight Compute of the 4-qubit
# few-qubit tensor-core kernel, HEAD vs the TMA-box variant; small,zz4 of both
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
mkdir -p $OUT/l /tmp/var && tar -xf .peer/variant.tar -C /tmp/var
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
T0=$(date +%s)
( meson setup ba $OPTS > /dev/null 2>&1 && meson compile -C ba qk-bench > $OUT/l/build_a.log 2>&1; echo "HEAD build rc $?" ) &
( cd /tmp/var && meson setup bv $OPTS > /dev/null 2>&1 && meson compile -C bv qk-bench > $OUT/l/build_v.log 2>&1; echo "variant build rc $?" ) &
wait
echo "builds $(( $(date +%s) - T0 )) s"; cat .peer/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
QA=$(find ba -name qk-bench -type f | head -1); QV=$(find /tmp/var/bv -name qk-bench -type f | head -1)
COMMIT=$(cut -d' ' -f2 .peer/commit | tr -d ';') B=ba CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 280 bash bench/run.sh gpu-bench $OUT/roof > $OUT/roof.txt 2>&1; echo "roof rc $?"
cat $OUT/roof/roofline.md
echo "roof done $(( $(date +%s) - T0 )) s"
for r in 1 2; do
  timeout 60 $QA --cases small --json $OUT/l/a$r.json > $OUT/l/a$r.log 2>&1; echo "HEAD r$r rc $?"
  timeout 60 $QV --cases small --json $OUT/l/v$r.json > $OUT/l/v$r.log 2>&1; echo "variant r$r rc $?"
done
for f in a1 v1 a2 v2; do echo "== $f"; grep -E "write floor|Gpairs/s" $OUT/l/$f.log | grep -E "floor|cfg=8" | sed -E "s/ +\| out.*//; s/ +device +/ /; s/ +gram +/ /"; done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
if [ -n "$NCU" ]; then
  for v in a v; do Q=$([ $v = a ] && echo $QA || echo $QV)
    timeout 120 $NCU -k regex:qk__k_gram_small_tc -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats $Q --cases zz4 --reps 1 > $OUT/l/ncu_$v.txt 2>&1; echo "ncu $v rc $?"
  done
  for v in a v; do echo "== ncu $v"; grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|Issued Ipc|No Eligible|Stall|Achieved Occupancy|Block Limit|Registers Per|Shared Memory Config|Dynamic Shared|Executed Ipc|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Pipe" $OUT/l/ncu_$v.txt | head -40; done
fi
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf res.tgz l roof roof.txt && rm -rf l roof
