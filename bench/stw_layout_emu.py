# Design check of qk__k_gram_stw (src/cuda/smalltc.cuh) on the CPU: the stage layout that cp.async
# writes (16-byte chunks XOR-swizzled per row), the fragment reads out of it, the mma.sync
# m16n8k16 fragment layouts (PTX ISA: A a0 (g, 2t..2t+1), a1 (g+8, ..), a2 (g, 2t+8..), a3
# (g+8, 2t+8..); B b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C c0, c1 (g, 2t..2t+1), c2, c3
# (g+8, ..)) and the lane -> K mapping the stores use (kv[x][v][y] = K[4g + x][16 v + 4t + y]),
# emulated in exact arithmetic (complex128, no fp16 split) against |A B^H|^2 of a 32 x 32 quarter;
# and the bank of every 8-byte fragment read (per half-warp) and 16-byte cp.async write (per
# quarter-warp). It mirrors the kernel's formulas; it does not run the kernel.
# python3 bench/stw_layout_emu.py  (exit status 1 on any mismatch)
import numpy as np, sys
rng = np.random.default_rng(3)
D = 16
A = rng.normal(size=(32, D)) + 1j * rng.normal(size=(32, D))
B = rng.normal(size=(32, D)) + 1j * rng.normal(size=(32, D))
fails = 0
def fa(rr): return 2 * ((rr >> 2) & 3)
def fb(rr): return 2 * ((rr & 1) | ((rr >> 1) & 2))
# the stage as the kernel's issue() writes it: word w holds re or im of one amplitude
stage = np.full(64 * 32, np.nan)
for e in range(64 * 8):
    r, k = e >> 3, e & 7
    isb, rr = r >> 5, r & 31
    f = fb(rr) if isb else fa(rr)
    src = (B if isb else A)[rr]
    for w in range(4): # chunk k = amplitudes 2k, 2k+1 as (re, im, re, im)
        amp = 2 * k + (w >> 1)
        stage[r * 32 + 4 * (k ^ f) + w] = src[amp].real if w % 2 == 0 else src[amp].imag
if np.isnan(stage).any(): print("stage: words left unwritten"); fails += 1
def rdA(g, t, ks, i, r):
    rr, c = 4 * g + 2 * i + (r & 1), 8 * ks + t + 4 * (r >> 1)
    return rr * 32 + 4 * ((c >> 1) ^ fa(rr)) + 2 * (c & 1)
def rdB(g, t, ks, j, r):
    rr, c = 16 * (j >> 1) + 4 * (g >> 1) + 2 * (j & 1) + (g & 1), 8 * ks + t + 4 * r
    return 32 * 32 + rr * 32 + 4 * ((c >> 1) ^ fb(rr)) + 2 * (c & 1)
def cval(w): return stage[w] + 1j * stage[w + 1]
# fragment matrices of each (ks, i) A piece and (ks, j) B piece, indexed as the MMA sees them:
# k slot pair p = (2t, 2t+1) -> amplitude slot t, (2t+8, 2t+9) -> t + 4; one complex per (row, slot)
cr = np.zeros((8, 4, 2, 4, 4)); ci = np.zeros((8, 4, 2, 4, 4)) # [g][t][i][j][reg]
for ks in range(2):
    Af = np.zeros((2, 16, 8), complex) # [i][fragment row][amplitude slot]
    Bf = np.zeros((4, 8, 8), complex)  # [j][amplitude slot][fragment column]
    for g in range(8):
        for t in range(4):
            for i in range(2):
                for r in range(4):
                    Af[i, g + 8 * (r & 1), t + 4 * (r >> 1)] = cval(rdA(g, t, ks, i, r))
            for j in range(4):
                for r in range(2):
                    Bf[j, t + 4 * r, g] = cval(rdB(g, t, ks, j, r))
    # the real MMA on (re, im) pairs: Re = sum a.re b.re + a.im b.im (B as is), Im = sum a.re b.im - a.im b.re
    # (B turned to (im, -re)): that is Re and Im of sum conj(a) b
    for i in range(2):
        for j in range(4):
            P = np.conj(Af[i]) @ Bf[j] # 16 x 8: <a_row|b_col> over this k-step
            for g in range(8):
                for t in range(4):
                    for reg in range(4):
                        row, col = g + 8 * (reg >> 1), 2 * t + (reg & 1)
                        cr[g, t, i, j, reg] += P[row, col].real
                        ci[g, t, i, j, reg] += P[row, col].imag
K = np.abs(np.conj(A) @ B.T) ** 2
seen = np.zeros((32, 32), int)
for g in range(8):
    for t in range(4):
        for x in range(4):
            for v in range(2):
                for y in range(4):
                    i, j, e = x >> 1, 2 * v + (y >> 1), 2 * (x & 1) + (y & 1)
                    kv = cr[g, t, i, j, e] ** 2 + ci[g, t, i, j, e] ** 2
                    row, col = 4 * g + x, 16 * v + 4 * t + y
                    seen[row, col] += 1
                    if abs(kv - K[row, col]) > 1e-9 * max(1.0, K[row, col]):
                        fails += 1
if (seen != 1).any(): print("lanes do not cover the quarter once"); fails += 1
def ways(words):
    banks = {}
    for w in words: banks.setdefault(w % 32, set()).add(w // 32)
    return max(len(s) for s in banks.values())
worst = 0
for half in range(2):
    for ks in range(2):
        for i in range(2):
            for r in range(4):
                worst = max(worst, ways([a + d for g in range(4 * half, 4 * half + 4) for t in range(4) for a in [rdA(g, t, ks, i, r)] for d in (0, 1)]))
        for j in range(4):
            for r in range(2):
                worst = max(worst, ways([a + d for g in range(4 * half, 4 * half + 4) for t in range(4) for a in [rdB(g, t, ks, j, r)] for d in (0, 1)]))
def dst(e):
    r, k = e >> 3, e & 7
    return r * 32 + 4 * (k ^ (fb(r & 31) if r >> 5 else fa(r & 31)))
wst = max(ways([dst(b + q * 8 + l) + d for l in range(8) for d in range(4)]) for b in range(0, 512, 32) for q in range(4))
print(f"K of the quarter from the lanes: {'ok' if fails == 0 else f'{fails} mismatches'}; "
      f"fragment reads: {worst}-way per half-warp; cp.async writes: {wst}-way per quarter-warp")
if worst != 1 or wst != 1: fails += 1
sys.exit(1 if fails else 0)
