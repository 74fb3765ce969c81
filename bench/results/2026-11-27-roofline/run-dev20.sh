#!/bin/bash
# device run 20: the wgmma epilogue's stores as streaming (st.global.cs) (v1), and with a 5-stage B ring in the
# persistent fp16 kernel (v2), against HEAD: tc7,tc8 alternated
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
mkdir -p $OUT/l /tmp/v1 /tmp/v2 && tar -xf .peer/v1.tar -C /tmp/v1 && tar -xf .peer/v2.tar -C /tmp/v2
OPTS="-Dgpu_arch=90 -Dpython=disabled -Dprofiler=false"
T0=$(date +%s)
( [ -f ba/build.ninja ] || meson setup ba $OPTS > /dev/null 2>&1; meson compile -C ba qk-bench > $OUT/l/build_a.log 2>&1; echo "HEAD build rc $?" ) &
for v in v1 v2; do ( cd /tmp/$v && meson setup b $OPTS > /dev/null 2>&1 && meson compile -C b qk-bench > $OUT/l/build_$v.log 2>&1; echo "$v build rc $?" ) & done
wait
echo "builds $(( $(date +%s) - T0 )) s"; cat .peer/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
QA=$(find ba -name qk-bench -type f | head -1)
for r in 1 2; do for v in a v1 v2; do
  Q=$([ $v = a ] && echo $QA || find /tmp/$v/b -name qk-bench -type f | head -1)
  timeout 100 $Q --cases tc7,tc8 --json $OUT/l/$v-$r.json > $OUT/l/$v-$r.log 2>&1; echo "$v r$r rc $?"
  grep -E "cfg=4" $OUT/l/$v-$r.log | grep Gpairs | sed -E "s/ +\| out.*//; s/ +device +/ /; s/ +gram +/ /"
done; done
echo "total $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf res.tgz l && rm -rf l
