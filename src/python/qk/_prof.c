/* qk._prof: qk_prof.h (the profiler) for Python; the API is qk.prof (prof.py). The profiler's
   implementation lives here, built with QK_PROF_CUDA where the package has the CUDA engine, so
   GPU zones time work on any CUDA stream by its raw handle (CuPy's Stream.ptr, PyTorch's
   Stream.cuda_stream). Zone names are interned: a site per (name, kind), kept for the module's
   life (the profiler keeps pointers to them). Every call below runs with the GIL held, which
   also guards the site table; only the report writers release it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define QK_PROF_ENABLE
#define QK_PROF_IMPLEMENTATION
#include "qk_prof.h"

#include <stdlib.h>
#include <string.h>

static qk_prof_site **qkpp_sites;
static Py_ssize_t qkpp_n_sites, qkpp_cap_sites;

static PyObject *qkpp_err(void)
{
    PyErr_SetString(PyExc_RuntimeError, qk_prof_last_error());
    return NULL;
}

static qk_prof_site *qkpp_site(PyObject *h)
{
    Py_ssize_t i = PyLong_AsSsize_t(h);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= qkpp_n_sites) { PyErr_SetString(PyExc_ValueError, "qk._prof: bad site handle"); return NULL; }
    return qkpp_sites[i];
}

static void *qkpp_ptr(PyObject *o)
{
    if (o == Py_None) return NULL;
    return PyLong_AsVoidPtr(o);
}

static PyObject *qkpp_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = { "events_per_thread", "gpu_records_per_thread", "gpu_queue", "top_n", "preallocate",
                           "step_warmup", "step_window", "cupti", "cupti_records", NULL };
    qk_prof_desc d;
    Py_ssize_t ev = 0, gr = 0, cr = 0;
    (void)self;
    memset(&d, 0, sizeof d);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|nniiiiiin", kws, &ev, &gr, &d.gpu_queue, &d.top_n, &d.preallocate,
                                     &d.step_warmup, &d.step_window, &d.cupti, &cr))
        return NULL;
    if (ev < 0 || gr < 0 || cr < 0) { PyErr_SetString(PyExc_ValueError, "sizes must be >= 0"); return NULL; }
    if (d.cupti < 0 || d.cupti > 2) {
        PyErr_SetString(PyExc_ValueError, "cupti must be 0 (as QK_PROF_CUPTI says), 1 (kernels, copies, memsets, "
                        "syncs) or 2 (also runtime calls)");
        return NULL;
    }
    d.events_per_thread = (size_t)ev;
    d.gpu_records_per_thread = (size_t)gr;
    d.cupti_records = (size_t)cr;
    if (qk_prof_init(&d) != 0) return qkpp_err();
    Py_RETURN_NONE;
}

static PyObject *qkpp_shutdown(PyObject *self, PyObject *noargs)
{
    (void)self; (void)noargs;
    qk_prof_shutdown();
    Py_RETURN_NONE;
}

/* site(name, kind) -> handle: a new site each call (qk.prof interns them per name and kind). */
static PyObject *qkpp_new_site(PyObject *self, PyObject *args)
{
    const char *name;
    int kind;
    qk_prof_site *s;
    char *copy;
    (void)self;
    if (!PyArg_ParseTuple(args, "si", &name, &kind)) return NULL;
    if (kind < QK_PROF_SITE_CPU || kind > QK_PROF_SITE_COUNTER) { PyErr_SetString(PyExc_ValueError, "bad kind"); return NULL; }
    if (qkpp_n_sites == qkpp_cap_sites) {
        Py_ssize_t nc = qkpp_cap_sites ? 2 * qkpp_cap_sites : 64;
        void *np = realloc(qkpp_sites, (size_t)nc * sizeof *qkpp_sites);
        if (!np) return PyErr_NoMemory();
        qkpp_sites = (qk_prof_site **)np;
        qkpp_cap_sites = nc;
    }
    s = (qk_prof_site *)calloc(1, sizeof *s);
    copy = (char *)malloc(strlen(name) + 1);
    if (!s || !copy) { free(s); free(copy); return PyErr_NoMemory(); }
    strcpy(copy, name);
    s->name = copy;
    s->file = "<python>";
    s->kind = kind;
    qkpp_sites[qkpp_n_sites] = s;
    return PyLong_FromSsize_t(qkpp_n_sites++);
}

