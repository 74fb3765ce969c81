"""qk.gram, qk.FeatureMap, qk.Kernel: values (an independent numpy statevector; the qk-gram CLI),
inputs of every dtype and stride, out= arrays / memmaps / .npy paths, the documented exceptions,
the GIL released. Needs numpy only (tests/python/run.py skips the file without it). The CPU
engine's semantics are tested with device="cpu" (a GPU machine's "auto" is the GPU engine, fp32
by default); test_cuda_engine_equals_cpu checks the GPU engine where there is one."""
import copy
import os
import pickle
import subprocess
import tempfile
import threading
import time
import unittest
import warnings

import functools

import numpy as np

import qk

gram = functools.partial(qk.gram, device="cpu")
RNG = np.random.default_rng(20261123)


# ---- an independent statevector simulator (Qiskit's conventions: qubit 0 = least significant bit) ----
def _apply1(psi, q, U):
    n = psi.size.bit_length() - 1
    t = psi.reshape([2] * n)                       # axis n-1-q is qubit q
    ax = n - 1 - q
    t = np.moveaxis(np.tensordot(U, np.moveaxis(t, ax, 0), axes=(1, 0)), 0, ax)
    return t.reshape(-1)


def _cx(psi, c, t):
    idx = np.arange(psi.size)
    out = psi.copy()
    on = (idx >> c) & 1 == 1
    out[on] = psi[idx[on] ^ (1 << t)]
    return out


def zz_state(x, reps=2, alpha=2.0, pairs=None):
    """Qiskit's ZZFeatureMap, written from its definition: per rep H, P(alpha x_i), and for each
    pair CX P(alpha (pi - x_i)(pi - x_j)) CX."""
    n = len(x)
    pairs = pairs if pairs is not None else [(i, j) for i in range(n) for j in range(i + 1, n)]
    H = np.array([[1, 1], [1, -1]]) / np.sqrt(2)
    P = lambda t: np.diag([1, np.exp(1j * t)])
    psi = np.zeros(2 ** n, complex)
    psi[0] = 1
    for _ in range(reps):
        for q in range(n):
            psi = _apply1(psi, q, H)
        for q in range(n):
            psi = _apply1(psi, q, P(alpha * x[q]))
        for i, j in pairs:
            psi = _cx(psi, i, j)
            psi = _apply1(psi, j, P(alpha * (np.pi - x[i]) * (np.pi - x[j])))
            psi = _cx(psi, i, j)
    return psi


def ref_gram(states_a, states_b=None):
    B = states_a if states_b is None else states_b
    return np.abs(states_a.conj() @ B.T) ** 2


def rand(n, d, lo=0.0, hi=np.pi):
    return RNG.uniform(lo, hi, (n, d))


