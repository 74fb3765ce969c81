"""qk with scikit-learn: SVC(kernel=qk.Kernel(...)) on the Iris data (examples/data/iris.csv) gives
the same predictions as SVC(kernel="precomputed") on qk.gram's matrices, the kernel clones, and
GridSearchCV searches over its map and weights. Skips without scikit-learn."""
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
