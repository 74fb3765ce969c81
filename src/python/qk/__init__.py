"""qk: quantum-kernel Gram matrices, K[i, j] = |<psi(x_i)|psi(y_j)>|^2, on CPU and GPU.

The Python face of qk.h (and its CUDA engine, where the package was built with nvcc): numpy in,
numpy out, the C library's speed and none of its C.

    >>> import numpy as np, qk
    >>> X = np.random.default_rng(0).uniform(0, np.pi, (100, 4))
    >>> K = qk.gram(X, map="zz(reps=2)")                  # K(X, X), float64 on the CPU
    >>> from sklearn.svm import SVC
    >>> clf = SVC(kernel=qk.Kernel("zz(reps=2)"))         # or kernel="precomputed" with K

- ``gram(X, Y=None, map=..., ...)``: the Gram matrix as a numpy array, into ``out=`` (an array
  or ``np.memmap``) or streamed into a ``.npy`` file (``out="K.npy"``).
- ``FeatureMap(spec, n_features)``: a map from a spec string (docs/maps.md) or, with
  ``FeatureMap.from_qiskit(circuit)``, from a Qiskit circuit; ``.statevector(x)``.
- ``Kernel(map, ...)``: a scikit-learn kernel (``SVC(kernel=qk.Kernel(...))``, clones in
  ``GridSearchCV``; ``k(x, y)`` of two 1-D samples is the scalar, for ``KernelRidge``,
  ``KernelPCA`` and PennyLane's ``qml.kernels``) with qiskit-machine-learning's
  ``evaluate(x_vec, y_vec)``; ``qk.qiskit.QKKernel`` is qiskit-machine-learning's ``BaseKernel``
  (``QSVC``, ``QSVR``, ``PegasosQSVC``).

Errors from qk become ``ValueError`` (bad input: NaN, shapes, map spec, weights), ``MemoryError``
(host or device memory), ``OSError`` subclasses by errno (files: ``FileNotFoundError``,
``PermissionError``, ...) or ``RuntimeError`` (the rest), carrying qk's detail message; a
non-numeric dtype is a ``TypeError``. The GIL is released while qk computes and Ctrl-C stops a
running Gram (``KeyboardInterrupt``). docs/python.md has the whole story.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from . import _qk

__all__ = ["gram", "gram_states", "gram_mps", "gram_vjp", "projected_gram", "sampled", "closest_psd", "threshold_psd", "displace_psd", "flip_psd",
           "mitigate_depolarizing_noise", "alignment", "KernelTrainer", "FeatureMap", "Kernel", "engine", "get_num_threads", "set_num_threads", "DefaultWeightsWarning",
           "__version__"]
__version__: str = _qk.engine()["version"]

_DEVICES = {"auto": _qk.QK_DEVICE_AUTO, "cpu": _qk.QK_DEVICE_CPU, "cuda": _qk.QK_DEVICE_CUDA,
            "gpu": _qk.QK_DEVICE_CUDA}
_PRECISIONS = {None: _qk.QK_PRECISION_DEFAULT, "fp32": _qk.QK_PRECISION_FP32,
               "fp64": _qk.QK_PRECISION_FP64, "tf32": _qk.QK_PRECISION_TF32,
               "fp32x3": _qk.QK_PRECISION_FP32X3, "fp16": _qk.QK_PRECISION_FP16,
               "auto": _qk.QK_PRECISION_AUTO}

_PATHS = {None: _qk.QK_PATH_DEFAULT, "auto": _qk.QK_PATH_DEFAULT, "mps": _qk.QK_PATH_MPS,
          "statevector": _qk.QK_PATH_COMPLEX}

MapLike = Union[str, "FeatureMap", Any]   # a spec string, a FeatureMap or a Qiskit QuantumCircuit
PathLike = Union[str, "os.PathLike[str]"]


def engine() -> Dict[str, Any]:
    """What this build and machine offer: ``{'version', 'cuda_engine', 'cuda_devices', 'cpu_isa'}``.

    ``cuda_engine`` is True when the package was built with the CUDA engine (nvcc was found);
    ``cuda_devices`` counts the CUDA devices it sees now; ``cpu_isa`` names the instruction set
    of the CPU engine's kernels (``'generic'``, ``'avx2'``, ``'avx512'``: the best the CPU has in
    a wheel, or ``QK_CPU_ISA``; docs/api.md, "CPU instruction sets").
    """
    return _qk.engine()


# ---- threads ----
def get_num_threads() -> int:
    """The CPU threads a call uses when it names none (``threads=None``): the limit set by
    ``set_num_threads``, ``threadpoolctl.threadpool_limits``, ``QK_NUM_THREADS`` or
    ``OMP_NUM_THREADS``, else every online core."""
    return _qk.get_num_threads()


def set_num_threads(n: Optional[int]) -> None:
    """Limits the CPU threads of calls that name none to ``n`` (process-wide, like
    ``omp_set_num_threads``); ``None``: no limit (every online core). An explicit ``threads=``
    argument is not capped. ``threadpoolctl.threadpool_limits(n)`` sets the same limit."""
    _qk.set_num_threads(0 if n is None else _threads(n))


def _threads_from_env() -> None:
    """QK_NUM_THREADS, else OMP_NUM_THREADS (its first value: "4,2" is 4), as OpenMP and BLAS
    libraries read it; joblib's worker processes (GridSearchCV(n_jobs=k)) get cores // k there."""
    import warnings
    for var in ("QK_NUM_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(var, "").strip()
        if not v:
            continue
        try:
            n = int(v.split(",")[0])
            if n < 1:
                raise ValueError
        except ValueError:
            warnings.warn(f"qk: ignoring {var}={v!r} (expected a positive integer)", RuntimeWarning, stacklevel=3)
            continue
        _qk.set_num_threads(min(n, 4096))
        return


def _register_threadpoolctl() -> None:
    """Makes qk's thread pool visible to threadpoolctl (threadpool_info, threadpool_limits): a
    LibController for this extension module, found by its file name (_qk.*) and its two exported
    functions, through which threadpoolctl reads and sets the limit (qk/_qk.c). Needs a
    threadpoolctl with ``threadpoolctl.register`` (tested with 3.8); without one, nothing to do."""
    try:
        import threadpoolctl
    except ImportError:
        return
    if not hasattr(threadpoolctl, "register") or not hasattr(threadpoolctl, "LibController"):
        return

    class QKController(threadpoolctl.LibController):
        user_api = "qk"
        internal_api = "qk"
        filename_prefixes = ("_qk.",)
        check_symbols = ("qkpy_get_num_threads", "qkpy_set_num_threads")

        def get_num_threads(self) -> Optional[int]:
            get = getattr(self.dynlib, "qkpy_get_num_threads", None)
            return None if get is None else int(get())

        def set_num_threads(self, num_threads: int) -> None:
            set_ = getattr(self.dynlib, "qkpy_set_num_threads", None)
            if set_ is not None:
                set_(int(num_threads))

        def get_version(self) -> str:
            return __version__

    threadpoolctl.register(QKController)


_threads_from_env()
_register_threadpoolctl()


# ---- warnings ----
class DefaultWeightsWarning(UserWarning):
    """A trainable map (``hea``, a circuit with weight parameters) used without weights: every
    weight is 1.0 (the qk-gram CLI prints the same note). Pass ``weights=`` to choose them, or
    ``warnings.simplefilter("ignore", qk.DefaultWeightsWarning)`` where 1.0 is meant."""


def _warn(message: str, category: type) -> None:
    """warnings.warn at the first frame outside the qk package (the user's call)."""
    import sys
    import warnings
    here = os.path.dirname(os.path.abspath(__file__))
    level, f = 2, sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f, level = f.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _check_default_weights(m: "_qk.Map", given: bool) -> "_qk.Map":
    if not given and m.n_weights > 0:
        _warn(f"the map {m.spec!r} has {m.n_weights} trainable weights; none given (weights=), so all are 1.0",
              DefaultWeightsWarning)
    return m


# ---- argument conversion ----
def _no_masked(arr: np.ndarray, name: str) -> None:
    """A masked array with a masked entry is refused: its buffer holds whatever lies under the
    mask, and computing with it would be a silent wrong answer."""
    if np.ma.isMaskedArray(arr) and np.ma.is_masked(arr):
        raise ValueError(f"{name} is a masked array with {int(np.ma.count_masked(arr))} masked entries: "
                         f"fill or drop them first (e.g. {name}.filled(value) or {name}.compressed())")


def _as_data(a: npt.ArrayLike, name: str) -> np.ndarray:
    """A 2-D C-contiguous, aligned, native float64 array; copies only when a is not one already."""
    arr = np.asanyarray(a)
    _no_masked(arr, name)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers (float64, float32, integer or bool), not dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {arr.shape}"
                         + (f"; use {name}.reshape(1, -1) for one sample" if arr.ndim == 1 else ""))
    return np.require(arr, dtype=np.float64, requirements=["C", "A"])


