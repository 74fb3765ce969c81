"""qk.prof (qk_prof.h from Python) on the CPU: zones as context managers and decorators, nesting
and self time, zones of several threads, step markers and per-step statistics, counters, array
memory tracking by name, the four reports (parsed), errors; the CUPTI mode's calls (init's
cupti arguments, cupti_status, activity_summary against injected records, advice against the
reports); GPU zones on CuPy and PyTorch streams, and a step loop of CuPy / PyTorch kernels in
the CUPTI mode, only where the package has CUDA and a GPU and the library is installed (skipped
otherwise)."""
import json
import os
import re
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
    # self time: outer less the decorated zones nested in it (to 1e-4: each zone_stats call refines
    # the rdtsc calibration, so the two calls' ns differ by a few parts in a million)
    assert abs(outer["self_ns"] - (outer["total_ns"] - dec["total_ns"])) <= 1e-4 * outer["total_ns"]
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
            spin(0.001 + 0.003 * i)  # a planted upward drift, 3 ms a step: a stall of tens of ms on a busy host cannot turn it
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


# ---- the CUPTI mode and the advice ----

_ACT_KERNEL, _ACT_MEMCPY, _ACT_MEMSET, _ACT_SYNC = 1, 2, 3, 4  # qk_prof_act_kind


def _reports():
    """(text, JSON, trace) of the run so far, parsed."""
    with tempfile.TemporaryDirectory() as d:
        paths = [os.path.join(d, n) for n in ("r.txt", "r.json", "t.json")]
        prof.report(paths[0])
        prof.write_json(paths[1])
        prof.write_trace(paths[2])
        return open(paths[0]).read(), json.load(open(paths[1])), json.load(open(paths[2]))


def _kernels_by_zone(rep, trace):
    """Kernel launches per zone, from the JSON's kernel table (calls of the names whose launches all
    came from one zone; None for names from several) and from the trace's CUPTI kernel events."""
    table = {}
    for k in rep["activities"]["kernel_names"]:
        z = k["zone"] if k["zones"] == 1 else None
        table[z] = table.get(z, 0) + k["calls"]
    events = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "cupti" and e["ph"] == "X" and "grid" in e["args"]:
            events[e["args"]["zone"]] = events.get(e["args"]["zone"], 0) + 1
    return table, events


class _env:
    """QK_PROF_CUPTI set (or unset: None) for a block, restored after."""

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.old = os.environ.pop("QK_PROF_CUPTI", None)
        if self.value is not None:
            os.environ["QK_PROF_CUPTI"] = self.value

    def __exit__(self, *exc):
        os.environ.pop("QK_PROF_CUPTI", None)
        if self.old is not None:
            os.environ["QK_PROF_CUPTI"] = self.old


def test_cupti_init_arguments():
    prof.shutdown()
    for bad in (3, -1, 1.5, "1", None):
        try:
            prof.init(cupti=bad)
        except ValueError as e:
            assert "cupti" in str(e)
        else:
            raise AssertionError("init(cupti=%r) must raise ValueError" % (bad,))
    try:
        prof.init(cupti=1, cupti_records=-1)
    except ValueError as e:
        assert "cupti_records" in str(e)
    else:
        raise AssertionError("a negative cupti_records must raise ValueError")
    for kw in ({"cupti": 7}, {"cupti_records": -3}):  # the extension checks too
        try:
            prof._prof.init(**kw)
        except ValueError:
            pass
        else:
            raise AssertionError("_prof.init(%r) must raise ValueError" % (kw,))
    # nothing was started by the refused calls; the old arguments still work beside the new
    with _env(None):
        fresh(step_warmup=2, step_window=64, top_n=3, cupti=0, cupti_records=16)
        assert prof.activity_summary()["cupti"] == 0 and prof.cupti_status().startswith("off")
        for i in range(5):
            prof.step(i)
            with prof.zone("z"):
                pass
        prof.step_end()
        assert prof.step_stats()["steps"] == 3  # step_warmup=2 of 5
        # cupti_records bounds the records kept; the counts stay exact beyond it
        for k in range(20):
            prof._prof.activity_add(_ACT_KERNEL, 1000.0 + 10 * k, 1005.0 + 10 * k, name="k", stream=1)
        a = prof.activity_summary()
        assert a["kernels"] == 20 and a["kept"] == 16 and a["dropped"] == 4


