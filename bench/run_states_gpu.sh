#!/bin/bash
# The structured state pass (issue 11 item 2) on the GPU machine: the GPU suite at the multi-pass
# sizes against the CPU engine, compute-sanitizer over single qk-gram jobs that run the new kernel
# (fp32 and fp64, one and two passes), and the zz16 / zz20 states before (OLD: a tree of the
# previous commit) and after, the PyTorch peer beside. Logs under $OUT; run from the repo root.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
OLD=${OLD:-}
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  echo "commit $(cat bench/commit.txt 2>/dev/null)"
  (meson setup /tmp/bn . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false >/dev/null &&
   ninja -C /tmp/bn bench/qk-bench tests/test_gpu_engine examples/qk-gram >$OUT/build-new.log 2>&1; echo "new build rc $?") &
  if [ -n "$OLD" ]; then
    (meson setup /tmp/bo $OLD -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false >/dev/null &&
     ninja -C /tmp/bo bench/qk-bench >$OUT/build-old.log 2>&1; echo "old build rc $?") &
  fi
  wait
  B=/tmp/bn
  QK_TEST_SEED=$RANDOM timeout 400 $B/tests/test_gpu_engine 20 0 ${QS:-8,12,13,14,15,16,17,18,20} > $OUT/test_gpu.log 2>&1
  echo "suite q=${QS:-8,12,13,14,15,16,17,18,20} rc $? : $(grep -E 'checks, ' $OUT/test_gpu.log)"
  grep -E "FAIL|^errq" $OUT/test_gpu.log | head -24
  if [ -n "$NCU" ]; then
    timeout 200 ncu --kernel-name regex:"qk__k_prep|qk__k_pass" --launch-count 3 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section LaunchStats --section InstructionStats \
      $B/bench/qk-bench --cases zz16 --reps 1 > $OUT/ncu-states.txt 2>&1; echo "ncu rc $?"
    grep -E "  void qk__k_|Duration|SM Frequency|Compute \(SM\) Throughput|DRAM Throughput|Issued Warp|Not Predicated|Executed Instructions  " $OUT/ncu-states.txt | head -40
  fi
  python3 -c "import numpy as np; r=np.random.default_rng(7); np.save('/tmp/x13.npy', r.random((12,13))*6.28); np.save('/tmp/x16.npy', r.random((6,16))*6.28)"
  for t in memcheck racecheck initcheck synccheck; do
    for c in ${SAN_CASES:-"x13.npy fp32" "x16.npy fp32" "x13.npy fp64"}; do
      set -- $c
      timeout 240 compute-sanitizer --tool $t --error-exitcode 9 $B/examples/qk-gram --x /tmp/$1 --map 'zz(reps=2)' \
        --device cuda --precision $2 --out /tmp/K-$t.npy > $OUT/san.tmp 2>&1
      echo "$t $1 $2 rc $? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san.tmp | tr '\n' ' ')"; rm -f $OUT/san.tmp
    done
  done
  for b in new old; do
    [ $b = old ] && [ -z "$OLD" ] && continue
    bb=/tmp/b${b:0:1}
    for r in 1 2; do
      timeout 200 $bb/bench/qk-bench --json $OUT/bench-$b-$r.json --commit bench/commit.txt --cases zz16,zz20 | grep -E "^zz"
    done
  done
  timeout 200 python3 .peer/torch_qk.py --cases zz:16:4096 --json $OUT/peer.json | tail -3
} 2>&1 | tee $OUT/states.log