def _as_weights(w: Optional[npt.ArrayLike]) -> Optional[np.ndarray]:
    if w is None:
        return None
    _no_masked(np.asanyarray(w), "weights")
    arr = np.asarray(w)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"weights must hold real numbers, not dtype {arr.dtype}")
    if arr.ndim > 1:
        raise ValueError(f"weights must be 1-D, got shape {arr.shape}")
    return np.ascontiguousarray(arr.ravel(), dtype=np.float64)


def _option(table: Dict[Any, int], value: Any, name: str) -> int:
    key = value.lower() if isinstance(value, str) else value
    if key not in table:
        names = ", ".join(repr(k) for k in table)
        raise ValueError(f"{name} must be one of {names} (got {value!r})")
    return table[key]


def _threads(threads: Optional[int]) -> int:
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be a positive integer or None (got {threads!r})")
    return int(threads)


def _is_qiskit_circuit(obj: Any) -> bool:
    return type(obj).__module__.startswith("qiskit") and hasattr(obj, "num_qubits") and hasattr(obj, "data")


# ---- FeatureMap ----
class FeatureMap:
    """A quantum feature map: a qk map (docs/maps.md) for samples of ``n_features`` features.

    ``FeatureMap("zz(reps=2,ent=linear)", 4)`` parses a spec string (the CLI's ``--map``):
    ``zz`` (Qiskit's zz_feature_map), ``iqp`` (PennyLane IQPEmbedding), ``angle(rot=x|y|z)``
    (AngleEmbedding), ``amplitude``, ``basis``, ``hea(layers=L)`` (trainable) or
    ``circuit(qubits=Q: h(0) rz(0, 2*x0) cx(0,1) ...)``. ``weights`` sets trainable weights
    (maps with ``n_weights > 0``; default 1.0 each, with a ``DefaultWeightsWarning``). ``FeatureMap.from_qiskit(circuit)`` converts a
    Qiskit circuit. A FeatureMap is immutable; ``with_weights`` returns a new one.
    """

    __slots__ = ("_map",)

    def __init__(self, spec: str, n_features: int, weights: Optional[npt.ArrayLike] = None) -> None:
        if not isinstance(spec, str):
            raise TypeError(f"spec must be a str (got {type(spec).__name__}); for a Qiskit circuit use FeatureMap.from_qiskit")
        if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)):
            raise TypeError(f"n_features must be an int (got {n_features!r})")
        self._map = _check_default_weights(_qk.Map(spec, int(n_features), _as_weights(weights)), weights is not None)

    @classmethod
    def _wrap(cls, m: "_qk.Map") -> "FeatureMap":
        fm = cls.__new__(cls)
        fm._map = m
        return fm

    @classmethod
    def from_qiskit(cls, circuit: Any, weights: Optional[Sequence[Any]] = None,
                    weight_values: Optional[npt.ArrayLike] = None) -> "FeatureMap":
        """A qk map from a Qiskit ``QuantumCircuit`` whose parameters are the data.

        zz_feature_map (or the deprecated ZZFeatureMap class), PauliFeatureMap with Z and ZZ terms, and any circuit of
        ``h x y z rx ry rz p cx cz rzz`` gates (composite gates are unrolled; barriers are
        skipped) whose angles have the forms qk supports: ``a*x_i + b``, ``a*x_i*x_j + b``,
        ``a*(pi - x_i)*(pi - x_j) + b``, ``a*w_k + b``, ``a*w_k*x_i + b`` or a constant. Feature i
        is the i-th data parameter in ``circuit.parameters`` order (the order Qiskit binds a
        sample in, as qiskit-machine-learning does). ``weights`` names the parameters that are
        trainable weights instead of data (a ParameterVector or a sequence of Parameters), with
        ``weight_values`` their values (default 1.0, with a ``DefaultWeightsWarning``). Anything else raises ``ValueError`` naming
        the gate or the expression. The state equals Qiskit's up to a global phase
        (``rz`` and ``p`` differ by one), so kernels are equal.
        """
        from ._qiskit import circuit_to_ops
        nq, nf, nw, ops = circuit_to_ops(circuit, weights)
        m = _qk.Map.from_ops(nq, nf, nw, ops, _as_weights(weight_values))
        return cls._wrap(_check_default_weights(m, weight_values is not None))

    @property
    def n_qubits(self) -> int:
        """Number of qubits."""
        return self._map.n_qubits

    @property
    def n_features(self) -> int:
        """Number of features a sample has."""
        return self._map.n_features

    @property
    def n_weights(self) -> int:
        """Number of trainable weights (0 for data-only maps)."""
        return self._map.n_weights

    @property
    def kind(self) -> str:
        """``'product'`` (analytic kernel, no states), ``'real'`` (real amplitudes) or ``'complex'``."""
        return self._map.kind

    @property
    def spec(self) -> str:
        """A spec string that parses back into this map (custom circuits included)."""
        return self._map.spec

    @property
    def weights(self) -> np.ndarray:
        """A copy of the trainable weights (float64, ``n_weights`` values)."""
        return self._map.weights

    def with_weights(self, weights: npt.ArrayLike) -> "FeatureMap":
        """The same map with other weights (``n_weights`` finite values)."""
        return FeatureMap(self.spec, self.n_features, weights)

    def statevector(self, x: npt.ArrayLike, threads: Optional[int] = None) -> np.ndarray:
        """The states psi(x) as complex128: shape ``(2**n_qubits,)`` for one sample (1-D x),
        ``(n, 2**n_qubits)`` for n samples. Qubit 0 is the least significant bit of the index
        (Qiskit's order; reverse the bits for PennyLane's ``qml.state()``)."""
        arr = np.asanyarray(x)
        one = arr.ndim == 1
        X = _as_data(arr.reshape(1, -1) if one else arr, "x")
        S = self._map.states(X, _threads(threads))
        return S[0] if one else S

    def __reduce__(self):
        return (FeatureMap, (self.spec, self.n_features, self.weights if self.n_weights else None))

    def __repr__(self) -> str:
        w = f", weights={self.weights.tolist()!r}" if self.n_weights else ""
        return f"FeatureMap({self.spec!r}, n_features={self.n_features}{w})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FeatureMap):
            return NotImplemented
        return (self.spec, self.n_features) == (other.spec, other.n_features) and \
            np.array_equal(self.weights, other.weights)

    def __hash__(self) -> int:
        return hash((self.spec, self.n_features, self.weights.tobytes()))


