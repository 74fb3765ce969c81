# Design check of qk__k_states_fz (src/cuda/states.cuh) on the CPU: the layouts, the padded
# shared-memory offsets (a permutation, no bank conflicts), the cluster exchange and the store
# index, emulated with numpy for 14, 15 and 16 qubits against psi = D2 H^q D1 (product state).
# It mirrors the kernel's formulas; it does not run the kernel. python3 bench/states_fz_emu.py
# CPU emulation of qk__k_states_fz's index mappings (layouts, padding, exchange, store) against a
# direct reference: psi = D2 . H^q . D1 . (prod-state), D = exp(i * quadratic phase).
import numpy as np, sys
rng = np.random.default_rng(1)
L, RB, R = 13, 5, 32
SH = 8448
def pad(r): return r + (r >> 5)
def tpart(t, rb0): return (t & ((1 << rb0) - 1)) | ((t >> rb0) << (rb0 + RB))
def fzk(lay, k): return (k << lay) + ((k << lay) >> 5)
def g2off(cb, k):
    g = 0
    for j in range(5):
        if (k >> j) & 1: g |= 1 << (8 + j if 8 + j < 13 - cb else 8 + j + cb)
    return g
T = np.arange(256)[:, None]; K = np.arange(32)[None, :]

def check_banks(addr, what):
    # addr: [256 threads][32 k] element indices (8-byte); per warp, per k, each half-warp distinct mod 16
    for w in range(8):
        for k in range(32):
            a = addr[w*32:(w+1)*32, k]
            for h in range(2):
                b = a[h*16:(h+1)*16] % 16
                assert len(set(b.tolist())) == 16, (what, w, k, b)

def run(q, uniform, seed):
    rng = np.random.default_rng(seed)
    CB = q - 13; C = 1 << CB; LO = L - CB
    # quadratic phases
    def mkcf():
        c = rng.uniform(-3, 3, q); d = np.triu(rng.uniform(-3, 3, (q, q)), 1); c0 = rng.uniform(-3, 3)
        return c0, c, d
    def phase(cf, g):
        c0, c, d = cf
        bits = ((g[..., None] >> np.arange(q)) & 1).astype(float)
        return c0 + bits @ c + np.einsum('...i,ij,...j->...', bits, d, bits)
    cf1, cf2 = mkcf(), mkcf()
    if uniform: u = np.tile(np.array([1, 1]) / np.sqrt(2) + 0j, (q, 1))
    else: u = rng.normal(size=(q, 2)) + 1j * rng.normal(size=(q, 2))
    # reference
    D = 1 << q; gall = np.arange(D)
    psi = np.ones(D, complex)
    for Q in range(q): psi *= u[Q][(gall >> Q) & 1]
    psi *= np.exp(1j * phase(cf1, gall))
    for Q in range(q):
        a = psi.reshape(-1, 2, 1 << Q)
        psi = np.concatenate([(a[:, 0] + a[:, 1])[:, None], (a[:, 0] - a[:, 1])[:, None]], 1).reshape(-1) / np.sqrt(2)
    psi *= np.exp(1j * phase(cf2, gall))
    # the host's scale: pass 1 flushes 13 bits, pass 2 CB bits
    sc = 0.5 ** (0.5 * (13 + CB))
    sh = np.full((C, SH), np.nan + 0j)
    p1npos = list(range(13, q)); p2pos = list(range(LO)) + list(range(13, q)); p2npos = list(range(LO, 13))
    regs = {}
    for rank in range(C):
        fixed = sum(1 << p1npos[i] for i in range(CB) if (rank >> i) & 1)
        cur = 8
        g = fixed | tpart(T, cur) | (K << cur)
        v = sc * np.ones((256, 32), complex)
        for Q in range(q): v = v * u[Q][(g >> Q) & 1]
        v = v * np.exp(1j * phase(cf1, g))
        # flush bits 0..12 as the kernel does
        pend = (1 << 13) - 1
        loc = np.full(SH, np.nan + 0j)
        def move(nw):
            nonlocal v, cur
            a = pad(tpart(T, cur)) + fzk(cur, K)
            check_banks(a, ('st', cur))
            assert len(set(a.ravel().tolist())) == 8192 and a.max() < SH
            loc[:] = np.nan; loc[a] = v
            b = pad(tpart(T, nw)) + fzk(nw, K)
            check_banks(b, ('ld', nw))
            v = loc[b]; cur = nw
            assert not np.isnan(v).any()
        def bf(msk):
            nonlocal v
            for j in range(5):
                if (msk >> j) & 1:
                    lo = K[0][((K[0] >> j) & 1) == 0]; hi = lo | (1 << j)
                    a, b = v[:, lo].copy(), v[:, hi].copy()
                    v[:, lo] = a + b; v[:, hi] = a - b
        def flush(pend):
            while pend:
                rm = 31 << cur
                if not (pend & rm):
                    best, bc = cur, 0
                    for lay in (8, 0, 5):
                        c = bin(pend & (31 << lay)).count('1')
                        if c > bc: bc, best = c, lay
                    move(best); rm = 31 << cur
                bf((pend >> cur) & 31)
                pend &= ~rm
        flush(pend)
        if cur != 5: move(5)
        regs[rank] = (v.copy(), cur)
    # exchange
    for rank in range(C):
        v, cur = regs[rank]
        assert cur == 5
        w = T >> 5; lane = T & 31
        dst = w >> (3 - CB)
        r2 = ((w & ((1 << (3 - CB)) - 1)) << 10) | (rank << LO)
        a = lane + pad(r2) + fzk(5, K)
        dd = np.broadcast_to(dst, a.shape)
        for d in range(C):
            m = dd == d
            assert np.isnan(sh[d][a[m]]).all()
            sh[d][a[m]] = v[m]
        # remote rows: each warp-instruction 32 consecutive elements of one block
        for ww in range(8):
            for k in range(32):
                aa = a[ww*32:(ww+1)*32, k]; assert (np.diff(aa) == 1).all()
    out = np.full(D, np.nan + 0j)
    for rank in range(C):
        fixed2 = sum(1 << p2npos[i] for i in range(CB) if (rank >> i) & 1)
        b = pad(T) + fzk(8, K)
        check_banks(b, 'ld2')
        v = sh[rank][b]; assert not np.isnan(v).any()
        cur = 8
        # pass 2's pending H: in-chunk bits LO..12
        pend = ((1 << CB) - 1) << LO
        msk = (pend >> cur) & 31
        assert pend & ~(31 << cur) == 0
        for j in range(5):
            if (msk >> j) & 1:
                lo = K[0][((K[0] >> j) & 1) == 0]; hi = lo | (1 << j)
                a_, b_ = v[:, lo].copy(), v[:, hi].copy()
                v[:, lo] = a_ + b_; v[:, hi] = a_ - b_
        r2 = tpart(T, 8) | (K << 8)
        g = fixed2 | np.zeros_like(r2)
        for i in range(13): g = g | (((r2 >> i) & 1) << p2pos[i])
        v = v * np.exp(1j * phase(cf2, g))
        gst = (fixed2 | T) + np.array([[g2off(CB, k) for k in range(32)]])
        assert (gst == g).all()
        assert np.isnan(out[gst]).all()
        out[gst] = v
    assert not np.isnan(out).any()
    err = np.abs(out - psi).max() / np.abs(psi).max()
    print(f"q={q} uniform={uniform}: max rel err {err:.2e}")
    assert err < 1e-9
    return err

for q in (14, 15, 16):
    for uni in (True, False):
        run(q, uni, q * 7 + uni)
print("ok")