def raises(exc, fn, *args, match=None, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        if match is not None:
            assert match in str(e), f"{exc.__name__} message {str(e)!r} lacks {match!r}"
        return e
    raise AssertionError(f"{exc.__name__} not raised")


# ---- values ----
def test_zz_equals_independent_statevector():
    X, Y = rand(23, 4), rand(9, 4)
    SX = np.array([zz_state(x) for x in X])
    SY = np.array([zz_state(y) for y in Y])
    K = gram(X)
    assert K.dtype == np.float64 and K.shape == (23, 23)
    np.testing.assert_allclose(K, ref_gram(SX), atol=1e-12, rtol=0)
    np.testing.assert_array_equal(K, K.T)
    np.testing.assert_allclose(gram(X, Y), ref_gram(SX, SY), atol=1e-12, rtol=0)
    K1 = gram(X, map="zz(reps=1,alpha=0.5,ent=linear)")
    S1 = np.array([zz_state(x, 1, 0.5, [(0, 1), (1, 2), (2, 3)]) for x in X])
    np.testing.assert_allclose(K1, ref_gram(S1), atol=1e-12, rtol=0)


def test_statevector_equals_independent_statevector():
    X = rand(5, 3)
    fm = qk.FeatureMap("zz(reps=2)", 3)
    S = fm.statevector(X)
    assert S.shape == (5, 8) and S.dtype == np.complex128
    for s, x in zip(S, X):
        np.testing.assert_allclose(s, zz_state(x), atol=1e-12)
    np.testing.assert_allclose(fm.statevector(X[0]), S[0], atol=0)      # 1-D: one state


def _qk_gram_cli(args):
    exe = os.environ.get("QK_GRAM")
    if not exe or not os.path.exists(exe):
        raise unittest.SkipTest("QK_GRAM (the qk-gram program) is not set: build with -Dexamples=true")
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for name, arr in args.items():
            if isinstance(arr, np.ndarray):
                files[name] = os.path.join(d, name + ".npy")
                np.save(files[name], arr)
        cmd = [exe, "--map", args["map"], "--x", files["x"], "--out", os.path.join(d, "K.npy"), "--device", "cpu"]
        if "y" in files:
            cmd += ["--y", files["y"]]
        if "weights" in files:
            cmd += ["--weights", files["weights"]]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return np.load(os.path.join(d, "K.npy"))


def test_values_equal_qk_gram_cli():
    X, Y = rand(70, 5), rand(33, 5)
    for spec in ["zz(reps=2)", "iqp(reps=2)", "angle(rot=y)", "amplitude", "zz(reps=1,ent=circular)"]:
        K_cli = _qk_gram_cli({"map": spec, "x": X})
        np.testing.assert_allclose(gram(X, map=spec), K_cli, atol=1e-15, rtol=0)
        K_cli = _qk_gram_cli({"map": spec, "x": X, "y": Y})
        np.testing.assert_allclose(gram(X, Y, map=spec), K_cli, atol=1e-15, rtol=0)
    w = RNG.uniform(-1, 1, 20)
    K_cli = _qk_gram_cli({"map": "hea(layers=2,rot=yz)", "x": X, "weights": w})
    np.testing.assert_allclose(gram(X, map="hea(layers=2,rot=yz)", weights=w), K_cli, atol=1e-15, rtol=0)


# ---- inputs: dtypes, strides, copies ----
def test_inputs_any_dtype_and_stride():
    X = rand(40, 3)
    K = gram(X)
    np.testing.assert_array_equal(gram(np.asfortranarray(X)), K)
    np.testing.assert_array_equal(gram(X.tolist()), K)
    big = np.zeros((80, 7))
    big[::2, 1:7:2] = X
    view = big[::2, 1:7:2]                       # strided in both axes
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(gram(view), K)
    np.testing.assert_array_equal(gram(X.astype(">f8")), K)    # big-endian
    X32 = X.astype(np.float32)
    np.testing.assert_array_equal(gram(X32), gram(X32.astype(np.float64)))
    Xi = RNG.integers(0, 2, (10, 4))
    np.testing.assert_array_equal(gram(Xi, map="basis"), gram(Xi.astype(float), map="basis"))
    np.testing.assert_array_equal(gram(Xi.astype(bool), map="basis"), gram(Xi.astype(float), map="basis"))


def test_c_contiguous_float64_is_not_copied():
    X = rand(10, 3)
    assert qk._as_data(X, "X") is X
    mm_path = os.path.join(tempfile.mkdtemp(), "X.dat")
    mm = np.memmap(mm_path, dtype=np.float64, mode="w+", shape=(10, 3))
    mm[:] = X
    assert qk._as_data(mm, "X") is mm            # a memmap is used in place too
    np.testing.assert_array_equal(gram(mm), gram(X))
    assert qk._as_data(X.astype(np.float32), "X").dtype == np.float64


def test_kernel_symmetric_when_Y_is_X():
    X = rand(30, 4)
    k = qk.Kernel("zz(reps=2)", device="cpu")
    K = k(X, X)
    np.testing.assert_array_equal(K, gram(X))               # the symmetric path: exactly K(X, X)
    np.testing.assert_array_equal(K, K.T)
    np.testing.assert_allclose(k(X, X.copy()), K, atol=1e-14)   # K(X, Y) path, same values
    np.testing.assert_array_equal(k.evaluate(X[0]), gram(X[:1]))
    np.testing.assert_array_equal(k.evaluate(X[0], X[1:4]), gram(X[:1], X[1:4]))


def test_threads_and_precision():
    X = rand(150, 6)
    K = gram(X)
    np.testing.assert_array_equal(gram(X, threads=1), K)
    np.testing.assert_array_equal(gram(X, threads=3), K)
    np.testing.assert_array_equal(qk.gram(X, device="cpu", precision="fp64"), K)
    K32 = qk.gram(X, device="cpu", precision="fp32")
    assert K32.dtype == np.float32
    np.testing.assert_allclose(K32, K, atol=1e-6, rtol=0)
    # every mode name runs on the CPU engine (computing in fp64); the tensor-core modes give
    # float32 like fp32, auto the engine's default dtype
    for mode in ("tf32", "fp32x3", "fp16"):
        Km = qk.gram(X, device="cpu", precision=mode)
        assert Km.dtype == np.float32
        np.testing.assert_allclose(Km, K, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(qk.gram(X, device="cpu", precision="auto"), K)
    np.testing.assert_array_equal(qk.gram(X, device="cpu", precision="auto", tol=1e-2), K)
    raises(ValueError, qk.gram, X, device="cpu", precision="fp32", tol=1e-3, match="tol")
    raises(ValueError, qk.gram, X, device="cpu", precision="auto", tol=0.0, match="tol")
    raises(ValueError, qk.gram, X, device="cpu", precision="auto", tol=float("nan"), match="tol")


# ---- out= ----
def test_out_array_memmap_and_row_stride():
    X, Y = rand(37, 4), rand(21, 4)
    K = gram(X, Y)
    out = np.full((37, 21), -1.0)
    r = gram(X, Y, out=out)
    assert r is out
    np.testing.assert_array_equal(out, K)
    wide = np.full((37, 30), -7.0, dtype=np.float32)             # a slice of a wider array: ld_out
    r = gram(X, Y, out=wide[:, 4:25])
    np.testing.assert_allclose(wide[:, 4:25], K, atol=1e-6)
    assert (wide[:, :4] == -7).all() and (wide[:, 25:] == -7).all()
    with tempfile.TemporaryDirectory() as d:
        mm = np.memmap(os.path.join(d, "K.dat"), dtype=np.float64, mode="w+", shape=(37, 37))
        gram(X, out=mm)
        mm.flush()
        np.testing.assert_array_equal(np.fromfile(os.path.join(d, "K.dat")).reshape(37, 37), gram(X))
        del mm


def test_out_npy_path():
    X = rand(90, 5)
    K = gram(X)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "K.npy")
        r = gram(X, out=p)
        assert isinstance(r, np.memmap) and not r.flags.writeable
        np.testing.assert_array_equal(r, K)
        np.testing.assert_array_equal(np.load(p), K)
        del r
        from pathlib import Path
        r = gram(X, X[:13], out=Path(d) / "KY.npy", precision="fp32")
        assert r.dtype == np.float32 and r.shape == (90, 13)
        np.testing.assert_allclose(r, gram(X, X[:13]), atol=1e-6)
        del r
        bad = os.path.join(d, "no-such-dir", "K.npy")
        raises(FileNotFoundError, gram, X, out=bad)
        assert sorted(os.listdir(d)) == ["K.npy", "KY.npy"]       # nothing half-written left
        raises(ValueError, gram, np.full((3, 5), np.nan), out=os.path.join(d, "nan.npy"))
        assert sorted(os.listdir(d)) == ["K.npy", "KY.npy"]


def test_out_errors():
    X = rand(8, 3)
    raises(ValueError, gram, X, out=np.zeros((8, 7)), match="shape")
    raises(TypeError, gram, X, out=np.zeros((8, 8), dtype=np.int64), match="float32 or float64")
    ro = np.zeros((8, 8))
    ro.flags.writeable = False
    raises(ValueError, gram, X, out=ro, match="read-only")
    raises(ValueError, gram, X, out=np.zeros((8, 8)).T.copy().T, match="contiguous")   # Fortran order
    raises(ValueError, gram, X, out=np.zeros((8, 16))[:, ::2], match="contiguous")
    buf = np.full((8, 8), 0.5)
    raises(ValueError, gram, buf.reshape(-1)[:24].reshape(8, 3), out=buf, match="overlaps X")  # X used in place
    gram(buf[:, :3], out=buf)     # a strided X is copied first: no overlap then
    raises(TypeError, gram, X, out=[[0.0] * 8] * 8)


# ---- the documented exceptions ----
def test_bad_inputs_raise_documented_exceptions():
    X = rand(6, 3)
    for bad, where in [(np.nan, "NaN"), (np.inf, "Inf")]:
        Xb = X.copy()
        Xb[4, 1] = bad
        raises(ValueError, gram, Xb, match=f"X[4][1] is {where}")
        raises(ValueError, gram, X, Xb, match=f"Y[4][1] is {where}")
    raises(ValueError, gram, X, rand(4, 2), match="features")
    raises(ValueError, gram, X[0], match="2-D")
    raises(ValueError, gram, X.reshape(1, 6, 3), match="2-D")
    # no samples: an empty K (qk_gram itself takes n > 0), shapes still checked
    assert gram(np.zeros((0, 3))).shape == (0, 0) and gram(X, np.zeros((0, 3))).shape == (6, 0)
    assert gram(np.zeros((0, 3)), X).dtype == np.float64
    raises(ValueError, gram, X, np.zeros((0, 2)), match="features")
    raises(ValueError, gram, X, np.zeros((0, 3)), out=np.zeros((6, 1)), match="shape")
    raises(TypeError, gram, np.array([["a", "b"], ["c", "d"]]), match="real numbers")
    raises(TypeError, gram, X.astype(complex), match="real numbers")
    raises(TypeError, gram, np.array([[1.0, None]], dtype=object), match="real numbers")
    raises(ValueError, gram, X, map="zz(rep=2)", match="unknown parameter")
    raises(ValueError, gram, X, map="nosuchmap", match="nosuchmap")
    raises(TypeError, gram, X, map=42)
    raises(ValueError, gram, X, map=qk.FeatureMap("zz", 4), match="features")
    raises(ValueError, qk.gram, X, device="tpu", match="device")
    raises(ValueError, gram, X, precision="fp8", match="precision")
    raises(ValueError, gram, X, threads=0, match="threads")
    raises(ValueError, gram, rand(2, 31), map="zz", match="qubits")
    raises(ValueError, gram, np.zeros((2, 4)), map="amplitude", match="norm")
    raises(ValueError, gram, np.full((2, 3), 0.5), map="basis")
    if not qk.engine()["cuda_devices"]:
        raises(RuntimeError, qk.gram, X, device="cuda", match="cuda")


def test_wrong_weights():
    X = rand(5, 3)
    raises(ValueError, gram, X, map="hea(layers=2)", weights=np.ones(5), match="weights")    # takes 6
    raises(ValueError, gram, X, map="hea(layers=2)", weights=[1, 2, 3, np.nan, 5, 6], match="NaN")
    raises(ValueError, gram, X, map="zz", weights=[1.0], match="weights")                  # zz has none
    raises(TypeError, gram, X, map="hea(layers=2)", weights=["a"] * 6)
    raises(ValueError, gram, X, map="hea(layers=2)", weights=np.ones((2, 3)), match="1-D")
    w = RNG.uniform(-2, 2, 6)
    fm = qk.FeatureMap("hea(layers=2)", 3, weights=w)
    np.testing.assert_array_equal(fm.weights, w)
    np.testing.assert_array_equal(gram(X, map=fm), gram(X, map="hea(layers=2)", weights=w))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qk.DefaultWeightsWarning)
        assert not np.array_equal(gram(X, map=fm), gram(X, map="hea(layers=2)"))       # default 1.0


