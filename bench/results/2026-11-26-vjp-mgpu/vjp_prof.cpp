// device-only experiment (not committed): where the GPU VJP's time goes, via qk_prof's CUPTI mode
#define QK_PROF_ENABLE
#define QK_PROF_CUDA
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"
#define QK_IMPLEMENTATION
#include "qk.h"
#include <cuda_runtime.h>
#include <chrono>
#include <vector>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
static double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char **argv)
{
    const char *outdir = argc > 1 ? argv[1] : ".";
    qk_prof_desc pd; memset(&pd, 0, sizeof pd); pd.cupti = 1;
    QK_PROF_INIT(&pd);
    qk_ctx_desc cd; memset(&cd, 0, sizeof cd); cd.device = QK_DEVICE_CUDA; cd.autotune = -1;
    qk_ctx *gpu = nullptr;
    if (qk_ctx_create(&cd, &gpu) != QK_OK) { printf("ctx %s\n", qk_last_error()); return 1; }
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> U(-1, 1);
    for (int q : {8, 12}) {
        const int64_t n = 4096;
        qk_map *m = nullptr;
        char spec[64]; snprintf(spec, sizeof spec, "hea(layers=2)");
        if (qk_map_parse(spec, q, &m) != QK_OK) { printf("parse %s\n", qk_last_error()); return 1; }
        std::vector<double> w(m->n_weights); for (auto &v : w) v = U(rng);
        qk_map_set_weights(m, w.data(), m->n_weights);
        std::vector<double> x(n * q), G(n * n), K(n * n), g(m->n_weights);
        for (auto &v : x) v = 1.2 * U(rng);
        for (auto &v : G) v = U(rng);
        for (int pinned = 0; pinned <= 1; ++pinned) {
            if (pinned) cudaHostRegister(G.data(), G.size() * 8, cudaHostRegisterPortable);
            std::vector<double> tv, tg;
            for (int rep = 0; rep < 6; ++rep) {
                qk_gram_desc gd; memset(&gd, 0, sizeof gd);
                gd.x = x.data(); gd.n_x = n; gd.out = K.data(); gd.out_dtype = QK_F64; gd.precision = QK_PRECISION_FP64;
                double t0 = now_s();
                QK_PROF_BEGIN("gram");
                if (qk_gram(gpu, m, &gd) != QK_OK) { printf("gram %s\n", qk_last_error()); return 1; }
                QK_PROF_END("gram");
                double a = now_s() - t0;
                qk_vjp_desc v; memset(&v, 0, sizeof v);
                v.x = x.data(); v.n_x = n; v.g = G.data(); v.grad_w = g.data();
                t0 = now_s();
                qk_result vr;
                if (pinned) { QK_PROF_BEGIN("vjp pinned G"); vr = qk_gram_vjp(gpu, m, &v); QK_PROF_END("vjp pinned G"); }
                else { QK_PROF_BEGIN("vjp"); vr = qk_gram_vjp(gpu, m, &v); QK_PROF_END("vjp"); }
                if (vr != QK_OK) { printf("vjp %s\n", qk_last_error()); return 1; }
                double c = now_s() - t0;
                if (rep) { tg.push_back(a); tv.push_back(c); }
            }
            std::sort(tv.begin(), tv.end()); std::sort(tg.begin(), tg.end());
            printf("q=%d n=%lld %s G: gram fp64 %.2f ms, vjp %.2f ms (%.2fx)\n", q, (long long)n, pinned ? "pinned" : "pageable",
                   tg[2] * 1e3, tv[2] * 1e3, tv[2] / tg[2]);
            if (pinned) cudaHostUnregister(G.data());
        }
        qk_map_free(m);
    }
    cudaDeviceSynchronize();
    char path[512]; snprintf(path, sizeof path, "%s/prof.txt", outdir);
    QK_PROF_REPORT(path);
    qk_ctx_destroy(gpu);
    return 0;
}
