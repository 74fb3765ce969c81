"""qk.gram_mps (issue 28, MPS input): K from given matrix product states, against the dense
statevectors contracted (numpy) from the same tensors (1e-12), against qk's own map path (the MPS
of qk's statevectors by SVD sweeps equal qk.gram of the map, 1e-12), quimb's layout and end
tensors, complex64 / float tensors, a .npy output, at 120 qubits against a closed form, and
validation errors naming the sample and site. quimb's part skips without quimb."""
import os
import tempfile
import unittest

import numpy as np

import qk

RNG = np.random.default_rng(2028)


def random_mps(q, maxb, real=False, rng=RNG):
    """random site tensors (left, 2, right), bonds 1 .. min(maxb, 2^min(s, q - s))"""
    bonds = [1] + [int(rng.integers(1, min(maxb, 2 ** min(s, q - s)) + 1)) for s in range(1, q)] + [1]
    out = []
    for s in range(q):
        shape = (bonds[s], 2, bonds[s + 1])
        t = rng.normal(size=shape) + (0 if real else 1j * rng.normal(size=shape))
        out.append(t)
    return out


def dense(mps):
    """the 2^q amplitudes, bit s of the index = site s (qk's order), normalised"""
    v = np.ones((1, 1))          # (amplitude index over sites < s, right bond)
    for s, t in enumerate(mps):
        # new index = old + 2^s * a
        v = np.einsum("il,lar->air", v, t).reshape(-1, t.shape[2])
    psi = v[:, 0]
    return psi / np.linalg.norm(psi)


def mps_of_state(psi, q):
    """an exact MPS (left, 2, right) of a statevector in qk's order by SVD sweeps (site s = qubit s)"""
    t = psi.reshape([2] * q)[tuple([slice(None)] * q)]
    t = np.transpose(t, list(range(q - 1, -1, -1)))   # axis s = qubit s (bit s)
    out, left, rest = [], 1, t.reshape(1, -1)
    for s in range(q - 1):
        m = rest.reshape(left * 2, -1)
        u, sv, vh = np.linalg.svd(m, full_matrices=False)
        k = int(np.sum(sv > 1e-14 * sv[0]))
        out.append(u[:, :k].reshape(left, 2, k))
        rest = sv[:k, None] * vh[:k]
        left = k
    out.append(rest.reshape(left, 2, 1))
    return out


def ref_K(A, B):
    return np.abs(np.conj(A) @ B.T) ** 2


