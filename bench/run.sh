#!/bin/bash
# bench/run.sh CASESET [OUTDIR]: the one benchmark driver (docs/benchmarks.md, "How to run").
# Run from the repository root, on the machine the case set names (GPU sets: a CUDA machine with
# nvcc and nvidia-smi; cpu-bench: any). It builds what the case set needs into one build dir
# ($B, default build-run-CASESET, gitignored), runs it, and writes the logs and JSON under OUTDIR
# (default $OUT, else /tmp/out). Every case set writes OUTDIR/run.log, which starts with the job
# header (date, GPU name and driver or CPU model, nvcc version, commit). The exit status is non-zero
# when the build or any step failed; a failed step is logged and the set goes on.
#
#   gpu-suite   tests/gpu/test_gpu_engine at QS (3,8,13,16) qubits against the CPU engine, with the
#               public-API tests (one device, host / device / tiles / .npy outputs, fault paths)
#   gpu-bench   qk-bench CASES (zz4,zz8,zz12,zz16,tc8,amp16: zz16 is the 16-qubit state rate;
#               roof: issue 26's table, each row with its floor and share, the floors measured in
#               the job), the PyTorch peer (bench/.peer/torch_qk.py, PEER_CASES: zz at 4, 8, 12,
#               16 qubits, the roof rows' peers) in the same job, the joined table
#               (qk_bench_report.py; roofline.md where CASES has roof); the peer at TF32 beside
#               tc8 (torch_prec.py)
#   whole-job   qk-gram X.npy -> K.npy, ROWS (zz6:40000,zz8:20000): bench/whole_job.py (wall, peak
#               RSS, dd floor, bench/.peer/torch_e2e.py in the same job), then each row again under
#               /usr/bin/time -v
#   states-job  qk-gram --states A.npy -> K.npy, SROWS (10:40000,14:8000: qubits:n, complex64
#               states): bench/states_job.py, beside a PyTorch job on the same file (wall, peak RSS)
#   sanitizers  compute-sanitizer TOOLS (memcheck racecheck initcheck) over PARTS (small tcblocks planes
#               plan suite jobs; mirror too, by name): the test_gpu_engine parts, the suite at SAN_QS (3,8), single
#               qk-gram jobs (13 / 16 qubits, fp32 / fp64); one log per tool and part
#   cpu-bench   qk-cpu-bench against numpy (bench/cpu_numpy.py), zz reps=2 at 8 qubits n=4096 and
#               10 qubits n=4000, one JSON (CPU machine, no CUDA build)
#   prof        the profiler: meson test --suite prof, examples/transport_loop (trace, HTML, report,
#               3 GPU lanes checked), qk-gram --trace (2 GPU lanes), both overhead benches
#   mgpu        2 GPUs in one process (nvidia-h200-x2 / h100-x2): test_mgpu, qk-mgpu-bench 1 GPU vs
#               2 (device, .npy, host outputs), the dd floor, qk-gram --gpus 0 / 0,1 on a file, and
#               bench/mpi_scaling.py (qk-gram vs mpirun -n 1,2 qk-gram-mpi, K in /dev/shm)
#   prec        precision modes: the GPU suite to QMAX (12) with its per-mode error table, qk-bench
#               prec,probe,tc, qk-gram --precision auto --tol, the peer at fp32 / TF32 / fp16
#   mps-gpu     the MPS path on the GPU: the CPU MPS tests, tests/gpu/test_mps_gpu, mps_bench
#   python-gpu  the Python package with the CUDA engine: tests/python, bench/python_gpu.py (call
#               overhead vs qk-gram; vs qiskit-machine-learning when wheels were carried in .whl/)
#
# Environment: B (build dir), COMMIT (when the tree has no .git; else HEAD, +uncommitted where tracked files differ), PEER (folder of the peer
# scripts, default bench/.peer, else .peer), and the per-set knobs named above.
# Example (device machine): OUT=/tmp/out bash bench/run.sh gpu-bench
set -u -o pipefail