def test_cupti_without_cuda():
    if prof.has_cuda():
        raise unittest.SkipTest("this build has CUDA (test_gpu_cupti_* cover it)")
    for mode, env in ((1, None), (2, None), (0, "1")):  # desc.cupti, or QK_PROF_CUPTI with cupti=0
        with _env(env):
            fresh(cupti=mode)  # asking never fails ...
            st = prof.cupti_status()
            assert st.startswith("unavailable:") and "QK_PROF_CUDA" in st, st  # ... the status says why
            with prof.zone("step"):
                spin(0.0002)
            a = prof.activity_summary()
            assert a["cupti"] == -1 and a["status"] == st and a["kernels"] == 0
            assert prof.zone_stats("step")["calls"] == 1
            txt, rep, _ = _reports()
            assert rep["activities"]["cupti"] == "unavailable" and rep["activities"]["status"] == st
            assert "(CUPTI " + st + ")" in txt
    with _env(None):
        fresh()
        assert prof.activity_summary()["cupti"] == 0 and prof.cupti_status().startswith("off")


def test_activity_summary():
    fresh()
    a = prof.activity_summary()
    assert set(a) == set(prof.ActivitySummary.__annotations__)
    assert isinstance(a["cupti"], int) and isinstance(a["status"], str)
    assert all(type(a[k]) is int and a[k] == 0 for k in a if k not in ("cupti", "status"))
    # injected records (as another tracer would add them): each count in its own field
    t = 1e6
    plan = [(_ACT_KERNEL, 3, {"name": "axpy", "zone": "step"}), (_ACT_MEMCPY, 5, {"bytes": 4096, "dir": 1}),
            (_ACT_MEMSET, 2, {"bytes": 64}), (_ACT_SYNC, 7, {"sync": 3})]
    for kind, n, kw in plan:
        for _ in range(n):
            prof._prof.activity_add(kind, t, t + 500.0, stream=3, **kw)
            t += 1000.0
    a = prof.activity_summary()
    assert (a["kernels"], a["memcpys"], a["memsets"], a["syncs"]) == (3, 5, 2, 7)
    assert a["kept"] == 17 and a["dropped"] == 0 and a["runtime"] == 0 and a["incomplete"] == 0
    _, rep, trace = _reports()
    act = rep["activities"]
    assert all(act[k] == a[k] for k in ("kernels", "memcpys", "memsets", "syncs", "kept", "dropped", "dropped_cupti",
                                        "incomplete", "runtime"))
    assert _kernels_by_zone(rep, trace) == ({"step": 3}, {"step": 3})  # the GPU tests' attribution check
    try:
        prof._prof.activity_add(_ACT_KERNEL, 10.0, 5.0)
    except ValueError:
        pass
    else:
        raise AssertionError("an activity that ends before it starts must raise")


_NUM = re.compile(r"\d+(?:\.(\d+))?")


def _same_text(a, b):
    """Texts equal but for the last printed digit of a number (the rdtsc calibration is refined at
    each report, so a time read later may round the other way)."""
    assert _NUM.sub("#", a) == _NUM.sub("#", b), (a, b)
    for x, y in zip(_NUM.finditer(a), _NUM.finditer(b)):
        unit = 10.0 ** -len(x.group(1) or "")
        assert abs(float(x.group(0)) - float(y.group(0))) <= unit * 1.01, (a, b)


def _advice_json_equal(adv, rep):
    """advice() against the JSON report's advice: the same items in the same order, every field (the
    times to 1e-4 and the last digit, see _same_text)."""
    js = rep["advice"]
    assert [x["rule"] for x in js] == [x["rule"] for x in adv]
    for a, j in zip(adv, js):
        for k in ("where", "evidence", "fix"):
            _same_text(a[k], j[k])
        assert abs(a["impact_ns"] - j["impact_ns"]) <= 1e-4 * abs(j["impact_ns"])


def _rules(adv):
    return [x["rule"] for x in adv]


class _advice_env:
    """QK_PROF_ADVICE set for a block (advice() and the reports read it at each call)."""

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.old = os.environ.get("QK_PROF_ADVICE")
        os.environ["QK_PROF_ADVICE"] = self.value

    def __exit__(self, *exc):
        if self.old is None:
            del os.environ["QK_PROF_ADVICE"]
        else:
            os.environ["QK_PROF_ADVICE"] = self.old


