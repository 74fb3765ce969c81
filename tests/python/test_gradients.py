"""qk.gram_vjp, qk.alignment, qk.KernelTrainer, qk.projected_gram, qk.sampled, qk.closest_psd, the PSD repairs and
qk.mitigate_depolarizing_noise (issue 24); projected_gram's path= and device= (the MPS path at 60 qubits against
numpy's light-cone partial traces and the qk-gram CLI; the GPU engine against the CPU where a GPU exists): the VJP of the alignment against
central finite differences through qk.gram (relative 1e-7), for the weights and (data=True) the data, K from the same pass equal to
qk.gram's, the alignment's dA/dK against finite differences of the alignment, and the trainer:
the alignment grows, the trained qk.Kernel classifies with an SVC, the result's attributes are
qiskit-machine-learning QuantumKernelTrainer's. Skips the trainer without scipy/scikit-learn."""
import os
import subprocess
import tempfile
import unittest

import numpy as np

import qk

RNG = np.random.default_rng(24)


class TestVJP(unittest.TestCase):
    def test_vjp_against_finite_differences(self):
        X = RNG.uniform(-1, 1, (30, 4))
        Y = RNG.uniform(-1, 1, (12, 4))
        for spec, YY in (("hea(layers=2)", None), ("hea(layers=2,rot=yz)", Y)):
            w = RNG.uniform(-1.5, 1.5, 8 if "yz" not in spec else 16)
            m = qk.FeatureMap(spec, 4, weights=w)
            n2 = X.shape[0] if YY is None else YY.shape[0]
            G = RNG.uniform(-1, 1, (X.shape[0], n2))
            g, K = qk.gram_vjp(X, G, YY, map=m)
            np.testing.assert_allclose(K, qk.gram(X, YY, map=m, device="cpu", precision="fp64"), atol=1e-14, rtol=0)
            h, fd = 1e-5, []
            for k in range(len(w)):
                wp, wm = w.copy(), w.copy()
                wp[k] += h
                wm[k] -= h
                Lp = np.sum(G * qk.gram(X, YY, map=m.with_weights(wp), device="cpu", precision="fp64"))
                Lm = np.sum(G * qk.gram(X, YY, map=m.with_weights(wm), device="cpu", precision="fp64"))
                fd.append((Lp - Lm) / (2 * h))
            fd = np.array(fd)
            self.assertLess(np.abs(g - fd).max(), 1e-7 * np.abs(fd).max(), spec)

    def test_vjp_data_against_finite_differences(self):
        # dL/dX (and dL/dY): x in gate angles as x, x x' and (pi - x)(pi - x') (zz), w x (hea)
        X = RNG.uniform(-1, 1, (9, 3))
        Y = RNG.uniform(-1, 1, (7, 3))
        for spec, YY in (("zz(reps=2)", Y), ("zz(reps=2)", None), ("hea(layers=2,rot=yz)", None)):
            m = qk.FeatureMap(spec, 3, weights=RNG.uniform(-1.5, 1.5, 12) if "hea" in spec else None)
            G = RNG.uniform(-1, 1, (9, 9 if YY is None else 7))
            out = qk.gram_vjp(X, G, YY, map=m, data=True)
            self.assertEqual(len(out), 3 if YY is None else 4)
            L = lambda A, B: np.sum(G * qk.gram(A, B, map=m, device="cpu", precision="fp64"))
            h = 1e-5
            for side, A in enumerate((X,) if YY is None else (X, YY)):
                fd = np.zeros_like(A)
                for e in np.ndindex(A.shape):
                    Ap, Am = A.copy(), A.copy()
                    Ap[e] += h
                    Am[e] -= h
                    if side == 0:
                        fd[e] = (L(Ap, YY) - L(Am, YY)) / (2 * h)
                    else:
                        fd[e] = (L(X, Ap) - L(X, Am)) / (2 * h)
                got = out[2 + side]
                self.assertEqual(got.shape, A.shape)
                self.assertLess(np.abs(got - fd).max(), 1e-7 * np.abs(fd).max(), f"{spec} side {side}")
        with self.assertRaisesRegex(RuntimeError, "amplitude"):   # QK_ERROR_UNSUPPORTED: x is no angle there
            qk.gram_vjp(X, np.ones((9, 9)), map="amplitude", data=True)

    def test_alignment_gradient(self):
        K = RNG.uniform(0, 1, (15, 15))
        K = (K + K.T) / 2
        y = RNG.choice([3, 7], 15)
        for centered in (False, True):
            a, dA = qk.alignment(K, y, centered)
            h = 1e-6
            for (i, j) in ((0, 0), (2, 5), (7, 3)):
                Kp, Km = K.copy(), K.copy()
                Kp[i, j] += h
                Km[i, j] -= h
                fd = (qk.alignment(Kp, y, centered)[0] - qk.alignment(Km, y, centered)[0]) / (2 * h)
                self.assertAlmostEqual(dA[i, j], fd, delta=1e-7)
        with self.assertRaises(ValueError):
            qk.alignment(K, np.arange(15))

    def test_errors(self):
        X = RNG.uniform(-1, 1, (5, 3))
        with self.assertRaises(ValueError):
            qk.gram_vjp(X, np.zeros((5, 4)), map="hea(layers=1)")
        G = np.zeros((5, 5))
        G[1, 2] = np.nan
        with self.assertRaises(ValueError):
            qk.gram_vjp(X, G, map="hea(layers=1)")


