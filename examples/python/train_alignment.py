#!/usr/bin/env python3
"""Training a feature map's weights by kernel-target alignment: qk's exact gradients beside
qiskit-machine-learning's QuantumKernelTrainer with SPSA, on the same data, circuit, loss and
iteration budget.

    pip install .                      # at the repository root: builds and installs the qk package
    pip install qiskit qiskit-machine-learning scikit-learn scipy
    python3 examples/python/train_alignment.py [--maxiter 50] [--repeats 3]

(or, in a Meson build directory: PYTHONPATH=build/src/python python3 examples/python/train_alignment.py)

Data: scikit-learn's breast-cancer set (569 tumours, 30 features, two classes), standardised,
reduced to 4 principal components and scaled to [0, pi] (the scalers fitted on the training
split), 100 training samples and the other 469 for the test. Map: qk's ``hea(layers=2)`` at 4 qubits, per layer
RY(w * x_k) on each qubit and a CZ ring, 8 weights, all 1.0 at the start; the same circuit is
written in Qiskit with a ParameterVector ``w`` of training parameters and checked to give the
same K (to 1e-12) as qk at the initial weights. Loss: minus the kernel-target alignment of K on
the training set (``qk.alignment``), for both. Optimisers: qk.KernelTrainer (L-BFGS-B on the
exact gradient, ``qk.gram_vjp``) and QuantumKernelTrainer with SPSA (its learning rate and
perturbation calibrated, as by default), each with ``--maxiter`` iterations. Printed: the loss
each reaches, the time each takes to reach the loss SPSA ends at (SPSA's iterates scored
afterwards with the exact loss, untimed), and the test accuracy of an SVC on each trained
kernel. Exit status 77 when a package is missing (the test suite's skip), 1 when the kernels
disagree.
"""
import argparse
import statistics
import sys
import time
import warnings

try:
    import numpy as np
    from sklearn.datasets import load_breast_cancer
    from sklearn.decomposition import PCA
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import MinMaxScaler, StandardScaler
    from sklearn.svm import SVC
    import qk
    from qiskit import QuantumCircuit
    from qiskit.circuit import ParameterVector
    from qiskit_machine_learning.kernels import TrainableFidelityStatevectorKernel
    from qiskit_machine_learning.kernels.algorithms import QuantumKernelTrainer
    from qiskit_machine_learning.optimizers import SPSA
    from qiskit_machine_learning.utils import algorithm_globals
    from qiskit_machine_learning.utils.loss_functions import KernelLoss
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(77)


def load_data(n_train: int, n_test: int, n_qubits: int, seed: int):
    """The breast-cancer data, n_qubits principal components scaled to [0, pi]; labels 0 / 1."""
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, train_size=n_train, test_size=n_test, random_state=seed, stratify=y)
    pre = StandardScaler().fit(Xtr)
    pca = PCA(n_components=n_qubits, random_state=seed).fit(pre.transform(Xtr))
    mm = MinMaxScaler(feature_range=(0.0, np.pi)).fit(pca.transform(pre.transform(Xtr)))
    f = lambda A: np.clip(mm.transform(pca.transform(pre.transform(A))), 0.0, np.pi)
    return f(Xtr), f(Xte), ytr, yte


def hea_circuit(n_qubits: int, layers: int):
    """qk's hea(layers=L) as a Qiskit circuit: data parameters x, training parameters w."""
    x = ParameterVector("x", n_qubits)
    w = ParameterVector("w", layers * n_qubits)
    c = QuantumCircuit(n_qubits)
    for l in range(layers):
        for k in range(n_qubits):
            c.ry(w[l * n_qubits + k] * x[k], k)
        for k in range(n_qubits):
            c.cz(k, (k + 1) % n_qubits)
    return c, w


class AlignmentLoss(KernelLoss):
    """qiskit-machine-learning's KernelLoss for minus the kernel-target alignment (the loss
    qk.KernelTrainer minimises), so that both trainers optimise the same function. Counts its
    calls (SPSA's calibration included, which its own count leaves out)."""

    calls = 0

    def evaluate(self, parameter_values, quantum_kernel, data, labels):
        self.calls += 1
        quantum_kernel.assign_training_parameters(parameter_values)
        return -qk.alignment(quantum_kernel.evaluate(np.asarray(data)), labels)[0]


def train_qk(spec, Xtr, ytr, w0, maxiter):
    """qk.KernelTrainer (L-BFGS-B, exact gradients): (trainer, [(seconds, loss) per evaluation])."""
    trace = []
    t0 = time.perf_counter()
    t = qk.KernelTrainer(spec, initial_weights=w0, maxiter=maxiter,
                         callback=lambda i, w, loss: trace.append((time.perf_counter() - t0, loss)))
    t.fit(Xtr, ytr)
    return t, trace, time.perf_counter() - t0


def train_spsa(circuit, wparams, Xtr, ytr, w0, maxiter, seed):
    """QuantumKernelTrainer with SPSA: (result, [(seconds, weights) per iteration], seconds, loss
    evaluations)."""
    algorithm_globals.random_seed = seed
    trace = []
    kern = TrainableFidelityStatevectorKernel(feature_map=circuit, training_parameters=wparams)
    t0 = time.perf_counter()
    opt = SPSA(maxiter=maxiter, callback=lambda nfev, w, f, step, ok: trace.append((time.perf_counter() - t0, np.array(w))))
    loss = AlignmentLoss()
    res = QuantumKernelTrainer(quantum_kernel=kern, loss=loss, optimizer=opt, initial_point=w0).fit(Xtr, ytr)
    return res, trace, time.perf_counter() - t0, loss.calls


