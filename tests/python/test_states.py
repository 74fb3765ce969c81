"""qk.gram_states (issue 28): K from given statevectors, against the peers' own overlaps for circuits
qk's feature maps cannot express (Qiskit's u and cu gates, PennyLane's Rot and CRX), to 1e-12;
qk's own states (FeatureMap.statevector) give qk.gram's K bit for bit; every dtype and layout numpy
hands over (complex64, float32, strided rows, Fortran order, a CPU torch tensor if installed);
validation errors name the row; a .npy output. Each peer's part skips without that peer."""
import os
import tempfile
import unittest

import numpy as np

import qk

RNG = np.random.default_rng(28)


def _ref(A, B):
    return np.abs(A.conj() @ B.T) ** 2


def _rand_states(n, dim, dtype=np.complex128):
    S = RNG.normal(size=(n, dim)) + (1j * RNG.normal(size=(n, dim)) if np.iscomplexobj(np.zeros(1, dtype)) else 0)
    S = S / np.linalg.norm(S, axis=1, keepdims=True)
    return S.astype(dtype)


class TestStates(unittest.TestCase):
    def test_own_states_bitwise(self):
        m = qk.FeatureMap("zz(reps=2)", 6)
        X = RNG.uniform(-1, 1, size=(120, 6))
        Y = RNG.uniform(-1, 1, size=(50, 6))
        K = qk.gram(X, map=m, device="cpu", precision="fp64")
        Ks = qk.gram_states(m.statevector(X), device="cpu", precision="fp64")
        self.assertTrue(np.array_equal(K, Ks))
        K = qk.gram(X, Y, map=m, device="cpu", precision="fp64")
        Ks = qk.gram_states(m.statevector(X), m.statevector(Y), device="cpu", precision="fp64")
        self.assertTrue(np.array_equal(K, Ks))

    def test_dtypes_and_layouts(self):
        A = _rand_states(70, 40)
        B = _rand_states(30, 40)
        K = _ref(A, B)
        np.testing.assert_allclose(qk.gram_states(A, B, device="cpu"), K, atol=1e-13, rtol=0)
        np.testing.assert_allclose(qk.gram_states(A, device="cpu"), _ref(A, A), atol=1e-13, rtol=0)
        # strided rows (a column slice), Fortran order: used as they are or copied, same K
        W = np.zeros((70, 50), complex)
        W[:, :40] = A
        np.testing.assert_allclose(qk.gram_states(W[:, :40], B, device="cpu"), K, atol=1e-13, rtol=0)
        WB = np.zeros((30, 45), complex)
        WB[:, :40] = B
        np.testing.assert_allclose(qk.gram_states(A, WB[:, :40], device="cpu"), K, atol=1e-13, rtol=0)
        np.testing.assert_allclose(qk.gram_states(np.asfortranarray(A), B, device="cpu"), K, atol=1e-13, rtol=0)
        # complex64, float64, float32: against the definition on the rounded values
        A64, B64 = A.astype(np.complex64), B.astype(np.complex64)
        np.testing.assert_allclose(qk.gram_states(A64, B64, device="cpu", norm_tol=1e-5),
                                   _ref(A64.astype(complex), B64.astype(complex)), atol=1e-12, rtol=0)
        R = _rand_states(60, 33, np.float64)
        np.testing.assert_allclose(qk.gram_states(R, device="cpu"), _ref(R, R), atol=1e-13, rtol=0)
        R32 = R.astype(np.float32)
        np.testing.assert_allclose(qk.gram_states(R32, device="cpu"), _ref(R32.astype(float), R32.astype(float)), atol=1e-12, rtol=0)
        with self.assertRaises(ValueError):
            qk.gram_states(A, _rand_states(5, 41), device="cpu")
        with self.assertRaises(TypeError):
            qk.gram_states(A, B64, device="cpu")
        try:
            import torch
        except ImportError:
            return
        np.testing.assert_allclose(qk.gram_states(torch.from_numpy(A), device="cpu"), _ref(A, A), atol=1e-13, rtol=0)

    def test_validation(self):
        A = _rand_states(20, 16)
        A[7] *= 1.001
        with self.assertRaisesRegex(ValueError, r"A\[7\]"):
            qk.gram_states(A, device="cpu")
        K = qk.gram_states(A, device="cpu", norm_tol=0.01)       # |A[7]|^2 = 1.001^2: within 0.01
        self.assertAlmostEqual(K[7, 7], 1.001 ** 4, delta=1e-12)
        K = qk.gram_states(A, device="cpu", normalize=True)
        np.testing.assert_allclose(np.diag(K), 1.0, atol=1e-14, rtol=0)
        A[3, 2] = np.nan
        with self.assertRaisesRegex(ValueError, r"A\[3\]"):
            qk.gram_states(A, device="cpu", normalize=True)
        with self.assertRaisesRegex(ValueError, "square"):
            qk.gram_states(np.zeros((2, 4, 3), complex), device="cpu")

    def test_npy(self):
        A = _rand_states(90, 32)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "K.npy")
            K = qk.gram_states(A, device="cpu", out=p)
            np.testing.assert_allclose(np.load(p), _ref(A, A), atol=1e-13, rtol=0)
            self.assertEqual(K.shape, (90, 90))


