#!/bin/bash
# Several GPUs in one process (issue 9, item 1) on the nvidia-h200-x2 machine (2 H200), one call:
#   1. build (sm_90, MPI when found) into build-gpu-mgpu
#   2. the CPU suite (all but suite gpu) and the GPU suites: test_mgpu (2 GPUs vs the CPU
#      engine, every output, failures leave no file) and test_gpu_engine (q <= 12, with 2 GPUs
#      visible: the default context now sees both)
#   3. qk-mgpu-bench: 1 GPU vs 2 GPUs, zz reps=2, K on the devices: 8 features n=65536 and
#      12 features n=32768; K to a .npy file: 8 features n=65536 (no_sync; the dd floor of the
#      same directory beside it); per-GPU finish times (balance)
#   4. the same file job with qk-gram --gpus 0 / --gpus 0,1, and bench/mpi_scaling.py: qk-gram
#      (default: every GPU, so 2 in one process) against mpirun -n 2 qk-gram-mpi (one GPU per
#      rank: node-local rank -> device), the "2 ranks within 5% of 2 GPUs in one process" target
# Every section runs on its own (a failure is logged and the script goes on); the exit status
# is non-zero when any section failed. Logs and JSON under $OUT (default /tmp/out).
# Run from the repository root: OUT=... bash bench/run_mgpu_gpu.sh
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=${B:-build-gpu-mgpu}
DIR=${DIR:-/tmp/qk_mgpu}; mkdir -p "$DIR"
REPS=${REPS:-5}
FAILED=""
section() {   # section NAME CMD...: runs CMD with set -e in a subshell, log in $OUT/NAME.log
  local name=$1; shift
  echo "== $name: $*"
  ( set -e; "$@" ) >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc $rc ($OUT/$name.log)"; tail -n 25 "$OUT/$name.log" | sed 's/^/   | /'
  [ $rc -eq 0 ] || FAILED="$FAILED $name"
  return 0
}
{
  date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m || true
  nvcc --version | tail -1; nproc; free -g | head -2; df -h "$DIR" | tail -1; mpirun --version 2>/dev/null | head -1
  git rev-parse HEAD 2>/dev/null | tee "$OUT/commit.txt" || true
} 2>&1 | tee "$OUT/machine.log"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

build() {
  rm -rf "$B"
  meson setup "$B" . -Dgpu_arch=90 -Dmpi=auto
  ninja -C "$B"
}
section build build

cpu_suite() { timeout 600 meson test -C "$B" --no-rebuild --no-suite gpu --print-errorlogs; }
section cpu_suite cpu_suite

gpu_mgpu() { timeout 600 "$B/tests/test_mgpu" "$DIR"; }
section gpu_mgpu gpu_mgpu

gpu_engine() { timeout 900 "$B/tests/test_gpu_engine" 12; }
section gpu_engine gpu_engine

# 3. 1 GPU vs 2 GPUs in one process
bench_case() {   # label gpus features n output
  "$B/bench/qk-mgpu-bench" --label "$1" --gpus "$2" --features "$3" --n "$4" --output "$5" --reps "$REPS" \
      --out "$DIR/K_bench.npy" | tee "$OUT/bench_$1.txt"
  grep '^json: ' "$OUT/bench_$1.txt" | sed 's/^json: //' >> "$OUT/mgpu_bench.jsonl"
}
rm -f "$OUT/mgpu_bench.jsonl"
section bench_zz8_device_1gpu  bench_case zz8_device_1gpu  0   8 65536 device
section bench_zz8_device_2gpu  bench_case zz8_device_2gpu  0,1 8 65536 device
section bench_zz12_device_1gpu bench_case zz12_device_1gpu 0   12 32768 device
section bench_zz12_device_2gpu bench_case zz12_device_2gpu 0,1 12 32768 device
dd_floor() {   # the directory's write speed for the file case's size (17.2 GB fp32 K)
  sync; dd if=/dev/zero of="$DIR/dd.bin" bs=64M count=256 conv=fdatasync 2>&1 | tail -1
  dd if=/dev/zero of="$DIR/dd.bin" bs=64M count=256 2>&1 | tail -1   # page cache only (no_sync's floor)
  rm -f "$DIR/dd.bin"
}
section dd_floor dd_floor
section bench_zz8_npy_1gpu bench_case zz8_npy_1gpu 0   8 65536 npy
section bench_zz8_npy_2gpu bench_case zz8_npy_2gpu 0,1 8 65536 npy
section bench_zz8_host_1gpu bench_case zz8_host_1gpu 0   8 32768 host
section bench_zz8_host_2gpu bench_case zz8_host_2gpu 0,1 8 32768 host

# 4. the file job end to end: qk-gram on 1 and 2 GPUs, 2 MPI ranks of one GPU each
cli_file() {
  python3 -c "import numpy as np; np.save('$DIR/X8.npy', np.random.default_rng(1).uniform(0, np.pi, (65536, 8)))"
  for g in 0 0,1; do
    echo "-- qk-gram --gpus $g"
    "$B/examples/qk-gram" --map "zz(reps=2)" --x "$DIR/X8.npy" --out "$DIR/K_cli.npy" --device cuda --gpus $g --no-sync
    rm -f "$DIR/K_cli.npy"
  done
}
section cli_file cli_file
mpi_file() {
  test -x "$B/examples/qk-gram-mpi" || { echo "no qk-gram-mpi (MPI not found at build)"; exit 1; }
  python3 bench/mpi_scaling.py --build "$B" --device cuda --ranks 2 --cases zz8:65536 --dir "$DIR" \
      --json "$OUT/mpi_scaling.json" --mpirun "$(command -v mpirun)"
}
section mpi_file mpi_file

python3 - "$OUT/mgpu_bench.jsonl" <<'PY' 2>&1 | tee "$OUT/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
by = {r["label"]: r for r in rows}
for case in ["zz8_device", "zz12_device", "zz8_npy", "zz8_host"]:
    a, b = by.get(case + "_1gpu"), by.get(case + "_2gpu")
    if a and b:
        print("%-12s 1 GPU %.4f s, 2 GPUs %.4f s: %.3fx (target 1.85x device / 1.8x file); 2-GPU finish %s, slowest/mean %.4f%s"
              % (case, a["median_s"], b["median_s"], a["median_s"] / b["median_s"], b["gpu_finish_s"], b["slowest_over_mean"],
                 " (full rows)" if b.get("full_rows") else ""))
PY
echo "failed sections:${FAILED:- none}" | tee -a "$OUT/summary.txt"
[ -z "$FAILED" ]
