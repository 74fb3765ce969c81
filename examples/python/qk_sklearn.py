#!/usr/bin/env python3
"""qk from Python: ctypes + numpy + scikit-learn.

Computes quantum-kernel Gram matrices with qk (through the small C shim qkpy.c, built by Meson as
libqkpy) and trains scikit-learn's SVC on them (kernel="precomputed"). Data: the Iris set shipped
in examples/data, scaled to [0, pi].

    python3 examples/python/qk_sklearn.py --lib build/examples/python/libqkpy.so

Exit status 77 when numpy or scikit-learn is missing (the test suite treats it as a skip).
"""
import argparse, ctypes, os, sys

try:
    import numpy as np
    from sklearn.svm import SVC
    from sklearn.model_selection import train_test_split
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))


class Qk:
    """Thin wrapper: qk.gram(spec, X, Y=None, weights=None) -> numpy K."""

    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        f = self.lib.qkpy_gram
        dp = ctypes.POINTER(ctypes.c_double)
        f.argtypes = [ctypes.c_char_p, dp, ctypes.c_longlong, ctypes.c_int, dp, ctypes.c_longlong,
                      dp, ctypes.c_int, ctypes.c_int, dp, ctypes.c_char_p, ctypes.c_size_t]
        f.restype = ctypes.c_int

    def gram(self, spec, X, Y=None, weights=None, device="auto"):
        X = np.ascontiguousarray(X, dtype=np.float64)
        Yc = None if Y is None else np.ascontiguousarray(Y, dtype=np.float64)
        W = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64).ravel()
        K = np.empty((X.shape[0], X.shape[0] if Yc is None else Yc.shape[0]))
        err = ctypes.create_string_buffer(512)
        dp = lambda a: None if a is None else a.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        r = self.lib.qkpy_gram(spec.encode(), dp(X), X.shape[0], X.shape[1], dp(Yc),
                               0 if Yc is None else Yc.shape[0], dp(W), 0 if W is None else W.size,
                               {"auto": 0, "cpu": 1, "cuda": 2}[device], dp(K), err, len(err))
        if r != 0:
            raise RuntimeError(err.value.decode())
        return K


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path to libqkpy (built by meson)")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "data", "iris.csv"))
    ap.add_argument("--map", default="zz(reps=2,alpha=0.5)")
    a = ap.parse_args()
    qk = Qk(a.lib)
    raw = np.loadtxt(a.data, delimiter=",", skiprows=1)
    X, y = raw[:, :4], raw[:, 4].astype(int)
    X = (X - X.min(0)) / (X.max(0) - X.min(0)) * np.pi
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=7, stratify=y)
    Ktr = qk.gram(a.map, Xtr)
    Kte = qk.gram(a.map, Xte, Xtr)
    assert np.allclose(Ktr, Ktr.T) and np.allclose(np.diag(Ktr), 1.0)
    clf = SVC(kernel="precomputed", C=10.0).fit(Ktr, ytr)
    acc = (clf.predict(Kte) == yte).mean()
    print(f"qk + scikit-learn SVC, map {a.map}: test accuracy {acc:.4f} ({len(yte)} test samples)")
    try:
        qk.gram("zz(reps=2", Xtr)
    except RuntimeError as e:
        print(f"errors arrive as exceptions: {e}")
    return 0 if acc >= 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
