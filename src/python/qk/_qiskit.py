"""Qiskit QuantumCircuit -> qk op list (FeatureMap.from_qiskit).

Each gate becomes a qk op; composite gates (ZZFeatureMap's block, PauliEvolutionGate, ...) are
unrolled through their definitions. Each angle, a ParameterExpression, is matched against the
forms qk evaluates (qk_arg_kind) by probing it at chosen points and checking the fit at others:
this reads the expression's value, not its printed form, so it works whatever Qiskit's symbolic
engine writes. Probe points are chosen so that the fitted scale and offset are exact for Qiskit's
own maps (pi - (pi - 1) is exactly 1 in floating point).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _qk

# Qiskit gate name -> (qk op, qubits, has an angle)
_GATES = {
    "h": (_qk.QK_OP_H, 1, False), "x": (_qk.QK_OP_X, 1, False), "y": (_qk.QK_OP_Y, 1, False),
    "z": (_qk.QK_OP_Z, 1, False), "rx": (_qk.QK_OP_RX, 1, True), "ry": (_qk.QK_OP_RY, 1, True),
    "rz": (_qk.QK_OP_RZ, 1, True), "p": (_qk.QK_OP_P, 1, True), "u1": (_qk.QK_OP_P, 1, True),
    "cx": (_qk.QK_OP_CNOT, 2, False), "cz": (_qk.QK_OP_CZ, 2, False), "rzz": (_qk.QK_OP_RZZ, 2, True),
}
_SKIP = {"barrier", "id", "delay", "global_phase"}   # no effect on |<psi(x)|psi(y)>|^2
_SUPPORTED = "h x y z rx ry rz p cx cz rzz"
_FORMS = "a*x_i + b, a*x_i*x_j + b, a*(pi - x_i)*(pi - x_j) + b, a*w_k + b, a*w_k*x_i + b or a constant"
_MAX_DEPTH = 16

Op = Tuple[int, int, int, int, int, int, int, float, float]


class _Angle:
    """Fits one gate angle (a ParameterExpression or a number) to a qk_angle."""

    def __init__(self, feat: Dict[Any, int], wmap: Dict[Any, int]) -> None:
        self.feat = feat
        self.wmap = wmap

    @staticmethod
    def _value(expr: Any, binding: Dict[Any, float]) -> float:
        v = expr.bind(binding) if binding else expr
        c = complex(v)
        if abs(c.imag) > 1e-12 * (1.0 + abs(c.real)):
            raise ValueError("complex")
        return c.real

    def fit(self, expr: Any, where: str) -> Tuple[int, int, int, int, float, float]:
        """(arg_kind, x0, x1, w, scale, offset)"""
        from qiskit.circuit import ParameterExpression
        if not isinstance(expr, ParameterExpression) or not expr.parameters:
            try:
                return (_qk.QK_ARG_CONST, 0, 0, 0, 0.0, float(complex(expr).real))
            except (TypeError, ValueError):
                raise ValueError(f"from_qiskit: angle {expr!r} of {where} is not a real number") from None
        ps = sorted(expr.parameters, key=lambda p: (p in self.wmap, self.wmap.get(p, 0), self.feat.get(p, 0)))
        xs = [p for p in ps if p in self.feat]
        ws = [p for p in ps if p in self.wmap]
        try:
            fit = self._fit(expr, xs, ws)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            fit = None
        if fit is None:
            raise ValueError(f"from_qiskit: angle {expr} of {where} is not a form qk supports ({_FORMS}; "
                             f"x: data parameters, w: weights)")
        return fit

    def _fit(self, e: Any, xs: List[Any], ws: List[Any]):
        f = self._value
        pi = math.pi
        # probe points (pairs), away from the fitting points, for the check
        probes = [(0.37, -1.21), (2.9, 0.55), (-0.8, 1.7), (1.3, 2.45)]

        def close(a: float, b: float) -> bool:
            return abs(a - b) <= 1e-9 * (1.0 + abs(a) + abs(b))

        if len(xs) == 1 and not ws:
            p, i = xs[0], self.feat[xs[0]]
            b = f(e, {p: 0.0})
            a = f(e, {p: 1.0}) - b
            if all(close(f(e, {p: s}), a * s + b) for s, _ in probes):
                return (_qk.QK_ARG_X, i, 0, 0, a, b)
            pairs = [(p, p)]                       # x_i * x_i, (pi - x_i)^2
        elif len(xs) == 2 and not ws:
            pairs = [(xs[0], xs[1])]
        elif len(ws) == 1 and not xs:
            p, k = ws[0], self.wmap[ws[0]]
            b = f(e, {p: 0.0})
            a = f(e, {p: 1.0}) - b
            if all(close(f(e, {p: s}), a * s + b) for s, _ in probes):
                return (_qk.QK_ARG_W, 0, 0, k, a, b)
            return None
        elif len(ws) == 1 and len(xs) == 1:
            pw, px = ws[0], xs[0]
            b = f(e, {pw: 0.0, px: 0.0})
            a = f(e, {pw: 1.0, px: 1.0}) - b
            if all(close(f(e, {pw: s, px: t}), a * s * t + b) for s, t in probes):
                return (_qk.QK_ARG_WX, self.feat[px], 0, self.wmap[pw], a, b)
            return None
        else:
            return None
        p, q = pairs[0]
        i, j = self.feat[p], self.feat[q]

        def bind(s: float, t: float) -> Dict[Any, float]:
            return {p: s} if p is q else {p: s, q: t}

        def sq(s: float, t: float) -> Tuple[float, float]:
            return (s, s) if p is q else (s, t)

        b = f(e, bind(0.0, 0.0))
        a = f(e, bind(1.0, 1.0)) - b
        if all(close(f(e, bind(s, t)), a * sq(s, t)[0] * sq(s, t)[1] + b) for s, t in probes):
            return (_qk.QK_ARG_XX, i, j, 0, a, b)
        b = f(e, bind(pi, pi))
        a = f(e, bind(pi - 1.0, pi - 1.0)) - b     # (pi - (pi - 1))^2 == 1 exactly
        if all(close(f(e, bind(s, t)), a * (pi - sq(s, t)[0]) * (pi - sq(s, t)[1]) + b) for s, t in probes):
            return (_qk.QK_ARG_PIXX, i, j, 0, a, b)
        return None


def circuit_to_ops(circuit: Any, weights: Optional[Sequence[Any]] = None) -> Tuple[int, int, int, List[Op]]:
    """(n_qubits, n_features, n_weights, ops) for _qk.Map.from_ops."""
    try:
        from qiskit.circuit import QuantumCircuit
    except ImportError as e:  # pragma: no cover - exercised only without qiskit
        raise ImportError("FeatureMap.from_qiskit needs qiskit (pip install qiskit)") from e
    if not isinstance(circuit, QuantumCircuit):
        raise TypeError(f"from_qiskit takes a qiskit QuantumCircuit (got {type(circuit).__name__})")
    params = list(circuit.parameters)              # the order Qiskit binds a sample in
    wlist = [] if weights is None else list(weights)
    wmap = {}
    for k, p in enumerate(wlist):
        if p in wmap:
            raise ValueError(f"from_qiskit: weight parameter {p} given twice")
        wmap[p] = k
    data = [p for p in params if p not in wmap]
    if not data:
        raise ValueError("from_qiskit: the circuit has no data parameters (a feature map binds a sample to its parameters)")
    feat = {p: i for i, p in enumerate(data)}
    angle = _Angle(feat, wmap)
    ops: List[Op] = []

    def walk(circ: Any, qmap: List[int], where: str, depth: int) -> None:
        for inst in circ.data:
            op = inst.operation
            name = op.name
            qs = [qmap[circ.find_bit(q).index] for q in inst.qubits]
            at = f"'{name}' on qubits {qs}{where}"
            if inst.clbits or name in ("measure", "reset"):
                raise ValueError(f"from_qiskit: {at}: a feature map must be unitary (no measurements, resets or classical bits)")
            if name in _SKIP:
                continue
            if name in _GATES:
                kind, arity, has_angle = _GATES[name]
                a = angle.fit(op.params[0], at) if has_angle else (_qk.QK_ARG_CONST, 0, 0, 0, 1.0, 0.0)
                ops.append((kind, qs[0], qs[1] if arity == 2 else 0) + a)
                continue
            definition = getattr(op, "definition", None) if depth < _MAX_DEPTH else None
            if definition is None:
                raise ValueError(f"from_qiskit: gate {at} is not supported (qk takes {_SUPPORTED}, "
                                 f"and composite gates made of them)")
            walk(definition, qs, f" (inside '{name}'){where}", depth + 1)

    walk(circuit, list(range(circuit.num_qubits)), "", 0)
    return circuit.num_qubits, len(data), len(wlist), ops