def test_file_errors_are_os_errors_as_numpy_raises_them():
    # each unwritable out= path raises what open(path, "wb") (np.save's open) raises for it: the
    # OSError subclass of its errno, with errno and filename; nothing is left behind
    X = rand(7, 3)
    with tempfile.TemporaryDirectory() as d:
        locked = os.path.join(d, "locked")
        os.mkdir(locked)
        os.chmod(locked, 0o500)
        cases = [os.path.join(d, "no-such-dir", "K.npy"),      # FileNotFoundError
                 d,                                            # IsADirectoryError (qk: the rename)
                 os.path.join(os.devnull, "K.npy"),            # NotADirectoryError
                 os.path.join(locked, "K.npy"),                # PermissionError (not for root)
                 "/sys/qk-K.npy",                              # PermissionError (or EROFS) where sysfs is
                 "/proc/qk-K.npy"]
        seen = set()
        try:
            for path in cases:
                try:
                    with open(path, "wb"):
                        pass
                except OSError as e:
                    ref = e
                else:
                    os.remove(path)                            # writable here (root ignores modes): no case
                    continue
                before = sorted(os.listdir(d))
                try:
                    gram(X, out=path)
                except OSError as e:
                    assert type(e) is type(ref), (path, type(e), type(ref), e)
                    assert e.errno == ref.errno and e.filename == path, (e.errno, ref.errno, e.filename)
                    assert "I/O error: cannot write" in str(e), e
                else:
                    raise AssertionError(f"gram(out={path!r}) wrote where open() cannot")
                assert sorted(os.listdir(d)) == before
                seen.add(type(ref))
        finally:
            os.chmod(locked, 0o700)
    assert {FileNotFoundError, IsADirectoryError, NotADirectoryError} <= seen, seen


