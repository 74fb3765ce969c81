#!/bin/bash
# The MPS path on the GPU (issue 13, docs/mps.md): build (sm_90) into build-gpu-mpsgpu, the CPU MPS
# tests, the GPU MPS test (GPU K against the CPU MPS K: fp64 1e-10, fp32 2e-6 + 5e-7 q chi), then
# bench/mps_bench --device cuda (100 q n=4096 fp32, 165 q n=6400, 784 q n=1000, 1000 q n=1024,
# cuTN-QSVM's make_bsp circuit at 784 q, fp64, bond 8 / 16, and the statevector crossover at
# q = 8..20, n = 2048). Logs and JSON under $OUT; exits non-zero when a step fails.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=build-gpu-mpsgpu
rc=0
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1; nproc
  git rev-parse HEAD 2>/dev/null
  [ -d $B ] || meson setup $B . -Dgpu_arch=90 >/dev/null
  ninja -C $B >$OUT/build.log 2>&1; echo "build rc $?"
  timeout 300 meson test -C $B --no-rebuild --print-errorlogs mps planner >$OUT/meson-cpu.log 2>&1; r=$?; echo "cpu mps tests rc $r"; [ $r = 0 ] || rc=1
  grep -E "Ok:|Fail:|Skipped:" $OUT/meson-cpu.log
  timeout 900 $B/tests/test_mps_gpu >$OUT/test_mps_gpu.log 2>&1; r=$?; echo "gpu mps test rc $r"; [ $r = 0 ] || rc=1
  grep -E "FAIL|largest|checks" $OUT/test_mps_gpu.log | head -40
  timeout 1200 $B/bench/mps_bench --device cuda >$OUT/mps_gpu_bench.json 2>$OUT/mps_gpu_bench.err; r=$?; echo "bench rc $r"; [ $r = 0 ] || rc=1
  cat $OUT/mps_gpu_bench.err | tail -5
  python3 - $OUT/mps_gpu_bench.json <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("bench JSON unreadable:", e); sys.exit(0)
print("%-28s %5s %6s %-11s %-5s %9s %9s %10s %5s" % ("map", "q", "n", "path", "prec", "wall_s", "build_s", "gpu_ms", "bond"))
for c in d["cases"]:
    print("%-28s %5d %6d %-11s %-5s %9.3f %9.3f %10.1f %5d" % (c["map"][:28], c["qubits"], c["n"], c["path"], c["precision"],
          c["wall_s"], c["mps_build_s"], c["gpu_gram_ms"], c["bond"]))
PY
} 2>&1 | tee $OUT/mpsgpu.log
grep -q "rc [1-9]" $OUT/mpsgpu.log && rc=1
exit $rc
