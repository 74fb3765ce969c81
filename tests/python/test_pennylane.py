"""qk against PennyLane: the iqp and angle maps' kernels equal kernels from PennyLane's
IQPEmbedding / AngleEmbedding states (default.qubit) at 1e-10 in fp64, and the states match with
PennyLane's wire order (wire 0 = most significant bit) reversed; qml.kernels' kernel_matrix,
square_kernel_matrix and target_alignment, which call kernel(x1, x2) -> scalar, give with a qk.Kernel
what they give with PennyLane's own adjoint-embedding kernel circuit, to 1e-12; qk's noise
mitigations and PSD repairs equal qml.kernels' (mitigate_depolarizing_noise's three methods,
threshold_matrix, displace_matrix, flip_matrix) to 1e-12. Skips without pennylane."""
import unittest

import numpy as np

import qk

try:
    import pennylane as qml
except ImportError as e:
    raise unittest.SkipTest(f"pennylane is not installed ({e}): pip install pennylane")

RNG = np.random.default_rng(5)
TOL = 1e-10


def _states(embed, X, **kw):
    d = X.shape[1]
    dev = qml.device("default.qubit", wires=d)

    @qml.qnode(dev)
    def circuit(x):
        embed(x, wires=range(d), **kw)
        return qml.state()

    return np.array([np.asarray(circuit(x)) for x in X])


def _kernel(SA, SB):
    return np.abs(SA.conj() @ SB.T) ** 2


def _reverse_bits(S, n):
    return S.reshape((-1,) + (2,) * n).transpose((0,) + tuple(range(n, 0, -1))).reshape(S.shape)


def test_iqp_embedding_kernel():
    for reps in (1, 2):
        X, Y = RNG.uniform(-np.pi, np.pi, (9, 3)), RNG.uniform(0, np.pi, (5, 3))
        SX = _states(qml.IQPEmbedding, X, n_repeats=reps)
        SY = _states(qml.IQPEmbedding, Y, n_repeats=reps)
        np.testing.assert_allclose(qk.gram(X, map=f"iqp(reps={reps})", precision="fp64"), _kernel(SX, SX), atol=TOL, rtol=0)
        np.testing.assert_allclose(qk.gram(X, Y, map=f"iqp(reps={reps})", precision="fp64"), _kernel(SX, SY), atol=TOL, rtol=0)
        np.testing.assert_allclose(qk.Kernel(f"iqp(reps={reps})", precision="fp64")(X, Y), _kernel(SX, SY), atol=TOL, rtol=0)
        ours = qk.FeatureMap(f"iqp(reps={reps})", 3).statevector(X)
        np.testing.assert_allclose(_reverse_bits(ours, 3), SX, atol=TOL)


def test_angle_embedding_kernel():
    X, Y = RNG.uniform(-np.pi, np.pi, (8, 4)), RNG.uniform(0, np.pi, (6, 4))
    for rot in ("X", "Y", "Z"):
        SX = _states(qml.AngleEmbedding, X, rotation=rot)
        SY = _states(qml.AngleEmbedding, Y, rotation=rot)
        spec = f"angle(rot={rot.lower()})"
        assert qk.FeatureMap(spec, 4).kind == "product"            # the analytic kernel: no states
        np.testing.assert_allclose(qk.gram(X, map=spec, precision="fp64"), _kernel(SX, SX), atol=TOL, rtol=0)
        np.testing.assert_allclose(qk.gram(X, Y, map=spec, precision="fp64"), _kernel(SX, SY), atol=TOL, rtol=0)
        ours = qk.FeatureMap(spec, 4).statevector(X)
        np.testing.assert_allclose(_reverse_bits(ours, 4), SX, atol=TOL)


# ---- qml.kernels: PennyLane calls kernel(x1, x2) -> a scalar, one pair at a time ----
TIGHT = 1e-12


