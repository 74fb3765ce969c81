"""qk.prof (qk_prof.h from Python) on the CPU: zones as context managers and decorators, nesting
and self time, zones of several threads, step markers and per-step statistics, counters, array
memory tracking by name, the four reports (parsed), errors; GPU zones on CuPy and PyTorch streams
only where the package has CUDA and a GPU and the library is installed (skipped otherwise)."""
import json
import os
import tempfile
import threading
import time
import unittest

import numpy as np

import qk.prof as prof


def fresh(**kw):
    prof.shutdown()
    prof.init(**kw)


def spin(s):
    t = time.perf_counter()
    while time.perf_counter() - t < s:
        pass


def test_zones_nesting_and_decorators():
    fresh()

    @prof.zone("decorated")
    def work(x):
        spin(0.001)
        return x + 1

    @prof.func
    def named():
        return 7

    for i in range(5):
        with prof.zone("outer"):
            spin(0.002)
            assert work(i) == i + 1
    assert named() == 7
    outer, dec = prof.zone_stats("outer"), prof.zone_stats("decorated")
    assert outer["calls"] == 5 and dec["calls"] == 5
    assert outer["total_ns"] >= 5 * 3e6 and dec["total_ns"] >= 5 * 1e6
    # self time: outer less the decorated zones nested in it
    assert abs(outer["self_ns"] - (outer["total_ns"] - dec["total_ns"])) <= 1e-6 * outer["total_ns"]
    assert prof.zone_stats(named.__qualname__)["calls"] == 1
    assert prof.zone_stats("never") is None
    assert prof.summary()["unbalanced"] == 0 and prof.summary()["mismatched"] == 0


def test_exception_closes_zone():
    fresh()
    try:
        with prof.zone("raises"):
            raise ValueError("x")
    except ValueError:
        pass
    with prof.zone("after"):
        pass
    s = prof.summary()
    assert s["unbalanced"] == 0 and s["mismatched"] == 0
    assert prof.zone_stats("raises")["calls"] == 1