usage() { sed -n '2,/^# Example/p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
SET=$1
OUT=${2:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
B=${B:-build-run-$SET}
PEER=${PEER:-bench/.peer}
[ -d "$PEER" ] || [ ! -d .peer ] || PEER=.peer
FAILED=""
export QK_TEST_SEED=${QK_TEST_SEED:-$RANDOM}

# ---- common ----
header()  # the job header every run.log starts with
{
    date -u
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    else
        echo "cpu $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
    fi
    command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -1
    echo "commit $COMMIT"
    echo "case set $SET, build $B, seed $QK_TEST_SEED, peer $([ -f "$PEER/torch_qk.py" ] && echo "$PEER" || echo none)"
}
if [ -z "${COMMIT:-}" ]; then  # a tree with changes to tracked files says so: its figures are not the commit's
    if COMMIT=$(git rev-parse HEAD 2>/dev/null); then
        git diff --quiet HEAD -- 2>/dev/null || COMMIT="$COMMIT+uncommitted"
    else
        COMMIT=$(cat bench/commit.txt 2>/dev/null || echo unknown)
    fi
fi
echo "$COMMIT" >"$OUT/commit.txt"

build()  # build "MESON OPTIONS" TARGET...: setup $B once, compile the targets; log in build.log
{
    local opts=$1 rc
    shift
    if [ ! -f "$B/build.ninja" ]; then
        # shellcheck disable=SC2086
        meson setup "$B" . $opts >"$OUT/build.log" 2>&1 || { echo "meson setup failed"; tail -20 "$OUT/build.log"; exit 1; }
    else  # a build dir shared by several sets ($B): this set's options
        # shellcheck disable=SC2086
        meson setup --reconfigure "$B" . $opts >"$OUT/build.log" 2>&1 || { echo "meson setup --reconfigure failed"; tail -20 "$OUT/build.log"; exit 1; }
    fi
    meson compile -C "$B" "$@" >>"$OUT/build.log" 2>&1
    rc=$?
    echo "build rc $rc ($*)"
    [ $rc = 0 ] || { grep -iE "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
}
GPU_OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"

bin()  # bin NAME: the path of built target NAME (wherever its meson.build puts it)
{
    python3 - "$B" "$1" <<'PY'
import json, sys
for t in json.load(open(sys.argv[1] + "/meson-info/intro-targets.json")):
    if t["name"] == sys.argv[2]:
        print(t["filename"][0]); break
else:
    sys.exit("no target " + sys.argv[2])
PY
}

step()  # step NAME LIMIT_S CMD...: run CMD with a time limit, output in OUT/NAME.log, rc noted
{
    local name=$1 lim=$2 rc
    shift 2
    timeout "$lim" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "$name rc $rc"
    [ $rc = 0 ] || FAILED="$FAILED $name"
    return $rc
}

peer() { [ -f "$PEER/$1" ]; }

# ---- case sets ----
set_gpu_suite()
{
    build "$GPU_OPTS" test_gpu_engine
    step test_gpu 600 "$(bin test_gpu_engine)" 20 1 "${QS:-3,8,13,16}"
    grep -E "checks, |FAIL" "$OUT/test_gpu.log" | head -20
}

set_gpu_bench()
{
    build "$GPU_OPTS" qk-bench
    step bench 300 "$(bin qk-bench)" --json "$OUT/bench.json" --commit "$OUT/commit.txt" \
        --cases "${CASES:-zz4,zz8,zz12,zz16,tc8,amp16}"
    grep -E "^(zz|tc|amp|hea|host|e2e|small|roof|write floor|   ->|   plan:)" "$OUT/bench.log"
    rm -f "$OUT/peer.json"
    if peer torch_qk.py; then
        step peer 200 python3 "$PEER/torch_qk.py" --cases "${PEER_CASES:-zz:4:32768,zz:8:32768,zz:12:16384,zz:16:4096}" \
            --json "$OUT/peer.json"
        tail -6 "$OUT/peer.log"
        step peer_prec 200 python3 bench/torch_prec.py --peer "$PEER" --cases zz:8:32768 --json "$OUT/peer_prec.json"
    else
        echo "no peer in $PEER: qk alone"
    fi
    # the peer's JSON where it ran (the report reads a missing one as no peer)
    python3 bench/qk_bench_report.py "$OUT/bench.json" "$OUT/peer.json" | tee "$OUT/report.txt"
    case ",${CASES:-}," in
    *,roof,*) python3 bench/qk_bench_report.py --roofline "$OUT/bench.json" "$OUT/peer.json" >"$OUT/roofline.md" ;;
    esac
}

set_states_job()
{
    build "$GPU_OPTS" qk-gram
    step states_job 580 python3 bench/states_job.py --qk-gram "$(bin qk-gram)" --rows "${SROWS:-10:40000,14:8000}" \
        --qk-args "--device cuda --precision fp32" --json "$OUT/states_job.json"
    cat "$OUT/states_job.log"
}

set_whole_job()
{
    build "$GPU_OPTS" qk-gram
    local qkg dir=${DIR:-/tmp/qk_wj} r name n d
    qkg=$(bin qk-gram)
    mkdir -p "$dir"
    step whole_job 580 python3 bench/whole_job.py --qk-gram "$qkg" --peer "$PEER/torch_e2e.py" --dir "$dir" \
        --rows "${ROWS:-zz6:40000,zz8:20000}" --json "$OUT/whole_job.json"
    cat "$OUT/whole_job.log"
    for r in $(echo "${ROWS:-zz6:40000,zz8:20000}" | tr , ' '); do
        name=${r%%:*}; n=${r#*:}; d=${name#zz}
        python3 -c "import numpy as np; np.save('$dir/X.npy', np.random.default_rng(7).uniform(0, 6.28, ($n, $d)))"
        /usr/bin/time -v "$qkg" --map "zz(reps=2)" --x "$dir/X.npy" --out "$dir/K.npy" --device cuda --precision fp32 \
            --quiet 2>"$OUT/time-$name-$n.txt"
        echo "qk-gram $r rc $?: $(grep -E 'Elapsed \(wall|Maximum resident' "$OUT/time-$name-$n.txt" | sed 's/^\s*//' | tr '\n' ' ')"
        rm -f "$dir/K.npy"
    done
}

set_sanitizers()
{
    build "$GPU_OPTS" test_gpu_engine qk-gram
    local t p x pr extra
    local tge qkg
    tge=$(bin test_gpu_engine); qkg=$(bin qk-gram)
    python3 -c "import numpy as np; r = np.random.default_rng(7); np.save('/tmp/qk_x13.npy', r.random((12, 13)) * 6.28); \
np.save('/tmp/qk_x16.npy', r.random((6, 16)) * 6.28)"
    export QK_TEST_UNDER_SANITIZER=1
    for t in ${TOOLS:-memcheck racecheck initcheck}; do
        extra=""; [ "$t" = memcheck ] && extra="--leak-check full"
        # initcheck: cuBLAS's writes of the product buffer C are invisible to it, so every epilogue
        # read of C would be reported; QK_TEST_POISON fills C with NaN before the GEMMs (an
        # initialisation it sees), and K staying finite and within its bound proves the GEMMs
        # overwrote every entry the epilogue reads (docs/gpu.md, "Sanitizers and cuBLAS")
        if [ "$t" = initcheck ]; then export QK_TEST_POISON=1; else unset QK_TEST_POISON; fi
        for p in ${PARTS:-small tcblocks planes plan suite jobs}; do
            case $p in
            small|tcblocks|planes|plan|mirror)  # one part of the GPU suite (QK_TEST_ONLY)
                # shellcheck disable=SC2086
                QK_TEST_ONLY=$p step "san-$t-$p" "${TLIM:-240}" compute-sanitizer --tool "$t" $extra --error-exitcode 9 "$tge" ;;
            suite)  # the suite at a fused and a cuBLAS size, API tests skipped (racecheck is slow)
                # shellcheck disable=SC2086
                step "san-$t-suite" "${TLIM:-240}" compute-sanitizer --tool "$t" $extra --error-exitcode 9 "$tge" 14 0 "${SAN_QS:-3,8}" ;;
            jobs)  # single qk-gram jobs: the structured state pass (one and two passes), fp32 and fp64
                : >"$OUT/san-$t-jobs.log"
                for x in "x13 fp32" "x16 fp32" "x13 fp64"; do
                    set -- $x
                    # shellcheck disable=SC2086
                    timeout "${TLIM:-240}" compute-sanitizer --tool "$t" $extra --error-exitcode 9 "$qkg" --x "/tmp/qk_$1.npy" \
                        --map 'zz(reps=2)' --device cuda --gpus 0 --precision "$2" --out /tmp/qk_K_san.npy >>"$OUT/san-$t-jobs.log" 2>&1
                    pr=$?
                    echo "san-$t-jobs $1 $2 rc $pr"
                    [ $pr = 0 ] || FAILED="$FAILED san-$t-jobs-$1-$2"
                done ;;
            *) echo "unknown part $p (small tcblocks planes plan suite jobs)"; FAILED="$FAILED $p" ;;
            esac
            [ -f "$OUT/san-$t-$p.log" ] && echo "   $(grep -hE 'checks, |ERROR SUMMARY|LEAK SUMMARY|RACECHECK SUMMARY' \
                "$OUT/san-$t-$p.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
        done
    done
}

