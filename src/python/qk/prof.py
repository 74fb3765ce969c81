"""qk.prof: qk_prof.h, the embeddable profiler, from Python (docs/profiler.md, "Python").

Zones as context managers and decorators, GPU zones on CuPy / PyTorch streams (by their raw
handles; only where the package was built with CUDA), memory tracking of arrays by name, step
markers, counters, and the same reports (text, JSON, Chrome trace, HTML), written by the same C
code as a C program's::

    import qk.prof as prof

    for i in range(n_steps):
        prof.step(i)
        with prof.zone("scatter"):
            scatter(psi)
        with prof.gpu_zone("stream", stream):      # a cupy.cuda.Stream, a torch.cuda.Stream, or a handle
            stream_kernel(psi)
    prof.step_end()
    prof.report("-"); prof.write_html("report.html")

Names are interned: a zone name costs a dictionary lookup per use. The profiler is one per
process (the C library's global state); zones nest per thread.

The CUPTI activity mode (``init(cupti=1)``; where the package was built with CUDA) records every
kernel, copy, memset and host wait on every stream, CuPy's, PyTorch's and the libraries' kernels
included, each attributed to the innermost CPU zone open on the thread that launched it, so a
step loop needs no GPU zone around each kernel::

    prof.init(cupti=1)                             # before the GPU work to be recorded
    for i in range(n_steps):
        with prof.zone("step"):                    # its kernels are "launched in" step
            y = torch.relu(x @ w)
    torch.cuda.synchronize()                       # what still runs is not counted
    prof.activity_summary()["kernels"]             # cupti_status() says why where it is off
    for a in prof.advice():                        # the rules' findings, as the reports give them
        print(a["rule"], a["where"], a["impact_ns"])
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, TypedDict

from . import _prof

__all__ = ["init", "shutdown", "zone", "func", "gpu_zone", "step", "step_end", "counter", "count", "track", "untrack",
           "thread_name", "stream_name", "gpu_collect", "report", "write_json", "write_trace", "write_html",
           "zone_stats", "step_stats", "stream_stats", "summary", "has_cuda", "stream_handle",
           "cupti_status", "activity_summary", "advice", "ActivitySummary", "Advice"]


class ActivitySummary(TypedDict):
    """What the CUPTI mode recorded (qk_prof_act_summary), from activity_summary()."""
    cupti: int          # 1 recording, 0 not asked, -1 asked but unavailable (status says why)
    status: str         # cupti_status(): "on: ...", "unavailable: <why>", "off ..."
    kernels: int        # kernels, copies, memsets, host waits (syncs), runtime calls (cupti=2):
    memcpys: int        # exact counts, also beyond the record store
    memsets: int
    syncs: int
    runtime: int
    kept: int           # records kept for the trace and the advice (at most cupti_records)
    dropped: int        # records not kept: the store was full
    dropped_cupti: int  # records CUPTI dropped (no buffer given)
    incomplete: int     # records without valid times


class Advice(TypedDict):
    """One item of advice (qk_prof_advice), from advice()."""
    rule: str           # the rule id: "pageable-copy", "sync-in-loop", "gpu-idle", "launch-bound",
                        # "serialized-copy", "memory-growth", "step-outliers", "step-drift", "thread-imbalance"
    where: str          # the zone, stream or memory the evidence points at
    evidence: str       # the numbers that made the rule fire
    fix: str            # what to do about it
    impact_ns: float    # the time at stake, an estimate (0: not a time); advice() is sorted by it

_CPU, _GPU, _COUNTER = 0, 1, 2
_sites: Dict[Tuple[str, int], int] = {}
_lock = threading.Lock()


def _site(name: str, kind: int) -> int:
    h = _sites.get((name, kind))
    if h is None:
        if not isinstance(name, str):
            raise TypeError("a zone name is a str, not %s" % type(name).__name__)
        with _lock:
            h = _sites.get((name, kind))
            if h is None:
                h = _prof.new_site(name, kind)
                _sites[(name, kind)] = h
    return h


def has_cuda() -> bool:
    """Whether this build of the package has GPU zones (built with the CUDA engine)."""
    return bool(_prof.HAS_CUDA)


def init(*, events_per_thread: int = 0, gpu_records_per_thread: int = 0, gpu_queue: int = 0, top_n: int = 0,
         preallocate: bool = False, step_warmup: int = 0, step_window: int = 0, cupti: int = 0,
         cupti_records: int = 0) -> None:
    """Configure the profiler before the first zone (qk_prof_desc; 0 = the default). step_warmup:
    steps left out of the step statistics (default 1, -1: none); step_window: steps kept per zone.

    cupti: the CUPTI activity mode, started here: 1 records every kernel, copy, memset and host
    wait (each with the CPU zone it was launched in), 2 also every CUDA runtime call, 0 as the
    environment variable QK_PROF_CUPTI says (unset: off). It never fails: where CUPTI cannot record
    (a build without CUDA, no libcupti, another tool holding CUPTI) cupti_status() says why.
    cupti_records: activity records kept for the trace and the advice (default 262144); the
    counts stay exact beyond it. Raises ValueError for a cupti other than 0, 1, 2 or a negative
    size, RuntimeError once zones were recorded (shutdown() first)."""
    if cupti not in (0, 1, 2):
        raise ValueError("qk.prof.init: cupti must be 0 (as QK_PROF_CUPTI says), 1 (kernels, copies, memsets, "
                         "host waits) or 2 (also runtime calls), not %r" % (cupti,))
    if cupti_records < 0:
        raise ValueError("qk.prof.init: cupti_records must be >= 0 (0: the default), not %r" % (cupti_records,))
    _prof.init(events_per_thread=events_per_thread, gpu_records_per_thread=gpu_records_per_thread,
               gpu_queue=gpu_queue, top_n=top_n, preallocate=int(bool(preallocate)), step_warmup=step_warmup,
               step_window=step_window, cupti=int(cupti), cupti_records=int(cupti_records))


def shutdown() -> None:
    """Free everything recorded; init may follow. No other thread may be recording."""
    _prof.shutdown()


class zone:
    """A CPU zone: ``with zone("name"):`` or, as a decorator, ``@zone("name")``."""
    __slots__ = ("_h",)

    def __init__(self, name: str):
        self._h = _site(name, _CPU)

    def __enter__(self) -> "zone":
        _prof.begin(self._h)
        return self

    def __exit__(self, *exc: Any) -> None:
        _prof.end(self._h)

    def __call__(self, fn: Callable) -> Callable:
        h = self._h

        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            _prof.begin(h)
            try:
                return fn(*a, **k)
            finally:
                _prof.end(h)
        return wrapper


def func(fn: Callable) -> Callable:
    """Decorator: a zone named after the function (its qualified name)."""
    return zone(getattr(fn, "__qualname__", getattr(fn, "__name__", "function")))(fn)


def stream_handle(stream: Any) -> int:
    """The raw cudaStream_t of a CuPy stream (.ptr), a PyTorch stream (.cuda_stream), an object
    with __cuda_stream__ (the CUDA stream protocol), an int handle, or None (the legacy default stream: 0)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        v = proto() if callable(proto) else proto
        return int(v[1] if isinstance(v, tuple) else v)
    for attr in ("ptr", "cuda_stream", "handle"):
        v = getattr(stream, attr, None)
        if v is not None:
            return int(v)
    raise TypeError("not a CUDA stream: %r (a cupy.cuda.Stream, torch.cuda.Stream or an int handle)" % (stream,))