def _resolve_map(map: MapLike, n_features: int, weights: Optional[npt.ArrayLike]) -> "_qk.Map":
    if isinstance(map, str):
        return _check_default_weights(_qk.Map(map, n_features, _as_weights(weights)), weights is not None)
    if isinstance(map, FeatureMap):
        if map.n_features != n_features:
            raise ValueError(f"X has {n_features} features, the map takes {map.n_features}")
        return map._map if weights is None else map.with_weights(weights)._map
    if _is_qiskit_circuit(map):
        fm = FeatureMap.from_qiskit(map, weight_values=None)
        if fm.n_features != n_features:
            raise ValueError(f"X has {n_features} features, the circuit has {fm.n_features} parameters")
        return fm._map if weights is None else fm.with_weights(weights)._map
    raise TypeError(f"map must be a spec string, a qk.FeatureMap or a Qiskit QuantumCircuit (got {type(map).__name__})")


# ---- gram ----
def _empty_gram(n: int, m: int, dev: int, prec: int, out: Any) -> np.ndarray:
    """K of an empty X or Y: an (n, m) array with no entries (qk_gram itself takes n, m > 0), as
    qiskit-machine-learning's kernels give for an empty y (PegasosQSVC's first step)."""
    if prec == _qk.QK_PRECISION_FP64:
        dt = np.float64
    elif prec not in (_qk.QK_PRECISION_DEFAULT, _qk.QK_PRECISION_AUTO):
        dt = np.float32
    else:   # the engine's default: float32 (fp32 / fp32x3) where the call would run on the GPU engine
        e = _qk.engine()
        gpu = dev == _qk.QK_DEVICE_CUDA or (dev == _qk.QK_DEVICE_AUTO and e["cuda_engine"] and e["cuda_devices"] > 0)
        dt = np.float32 if gpu else np.float64
    if out is None:
        return np.empty((n, m), dtype=dt)
    if isinstance(out, np.ndarray):
        if out.shape != (n, m):
            raise ValueError(f"out must have shape ({n}, {m})")
        return out
    if isinstance(out, (str, bytes, os.PathLike)):
        path = os.fspath(out)
        with open(path, "wb") as f:
            np.lib.format.write_array(f, np.empty((n, m), dtype=dt))
        return np.load(path, mmap_mode="r")
    raise TypeError(f"out must be None, a numpy array or a path (got {type(out).__name__})")


_STATE_TYPES = {"complex128": _qk.QK_STATE_C128, "complex64": _qk.QK_STATE_C64,
                "float64": _qk.QK_STATE_F64, "float32": _qk.QK_STATE_F32}
_CAI_TYPES = {"<c16": "complex128", "<c8": "complex64", "<f8": "float64", "<f4": "float32"}


