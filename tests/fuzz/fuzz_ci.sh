#!/usr/bin/env bash
# The seven libFuzzer targets (tests/fuzz/fuzz_*.c) for a short budget each, for CI (.ci/run): each is
# built with clang -fsanitize=fuzzer,address,undefined and run for SECONDS (-max_total_time)
# from its seeds (the target's own, written by its -DQK_FUZZ_STANDALONE build, or
# tests/fuzz/fuzz_tune_json_seeds) and its dictionary. Exit 1 on a finding (a crash, an oracle
# failure, a sanitizer report, a leak, an input slower than 10 s): its input is kept under
# WORKDIR/artifacts and printed in hex. Skipped (exit 0, a message) where clang or libFuzzer is
# missing. Longer runs: docs/api.md "Fuzzing".
#
# usage: tests/fuzz/fuzz_ci.sh [SECONDS [WORKDIR]]    (defaults 25 and build-fuzz; FUZZ_CC=clang,
#        FUZZ_TARGETS="map_parse ..." a subset)
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-25}
work=${2:-build-fuzz}
cc=${FUZZ_CC:-clang}
targets=${FUZZ_TARGETS:-map_parse npy_read csv_read weights qk_gram_args tune_json prof_advice}
san="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all"

if ! command -v "$cc" >/dev/null 2>&1; then
    echo "fuzz: skipped: $cc not found (apt-get install clang brings libFuzzer)"
    exit 0
fi
rm -rf "$work"
mkdir -p "$work/artifacts"
printf '#include <stddef.h>\nint LLVMFuzzerTestOneInput(const unsigned char *d, size_t n) { (void)d; (void)n; return 0; }\n' \
    > "$work/probe.c"
if ! "$cc" $san "$work/probe.c" -o "$work/probe" >"$work/probe.log" 2>&1; then
    echo "fuzz: skipped: $cc cannot build a libFuzzer target (libclang_rt.fuzzer missing?):"
    sed 's/^/  /' "$work/probe.log" | head -5
    exit 0
fi

# build: the libFuzzer targets and the seed writers, nproc at a time
jobs=$(nproc 2>/dev/null || echo 2)
# the seed writer: the meson build's fuzz_<name>_smoke where it exists (FUZZ_SMOKE_DIR, default
# build/tests/fuzz: .ci/run has just built it), else a -DQK_FUZZ_STANDALONE build of its own
smoke=${FUZZ_SMOKE_DIR:-build/tests/fuzz}
seeder() { if [ -x "$smoke/fuzz_$1_smoke" ]; then echo "$smoke/fuzz_$1_smoke"; else echo "$work/seeds_$1"; fi; }
build() {   # build TARGET
    local t=$1 def=""
    [ "$t" = tune_json ] && def=-DQK_TUNE_CACHE
    "$cc" -g -O1 $san $def -I. "tests/fuzz/fuzz_$t.c" -lm -pthread -o "$work/fuzz_$t" >"$work/build_$t.log" 2>&1 &&
    if [ "$t" != tune_json ] && [ ! -x "$smoke/fuzz_${t}_smoke" ]; then
        "$cc" -O0 -DQK_FUZZ_STANDALONE -I. "tests/fuzz/fuzz_$t.c" -lm -pthread -o "$work/seeds_$t" >>"$work/build_$t.log" 2>&1
    fi
}
t0=$SECONDS
pids=()
for t in $targets; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
    build "$t" & pids+=("$!")
done
fail=0
i=0
for t in $targets; do
    if ! wait "${pids[$i]}"; then echo "fuzz: building fuzz_$t failed:"; cat "$work/build_$t.log"; fail=1; fi
    i=$((i + 1))
done
[ "$fail" = 0 ] || exit 1
echo "fuzz: $(echo $targets | wc -w) targets built in $((SECONDS - t0)) s; running each for $secs s"

# run, nproc at a time (the budget is wall time each)
run() {   # run TARGET
    local t=$1 seeds dict=()
    mkdir -p "$work/corpus_$t" "$work/seeds_dir_$t"
    if [ "$t" = tune_json ]; then seeds=tests/fuzz/fuzz_tune_json_seeds
    else "$(seeder "$t")" --write-seeds "$work/seeds_dir_$t" >/dev/null; seeds=$work/seeds_dir_$t; fi
    [ -f "tests/fuzz/fuzz_$t.dict" ] && dict=(-dict="tests/fuzz/fuzz_$t.dict")
    "$work/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 ${dict[@]+"${dict[@]}"} \
        -close_fd_mask=1 -print_final_stats=1 -artifact_prefix="$work/artifacts/${t}-" \
        "$work/corpus_$t" "$seeds" >"$work/run_$t.log" 2>&1
}
t0=$SECONDS
pids=()
for t in $targets; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
    run "$t" & pids+=("$!")
done
i=0
for t in $targets; do
    if wait "${pids[$i]}"; then
        echo "fuzz_$t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$work/run_$t.log" | grep -o '[0-9]*$') runs, no finding"
    else
        echo "fuzz_$t: FINDING (log $work/run_$t.log):"
        # the report from its first line (a sanitizer's, an oracle's, libFuzzer's), shadow bytes left out
        sed -n '/ERROR\|runtime error\|failed\|Test unit written/,$p' "$work/run_$t.log" |
            grep -v '^ *0x[0-9a-f]*: \|^Shadow\|^  [A-Z][A-Za-z ]*: *[0-9a-f ]*$\|^stat::' | head -60
        for a in "$work/artifacts/${t}-"*; do
            [ -f "$a" ] || continue
            echo "input $a:"
            od -An -c "$a" | head -20
        done
        fail=1
    fi
    i=$((i + 1))
done
echo "fuzz: run in $((SECONDS - t0)) s"
exit "$fail"
