/* _qk.c — the CPython extension of the qk package: a thin layer over qk.h.

   Everything qk does lives in qk.h (and the CUDA engine, qk_cuda.cu, where Meson built it); this
   file only converts between Python objects and qk's structs, so C, the CLI and Python agree.
   The pure-Python part (qk/__init__.py) validates and converts arguments, then calls:

     _qk.Map(spec, n_features, weights=None)        qk_map_parse (+ qk_map_set_weights)
     _qk.Map.from_ops(n_qubits, n_features, n_weights, ops, weights=None)
                                                    qk_map_make (QK_MAP_CUSTOM)
     Map.n_qubits / n_features / n_weights / kind / spec / weights / ops
     Map.states(x, threads)                         qk_states (complex128, n x 2^q)
     _qk.gram(map, x, y, out, device, precision, threads, out_path)
                                                    qk_gram into out (host, f32/f64) or into
                                                    the .npy file out_path (QK_OUTPUT_NPY)
     _qk.engine()                                   what this build and machine offer
     _qk.get_num_threads() / set_num_threads(n)     the threads of calls that name none (the
                                                    thread limit threadpoolctl sets)

   x and y reach gram() as C-contiguous, aligned, native float64 arrays (checked here again, so a
   direct caller cannot crash the process); out is a 2-D float32/float64 array whose rows are
   contiguous (any row stride: qk's ld_out). The GIL is released while qk computes. qk's progress
   callback, on the calling thread, takes the GIL back at most every QKPY_SIGNAL_CHECK_S seconds to
   run Python's signal handlers (PyErr_CheckSignals): Ctrl-C raises KeyboardInterrupt there, the
   callback cancels, qk_gram returns QK_ERROR_CANCELLED and the exception propagates. qk's errors
   become ValueError (bad input), MemoryError (out of host or device memory), OSError (file errors,
   its subclass picked by the errno: FileNotFoundError, PermissionError, ...) or RuntimeError (the
   rest), with qk_last_error()'s detail message. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#define QK_IMPLEMENTATION
#include "qk.h"

#include <string.h>
#if defined(_WIN32)
#include <windows.h>
#else
#include <time.h>
#include <unistd.h>
#endif

/* How often the progress callback looks for pending signals: 10 ms keeps Ctrl-C well under the
   100 ms target (docs/python.md) while the GIL is taken back at most 100 times a second. */
#define QKPY_SIGNAL_CHECK_S 0.010

/* ---- errors ---- */
static PyObject *qkpy_exception_for(qk_result r)
{
    switch (r) {
    case QK_ERROR_INVALID_ARGUMENT: case QK_ERROR_NON_FINITE: case QK_ERROR_SHAPE: case QK_ERROR_PARSE:
    case QK_ERROR_TOO_MANY_QUBITS: case QK_ERROR_ZERO_NORM: case QK_ERROR_BAD_DATA:
        return PyExc_ValueError;
    case QK_ERROR_OUT_OF_MEMORY: case QK_ERROR_DEVICE_OUT_OF_MEMORY:
        return PyExc_MemoryError;
    default:
        return PyExc_RuntimeError;
    }
}

/* The errno behind a QK_ERROR_IO detail message, or 0. qk's file errors end their detail with
   ": " strerror(errno) (possibly followed by a note): the longest errno text found after ": " in
   the message is the one (same process, same C library, so the texts are the ones qk wrote). */
static int qkpy_errno_of(const char *detail)
{
    int e, best = 0;
    size_t best_len = 0;
    for (e = 1; e < 256; e++) {
        const char *s = strerror(e), *at;
        size_t len;
        if (!s || !s[0] || !strncmp(s, "Unknown error", 13)) continue;
        len = strlen(s);
        for (at = strstr(detail, s); at; at = strstr(at + 1, s))
            if (at - detail >= 2 && at[-2] == ':' && at[-1] == ' ' && len > best_len) { best = e; best_len = len; break; }
    }
    return best;
}

/* Raises the Python exception for a qk_result, with qk's detail message; returns NULL. A file
   error (QK_ERROR_IO) is an OSError built from (errno, message, filename) as Python's own file
   errors are, so that the errno picks its subclass: FileNotFoundError, PermissionError,
   IsADirectoryError, NotADirectoryError, ... (a plain OSError where no subclass exists or qk's
   message names no errno). filename may be NULL. */
static PyObject *qkpy_raise_path(qk_result r, const char *filename)
{
    const char *detail = qk_last_error();
    if (r == QK_ERROR_IO) {
        int e = qkpy_errno_of(detail);
        PyObject *msg = PyUnicode_FromFormat("%s%s%s", qk_result_string(r), detail[0] ? ": " : "", detail), *args;
        if (!msg) return NULL;
        if (e && filename) {
            PyObject *fn = PyUnicode_DecodeFSDefault(filename);
            if (!fn) { Py_DECREF(msg); return NULL; }
            args = Py_BuildValue("(iNN)", e, msg, fn);
        } else {
            args = e ? Py_BuildValue("(iN)", e, msg) : Py_BuildValue("(N)", msg);
        }
        if (!args) return NULL;
        PyErr_SetObject(PyExc_OSError, args);   /* OSError.__new__ maps the errno to the subclass */
        Py_DECREF(args);
        return NULL;
    }
    PyErr_Format(qkpy_exception_for(r), "%s%s%s", qk_result_string(r), detail[0] ? ": " : "", detail);
    return NULL;
}

static PyObject *qkpy_raise(qk_result r) { return qkpy_raise_path(r, NULL); }

static double qkpy_now(void)
{
#if defined(_WIN32)
    return (double)GetTickCount64() * 1e-3;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
#endif
}

/* ---- the thread limit (threadpoolctl, qk.set_num_threads) ---- */
/* The threads a call uses when the caller names none (threads=None in Python): 0 means qk's own
   default, every online core (qk_ctx_desc.n_threads = 0). qk's threadpoolctl controller
   (qk/__init__.py, _register_threadpoolctl) reads and sets it through the two exported functions below, by ctypes, as
   threadpoolctl does for OpenBLAS or OpenMP: they are the only symbols of this module besides
   PyInit__qk, and their names tell threadpoolctl this library is qk. Process-wide, like
   omp_set_num_threads; an explicit threads= argument is not capped by it. */
#if defined(_WIN32)
#define QKPY_EXPORT __declspec(dllexport)
#else
#define QKPY_EXPORT __attribute__((visibility("default")))
#endif
static volatile int qkpy_thread_limit;     /* 0: none */
static int qkpy_cores = 1;                 /* qk's default thread count (PyInit__qk) */
static int qkpy_last_threads;              /* threads of the context of the last gram()/states() */

