"""qk with scikit-learn: SVC(kernel=qk.Kernel(...)) on the Iris data (examples/data/iris.csv) gives
the same predictions as SVC(kernel="precomputed") on qk.gram's matrices, the kernel clones, and
GridSearchCV searches over its map and weights; the per-pair protocol (two 1-D rows -> a float) makes
KernelRidge, KernelPCA and pairwise_kernels(metric=kernel) equal their precomputed-kernel results
to 1e-12, while a 2-D call stays one qk_gram. Skips without scikit-learn."""
import os
import unittest

import numpy as np

import qk

try:
    from sklearn.base import clone
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.svm import SVC
except ImportError as e:
    raise unittest.SkipTest(f"scikit-learn is not installed ({e}): pip install scikit-learn")

IRIS = os.environ.get("QK_IRIS_CSV") or os.path.join(os.path.dirname(__file__), "..", "..", "examples", "data", "iris.csv")


def _iris():
    raw = np.loadtxt(IRIS, delimiter=",", skiprows=1)
    X, y = raw[:, :4], raw[:, 4].astype(int)
    X = (X - X.min(0)) / (X.max(0) - X.min(0)) * np.pi
    return train_test_split(X, y, test_size=0.3, random_state=7, stratify=y)


def test_svc_kernel_equals_precomputed():
    Xtr, Xte, ytr, yte = _iris()
    spec = "zz(reps=2,alpha=0.5)"
    clf = SVC(kernel=qk.Kernel(spec), C=10.0).fit(Xtr, ytr)
    pre = SVC(kernel="precomputed", C=10.0).fit(qk.gram(Xtr, map=spec), ytr)
    np.testing.assert_array_equal(clf.predict(Xte), pre.predict(qk.gram(Xte, Xtr, map=spec)))
    np.testing.assert_array_equal(clf.support_, pre.support_)
    assert clf.score(Xte, yte) >= 0.9, clf.score(Xte, yte)


def test_clone_and_grid_search():
    Xtr, Xte, ytr, yte = _iris()
    k = qk.Kernel("zz(reps=2)", device="cpu")
    k2 = clone(k)
    assert k2 is not k and k2.get_params() == k.get_params()
    svc = clone(SVC(kernel=k))
    assert svc.kernel is not k and svc.kernel.get_params() == k.get_params()
    grid = GridSearchCV(SVC(kernel=qk.Kernel("zz(reps=1)")),
                        {"kernel__map": ["zz(reps=1,alpha=0.5)", "zz(reps=2,alpha=0.5)", "angle(rot=y)"],
                         "C": [1.0, 10.0]}, cv=3).fit(Xtr, ytr)
    assert grid.best_params_["kernel__map"] in ("zz(reps=1,alpha=0.5)", "zz(reps=2,alpha=0.5)", "angle(rot=y)")
    assert len(grid.cv_results_["params"]) == 6
    assert grid.score(Xte, yte) >= 0.9, grid.score(Xte, yte)
    # a trainable map: the weights are a searchable parameter too
    w1, w2 = np.full(8, 0.5), np.full(8, 1.0)
    grid = GridSearchCV(SVC(kernel=qk.Kernel("hea(layers=2)")), {"kernel__weights": [w1, w2]}, cv=3).fit(Xtr, ytr)
    assert any(grid.best_params_["kernel__weights"] is w for w in (w1, w2))


# ---- the per-pair protocol: scikit-learn calls a callable kernel with two 1-D rows ----
TIGHT = 1e-12


def _data(n=30, m=12, d=4, seed=3):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, np.pi, (n, d)), rng.uniform(0, np.pi, (m, d)), rng.normal(size=n)


