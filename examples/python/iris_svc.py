#!/usr/bin/env python3
"""qk from Python: a quantum-kernel SVM on the Iris data, with scikit-learn.

    pip install .                      # at the repository root: builds and installs the qk package
    python3 examples/python/iris_svc.py

(or, in a Meson build directory: PYTHONPATH=build/src/python python3 examples/python/iris_svc.py;
`meson test -C build python-example` runs it.)

The Iris features are scaled to [0, pi] and encoded by Qiskit's ZZFeatureMap (qk's "zz" map).
Three ways to hand the kernel to scikit-learn's SVC: the kernel object itself, a precomputed Gram
matrix, and a grid search over the map's repetitions. Exit status 77 when numpy, scikit-learn or
qk cannot be imported (the test suite's skip).
"""
import argparse
import os
import sys
import time

try:
    import numpy as np
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.svm import SVC
    import qk
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "..", "data", "iris.csv"))
    ap.add_argument("--map", default="zz(reps=2,alpha=0.5)", help="qk map spec (docs/maps.md)")
    a = ap.parse_args()

    raw = np.loadtxt(a.data, delimiter=",", skiprows=1)
    X, y = raw[:, :4], raw[:, 4].astype(int)
    X = (X - X.min(0)) / (X.max(0) - X.min(0)) * np.pi
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=7, stratify=y)
    print(f"qk {qk.__version__}, engine {qk.engine()}; map {a.map}; {len(ytr)} train / {len(yte)} test samples")

    # 1. the kernel as a callable: SVC calls K(X, Y) itself (fit computes the symmetric K(X, X))
    t = time.perf_counter()
    clf = SVC(kernel=qk.Kernel(a.map), C=10.0).fit(Xtr, ytr)
    acc = clf.score(Xte, yte)
    print(f"SVC(kernel=qk.Kernel(...)):   test accuracy {acc:.4f}  ({time.perf_counter() - t:.3f} s)")

    # 2. precomputed Gram matrices: K(train, train) and K(test, train)
    Ktr = qk.gram(Xtr, map=a.map)
    Kte = qk.gram(Xte, Xtr, map=a.map)
    assert np.allclose(Ktr, Ktr.T) and np.allclose(np.diag(Ktr), 1.0)
    acc2 = SVC(kernel="precomputed", C=10.0).fit(Ktr, ytr).score(Kte, yte)
    print(f"SVC(kernel='precomputed'):   test accuracy {acc2:.4f}")

    # 3. a grid search over the map and C: the kernel clones like any scikit-learn estimator
    grid = GridSearchCV(SVC(kernel=qk.Kernel(a.map)),
                        {"kernel__map": ["zz(reps=1,alpha=0.5)", "zz(reps=2,alpha=0.5)", "iqp"], "C": [1.0, 10.0]},
                        cv=3).fit(Xtr, ytr)
    print(f"GridSearchCV: best {grid.best_params_['kernel__map']}, C={grid.best_params_['C']}, "
          f"test accuracy {grid.score(Xte, yte):.4f}")

    # errors arrive as Python exceptions with qk's message
    try:
        qk.gram(Xtr, map="zz(reps=2")
    except ValueError as e:
        print(f"errors are exceptions: ValueError: {e}")
    return 0 if min(acc, acc2) >= 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
