#!/bin/bash
# run 100 (H200 x2, warm after run 99): issue 26's table with the peer (new), roof16 new/base alternated 3 rounds, whole job
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w100; mkdir -p $W
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
[ -x /tmp/bn/bench/qk-bench ] || { (meson setup /tmp/bn . $OPTS && ninja -C /tmp/bn bench/qk-bench) > $W/build-new.log 2>&1; }
ninja -C /tmp/bn qk-gram > $W/build-qkg.log 2>&1; echo "builds $(el) s"
export CUDA_VISIBLE_DEVICES=0
for r in 1 2 3; do
  for t in new base; do
    B=/tmp/bn; [ $t = base ] && B=/tmp/bb
    [ -x $B/bench/qk-bench ] || continue
    timeout 60 $B/bench/qk-bench --cases roof16 > $W/roof16-$t-$r.log 2>&1
    echo "$t $r: $(grep -E '^roof16 q=16' $W/roof16-$t-$r.log | grep -v 'fp32 ' | sed -E 's/.*(fp32x3|fp16) .*gram +([0-9.]+) ms.*states +([0-9.]+) ms.*/\1 gram \2 states \3/' | tr '\n' ' ')"
  done
done
echo "A/B $(el) s"
B=/tmp/bn COMMIT=5f3a40c CASES=roof PEER_CASES=zz:4:32768,zz:7:32768,zz:8:32768,zz:12:16384,zz:16:4096 timeout 300 bash bench/run.sh gpu-bench $W/roof > $W/roof-run.log 2>&1
echo "roof rc $? $(el) s"; cat $W/roof/roofline.md 2>/dev/null | head -30
left=$(( 560 - $(el) ))
B=/tmp/bn ROWS=zz8:20000,zz12:16384 timeout $left bash bench/run.sh whole-job $W/wj > $W/wj-run.log 2>&1; echo "whole job rc $?"; tail -12 $W/wj/whole_job.log
echo "total $(el) s"
cd $W && tar czf $OUT/run100.tgz .
