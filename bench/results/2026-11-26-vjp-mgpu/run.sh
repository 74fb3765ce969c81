#!/bin/bash
# device run 02 (2 GPUs): device states on 2 GPUs (bench), MPI rank on 2 GPUs, the provider over MPI (merged helper), the GPU VJP's G upload
set -o pipefail
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --target /tmp/ms .whl/meson-*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/ms PATH=/tmp/ms/bin:$PATH
R=$OUT/r; mkdir -p $R
cat .peer/commit > $R/commit
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/gpu.txt; nvcc --version | tail -2 >> $R/gpu.txt
# the old engine (1e6592a) for the VJP before/after, built beside (sm_90)
( cd .peer/old && nvcc -O3 --std=c++17 -arch=sm_90 --threads=0 -c qk_cuda.cu -o qk_cuda_old.o > $R/old_build.log 2>&1 ) &
python3 -m mesonbuild.mesonmain setup b -Dgpu_arch=90 -Dpython=disabled -Dcuda=enabled -Dprofiler=false > $R/setup.log 2>&1 || { tail -30 $R/setup.log; exit 1; }
ninja -C b tests/gpu/test_states_gpu tests/mpi/test_states_gpu_mpi tests/gpu/test_vjp_gpu tests/gpu/test_mgpu libqk_cuda.a > $R/build.log 2>&1 || { tail -40 $R/build.log; exit 1; }
wait
L="-L/usr/local/cuda/lib64 -lcudart -lcublas -lcublasLt -ldl -lpthread"
g++ -std=c++17 -O2 -DQK_CUDA=1 -I. -I/usr/local/cuda/include .peer/vjp_prof.cpp b/libqk_cuda.a $L -o vjp_new > $R/vjp_build.log 2>&1 &&
g++ -std=c++17 -O2 -DQK_CUDA=1 -I.peer/old -I/usr/local/cuda/include .peer/vjp_prof.cpp .peer/old/qk_cuda_old.o $L -o vjp_old >> $R/vjp_build.log 2>&1 || { tail -20 $R/vjp_build.log; }
echo "== vjp_gpu"; ./b/tests/gpu/test_vjp_gpu > $R/vjp_gpu.log 2>&1; echo "rc $?"; grep -E "FAIL|checks" $R/vjp_gpu.log | head
mkdir -p $R/vo $R/vn
echo "== vjp old/new (GPU 0)"; for k in 1 2; do CUDA_VISIBLE_DEVICES=0 ./vjp_old $R/vo > $R/vjp_old_$k.log 2>&1; CUDA_VISIBLE_DEVICES=0 ./vjp_new $R/vn > $R/vjp_new_$k.log 2>&1; done; cat $R/vjp_old_*.log $R/vjp_new_*.log
echo "== test_vjp_gpu bench"; CUDA_VISIBLE_DEVICES=0 ./b/tests/gpu/test_vjp_gpu bench 2>&1 | tee $R/vjp_bench.log | grep bench
echo "== states mgpu"; ./b/tests/gpu/test_states_gpu mgpu > $R/states_mgpu.log 2>&1; echo "rc $?"; grep -E "FAIL|checks" $R/states_mgpu.log | head
echo "== states_gpu_mpi"; python3 -m mesonbuild.mesonmain test -C b states_gpu_mpi --print-errorlogs > $R/states_gpu_mpi.log 2>&1; echo "rc $?"; grep -E "test_states_gpu_mpi:|FAIL|skipped" b/meson-logs/testlog.txt | head; cp b/meson-logs/testlog.txt $R/states_gpu_mpi_testlog.txt
echo "== mgpu"; ./b/tests/gpu/test_mgpu > $R/mgpu.log 2>&1; echo "rc $?"; tail -2 $R/mgpu.log
echo "== bench-mgpu"; ./b/tests/gpu/test_states_gpu bench-mgpu 2>&1 | tee $R/bench_mgpu.log | grep bench-mgpu
cd $OUT && tar czf res.tgz r && rm -rf r
