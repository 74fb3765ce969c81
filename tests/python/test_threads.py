"""qk's thread pool under threadpoolctl and the environment: threadpool_info() lists qk,
threadpool_limits(n) sets the threads qk's next context gets (qk_ctx_query's n_threads, read
through qk._qk._last_threads()) and restores them on exit, an explicit threads= is not capped,
qk.set_num_threads / get_num_threads, QK_NUM_THREADS / OMP_NUM_THREADS read at import, and
joblib's worker processes (GridSearchCV(n_jobs=k)) start with cores // k. Skips without
threadpoolctl (the threadpoolctl tests only)."""
import os
import subprocess
import sys
import unittest

import numpy as np

import qk

X = np.random.default_rng(0).uniform(0, np.pi, (64, 5))


def _tpc():
    try:
        import threadpoolctl
    except ImportError as e:
        raise unittest.SkipTest(f"threadpoolctl is not installed ({e})")
    if not hasattr(threadpoolctl, "register"):
        raise unittest.SkipTest(f"threadpoolctl {threadpoolctl.__version__} has no register()")
    return threadpoolctl


def _qk_infos(tpc):
    return [i for i in tpc.threadpool_info() if i["internal_api"] == "qk"]


def _gram_threads(**kw):
    qk.gram(X, map="zz(reps=2)", device="cpu", **kw)
    return qk._qk._last_threads()


def test_threadpool_info_lists_qk():
    tpc = _tpc()
    infos = _qk_infos(tpc)
    assert len(infos) == 1, tpc.threadpool_info()
    info = infos[0]
    assert info["user_api"] == "qk" and info["version"] == qk.__version__
    assert os.path.realpath(info["filepath"]) == os.path.realpath(qk._qk.__file__)
    assert info["num_threads"] == qk.get_num_threads() >= 1


def test_threadpool_limits_reaches_qk():
    tpc = _tpc()
    default = qk.get_num_threads()
    assert _gram_threads() == default
    with tpc.threadpool_limits(1):
        assert qk.get_num_threads() == 1 and _qk_infos(tpc)[0]["num_threads"] == 1
        assert _gram_threads() == 1
        qk.FeatureMap("zz", 5).statevector(X)
        assert qk._qk._last_threads() == 1
        assert _gram_threads(threads=2) == 2               # an explicit count is the caller's
        with tpc.threadpool_limits(limits={"qk": default + 1}):   # by user_api; above the core count too
            assert _gram_threads() == default + 1
        assert _gram_threads() == 1
    assert qk.get_num_threads() == default and _gram_threads() == default   # restored
    with tpc.threadpool_limits(1, user_api="qk"):
        assert _gram_threads() == 1
    assert _gram_threads() == default


def test_set_num_threads():
    default = qk.get_num_threads()
    try:
        qk.set_num_threads(1)
        assert qk.get_num_threads() == 1 and _gram_threads() == 1
        qk.set_num_threads(3)
        assert _gram_threads() == 3
    finally:
        qk.set_num_threads(None)
    assert qk.get_num_threads() == default and _gram_threads() == default
    for bad in (0, -1, 1.5, "2", True):
        try:
            qk.set_num_threads(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"set_num_threads({bad!r}) must raise ValueError")
    assert qk.get_num_threads() == default


def _child_threads(env):
    code = "import warnings, qk; print(qk.get_num_threads())"
    e = {k: v for k, v in os.environ.items() if k not in ("QK_NUM_THREADS", "OMP_NUM_THREADS")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split()[-1]), r.stderr


def test_environment_variables():
    default, _ = _child_threads({})
    assert _child_threads({"OMP_NUM_THREADS": "1"})[0] == 1
    assert _child_threads({"OMP_NUM_THREADS": "3,1"})[0] == 3              # OpenMP's nested list: the first
    assert _child_threads({"QK_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"})[0] == 2   # qk's own wins
    n, err = _child_threads({"OMP_NUM_THREADS": "many"})
    assert n == default and "OMP_NUM_THREADS" in err and "RuntimeWarning" in err


def test_joblib_workers_share_the_cores():
    try:
        import joblib
    except ImportError as e:
        raise unittest.SkipTest(f"joblib is not installed ({e})")
    # loky's workers get OMP_NUM_THREADS = cores // n_jobs (unless the parent sets it): qk reads it
    if "QK_NUM_THREADS" in os.environ:
        want = int(os.environ["QK_NUM_THREADS"])
    else:
        want = int(str(os.environ.get("OMP_NUM_THREADS", max(joblib.cpu_count() // 2, 1))).split(",")[0])
    got = joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(qk.get_num_threads)() for _ in range(4))
    assert got == [want] * 4, (got, want)