def test_device_names():
    X = rand(6, 3)
    for name in ("cpu", "CPU", "auto", "Auto"):
        K = qk.gram(X, device=name, precision="fp64")
        if name.lower() == "auto" and qk.engine()["cuda_devices"]:
            # "auto" is the GPU where there is one: fp64 there, to rounding
            np.testing.assert_allclose(K, gram(X, precision="fp64"), atol=1e-13, rtol=0)
        else:
            np.testing.assert_array_equal(K, gram(X, precision="fp64"))
    # "gpu" is "cuda" (the CLI's --device gpu): the same K, or the same error without a device
    outcomes = []
    for name in ("cuda", "gpu", "GPU"):
        try:
            outcomes.append(("K", qk.gram(X, device=name, precision="fp64").tolist()))
        except RuntimeError as e:
            outcomes.append(("RuntimeError", str(e)))
        try:
            outcomes.append(("K", qk.Kernel(device=name, precision="fp64")(X).tolist()))
        except RuntimeError as e:
            outcomes.append(("RuntimeError", str(e)))
    assert all(o == outcomes[0] for o in outcomes), outcomes
    if not qk.engine()["cuda_devices"]:
        assert outcomes[0][0] == "RuntimeError" and "CUDA" in outcomes[0][1].upper(), outcomes[0]
    raises(ValueError, qk.gram, X, device="tpu", match="'gpu'")