/* begin(handle) / end(handle): a zone of the site opened or closed on this thread */
static PyObject *qkpp_zone(PyObject *h, int end)
{
    qk_prof_site *s = qkpp_site(h);
    if (!s) return NULL;
    if (end) qk_prof_end(s->name);
    else qk_prof_begin(s);
    Py_RETURN_NONE;
}

static PyObject *qkpp_begin(PyObject *self, PyObject *h) { (void)self; return qkpp_zone(h, 0); }
static PyObject *qkpp_end(PyObject *self, PyObject *h) { (void)self; return qkpp_zone(h, 1); }

/* gpu_begin(handle, stream) / gpu_end(handle, stream): the same on a CUDA stream (its raw handle) */
static PyObject *qkpp_gpu_zone(PyObject *args, int end)
{
    PyObject *h, *st;
    qk_prof_site *s;
    void *stream;
    if (!PyArg_ParseTuple(args, "OO", &h, &st) || !(s = qkpp_site(h))) return NULL;
    stream = qkpp_ptr(st);
    if (PyErr_Occurred()) return NULL;
    if (end) qk_prof_gpu_end(s->name, stream);
    else qk_prof_gpu_begin(s, stream);
    Py_RETURN_NONE;
}

static PyObject *qkpp_gpu_begin(PyObject *self, PyObject *args) { (void)self; return qkpp_gpu_zone(args, 0); }
static PyObject *qkpp_gpu_end(PyObject *self, PyObject *args) { (void)self; return qkpp_gpu_zone(args, 1); }

static PyObject *qkpp_counter(PyObject *self, PyObject *args)
{
    PyObject *h;
    double v;
    int add;
    qk_prof_site *s;
    (void)self;
    if (!PyArg_ParseTuple(args, "Odp", &h, &v, &add) || !(s = qkpp_site(h))) return NULL;
    qk_prof_counter(s, v, add);
    Py_RETURN_NONE;
}

static PyObject *qkpp_step(PyObject *self, PyObject *args)
{
    long long i;
    (void)self;
    if (!PyArg_ParseTuple(args, "L", &i)) return NULL;
    qk_prof_step((int64_t)i);
    Py_RETURN_NONE;
}

static PyObject *qkpp_step_end(PyObject *self, PyObject *noargs)
{
    (void)self; (void)noargs;
    qk_prof_step_end();
    Py_RETURN_NONE;
}

static PyObject *qkpp_thread_name(PyObject *self, PyObject *args)
{
    const char *n;
    (void)self;
    if (!PyArg_ParseTuple(args, "s", &n)) return NULL;
    qk_prof_thread_name(n);
    Py_RETURN_NONE;
}

static PyObject *qkpp_stream_name(PyObject *self, PyObject *args)
{
    PyObject *st;
    const char *n;
    void *stream;
    (void)self;
    if (!PyArg_ParseTuple(args, "Os", &st, &n)) return NULL;
    stream = qkpp_ptr(st);
    if (PyErr_Occurred()) return NULL;
    qk_prof_stream_name(stream, n);
    Py_RETURN_NONE;
}

static PyObject *qkpp_gpu_collect(PyObject *self, PyObject *args)
{
    int wait = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "|p", &wait)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    qk_prof_gpu_collect(wait);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* track(name, ptr, nbytes, dtype, shape) */
static PyObject *qkpp_track(PyObject *self, PyObject *args)
{
    const char *name, *dtype = NULL;
    PyObject *p, *shape = Py_None;
    Py_ssize_t nbytes, i, nd = 0;
    int64_t dims[16];
    void *ptr;
    (void)self;
    if (!PyArg_ParseTuple(args, "sOn|zO", &name, &p, &nbytes, &dtype, &shape)) return NULL;
    ptr = qkpp_ptr(p);
    if (PyErr_Occurred()) return NULL;
    if (nbytes < 0) { PyErr_SetString(PyExc_ValueError, "nbytes must be >= 0"); return NULL; }
    if (shape != Py_None) {
        PyObject *t = PySequence_Fast(shape, "shape must be a sequence of ints");
        if (!t) return NULL;
        nd = PySequence_Fast_GET_SIZE(t);
        if (nd > 16) nd = 16;
        for (i = 0; i < nd; i++) {
            dims[i] = (int64_t)PyLong_AsLongLong(PySequence_Fast_GET_ITEM(t, i));
            if (dims[i] == -1 && PyErr_Occurred()) { Py_DECREF(t); return NULL; }
        }
        Py_DECREF(t);
    }
    qk_prof_track(name, ptr, (size_t)nbytes, dtype, (int)nd, nd ? dims : NULL);
    Py_RETURN_NONE;
}