class gpu_zone:
    """A GPU zone on a CUDA stream, timed by CUDA events recorded on it (no synchronization):
    ``with gpu_zone("name", stream):``. Without CUDA in this build it is counted as ignored."""
    __slots__ = ("_h", "_s")

    def __init__(self, name: str, stream: Any = None):
        self._h = _site(name, _GPU)
        self._s = stream_handle(stream)

    def __enter__(self) -> "gpu_zone":
        _prof.gpu_begin(self._h, self._s)
        return self

    def __exit__(self, *exc: Any) -> None:
        _prof.gpu_end(self._h, self._s)

    def __call__(self, fn: Callable) -> Callable:
        h, s = self._h, self._s

        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            _prof.gpu_begin(h, s)
            try:
                return fn(*a, **k)
            finally:
                _prof.gpu_end(h, s)
        return wrapper


def step(index: int) -> None:
    """End the open step (if any) and begin step index (QK_PROF_STEP)."""
    _prof.step(int(index))


def step_end() -> None:
    """End the open step (QK_PROF_STEP_END): after the loop, so its last step counts."""
    _prof.step_end()


def counter(name: str, value: float) -> None:
    """Set a named series (QK_PROF_COUNTER)."""
    _prof.counter(_site(name, _COUNTER), float(value), False)


def count(name: str, delta: float = 1) -> None:
    """Add to a named running sum (QK_PROF_COUNT)."""
    _prof.counter(_site(name, _COUNTER), float(delta), True)