class TestQiskit(unittest.TestCase):
    def setUp(self):
        try:
            import qiskit  # noqa: F401
        except ImportError as e:
            self.skipTest(f"qiskit is not installed ({e})")

    def test_u_cu_circuits(self):
        from qiskit import QuantumCircuit
        from qiskit.quantum_info import Statevector
        n, q = 24, 5
        svs = []
        for _ in range(n):
            c = QuantumCircuit(q)
            for layer in range(3):
                for k in range(q):
                    c.u(*RNG.uniform(0, 2 * np.pi, 3), k)
                for k in range(q - 1):
                    c.cu(*RNG.uniform(0, 2 * np.pi, 4), k, k + 1)
            svs.append(Statevector(c))
        S = np.array([sv.data for sv in svs])
        K = qk.gram_states(S, device="cpu")
        peer = np.array([[abs(a.inner(b)) ** 2 for b in svs] for a in svs])
        np.testing.assert_allclose(K, peer, atol=1e-12, rtol=0)


class TestQiskitMixed(unittest.TestCase):
    def setUp(self):
        try:
            import qiskit  # noqa: F401
        except ImportError as e:
            self.skipTest(f"qiskit is not installed ({e})")

    def test_noisy_density_matrices(self):
        """Density matrices of u/cu circuits under a depolarising channel after each layer
        (qiskit.quantum_info: DensityMatrix.evolve with a Kraus channel): K = Tr(rho sigma), its
        diagonal Qiskit's purity(), and pure vs mixed Qiskit's <psi|rho|psi> (expectation_value)."""
        from qiskit import QuantumCircuit
        from qiskit.quantum_info import DensityMatrix, Kraus, Statevector
        q, p = 3, 0.1
        I, X, Y, Z = (np.eye(2), np.array([[0, 1], [1, 0]]), np.array([[0, -1j], [1j, 0]]), np.diag([1, -1]))
        dep = Kraus([np.sqrt(1 - 3 * p / 4) * I, np.sqrt(p / 4) * X, np.sqrt(p / 4) * Y, np.sqrt(p / 4) * Z])
        rhos, svs = [], []
        for _ in range(10):
            rho = DensityMatrix.from_label("0" * q)
            c0 = QuantumCircuit(q)
            for layer in range(2):
                c = QuantumCircuit(q)
                for k in range(q):
                    c.u(*RNG.uniform(0, 2 * np.pi, 3), k)
                c.cu(*RNG.uniform(0, 2 * np.pi, 4), 0, 1)
                rho = rho.evolve(c)
                c0.compose(c, inplace=True)
                for k in range(q):
                    rho = rho.evolve(dep, qargs=[k])
            rhos.append(rho)
            svs.append(Statevector(c0))
        R = np.array([r.data for r in rhos])
        K = qk.gram_states(R, device="cpu")
        peer = np.array([[np.real(np.trace(a.data @ b.data)) for b in rhos] for a in rhos])
        np.testing.assert_allclose(K, peer, atol=1e-12, rtol=0)
        np.testing.assert_allclose(np.diag(K), [r.purity().real for r in rhos], atol=1e-12, rtol=0)
        S = np.array([sv.data for sv in svs])
        Kpm = qk.gram_states(S, R, device="cpu")
        peer = np.array([[np.real(sv.expectation_value(r.to_operator())) for r in rhos] for sv in svs])
        np.testing.assert_allclose(Kpm, peer, atol=1e-12, rtol=0)