def test_default_weights_warning():
    X = rand(5, 3)
    w = np.full(6, 0.7)

    def caught(fn):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            fn()
        return [x for x in ws if issubclass(x.category, qk.DefaultWeightsWarning)]

    for fn in (lambda: gram(X, map="hea(layers=2)"), lambda: qk.FeatureMap("hea(layers=2)", 3),
               lambda: qk.Kernel("hea(layers=2)", device="cpu")(X)):
        ws = caught(fn)
        assert len(ws) == 1, ws
        assert issubclass(ws[0].category, UserWarning) and "6 trainable weights" in str(ws[0].message)
        assert os.path.abspath(ws[0].filename) == os.path.abspath(__file__), ws[0].filename   # points at the caller
    # per-pair calls warn once per kernel (the map is kept), not once per pair
    k = qk.Kernel("hea(layers=2)", device="cpu")
    assert len(caught(lambda: [k(X[i], X[j]) for i in range(3) for j in range(3)])) == 1
    # weights given, maps without weights, pickling a weighted map: no warning
    fm = qk.FeatureMap("hea(layers=2)", 3, weights=w)
    for fn in (lambda: gram(X, map="hea(layers=2)", weights=w), lambda: gram(X, map=fm),
               lambda: qk.Kernel("hea(layers=2)", weights=w, device="cpu")(X[0], X[1]),
               lambda: gram(X, map="zz"), lambda: pickle.loads(pickle.dumps(fm)), lambda: fm.with_weights(w)):
        assert caught(fn) == []


def test_memory_error():
    # K of 300000^2 float64 values (720 GB) cannot be allocated: MemoryError, not a crash. Under
    # "always overcommit" (vm.overcommit_memory = 1, seen on the GPU machine) the allocation
    # succeeds and the kernel's OOM killer ends the process instead: nothing to test there.
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            if f.read().strip() == "1":
                raise unittest.SkipTest("vm.overcommit_memory = 1: a 720 GB allocation would succeed")
    except OSError:
        pass
    X = np.zeros((300000, 1))
    raises(MemoryError, gram, X, map="angle")


