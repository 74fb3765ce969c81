# Sourced by the device-run scripts (bench/run_*.sh) from the repo root: pipefail, $OUT (default
# /tmp/out, created), the job header every log starts with and the one build of the GPU targets.
#   qk_gpu_header            date, GPU name and driver, nvcc version, $COMMIT
#   qk_gpu_build DIR T...    meson setup DIR (sm_90, no Python, no profiler) and ninja targets T;
#                            the build log goes to $OUT/build.log; prints "build rc N"
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
qk_gpu_header()
{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    nvcc --version | tail -1
    echo "commit $COMMIT"
}
qk_gpu_build()
{
    local dir=$1
    shift
    meson setup "$dir" . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false >/dev/null && ninja -C "$dir" "$@" >"$OUT/build.log" 2>&1
    echo "build rc $?"
}
