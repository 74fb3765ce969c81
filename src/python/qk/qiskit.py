"""qiskit-machine-learning's kernel interface over qk: ``QKKernel``, a real ``BaseKernel``.

    >>> from qiskit.circuit.library import zz_feature_map
    >>> from qiskit_machine_learning.algorithms import QSVC, QSVR, PegasosQSVC
    >>> from qk.qiskit import QKKernel
    >>> kernel = QKKernel(zz_feature_map(4, reps=2))        # = FidelityStatevectorKernel(feature_map=...)
    >>> QSVC(quantum_kernel=kernel).fit(X, y)               # QSVR, PegasosQSVC likewise

Importing this module imports qiskit-machine-learning (``import qk`` does not). qk computes exact
fidelities |<psi(x)|psi(y)>|^2 of the circuit's states (``FeatureMap.from_qiskit``), the values of
qiskit-machine-learning's ``FidelityStatevectorKernel`` (to 1e-12 in fp64), in milliseconds
instead of seconds. ``QKTrainableKernel`` is the ``TrainableKernel`` side, for
``QuantumKernelTrainer``: a qk map's trainable weights as its training parameters. qk has exact
gradients of a loss of K with respect to the weights (and the data) too, ``qk_gram_vjp``: in
Python ``qk.gram_vjp`` and ``qk.KernelTrainer``, which trains the weights with them instead of
QuantumKernelTrainer's SPSA / COBYLA (docs/gradients.md).
"""
from __future__ import annotations

import warnings
from typing import Any, Optional, Union

import numpy as np
import numpy.typing as npt

try:
    from qiskit.circuit import ParameterVector, QuantumCircuit
    from qiskit_machine_learning.kernels import BaseKernel, TrainableKernel
except ImportError as e:  # pragma: no cover - exercised only without the peers
    raise ImportError(f"qk.qiskit needs qiskit and qiskit-machine-learning (pip install qiskit qiskit-machine-learning): {e}") from e

from . import DefaultWeightsWarning, FeatureMap, gram

__all__ = ["QKKernel", "QKTrainableKernel"]


class QKKernel(BaseKernel):
    """A qiskit-machine-learning kernel computed by qk: ``evaluate(x_vec, y_vec=None)``.

    feature_map: a Qiskit ``QuantumCircuit`` whose parameters are the data (``zz_feature_map(4)``,
        any circuit ``qk.FeatureMap.from_qiskit`` converts; a copy is converted once, here, and is
        what ``feature_map`` returns), a ``qk.FeatureMap``, or a qk spec string (``"zz(reps=2)"``,
        docs/maps.md) with ``num_features``.
    num_features: the number of features, for a spec string only.
    enforce_psd: as in ``BaseKernel``: project the symmetric K(x, x) onto the PSD cone. qk's K is
        exact (no shot noise), so, as ``FidelityStatevectorKernel`` without shots does, K is left
        as computed in fp64; the projection is applied where K was computed in a reduced precision
        (fp32 and the GPU's tensor-core modes), whose rounding can leave eigenvalues of -1e-7.
    weights, device, precision, threads: as in ``qk.gram`` (``precision="fp64"`` for
        qiskit-machine-learning's values to 1e-12 on a GPU, whose default is fp32).

    ``evaluate`` follows ``BaseKernel.evaluate``: x_vec and y_vec are (n, d) arrays or one 1-D
    sample; y_vec None or equal to x_vec is the symmetric case; an empty x_vec or y_vec gives an
    (n, 0) / (0, m) array (PegasosQSVC's first step). Data of another feature count is a
    ValueError (qk does not resize the map).
    """

    def __init__(self, feature_map: Union[QuantumCircuit, FeatureMap, str, None] = None, *,
                 num_features: Optional[int] = None, enforce_psd: bool = True,
                 weights: Optional[npt.ArrayLike] = None, device: str = "auto",
                 precision: Optional[str] = None, threads: Optional[int] = None) -> None:
        if feature_map is None:
            raise TypeError("QKKernel needs a feature map: a QuantumCircuit (zz_feature_map(n)), a qk.FeatureMap "
                            "or a qk spec string with num_features")
        if isinstance(feature_map, QuantumCircuit):
            if num_features is not None:
                raise ValueError("num_features is for a spec string; a circuit's parameters are its features")
            circuit = feature_map.copy()
            fm = FeatureMap.from_qiskit(circuit, weight_values=None)
            super().__init__(feature_map=circuit, enforce_psd=enforce_psd)
        else:
            if isinstance(feature_map, FeatureMap):
                if num_features is not None and num_features != feature_map.n_features:
                    raise ValueError(f"num_features={num_features}, the FeatureMap takes {feature_map.n_features}")
                fm = feature_map
            elif isinstance(feature_map, str):
                if num_features is None:
                    raise TypeError("a spec string needs num_features (QKKernel('zz(reps=2)', num_features=4))")
                fm = FeatureMap(feature_map, num_features, weights)
                weights = None
            else:
                raise TypeError(f"feature_map must be a QuantumCircuit, a qk.FeatureMap or a spec string "
                                f"(got {type(feature_map).__name__})")
            # BaseKernel.__init__ reads a circuit's num_parameters; a qk map sets the same fields
            self._feature_map = fm
            self._num_features = fm.n_features
            self._enforce_psd = bool(enforce_psd)
        if weights is not None:
            fm = fm.with_weights(weights)
        self._qk_map = fm
        self._device = device
        self._precision = precision
        self._threads = threads

    @property
    def qk_feature_map(self) -> FeatureMap:
        """The qk FeatureMap this kernel computes with."""
        return self._qk_map

    def _as_samples(self, v: Any, name: str) -> np.ndarray:
        a = np.asarray(v)
        if a.ndim == 1:
            a = a.reshape(1, -1)
        if a.ndim != 2:
            raise ValueError(f"{name} must be a 1D or 2D array (got shape {a.shape})")
        if a.shape[1] != self._num_features:
            raise ValueError(f"{name} has {a.shape[1]} features, the feature map takes {self._num_features}")
        return a

    def evaluate(self, x_vec: npt.ArrayLike, y_vec: Optional[npt.ArrayLike] = None) -> np.ndarray:
        """The kernel matrix K[i, j] = |<psi(x_i)|psi(y_j)>|^2 (float64, n x m); y_vec None: K(x_vec, x_vec)."""
        x = self._as_samples(x_vec, "x_vec")
        y = None if y_vec is None else self._as_samples(y_vec, "y_vec")
        symmetric = y is None or (y.shape == x.shape and np.array_equal(x, y))
        K = gram(x, None if symmetric else y, map=self._qk_map, device=self._device,
                 precision=self._precision, threads=self._threads)
        reduced = K.dtype != np.float64
        K = np.asarray(K, dtype=np.float64)
        if symmetric and self._enforce_psd and reduced and K.size:
            w, v = np.linalg.eigh(K)
            K = (v * np.maximum(w, 0.0)) @ v.T
        return K

    def __repr__(self) -> str:
        return (f"QKKernel({self._qk_map!r}, enforce_psd={self._enforce_psd}, device={self._device!r}, "
                f"precision={self._precision!r}, threads={self._threads!r})")