def _rdm_ref(S, q, gamma, T):
    """projected kernel from numpy partial traces of states S (n, 2^q) and T (m, 2^q), qk's qubit k = bit k"""
    def rdms(V):
        out = []
        for v in V:
            t = v.reshape((2,) * q)   # axis 0 = the highest bit: qubit q-1
            rs = []
            for k in range(q):
                ax = q - 1 - k
                m = np.moveaxis(t, ax, 0).reshape(2, -1)
                rs.append(m @ m.conj().T)
            out.append(rs)
        return out
    A, B = rdms(S), rdms(T)
    return np.array([[np.exp(-gamma * sum(np.sum(np.abs(a[k] - b[k]) ** 2) for k in range(q))) for b in B] for a in A])


class TestProjectedShots(unittest.TestCase):
    def test_projected_against_numpy_partial_traces(self):
        X = RNG.uniform(-1, 1, (14, 5))
        Y = RNG.uniform(-1, 1, (9, 5))
        m = qk.FeatureMap("zz(reps=2)", 5)
        S, T = m.statevector(X), m.statevector(Y)
        np.testing.assert_allclose(qk.projected_gram(X, map=m, gamma=0.8), _rdm_ref(S, 5, 0.8, S), atol=1e-13, rtol=0)
        np.testing.assert_allclose(qk.projected_gram(X, Y, map=m, gamma=0.8), _rdm_ref(S, 5, 0.8, T), atol=1e-13, rtol=0)
        with self.assertRaises(ValueError):
            qk.projected_gram(X, map=m, gamma=-1.0)

    def test_projected_mps_path(self):
        # 14 qubits, zz linear: the planner takes the MPS path (cheaper than the statevector);
        # against numpy partial traces of qk's statevectors
        X = RNG.uniform(-1, 1, (8, 14))
        m = qk.FeatureMap("zz(reps=2,ent=linear)", 14)
        S = m.statevector(X)
        np.testing.assert_allclose(qk.projected_gram(X, map=m, gamma=0.3), _rdm_ref(S, 14, 0.3, S), atol=1e-12, rtol=0)
        # 120 qubits (no statevector): runs, symmetric, 1 on the diagonal
        X = RNG.uniform(-1, 1, (5, 120))
        K = qk.projected_gram(X, map="zz(reps=2,ent=linear)", gamma=0.05)
        self.assertEqual(K.shape, (5, 5))
        np.testing.assert_allclose(np.diag(K), 1.0, atol=1e-12)
        np.testing.assert_allclose(K, K.T, atol=0)
        self.assertTrue(np.all((K > 0) & (K <= 1 + 1e-12)))

    def test_projected_path_option(self):
        # path="mps" / "statevector" / None at 12 qubits: the same K (1e-12), and numpy's
        X = RNG.uniform(-1, 1, (10, 12))
        Y = RNG.uniform(-1, 1, (4, 12))
        m = qk.FeatureMap("zz(reps=2,ent=linear)", 12)
        ref = _rdm_ref(m.statevector(X), 12, 0.4, m.statevector(Y))
        K = {p: qk.projected_gram(X, Y, map=m, gamma=0.4, device="cpu", path=p) for p in (None, "auto", "mps", "statevector")}
        for p, Kp in K.items():
            self.assertEqual((Kp.dtype, Kp.shape), (np.float64, (10, 4)), p)
            np.testing.assert_allclose(Kp, ref, atol=1e-12, rtol=0, err_msg=str(p))
        np.testing.assert_allclose(K["mps"], K["statevector"], atol=1e-12, rtol=0)
        np.testing.assert_array_equal(K[None], K["auto"])
        # a forced path that does not apply: the statevector beyond 30 qubits, the MPS of a dense state
        with self.assertRaisesRegex(ValueError, "30"):
            qk.projected_gram(RNG.uniform(-1, 1, (3, 40)), map="zz(reps=2,ent=linear)", device="cpu", path="statevector")
        with self.assertRaisesRegex(RuntimeError, "mps"):
            qk.projected_gram(RNG.uniform(0.1, 1, (3, 8)), map="amplitude", device="cpu", path="mps")

    def test_projected_bad_device_and_path(self):
        X = RNG.uniform(-1, 1, (3, 4))
        for kw in ({"device": "tpu"}, {"device": ""}, {"device": 1}, {"path": "dense"}, {"path": "mps "}, {"path": 3}):
            with self.assertRaises(ValueError, msg=str(kw)):
                qk.projected_gram(X, **kw)

    def test_projected_mps_60_qubits(self):
        # 60 qubits on the MPS path (no statevector): each qubit's reduced state depends on the
        # qubits within reps = 2 of it only (a layer's ZZ gates are diagonal and commute), so the
        # reference is numpy's partial trace of qk's statevector of that 5-qubit window
        X = RNG.uniform(-1, 1, (7, 60))
        K = qk.projected_gram(X, map="zz(reps=2,ent=linear)", gamma=0.1, path="mps", device="cpu")
        np.testing.assert_array_equal(K, qk.projected_gram(X, map="zz(reps=2,ent=linear)", gamma=0.1, device="cpu"))
        self.assertTrue(np.all(np.isfinite(K)))
        np.testing.assert_array_equal(K, K.T)
        np.testing.assert_array_equal(np.diag(K), 1.0)
        d2 = np.zeros((7, 7))
        for k in range(60):
            lo, hi = max(0, k - 2), min(60, k + 3)
            S = qk.FeatureMap("zz(reps=2,ent=linear)", hi - lo).statevector(X[:, lo:hi])
            t = S.reshape((7,) + (2,) * (hi - lo))
            r = np.moveaxis(t, 1 + (hi - 1 - k), 1).reshape(7, 2, -1)   # axis 1 + j: qubit hi - 1 - j
            rho = r @ r.conj().transpose(0, 2, 1)
            d2 += np.sum(np.abs(rho[:, None] - rho[None, :]) ** 2, axis=(2, 3))
        np.testing.assert_allclose(K, np.exp(-0.1 * d2), atol=1e-12, rtol=0)
        self.assertLess(K.min(), 0.9)
        # the same K from the command line (qk-gram --projected), where the build made it
        exe = os.environ.get("QK_GRAM")
        if not exe or not os.path.exists(exe):
            raise unittest.SkipTest("QK_GRAM (the qk-gram program) is not set: the CLI comparison is skipped")
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "X.npy"), X)
            subprocess.run([exe, "--projected", "--gamma", "0.1", "--map", "zz(reps=2,ent=linear)", "--x", os.path.join(d, "X.npy"),
                            "--out", os.path.join(d, "K.npy"), "--device", "cpu", "--quiet"], check=True)
            np.testing.assert_allclose(np.load(os.path.join(d, "K.npy")), K, atol=1e-14, rtol=0)

    def test_projected_device(self):
        X = RNG.uniform(-1, 1, (9, 12))
        Y = RNG.uniform(-1, 1, (5, 12))
        if not qk.engine()["cuda_devices"]:
            with self.assertRaisesRegex(RuntimeError, "cuda"):
                qk.projected_gram(X, device="cuda")
            np.testing.assert_array_equal(qk.projected_gram(X, Y, device="auto"), qk.projected_gram(X, Y, device="cpu"))
            raise unittest.SkipTest("no CUDA device: the GPU engine's projected kernel is not compared")
        cases = [("zz(reps=2)", X, Y, None), ("zz(reps=2,ent=linear)", X, None, "mps"),
                 ("zz(reps=2,ent=linear)", X, Y, "statevector"), ("angle(rot=y)", X, Y, None),
                 ("zz(reps=2,ent=linear)", RNG.uniform(-1, 1, (6, 60)), None, None)]
        for spec, A, B, p in cases:
            Kc = qk.projected_gram(A, B, map=spec, gamma=0.5, device="cpu", path=p)
            for dev in ("cuda", "gpu"):
                Kg = qk.projected_gram(A, B, map=spec, gamma=0.5, device=dev, path=p)
                self.assertEqual(Kg.dtype, np.float64)
                np.testing.assert_allclose(Kg, Kc, atol=1e-12, rtol=0, err_msg=f"{spec} {p} {dev}")

    def test_shots_and_psd(self):
        X = RNG.uniform(-1, 1, (30, 4))
        K = qk.gram(X, map="zz(reps=2)", device="cpu", precision="fp64")
        Ks = qk.sampled(K, 1000, seed=1)
        np.testing.assert_array_equal(Ks, qk.sampled(K, 1000, seed=1))          # reproducible
        np.testing.assert_array_equal(Ks, Ks.T)
        np.testing.assert_array_equal(np.diag(Ks), np.diag(K))
        self.assertTrue(np.all(np.abs(Ks * 1000 - np.round(Ks * 1000))[np.triu_indices(30, 1)] < 1e-9))  # counts / shots
        z = (Ks - K)[np.triu_indices(30, 1)] / np.sqrt(K * (1 - K) / 1000 + 1e-12)[np.triu_indices(30, 1)]
        self.assertLess(abs(np.mean(z)), 0.3)            # unbiased: the mean of 435 standardised draws
        self.assertLess(abs(np.std(z) - 1.0), 0.2)       # with the binomial variance
        P = qk.closest_psd(Ks)
        self.assertGreaterEqual(np.linalg.eigvalsh(P).min(), -1e-12)
        w = np.linalg.eigvalsh(Ks)
        if w.min() < 0:   # the projection changes K by exactly the negative spectrum (Frobenius)
            self.assertAlmostEqual(np.linalg.norm(P - Ks), np.linalg.norm(w[w < 0]), places=10)
        with self.assertRaises(ValueError):
            qk.sampled(K, 0)