class TestGramMps(unittest.TestCase):
    def test_dense(self):
        q = 8
        A = [random_mps(q, 5) for _ in range(13)]
        B = [random_mps(q, 3) for _ in range(6)]
        SA = np.array([dense(m) for m in A])
        SB = np.array([dense(m) for m in B])
        K = qk.gram_mps(A, B, normalize=True, device="cpu")
        self.assertLess(np.max(np.abs(K - ref_K(SA, SB))), 1e-12)
        K = qk.gram_mps(A, normalize=True, device="cpu")
        self.assertLess(np.max(np.abs(K - ref_K(SA, SA))), 1e-12)
        # the same states through qk.gram_states (dense) agree
        self.assertLess(np.max(np.abs(K - qk.gram_states(SA, device="cpu", precision="fp64"))), 1e-12)

    def test_own_map(self):
        q = 7
        m = qk.FeatureMap("zz(reps=2,ent=linear)", q)
        X = RNG.uniform(-1, 1, size=(11, q))
        Y = RNG.uniform(-1, 1, size=(5, q))
        SX, SY = m.statevector(X), m.statevector(Y)
        MX = [mps_of_state(s, q) for s in SX]
        MY = [mps_of_state(s, q) for s in SY]
        for mm, s in zip(MX, SX):   # the MPS are exact, in qk's bit order
            d = dense(mm)
            self.assertLess(np.max(np.abs(d * np.vdot(d, s) / abs(np.vdot(d, s)) - s)), 1e-12)
        K = qk.gram(X, Y, map=m, device="cpu", precision="fp64")
        self.assertLess(np.max(np.abs(qk.gram_mps(MX, MY, device="cpu") - K)), 1e-12)
        K = qk.gram(X, map=m, device="cpu", precision="fp64")
        self.assertLess(np.max(np.abs(qk.gram_mps(MX, device="cpu") - K)), 1e-12)

    def test_layouts_and_types(self):
        q = 6
        A = [random_mps(q, 4) for _ in range(9)]
        SA = np.array([dense(m) for m in A])
        K0 = qk.gram_mps(A, normalize=True, device="cpu")
        # quimb's 'lrp' with the end tensors' unit bonds dropped
        Aq = [[np.transpose(t, (0, 2, 1)) for t in m] for m in A]
        Aq = [[m[0][0]] + m[1:-1] + [m[-1][:, 0, :]] for m in Aq]
        self.assertEqual(Aq[0][0].shape[1], 2)
        K1 = qk.gram_mps(Aq, layout="lrp", normalize=True, device="cpu")
        self.assertTrue(np.array_equal(K0, K1))
        # 'lpr' with dropped ends: (2, right) and (left, 2)
        Ae = [[m[0][0]] + m[1:-1] + [m[-1][:, :, 0]] for m in A]
        self.assertTrue(np.array_equal(K0, qk.gram_mps(Ae, normalize=True, device="cpu")))
        K64 = qk.gram_mps([[t.astype(np.complex64) for t in m] for m in A], normalize=True, device="cpu")
        self.assertLess(np.max(np.abs(K64 - ref_K(SA, SA))), 1e-5)
        R = [random_mps(q, 4, real=True) for _ in range(7)]
        SR = np.array([dense(m) for m in R])
        self.assertLess(np.max(np.abs(qk.gram_mps(R, normalize=True, device="cpu") - ref_K(SR, SR))), 1e-12)
        self.assertLess(np.max(np.abs(qk.gram_mps([[t.astype(np.float32) for t in m] for m in R], normalize=True,
                                                  device="cpu") - ref_K(SR, SR))), 1e-5)
        # a one-site MPS as a plain 2-vector
        one = [[np.array([0.6, 0.8j])], [np.array([1.0, 0.0])]]
        K = qk.gram_mps(one, device="cpu")
        self.assertAlmostEqual(K[0, 1], 0.36, places=14)

    def test_npy(self):
        A = [random_mps(5, 4) for _ in range(10)]
        K = qk.gram_mps(A, normalize=True, device="cpu")
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "K.npy")
            Kf = qk.gram_mps(A, normalize=True, device="cpu", out=p)
            self.assertTrue(np.array_equal(np.asarray(Kf), K))
            del Kf

    def test_wide_products(self):
        # 120 qubits: product states (bond 1) padded to bond 2 and mixed by random gauges
        q, n = 120, 6
        U = RNG.normal(size=(n, q, 2)) * np.array([1.0, 0.2]) + 1j * RNG.normal(size=(n, q, 2)) * 0.1
        U /= np.linalg.norm(U, axis=2, keepdims=True)
        A = []
        for i in range(n):
            sites = []
            for s in range(q):
                dl, dr = (1 if s == 0 else 2), (1 if s == q - 1 else 2)
                t = np.zeros((dl, 2, dr), dtype=complex)
                t[0, :, 0] = U[i, s]
                sites.append(t)
            for s in range(1, q):
                G = RNG.normal(size=(2, 2)) + 1j * RNG.normal(size=(2, 2)) + 2 * np.eye(2)
                sites[s - 1] = np.einsum("lar,rk->lak", sites[s - 1], G)
                sites[s] = np.einsum("kl,lar->kar", np.linalg.inv(G), sites[s])
            A.append(sites)
        K = qk.gram_mps(A, normalize=True, norm_tol=1e-6, device="cpu")
        ref = np.prod(np.abs(np.einsum("isa,jsa->ijs", U.conj(), U)) ** 2, axis=2)
        self.assertLess(np.max(np.abs(K - ref)), 1e-12)

    def test_errors(self):
        A = [random_mps(5, 4) for _ in range(4)]
        with self.assertRaisesRegex(ValueError, r"A\[0\]: the MPS's squared norm"):
            qk.gram_mps(A, device="cpu")
        bad = [list(m) for m in A]
        bad[2][3] = bad[2][3].copy()
        bad[2][3][0, 1, 0] = np.nan
        with self.assertRaisesRegex(ValueError, r"A\[2\] site 3: entry \(0, 1, 0\)"):
            qk.gram_mps(bad, normalize=True, device="cpu")
        with self.assertRaisesRegex(ValueError, r"B\[1\] site 2: left bond"):
            B = [list(m) for m in A[:2]]
            B[1][2] = np.zeros((B[1][2].shape[0] + 1, 2, B[1][2].shape[2]), dtype=complex)
            qk.gram_mps(A, B, normalize=True, device="cpu")
        with self.assertRaisesRegex(ValueError, "physical dimension must be 2"):
            qk.gram_mps([[np.ones((1, 3, 1))]], device="cpu")
        with self.assertRaisesRegex(ValueError, "sites"):
            qk.gram_mps([A[0], A[1][:4]], normalize=True, device="cpu")
        with self.assertRaisesRegex(ValueError, "layout"):
            qk.gram_mps(A, layout="rlp")
        # norm_tol reaches qk: a squared norm 1 + 1e-7 fails the default 1e-9, passes 1e-6
        m = mps_of_state(dense(random_mps(5, 4)), 5)
        m[0] = m[0] * np.sqrt(1 + 1e-7)
        with self.assertRaisesRegex(ValueError, r"A\[0\]: the MPS's squared norm"):
            qk.gram_mps([m], device="cpu")
        self.assertLess(abs(qk.gram_mps([m], norm_tol=1e-6, device="cpu")[0, 0] - 1), 1e-6)


@unittest.skipUnless(__import__("importlib").util.find_spec("quimb"), "quimb is not installed")
class TestQuimb(unittest.TestCase):
    def test_quimb_mps(self):
        import quimb.tensor as qtn
        q = 8
        mps = [qtn.MPS_rand_state(q, bond_dim=4, dtype="complex128", seed=s) for s in range(7)]
        A = [[t.data for t in m] for m in mps]   # default shape 'lrp'
        K = qk.gram_mps(A, layout="lrp", device="cpu")
        ref = np.array([[abs(a.H @ b) ** 2 for b in mps] for a in mps])
        self.assertLess(np.max(np.abs(K - ref)), 1e-12)


if __name__ == "__main__":
    unittest.main()