def _state_rows(S: Any, name: str) -> Tuple[Any, int, int, int, int, str, bool, bool]:
    """(keep-alive object, pointer, rows, ld in elements, dim, dtype name, on the device, mixed) of
    a 2-D array of states or a 3-D array of density matrices: a CUDA array
    (``__cuda_array_interface__``: CuPy, PyTorch, Numba) read in place, else numpy (rows with
    contiguous amplitudes used in place, anything else copied)."""
    cai = getattr(S, "__cuda_array_interface__", None)
    if cai is not None:
        shape, typestr = tuple(cai["shape"]), cai["typestr"]
        mixed = len(shape) == 3
        if mixed and shape[1] != shape[2]:
            raise ValueError(f"{name}: density matrices must be square, got shape {shape}")
        if len(shape) not in (2, 3):
            raise ValueError(f"{name}: states must be 2-D (n, dim) or density matrices (n, dim, dim), got shape {shape}")
        dt = _CAI_TYPES.get(typestr)
        if dt is None:
            raise TypeError(f"{name}: device states must be complex128, complex64, float64 or float32 (got {typestr})")
        isz = np.dtype(dt).itemsize
        # density matrices: rows of dim * dim entries, each matrix contiguous (C order within it)
        row = shape[1] * shape[2] if mixed else shape[1]
        strides = cai.get("strides") or ((row * isz, shape[2] * isz, isz) if mixed else (row * isz, isz))
        inner = (strides[2] == isz or shape[2] == 1) and (strides[1] == shape[2] * isz or shape[1] == 1) if mixed \
            else (shape[1] == 1 or strides[1] == isz)
        if not inner or strides[0] % isz != 0 or (shape[0] > 1 and strides[0] < row * isz):
            raise ValueError(f"{name}: device {'density matrices' if mixed else 'states'} need contiguous rows "
                             f"(strides {strides}); copy them first")
        ptr = int(cai["data"][0])
        return S, ptr, int(shape[0]), int(strides[0] // isz) if shape[0] > 1 else int(row), int(shape[1]), dt, True, mixed
    if hasattr(S, "detach") and hasattr(S, "numpy"):   # a CPU torch tensor
        S = S.detach().numpy()
    if isinstance(S, np.ma.MaskedArray) and np.ma.is_masked(S):
        raise ValueError(f"{name}: masked entries")
    A = np.asarray(S)
    mixed = A.ndim == 3
    if mixed:   # density matrices (n, dim, dim): rows of dim * dim entries
        if A.shape[1] != A.shape[2]:
            raise ValueError(f"{name}: density matrices must be square, got shape {A.shape}")
        A = np.ascontiguousarray(A).reshape(A.shape[0], A.shape[1] * A.shape[2])
    elif A.ndim != 2:
        raise ValueError(f"{name}: states must be 2-D (n, dim) or density matrices (n, dim, dim), got shape {A.shape}")
    if A.dtype.name not in _STATE_TYPES:
        if np.iscomplexobj(A):
            A = A.astype(np.complex128)
        elif A.dtype.kind in "fiub":
            A = A.astype(np.float64)
        else:
            raise TypeError(f"{name}: states must be numeric (got {A.dtype})")
    if not A.dtype.isnative:
        A = A.astype(A.dtype.newbyteorder("="))
    isz = A.itemsize
    if A.shape[1] > 1 and A.strides[1] != isz or A.strides[0] < 0 or A.strides[0] % isz != 0 or \
            (A.shape[0] > 1 and A.strides[0] < A.shape[1] * isz):
        A = np.ascontiguousarray(A)
    ld = A.strides[0] // isz if A.shape[0] > 1 else A.shape[1]
    dim = int(round(A.shape[1] ** 0.5)) if mixed else int(A.shape[1])
    return A, int(A.ctypes.data), int(A.shape[0]), int(ld), dim, A.dtype.name, False, mixed


def gram_states(A: Any, B: Any = None, device: str = "auto", precision: Optional[str] = None,
                normalize: bool = False, norm_tol: Optional[float] = None,
                out: Optional[PathLike] = None, threads: Optional[int] = None) -> np.ndarray:
    """K[i, j] = |<A[i]|B[j]>|^2 of given statevectors (B=None: K(A, A), symmetric): states a
    simulator made (any gates, noise trajectories), with qk's planner, tiling and precision modes.
    Density matrices, (n, dim, dim) arrays, give the Hilbert-Schmidt kernel Tr(rho_i rho_j) (and
    <psi|rho|psi> against pure states): Qiskit's ``DensityMatrix(c).data``, PennyLane's
    ``qml.density_matrix``; on the CPU engine and the GPU engine (fp64 or fp32: the tensor-core
    modes run fp32 there; CUDA arrays of density matrices read in place; a pure side against a
    mixed one takes host arrays).

    A, B: (n, dim) arrays of states, one per row: complex128, complex64, float64 or float32
        (other numeric dtypes are converted to complex128 / float64); numpy arrays (or CPU
        PyTorch tensors), or CUDA arrays (CuPy, PyTorch, anything with
        ``__cuda_array_interface__``), which are read in place on the GPU engine, never copied.
        A dim that is no power of two is zero-padded. Qiskit: ``np.array([sv.data for sv in svs])``;
        PennyLane: stack the ``qml.state()`` outputs.
    normalize: False (default): each state's squared norm must be within norm_tol of 1 (default
        1e-9 for double, 1e-5 for float states), a ValueError naming the row otherwise; True:
        each state is scaled to norm 1.
    device, precision, threads: as for ``gram``; out: None (a new array) or a ``.npy`` path (K
        streamed into it, returned as a read-only memmap).
    """
    Ak, pa, na, lda, dim, dta, dev_a, mix_a = _state_rows(A, "A")
    pb, nb, ldb, Bk, dev_b, mix_b = 0, 0, 0, None, dev_a, False
    if B is not None:
        Bk, pb, nb, ldb, dimb, dtb, dev_b, mix_b = _state_rows(B, "B")
        if dimb != dim:
            raise ValueError(f"A has states of dim {dim} and B of dim {dimb}")
        if dtb != dta or dev_b != dev_a:
            raise TypeError(f"A and B must have the same dtype and live on the same device (A: {dta}, B: {dtb})")
    if na == 0 or (B is not None and nb == 0):
        return np.zeros((na, na if B is None else nb), dtype=np.float64)
    dev = _option(_DEVICES, device, "device")
    if dev_a and dev == _qk.QK_DEVICE_CPU:
        raise ValueError("device states need device='cuda' (or 'auto')")
    if dev_a:
        dev = _qk.QK_DEVICE_CUDA
    prec = _option(_PRECISIONS, precision, "precision")
    nt = _threads(threads)
    tol = 0.0 if norm_tol is None else float(norm_tol)
    args = (pa, na, lda, pb, nb, ldb, dim, _STATE_TYPES[dta], int(dev_a), dev, prec, nt, int(bool(normalize)), tol)
    if out is None:
        K = _qk._gram_states(*args, a_mixed=int(mix_a), b_mixed=int(mix_b))
    else:
        path = os.fspath(out)
        _qk._gram_states(*args, out_path=path, a_mixed=int(mix_a), b_mixed=int(mix_b))
        K = np.load(path, mmap_mode="r")
    del Ak, Bk
    return K


_MPS_LAYOUTS = {"lpr": _qk.QK_MPS_LPR, "lrp": _qk.QK_MPS_LRP}


def _mps_side(S: Any, name: str, layout: str) -> Tuple[list, np.ndarray, int, str]:
    """(tensors as contiguous arrays, bonds (n, q + 1) int32, q, dtype name) of a sequence of MPS,
    each a sequence of site tensors in layout 'lpr' or 'lrp', checked: rank 3 (or the open
    boundary's rank 2 at the ends, rank 1 for one site), physical dimension 2, neighbouring bonds
    equal, the outer bonds 1."""
    samples = [list(m) for m in S]
    if not samples:
        return [], np.zeros((0, 1), dtype=np.int32), 0, "complex128"
    q = len(samples[0])
    if q == 0:
        raise ValueError(f"{name}[0]: an MPS needs at least one site")
    arrs = []
    for i, m in enumerate(samples):
        if len(m) != q:
            raise ValueError(f"{name}[{i}]: {len(m)} sites, {name}[0] has {q}")
        row = []
        for s, t in enumerate(m):
            if hasattr(t, "detach") and hasattr(t, "numpy"):   # a CPU torch tensor
                t = t.detach().numpy()
            a = np.asarray(t)
            if a.ndim == 1 and q == 1:
                a = a.reshape(1, 2, 1) if layout == "lpr" else a.reshape(1, 1, 2)
            elif a.ndim == 2 and (s == 0 or s == q - 1) and q > 1:
                # the open boundary without its unit bond (quimb's end tensors: 'rp' / 'lp' for
                # 'lrp', 'pr' / 'lp' for 'lpr')
                if s == 0:
                    a = a[np.newaxis]
                else:
                    a = a[:, :, np.newaxis] if layout == "lpr" else a[:, np.newaxis, :]
            if a.ndim != 3:
                raise ValueError(f"{name}[{i}] site {s}: a site tensor has rank 3 ({layout}), got shape {np.shape(t)}")
            if (a.shape[1] if layout == "lpr" else a.shape[2]) != 2:
                raise ValueError(f"{name}[{i}] site {s}: the physical dimension must be 2 (qubits), shape {a.shape} in layout {layout}")
            row.append(a)
        arrs.append(row)
    dt = np.result_type(*[a.dtype for row in arrs for a in row])
    if dt.name not in _STATE_TYPES:
        dt = np.dtype(np.complex128 if dt.kind == "c" else np.float64)
        if not (dt.kind == "c" or all(a.dtype.kind in "fiub" for row in arrs for a in row)):
            raise TypeError(f"{name}: site tensors must be numeric")
    bonds = np.empty((len(arrs), q + 1), dtype=np.int32)
    flat = []
    for i, row in enumerate(arrs):
        for s, a in enumerate(row):
            left, right = a.shape[0], (a.shape[2] if layout == "lpr" else a.shape[1])
            if s == 0:
                bonds[i, 0] = left
            elif left != bonds[i, s]:
                raise ValueError(f"{name}[{i}] site {s}: left bond {left}, the right bond of site {s - 1} is {bonds[i, s]}")
            bonds[i, s + 1] = right
            flat.append(np.ascontiguousarray(a, dtype=dt))
    return flat, bonds, q, dt.name


def gram_mps(A: Any, B: Any = None, layout: str = "lpr", normalize: bool = False, norm_tol: Optional[float] = None,
             device: str = "auto", precision: Optional[str] = None, out: Optional[PathLike] = None,
             threads: Optional[int] = None) -> np.ndarray:
    """K[i, j] = |<A[i]|B[j]>|^2 of states given as open-boundary matrix product states (B=None:
    K(A, A), symmetric), contracted by qk's MPS engine (CPU; the GPU's MPS kernels on
    device="cuda"): a tensor-network simulator's states at any qubit count (docs/states.md, "MPS
    input").

    A, B: sequences of samples, each a sequence of n_sites site tensors (numpy arrays, CPU torch
        tensors, anything np.asarray takes; complex128, complex64, float64 or float32):
        layout "lpr" (default): (left, 2, right), ITensor's (link, site, link) and TeNPy's
        (vL, p, vR); layout "lrp": (left, right, 2), quimb's default: ``[t.data for t in mps]``
        of a ``MatrixProductState``. The end tensors may drop their unit bond (quimb's (2, right)
        / (right, 2) and (left, 2)). Site s carries qubit s, bit s of the amplitude index of
        qk's statevectors; quimb's ``to_dense()`` puts site 0 in the most significant bit (the
        same state with the bits reversed; K is the same).
    normalize: False (default): each MPS's squared norm must be within norm_tol of 1 (default
        1e-9, 1e-5 for float tensors), a ValueError naming the sample otherwise; True: each state
        is scaled to norm 1.
    device, precision, threads: as for ``gram``; out: None (a new array) or a ``.npy`` path.
    """
    lay = layout.lower() if isinstance(layout, str) else layout
    if lay not in _MPS_LAYOUTS:
        raise ValueError(f"layout must be 'lpr' or 'lrp', got {layout!r}")
    fa, ba, q, dta = _mps_side(A, "A", lay)
    fb, bb, qb, dtb = ([], None, q, dta) if B is None else _mps_side(B, "B", lay)
    na, nb = len(ba), (0 if B is None else len(bb))
    if na == 0 or (B is not None and nb == 0):
        return np.zeros((na, na if B is None else nb), dtype=np.float64)
    if B is not None:
        if qb != q:
            raise ValueError(f"A has MPS of {q} sites and B of {qb}")
        if dtb != dta:   # one dtype for both sides
            dt = np.result_type(dta, dtb)
            fa = [a.astype(dt) for a in fa]
            fb = [b.astype(dt) for b in fb]
            dta = dt.name
    pa = np.array([a.ctypes.data for a in fa], dtype=np.uint64)
    pb = np.array([b.ctypes.data for b in fb], dtype=np.uint64) if B is not None else None
    dev = _option(_DEVICES, device, "device")
    prec = _option(_PRECISIONS, precision, "precision")
    tol = 0.0 if norm_tol is None else float(norm_tol)
    args = (int(pa.ctypes.data), int(ba.ctypes.data), na,
            0 if pb is None else int(pb.ctypes.data), 0 if bb is None else int(bb.ctypes.data), nb,
            q, _STATE_TYPES[dta], _MPS_LAYOUTS[lay], dev, prec, _threads(threads), int(bool(normalize)), tol)
    if out is None:
        K = _qk._gram_mps(*args)
    else:
        path = os.fspath(out)
        _qk._gram_mps(*args, out_path=path)
        K = np.load(path, mmap_mode="r")
    del fa, fb, pa, pb
    return K


def gram_vjp(X: npt.ArrayLike, G: npt.ArrayLike, Y: Optional[npt.ArrayLike] = None, map: MapLike = "hea(layers=2)",
             weights: Optional[npt.ArrayLike] = None, threads: Optional[int] = None,
             data: bool = False) -> Tuple[np.ndarray, ...]:
    """The gradient of a loss of K for every trainable weight of the map: given G = dL/dK (the
    shape of K(X, Y), or K(X, X) when Y is None; need not be symmetric), returns (dL/dw, K) with
    dL/dw = sum_ij G_ij dK_ij/dw, exact, at the cost of a few Gram evaluations whatever the number
    of weights (adjoint sweeps; docs/gradients.md). CPU engine, fp64.

    data=True: the gradient for the data too (feature learning), from the same sweeps:
    (dL/dw, K, dL/dX) for K(X, X) (X in both roles), (dL/dw, K, dL/dX, dL/dY) for K(X, Y), each
    the shape of its data. Angle encodings only (x in gate angles); amplitude and basis maps raise."""
    Xa = _as_data(X, "X")
    Ya = None if Y is None else _as_data(Y, "Y")
    if Ya is not None and Ya.shape[1] != Xa.shape[1]:
        raise ValueError(f"X has {Xa.shape[1]} features and Y has {Ya.shape[1]}")
    m = _resolve_map(map, Xa.shape[1], weights)
    Ga = np.ascontiguousarray(np.asarray(G, dtype=np.float64))
    return _qk._gram_vjp(m, Xa, Ya, Ga, _threads(threads), int(bool(data)))


def alignment(K: np.ndarray, y: npt.ArrayLike, centered: bool = False) -> Tuple[float, np.ndarray]:
    """Kernel-target alignment A = <K, yy^T>_F / (||K||_F ||yy^T||_F) (Cristianini et al. 2001) of
    labels y in {-1, +1} (any two classes are mapped to -1, +1), and dA/dK, the G for gram_vjp.
    centered: the centered alignment (K and yy^T centered by H = I - 11^T/n first)."""
    yv = np.asarray(y).ravel()
    classes = np.unique(yv)
    if len(classes) != 2:
        raise ValueError(f"alignment needs two classes (got {len(classes)})")
    t = np.where(yv == classes[1], 1.0, -1.0)
    T = np.outer(t, t)
    n = len(t)
    if centered:
        H = np.eye(n) - 1.0 / n
        Kc, Tc = H @ K @ H, H @ T @ H
    else:
        Kc, Tc = K, T
    kt, kk, tt = float(np.sum(Kc * Tc)), float(np.sum(Kc * Kc)), float(np.sum(Tc * Tc))
    a = kt / np.sqrt(kk * tt)
    dA = (Tc / np.sqrt(kk * tt) - kt * Kc / (kk * np.sqrt(kk * tt)))
    if centered:
        dA = H @ dA @ H
    return a, dA


class KernelTrainer:
    """Trains a map's weights by kernel-target alignment with exact gradients (gram_vjp) and
    scipy.optimize.minimize (L-BFGS-B by default): ``fit(X, y)`` returns self with
    ``optimal_point`` (the weights), ``optimal_value`` (the final loss, -alignment), ``loss_history``,
    ``n_evals`` and ``kernel`` (a trained qk.Kernel), the attribute names of
    qiskit-machine-learning's QuantumKernelTrainer result. scikit-learn style parameters.
    callback: called after each evaluation of the loss as ``callback(n_eval, weights, loss)``
    (as SPSA's callback in qiskit-machine-learning: to log or time the training)."""

    def __init__(self, map: str = "hea(layers=2)", initial_weights: Optional[npt.ArrayLike] = None, centered: bool = False,
                 method: str = "L-BFGS-B", maxiter: int = 50, threads: Optional[int] = None,
                 callback: Optional[Any] = None) -> None:
        self.map = map
        self.initial_weights = initial_weights
        self.centered = centered
        self.method = method
        self.maxiter = maxiter
        self.threads = threads
        self.callback = callback

    def get_params(self, deep: bool = True) -> Dict[str, Any]:
        return {k: getattr(self, k) for k in ("map", "initial_weights", "centered", "method", "maxiter", "threads", "callback")}

    def set_params(self, **params: Any) -> "KernelTrainer":
        for k, v in params.items():
            setattr(self, k, v)
        return self

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike) -> "KernelTrainer":
        from scipy.optimize import minimize
        Xa = _as_data(X, "X")
        m0 = _resolve_map(self.map, Xa.shape[1], self.initial_weights)
        if m0.n_weights == 0:
            raise ValueError("the map has no trainable weights")
        w0 = np.asarray(m0.weights if self.initial_weights is None else self.initial_weights, dtype=np.float64)
        self.loss_history = []

        def f(w: np.ndarray) -> Tuple[float, np.ndarray]:
            m = _resolve_map(self.map, Xa.shape[1], w)
            K = _qk.gram(m, Xa, None, None, _qk.QK_DEVICE_CPU, _qk.QK_PRECISION_FP64, _threads(self.threads))
            a, dA = alignment(K, y, self.centered)
            g, _ = _qk._gram_vjp(m, Xa, None, np.ascontiguousarray(dA), _threads(self.threads))
            self.loss_history.append(-a)
            if self.callback is not None:
                self.callback(len(self.loss_history), np.array(w, dtype=np.float64), -a)
            return -a, -g

        res = minimize(f, w0, jac=True, method=self.method, options={"maxiter": int(self.maxiter)})
        self.optimal_point = np.asarray(res.x)
        self.optimal_value = float(res.fun)
        self.n_evals = int(res.nfev)
        self.kernel = Kernel(self.map, weights=self.optimal_point)
        return self