static PyObject *qkpp_untrack(PyObject *self, PyObject *p)
{
    void *ptr = qkpp_ptr(p);
    (void)self;
    if (PyErr_Occurred()) return NULL;
    qk_prof_untrack(ptr);
    Py_RETURN_NONE;
}

/* write(fmt, path): 1 text, 2 JSON, 3 trace, 4 HTML; "-" is standard output */
static PyObject *qkpp_write(PyObject *self, PyObject *args)
{
    int fmt, rc;
    PyObject *po;
    const char *path;
    (void)self;
    if (!PyArg_ParseTuple(args, "iO&", &fmt, PyUnicode_FSConverter, &po)) return NULL;
    path = PyBytes_AS_STRING(po);
    if (fmt < QK_PROF_TEXT || fmt > QK_PROF_HTML) { Py_DECREF(po); PyErr_SetString(PyExc_ValueError, "bad format"); return NULL; }
    Py_BEGIN_ALLOW_THREADS
    rc = qk_prof_write_file((qk_prof_format)fmt, path);
    Py_END_ALLOW_THREADS
    Py_DECREF(po);
    if (rc != 0) {
        PyErr_SetString(PyExc_OSError, qk_prof_last_error());
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *qkpp_zone_stats(PyObject *self, PyObject *args)
{
    const char *name;
    int gpu = 0, rc;
    qk_prof_stats s;
    (void)self;
    if (!PyArg_ParseTuple(args, "s|p", &name, &gpu)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = qk_prof_zone_stats(name, gpu, &s);
    Py_END_ALLOW_THREADS
    if (rc != 0) Py_RETURN_NONE;
    return Py_BuildValue("{s:K,s:d,s:d,s:d,s:d,s:d,s:d}", "calls", (unsigned long long)s.calls, "total_ns", s.total_ns,
                         "mean_ns", s.mean_ns, "min_ns", s.min_ns, "max_ns", s.max_ns, "std_ns", s.std_ns,
                         "self_ns", s.self_ns);
}

static PyObject *qkpp_step_stats(PyObject *self, PyObject *args)
{
    const char *name = NULL;
    int gpu = 0, rc;
    qk_prof_step_stats s;
    (void)self;
    if (!PyArg_ParseTuple(args, "|zp", &name, &gpu)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = qk_prof_zone_step_stats(name, gpu, &s);
    Py_END_ALLOW_THREADS
    if (rc != 0) Py_RETURN_NONE;
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:d,s:d,s:d,s:d,s:d,s:d,s:d,s:d}", "steps", (long long)s.steps,
                         "marked", (long long)s.marked, "first", (long long)s.first, "last", (long long)s.last,
                         "mean_ns", s.mean_ns, "min_ns", s.min_ns, "max_ns", s.max_ns, "p50_ns", s.p50_ns,
                         "p95_ns", s.p95_ns, "p99_ns", s.p99_ns, "trend_ns", s.trend_ns, "trend_rel", s.trend_rel);
}

static PyObject *qkpp_summary(PyObject *self, PyObject *noargs)
{
    qk_prof_summary s;
    (void)self; (void)noargs;
    Py_BEGIN_ALLOW_THREADS
    qk_prof_get_summary(&s);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("{s:d,s:i,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:d,s:d,s:d,s:s}", "wall_ns", s.wall_ns,
                         "threads", s.threads, "streams", s.lanes, "events", (unsigned long long)s.events,
                         "dropped_events", (unsigned long long)s.dropped_events, "dropped_gpu", (unsigned long long)s.dropped_gpu,
                         "unbalanced", (unsigned long long)s.unbalanced, "mismatched", (unsigned long long)s.mismatched,
                         "gpu_ignored", (unsigned long long)s.gpu_ignored, "gpu_pending", (unsigned long long)s.gpu_pending,
                         "host_current", s.host_current, "host_peak", s.host_peak, "device_current", s.device_current,
                         "device_peak", s.device_peak, "clock", s.clock ? s.clock : "");
}

static PyObject *qkpp_stream_stats(PyObject *self, PyObject *st)
{
    uint64_t zones = 0;
    double busy = 0, wall = 0;
    void *stream = qkpp_ptr(st);
    int rc;
    (void)self;
    if (PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = qk_prof_stream_stats(stream, &zones, &busy, &wall);
    Py_END_ALLOW_THREADS
    if (rc != 0) Py_RETURN_NONE;
    return Py_BuildValue("{s:K,s:d,s:d}", "zones", (unsigned long long)zones, "busy_ns", busy, "wall_ns", wall);
}

/* d[key] = v (a new reference, consumed; NULL: the error already set). 0 or -1. */
static int qkpp_set(PyObject *d, const char *key, PyObject *v)
{
    int rc;
    if (!v) return -1;
    rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* The profiler's texts as str: UTF-8, a character cut by a fixed-size field replaced (U+FFFD). */
static PyObject *qkpp_str(const char *s)
{
    if (!s) s = "";
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static int qkpp_set_str(PyObject *d, const char *key, const char *s) { return qkpp_set(d, key, qkpp_str(s)); }

static int qkpp_set_u64(PyObject *d, const char *key, uint64_t v)
{
    return qkpp_set(d, key, PyLong_FromUnsignedLongLong((unsigned long long)v));
}

/* cupti_status() -> str: "on: ...", "unavailable: <why>" or "off ..." (qk_prof_cupti_status) */
static PyObject *qkpp_cupti_status(PyObject *self, PyObject *noargs)
{
    (void)self; (void)noargs;
    return qkpp_str(qk_prof_cupti_status());
}

/* activity_summary() -> dict: qk_prof_act_summary, after handing CUPTI's completed buffers to the
   store (as a report does; qk__prof_cupti_flush is this file's, being the implementation's TU),
   so the counts include every activity finished by now. */
static PyObject *qkpp_activity_summary(PyObject *self, PyObject *noargs)
{
    qk_prof_act_summary s;
    PyObject *d;
    (void)self; (void)noargs;
    Py_BEGIN_ALLOW_THREADS
    qk__prof_cupti_flush();
    qk_prof_activity_summary(&s);
    Py_END_ALLOW_THREADS
    if (!(d = PyDict_New())) return NULL;
    if (qkpp_set(d, "cupti", PyLong_FromLong(s.cupti)) || qkpp_set_str(d, "status", qk_prof_cupti_status()) ||
        qkpp_set_u64(d, "kernels", s.kernels) || qkpp_set_u64(d, "memcpys", s.memcpys) ||
        qkpp_set_u64(d, "memsets", s.memsets) || qkpp_set_u64(d, "syncs", s.syncs) ||
        qkpp_set_u64(d, "runtime", s.runtime) || qkpp_set_u64(d, "kept", s.kept) ||
        qkpp_set_u64(d, "dropped", s.dropped) || qkpp_set_u64(d, "dropped_cupti", s.dropped_cupti) ||
        qkpp_set_u64(d, "incomplete", s.incomplete)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* activity_add(kind, start_ns, end_ns, name=None, zone=None, stream=0, bytes=0, dir=0, src_kind=0,
   dst_kind=0, sync=0): qk_prof_activity_add, a record on the profiler's timeline (ns from its
   start; kind a qk_prof_act_kind). Not in qk.prof's API: the tests feed the tables and the
   rules with it where no GPU is. */
static PyObject *qkpp_activity_add(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kws[] = { "kind", "start_ns", "end_ns", "name", "zone", "stream", "bytes", "dir", "src_kind", "dst_kind",
                           "sync", NULL };
    qk_prof_activity a;
    unsigned int stream = 0;
    unsigned long long bytes = 0;
    (void)self;
    memset(&a, 0, sizeof a);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "idd|zzIKiiii", kws, &a.kind, &a.start_ns, &a.end_ns, &a.name, &a.zone,
                                     &stream, &bytes, &a.dir, &a.src_kind, &a.dst_kind, &a.sync))
        return NULL;
    a.stream = stream;
    a.bytes = bytes;
    if (qk_prof_activity_add(&a) != 0) {
        PyErr_SetString(PyExc_ValueError, qk_prof_last_error());
        return NULL;
    }
    Py_RETURN_NONE;
}

/* advice() -> [dict]: qk_prof_get_advice, every item (rule, where, evidence, fix, impact_ns), in
   the reports' order (the time at stake, largest first). */
static PyObject *qkpp_advice(PyObject *self, PyObject *noargs)
{
    qk_prof_advice *items = NULL;
    int n = 0, cap = 32, i;
    PyObject *list;
    (void)self; (void)noargs;
    for (;;) {
        qk_prof_advice *np = (qk_prof_advice *)realloc(items, (size_t)cap * sizeof *items);
        if (!np) { free(items); return PyErr_NoMemory(); }
        items = np;
        Py_BEGIN_ALLOW_THREADS
        n = qk_prof_get_advice(items, cap);
        Py_END_ALLOW_THREADS
        if (n <= cap) break;
        cap = n; /* more than fit: again with room for all (a later run may find more still) */
    }
    if (n < 0) { free(items); return qkpp_err(); }
    if (!(list = PyList_New(n))) { free(items); return NULL; }
    for (i = 0; i < n; i++) {
        const qk_prof_advice *a = &items[i];
        PyObject *o = PyDict_New();
        if (!o || qkpp_set_str(o, "rule", a->rule) || qkpp_set_str(o, "where", a->where) ||
            qkpp_set_str(o, "evidence", a->evidence) || qkpp_set_str(o, "fix", a->fix) ||
            qkpp_set(o, "impact_ns", PyFloat_FromDouble(a->impact_ns))) {
            Py_XDECREF(o);
            Py_DECREF(list);
            free(items);
            return NULL;
        }
        PyList_SET_ITEM(list, i, o);
    }
    free(items);
    return list;
}

static PyMethodDef qkpp_methods[] = {
    {"init", (PyCFunction)(void (*)(void))qkpp_init, METH_VARARGS | METH_KEYWORDS, "qk_prof_init"},
    {"shutdown", qkpp_shutdown, METH_NOARGS, "qk_prof_shutdown"},
    {"new_site", qkpp_new_site, METH_VARARGS, "new_site(name, kind) -> handle"},
    {"begin", qkpp_begin, METH_O, "begin(handle): a CPU zone"},
    {"end", qkpp_end, METH_O, "end(handle)"},
    {"gpu_begin", qkpp_gpu_begin, METH_VARARGS, "gpu_begin(handle, stream_ptr): a GPU zone"},
    {"gpu_end", qkpp_gpu_end, METH_VARARGS, "gpu_end(handle, stream_ptr)"},
    {"counter", qkpp_counter, METH_VARARGS, "counter(handle, value, add)"},
    {"step", qkpp_step, METH_VARARGS, "step(index)"},
    {"step_end", qkpp_step_end, METH_NOARGS, "step_end()"},
    {"thread_name", qkpp_thread_name, METH_VARARGS, "thread_name(name)"},
    {"stream_name", qkpp_stream_name, METH_VARARGS, "stream_name(stream_ptr, name)"},
    {"gpu_collect", qkpp_gpu_collect, METH_VARARGS, "gpu_collect(wait=False)"},
    {"track", qkpp_track, METH_VARARGS, "track(name, ptr, nbytes, dtype=None, shape=None)"},
    {"untrack", qkpp_untrack, METH_O, "untrack(ptr)"},
    {"write", qkpp_write, METH_VARARGS, "write(fmt, path)"},
    {"zone_stats", qkpp_zone_stats, METH_VARARGS, "zone_stats(name, gpu=False) -> dict or None"},
    {"step_stats", qkpp_step_stats, METH_VARARGS, "step_stats(name=None, gpu=False) -> dict or None"},
    {"summary", qkpp_summary, METH_NOARGS, "summary() -> dict"},
    {"stream_stats", qkpp_stream_stats, METH_O, "stream_stats(stream_ptr) -> dict or None"},
    {"cupti_status", qkpp_cupti_status, METH_NOARGS, "cupti_status() -> str"},
    {"activity_summary", qkpp_activity_summary, METH_NOARGS, "activity_summary() -> dict"},
    {"advice", qkpp_advice, METH_NOARGS, "advice() -> list of dicts"},
    {"activity_add", (PyCFunction)(void (*)(void))qkpp_activity_add, METH_VARARGS | METH_KEYWORDS,
     "activity_add(kind, start_ns, end_ns, name=None, zone=None, stream=0, bytes=0, dir=0, src_kind=0, dst_kind=0, "
     "sync=0): qk_prof_activity_add (tests)"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef qkpp_module = {
    PyModuleDef_HEAD_INIT, "_prof", "qk_prof.h for Python; use qk.prof", -1, qkpp_methods, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__prof(void)
{
    PyObject *m = PyModule_Create(&qkpp_module);
    if (!m) return NULL;
#ifdef QK_PROF_CUDA
    PyModule_AddIntConstant(m, "HAS_CUDA", 1);
#else
    PyModule_AddIntConstant(m, "HAS_CUDA", 0);
#endif
    return m;
}