def test_pair_call_returns_a_float():
    X, Y, _ = _data()
    k = qk.Kernel("zz(reps=2)", precision="fp64")
    v = k(X[0], Y[1])
    assert type(v) is float
    K = qk.gram(X, Y, map="zz(reps=2)", precision="fp64")
    assert abs(v - K[0, 1]) <= TIGHT
    assert abs(k(X[3]) - qk.gram(X[3:4], map="zz(reps=2)", precision="fp64")[0, 0]) <= TIGHT   # K(x, x)
    assert abs(k(X[2].astype(np.float32), list(Y[2].astype(np.float32))) -
               qk.gram(X[2:3].astype(np.float32), Y[2:3].astype(np.float32), map="zz(reps=2)", precision="fp64")[0, 0]) <= TIGHT
    # the map kept between pair calls follows the parameters: set_params, weights changed in place
    k.set_params(map="iqp(reps=1)")
    assert abs(k(X[0], Y[1]) - qk.gram(X[:1], Y[1:2], map="iqp(reps=1)", precision="fp64")[0, 0]) <= TIGHT
    w = np.full(8, 0.5)
    kw = qk.Kernel("hea(layers=2)", weights=w, precision="fp64")
    for _ in range(2):
        assert abs(kw(X[0], Y[1]) - qk.gram(X[:1], Y[1:2], map="hea(layers=2)", weights=w, precision="fp64")[0, 0]) <= TIGHT
        w[:] = 1.3
    # a 1-D sample with a matrix is ambiguous: an error, not a guess
    for a, b in ((X[0], Y), (X, Y[0])):
        try:
            k(a, b)
        except ValueError as e:
            assert "1-D" in str(e), e
        else:
            raise AssertionError("a 1-D sample with a 2-D matrix must raise ValueError")
    # wrong feature counts and bad values are typed errors here too
    for a, b, exc in ((X[0], Y[0, :3], ValueError), (np.array([np.nan, 1, 2, 3]), Y[0], ValueError),
                      (np.array(["a", "b", "c", "d"]), Y[0], TypeError)):
        try:
            k(a, b)
        except exc:
            pass
        else:
            raise AssertionError(f"{exc.__name__} not raised for {a!r}, {b!r}")


def test_batched_call_is_one_gram():
    # the 2-D call stays the fast path: one qk_gram for the whole matrix, whatever its size
    X, Y, _ = _data(n=40, m=25)
    calls = []
    real = qk._qk.gram

    def counting(*a, **kw):
        calls.append(a[1].shape)
        return real(*a, **kw)

    qk._qk.gram = counting
    try:
        K = qk.Kernel("zz(reps=2)")(X, Y)
        Ks = qk.Kernel("zz(reps=2)")(X, X)
    finally:
        qk._qk.gram = real
    assert K.shape == (40, 25) and Ks.shape == (40, 40)
    assert calls == [(40, 4), (40, 4)], calls


def test_pairwise_kernels_with_a_qk_kernel():
    from sklearn.metrics.pairwise import pairwise_kernels
    X, Y, _ = _data()
    for spec in ("zz(reps=2)", "iqp(reps=1)", "angle(rot=y)"):
        k = qk.Kernel(spec, precision="fp64")
        np.testing.assert_allclose(pairwise_kernels(X, metric=k), qk.gram(X, map=spec, precision="fp64"), atol=TIGHT, rtol=0)
        np.testing.assert_allclose(pairwise_kernels(X, Y, metric=k), qk.gram(X, Y, map=spec, precision="fp64"), atol=TIGHT, rtol=0)


def test_kernel_ridge_equals_precomputed():
    from sklearn.kernel_ridge import KernelRidge
    X, Y, t = _data()
    spec = "zz(reps=2,alpha=0.5)"
    ours = KernelRidge(kernel=qk.Kernel(spec, precision="fp64"), alpha=0.1).fit(X, t)
    pre = KernelRidge(kernel="precomputed", alpha=0.1).fit(qk.gram(X, map=spec, precision="fp64"), t)
    np.testing.assert_allclose(ours.dual_coef_, pre.dual_coef_, atol=TIGHT, rtol=0)
    np.testing.assert_allclose(ours.predict(Y), pre.predict(qk.gram(Y, X, map=spec, precision="fp64")), atol=TIGHT, rtol=0)


def test_kernel_pca_equals_precomputed():
    from sklearn.decomposition import KernelPCA
    X, Y, _ = _data()
    spec = "iqp(reps=1)"
    ours = KernelPCA(n_components=3, kernel=qk.Kernel(spec, precision="fp64"), eigen_solver="dense").fit(X)
    pre = KernelPCA(n_components=3, kernel="precomputed", eigen_solver="dense").fit(qk.gram(X, map=spec, precision="fp64"))
    np.testing.assert_allclose(ours.eigenvalues_, pre.eigenvalues_, atol=TIGHT, rtol=0)
    np.testing.assert_allclose(ours.transform(Y), pre.transform(qk.gram(Y, X, map=spec, precision="fp64")), atol=TIGHT, rtol=0)