/* The threads of a call that names none: the limit, or qk's default (all online cores). */
QKPY_EXPORT int qkpy_get_num_threads(void)
{
    int n = qkpy_thread_limit;
    return n > 0 ? n : qkpy_cores;
}

/* n >= 1: calls that name no thread count use n threads; n <= 0 (or qk's default): no limit. */
QKPY_EXPORT void qkpy_set_num_threads(int n)
{
    qkpy_thread_limit = n > 0 && n != qkpy_cores ? n : 0;
}

static int qkpy_threads_for(int threads) { return threads > 0 ? threads : qkpy_thread_limit; }

/* ---- Map ---- */
typedef struct {
    PyObject_HEAD
    qk_map *map;
} qkpy_Map;

/* Copies a 1-D sequence of floats into a new double buffer (*n values); NULL with an exception set. */
static double *qkpy_doubles(PyObject *seq, Py_ssize_t *n)
{
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(seq, NPY_DOUBLE, 0, 1, NPY_ARRAY_IN_ARRAY);
    double *out;
    if (!a) return NULL;
    *n = PyArray_SIZE(a);
    out = (double *)PyMem_Malloc(sizeof(double) * (size_t)(*n > 0 ? *n : 1));
    if (!out) { Py_DECREF(a); PyErr_NoMemory(); return NULL; }
    if (*n > 0) memcpy(out, PyArray_DATA(a), sizeof(double) * (size_t)*n);
    Py_DECREF(a);
    return out;
}

static int qkpy_set_weights(qk_map *m, PyObject *weights)
{
    Py_ssize_t n;
    double *w;
    qk_result r;
    if (weights == NULL || weights == Py_None) return 0;
    w = qkpy_doubles(weights, &n);
    if (!w) return -1;
    if (n > INT32_MAX) { PyMem_Free(w); PyErr_SetString(PyExc_ValueError, "too many weights"); return -1; }
    r = qk_map_set_weights(m, w, (int)n);
    PyMem_Free(w);
    if (r != QK_OK) { qkpy_raise(r); return -1; }
    return 0;
}

static PyObject *qkpy_map_wrap(PyTypeObject *type, qk_map *m)
{
    qkpy_Map *self = (qkpy_Map *)type->tp_alloc(type, 0);
    if (!self) { qk_map_free(m); return NULL; }
    self->map = m;
    return (PyObject *)self;
}

static PyObject *qkpy_Map_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"spec", "n_features", "weights", NULL};
    const char *spec;
    int n_features;
    PyObject *weights = Py_None;
    qk_map *m = NULL;
    qk_result r;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "si|O:Map", kwlist, &spec, &n_features, &weights)) return NULL;
    r = qk_map_parse(spec, n_features, &m);
    if (r != QK_OK) return qkpy_raise(r);
    if (qkpy_set_weights(m, weights) < 0) { qk_map_free(m); return NULL; }
    return qkpy_map_wrap(type, m);
}

/* ops: a sequence of 9-tuples (op_kind, q0, q1, arg_kind, x0, x1, w, scale, offset), the fields
   of qk_op / qk_angle with the QK_OP_* / QK_ARG_* values exported by this module. */
static PyObject *qkpy_Map_from_ops(PyObject *cls, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"n_qubits", "n_features", "n_weights", "ops", "weights", NULL};
    int nq, nf, nw;
    PyObject *ops_obj, *weights = Py_None, *seq;
    qk_map_desc d;
    qk_op *ops;
    qk_map *m = NULL;
    qk_result r;
    Py_ssize_t i, n;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiO|O:from_ops", kwlist, &nq, &nf, &nw, &ops_obj, &weights)) return NULL;
    seq = PySequence_Fast(ops_obj, "ops must be a sequence of tuples");
    if (!seq) return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n > INT32_MAX) { Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "too many ops"); return NULL; }
    ops = (qk_op *)PyMem_Malloc(sizeof(qk_op) * (size_t)(n > 0 ? n : 1));
    if (!ops) { Py_DECREF(seq); return PyErr_NoMemory(); }
    memset(ops, 0, sizeof(qk_op) * (size_t)(n > 0 ? n : 1));
    for (i = 0; i < n; i++) {
        int kind, q0, q1, ak, x0, x1, w;
        double scale, offset;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiiiiiidd;each op is (kind, q0, q1, arg_kind, x0, x1, w, scale, offset)",
                              &kind, &q0, &q1, &ak, &x0, &x1, &w, &scale, &offset)) {
            PyMem_Free(ops); Py_DECREF(seq); return NULL;
        }
        ops[i].kind = (qk_op_kind)kind; ops[i].q0 = q0; ops[i].q1 = q1;
        ops[i].angle.kind = (qk_arg_kind)ak; ops[i].angle.x0 = x0; ops[i].angle.x1 = x1; ops[i].angle.w = w;
        ops[i].angle.scale = scale; ops[i].angle.offset = offset;
    }
    Py_DECREF(seq);
    memset(&d, 0, sizeof d);
    d.type = QK_MAP_CUSTOM;
    d.n_features = nf;
    d.n_qubits = nq;
    d.ops = ops;
    d.n_ops = (int)n;
    d.n_weights = nw;
    r = qk_map_make(&d, &m);
    PyMem_Free(ops);
    if (r != QK_OK) return qkpy_raise(r);
    if (qkpy_set_weights(m, weights) < 0) { qk_map_free(m); return NULL; }
    return qkpy_map_wrap((PyTypeObject *)cls, m);
}

