#!/bin/bash
# compute-sanitizer over the real paths (issue 14): the GPU suite restricted to one fused (3),
# one cuBLAS (8) and one multi-pass state case (14 qubits, small n), plus the streamed output,
# pageable / fresh host buffers, the tile callback and the fault-injection runs, under memcheck
# (leak check), initcheck, racecheck and synccheck. TOOLS picks the tools; logs under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=${B:-/tmp/bs}; QS=${QS:-3,8,14}; TOOLS=${TOOLS:-memcheck initcheck racecheck synccheck}
[ -x $B/tests/test_gpu_engine ] || { rm -rf $B; meson setup $B . -Dgpu_arch=90 >/dev/null && ninja -C $B >$OUT/build.log 2>&1; }
for t in $TOOLS; do
  extra=""; [ $t = memcheck ] && extra="--leak-check full"
  QK_TEST_UNDER_SANITIZER=1 timeout ${TLIM:-200} compute-sanitizer --tool $t $extra --error-exitcode 9 $B/tests/test_gpu_engine 14 0 $QS > $OUT/san-$t.log 2>&1
  echo "$t rc $? : $(grep -E 'ERROR SUMMARY|LEAK SUMMARY|RACECHECK SUMMARY' $OUT/san-$t.log | tr '\n' ' ') $(grep -E 'checks, ' $OUT/san-$t.log)"
done