def _pl_kernel(embed, d, **kw):
    """PennyLane's own embedding kernel: |<0|U(x2)^dagger U(x1)|0>|^2 as the probability of
    |0...0> (the circuit of PennyLane's kernel tutorial), for qml.kernels."""
    dev = qml.device("default.qubit", wires=d)

    @qml.qnode(dev)
    def circuit(x1, x2):
        embed(x1, wires=range(d), **kw)
        qml.adjoint(embed)(x2, wires=range(d), **kw)
        return qml.probs(wires=range(d))

    return lambda x1, x2: circuit(x1, x2)[0]


def test_qml_kernels_with_a_qk_kernel():
    d = 3
    X, Y = RNG.uniform(-np.pi, np.pi, (7, d)), RNG.uniform(0, np.pi, (4, d))
    labels = np.array([1, -1, 1, 1, -1, -1, 1])
    for embed, kw, spec in ((qml.IQPEmbedding, {"n_repeats": 2}, "iqp(reps=2)"),
                            (qml.AngleEmbedding, {"rotation": "Y"}, "angle(rot=y)")):
        theirs = _pl_kernel(embed, d, **kw)
        ours = qk.Kernel(spec, precision="fp64")
        assert type(ours(X[0], X[1])) is float
        np.testing.assert_allclose(qml.kernels.square_kernel_matrix(X, ours, assume_normalized_kernel=False),
                                   qml.kernels.square_kernel_matrix(X, theirs, assume_normalized_kernel=False),
                                   atol=TIGHT, rtol=0)
        np.testing.assert_allclose(qml.kernels.kernel_matrix(X, Y, ours), qml.kernels.kernel_matrix(X, Y, theirs),
                                   atol=TIGHT, rtol=0)
        # and the batched matrix of the same kernel
        np.testing.assert_allclose(qml.kernels.kernel_matrix(X, Y, ours), ours(X, Y), atol=TIGHT, rtol=0)
        for norm in (False, True):
            a = qml.kernels.target_alignment(X, labels, ours, assume_normalized_kernel=norm)
            b = qml.kernels.target_alignment(X, labels, theirs, assume_normalized_kernel=norm)
            assert abs(a - b) <= TIGHT, (spec, norm, a, b)


def test_noise_mitigation_and_psd_repairs_equal_pennylane():
    K0 = qk.gram(RNG.uniform(0, np.pi, (16, 4)), map="iqp", device="cpu", precision="fp64")
    lam = RNG.uniform(0.05, 0.4, 16)
    keep = np.outer(1 - lam, 1 - lam)
    K2 = qk.gram(RNG.uniform(0, np.pi, (40, 2)), map="zz(reps=2)", device="cpu", precision="fp64")   # rank <= 16
    cases = [(0.8 * K0 + 0.2 / 16, 4), (keep * K0 + (1 - keep) / 16, 4),
             (qk.sampled(0.9 * K2 + 0.1 / 4, 40, seed=9), 2)]           # with shot noise: negative eigenvalues
    assert np.linalg.eigvalsh(cases[2][0])[0] < -1e-3   # the repairs meet a matrix they change
    for Kn, q in cases:
        for method, use in (("single", None), ("single", [3]), ("average", None), ("average", [0, 5, 9]), ("split_channel", None)):
            ours = qk.mitigate_depolarizing_noise(Kn, q, method, use)
            theirs = qml.kernels.mitigate_depolarizing_noise(Kn, q, method, use)
            np.testing.assert_allclose(ours, theirs, atol=1e-12, rtol=0, err_msg=f"{method} {use}")
        for ours, theirs in ((qk.threshold_psd, qml.kernels.threshold_matrix), (qk.displace_psd, qml.kernels.displace_matrix),
                             (qk.flip_psd, qml.kernels.flip_matrix)):
            np.testing.assert_allclose(ours(Kn), np.asarray(theirs(Kn)), atol=1e-12, rtol=0, err_msg=ours.__name__)
