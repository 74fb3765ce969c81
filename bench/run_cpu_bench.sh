#!/usr/bin/env bash
# CPU engine vs numpy, same machine, same inputs: bench/run_cpu_bench.sh BUILD_DIR OUT.json
# Cases: zz reps=2 at 8 qubits n=4096 (issue 2) and 10 qubits n=4000.
set -euo pipefail
b=${1:-build}; out=${2:-/dev/stdout}
here=$(cd "$(dirname "$0")" && pwd)
{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"commit\": \"$(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)\","
  echo "  \"cpu\": \"$(lscpu | sed -n 's/^Model name: *//p' | head -1)\", \"cores\": $(nproc),"
  echo "  \"runs\": ["
  first=1
  for c in "8 4096" "10 4000"; do
    set -- $c
    [ $first = 1 ] || echo ","
    first=0
    echo "    $("$b/bench/qk-cpu-bench" "$1" "$2")",
    echo "    $(python3 "$here/cpu_numpy.py" "$1" "$2")"
  done
  echo "  ]"
  echo "}"
} > "$out"
cat "$out"