set_cpu_bench()
{
    build "-Dcuda=disabled -Dpython=disabled -Dprofiler=false" qk-cpu-bench
    local cb c first=1
    cb=$(bin qk-cpu-bench)
    {
        echo "{"
        echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"commit\": \"$COMMIT\","
        echo "  \"cpu\": \"$(lscpu | sed -n 's/^Model name: *//p' | head -1)\", \"cores\": $(nproc),"
        echo "  \"runs\": ["
        for c in ${CPU_CASES:-8:4096 10:4000}; do
            [ $first = 1 ] || echo ","
            first=0
            echo "    $("$cb" "${c%:*}" "${c#*:}"),"
            echo "    $(python3 bench/cpu_numpy.py "${c%:*}" "${c#*:}")"
        done
        echo "  ]"
        echo "}"
    } >"$OUT/cpu_bench.json"
    python3 -m json.tool "$OUT/cpu_bench.json" >/dev/null && echo "cpu_bench rc 0" || { echo "cpu_bench rc 1"; FAILED="$FAILED cpu_bench"; }
    cat "$OUT/cpu_bench.json"
}

set_prof()
{
    build "-Dgpu_arch=90 -Dpython=disabled -Dprofiler=true" transport_loop prof_overhead prof_overhead_cuda qk-gram
    local drv
    drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
    step meson_test_prof 600 meson test -C "$B" --suite prof --print-errorlogs
    grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped):" "$OUT/meson_test_prof.log"
    step transport_loop 120 "$(bin transport_loop)" 300 "$OUT/transport_trace.json" "$OUT/transport_report.html" "$OUT/transport_report.txt"
    step transport_trace_check 60 python3 tests/prof/prof_trace_check.py --min-gpu-lanes 3 "$OUT/transport_trace.json"
    python3 -c "import numpy as np; np.save('/tmp/qk_x8.npy', np.random.default_rng(3).uniform(0, 6.28, (20000, 8)))"
    step qkgram_trace 120 "$(bin qk-gram)" --map "zz(reps=2)" --x /tmp/qk_x8.npy --out /tmp/qk_K8.npy --precision fp32 \
        --device cuda --trace "$OUT/qkgram_trace.json" --profile "$OUT/qkgram_profile.txt"
    rm -f /tmp/qk_K8.npy
    step qkgram_trace_check 60 python3 tests/prof/prof_trace_check.py --min-gpu-lanes 2 "$OUT/qkgram_trace.json"
    step prof_overhead_cuda 120 "$(bin prof_overhead_cuda)" "$OUT/prof_overhead_cuda.json" "$COMMIT" "$drv"
    step prof_overhead_cpu 120 "$(bin prof_overhead)" "$OUT/prof_overhead_cpu.json" "$COMMIT" 1
    step prof_overhead_cpu_nopre 120 "$(bin prof_overhead)" "$OUT/prof_overhead_cpu_nopre.json" "$COMMIT" 0
    tail -12 "$OUT/prof_overhead_cuda.log"
}

set_mgpu()
{
    build "-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false -Dmpi=auto" qk-gram qk-mgpu-bench test_mgpu
    meson compile -C "$B" qk-gram-mpi >>"$OUT/build.log" 2>&1 || echo "no qk-gram-mpi (MPI not found at setup)"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    local dir=${DIR:-/tmp/qk_mgpu} mb c g label
    mkdir -p "$dir"
    nvidia-smi topo -m; mpirun --version 2>/dev/null | head -1; free -g | head -2; df -h "$dir" /dev/shm | tail -2
    step test_mgpu 300 "$(bin test_mgpu)" "$dir"
    tail -3 "$OUT/test_mgpu.log"
    mb=$(bin qk-mgpu-bench)
    rm -f "$OUT/mgpu_bench.jsonl"
    # label features n output [split]: 1 GPU (--gpus 0) against 2 (--gpus 0,1), median of REPS; split: a
    # host-bound K(X,X) dealt to both GPUs as full rows (yes) or run on the first (no)
    for c in "zz8_device 8 65536 device" "zz12_device 12 32768 device" "zz8_npy 8 65536 npy" "zz8_host 8 32768 host" \
             "zz8_hostsplit 8 32768 host yes" "zz8_hostone 8 32768 host no" "zz12_host 12 16384 host"; do
        set -- $c
        for g in 0 0,1; do
            label=$1_$([ $g = 0 ] && echo 1gpu || echo 2gpu)
            step "bench_$label" 200 "$mb" --label "$label" --gpus $g --features "$2" --n "$3" --output "$4" --reps "${REPS:-5}" \
                ${5:+--split "$5"} --out "$dir/K_bench.npy" && grep '^json: ' "$OUT/bench_$label.log" | sed 's/^json: //' >>"$OUT/mgpu_bench.jsonl"
            rm -f "$dir/K_bench.npy"
        done
    done
    {   # the directory's write speed for the file case's size (17.2 GB fp32 K): synced, page cache only
        sync; dd if=/dev/zero of="$dir/dd.bin" bs=64M count=256 conv=fdatasync 2>&1 | tail -1
        dd if=/dev/zero of="$dir/dd.bin" bs=64M count=256 2>&1 | tail -1; rm -f "$dir/dd.bin"
    } | tee "$OUT/dd_floor.log"
    python3 -c "import numpy as np; np.save('$dir/X8.npy', np.random.default_rng(1).uniform(0, np.pi, (65536, 8)))"
    for g in 0 0,1; do
        step "cli_file_gpus_$g" 200 "$(bin qk-gram)" --map "zz(reps=2)" --x "$dir/X8.npy" --out "$dir/K_cli.npy" --device cuda \
            --gpus $g --no-sync
        grep -h "done" "$OUT/cli_file_gpus_$g.log"; rm -f "$dir/K_cli.npy"
    done
    if bin qk-gram-mpi >/dev/null 2>&1 && [ -x "$(bin qk-gram-mpi)" ]; then  # mpi_scaling.py takes both from $B/examples
        mkdir -p /dev/shm/qk_mpis
        step mpi_scaling 400 python3 bench/mpi_scaling.py --build "$B" --device cuda --ranks 1,2 \
            --cases "${MPI_CASES:-zz16:16384,zz12:32768}" --dir /dev/shm/qk_mpis --json "$OUT/mpi_scaling.json"
        tail -6 "$OUT/mpi_scaling.log"; rm -rf /dev/shm/qk_mpis
    fi
    python3 - "$OUT/mgpu_bench.jsonl" <<'PY' | tee "$OUT/summary.txt"
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
by = {r["label"]: r for r in rows}
for case in ["zz8_device", "zz12_device", "zz8_npy", "zz8_host", "zz8_hostsplit", "zz8_hostone", "zz12_host"]:
    a, b = by.get(case + "_1gpu"), by.get(case + "_2gpu")
    if a and b:
        print("%-12s 1 GPU %.4f s, 2 GPUs %.4f s: %.3fx; 2-GPU finish %s, slowest/mean %.4f%s"
              % (case, a["median_s"], b["median_s"], a["median_s"] / b["median_s"], b["gpu_finish_s"], b["slowest_over_mean"],
                 " (full rows)" if b.get("full_rows") else ""))
PY
}

set_prec()
{
    build "$GPU_OPTS" test_gpu_engine qk-bench qk-gram
    local qkg tol
    qkg=$(bin qk-gram)
    step test_gpu 580 "$(bin test_gpu_engine)" "${QMAX:-12}"
    grep -E "checks, |FAIL|^errq" "$OUT/test_gpu.log" | head -40
    step bench 300 "$(bin qk-bench)" --json "$OUT/bench.json" --commit "$OUT/commit.txt" --cases "${CASES:-prec,probe,tc}"
    cat "$OUT/bench.log"
    python3 -c "import numpy as np; np.save('/tmp/qk_x8.npy', np.random.default_rng(3).uniform(0, 6.28, (4001, 8)))"
    for tol in "" 1e-3 1e-2; do
        "$qkg" --map "zz(reps=2)" --x /tmp/qk_x8.npy --out "/tmp/qk_K_auto$tol.npy" --device cuda --precision auto ${tol:+--tol $tol} \
            2>&1 | grep -E "precision|config|engine" | head -4
    done
    python3 -c "
import numpy as np
a = np.load('/tmp/qk_K_auto.npy').astype(float)
for t in ('1e-3', '1e-2'):
    print('qk-gram auto tol %s vs default: max diff %.3g' % (t, abs(a - np.load('/tmp/qk_K_auto%s.npy' % t)).max()))"
    if peer torch_qk.py; then
        step peer_prec 300 python3 bench/torch_prec.py --peer "$PEER" \
            --cases "${PEER_CASES:-zz:8:32768,zz:12:16384,zz:16:4096,hea:12:16384}" --json "$OUT/peer_prec.json"
        tail -12 "$OUT/peer_prec.log"
    fi
}

set_mps_gpu()
{
    build "$GPU_OPTS" test_mps_gpu mps_bench
    step meson_test_mps 300 meson test -C "$B" --print-errorlogs mps planner
    grep -E "Ok:|Fail:|Skipped:" "$OUT/meson_test_mps.log"
    step test_mps_gpu 580 "$(bin test_mps_gpu)"
    grep -E "FAIL|largest|checks" "$OUT/test_mps_gpu.log" | head -20
    timeout 580 "$(bin mps_bench)" --device cuda >"$OUT/mps_gpu_bench.json" 2>"$OUT/mps_bench.log"
    local rc=$?; echo "mps_bench rc $rc"; [ $rc = 0 ] || FAILED="$FAILED mps_bench"
    python3 - "$OUT/mps_gpu_bench.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit("bench JSON unreadable: %s" % e)
print("%-28s %5s %6s %-11s %-5s %9s %9s %10s %5s" % ("map", "q", "n", "path", "prec", "wall_s", "build_s", "gpu_ms", "bond"))
for c in d["cases"]:
    print("%-28s %5d %6d %-11s %-5s %9.3f %9.3f %10.1f %5d" % (c["map"][:28], c["qubits"], c["n"], c["path"], c["precision"],
          c["wall_s"], c["mps_build_s"], c["gpu_gram_ms"], c["bond"]))
PY
}

set_python_gpu()
{
    if ls .whl/*.whl >/dev/null 2>&1; then  # qiskit, qiskit-machine-learning, pennylane carried as wheels
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/qk_site .whl/*.whl \
            && export PYTHONPATH=/tmp/qk_site${PYTHONPATH:+:$PYTHONPATH}
        echo "carried wheels installed: rc $?"
    fi
    python3 -c 'import sys, numpy; print("python", sys.version.split()[0], "numpy", numpy.__version__)'
    build "-Dgpu_arch=90 -Dpython=enabled -Dprofiler=false" qk-gram
    meson compile -C "$B" >>"$OUT/build.log" 2>&1 || { echo "build rc 1 (all)"; exit 1; }
    local pkg
    pkg=$(find "$B" -name __init__.py -path '*/qk/__init__.py' | head -1)  # the built package (its folder's parent)
    pkg=$(dirname "$(dirname "${pkg:-$B/src/python/qk/x}")")
    export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" QK_CACHE_DIR="$B/test-cache"
    python3 -c 'import qk; print("qk", qk.__file__, qk.engine())'
    step meson_test_python 400 meson test -C "$B" --no-rebuild --suite python --print-errorlogs
    grep -E "^ *[0-9]+/[0-9]+ |Ok:|Fail:|Skipped:" "$OUT/meson_test_python.log"
    step python_gpu 400 python3 bench/python_gpu.py "$B" "$OUT/python_gpu.json" "$(bin qk-gram)"
    cat "$OUT/python_gpu.log"
}

# ---- main ----
case $SET in
gpu-suite|gpu-bench|whole-job|states-job|sanitizers|cpu-bench|prof|mgpu|prec|mps-gpu|python-gpu) ;;
*) echo "unknown case set '$SET'"; usage ;;
esac
fn=set_${SET//-/_}
{
    header
    ( "$fn"; echo "failed steps:${FAILED:- none}"; [ -z "$FAILED" ] )
    echo "$SET rc $?"
} 2>&1 | tee "$OUT/run.log"
grep -q "^$SET rc 0$" "$OUT/run.log"