def test_threads():
    fresh()

    bar = threading.Barrier(4)

    def body(k):
        prof.thread_name("worker %d" % k)
        for _ in range(200):
            with prof.zone("t"):
                pass
        bar.wait()  # all alive at once: four threads, not one lane handed on (qk_prof reuses exited threads')

    ts = [threading.Thread(target=body, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert prof.zone_stats("t")["calls"] == 800
    assert prof.summary()["threads"] == 4


def test_steps():
    fresh(step_warmup=2)
    for i in range(12):
        prof.step(i)
        with prof.zone("every"):
            spin(0.0005 + 0.0002 * i)  # a planted upward drift
        if i % 3 == 0:
            with prof.zone("sometimes"):
                spin(0.0003)
    prof.step_end()
    with prof.zone("outside"):
        pass
    st = prof.step_stats()
    assert st["steps"] == 10 and st["marked"] == 12 and st["first"] == 2 and st["last"] == 11
    assert st["min_ns"] <= st["p50_ns"] <= st["p95_ns"] <= st["p99_ns"] <= st["max_ns"]
    ev = prof.step_stats("every")
    assert ev["steps"] == 10 and ev["trend_ns"] > 0 and ev["trend_rel"] > 0  # the drift shows
    so = prof.step_stats("sometimes")
    assert so["steps"] == 9 and so["min_ns"] == 0  # from step 3 on, 0 where it did not run
    assert prof.step_stats("outside") is None


def test_counters_and_memory():
    fresh()
    for i in range(4):
        prof.count("tiles", 2)
    prof.counter("temperature", 3.5)
    a = prof.track("psi", np.zeros((64, 32), dtype=np.float32))
    b = prof.track("dose", np.ones(1000, dtype=np.float64))
    s = prof.summary()
    assert s["host_current"] == a.nbytes + b.nbytes and s["host_peak"] == a.nbytes + b.nbytes
    prof.untrack(a)
    s = prof.summary()
    assert s["host_current"] == b.nbytes and s["host_peak"] == a.nbytes + b.nbytes
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "r.json")
        prof.write_json(p)
        rep = json.load(open(p))
    names = {m["name"]: m for m in rep["memory"]["names"]}
    assert names["psi"]["peak"] == a.nbytes and names["psi"]["current"] == 0
    assert names["psi"]["dtype"] == "float32" and names["psi"]["shape"] == "64x32"
    assert names["dose"]["current"] == b.nbytes
    ctr = {c["name"]: c for c in rep["counters"]}
    assert ctr["tiles"]["sum"] == 8 and ctr["temperature"]["last"] == 3.5


def test_reports():
    fresh()
    for i in range(6):
        prof.step(i)
        with prof.zone("stream \"q\" <x>"):
            spin(0.0002)
    prof.step_end()
    with tempfile.TemporaryDirectory() as d:
        paths = {k: os.path.join(d, k) for k in ("r.txt", "r.json", "t.json", "r.html")}
        prof.report(paths["r.txt"])
        prof.write_json(paths["r.json"])
        prof.write_trace(paths["t.json"])
        prof.write_html(paths["r.html"])
        txt = open(paths["r.txt"]).read()
        rep = json.load(open(paths["r.json"]))
        tr = json.load(open(paths["t.json"]))
        page = open(paths["r.html"]).read()
        assert "qk_prof report" in txt and "Steps:" in txt
        assert rep["generator"] == "qk_prof" and rep["cpu_zones"][0]["name"] == "stream \"q\" <x>"
        assert rep["steps"]["step"]["steps"] == 5
        assert sum(1 for e in tr["traceEvents"] if e["ph"] == "X") == 6
        assert "Step times" in page and "&lt;x&gt;" in page and "<x>" not in page
        try:
            prof.report(os.path.join(d, "no", "such", "dir.txt"))
        except OSError as e:
            assert "no" in str(e)
        else:
            raise AssertionError("a report into a missing directory must raise")
    try:
        prof.init()
    except RuntimeError:
        pass
    else:
        raise AssertionError("init after recording must raise")


def test_gpu_zone_without_cuda():
    if prof.has_cuda():
        raise unittest.SkipTest("this build has CUDA (test_gpu_* cover it)")
    fresh()
    with prof.gpu_zone("k", 0):
        pass
    assert prof.summary()["gpu_ignored"] == 1
    assert prof.stream_handle(None) == 0 and prof.stream_handle(1234) == 1234

    class FakeStream:
        ptr = 99
    assert prof.stream_handle(FakeStream()) == 99


def _gpu_lib(name):
    if not prof.has_cuda():
        raise unittest.SkipTest("qk built without CUDA")
    try:
        mod = __import__(name)
    except ImportError:
        raise unittest.SkipTest("%s is not installed" % name)
    return mod


def test_gpu_cupy():
    cp = _gpu_lib("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise unittest.SkipTest("no GPU")
    except cp.cuda.runtime.CUDARuntimeError:
        raise unittest.SkipTest("no GPU")
    fresh()
    s = cp.cuda.Stream(non_blocking=True)
    prof.stream_name(s, "cupy stream")
    x = prof.track("x", cp.zeros((1 << 20,), dtype=cp.float32))
    with s:
        for i in range(20):
            prof.step(i)
            with prof.gpu_zone("axpy", s):
                x += 1.0
    prof.step_end()
    s.synchronize()
    st = prof.zone_stats("axpy", gpu=True)
    assert st["calls"] == 20 and st["total_ns"] > 0
    assert prof.stream_stats(s)["zones"] == 20
    assert prof.summary()["device_current"] == x.nbytes
    assert prof.step_stats("axpy", gpu=True)["steps"] == 19


def test_gpu_torch():
    torch = _gpu_lib("torch")
    if not torch.cuda.is_available():
        raise unittest.SkipTest("no GPU")
    fresh()
    s = torch.cuda.Stream()
    x = prof.track("t", torch.zeros(1 << 20, device="cuda"))
    with torch.cuda.stream(s):
        for _ in range(10):
            with prof.gpu_zone("mul", s):
                x.mul_(1.0001)
    s.synchronize()
    assert prof.zone_stats("mul", gpu=True)["calls"] == 10
    assert prof.stream_stats(s)["zones"] == 10
    assert prof.summary()["device_current"] == 4 * (1 << 20)
