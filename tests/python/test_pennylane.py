"""qk against PennyLane: the iqp and angle maps' kernels equal kernels from PennyLane's
IQPEmbedding / AngleEmbedding states (default.qubit) at 1e-10 in fp64, and the states match with
PennyLane's wire order (wire 0 = most significant bit) reversed. Skips without pennylane."""
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
