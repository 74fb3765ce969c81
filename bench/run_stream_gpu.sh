#!/bin/bash
# One device call for the whole-job work (issue 8): build (sm_90), the CPU suites, the GPU engine
# suite (streamed output included), qk-bench on the output paths and the engine cases beside the
# peer, then the user's whole job (bench/whole_job.py: qk-gram vs torch_e2e.py, dd floor, peak
# RSS) and one profiled qk-gram. Logs under $OUT. Run from the repo root with the peers in .peer/.
# Environment: QMAX (GPU suite qubits, default 12), CASES (qk-bench), ROWS / BIG (whole_job.py).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
QMAX=${QMAX:-12}; CASES=${CASES:-zz4,zz8,zz12,hea12,host8,e2e8,e2e6}
ROWS=${ROWS:-zz6:40000,zz8:20000,zz10:24000,hea10:20000}; BIG=${BIG:-zz6:80000}
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; nproc; free -g | head -2; df -h /tmp | tail -1
  git rev-parse HEAD 2>/dev/null > bench/commit.txt || true
  B=/tmp/bs; rm -rf $B
  meson setup $B . -Dgpu_arch=90 >/dev/null && ninja -C $B >$OUT/build.log 2>&1; echo "build rc $?"
  timeout 150 meson test -C $B --no-rebuild --no-suite gpu --print-errorlogs >$OUT/meson-test.log 2>&1
  echo "meson test (all but suite gpu) rc $?"; grep -E "Ok:|Fail:|Skipped:| FAIL" $OUT/meson-test.log
  timeout 200 $B/tests/test_gpu_engine $QMAX >$OUT/test_gpu.log 2>&1; echo "gpu engine suite (q<=$QMAX) rc $?"; grep -E "FAIL|checks|stream" $OUT/test_gpu.log | head -20
  timeout 150 $B/bench/qk-bench --json $OUT/bench.json --commit bench/commit.txt --cases $CASES; echo "bench rc $?"
  timeout 60 python3 .peer/torch_qk.py --cases zz:4:32768,zz:8:32768,zz:12:16384 --json $OUT/peer.json 2>&1 | tail -4
  python3 bench/qk_bench_report.py $OUT/bench.json $OUT/peer.json
  timeout 240 python3 bench/whole_job.py --qk-gram $B/examples/qk-gram --peer .peer/torch_e2e.py --rows $ROWS --big "$BIG" --json $OUT/whole_job.json; echo "whole job rc $?"
  python3 -c "import numpy as np; np.save('/tmp/x8.npy', np.random.default_rng(3).uniform(0, 6.28, (20000, 8)))"
  $B/examples/qk-gram --map "zz(reps=2)" --x /tmp/x8.npy --out /tmp/K8.npy --precision fp32 --device cuda \
      --profile $OUT/qkgram-profile.txt --progress; echo "qk-gram profiled rc $?"
  head -40 $OUT/qkgram-profile.txt
} 2>&1 | tee $OUT/stream.log