static void qkpy_Map_dealloc(qkpy_Map *self)
{
    qk_map_free(self->map);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *qkpy_Map_get_n_qubits(qkpy_Map *self, void *c) { (void)c; return PyLong_FromLong(self->map->n_qubits); }
static PyObject *qkpy_Map_get_n_features(qkpy_Map *self, void *c) { (void)c; return PyLong_FromLong(self->map->n_features); }
static PyObject *qkpy_Map_get_n_weights(qkpy_Map *self, void *c) { (void)c; return PyLong_FromLong(self->map->n_weights); }
static PyObject *qkpy_Map_get_kind(qkpy_Map *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(self->map->cls == QK_CLASS_PRODUCT ? "product" : self->map->cls == QK_CLASS_REAL ? "real" : "complex");
}

static PyObject *qkpy_Map_get_spec(qkpy_Map *self, void *c)
{
    int len = qk_map_spec(self->map, NULL, 0);
    char *buf;
    PyObject *s;
    (void)c;
    buf = (char *)PyMem_Malloc((size_t)len + 1);
    if (!buf) return PyErr_NoMemory();
    qk_map_spec(self->map, buf, (size_t)len + 1);
    s = PyUnicode_FromString(buf);
    PyMem_Free(buf);
    return s;
}

static PyObject *qkpy_Map_get_weights(qkpy_Map *self, void *c)
{
    npy_intp n = self->map->n_weights;
    PyObject *a = PyArray_SimpleNew(1, &n, NPY_DOUBLE);
    (void)c;
    if (a && n > 0) memcpy(PyArray_DATA((PyArrayObject *)a), self->map->weights, sizeof(double) * (size_t)n);
    return a;
}

static PyObject *qkpy_Map_get_ops(qkpy_Map *self, void *c)
{
    PyObject *list = PyList_New(self->map->n_ops);
    int i;
    (void)c;
    if (!list) return NULL;
    for (i = 0; i < self->map->n_ops; i++) {
        const qk_op *o = &self->map->ops[i];
        PyObject *t = Py_BuildValue("(iiiiiiidd)", (int)o->kind, o->q0, o->q1, (int)o->angle.kind, o->angle.x0,
                                    o->angle.x1, o->angle.w, o->angle.scale, o->angle.offset);
        if (!t) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

/* The input arrays of gram() / states(): 2-D, C-contiguous, aligned, native float64. */
static int qkpy_check_in(PyObject *o, const char *name, int n_features)
{
    PyArrayObject *a;
    if (!PyArray_Check(o)) { PyErr_Format(PyExc_TypeError, "%s must be a numpy array", name); return -1; }
    a = (PyArrayObject *)o;
    if (PyArray_TYPE(a) != NPY_DOUBLE || !PyArray_ISNOTSWAPPED(a) || !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous, aligned, native float64 array", name);
        return -1;
    }
    if (PyArray_NDIM(a) != 2) { PyErr_Format(PyExc_ValueError, "%s must be 2-D (got %d dimensions)", name, PyArray_NDIM(a)); return -1; }
    if (PyArray_DIM(a, 1) != n_features) {
        PyErr_Format(PyExc_ValueError, "%s has %zd features per row, the map takes %d", name, (Py_ssize_t)PyArray_DIM(a, 1), n_features);
        return -1;
    }
    return 0;
}

static PyObject *qkpy_Map_states(qkpy_Map *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "threads", NULL};
    PyObject *xo;
    int threads = 0;
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_result r;
    PyArrayObject *x;
    PyObject *out;
    npy_intp dims[2];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i:states", kwlist, &xo, &threads)) return NULL;
    if (qkpy_check_in(xo, "x", self->map->n_features) < 0) return NULL;
    x = (PyArrayObject *)xo;
    if (self->map->n_qubits > QK_MAX_STATE_QUBITS) {
        PyErr_Format(PyExc_ValueError, "too many qubits: %d qubits exceed the state limit %d", self->map->n_qubits, QK_MAX_STATE_QUBITS);
        return NULL;
    }
    dims[0] = PyArray_DIM(x, 0);
    dims[1] = (npy_intp)1 << self->map->n_qubits;
    if (dims[0] > 0 && (double)dims[0] * (double)dims[1] * 16.0 > 9.0e18) return PyErr_NoMemory();
    out = PyArray_SimpleNew(2, dims, NPY_COMPLEX128);
    if (!out) return NULL;
    if (dims[0] == 0) return out;
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = qkpy_threads_for(threads);
    Py_BEGIN_ALLOW_THREADS
    r = qk_ctx_create(&cd, &ctx);
    if (r == QK_OK) qkpy_last_threads = qk_ctx_query(ctx).n_threads;
    if (r == QK_OK) r = qk_states(ctx, self->map, (const double *)PyArray_DATA(x), dims[0], (double *)PyArray_DATA((PyArrayObject *)out));
    qk_ctx_destroy(ctx);
    Py_END_ALLOW_THREADS
    if (r != QK_OK) { Py_DECREF(out); return qkpy_raise(r); }
    return out;
}

static PyGetSetDef qkpy_Map_getset[] = {
    {"n_qubits", (getter)qkpy_Map_get_n_qubits, NULL, "number of qubits", NULL},
    {"n_features", (getter)qkpy_Map_get_n_features, NULL, "number of features per sample", NULL},
    {"n_weights", (getter)qkpy_Map_get_n_weights, NULL, "number of trainable weights", NULL},
    {"kind", (getter)qkpy_Map_get_kind, NULL, "'product', 'real' or 'complex' (qk_map_class)", NULL},
    {"spec", (getter)qkpy_Map_get_spec, NULL, "spec string that parses back into this map (qk_map_spec)", NULL},
    {"weights", (getter)qkpy_Map_get_weights, NULL, "a copy of the weights (float64)", NULL},
    {"ops", (getter)qkpy_Map_get_ops, NULL, "the op list as (kind, q0, q1, arg_kind, x0, x1, w, scale, offset) tuples", NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PyMethodDef qkpy_Map_methods[] = {
    {"from_ops", (PyCFunction)(void (*)(void))qkpy_Map_from_ops, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "from_ops(n_qubits, n_features, n_weights, ops, weights=None): a custom map (qk_map_make)"},
    {"states", (PyCFunction)(void (*)(void))qkpy_Map_states, METH_VARARGS | METH_KEYWORDS,
     "states(x, threads=0): complex128 states of the rows of x (qk_states)"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject qkpy_MapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "qk._qk.Map",
    .tp_basicsize = sizeof(qkpy_Map),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A qk feature map (qk_map): immutable once built",
    .tp_new = qkpy_Map_new,
    .tp_dealloc = (destructor)qkpy_Map_dealloc,
    .tp_getset = qkpy_Map_getset,
    .tp_methods = qkpy_Map_methods,
};

/* ---- gram ---- */
typedef struct {
    PyThreadState *ts;          /* the calling thread's state while the GIL is released */
    unsigned long thread;       /* the calling thread: only it may take the GIL back here */
    double last;                /* when signals were last checked */
    int interrupted;            /* a signal handler raised: cancel */
} qkpy_cancel;

static int qkpy_progress(int64_t done, int64_t total, void *user)
{
    qkpy_cancel *c = (qkpy_cancel *)user;
    double now;
    (void)done; (void)total;
    if (c->interrupted || PyThread_get_thread_ident() != c->thread) return c->interrupted;
    now = qkpy_now();
    if (now - c->last < QKPY_SIGNAL_CHECK_S) return 0;
    c->last = now;
    PyEval_RestoreThread(c->ts);
    if (PyErr_CheckSignals() < 0) c->interrupted = 1;
    c->ts = PyEval_SaveThread();
    return c->interrupted;
}

/* ---- contexts ---- */
/* qk contexts are kept between calls (a context owns the CPU engine's thread pool and, on the
   GPU engine, pinned staging: both cost more to set up than a small Gram). A call takes a free
   context of its (device, threads) from this cache, or makes one, and puts it back afterwards;
   the GIL guards the cache, so concurrent calls from Python threads use different contexts. A
   forked child forgets the parent's contexts (their threads did not survive the fork). */
#define QKPY_CTX_CACHE 4
typedef struct { qk_ctx *ctx; int device, threads; } qkpy_ctx_slot;
static qkpy_ctx_slot qkpy_ctx_cache[QKPY_CTX_CACHE];
static long qkpy_ctx_pid;

static long qkpy_pid(void)
{
#if defined(_WIN32)
    return (long)GetCurrentProcessId();
#else
    return (long)getpid();
#endif
}

/* Called with the GIL held: a cached context of (device, threads), or NULL. */
static qk_ctx *qkpy_ctx_take(int device, int threads)
{
    int i;
    if (qkpy_ctx_pid != qkpy_pid()) {
        memset(qkpy_ctx_cache, 0, sizeof qkpy_ctx_cache);   /* a fork: not ours to free */
        qkpy_ctx_pid = qkpy_pid();
    }
    for (i = 0; i < QKPY_CTX_CACHE; i++)
        if (qkpy_ctx_cache[i].ctx && qkpy_ctx_cache[i].device == device && qkpy_ctx_cache[i].threads == threads) {
            qk_ctx *c = qkpy_ctx_cache[i].ctx;
            qkpy_ctx_cache[i].ctx = NULL;
            return c;
        }
    return NULL;
}

/* Called with the GIL held (the context is destroyed when the cache is full). */
static void qkpy_ctx_give(qk_ctx *ctx, int device, int threads)
{
    int i;
    if (!ctx) return;
    for (i = 0; i < QKPY_CTX_CACHE; i++)
        if (!qkpy_ctx_cache[i].ctx) {
            qkpy_ctx_cache[i].ctx = ctx; qkpy_ctx_cache[i].device = device; qkpy_ctx_cache[i].threads = threads;
            return;
        }
    Py_BEGIN_ALLOW_THREADS
    qk_ctx_destroy(ctx);
    Py_END_ALLOW_THREADS
}

static void qkpy_ctx_clear(void)
{
    int i;
    if (qkpy_ctx_pid != qkpy_pid()) return;
    for (i = 0; i < QKPY_CTX_CACHE; i++) { qk_ctx_destroy(qkpy_ctx_cache[i].ctx); qkpy_ctx_cache[i].ctx = NULL; }
}

/* ---- what gram, gram_states and gram_mps share ---- */
/* Wall time of the last qk_gram call made by gram() (bench/python_cpu.py: the wrapper's own cost
   is the call's time minus this). */
static double qkpy_last_gram_s;

/* ValueError for a device or precision outside qk's enums; 0 when both are known. */
static int qkpy_check_device_precision(int device, int precision)
{
    if (device < QK_DEVICE_AUTO || device > QK_DEVICE_CUDA) { PyErr_Format(PyExc_ValueError, "unknown device %d", device); return -1; }
    if (precision < QK_PRECISION_DEFAULT || precision >= QK_PRECISION_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown precision %d", precision);
        return -1;
    }
    return 0;
}

/* A context of (device, threads): a cached one (qkpy_ctx_take) or a new one; NULL with the
   exception set. */
static qk_ctx *qkpy_ctx_get(int device, int threads)
{
    qk_ctx_desc cd;
    qk_ctx *ctx = qkpy_ctx_take(device, threads);
    qk_result r = QK_OK;
    if (ctx) return ctx;
    memset(&cd, 0, sizeof cd);
    cd.device = (qk_device)device;
    cd.n_threads = threads;
    Py_BEGIN_ALLOW_THREADS
    r = qk_ctx_create(&cd, &ctx);
    Py_END_ALLOW_THREADS
    if (r != QK_OK) { qkpy_raise(r); return NULL; }
    return ctx;
}

/* The output dtype qk's planner picks (docs/api.md): fp64 on the CPU engine, fp32 on the GPU
   engine, unless the precision says otherwise. */
static qk_dtype qkpy_out_dtype(qk_ctx *ctx, int precision)
{
    return precision == QK_PRECISION_FP64 ? QK_F64
           : precision != QK_PRECISION_DEFAULT && precision != QK_PRECISION_AUTO ? QK_F32 /* fp32 and the tensor-core modes */
           : qk_ctx_query(ctx).device == QK_DEVICE_CUDA ? QK_F32 : QK_F64;
}

/* Where K goes: the .npy at path, or a new (n_x, n_y) array of dt (*out, which the caller owns).
   -1 with the exception set (no memory). */
static int qkpy_gram_out(qk_gram_desc *g, PyObject *path, int64_t n_x, int64_t n_y, qk_dtype dt, PyArrayObject **out)
{
    npy_intp dims[2];
    if (path) {
        g->output = QK_OUTPUT_NPY;
        g->out_path = PyBytes_AS_STRING(path);
        return 0;
    }
    dims[0] = (npy_intp)n_x; dims[1] = (npy_intp)n_y;
    *out = (PyArrayObject *)PyArray_SimpleNew(2, dims, dt == QK_F32 ? NPY_FLOAT : NPY_DOUBLE);
    if (!*out) return -1;
    g->out = PyArray_DATA(*out);
    return 0;
}

/* Runs one Gram (qk_gram of map, qk_gram_states of states or qk_gram_mps_states of mps: one of
   them given) with the GIL released, checking for signals while it runs (qkpy_progress), times it
   (qkpy_last_gram_s) and gives the context back. -1 with the exception set: a signal handler's,
   or qk's error (path: the file it names). */
static int qkpy_gram_run(qk_ctx *ctx, int device, int threads, const qk_map *map, const qk_states_desc *states,
                         const qk_mps_states_desc *mps, qk_gram_desc *g, PyObject *path)
{
    qkpy_cancel cancel;
    qk_result r;
    double t0;
    g->progress = qkpy_progress;
    g->progress_user = &cancel;
    memset(&cancel, 0, sizeof cancel);
    cancel.thread = PyThread_get_thread_ident();
    cancel.last = qkpy_now();
    cancel.ts = PyEval_SaveThread();
    t0 = qkpy_now();
    r = map ? qk_gram(ctx, map, g) : states ? qk_gram_states(ctx, states, g) : qk_gram_mps_states(ctx, mps, g);
    t0 = qkpy_now() - t0;
    PyEval_RestoreThread(cancel.ts);
    qkpy_last_gram_s = t0;                  /* written with the GIL held */
    qkpy_ctx_give(ctx, device, threads);
    if (cancel.interrupted) return -1;      /* the signal handler's exception is set */
    if (r != QK_OK) { qkpy_raise_path(r, path ? PyBytes_AS_STRING(path) : NULL); return -1; }
    return 0;
}

/* X (and Y unless None) checked as a map of n_features takes them (qkpy_check_in); borrowed. */
static int qkpy_check_xy(PyObject *xo, PyObject *yo, int n_features, PyArrayObject **x, PyArrayObject **y)
{
    if (qkpy_check_in(xo, "X", n_features) < 0) return -1;
    *x = (PyArrayObject *)xo;
    *y = NULL;
    if (yo != Py_None) {
        if (qkpy_check_in(yo, "Y", n_features) < 0) return -1;
        *y = (PyArrayObject *)yo;
    }
    return 0;
}

/* ---- gram ---- */
static PyObject *qkpy_gram(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"map", "x", "y", "out", "device", "precision", "threads", "out_path", "tol", NULL};
    PyObject *mapo, *xo, *yo = Py_None, *outo = Py_None, *path = NULL;
    int device = 0, precision = 0, threads = 0;
    double tol = 0.0;
    qkpy_Map *map;
    PyArrayObject *x, *y = NULL, *out = NULL;
    qk_ctx *ctx;
    qk_gram_desc g;
    qk_dtype dt;
    int64_t nx, ny, ld = 0;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O|OOiiiO&d:gram", kwlist, &qkpy_MapType, &mapo, &xo, &yo, &outo,
                                     &device, &precision, &threads, PyUnicode_FSConverter, &path, &tol)) return NULL;
    map = (qkpy_Map *)mapo;
    if (qkpy_check_xy(xo, yo, map->map->n_features, &x, &y) < 0) goto fail;
    if (qkpy_check_device_precision(device, precision) < 0) goto fail;
    if (!(tol >= 0.0 && tol <= 1.0)) { PyErr_Format(PyExc_ValueError, "tol must be in [0, 1] (got %g)", tol); goto fail; }
    if (threads < 0) { PyErr_Format(PyExc_ValueError, "threads must be >= 1 (got %d)", threads); goto fail; }
    if (path && outo != Py_None) { PyErr_SetString(PyExc_ValueError, "give out or out_path, not both"); goto fail; }
    nx = PyArray_DIM(x, 0);
    ny = y ? PyArray_DIM(y, 0) : nx;
    if (outo != Py_None) {     /* the caller's array (borrowed: out stays NULL) */
        PyArrayObject *o;
        npy_intp isz;
        if (!PyArray_Check(outo)) { PyErr_SetString(PyExc_TypeError, "out must be a numpy array"); goto fail; }
        o = (PyArrayObject *)outo;
        if ((PyArray_TYPE(o) != NPY_DOUBLE && PyArray_TYPE(o) != NPY_FLOAT) || !PyArray_ISNOTSWAPPED(o)) {
            PyErr_SetString(PyExc_TypeError, "out must be a native float32 or float64 array");
            goto fail;
        }
        if (PyArray_NDIM(o) != 2 || PyArray_DIM(o, 0) != nx || PyArray_DIM(o, 1) != ny) {
            PyErr_Format(PyExc_ValueError, "out must have shape (%lld, %lld)", (long long)nx, (long long)ny);
            goto fail;
        }
        if (!PyArray_ISWRITEABLE(o)) { PyErr_SetString(PyExc_ValueError, "out is read-only"); goto fail; }
        isz = PyArray_ITEMSIZE(o);
        if (!PyArray_ISALIGNED(o) || (ny > 1 && PyArray_STRIDE(o, 1) != isz) ||
            (nx > 1 && (PyArray_STRIDE(o, 0) < ny * isz || PyArray_STRIDE(o, 0) % isz != 0))) {
            PyErr_SetString(PyExc_ValueError, "out's rows must be contiguous and in order (column stride = item size, row stride >= columns)");
            goto fail;
        }
        if (nx > 1) ld = PyArray_STRIDE(o, 0) / isz;
    }
    threads = qkpy_threads_for(threads);    /* threads=None: the limit (threadpoolctl), if any */
    if (!(ctx = qkpy_ctx_get(device, threads))) goto fail;
    qkpy_last_threads = qk_ctx_query(ctx).n_threads;
    dt = qkpy_out_dtype(ctx, precision);    /* the caller's out decides for itself */
    memset(&g, 0, sizeof g);
    if (outo != Py_None) {
        dt = PyArray_TYPE((PyArrayObject *)outo) == NPY_FLOAT ? QK_F32 : QK_F64;
        g.out = PyArray_DATA((PyArrayObject *)outo);
    } else if (qkpy_gram_out(&g, path, nx, ny, dt, &out) < 0) {
        qkpy_ctx_give(ctx, device, threads);
        goto fail;
    }
    g.x = (const double *)PyArray_DATA(x);
    g.n_x = nx;
    g.y = y ? (const double *)PyArray_DATA(y) : NULL;
    g.n_y = y ? ny : 0;
    g.ld_out = ld;
    g.out_dtype = dt;
    g.precision = (qk_precision)precision;
    g.tol = tol;
    if (qkpy_gram_run(ctx, device, threads, map->map, NULL, NULL, &g, path) < 0) goto fail;
    Py_XDECREF(path);
    if (outo != Py_None) { Py_INCREF(outo); return outo; }
    if (out) return (PyObject *)out;
    Py_RETURN_NONE;                         /* out_path: the file is written */
fail:
    Py_XDECREF(out);
    Py_XDECREF(path);
    return NULL;
}

/* K (n_rows x n_cols) from given states or MPS (qk_gram_states of st, qk_gram_mps_states of mps:
   one of them given) on the context of device and threads: a new float32 / float64 array, or
   None with out_path (path, a reference this call gives up). */
static PyObject *qkpy_gram_given(const qk_states_desc *st, const qk_mps_states_desc *mps, int64_t n_rows, int64_t n_cols,
                                 int device, int precision, int threads, PyObject *path)
{
    PyArrayObject *out = NULL;
    qk_gram_desc g;
    qk_ctx *ctx;
    qk_dtype dt;
    if (qkpy_check_device_precision(device, precision) < 0) goto fail;
    threads = qkpy_threads_for(threads);
    if (!(ctx = qkpy_ctx_get(device, threads))) goto fail;
    dt = qkpy_out_dtype(ctx, precision);
    memset(&g, 0, sizeof g);
    if (qkpy_gram_out(&g, path, n_rows, n_cols, dt, &out) < 0) { qkpy_ctx_give(ctx, device, threads); goto fail; }
    g.out_dtype = dt;
    g.precision = (qk_precision)precision;
    if (qkpy_gram_run(ctx, device, threads, NULL, st, mps, &g, path) < 0) goto fail;
    Py_XDECREF(path);
    if (out) return (PyObject *)out;
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    Py_XDECREF(path);
    return NULL;
}

/* ---- gram_states ---- */
/* K from given states (qk_gram_states): the Python wrapper (qk.gram_states) resolves numpy, CuPy
   and PyTorch arrays to raw pointers, element strides and the state type and keeps them alive
   over the call; here they are handed to qk as they are. Returns K as a new float32 / float64
   array, or None with out_path. */
static PyObject *qkpy_gram_states_raw(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"a", "n_a", "lda", "b", "n_b", "ldb", "dim", "type", "on_device", "device", "precision", "threads",
                             "normalize", "norm_tol", "out_path", "a_mixed", "b_mixed", NULL};
    unsigned long long pa = 0, pb = 0;
    long long n_a = 0, lda = 0, n_b = 0, ldb = 0, dim = 0;
    int type = 0, on_device = 0, device = 0, precision = 0, threads = 0, normalize = 0, a_mixed = 0, b_mixed = 0;
    double norm_tol = 0.0;
    PyObject *path = NULL;
    qk_states_desc st;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KLLKLLLiiiiiid|O&ii:_gram_states", kwlist, &pa, &n_a, &lda, &pb, &n_b, &ldb, &dim, &type,
                                     &on_device, &device, &precision, &threads, &normalize, &norm_tol, PyUnicode_FSConverter, &path,
                                     &a_mixed, &b_mixed))
        return NULL;
    st = (qk_states_desc){
        .type = (qk_state_type)type, .dim = dim,
        .a = (const void *)(uintptr_t)pa, .n_a = n_a, .lda = lda,
        .b = pb ? (const void *)(uintptr_t)pb : NULL, .n_b = pb ? n_b : 0, .ldb = ldb,
        .on_device = on_device, .normalize = normalize, .norm_tol = norm_tol, .a_mixed = a_mixed, .b_mixed = b_mixed,
    };
    return qkpy_gram_given(&st, NULL, n_a, pb ? n_b : n_a, device, precision, threads, path);
}

