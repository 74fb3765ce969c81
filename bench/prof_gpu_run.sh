#!/bin/sh
# The profiler's GPU session in one command (device machine): build for sm_90, run the prof test
# suite (GPU tests included), the transport example (trace + HTML + report) and both overhead
# benches. Everything lands in OUT_DIR (8 files).
#   sh bench/prof_gpu_run.sh OUT_DIR COMMIT
set -u
out=$1
commit=$2
log=$out/run.log
drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -1; } > "$log" 2>&1
meson setup /tmp/b-prof . -Dgpu_arch=90 -Dbuildtype=release >> "$log" 2>&1 && ninja -C /tmp/b-prof >> "$log" 2>&1 || { echo "build failed" >> "$log"; tail -30 "$log"; exit 1; }
meson test -C /tmp/b-prof --suite prof --print-errorlogs >> "$log" 2>&1; echo "meson test rc $?" >> "$log"
cp /tmp/b-prof/meson-logs/testlog.txt "$out/testlog.txt"
/tmp/b-prof/examples/transport_loop 300 "$out/transport_trace.json" "$out/transport_report.html" "$out/transport_report.txt" >> "$log" 2>&1
echo "transport_loop rc $?" >> "$log"
python3 tests/prof_trace_check.py --min-gpu-lanes 3 "$out/transport_trace.json" >> "$log" 2>&1
/tmp/b-prof/bench/prof_overhead_cuda "$out/prof_overhead_cuda.json" "$commit" "$drv" >> "$log" 2>&1
/tmp/b-prof/bench/prof_overhead "$out/prof_overhead_cpu.json" "$commit" 1 >> "$log" 2>&1
/tmp/b-prof/bench/prof_overhead "$out/prof_overhead_cpu_nopre.json" "$commit" 0 >> "$log" 2>&1
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped):" "$log"
tail -28 "$log"
