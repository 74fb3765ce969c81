#!/bin/bash
# run 104 (H200 x2): the GPU pool with the caller's yields (HEAD, "spin") against a thread per GPU and call
# (5f3a40c, "base"), alternated, every output: K on the devices, pinned host, pageable host (split forced), .npy in /dev/shm
set -u
pip install -q --no-index --find-links .peer/whl --target /tmp/ms meson ninja >/dev/null 2>&1
export PATH=/tmp/ms/bin:$PATH PYTHONPATH=/tmp/ms
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
W=/tmp/w104; mkdir -p $W /tmp/s_base
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
tar xzf .peer/base-5f3a40c.tgz -C /tmp/s_base
(cd /tmp/s_base && meson setup /tmp/b_base . $OPTS && ninja -C /tmp/b_base bench/qk-mgpu-bench) > $W/build-base.log 2>&1 &
(meson setup /tmp/b_spin . $OPTS && ninja -C /tmp/b_spin bench/qk-mgpu-bench) > $W/build-spin.log 2>&1 &
wait; echo "builds $(el) s: $(tail -qn1 $W/build-*.log | tr '\n' ' ')"
mkdir -p /dev/shm/qk
for r in 1 2 3; do
  for t in spin base; do
    MB=/tmp/b_$t/bench/qk-mgpu-bench
    line="$r $t:"
    for c in "dev 0" "dev 0,1" "pin 0" "pin 0,1" "split 0,1" "npy 0" "npy 0,1" "dev65 0" "dev65 0,1"; do
      set -- $c
      case $1 in
        dev) a="--output device --n 32768";; dev65) a="--output device --n 65536";;
        pin) a="--output host --pinned --n 32768";; split) a="--output host --split yes --n 32768";;
        npy) a="--output npy --out /dev/shm/qk/K.npy --n 32768";;
      esac
      timeout 60 $MB --features 8 --precision auto --gpus $2 --reps 15 $a --label "$1_g$2" > $W/mgpu-$t-$1-$2-$r.log 2>&1
      line="$line $1/g$2 $(grep -o '"median_s": [0-9.e-]*' $W/mgpu-$t-$1-$2-$r.log | cut -d' ' -f2)"
      rm -f /dev/shm/qk/K.npy
    done
    echo "$line"
  done
done
echo "total $(el) s"
cd $W && tar czf $OUT/run104.tgz .