def projected_gram(X: npt.ArrayLike, Y: Optional[npt.ArrayLike] = None, map: MapLike = "zz(reps=2)",
                   gamma: float = 1.0, weights: Optional[npt.ArrayLike] = None, threads: Optional[int] = None,
                   device: str = "auto", path: Optional[str] = None) -> np.ndarray:
    """The projected quantum kernel (Huang et al., Nat. Commun. 12, 2631 (2021)):
    K(x, x') = exp(-gamma sum_k ||rho_k(x) - rho_k(x')||_F^2) over the one-qubit reduced density
    matrices of the map's states. Unlike the fidelity kernel it does not concentrate exponentially
    with the qubit count. Returns K as float64 (computed in fp64 on either engine).

    device: ``"auto"`` (CUDA when the engine and a device exist, else CPU), ``"cpu"``, ``"cuda"``
        (or ``"gpu"``), as for ``gram``; ``"cuda"`` without the CUDA engine or a device is a
        RuntimeError. The GPU engine runs the projected kernel on its first GPU.
    path: None (or ``"auto"``): as ``gram`` chooses, the MPS path beyond 30 qubits and where it is
        cheaper, else the statevector; ``"mps"``: the MPS path (entangling maps with local gates,
        any qubit count); ``"statevector"``: the statevector (entangling maps up to 30 qubits).
        Case-insensitive. Product maps take their own path (each qubit's state, any qubit count)
        whatever ``path`` says.
    threads: CPU engine threads (default ``get_num_threads()``).
    Raises ValueError (gamma <= 0, NaN/Inf, shapes, a bad device or path string, too many qubits
    for the statevector), RuntimeError (no CUDA device for ``device="cuda"``; ``path="mps"`` for a
    map the MPS path cannot take, e.g. amplitude encoding), MemoryError."""
    Xa = _as_data(X, "X")
    Ya = None if Y is None else _as_data(Y, "Y")
    if Ya is not None and Ya.shape[1] != Xa.shape[1]:
        raise ValueError(f"X has {Xa.shape[1]} features and Y has {Ya.shape[1]}")
    dev = _option(_DEVICES, device, "device")
    pth = _option(_PATHS, path, "path")
    m = _resolve_map(map, Xa.shape[1], weights)
    return _qk._gram_projected(m, Xa, Ya, float(gamma), _threads(threads), dev, pth)