class QKTrainableKernel(TrainableKernel, QKKernel):
    """A qiskit-machine-learning ``TrainableKernel`` computed by qk, for ``QuantumKernelTrainer``:
    the trainable weights of a qk map (``hea``, circuits with ``w`` parameters) are its training
    parameters, a ``ParameterVector("w", n_weights)``; ``assign_training_parameters`` sets them
    and ``evaluate`` computes K at those values, as ``TrainableFidelityStatevectorKernel`` does.
    For exact gradients instead of QuantumKernelTrainer's SPSA / COBYLA, ``qk.KernelTrainer``.

    feature_map: a qk spec string (with num_features) or a ``qk.FeatureMap`` with weights;
    initial_weights: assigned at once (else assign before evaluate); the other arguments as
    QKKernel's.
    """

    def __init__(self, feature_map: Union[FeatureMap, str, None] = None, *, num_features: Optional[int] = None,
                 initial_weights: Optional[npt.ArrayLike] = None, enforce_psd: bool = True, device: str = "auto",
                 precision: Optional[str] = None, threads: Optional[int] = None) -> None:
        if isinstance(feature_map, QuantumCircuit):
            raise TypeError("QKTrainableKernel takes a qk map (a spec string or qk.FeatureMap); for a Qiskit circuit with "
                            "training parameters use qiskit-machine-learning's TrainableFidelityStatevectorKernel")
        if isinstance(feature_map, str):
            if num_features is None:
                raise TypeError("a spec string needs num_features")
            with warnings.catch_warnings():   # the weights are training parameters, assigned later
                warnings.simplefilter("ignore", DefaultWeightsWarning)
                feature_map = FeatureMap(feature_map, num_features, initial_weights)
        if not isinstance(feature_map, FeatureMap):
            raise TypeError(f"feature_map must be a qk.FeatureMap or a spec string (got {type(feature_map).__name__})")
        if feature_map.n_weights == 0:
            raise ValueError(f"the map {feature_map.spec!r} has no trainable weights")
        super().__init__(training_parameters=ParameterVector("w", feature_map.n_weights), feature_map=feature_map,
                         enforce_psd=enforce_psd, device=device, precision=precision, threads=threads)
        if initial_weights is not None:
            self.assign_training_parameters(list(np.asarray(initial_weights, dtype=np.float64)))

    def evaluate(self, x_vec: npt.ArrayLike, y_vec: Optional[npt.ArrayLike] = None) -> np.ndarray:
        """K at the assigned training parameters (a ValueError where one is not assigned)."""
        vals = [self._parameter_dict[p] for p in self._training_parameters]
        if any(v is None for v in vals):
            raise ValueError("assign the training parameters first (assign_training_parameters)")
        self._qk_map = self._qk_map.with_weights(np.asarray(vals, dtype=np.float64))
        return QKKernel.evaluate(self, x_vec, y_vec)

