#!/bin/bash
# device run 05: the projected kernel from the CLI and Python on the GPU (merged helper), test_projected_gpu again
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
R=$OUT/r; mkdir -p $R
cat .peer/commit > $R/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt
python3 -c 'import numpy, sys; print(sys.version, numpy.__version__)' >> $R/gpu.txt
python3 -m mesonbuild.mesonmain setup bp -Dgpu_arch=90 -Dpython=enabled -Dcuda=enabled -Dprofiler=false -Dmpi=disabled > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
grep -i "python" $R/setup.log | tail -3
timeout 420 python3 -m mesonbuild.mesonmain test -C bp --num-processes 3 cli-projected python-gradients projected_gpu projected fuzz_qk_gram_args_smoke > $R/test.log 2>&1; echo "rc $?"; grep -E "^ *[0-9]+/[0-9]+ " $R/test.log
cp bp/meson-logs/testlog.txt $R/testlog.txt
grep -E "skipped|SKIP|cuda|GPU" $R/testlog.txt | grep -v "^command" | head -20
cd $OUT && tar czf res.tgz r && rm -rf r