/* ---- gram_mps ---- */
/* K from given MPS (qk_gram_mps_states): the Python wrapper (qk.gram_mps) makes every site tensor
   a contiguous array of one dtype and passes the addresses of a uint64 array of the tensors'
   pointers (n * n_sites) and of an int32 array of the bonds (n * (n_sites + 1)), and keeps them
   alive over the call. Returns K as a new float32 / float64 array, or None with out_path. */
static PyObject *qkpy_gram_mps_raw(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"a", "a_bonds", "n_a", "b", "b_bonds", "n_b", "n_sites", "type", "layout", "device", "precision",
                             "threads", "normalize", "norm_tol", "out_path", NULL};
    unsigned long long pa = 0, pab = 0, pb = 0, pbb = 0;
    long long n_a = 0, n_b = 0;
    int n_sites = 0, type = 0, layout = 0, device = 0, precision = 0, threads = 0, normalize = 0;
    double norm_tol = 0.0;
    PyObject *path = NULL;
    qk_mps_states_desc st;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KKLKKLiiiiiiid|O&:_gram_mps", kwlist, &pa, &pab, &n_a, &pb, &pbb, &n_b, &n_sites, &type,
                                     &layout, &device, &precision, &threads, &normalize, &norm_tol, PyUnicode_FSConverter, &path))
        return NULL;
    st = (qk_mps_states_desc){
        .type = (qk_state_type)type, .layout = (qk_mps_layout)layout, .n_sites = n_sites,
        .a = (const void *const *)(uintptr_t)pa, .a_bonds = (const int *)(uintptr_t)pab, .n_a = n_a,
        .b = pb ? (const void *const *)(uintptr_t)pb : NULL, .b_bonds = pb ? (const int *)(uintptr_t)pbb : NULL,
        .n_b = pb ? n_b : 0, .normalize = normalize, .norm_tol = norm_tol,
    };
    return qkpy_gram_given(NULL, &st, n_a, pb ? n_b : n_a, device, precision, threads, path);
}