def _rand_dms(n, dim, dtype=np.complex128):
    """n random density matrices: mixtures of 2..4 random pure states (purity < 1)."""
    out = []
    for _ in range(n):
        r = int(RNG.integers(2, 5))
        w = RNG.uniform(0.05, 1.05, size=r)
        S = _rand_states(r, dim, np.complex128 if np.iscomplexobj(np.zeros(1, dtype)) else np.float64)
        rho = (S.T * (w / w.sum())) @ S.conj()
        out.append((rho + rho.conj().T) / 2)
    return np.array(out).astype(dtype)


def _hs(A, B):
    return np.real(np.einsum("iab,jba->ij", A.astype(np.complex128), B.astype(np.complex128)))


class TestMixedGPU(unittest.TestCase):
    """Density matrices on the GPU engine (K = Tr(rho_i rho_j), the plan's linear epilogue):
    numpy arrays with device="cuda", CuPy and PyTorch CUDA arrays read in place; skips without a
    GPU (and each array library's part without that library)."""

    def setUp(self):
        if not qk.engine()["cuda_devices"]:
            self.skipTest("no CUDA device")

    def test_numpy_on_gpu(self):
        for dtype, tol in ((np.complex128, 1e-12), (np.complex64, 1e-12), (np.float64, 1e-12)):
            A, B = _rand_dms(90, 6, dtype), _rand_dms(40, 6, dtype)
            nt = 1e-5 if dtype == np.complex64 else None
            ref = _hs(A, B)
            Kc = qk.gram_states(A, B, device="cpu", norm_tol=nt)
            np.testing.assert_allclose(Kc, ref, atol=1e-12, rtol=0)
            K = qk.gram_states(A, B, device="cuda", precision="fp64", norm_tol=nt)
            np.testing.assert_allclose(K, Kc, atol=tol, rtol=0)
            K = qk.gram_states(A, device="cuda", precision="fp64", norm_tol=nt)
            np.testing.assert_allclose(K, _hs(A, A), atol=tol, rtol=0)
            # the GPU's default (fp32-class: fp32x3 on the tensor cores from 7 qubits of the
            # vector, complex here; fp32 at 6, real here): inside the stated bound (3.5e-4,
            # 3.8e-4), far from K^2 (off by ~0.1)
            K32 = qk.gram_states(A, B, device="cuda", norm_tol=nt)
            self.assertEqual(K32.dtype, np.float32)
            np.testing.assert_allclose(K32, Kc, atol=1e-4, rtol=0)
        # pure states against density matrices (host): <psi|rho|psi>
        S, R = _rand_states(30, 5), _rand_dms(25, 5)
        ref = np.real(np.einsum("ia,jab,ib->ij", S.conj(), R, S))
        np.testing.assert_allclose(qk.gram_states(S, R, device="cuda", precision="fp64"), ref, atol=1e-12, rtol=0)
        # validation on the GPU context names the row
        R[4, 0, 1] += 1e-3
        with self.assertRaisesRegex(ValueError, r"A\[4\].*Hermitian"):
            qk.gram_states(R, device="cuda")

    def test_cupy(self):
        try:
            import cupy as cp
        except ImportError as e:
            self.skipTest(f"cupy is not installed ({e})")
        A, B = _rand_dms(70, 8), _rand_dms(30, 8)
        Kc = qk.gram_states(A, B, device="cpu")
        dA, dB = cp.asarray(A), cp.asarray(B)
        np.testing.assert_allclose(qk.gram_states(dA, dB, precision="fp64"), Kc, atol=1e-12, rtol=0)
        np.testing.assert_allclose(qk.gram_states(dA, precision="fp64"), _hs(A, A), atol=1e-12, rtol=0)
        np.testing.assert_allclose(qk.gram_states(dA, dB, normalize=True, precision="fp64"), Kc, atol=1e-12, rtol=0)
        bad = dA.copy()
        bad[9, 2, 2] += 0.5    # trace 1.5
        with self.assertRaisesRegex(ValueError, r"A\[9\].*trace"):
            qk.gram_states(bad)
        with self.assertRaises(ValueError):   # not contiguous within a matrix
            qk.gram_states(dA.transpose(0, 2, 1))

    def test_torch_cuda(self):
        try:
            import torch
        except ImportError as e:
            self.skipTest(f"torch is not installed ({e})")
        if not torch.cuda.is_available():
            self.skipTest("torch has no CUDA")
        A = _rand_dms(50, 4)
        tA = torch.from_numpy(A).cuda()
        np.testing.assert_allclose(qk.gram_states(tA, precision="fp64"), _hs(A, A), atol=1e-12, rtol=0)
        A32 = A.astype(np.complex64)
        np.testing.assert_allclose(qk.gram_states(torch.from_numpy(A32).cuda(), precision="fp32", norm_tol=1e-5),
                                   _hs(A32, A32), atol=1e-4, rtol=0)


