"""An attack on the per-pair protocol (``qk.Kernel(x, y)`` of two 1-D samples, issue 25's
addition) and the array arguments around it, as a hostile or careless caller would use it:
random maps, lengths (0 features, mismatched x / y, more qubits than the engines take), dtypes
(integers, bool, float16 / float32, big-endian, complex, object), layouts (strided, Python
lists), values (NaN, Inf, 1e308, subnormals, data outside a map's domain) and masked arrays.

Every call must either return a Python float in [0, 1] equal to the matrix path's K[0, 0] on the
same data, or raise TypeError / ValueError with a message; anything else (another exception, a
crash, a value outside [0, 1], a masked entry used silently) fails. The seed is printed; set
QK_ATTACK_SEED to replay one run. The CPU engine (fp64) answers, also on a GPU host: "auto" would
take the GPU's fp32-class default there, whose K(x, x) is 1 to fp32's rounding (1 + 2e-7).
"""
import math
import os
import warnings

import numpy as np
import qk

MAPS = ["zz", "zz(reps=2)", "angle", "iqp", "hea(layers=1)", "amplitude", "basis", "angle(rot=x)"]


def _value(rng, kind, n):
    if kind == 0:
        return rng.uniform(-3, 3, n)
    if kind == 1:
        return rng.integers(-5, 5, n)
    if kind == 2:
        return rng.uniform(-3, 3, n).astype(np.float32)
    if kind == 3:
        return rng.integers(0, 2, n).astype(bool)
    if kind == 4:   # one hostile value
        a = rng.uniform(-3, 3, n)
        if n:
            a[rng.integers(0, n)] = rng.choice([np.nan, np.inf, -np.inf, 1e308, -1e308, 5e-324])
        return a
    if kind == 5:
        return rng.uniform(-3, 3, n).astype(np.float16)
    if kind == 6:
        return rng.uniform(-3, 3, n) + 1j
    if kind == 7:
        return np.array(["1"] * n, dtype=object)
    if kind == 8:   # strided view
        return rng.uniform(-3, 3, 2 * n)[::2]
    if kind == 9:   # masked, usually with a masked entry
        return np.ma.masked_array(rng.uniform(-3, 3, n), mask=rng.integers(0, 2, n).astype(bool))
    if kind == 10:
        return rng.uniform(-3, 3, n).astype(">f8")
    if kind == 11:
        return list(rng.uniform(-3, 3, n))
    return rng.integers(0, 2, n).astype(np.float64)   # in basis encoding's domain


def test_per_pair_protocol_under_attack():
    seed = int(os.environ.get("QK_ATTACK_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"seed {seed} (QK_ATTACK_SEED={seed} replays it)")
    rng = np.random.default_rng(seed)
    outcomes = {"value": 0, "TypeError": 0, "ValueError": 0}
    bad = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for it in range(600):
            m = MAPS[rng.integers(len(MAPS))]
            n = int(rng.choice([0, 1, 2, 3, 4, 5, 8, 13, 40]))
            x = _value(rng, int(rng.integers(13)), n)
            pick = int(rng.integers(4))
            y = None if pick == 0 else x if pick == 1 else _value(rng, int(rng.integers(13)),
                                                                  n if rng.random() < 0.8 else n + 1)
            what = f"#{it} map={m} n={n} x={type(x).__name__}:{np.asarray(x).dtype} y={None if y is None else np.asarray(y).dtype}"
            try:
                v = qk.Kernel(map=m, device="cpu")(x, y)
            except (TypeError, ValueError) as e:
                outcomes[type(e).__name__] += 1
                if not str(e):
                    bad.append(f"{what}: {type(e).__name__} without a message")
                continue
            except Exception as e:   # noqa: BLE001 (the point of the test)
                bad.append(f"{what}: unexpected {type(e).__name__}: {e}")
                continue
            outcomes["value"] += 1
            if any(np.ma.isMaskedArray(a) and np.ma.is_masked(a) for a in (x, y)):
                bad.append(f"{what}: a masked entry was used silently (K = {v!r})")
                continue
            if not (isinstance(v, float) and math.isfinite(v) and -1e-12 <= v <= 1 + 1e-12):
                bad.append(f"{what}: K = {v!r} is not a float in [0, 1]")
                continue
            X2 = np.asarray(x, dtype=np.float64).reshape(1, -1)
            Y2 = X2 if y is None else np.asarray(y, dtype=np.float64).reshape(1, -1)
            ref = float(qk.Kernel(map=m, device="cpu")(X2, Y2)[0, 0])
            if abs(ref - v) > 1e-12:
                bad.append(f"{what}: per-pair K = {v!r}, matrix path {ref!r}")
    print(outcomes)
    assert not bad, "\n".join(bad[:20])
    # the attack reached every outcome (a generator that only produced errors would test nothing)
    assert all(c > 20 for c in outcomes.values()), outcomes


def test_masked_arrays_are_refused():
    k = qk.Kernel(map="zz")
    x = np.ma.masked_array([0.1, 0.2, 0.3], mask=[0, 1, 0])
    for call in (lambda: k(x, x), lambda: k(x), lambda: k(x.reshape(1, -1)), lambda: qk.gram(x.reshape(1, -1), map="zz"),
                 lambda: qk.gram(np.ones((2, 3)), map="hea(layers=1)", weights=np.ma.masked_array(np.ones(6), mask=[1] + [0] * 5))):
        try:
            call()
        except ValueError as e:
            assert "masked" in str(e), e
        else:
            raise AssertionError("a masked entry was used silently")
    # a masked array without a masked entry is plain data
    clean = np.ma.masked_array([0.1, 0.2, 0.3], mask=False)
    assert k(clean, clean) == k(np.array([0.1, 0.2, 0.3]), np.array([0.1, 0.2, 0.3]))


def test_huge_feature_counts_are_refused_before_work():
    k = qk.Kernel(map="angle")
    for n in (10**7, 5000):
        try:
            k(np.zeros(n))
        except ValueError as e:
            assert "qubits" in str(e), e
        else:
            raise AssertionError(f"{n} features accepted")