def sampled(K: npt.ArrayLike, shots: int, seed: Optional[int] = None, symmetric: Optional[bool] = None) -> np.ndarray:
    """K as a device with shots would estimate it: each entry the all-zeros frequency of ``shots``
    runs of the compute-uncompute circuit, Binomial(shots, K_ij) / shots (qiskit-machine-learning's
    FidelityQuantumKernel with a sampler, PennyLane devices with shots), reproducible with
    ``seed``. symmetric (default: K is square and symmetric): one draw per pair, mirrored, and the
    diagonal left at K_ii (1 for the fidelity kernel, which the all-zeros outcome always gives)."""
    Ka = np.asarray(K, dtype=np.float64)
    shots = int(shots)
    if shots < 1:
        raise ValueError(f"shots must be >= 1 (got {shots})")
    if Ka.ndim != 2 or not np.all(np.isfinite(Ka)) or Ka.min(initial=0.0) < 0 or Ka.max(initial=0.0) > 1 + 1e-9:
        raise ValueError("K must be a 2-D array of probabilities in [0, 1]")
    rng = np.random.default_rng(seed)
    if symmetric is None:
        symmetric = Ka.shape[0] == Ka.shape[1] and np.allclose(Ka, Ka.T, atol=1e-12)
    P = np.clip(Ka, 0.0, 1.0)
    if not symmetric:
        return rng.binomial(shots, P) / shots
    n = Ka.shape[0]
    iu = np.triu_indices(n, 1)
    out = np.array(Ka, copy=True)
    draws = rng.binomial(shots, P[iu]) / shots
    out[iu] = draws
    out[(iu[1], iu[0])] = draws
    return out


def closest_psd(K: npt.ArrayLike) -> np.ndarray:
    """The closest positive semidefinite matrix to a symmetric K in the Frobenius norm (the
    negative eigenvalues set to 0), as PennyLane's ``qml.kernels.closest_psd_matrix`` without a
    solver: for K estimated with shots, whose noise leaves negative eigenvalues."""
    Ka = np.asarray(K, dtype=np.float64)
    if Ka.ndim != 2 or Ka.shape[0] != Ka.shape[1]:
        raise ValueError(f"K must be square (got shape {Ka.shape})")
    S = (Ka + Ka.T) / 2
    w, v = np.linalg.eigh(S)
    return (v * np.maximum(w, 0.0)) @ v.T


def _square_symmetric(K: npt.ArrayLike) -> np.ndarray:
    Ka = np.asarray(K, dtype=np.float64)
    if Ka.ndim != 2 or Ka.shape[0] != Ka.shape[1]:
        raise ValueError(f"K must be square (got shape {Ka.shape})")
    if not np.all(np.isfinite(Ka)):
        raise ValueError("K has NaN or infinite entries")
    return (Ka + Ka.T) / 2


def threshold_psd(K: npt.ArrayLike) -> np.ndarray:
    """K with its negative eigenvalues set to 0 (PennyLane's ``qml.kernels.threshold_matrix``): the
    closest PSD matrix in the Frobenius norm; a K without negative eigenvalues is returned as it
    is (a float64 copy). K is symmetrised first, (K + K^T) / 2."""
    S = _square_symmetric(K)
    w, v = np.linalg.eigh(S)
    if w.size == 0 or w[0] >= 0:
        return S
    return (v * np.clip(w, 0.0, None)) @ v.T


def displace_psd(K: npt.ArrayLike) -> np.ndarray:
    """K shifted by its most negative eigenvalue, K - w_min I (PennyLane's
    ``qml.kernels.displace_matrix``): PSD, the eigenvectors and the gaps kept, every eigenvalue
    raised alike; unchanged without a negative eigenvalue. K is symmetrised first."""
    S = _square_symmetric(K)
    if S.size == 0:
        return S
    wmin = np.linalg.eigvalsh(S)[0]
    return S - np.eye(S.shape[0]) * wmin if wmin < 0 else S


def flip_psd(K: npt.ArrayLike) -> np.ndarray:
    """K with the signs of its negative eigenvalues flipped, V |W| V^T (PennyLane's
    ``qml.kernels.flip_matrix``); unchanged without a negative eigenvalue. K is symmetrised first."""
    S = _square_symmetric(K)
    w, v = np.linalg.eigh(S)
    if w.size == 0 or w[0] >= 0:
        return S
    return (v * np.abs(w)) @ v.T


