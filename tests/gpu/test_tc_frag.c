/* Host emulation of the fragment mapping of qk_cuda.cu's fused tensor-core Gram kernel
   (qk__k_tcgram), so that a wrong index or sign shows up without a GPU.

   A warp is emulated lane by lane: each lane builds its A and B registers exactly as the kernel
   does (16-byte loads at word 16 grp + 4t of rows g and g + 8 of the shared tile, register
   2ks + h of the load for k-word t + 4h of step ks; for Im, B's amplitudes rotated (re, im) ->
   (im, -re): TF32 across the register pair, FP16 within a register), then the MMA is applied as
   the PTX ISA documents its fragments (mma.m16n8k8 .tf32 and mma.m16n8k16 .f16, g = lane / 4,
   t = lane % 4):
     A  a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)      [k in 32-bit words; an f16
     B  b0 (t, g)  b1 (t+4, g)                                  word holds k = 2w, 2w + 1]
     C  c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1)
   The C the lanes hold is mapped back to the tile as the kernel's epilogue does and compared with
   <a_i|b_j> (complex: Re and Im; real: the dot product) computed directly, on fresh random
   values in exact arithmetic (doubles: the emulation checks indices and signs, not rounding). */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "../qk_test.h"

/* a 32-bit word of the shared tile: TF32 one value (v[0]); FP16 two halves (v[0] low, v[1] high) */
typedef struct { double v[2]; } word;

/* the kernel's map: k-word t + 4h of k-step ks is physical word 4t + 2ks + h of a 16-word group */
static int kword(int t, int ks, int h) { return 4 * t + 2 * ks + h; }

static word rot_f16(word w) { word r; r.v[0] = w.v[1]; r.v[1] = -w.v[0]; return r; }

/* One warp, one 16-word group, rows a0..a0+15 of A and b0..b0+7 of B (tiles of 16-word rows
   holding WPR words: words [16 grp, 16 grp + 16) are used). f16: 1 for FP16 words. cplx: the
   words hold interleaved (re, im) (TF32: word pairs; FP16: one word per amplitude). Accumulates
   the C fragments of Re (cr) and Im (ci) of every lane, as the kernel does. */
static void warp_group(const word *A, const word *B, int wpr, int grp, int f16, int cplx, double cr[32][4], double ci[32][4])
{
    int lane, ks, e, k, n, r;
    for (ks = 0; ks < 2; ++ks) {
        word a[32][4], b[32][2], br[32][2];
        /* registers as the kernel builds them */
        for (lane = 0; lane < 32; ++lane) {
            const int g = lane >> 2, t = lane & 3;
            const word *ra = A + (size_t)g * wpr + 16 * grp, *rb = ra + 8 * wpr, *rbb = B + (size_t)g * wpr + 16 * grp;
            a[lane][0] = ra[kword(t, ks, 0)];
            a[lane][1] = rb[kword(t, ks, 0)];
            a[lane][2] = ra[kword(t, ks, 1)];
            a[lane][3] = rb[kword(t, ks, 1)];
            b[lane][0] = rbb[kword(t, ks, 0)];
            b[lane][1] = rbb[kword(t, ks, 1)];
            if (f16) { br[lane][0] = rot_f16(b[lane][0]); br[lane][1] = rot_f16(b[lane][1]); }
            else {
                br[lane][0] = b[lane][1];
                br[lane][1] = b[lane][0];
                br[lane][1].v[0] = -br[lane][1].v[0];
            }
        }
        /* the MMA from the documented fragments: matrices first, then D = A B + C per lane */
        {
            const int KV = f16 ? 16 : 8; /* k values per step */
            double Am[16][16], Bm[16][8], Bi[16][8], Cr[16][8], Ci[16][8];
            for (lane = 0; lane < 32; ++lane) {
                const int g = lane >> 2, t = lane & 3;
                if (f16) {
                    for (e = 0; e < 2; ++e) {
                        Am[g][2 * t + e] = a[lane][0].v[e]; Am[g + 8][2 * t + e] = a[lane][1].v[e];
                        Am[g][2 * t + 8 + e] = a[lane][2].v[e]; Am[g + 8][2 * t + 8 + e] = a[lane][3].v[e];
                        Bm[2 * t + e][g] = b[lane][0].v[e]; Bm[2 * t + 8 + e][g] = b[lane][1].v[e];
                        Bi[2 * t + e][g] = br[lane][0].v[e]; Bi[2 * t + 8 + e][g] = br[lane][1].v[e];
                    }
                } else {
                    Am[g][t] = a[lane][0].v[0]; Am[g + 8][t] = a[lane][1].v[0];
                    Am[g][t + 4] = a[lane][2].v[0]; Am[g + 8][t + 4] = a[lane][3].v[0];
                    Bm[t][g] = b[lane][0].v[0]; Bm[t + 4][g] = b[lane][1].v[0];
                    Bi[t][g] = br[lane][0].v[0]; Bi[t + 4][g] = br[lane][1].v[0];
                }
            }
            for (r = 0; r < 16; ++r)
                for (n = 0; n < 8; ++n) {
                    Cr[r][n] = Ci[r][n] = 0;
                    for (k = 0; k < KV; ++k) { Cr[r][n] += Am[r][k] * Bm[k][n]; Ci[r][n] += Am[r][k] * Bi[k][n]; }
                }
            for (lane = 0; lane < 32; ++lane) {
                const int g = lane >> 2, t = lane & 3;
                for (e = 0; e < 4; ++e) {
                    const int row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
                    cr[lane][e] += Cr[row][col];
                    if (cplx) ci[lane][e] += Ci[row][col];
                }
            }
        }
    }
}