/* ---- gram_vjp ---- */
/* dL/dw (and K) of a map for G = dL/dK (qk_gram_vjp): X, Y float64 C-contiguous (the wrapper
   converts), G float64 (n_x, n_y) C-contiguous. Returns (grad, K); data=1: (grad, K, dL/dX) for
   K(X,X), (grad, K, dL/dX, dL/dY) for K(X,Y). */
static PyObject *qkpy_gram_vjp(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"map", "x", "y", "g", "threads", "data", NULL};
    PyObject *mapo, *xo, *yo = Py_None, *go, *res = NULL;
    PyArrayObject *x, *y = NULL, *gg, *grad = NULL, *K = NULL, *gx = NULL, *gy = NULL;
    qkpy_Map *map;
    qk_ctx_desc cd;
    qk_ctx *ctx = NULL;
    qk_vjp_desc v;
    qk_result r;
    npy_intp dims[2];
    int threads = 0, data = 0;
    int64_t nx, ny;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOO|ii:_gram_vjp", kwlist, &qkpy_MapType, &mapo, &xo, &yo, &go, &threads, &data)) return NULL;
    map = (qkpy_Map *)mapo;
    if (qkpy_check_xy(xo, yo, map->map->n_features, &x, &y) < 0) return NULL;
    nx = PyArray_DIM(x, 0);
    ny = y ? PyArray_DIM(y, 0) : nx;
    if (!PyArray_Check(go) || PyArray_TYPE((PyArrayObject *)go) != NPY_DOUBLE || PyArray_NDIM((PyArrayObject *)go) != 2 ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)go) || PyArray_DIM((PyArrayObject *)go, 0) != nx || PyArray_DIM((PyArrayObject *)go, 1) != ny) {
        PyErr_Format(PyExc_ValueError, "G must be a C-contiguous float64 array of shape (%lld, %lld)", (long long)nx, (long long)ny);
        return NULL;
    }
    gg = (PyArrayObject *)go;
    dims[0] = map->map->n_weights > 0 ? map->map->n_weights : 0;
    grad = (PyArrayObject *)PyArray_ZEROS(1, dims, NPY_DOUBLE, 0);
    dims[0] = (npy_intp)nx; dims[1] = (npy_intp)ny;
    K = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_DOUBLE);
    if (!grad || !K) goto done;
    if (data) {
        dims[0] = (npy_intp)nx; dims[1] = (npy_intp)map->map->n_features;
        gx = (PyArrayObject *)PyArray_ZEROS(2, dims, NPY_DOUBLE, 0);
        if (!gx) goto done;
        if (y) {
            dims[0] = (npy_intp)ny;
            gy = (PyArrayObject *)PyArray_ZEROS(2, dims, NPY_DOUBLE, 0);
            if (!gy) goto done;
        }
    }
    threads = qkpy_threads_for(threads);
    memset(&cd, 0, sizeof cd);
    cd.device = QK_DEVICE_CPU;
    cd.n_threads = threads;
    memset(&v, 0, sizeof v);
    v.x = (const double *)PyArray_DATA(x); v.n_x = nx;
    v.y = y ? (const double *)PyArray_DATA(y) : NULL; v.n_y = y ? ny : 0;
    v.g = (const double *)PyArray_DATA(gg);
    v.grad_w = (double *)PyArray_DATA(grad);
    v.k_out = (double *)PyArray_DATA(K);
    v.grad_x = gx ? (double *)PyArray_DATA(gx) : NULL;
    v.grad_y = gy ? (double *)PyArray_DATA(gy) : NULL;
    Py_BEGIN_ALLOW_THREADS
    r = qk_ctx_create(&cd, &ctx);
    if (r == QK_OK) r = qk_gram_vjp(ctx, map->map, &v);
    qk_ctx_destroy(ctx);
    Py_END_ALLOW_THREADS
    if (r != QK_OK) { qkpy_raise(r); goto done; }
    if (gy) res = Py_BuildValue("(OOOO)", (PyObject *)grad, (PyObject *)K, (PyObject *)gx, (PyObject *)gy);
    else if (gx) res = Py_BuildValue("(OOO)", (PyObject *)grad, (PyObject *)K, (PyObject *)gx);
    else res = Py_BuildValue("(OO)", (PyObject *)grad, (PyObject *)K);