def mitigate_depolarizing_noise(K: npt.ArrayLike, n_qubits: int, method: str = "average",
                                use_entries: Optional[Sequence[int]] = None) -> np.ndarray:
    """Undoes global depolarizing noise on a fidelity kernel matrix measured on a device, from its
    diagonal (Hubregtsen et al., arXiv:2105.02276, section V; PennyLane's
    ``qml.kernels.mitigate_depolarizing_noise``). Under a depolarizing channel of rate lam on the
    2^q-dimensional states each entry becomes (1 - lam) K_ij + lam / 2^q, and K_ii = 1 gives lam
    from the measured diagonal.

    method: ``"single"`` (lam from one diagonal entry, ``use_entries[0]``, default 0),
        ``"average"`` (the mean of the rates of the diagonal entries in ``use_entries``, default
        all), ``"split_channel"`` (a rate per sample, lam_i = 1 - sqrt(1 - r_i) from each K_ii,
        entry (i, j) undone with lam_i + lam_j - lam_i lam_j; every diagonal entry is used).
    A diagonal entry (or their mean) at or below 1 / 2^q is a ValueError: the rate would be 1."""
    Ka = np.array(K, dtype=np.float64)
    if Ka.ndim != 2 or Ka.shape[0] != Ka.shape[1]:
        raise ValueError(f"K must be square (got shape {Ka.shape})")
    if isinstance(n_qubits, bool) or not isinstance(n_qubits, (int, np.integer)) or n_qubits < 1:
        raise ValueError(f"n_qubits must be a positive integer (got {n_qubits!r})")
    dim = 2.0 ** int(n_qubits)
    diag = np.diag(Ka)
    rate = lambda d: (1.0 - d) * dim / (dim - 1.0)     # the depolarizing rate that leaves d of a 1
    if method == "single":
        i = 0 if use_entries is None else int(use_entries[0])
        if diag[i] <= 1.0 / dim:
            raise ValueError(f"'single': the diagonal entry K[{i}, {i}] = {diag[i]:.6g} is at or below 1/2^q = {1.0 / dim:.6g}")
        lam = rate(diag[i])
        return (Ka - lam / dim) / (1.0 - lam)
    if method == "average":
        d = diag if use_entries is None else diag[np.asarray(use_entries, dtype=np.intp)]
        if np.mean(d) <= 1.0 / dim:
            raise ValueError(f"'average': the mean of the diagonal entries used, {np.mean(d):.6g}, is at or below 1/2^q = {1.0 / dim:.6g}")
        lam = np.mean(rate(d))
        return (Ka - lam / dim) / (1.0 - lam)
    if method == "split_channel":
        if np.any(diag <= 1.0 / dim):
            raise ValueError(f"'split_channel': a diagonal entry is at or below 1/2^q = {1.0 / dim:.6g}")
        lam = 1.0 - np.sqrt(1.0 - np.clip(rate(diag), 0.0, 1.0))   # K_ii = (1 - lam_i)^2 + ...: each side's rate
        L = lam[:, None] + lam[None, :] - np.outer(lam, lam)
        return (Ka - L / dim) / (1.0 - L)
    raise ValueError(f"method must be 'single', 'average' or 'split_channel' (got {method!r})")


def gram(X: npt.ArrayLike, Y: Optional[npt.ArrayLike] = None, map: MapLike = "zz(reps=2)",
         weights: Optional[npt.ArrayLike] = None, device: str = "auto", precision: Optional[str] = None,
         out: Union[None, np.ndarray, PathLike] = None, threads: Optional[int] = None,
         tol: Optional[float] = None) -> np.ndarray:
    """The Gram matrix K[i, j] = |<psi(X[i])|psi(Y[j])>|^2 (Y=None: K(X, X), symmetric).

    X, Y: (n, d) arrays of real numbers, any dtype that converts to float64 and any strides;
        a C-contiguous float64 array is used in place, anything else is converted once.
    map: a spec string (docs/maps.md; ``d`` comes from X), a ``FeatureMap`` or a Qiskit circuit.
    weights: the map's trainable weights (``hea``, circuits with ``w`` parameters).
    device: ``"auto"`` (CUDA when the engine and a device exist, else CPU), ``"cpu"``, ``"cuda"``
        (or its alias ``"gpu"``, as the CLI's ``--device gpu``); case-insensitive. ``"cuda"`` without
        the CUDA engine or a device is a RuntimeError, never a silent fallback to the CPU.
    precision: None (the engine's default: fp64 on the CPU, ``"auto"`` on the GPU, which at the
        default ``tol`` is fp32x3 from 7 qubits (from 5 for complex states on wgmma devices) and fp32 below), ``"fp32"``, ``"fp64"``, the GPU's tensor-core modes
        ``"fp32x3"`` (fp32 accuracy), ``"tf32"``, ``"fp16"`` (~1e-3), or ``"auto"``: the fastest mode
        whose stated error bound meets ``tol`` (docs/precision.md). The CPU engine accepts every
        mode and computes in fp64.
    tol: the largest acceptable error bound of K for ``"auto"`` (default: fp32-class, fp32x3's bound).
    out: None (a new array), a preallocated (n, m) float32/float64 array or ``np.memmap`` whose
        rows are contiguous (a slice ``K[:, :m]`` of a wider array works), or a path: K is then
        streamed into a ``.npy`` file (never whole in memory; written atomically) and returned as a
        read-only ``np.memmap`` of that file.
    threads: CPU engine threads (default ``get_num_threads()``: all cores unless limited by
        ``set_num_threads``, threadpoolctl, ``QK_NUM_THREADS`` or ``OMP_NUM_THREADS``).

    Returns K: float64 by default on the CPU engine, float32 where the precision (or the GPU
    engine's default) is fp32; ``out``'s dtype when out is an array (and out itself).
    Raises ValueError (NaN/Inf, shapes, bad spec or weights), TypeError (non-numeric data),
    MemoryError, RuntimeError (no CUDA device for ``device="cuda"``, ...), OSError (``out`` path not
        writable: FileNotFoundError, PermissionError, IsADirectoryError, ... by errno), KeyboardInterrupt
    on Ctrl-C (an ``out`` given by the caller is then partly written).
    """
    Xa = _as_data(X, "X")
    Ya = None if Y is None else _as_data(Y, "Y")
    if Ya is not None and Ya.shape[1] != Xa.shape[1]:
        raise ValueError(f"X has {Xa.shape[1]} features and Y has {Ya.shape[1]}")
    m = _resolve_map(map, Xa.shape[1], weights)
    dev = _option(_DEVICES, device, "device")
    prec = _option(_PRECISIONS, precision, "precision")
    nt = _threads(threads)
    if tol is not None:
        tol = float(tol)
        if not (0.0 < tol <= 1.0):
            raise ValueError(f"tol must be in (0, 1] (got {tol})")
        if prec not in (_qk.QK_PRECISION_AUTO, _qk.QK_PRECISION_DEFAULT):
            raise ValueError("tol applies to precision='auto' (and the default), not to an explicit mode")
    tl = 0.0 if tol is None else tol
    if Xa.shape[0] == 0 or (Ya is not None and Ya.shape[0] == 0):
        return _empty_gram(Xa.shape[0], Xa.shape[0] if Ya is None else Ya.shape[0], dev, prec, out)
    if out is None:
        return _qk.gram(m, Xa, Ya, None, dev, prec, nt, tol=tl)
    if isinstance(out, np.ndarray):
        for A, name in ((Xa, "X"), (Ya, "Y")):
            if A is not None and np.may_share_memory(out, A):
                raise ValueError(f"out overlaps {name}")
        return _qk.gram(m, Xa, Ya, out, dev, prec, nt, tol=tl)
    if isinstance(out, (str, bytes, os.PathLike)):
        path = os.fspath(out)
        _qk.gram(m, Xa, Ya, None, dev, prec, nt, out_path=path, tol=tl)
        return np.load(path, mmap_mode="r")
    raise TypeError(f"out must be None, a numpy array or a path (got {type(out).__name__})")