class TestPennyLane(unittest.TestCase):
    def setUp(self):
        try:
            import pennylane  # noqa: F401
        except ImportError as e:
            self.skipTest(f"pennylane is not installed ({e})")

    def test_rot_crx_circuits(self):
        import pennylane as qml
        q = 4
        dev = qml.device("default.qubit", wires=q)

        def body(w):
            for layer in range(2):
                for k in range(q):
                    qml.Rot(*w[layer, k, :3], wires=k)
                for k in range(q - 1):
                    qml.CRX(w[layer, k, 3], wires=[k, k + 1])

        @qml.qnode(dev)
        def state(w):
            body(w)
            return qml.state()

        @qml.qnode(dev)
        def overlap(w1, w2):   # the peer's own kernel circuit: U(w2)^dagger U(w1) |0>, P(0)
            body(w1)
            qml.adjoint(body)(w2)
            return qml.probs(wires=range(q))

        W = RNG.uniform(0, 2 * np.pi, size=(12, 2, q, 4))
        S = np.array([np.asarray(state(w)) for w in W])
        K = qk.gram_states(S, device="cpu")
        peer = np.array([[float(overlap(a, b)[0]) for b in W] for a in W])
        np.testing.assert_allclose(K, peer, atol=1e-12, rtol=0)

    def test_density_matrix(self):
        import pennylane as qml
        q = 3
        dev = qml.device("default.mixed", wires=q)

        @qml.qnode(dev)
        def rho(w):
            for k in range(q):
                qml.Rot(*w[k, :3], wires=k)
                qml.DepolarizingChannel(0.1, wires=k)
            qml.CRX(w[0, 3], wires=[0, 1])
            qml.AmplitudeDamping(0.2, wires=1)
            return qml.density_matrix(wires=range(q))

        W = RNG.uniform(0, 2 * np.pi, size=(8, q, 4))
        R = np.array([np.asarray(rho(w)) for w in W])
        K = qk.gram_states(R, device="cpu")
        peer = np.array([[np.real(np.trace(a @ b)) for b in R] for a in R])
        np.testing.assert_allclose(K, peer, atol=1e-12, rtol=0)
        np.testing.assert_allclose(np.diag(K), [float(qml.math.purity(r, indices=range(q))) for r in R], atol=1e-12, rtol=0)


if __name__ == "__main__":
    unittest.main()