def first_time(trace, target):
    """The time of the first entry of trace [(seconds, loss)] with loss <= target (None: never)."""
    return next((s for s, loss in trace if loss <= target + 1e-12), None)


def svc_accuracy(Ktr, Kte, ytr, yte):
    return SVC(kernel="precomputed").fit(Ktr, ytr).score(Kte, yte)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qubits", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--n-test", type=int, default=None, help="default: the rest of the 569 samples")
    ap.add_argument("--maxiter", type=int, default=50, help="iterations of each optimiser")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each trainer (times: min and median)")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()

    Xtr, Xte, ytr, yte = load_data(a.n_train, a.n_test, a.qubits, a.seed)
    spec = f"hea(layers={a.layers})"
    nw = a.layers * a.qubits
    w0 = np.ones(nw)
    circuit, wparams = hea_circuit(a.qubits, a.layers)
    print(f"qk {qk.__version__}; breast cancer, {a.qubits} PCA features in [0, pi], {len(ytr)} train / "
          f"{len(yte)} test; map {spec} ({nw} weights, all 1.0 at the start); {a.maxiter} iterations each")

    # the same kernel: qk's hea, the Qiskit circuit through qk's adapter, qiskit-machine-learning
    kq = TrainableFidelityStatevectorKernel(feature_map=circuit, training_parameters=wparams)
    kq.assign_training_parameters(w0)
    K_qiskit = kq.evaluate(Xtr)
    K_qk = qk.gram(Xtr, map=spec, weights=w0, device="cpu", precision="fp64")
    K_adapter = qk.gram(Xtr, map=qk.FeatureMap.from_qiskit(circuit, weights=wparams, weight_values=w0),
                        device="cpu", precision="fp64")
    d = max(np.abs(K_qk - K_qiskit).max(), np.abs(K_adapter - K_qiskit).max())
    print(f"K at the initial weights: qk hea vs qiskit-machine-learning max |dK| = {d:.1e}")
    if d > 1e-12:
        print("the kernels disagree")
        return 1
    loss0 = -qk.alignment(K_qk, ytr)[0]

    qk_runs, sp_runs = [], []
    for r in range(a.repeats):
        qk_runs.append(train_qk(spec, Xtr, ytr, w0, a.maxiter))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            sp_runs.append(train_spsa(circuit, wparams, Xtr, ytr, w0, a.maxiter, a.seed + r))

    exact = lambda w: -qk.alignment(qk.gram(Xtr, map=spec, weights=w, device="cpu", precision="fp64"), ytr)[0]
    rows = []
    for (t, qtrace, qsec), (res, strace, ssec, scalls) in zip(qk_runs, sp_runs):
        sloss = [(s, exact(w)) for s, w in strace]            # SPSA's iterates, scored afterwards
        s_final = exact(res.optimal_point)
        target = s_final
        rows.append(dict(qk_loss=t.optimal_value, qk_evals=t.n_evals, qk_sec=qsec, qk_to_target=first_time(qtrace, target),
                         sp_loss=s_final, sp_evals=scalls, sp_sec=ssec, sp_to_target=first_time(sloss, target),
                         qk_w=t.optimal_point, sp_w=res.optimal_point, sp_kernel=res.quantum_kernel))

    med = lambda k: statistics.median(r[k] for r in rows if r[k] is not None)
    mn = lambda k: min(r[k] for r in rows if r[k] is not None)
    print(f"initial loss (-alignment) {loss0:.6f}")
    for i, r in enumerate(rows):
        print(f"run {i}: qk L-BFGS-B loss {r['qk_loss']:.6f} ({r['qk_evals']} evaluations, {r['qk_sec']:.3f} s); "
              f"SPSA loss {r['sp_loss']:.6f} ({r['sp_evals']} evaluations, {r['sp_sec']:.2f} s); "
              f"to SPSA's final loss: qk {r['qk_to_target']:.3f} s, SPSA {r['sp_to_target']:.2f} s")
    print(f"time to SPSA's final loss, min / median of {len(rows)}: qk {mn('qk_to_target'):.3f} / {med('qk_to_target'):.3f} s, "
          f"SPSA {mn('sp_to_target'):.2f} / {med('sp_to_target'):.2f} s")
    print(f"whole training, min / median: qk {mn('qk_sec'):.3f} / {med('qk_sec'):.3f} s, "
          f"SPSA {mn('sp_sec'):.2f} / {med('sp_sec'):.2f} s")

    # the test accuracy of an SVC on each trained kernel (SPSA's through qiskit-machine-learning)
    def acc_qk(w):
        return svc_accuracy(qk.gram(Xtr, map=spec, weights=w, device="cpu", precision="fp64"),
                            qk.gram(Xte, Xtr, map=spec, weights=w, device="cpu", precision="fp64"), ytr, yte)
    acc_sp = [svc_accuracy(r["sp_kernel"].evaluate(Xtr), r["sp_kernel"].evaluate(Xte, Xtr), ytr, yte) for r in rows]
    print(f"SVC test accuracy: initial weights {acc_qk(w0):.3f}, qk-trained {acc_qk(rows[0]['qk_w']):.3f}, "
          f"SPSA-trained {' '.join(f'{v:.3f}' for v in acc_sp)} (median {statistics.median(acc_sp):.3f})")
    return 0 if all(r["qk_loss"] <= r["sp_loss"] + 1e-9 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