def _array_info(a: Any) -> Tuple[int, int, Optional[str], Optional[tuple]]:
    """(pointer, bytes, dtype, shape) of a NumPy / CuPy / PyTorch array or anything with the
    array interfaces; bytes is the array's size (elements x item size)."""
    shape = tuple(int(x) for x in getattr(a, "shape", ())) if hasattr(a, "shape") else None
    dtype = str(getattr(a, "dtype", "")) or None
    if dtype and dtype.startswith("torch."):
        dtype = dtype[6:]
    if hasattr(a, "data_ptr") and callable(a.data_ptr):                     # torch.Tensor
        return int(a.data_ptr()), int(a.element_size() * a.nelement()), dtype, shape
    cai = getattr(a, "__cuda_array_interface__", None)                      # cupy, numba, ...
    ai = cai if cai is not None else getattr(a, "__array_interface__", None)  # numpy
    if ai is not None:
        nbytes = getattr(a, "nbytes", None)
        if nbytes is None:
            import numpy as np
            nbytes = int(np.prod(ai["shape"])) * np.dtype(ai["typestr"]).itemsize
        return int(ai["data"][0]), int(nbytes), dtype, shape
    mv = memoryview(a)
    import ctypes
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mv)) if not mv.readonly else 0
    return ptr, mv.nbytes, mv.format, tuple(mv.shape)


def track(name: str, array: Any, nbytes: Optional[int] = None) -> Any:
    """Track an array's memory under name (QK_PROF_TRACK_SHAPE): its bytes, dtype and shape;
    host, pinned or device memory as CUDA says (where built with CUDA). Returns the array.
    nbytes overrides the size (e.g. a pool allocation's real size)."""
    ptr, size, dtype, shape = _array_info(array)
    if not ptr:
        raise ValueError("qk.prof.track: the array has no data pointer (empty or read-only buffer)")
    _prof.track(name, ptr, int(size if nbytes is None else nbytes), dtype, shape)
    return array


def untrack(array: Any) -> None:
    """Stop tracking an array (by its data pointer; an int pointer works too)."""
    _prof.untrack(array if isinstance(array, int) else _array_info(array)[0])


def thread_name(name: str) -> None:
    _prof.thread_name(name)


def stream_name(stream: Any, name: str) -> None:
    _prof.stream_name(stream_handle(stream), name)


def gpu_collect(wait: bool = False) -> None:
    """Resolve finished GPU zones now (wait=True: wait for all of them)."""
    _prof.gpu_collect(wait)


def report(path: str = "-") -> None:
    """The text report to path ("-": standard output). Raises OSError on failure."""
    _prof.write(1, path)


def write_json(path: str) -> None:
    _prof.write(2, path)


def write_trace(path: str) -> None:
    """Chrome / Perfetto trace-event JSON."""
    _prof.write(3, path)


def write_html(path: str) -> None:
    """A self-contained HTML report."""
    _prof.write(4, path)


def zone_stats(name: str, gpu: bool = False) -> Optional[dict]:
    """calls, total_ns, mean_ns, min_ns, max_ns, std_ns, self_ns of a zone; None if none recorded."""
    return _prof.zone_stats(name, bool(gpu))


def step_stats(name: Optional[str] = None, gpu: bool = False) -> Optional[dict]:
    """Per-step statistics of a zone (name None: the step time): steps, mean_ns, p50_ns, p95_ns,
    p99_ns, trend_ns (slope per step), trend_rel, ...; None without steps."""
    return _prof.step_stats(name, bool(gpu))


def stream_stats(stream: Any) -> Optional[dict]:
    """zones, busy_ns, wall_ns of a GPU stream; None if not seen."""
    return _prof.stream_stats(stream_handle(stream))


def summary() -> dict:
    return _prof.summary()


def cupti_status() -> str:
    """The CUPTI mode's state in words (qk_prof_cupti_status): "on: kernels, copies, ...",
    "unavailable: <why>" (e.g. "the implementation was compiled without QK_PROF_CUDA" in a build
    without CUDA, libcupti not found, another tool holding CUPTI) or "off (...)" (not asked)."""
    return _prof.cupti_status()


def activity_summary() -> ActivitySummary:
    """The CUPTI mode's counts (qk_prof_activity_summary) with its state: cupti (1 recording, 0
    not asked, -1 asked but unavailable), status (cupti_status()), kernels, memcpys, memsets,
    syncs, runtime, kept, dropped, dropped_cupti, incomplete. CUPTI's completed buffers are
    taken in first, so everything that finished on the GPU by now counts: synchronize (e.g.
    torch.cuda.synchronize()) before reading it for exact counts."""
    return _prof.activity_summary()  # type: ignore[return-value]


def advice() -> List[Advice]:
    """The advice of this run so far, as every report gives it (qk_prof_get_advice; thresholds
    from the environment variable QK_PROF_ADVICE): a list of dicts with rule (the rule's id),
    where, evidence, fix and impact_ns (the time at stake), largest impact first; empty when no
    rule fires. Rules: docs/profiler.md, "Advice"."""
    return _prof.advice()  # type: ignore[return-value]