# ---- FeatureMap ----
def test_feature_map_properties_and_round_trips():
    cases = {"zz(reps=2)": (4, 4, "complex"), "angle(rot=y)": (4, 4, "product"), "amplitude": (5, 3, "real"),
             "iqp": (3, 3, "complex"), "hea(layers=1)": (3, 3, "real"), "basis": (6, 6, "product")}
    for spec, (d, q, kind) in cases.items():
        fm = qk.FeatureMap(spec, d)
        assert (fm.n_features, fm.n_qubits, fm.kind) == (d, q, kind), (spec, fm)
        again = qk.FeatureMap(fm.spec, d)
        assert again == fm and hash(again) == hash(fm)
        assert pickle.loads(pickle.dumps(fm)) == fm
        assert copy.deepcopy(fm) == fm
        x = RNG.integers(0, 2, d).astype(float) if spec == "basis" else rand(1, d)[0]
        s = fm.statevector(x)
        assert s.shape == (2 ** q,)
        assert abs(np.vdot(s, s) - 1) < 1e-12
    raises(TypeError, qk.FeatureMap, 3, 3)
    raises(ValueError, qk.FeatureMap, "zz(reps=-1)", 3)


def test_kernel_params_protocol():
    k = qk.Kernel("iqp", device="cpu", threads=2)
    p = k.get_params()
    assert p == {"map": "iqp", "weights": None, "device": "cpu", "precision": None, "threads": 2}
    k2 = qk.Kernel(**p)
    assert k2.get_params() == p
    assert k.set_params(map="zz(reps=1)") is k and k.map == "zz(reps=1)"
    raises(ValueError, k.set_params, nosuch=1)
    assert pickle.loads(pickle.dumps(k)).get_params() == k.get_params()
    assert k.feature_map(3) == qk.FeatureMap("zz(reps=1)", 3)
    repr(k)


# ---- the GIL ----
def test_gil_released_during_compute():
    X = rand(2500, 8)
    done = []
    t = threading.Thread(target=lambda: done.append(gram(X, threads=1)))     # CPU: about 1 s
    t0 = time.perf_counter()
    t.start()
    spins = 0
    while t.is_alive():
        spins += 1
        time.sleep(0.001)
    elapsed = time.perf_counter() - t0
    t.join()
    assert done and done[0].shape == (2500, 2500)
    # with the GIL held the main thread would not run at all while qk computes (1 or 2 spins)
    assert elapsed > 0.1, f"the job took {elapsed:.3f} s: too short to tell"
    assert spins >= 20, (spins, elapsed)


# ---- the GPU engine, where the package has it and a device is present ----
def test_cuda_engine_equals_cpu():
    if not qk.engine()["cuda_devices"]:
        raise unittest.SkipTest(f"no CUDA device ({qk.engine()})")
    X, Y = rand(300, 6), rand(70, 6)
    for spec in ["zz(reps=2)", "iqp", "angle(rot=y)", "amplitude", "hea(layers=2)"]:
        K = gram(X, map=spec)
        K64 = qk.gram(X, map=spec, device="cuda", precision="fp64")
        assert K64.dtype == np.float64
        np.testing.assert_allclose(K64, K, atol=1e-12, rtol=0)
        K32 = qk.gram(X, Y, map=spec, device="cuda")             # the GPU engine's default: fp32
        assert K32.dtype == np.float32
        np.testing.assert_allclose(K32, gram(X, Y, map=spec), atol=2e-5, rtol=0)
        assert qk.gram(X, map=spec).dtype == np.float32          # auto picks the GPU here
    out = np.full((300, 80), -1.0)
    qk.gram(X, Y, out=out[:, 5:75], device="cuda", precision="fp64")
    np.testing.assert_allclose(out[:, 5:75], gram(X, Y), atol=1e-12)
    assert (out[:, :5] == -1).all() and (out[:, 75:] == -1).all()
    with tempfile.TemporaryDirectory() as d:
        r = qk.gram(X, out=os.path.join(d, "K.npy"), device="cuda", precision="fp64")
        np.testing.assert_allclose(r, gram(X), atol=1e-12)
        del r


def test_forked_child_computes():
    # a forked child (multiprocessing's fork start method, joblib) must not reuse the parent's
    # cached qk context: its thread pool did not survive the fork, and waiting for it would hang
    if not hasattr(os, "fork"):
        raise unittest.SkipTest("no fork on this platform")
    # (the CPU engine: CUDA itself cannot be used in a child forked after the parent used it,
    # a CUDA rule that docs/python.md states)
    X = rand(200, 6)
    K = gram(X, threads=2, device="cpu")         # the parent now holds a context with a pool
    pid = os.fork()
    if pid == 0:                                 # child: exit status 0 when K matches
        code = 2
        try:
            code = 0 if np.array_equal(gram(X, threads=2, device="cpu"), K) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung in qk.gram")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