int main(void)
{
    int f16, cplx, lane, e, i, j, grp;
    const int wpr = 32; /* words per row: two 16-word groups, as a non-split stage */
    qk_test_seed();
    for (f16 = 0; f16 < 2; ++f16)
        for (cplx = 0; cplx < 2; ++cplx) {
            word A[16 * 32], B[8 * 32];
            double cr[32][4], ci[32][4], maxerr = 0;
            const int vpw = f16 ? 2 : 1, nv = wpr * vpw; /* values per row */
            double av[16][64], bv[8][64];
            for (i = 0; i < 16; ++i)
                for (j = 0; j < nv; ++j) av[i][j] = qk_test_uniform(-1.0, 1.0);
            for (i = 0; i < 8; ++i)
                for (j = 0; j < nv; ++j) bv[i][j] = qk_test_uniform(-1.0, 1.0);
            /* row-major values into words: value j of a row is word j / vpw, half j % vpw */
            memset(A, 0, sizeof A);
            memset(B, 0, sizeof B);
            for (i = 0; i < 16; ++i)
                for (j = 0; j < nv; ++j) A[i * wpr + j / vpw].v[j % vpw] = av[i][j];
            for (i = 0; i < 8; ++i)
                for (j = 0; j < nv; ++j) B[i * wpr + j / vpw].v[j % vpw] = bv[i][j];
            memset(cr, 0, sizeof cr);
            memset(ci, 0, sizeof ci);
            for (grp = 0; grp < 2; ++grp) warp_group(A, B, wpr, grp, f16, cplx, cr, ci);
            for (lane = 0; lane < 32; ++lane)
                for (e = 0; e < 4; ++e) {
                    const int g = lane >> 2, t = lane & 3, row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
                    double re = 0, im = 0, err;
                    if (cplx) { /* <a|b> = sum conj(a) b over interleaved (re, im) */
                        for (j = 0; j < nv; j += 2) {
                            re += av[row][j] * bv[col][j] + av[row][j + 1] * bv[col][j + 1];
                            im += av[row][j] * bv[col][j + 1] - av[row][j + 1] * bv[col][j];
                        }
                    } else
                        for (j = 0; j < nv; ++j) re += av[row][j] * bv[col][j];
                    err = fabs(cr[lane][e] - re) + (cplx ? fabs(ci[lane][e] - im) : 0.0);
                    if (err > maxerr) maxerr = err;
                }
            CHECK(maxerr < 1e-12, "%s %s: fragment mapping off by %.3g", f16 ? "fp16" : "tf32", cplx ? "complex" : "real", maxerr);
            printf("%s %-7s max err %.3g\n", f16 ? "fp16" : "tf32", cplx ? "complex" : "real", maxerr);
        }
    printf("%d checks, %d failed\n", qk_test_checks, qk_test_fails);
    return qk_test_fails ? 1 : 0;
}