done:
    Py_XDECREF(grad);
    Py_XDECREF(K);
    Py_XDECREF(gx);
    Py_XDECREF(gy);
    return res;
}

/* ---- projected ---- */
/* qk_gram_projected into a new float64 array, on a context of (device, threads) as gram's
   (qkpy_ctx_get: the CPU engine, or the CUDA engine's first GPU), on the path asked for
   (QK_PATH_DEFAULT: as qk_gram chooses; QK_PATH_MPS; QK_PATH_COMPLEX: the statevector). */
static PyObject *qkpy_gram_projected(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"map", "x", "y", "gamma", "threads", "device", "path", NULL};
    PyObject *mapo, *xo, *yo = Py_None;
    PyArrayObject *x, *y = NULL, *K;
    qkpy_Map *map;
    qk_ctx *ctx;
    qk_gram_desc g;
    qk_result r;
    npy_intp dims[2];
    double gamma;
    int threads = 0, device = QK_DEVICE_CPU, path = QK_PATH_DEFAULT;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOd|iii:_gram_projected", kwlist, &qkpy_MapType, &mapo, &xo, &yo, &gamma, &threads,
                                     &device, &path)) return NULL;
    map = (qkpy_Map *)mapo;
    if (qkpy_check_xy(xo, yo, map->map->n_features, &x, &y) < 0) return NULL;
    if (qkpy_check_device_precision(device, QK_PRECISION_DEFAULT) < 0) return NULL;
    if (path != QK_PATH_DEFAULT && path != QK_PATH_COMPLEX && path != QK_PATH_MPS)
        return PyErr_Format(PyExc_ValueError, "unknown path %d (QK_PATH_DEFAULT, QK_PATH_COMPLEX or QK_PATH_MPS)", path);
    if (threads < 0) return PyErr_Format(PyExc_ValueError, "threads must be >= 1 (got %d)", threads);
    dims[0] = PyArray_DIM(x, 0);
    dims[1] = y ? PyArray_DIM(y, 0) : dims[0];
    K = (PyArrayObject *)PyArray_SimpleNew(2, dims, NPY_DOUBLE);
    if (!K) return NULL;
    threads = qkpy_threads_for(threads);
    if (!(ctx = qkpy_ctx_get(device, threads))) { Py_DECREF(K); return NULL; }
    memset(&g, 0, sizeof g);
    g.x = (const double *)PyArray_DATA(x); g.n_x = dims[0];
    g.y = y ? (const double *)PyArray_DATA(y) : NULL; g.n_y = y ? dims[1] : 0;
    g.out = PyArray_DATA(K); g.out_dtype = QK_F64;
    g.path = (qk_path)path;
    Py_BEGIN_ALLOW_THREADS
    r = qk_gram_projected(ctx, map->map, &g, gamma);
    Py_END_ALLOW_THREADS
    qkpy_ctx_give(ctx, device, threads);
    if (r != QK_OK) { Py_DECREF(K); return qkpy_raise(r); }
    return (PyObject *)K;
}