# ---- Kernel ----
class Kernel:
    """A quantum kernel for scikit-learn and a drop-in for qiskit-machine-learning's kernels.

    ``SVC(kernel=qk.Kernel("zz(reps=2)"))`` calls ``K(X, Y)``; fitting passes X twice and gets
    the symmetric K(X, X) (half the work). Two 1-D samples give the scalar ``K(x, y)`` (a float):
    the per-pair protocol of ``KernelRidge``, ``KernelPCA``, ``pairwise_kernels(metric=k)`` and
    PennyLane's ``qml.kernels``. ``get_params`` / ``set_params`` make it clone in
    ``GridSearchCV`` (``param_grid={"kernel__map": ["zz(reps=1)", "zz(reps=2)"]}``).
    ``evaluate(x_vec, y_vec=None)`` has the semantics of qiskit-machine-learning's
    ``FidelityStatevectorKernel.evaluate`` (exact fidelities, 1-D inputs are one sample); the
    symmetric matrix is not projected onto the PSD cone (a fidelity Gram is PSD already).

    map: a spec string, a ``FeatureMap`` or a Qiskit ``QuantumCircuit`` (``zz_feature_map(4)``);
    weights, device, precision, threads: as in ``qk.gram``.
    """

    def __init__(self, map: MapLike = "zz(reps=2)", weights: Optional[npt.ArrayLike] = None,
                 device: str = "auto", precision: Optional[str] = None, threads: Optional[int] = None) -> None:
        # stored as given (scikit-learn's clone checks that the constructor keeps them as is)
        self.map = map
        self.weights = weights
        self.device = device
        self.precision = precision
        self.threads = threads

    def get_params(self, deep: bool = True) -> Dict[str, Any]:
        """The constructor's arguments (scikit-learn's estimator protocol)."""
        return {"map": self.map, "weights": self.weights, "device": self.device,
                "precision": self.precision, "threads": self.threads}

    def set_params(self, **params: Any) -> "Kernel":
        """Sets constructor arguments by name; returns self."""
        valid = self.get_params()
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"invalid parameter {k!r} for Kernel; valid: {sorted(valid)}")
            setattr(self, k, v)
        return self

    def feature_map(self, n_features: int) -> FeatureMap:
        """The FeatureMap this kernel uses for samples of ``n_features`` features."""
        return FeatureMap._wrap(_resolve_map(self.map, n_features, self.weights))

    def _pair_map(self, n_features: int) -> "_qk.Map":
        """The map for the per-pair protocol, kept between calls while the parameters that decide it
        are unchanged (a spec string or a FeatureMap: immutable; a Qiskit circuit is converted on
        every call, since it can change in place)."""
        if not isinstance(self.map, (str, FeatureMap)):
            return _resolve_map(self.map, n_features, self.weights)
        w = None if self.weights is None else np.asarray(self.weights, dtype=np.float64).tobytes()
        key = (self.map, n_features, w)
        cached = self.__dict__.get("_pair_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        m = _resolve_map(self.map, n_features, self.weights)
        self.__dict__["_pair_cache"] = (key, m)
        return m

    def _pair(self, x: np.ndarray, y: Optional[np.ndarray]) -> float:
        """K(x, y) of two 1-D samples as a Python float (y None: K(x, x))."""
        if x.dtype.kind not in "biuf" or (y is not None and y.dtype.kind not in "biuf"):
            bad = x if x.dtype.kind not in "biuf" else y
            raise TypeError(f"x and y must hold real numbers (float64, float32, integer or bool), not dtype {bad.dtype}")
        if y is not None and y.shape != x.shape:
            raise ValueError(f"x has {x.shape[0]} features and y has {y.shape[0]}")
        _no_masked(x, "x")
        if y is not None:
            _no_masked(y, "y")
        xa = np.require(x.reshape(1, -1), dtype=np.float64, requirements=["C", "A"])
        same = y is None or y is x or np.array_equal(x, y)
        ya = None if same else np.require(y.reshape(1, -1), dtype=np.float64, requirements=["C", "A"])
        m = self._pair_map(xa.shape[1])
        dev = _option(_DEVICES, self.device, "device")
        prec = _option(_PRECISIONS, self.precision, "precision")
        return float(_qk.gram(m, xa, ya, None, dev, prec, _threads(self.threads))[0, 0])

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_pair_cache", None)      # a _qk.Map: rebuilt on demand
        return state

    def __call__(self, X: npt.ArrayLike, Y: Optional[npt.ArrayLike] = None) -> Union[np.ndarray, float]:
        """K(X, Y) as a float64 array; K(X, X), symmetric and computed once per pair, when Y is None
        or holds the same samples as X (scikit-learn's fit passes X twice).

        Two 1-D samples x, y give the scalar K(x, y) as a Python float (x alone: K(x, x)): the
        per-pair protocol of scikit-learn's callable kernels (``KernelRidge``, ``KernelPCA``,
        ``pairwise_kernels(X, metric=kernel)``) and of PennyLane's ``qml.kernels``. A 1-D sample
        with a 2-D matrix is ambiguous and a ValueError; use ``x.reshape(1, -1)``."""
        xv = np.asanyarray(X)
        yv = None if Y is None else (xv if Y is X else np.asanyarray(Y))
        if xv.ndim == 1 and (yv is None or yv.ndim == 1):
            return self._pair(xv, yv)
        if xv.ndim == 1 or (yv is not None and yv.ndim == 1):
            raise ValueError(f"X has shape {xv.shape} and Y has shape {yv.shape}: give two 1-D samples for "
                             "the scalar K(x, y), or two 2-D (n_samples, n_features) arrays for the matrix "
                             "(one sample as a matrix: x.reshape(1, -1))")
        Xa = _as_data(X, "X")
        Ya = None if Y is None or Y is X else _as_data(Y, "Y")
        if Ya is not None and Ya.shape == Xa.shape and (Ya is Xa or np.array_equal(Xa, Ya)):
            Ya = None
        K = gram(Xa, Ya, map=self.map, weights=self.weights, device=self.device,
                 precision=self.precision, threads=self.threads)
        return K if K.dtype == np.float64 else K.astype(np.float64)

    def evaluate(self, x_vec: npt.ArrayLike, y_vec: Optional[npt.ArrayLike] = None) -> np.ndarray:
        """qiskit-machine-learning's ``evaluate``: the kernel matrix of x_vec (and y_vec), where a
        1-D vector is one sample; y_vec equal to x_vec gives the symmetric K(x_vec, x_vec)."""
        xv = np.asanyarray(x_vec)
        if xv.ndim == 1:
            xv = xv.reshape(1, -1)
        yv = None
        if y_vec is not None:
            yv = np.asanyarray(y_vec)
            if yv.ndim == 1:
                yv = yv.reshape(1, -1)
        return self(xv, yv)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items()
                         if k == "map" or (v is not None and not (k == "device" and v == "auto")))
        return f"Kernel({args})"