class TestMitigation(unittest.TestCase):
    """The noise mitigations and PSD repairs on their own definitions (test_pennylane.py checks
    them against PennyLane's functions): a depolarized K mitigated back to the noiseless one."""

    def setUp(self):
        self.K0 = qk.gram(RNG.uniform(0, np.pi, (14, 3)), map="zz(reps=2)", device="cpu", precision="fp64")
        self.dim = 8.0

    def test_global_depolarizing_noise_undone(self):
        p = 0.23
        Kn = (1 - p) * self.K0 + p / self.dim
        for method, use in (("average", None), ("average", [2, 5, 7]), ("single", None), ("single", [4])):
            np.testing.assert_allclose(qk.mitigate_depolarizing_noise(Kn, 3, method, use), self.K0, atol=1e-12, rtol=0)
        with self.assertRaises(ValueError):
            qk.mitigate_depolarizing_noise(np.full((4, 4), 0.1), 3, "single")
        with self.assertRaises(ValueError):
            qk.mitigate_depolarizing_noise(Kn, 3, "median")

    def test_split_channel_undone(self):
        lam = RNG.uniform(0.02, 0.3, 14)          # a rate per sample's embedding
        keep = np.outer(1 - lam, 1 - lam)
        Kn = keep * self.K0 + (1 - keep) / self.dim
        np.testing.assert_allclose(qk.mitigate_depolarizing_noise(Kn, 3, "split_channel"), self.K0, atol=1e-12, rtol=0)
        avg = qk.mitigate_depolarizing_noise(Kn, 3, "average")   # the global model does not undo it
        self.assertGreater(np.abs(avg - self.K0).max(), 1e-3)

    def test_psd_repairs(self):
        K2 = qk.gram(RNG.uniform(0, np.pi, (40, 2)), map="zz(reps=2)", device="cpu", precision="fp64")   # rank <= 16
        Ks = qk.sampled(K2, 50, seed=3)
        w = np.linalg.eigvalsh(Ks)
        self.assertLess(w[0], -1e-3)               # shot noise left a negative eigenvalue
        T, D, F = qk.threshold_psd(Ks), qk.displace_psd(Ks), qk.flip_psd(Ks)
        np.testing.assert_allclose(np.linalg.eigvalsh(T), np.clip(w, 0, None), atol=1e-12)
        np.testing.assert_allclose(T, qk.closest_psd(Ks), atol=1e-12)
        np.testing.assert_allclose(D - Ks, -w[0] * np.eye(40), atol=1e-14)
        np.testing.assert_allclose(np.linalg.eigvalsh(F), np.sort(np.abs(w)), atol=1e-12)
        for f in (qk.threshold_psd, qk.displace_psd, qk.flip_psd):   # a PSD K is left as it is
            Kp = self.K0 + 1e-3 * np.eye(14)
            np.testing.assert_array_equal(f(Kp), (Kp + Kp.T) / 2)
        with self.assertRaises(ValueError):
            qk.flip_psd(np.ones((3, 4)))


class TestTrainer(unittest.TestCase):
    def setUp(self):
        try:
            import scipy  # noqa: F401
            import sklearn  # noqa: F401
        except ImportError as e:
            self.skipTest(f"scipy / scikit-learn missing ({e})")

    def test_trainer(self):
        from sklearn.datasets import make_moons
        from sklearn.svm import SVC
        X, y = make_moons(80, noise=0.15, random_state=3)
        X = X * 1.5
        t = qk.KernelTrainer("hea(layers=2)", initial_weights=np.full(4, 0.3), maxiter=30).fit(X, y)
        self.assertEqual(len(t.optimal_point), 4)
        self.assertLess(t.optimal_value, t.loss_history[0] - 1e-3)   # the alignment grew
        self.assertEqual(t.optimal_value, min(t.loss_history))
        clf = SVC(kernel=t.kernel).fit(X, y)
        self.assertGreater(clf.score(X, y), 0.8)
        self.assertEqual(t.get_params()["maxiter"], 30)


if __name__ == "__main__":
    unittest.main()