/* ---- engine ---- */
static PyObject *qkpy_engine(PyObject *mod, PyObject *noargs)
{
    int devices = 0;
    (void)mod; (void)noargs;
#if defined(QK_CUDA) && QK_CUDA
    Py_BEGIN_ALLOW_THREADS
    devices = qk_cuda_device_count();
    Py_END_ALLOW_THREADS
    if (devices < 0) devices = 0;
    return Py_BuildValue("{s:s,s:O,s:i,s:s}", "version", QK_VERSION_STRING, "cuda_engine", Py_True, "cuda_devices", devices, "cpu_isa",
                         qk_cpu_isa());
#else
    return Py_BuildValue("{s:s,s:O,s:i,s:s}", "version", QK_VERSION_STRING, "cuda_engine", Py_False, "cuda_devices", devices, "cpu_isa",
                         qk_cpu_isa());
#endif
}

static PyObject *qkpy_last_gram_seconds(PyObject *mod, PyObject *noargs)
{
    (void)mod; (void)noargs;
    return PyFloat_FromDouble(qkpy_last_gram_s);
}

static PyObject *qkpy_py_get_num_threads(PyObject *mod, PyObject *noargs)
{
    (void)mod; (void)noargs;
    return PyLong_FromLong(qkpy_get_num_threads());
}