def test_advice():
    # a loop of 30 steps, one (step 12) 25 times as long as the others: step-outliers (p99 / p50 >= 2)
    fresh()
    for i in range(30):
        with prof.zone("step"):
            spin(0.05 if i == 12 else 0.002)
    adv = prof.advice()
    assert isinstance(adv, list)
    out = [x for x in adv if x["rule"] == "step-outliers"]
    assert len(out) == 1, adv
    x = out[0]
    assert set(x) == set(prof.Advice.__annotations__)
    assert all(isinstance(x[k], str) and x[k] for k in ("rule", "where", "evidence", "fix"))
    assert isinstance(x["impact_ns"], float)
    assert '"step"' in x["where"] and x["where"].endswith("the slowest step 12"), x["where"]
    slow = re.search(r"\(steps ([^)]*)\)", x["evidence"])  # the slow steps' indices (a preempted step may join)
    assert slow and "12" in slow.group(1).split(", "), x["evidence"]
    assert 40e6 < x["impact_ns"] < 300e6  # about the 48 ms beyond the typical step
    assert [a["impact_ns"] for a in adv] == sorted((a["impact_ns"] for a in adv), reverse=True)
    txt, rep, _ = _reports()
    line = txt[txt.index("[step-outliers] "):].splitlines()
    _same_text(line[0], "[step-outliers] " + x["where"] + line[0][len("[step-outliers] " + x["where"]):])
    _same_text(line[1].strip(), "evidence: " + x["evidence"])
    _advice_json_equal(adv, rep)  # every item, every field, as the JSON report has them
    # the same records under a threshold the plant does not reach (p99 / p50 is about 18, less
    # where a loaded machine stretches the typical step), or the rule off
    for env in ("tail_ratio=100", "tail_ratio=-1"):
        with _advice_env(env):
            assert "step-outliers" not in _rules(prof.advice())
            assert "[step-outliers]" not in _reports()[0]


def test_advice_injected_gpu_rule():
    # a GPU rule on the CPU: 200 kernels of 2 us, 3 us apart, in zone "step": launch-bound
    fresh()
    t = 1e6
    for k in range(200):
        prof._prof.activity_add(_ACT_KERNEL, t, t + 2000.0, name="tiny", zone="step", stream=5)
        t += 5000.0
    adv = prof.advice()
    rules = [x["rule"] for x in adv]
    assert "launch-bound" in rules, adv
    txt, rep, _ = _reports()
    assert "[launch-bound]" in txt
    _advice_json_equal(adv, rep)
    # kernels of 2 us are not short below 1 us; a negative threshold turns the rule off
    for env in ("short_kernel_ns=1000", "short_kernel_ns=-1"):
        with _advice_env(env):
            assert "launch-bound" not in _rules(prof.advice())


def _cupti_loop(launch, sync, steps=20, per_step=3):
    """A step loop in the CUPTI mode: per_step kernels a step in a CPU zone "step", no GPU zone;
    CUPTI must count every kernel, each launched in "step". The library's lazy work (module
    loading, compilation, allocation) was done before, so nothing else runs on the GPU."""
    with _env(None):
        fresh(cupti=1)
    st = prof.cupti_status()
    if st.startswith("unavailable:") and "not found" in st:
        raise unittest.SkipTest("libcupti: " + st)
    assert prof.activity_summary()["cupti"] == 1, st
    for i in range(steps):
        with prof.zone("step"):
            for _ in range(per_step):
                launch()
    sync()
    prof.gpu_collect(wait=True)
    n = steps * per_step
    a = prof.activity_summary()
    assert a["kernels"] == n and a["dropped"] == 0 and a["dropped_cupti"] == 0, a
    txt, rep, trace = _reports()
    assert rep["activities"]["kernels"] == n
    assert _kernels_by_zone(rep, trace) == ({"step": n}, {"step": n})  # every launch attributed to the zone
    assert "GPU kernels" in txt
    prof.shutdown()


def test_gpu_cupti_torch():
    torch = _gpu_lib("torch")
    if not torch.cuda.is_available():
        raise unittest.SkipTest("no GPU")
    x = torch.zeros(1 << 16, device="cuda")
    x.add_(1.0)
    torch.cuda.synchronize()
    _cupti_loop(lambda: x.add_(1.0), torch.cuda.synchronize)
    assert float(x[0]) == 61.0  # 1 + 20 steps x 3


def test_gpu_cupti_cupy():
    cp = _gpu_lib("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise unittest.SkipTest("no GPU")
    except cp.cuda.runtime.CUDARuntimeError:
        raise unittest.SkipTest("no GPU")
    x = cp.zeros((1 << 16,), dtype=cp.float32)

    def launch():
        x.__iadd__(1.0)

    launch()
    cp.cuda.Device().synchronize()
    _cupti_loop(launch, cp.cuda.Device().synchronize)
    assert float(x[0]) == 61.0
