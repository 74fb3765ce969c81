// run 110: what a 2 MB host-to-device copy of X costs: pageable, page-locked, and a host copy into
// page-locked memory on 1..8 threads first
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main()
{
    for (size_t mb : {1, 2, 8}) {
        size_t B = mb << 20;
        std::vector<double> x(B / 8);
        for (size_t i = 0; i < x.size(); ++i) x[i] = (double)i * 1e-3;
        void *d, *h;
        cudaMalloc(&d, B);
        cudaMallocHost(&h, B);
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2] * 1e3; };
        std::vector<double> tp, tpin, tst[4];
        for (int r = 0; r < 21; ++r) {
            double t0 = now();
            cudaMemcpyAsync(d, x.data(), B, cudaMemcpyHostToDevice, s);
            double t1 = now();
            cudaStreamSynchronize(s);
            double t2 = now();
            tp.push_back(t2 - t0);
            (void)t1;
            t0 = now();
            cudaMemcpyAsync(d, h, B, cudaMemcpyHostToDevice, s);
            cudaStreamSynchronize(s);
            tpin.push_back(now() - t0);
            int nts[4] = {1, 2, 4, 8};
            for (int k = 0; k < 4; ++k) {
                int nt = nts[k];
                t0 = now();
                std::vector<std::thread> th;
                size_t ch = B / nt;
                for (int i = 1; i < nt; ++i) th.emplace_back([&, i] { memcpy((char *)h + i * ch, (char *)x.data() + i * ch, ch); });
                memcpy(h, x.data(), ch);
                for (auto &t : th) t.join();
                cudaMemcpyAsync(d, h, B, cudaMemcpyHostToDevice, s);
                cudaStreamSynchronize(s);
                tst[k].push_back(now() - t0);
            }
        }
        printf("%zu MB: pageable %.3f ms, page-locked %.3f ms, host copy then page-locked: 1 thread %.3f, 2 %.3f, 4 %.3f, 8 %.3f ms (threads started per copy)\n",
               mb, med(tp), med(tpin), med(tst[0]), med(tst[1]), med(tst[2]), med(tst[3]));
        cudaFree(d); cudaFreeHost(h); cudaStreamDestroy(s);
    }
    return 0;
}