static PyObject *qkpy_py_set_num_threads(PyObject *mod, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    (void)mod;
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > 4096) return PyErr_Format(PyExc_ValueError, "threads must be in 1..4096, or 0 for no limit (got %ld)", n);
    qkpy_set_num_threads((int)n);
    Py_RETURN_NONE;
}

static PyObject *qkpy_py_last_threads(PyObject *mod, PyObject *noargs)
{
    (void)mod; (void)noargs;
    return PyLong_FromLong(qkpy_last_threads);
}

static PyMethodDef qkpy_methods[] = {
    {"gram", (PyCFunction)(void (*)(void))qkpy_gram, METH_VARARGS | METH_KEYWORDS,
     "gram(map, x, y=None, out=None, device=0, precision=0, threads=0, out_path=None, tol=0.0): qk_gram into out\n"
     "(or a new array; returned) or into the .npy file out_path (QK_OUTPUT_NPY; returns None)"},
    {"_gram_states", (PyCFunction)(void (*)(void))qkpy_gram_states_raw, METH_VARARGS | METH_KEYWORDS,
     "_gram_states(a, n_a, lda, b, n_b, ldb, dim, type, on_device, device, precision, threads, normalize, norm_tol, out_path=None): "
     "qk_gram_states on raw pointers (qk.gram_states resolves the arrays)"},
    {"_gram_mps", (PyCFunction)(void (*)(void))qkpy_gram_mps_raw, METH_VARARGS | METH_KEYWORDS,
     "_gram_mps(a, a_bonds, n_a, b, b_bonds, n_b, n_sites, type, layout, device, precision, threads, normalize, norm_tol, "
     "out_path=None): qk_gram_mps_states on raw pointer and bond arrays (qk.gram_mps resolves the tensors)"},
    {"_gram_vjp", (PyCFunction)(void (*)(void))qkpy_gram_vjp, METH_VARARGS | METH_KEYWORDS,
     "_gram_vjp(map, x, y, g, threads=0, data=0): (dL/dw, K[, dL/dX[, dL/dY]]) for G = dL/dK (qk_gram_vjp)"},
    {"_gram_projected", (PyCFunction)(void (*)(void))qkpy_gram_projected, METH_VARARGS | METH_KEYWORDS,
     "_gram_projected(map, x, y, gamma, threads=0, device=QK_DEVICE_CPU, path=QK_PATH_DEFAULT): the projected quantum kernel\n"
     "(qk_gram_projected) as a new float64 array"},
    {"engine", qkpy_engine, METH_NOARGS, "engine(): {'version', 'cuda_engine', 'cuda_devices', 'cpu_isa'}"},
    {"_last_gram_seconds", qkpy_last_gram_seconds, METH_NOARGS, "wall time of the last qk_gram call (benchmarks)"},
    {"get_num_threads", qkpy_py_get_num_threads, METH_NOARGS, "get_num_threads(): the threads of a call that names none (the limit, or all cores)"},
    {"set_num_threads", qkpy_py_set_num_threads, METH_O, "set_num_threads(n): the threads of calls that name none (0: no limit)"},
    {"_last_threads", qkpy_py_last_threads, METH_NOARGS, "n_threads of the qk context of the last gram() / states() call (qk_ctx_query)"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef qkpy_module = {
    PyModuleDef_HEAD_INIT, "_qk", "qk's extension module (qk.h); use the qk package", -1, qkpy_methods,
    NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__qk(void)
{
    PyObject *m;
    import_array();
    if (PyType_Ready(&qkpy_MapType) < 0) return NULL;
    qkpy_ctx_pid = qkpy_pid();
    {   /* qk's default thread count: what a context of n_threads = 0 resolves to */
        qk_ctx_desc cd;
        qk_ctx *c = NULL;
        memset(&cd, 0, sizeof cd);
        cd.device = QK_DEVICE_CPU;
        if (qk_ctx_create(&cd, &c) == QK_OK) { qkpy_cores = qk_ctx_query(c).n_threads; qk_ctx_destroy(c); }
        if (qkpy_cores < 1) qkpy_cores = 1;
    }
    if (Py_AtExit(qkpy_ctx_clear) < 0) { /* no slot left: the contexts are left to the OS at exit */ }
    m = PyModule_Create(&qkpy_module);
    if (!m) return NULL;
    Py_INCREF(&qkpy_MapType);
    if (PyModule_AddObject(m, "Map", (PyObject *)&qkpy_MapType) < 0) { Py_DECREF(&qkpy_MapType); Py_DECREF(m); return NULL; }
#define QKPY_CONST(name) if (PyModule_AddIntConstant(m, #name, name) < 0) { Py_DECREF(m); return NULL; }
    QKPY_CONST(QK_OP_H) QKPY_CONST(QK_OP_X) QKPY_CONST(QK_OP_Y) QKPY_CONST(QK_OP_Z)
    QKPY_CONST(QK_OP_RX) QKPY_CONST(QK_OP_RY) QKPY_CONST(QK_OP_RZ) QKPY_CONST(QK_OP_P)
    QKPY_CONST(QK_OP_CNOT) QKPY_CONST(QK_OP_CZ) QKPY_CONST(QK_OP_RZZ)
    QKPY_CONST(QK_ARG_CONST) QKPY_CONST(QK_ARG_X) QKPY_CONST(QK_ARG_XX) QKPY_CONST(QK_ARG_PIXX)
    QKPY_CONST(QK_ARG_W) QKPY_CONST(QK_ARG_WX)
    QKPY_CONST(QK_DEVICE_AUTO) QKPY_CONST(QK_DEVICE_CPU) QKPY_CONST(QK_DEVICE_CUDA)
    QKPY_CONST(QK_PRECISION_DEFAULT) QKPY_CONST(QK_PRECISION_FP32) QKPY_CONST(QK_PRECISION_FP64)
    QKPY_CONST(QK_PRECISION_TF32) QKPY_CONST(QK_PRECISION_FP32X3) QKPY_CONST(QK_PRECISION_FP16) QKPY_CONST(QK_PRECISION_AUTO)
    QKPY_CONST(QK_STATE_C128)
    QKPY_CONST(QK_MPS_LPR)
    QKPY_CONST(QK_MPS_LRP)
    QKPY_CONST(QK_STATE_C64)
    QKPY_CONST(QK_STATE_F64)
    QKPY_CONST(QK_STATE_F32)
    QKPY_CONST(QK_MAX_STATE_QUBITS)
    QKPY_CONST(QK_PATH_DEFAULT) QKPY_CONST(QK_PATH_COMPLEX) QKPY_CONST(QK_PATH_MPS)
#undef QKPY_CONST
    return m;
}
