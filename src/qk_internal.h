/* >>internal ---- what the sources share: includes, config macros, types, each source's internal functions ---- */
/* src/qk_internal.h — the internal header of qk's implementation (not installed, not for users).

   qk is developed as one C file per subsystem (the .c files of src/) and shipped as one header:
   the generator (src/amalgamate.py) inlines this header and then the sources, in the order of
   src/qk_unity.h, into qk.h, where every internal function is static. In development each source is also its own
   translation unit (the development build: meson's test tu-compile, and -Ddev=true, which runs
   the CPU suite against a library of the sources; docs/vendoring.md, "Developing qk"), and then a
   source sees only what this header declares: the config macros and the types more than one
   source uses, and, per source, the internal functions (and data) that later sources call.

   The layering is checked by the compiler: the translation unit of a source is compiled with
   QK__LAYER set to its place in the order (QK__L_<SOURCE> below, -DQK__LAYER=QK__L_MAP for
   src/map.c), and the section of a source is seen only by that source and those after it, so a
   call into a later source does not compile (implicit declaration, an error at -Werror), nor a
   call into a source's function it does not export (static there). In qk.h (QK_IMPLEMENTATION)
   every section is seen, in order, before the first source.

   To export a function to later sources: mark its definition QK__PRIV instead of static and
   declare it in its source's section here (the development build compiles with
   -Wmissing-prototypes, so a QK__PRIV function without its declaration fails). QK__PRIV is
   static in qk.h and external (hidden) in the development build. Data: the definition is
   QK__PRIV too, the declaration (extern) is for the development build only (#ifndef
   QK_IMPLEMENTATION), since C++ does not take a static object's declaration before its
   definition. A type or macro that a later source uses lives here, in its source's section. */
#ifndef QK_INTERNAL_H
#define QK_INTERNAL_H
#ifndef QK_IMPLEMENTATION /* a source compiled alone (the development build): qk.h's declarations */
#include "qk_unity.h"
#endif

/* The sources in their order (src/qk_unity.h's; amalgamate.py --check compares the two). */
#define QK__L_PROF 1
#define QK__L_BASE 2
#define QK__L_MPS_PROG 3
#define QK__L_MAP 4
#define QK__L_MAP_PARSE 5
#define QK__L_CPU_POOL 6
#define QK__L_CPU_STATES 7
#define QK__L_CPU_GRAM 8
#define QK__L_IO 9
#define QK__L_SINK_NPY 10
#define QK__L_CPU_STREAM 11
#define QK__L_CPU_RUN 12
#define QK__L_SCHEDULE 13
#define QK__L_ENGINE_MPS 14
#define QK__L_TUNE 15
#define QK__L_PLAN 16
#define QK__L_CTX 17
#define QK__L_RUN_CUDA 18
#define QK__L_GRAM 19
#define QK__L_VJP 20
#define QK__L_RUN_MPI 21
#define QK__L_ALL 22

#if defined(QK_IMPLEMENTATION)
#define QK__LAYER QK__L_ALL
#define QK__PRIV static
#else
#if !defined(QK__LAYER)
#error "qk_internal.h: a source compiled alone needs -DQK__LAYER=QK__L_<SOURCE> (its place in src/qk_unity.h), or QK_IMPLEMENTATION (all of qk.h)"
#endif
#if defined(QK_STATIC)
#error "qk_internal.h: QK_STATIC is for qk.h (the amalgamation), not for sources compiled one by one"
#endif
#if defined(__GNUC__) || defined(__clang__)
#define QK__PRIV __attribute__((visibility("hidden")))
#else
#define QK__PRIV
#endif
#endif
/* A function kept out of line: a private map type read through its embedded qk_map (the given
   MPS, qk__mpsmap) where gcc, having inlined the callee into a caller that allocated a plain
   qk_map, would see the read past that allocation (-Warray-bounds at -O3) on a path the map's op
   kind rules out. */
#if defined(__GNUC__) || defined(__clang__)
#define QK__NOINLINE __attribute__((noinline))
#else
#define QK__NOINLINE
#endif

/* ---- prof.c: qk's own profiler zones (qk_prof.h, or no-op zone macros) ---- */
#if QK__LAYER >= QK__L_PROF
#if defined(QK_PROF_ENABLE)
#if defined(QK_IMPLEMENTATION) && !defined(QK_PROF_IMPLEMENTATION)
#error "qk.h: QK_PROF_ENABLE with QK_IMPLEMENTATION: define QK_PROF_IMPLEMENTATION in this file too, before including qk.h, and in no other file (qk.h, 'The profiler and the two implementation defines')"
#endif
#if defined(QK_CUDA) && QK_CUDA && !defined(QK_PROF_CUDA)
#define QK_PROF_CUDA
#endif
#include "qk_prof.h"
#elif defined(QK_PROF_H)
/* qk_prof.h already included: its disabled macros serve */
#elif defined(__has_include)
#if __has_include("qk_prof.h")
#include "qk_prof.h"
#endif
#endif
#if !defined(QK_PROF_ENABLE) && !defined(QK_PROF_H)
/* qk.h alone (no qk_prof.h): the zone macros qk uses compile to nothing. The replacement lists
   are qk_prof.h's disabled ones, token for token, so a later include of qk_prof.h redefines them
   identically (no warning). */
#define QK_PROF_ENABLED 0
#define QK_PROF_U_(x) ((void)sizeof(x))
#define QK_PROF_BEGIN(name) QK_PROF_U_(name)
#define QK_PROF_END(name) QK_PROF_U_(name)
#define QK_PROF_THREAD_NAME(name) QK_PROF_U_(name)
#define QK_PROF_COUNTER(name, value) (QK_PROF_U_(name), QK_PROF_U_(value))
#define QK_PROF_COUNT(name, delta) (QK_PROF_U_(name), QK_PROF_U_(delta))
#define QK_PROF_TRACK(name, ptr, bytes) (QK_PROF_U_(name), QK_PROF_U_(ptr), QK_PROF_U_(bytes))
#define QK_PROF_UNTRACK(ptr) QK_PROF_U_(ptr)
#endif
/* the hook table handed to the CUDA engine (qk_cuda_io.prof), NULL where the profiler is off */
#if defined(QK_CUDA) && QK_CUDA && defined(QK_PROF_ENABLE)
#ifndef QK_IMPLEMENTATION
extern QK__PRIV const qk_cuda_prof_hooks qk__prof_cuda_hooks;
#endif
#define QK__PROF_CUDA_HOOKS (&qk__prof_cuda_hooks)
#else
#define QK__PROF_CUDA_HOOKS NULL
#endif
#endif /* prof.c */

/* ---- base.c: includes, config macros, the allocator, errors ---- */
#if QK__LAYER >= QK__L_BASE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <errno.h>

#ifndef QK_ASSERT
#include <assert.h>
#define QK_ASSERT(c) assert(c)
#endif

/* The allocator: stb's macros, QK_MALLOC / QK_REALLOC / QK_FREE (define all three before the
   implementation include, or none: malloc, realloc, free), behind qk__malloc, qk__calloc,
   qk__realloc and qk__free, the one path of every host allocation of the library. Why the
   macros and not an allocator in a desc (sokol's way): most of qk's allocations happen where no
   context is in reach (qk_map_*, the readers and qk_array_free, the autotune cache, the work
   schedule), and the CPU engine's worker threads allocate their scratch, so the allocator must
   be reachable everywhere and thread-safe, which a compile-time one is by contract (as malloc);
   the fault-injection test (tests/core/test_alloc_fail.c) overrides them to fail every allocation in
   turn. qk_ctx_desc.allocator stays for the programs that set it: it serves the context's own
   blocks (the qk_ctx, its thread pool) through qk__alloc_with / qk__free_with. */
#if defined(QK_MALLOC) && defined(QK_FREE) && defined(QK_REALLOC)
/* caller's allocator */
#elif !defined(QK_MALLOC) && !defined(QK_FREE) && !defined(QK_REALLOC)
#define QK_MALLOC(sz) malloc(sz)
#define QK_REALLOC(p, sz) realloc(p, sz)
#define QK_FREE(p) free(p)
#else
#error "qk.h: define all of QK_MALLOC, QK_REALLOC and QK_FREE, or none"
#endif

#if defined(__cplusplus)
#define QK__TLS thread_local
#elif defined(_MSC_VER)
#define QK__TLS __declspec(thread)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define QK__TLS _Thread_local
#else
#define QK__TLS __thread
#endif

#if !defined(QK_NO_THREADS) && (defined(_WIN32) || !(defined(__GNUC__) || defined(__clang__)))
#define QK_NO_THREADS /* the CPU engine's thread pool needs pthreads and GCC/Clang atomics */
#endif
#ifndef QK_NO_THREADS
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

/* The thread shim: a mutex, a condition variable and a joinable thread, pthreads or, under
   QK_NO_THREADS, no-ops (a lock always succeeds; a thread never starts, so the caller runs the
   function itself, and a condition is never waited on: only a started thread waits):
       if (!qk__thread_start(&t, fn, arg)) fn(arg);   ...   if (started) qk__thread_join(t);
   Every engine (the CPU pool, the streamed writers, the .npy syncer, several GPUs, MPI) takes its
   locks and starts its threads through it, so the call sites have no #ifdef; QK__THREADS is 0
   where a thread that cannot start means "run it here" rather than a failure. */
#ifndef QK_NO_THREADS
#define QK__THREADS 1
typedef pthread_mutex_t qk__mutex;
typedef pthread_t qk__thread;
static inline int qk__mutex_init(qk__mutex *m) { return pthread_mutex_init(m, NULL); }   /* 0: ok */
static inline void qk__mutex_destroy(qk__mutex *m) { pthread_mutex_destroy(m); }
static inline void qk__mutex_lock(qk__mutex *m) { pthread_mutex_lock(m); }
static inline int qk__mutex_trylock(qk__mutex *m) { return pthread_mutex_trylock(m) == 0; }   /* 1: taken */
static inline void qk__mutex_unlock(qk__mutex *m) { pthread_mutex_unlock(m); }
typedef pthread_cond_t qk__cond;
static inline int qk__cond_init(qk__cond *c) { return pthread_cond_init(c, NULL); }   /* 0: ok */
static inline void qk__cond_destroy(qk__cond *c) { pthread_cond_destroy(c); }
static inline void qk__cond_wait(qk__cond *c, qk__mutex *m) { pthread_cond_wait(c, m); }
static inline void qk__cond_signal(qk__cond *c) { pthread_cond_signal(c); }
static inline void qk__cond_broadcast(qk__cond *c) { pthread_cond_broadcast(c); }
static inline int qk__thread_start(qk__thread *t, void *(*fn)(void *), void *arg) { return pthread_create(t, NULL, fn, arg) == 0; }
static inline void qk__thread_join(qk__thread t) { pthread_join(t, NULL); }
static inline void qk__yield(void) { sched_yield(); }
static inline long qk__pid(void) { return (long)getpid(); }
static inline qk__thread qk__thread_self(void) { return pthread_self(); }
static inline int qk__thread_is_self(qk__thread t) { return pthread_equal(pthread_self(), t) != 0; }
#else
#define QK__THREADS 0
typedef struct qk__mutex { char unused; } qk__mutex;
typedef int qk__thread;
static inline int qk__mutex_init(qk__mutex *m) { (void)m; return 0; }
static inline void qk__mutex_destroy(qk__mutex *m) { (void)m; }
static inline void qk__mutex_lock(qk__mutex *m) { (void)m; }
static inline int qk__mutex_trylock(qk__mutex *m) { (void)m; return 1; }
static inline void qk__mutex_unlock(qk__mutex *m) { (void)m; }
typedef struct qk__cond { char unused; } qk__cond;   /* waited on only where a thread started */
static inline int qk__cond_init(qk__cond *c) { (void)c; return 0; }
static inline void qk__cond_destroy(qk__cond *c) { (void)c; }
static inline void qk__cond_wait(qk__cond *c, qk__mutex *m) { (void)c; (void)m; }
static inline void qk__cond_signal(qk__cond *c) { (void)c; }
static inline void qk__yield(void) {}
static inline long qk__pid(void) { return 0; }
static inline void qk__cond_broadcast(qk__cond *c) { (void)c; }
static inline int qk__thread_start(qk__thread *t, void *(*fn)(void *), void *arg) { (void)fn; (void)arg; *t = 0; return 0; }
static inline void qk__thread_join(qk__thread t) { (void)t; }
static inline qk__thread qk__thread_self(void) { return 0; }
static inline int qk__thread_is_self(qk__thread t) { (void)t; return 1; }
#endif

#define QK__PI 3.14159265358979323846
#define QK__UNUSED(x) ((void)(x))
/* The CPU engine's lanes: the columns of a Gram micro-kernel (cpu_gram.c), the samples of an MPS
   group (mps_prog.c, engine_mps.c): 8 doubles, one zmm with AVX-512. */
#define QK__NJ 8

#define QK__ESC_ARG_MAX 200
#define QK__ESC_ARG_SIZE (4 * QK__ESC_ARG_MAX + 32)

QK__PRIV int qk__def_i(int v, int d);                 /* v, or d where v is 0 */
QK__PRIV double qk__def_d(double v, double d);
QK__PRIV void *qk__malloc(size_t n);                  /* QK_MALLOC, never of 0 bytes */
QK__PRIV void *qk__calloc(size_t count, size_t size);
QK__PRIV void *qk__realloc(void *p, size_t n);         /* QK_REALLOC, never to 0 bytes */
QK__PRIV void qk__free(void *p);                       /* QK_FREE */
QK__PRIV void *qk__alloc_with(const qk_allocator *a, size_t n);   /* the context's blocks */
QK__PRIV void qk__free_with(const qk_allocator *a, void *p);
QK__PRIV const char *qk__esc(char *buf, size_t size, const char *s, size_t n, size_t max);
QK__PRIV const char *qk__esc_arg(char *buf, size_t size, const char *s);
QK__PRIV void qk__esc_msg(char *dst, size_t size, const char *src);
#ifndef QK_IMPLEMENTATION
extern QK__PRIV QK__TLS char qk__errbuf[512];         /* the detail message (qk_last_error) */
#endif
QK__PRIV void qk__set_error(const char *fmt, ...);
QK__PRIV qk_result qk__fail(qk_result r, const char *fmt, ...);
QK__PRIV int qk__prec_f32(qk_precision p);
#endif /* base.c */

/* ---- mps_prog.c: the MPS program (sites, bond bounds, steps) ---- */
#if QK__LAYER >= QK__L_MPS_PROG
#define QK__MPS_SAT (1 << 30)      /* bounds saturate here (an unusable map) */
#define QK__MPS_SET 8              /* distinct qubits per side tracked per bond and run */

enum { QK__MPS_CNOT = 1, QK__MPS_CZ, QK__MPS_RZZ, QK__MPS_PARITY };

typedef struct qk__mps_step {
    int kind;           /* 1: one-qubit op on site s0; 2: two-qubit op on sites s0 < s1 */
    int op;             /* op index (its angle; PARITY: the middle diagonal op) */
    int s0, s1;
    int gate;           /* two-qubit: QK__MPS_CNOT, CZ, RZZ, PARITY */
    int proj_left;      /* two-qubit: the projector side (the op's q0) is site s0 */
    int64_t b;          /* two-qubit: index into bounds of bonds s0+1 .. s1 after this step */
} qk__mps_step;

typedef struct qk__mps_prog {
    int q, n_steps, folded, span, dense;
    int chi;            /* largest bond bound (QK__MPS_SAT when the walk stopped early) */
    int chi_bond;       /* where: the bond between sites chi_bond-1 and chi_bond */
    int *order;         /* q: site -> qubit */
    int *D;             /* q+1: bond dimensions; D[0] = D[q] = 1, D[b] between sites b-1 and b */
    int64_t *off;       /* q+1: doubles from a group's start to site s (lane layout) */
    int64_t group;      /* doubles per group of QK__NJ samples */
    double pair_flops;  /* real flops per overlap (4 per complex multiply-add) */
    qk__mps_step *steps;
    int *bounds;
    int64_t n_bounds;
    int exact_chi;      /* the circuit's bound (chi is capped at max_bond when truncating) */
    int max_bond;       /* truncation (qk_gram_desc.mps_max_bond, mps_cutoff): 0 and 0 = exact */
    double cutoff;
    int given;          /* the MPS are given (qk_gram_mps_states): packed, not built; no steps */
} qk__mps_prog;

/* qk_gram_mps_states' map (QK__OP_MPS, qk_engine.h): the map first (the engines' map pointer is
   this). The tensors stay the caller's; D and scale are made and checked by gram.c. */
typedef struct qk__mpsmap {
    qk_map map;
    qk_op op;
    qk_mps_states_desc in;  /* the caller's, defaults resolved (type, norm_tol) */
    int *D;                 /* n_sites + 1: the largest bond over every sample of both sides */
    double *scale;          /* n_a + n_b: each sample's factor on every site (1, or ||psi||^(-1/q)) */
    char side[2];           /* the Gram's x and y point here */
} qk__mpsmap;

QK__PRIV void qk__mps_prog_free(qk__mps_prog *p);
QK__PRIV qk_result qk__mps_prog_make_t(const qk_map *m, int max_bond, double cutoff, qk__mps_prog *p);
QK__PRIV qk_result qk__mps_prog_make(const qk_map *m, qk__mps_prog *p);
QK__PRIV int qk__mps_bond_of(const qk_map *m);
#endif /* mps_prog.c */

/* ---- map.c: maps; numbers in C syntax whatever the locale ---- */
#if QK__LAYER >= QK__L_MAP
typedef struct qk__radix { char s[8]; size_t n; } qk__radix;   /* s: NUL-terminated */
typedef struct qk__ops {
    qk_op *ops;
    int n, cap;
    int oom;
} qk__ops;

QK__PRIV void qk__radix_init(qk__radix *r);
QK__PRIV const char *qk__fmt_g(char *buf, size_t size, double v, int prec);
QK__PRIV int qk__fmt_angle(const qk_angle *a, char *buf, size_t size);
QK__PRIV int qk__ci_eq(const char *s, size_t n, const char *word);
QK__PRIV size_t qk__num_len(const char *s, size_t n, int special);
QK__PRIV int qk__strtod_c(const char *s, size_t n, const qk__radix *rx, double *v);
QK__PRIV void qk__push(qk__ops *l, qk_op_kind kind, int q0, int q1, qk_angle a);
QK__PRIV qk_angle qk__ang(qk_arg_kind kind, int x0, int x1, int w, double scale, double offset);
QK__PRIV qk_angle qk__noang(void);

/* qk_gram_states' map (QK__OP_STATE, qk_engine.h): the map first, so that the engines' map
   pointer is this; with a provider the Gram's x and y are &smap->side[0] and &side[1], which the
   state builders hand to the provider as the side and never read. */
typedef struct qk__smap {
    qk_map map;
    qk_op op;
    qk_states_desc in;      /* the caller's, defaults resolved (lda, ldb, norm_tol, type) */
    int q;
    char side[2];
    void *buf;              /* provider rows: chunk rows of ld elements */
    void *pa, *pb;          /* packed copies of a and b (rows not whole doubles apart, or unaligned) */
    void *dev_pure;         /* a pure device side against device matrices: it as |psi><psi| on the device */
    int64_t ld, chunk;
    const char *fn;         /* the entry point, which begins the messages (qk_gram_states, qk_gram_mpi_states) */
    /* A provider's tags: the Gram's x tag (&side[0]) asks for rows of side tag_side[0] from row
       tag_row0[0] on, its y tag (&side[1]) for side tag_side[1] from tag_row0[1] (qk__smap_make:
       {0, 1} and {0, 0}; qk_gram_mpi_states points them at a sub-job's block of K). rows_fn (when
       set) sees each chunk the provider gave, after its check, and may fail it (error set). */
    int tag_side[2];
    int64_t tag_row0[2];
    qk_result (*rows_fn)(void *user, int side, int64_t row0, int64_t n, const void *rows, int64_t ld_bytes);
    void *rows_user;
    qk_result provider_failed;  /* the provider failed, or its rows were bad (the error set) */
    /* Rows the provider already gave (and were checked): rows [cache_row0, cache_row0 + cache_n)
       of side cache_side, n_features doubles apart; asked rows inside them are copied from here,
       not asked again (qk_gram_mpi_states keeps a slab's rows for its blocks). NULL: none. */
    const char *cache;
    int cache_side;
    int64_t cache_row0, cache_n;
} qk__smap;
QK__PRIV qk_result qk__state_norm_check(const qk__smap *sm, double ss, int side, int64_t row);
QK__PRIV qk_result qk__states_check(const qk__smap *sm, const void *rows, int64_t n, int64_t ld_bytes, int side, int64_t row0);
QK__PRIV qk_result qk__smap_fetch(qk__smap *sm, int side, int64_t row0, int64_t n, void *buf);
#endif /* map.c */

/* ---- map_parse.c: the map spec parser ---- */
#if QK__LAYER >= QK__L_MAP_PARSE
QK__PRIV void qk__cat(char *buf, size_t size, size_t *len, const char *fmt, ...);
#endif /* map_parse.c */

/* ---- cpu_pool.c: the thread pool, the Gram job and its polls ---- */
#if QK__LAYER >= QK__L_CPU_POOL
typedef void (*qk__work_fn)(void *ctx, int thread);
#ifndef QK_NO_THREADS
#define QK__FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define QK__LOAD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define QK__STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#else
#define QK__FETCH_ADD(p, v) ((*(p) += (v)) - (v))
#define QK__LOAD(p) (*(p))
#define QK__STORE(p, v) (*(p) = (v))
#endif
/* a context's pool (without threads, QK_NO_THREADS: no workers, its caller runs every step) */
typedef struct qk__tpool qk__tpool;
typedef struct qk__tpool_worker { qk__tpool *pool; int index; } qk__tpool_worker;
struct qk__tpool {
    int n_workers, quit, want, busy;   /* busy: workers still running the step (atomic) */
    int spin;                          /* the caller's yields, busy read between them, before it blocks */
    long pid;                          /* the process that started the workers (qk__tpool_forked) */
    unsigned gen;
    qk__work_fn fn;
    void *arg;
    qk__mutex mu;
    qk__cond go, done;
    qk__thread th[255];
    qk__tpool_worker w[255];
};

/* The state builders (statevectors, product states, MPS) reach the job's progress callback and
   cancel flag through a qk__poll per thread: it counts the work done (amplitude updates, or an
   estimate of the flops of an MPS step) and every QK__POLL_WORK of it on thread 0, 8x that on
   the others (as the tiles poll), calls qk__job_poll (the callback, from one thread at a time,
   with the pairs done so far: building states adds none). About 1 to 10 ms of work between
   polls; a cancel stops every builder at its next op (or sample), so that a job whose states
   dominate (18-22 qubits, few samples) sees Ctrl-C in a fraction of a second too. */
#define QK__POLL_WORK ((int64_t)1 << 21)
#define QK__POLL_OP_QUBITS 14   /* statevectors: a tick per op from here, per sample below */
typedef struct qk__poll {
    struct qk__gram_job *job;   /* NULL: no polling (qk_states, the GPU engine's builds) */
    int64_t work, every;
} qk__poll;

typedef struct qk__gram_job {
    qk_path path;
    const double *A, *B;        /* states (B == A when symmetric) */
    int64_t na, nb, stride, D;  /* D: complex/real dimension, analytic: qubits */
    int symmetric;
    qk_dtype dt;
    void *out;
    int64_t ld;
    qk_output output;
    qk_tile_fn tile_fn;
    void *tile_user;
    qk_progress_fn progress;
    void *progress_user;
    int64_t tiles_i, tiles_j, n_tiles;
    /* slab mode (streamed output): only tile rows [ti_begin, ti_end) are computed, into out
       with row_base subtracted from the row index; symmetric tiles are mirrored into out only
       where the mirror lands inside the slab (rows < mirror_end), the writer does the rest */
    int64_t ti_begin, ti_end, row_base, mirror_end;
    /* state tiles (plan->bulk_states == 0): one block of K at a time, A and B the blocks'
       states; i_base, j_base: the block's first row and column in K (the callback's
       coordinates); mirror_out: where an off-diagonal block of symmetric K also goes,
       transposed (same ld), or NULL; twice: the block's pairs count twice (its mirror) */
    int64_t i_base, j_base;
    void *mirror_out;
    int twice;
    int64_t next;
    int64_t pairs_done, pairs_total;
    int cancel;                 /* 1: cancelled by a callback */
    qk_result provider_failed;  /* given states: the provider failed or its rows were bad (the error set) */
    int linear;                 /* plan.linear: K = Re <a|b> (density matrices), not |<a|b>|^2 */
    int oom;
    const void *mps;            /* QK_PATH_MPS: the MPS program (qk__mps_prog, MPS engine) */
    size_t scratch;             /* QK_PATH_MPS: per-thread scratch doubles of qk__mps_tile */
    /* QK_PATH_MPS: the MPS engine's tile (qk__mps_tile, set by the MPS engine) */
    void (*mps_tile)(const struct qk__gram_job *j, int64_t i0, int64_t j0, int64_t m, int64_t n, double *scratch, double *kt);
    int isa;                    /* the kernels' instruction set (qk__cpu_isa when the job was set up) */
    qk__mutex cb_lock;
} qk__gram_job;

QK__PRIV int qk__ncores(void);
/* The CPU kernels' instruction set (cpu_pool.c): the Gram micro-kernels, the MPS transfer
   matrices and the VJP products of a portable x86-64 build (QK__DISPATCH: GCC / Clang vector
   extensions, a target without AVX2, no QK_NO_DISPATCH) are also compiled for AVX2 + FMA and for
   AVX-512F; qk__cpu_isa says which a job uses (QK__ISA_GENERIC: the build's own code, always in
   builds without dispatch), chosen once per process (QK_CPU_ISA, else the best the CPU has) or
   by qk_cpu_isa_set. A job reads it once, when it starts. */
enum { QK__ISA_GENERIC = 0, QK__ISA_AVX2 = 1, QK__ISA_AVX512 = 2 };
#if (defined(__GNUC__) || defined(__clang__)) && !defined(QK_NO_VECTOR_EXT) && defined(__x86_64__) && !defined(__AVX2__) && \
    !defined(QK_NO_DISPATCH)
#define QK__DISPATCH 1
#endif
QK__PRIV int qk__cpu_isa(void);
QK__PRIV qk_result qk__tpool_start(qk__tpool *t, int n);
QK__PRIV void qk__tpool_stop(qk__tpool *t);
QK__PRIV void qk__tpool_run(qk__tpool *t, int n_threads, qk__work_fn fn, void *arg);
QK__PRIV int qk__tpool_forked(const qk__tpool *t);
#ifndef QK_IMPLEMENTATION
extern QK__PRIV QK__TLS qk__tpool *qk__cur_pool;      /* the calling thread's pool (qk_gram sets it) */
#endif
QK__PRIV void qk__parallel(int n_threads, qk__work_fn fn, void *ctx);
QK__PRIV void qk__job_poll(qk__gram_job *j);
QK__PRIV void qk__poll_init(qk__poll *p, qk__gram_job *job, int thread);
QK__PRIV int qk__poll_tick(qk__poll *p, int64_t work);
#endif /* cpu_pool.c */

/* ---- cpu_states.c: one sample's statevector or product state ---- */
#if QK__LAYER >= QK__L_CPU_STATES
/* Below 12 qubits the table (2^g phases, each a sum of up to g(g+1)/2 angles) costs more than
   the passes it saves (2-core CPU, zz reps=2: 2x slower at 10 qubits; 1.8x faster at 12, 3.9x at
   14, 6.3x at 16, 7.1x at 18). */
#define QK__DIAG_MIN_QUBITS 12
QK__PRIV void qk__apply(const qk_op *o, double t, const double *x, double *re, double *im, int q);
QK__PRIV size_t qk__diag_scratch(int q);
QK__PRIV void qk__state1(const qk_map *m, const double *x, double *re, double *im, double *theta, qk__poll *poll);
QK__PRIV void qk__product1(const qk_map *m, const double *x, double *out, double *theta);
#endif /* cpu_states.c */

/* ---- cpu_gram.c: states for many samples, the blocked Gram tiles ---- */
#if QK__LAYER >= QK__L_CPU_GRAM
#define QK__T 64
#define QK__NI 6
#define QK__DC 256
#define QK__TR (((QK__T + QK__NI - 1) / QK__NI) * QK__NI)   /* tile rows padded to NI */

/* The micro-kernels' vector type and its loads and stores (GCC/Clang vector extensions: cpu_gram.c) */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(QK_NO_VECTOR_EXT)
#define QK__VEC 1
typedef double qk__v8 __attribute__((vector_size(QK__NJ * sizeof(double))));
typedef double qk__v4 __attribute__((vector_size(4 * sizeof(double))));   /* slices: one AVX2 / SSE2 register */
typedef double qk__v2 __attribute__((vector_size(2 * sizeof(double))));
#if defined(__GNUC__) && !defined(__clang__)
#define QK__CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define QK__CONTRACT
#endif
#define QK__LD8(v, p) memcpy(&(v), (p), sizeof(qk__v8))
/* Stores a vector, an element of an accumulator array included, through a whole local vector.
   With memcpy straight from &acc[k] (k < 8 in an array of 8 vectors) gcc 12 under
   -fsanitize=address reported -Warray-bounds "offset [0, 63] is out of the bounds [0, 0]" in
   qk__mps_site4 (an -O2 / -O3 build; a false positive, the access is in bounds): the source of a
   copy is now a whole object of its own. */
#define QK__ST8(p, v) do { qk__v8 qk__st8_ = (v); memcpy((p), &qk__st8_, sizeof(qk__v8)); } while (0)
#define QK__ADD8(p, v) do { qk__v8 t_; memcpy(&t_, (p), sizeof t_); t_ += (v); memcpy((p), &t_, sizeof t_); } while (0)
#endif

#ifndef QK__CONTRACT
#define QK__CONTRACT   /* no vector extensions: plain loops, the compiler's own contraction */
#endif

typedef struct qk__cpu_tiles {
    const qk_map *map;
    const qk_gram_desc *desc;
    qk_path path;
    int64_t R;
    double *A, *B;
} qk__cpu_tiles;

QK__PRIV qk_path qk__path_of(const qk_map *m);
QK__PRIV int64_t qk__row_len(const qk_map *m, qk_path path);
QK__PRIV double *qk__cpu_states(const qk_map *m, const double *x, int64_t row0, int64_t n, qk_path path, int n_threads,
                                struct qk__gram_job *job);
QK__PRIV void qk__cpu_run_tiles(qk__gram_job *j, int nt);
QK__PRIV qk_result qk__cpu_row_block(const qk__cpu_tiles *t, qk__gram_job *j, int64_t i0, int64_t m, char *out,
                                     char *kbase, int nt);
#endif /* cpu_gram.c */

/* ---- io.c: .npy / .csv readers and writers, temporary files ---- */
#if QK__LAYER >= QK__L_IO
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#ifdef _WIN32
#include <io.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <process.h>
#include <windows.h>
#else
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/utsname.h> /* the host in temporary names (qk__host_tag) */
#include <dirent.h>      /* stale temporaries (qk__sweep_tmp) */
#endif

#ifdef _WIN32
#define QK__OPEN_TMP(p) _open((p), _O_WRONLY | _O_CREAT | _O_EXCL | _O_BINARY, _S_IREAD | _S_IWRITE)
#define QK__WRITE(fd, b, n) _write((fd), (b), (unsigned)(n))
#define QK__FSYNC(fd) _commit(fd)
#define QK__CLOSE(fd) _close(fd)
#define QK__GETPID() ((long)_getpid())
#define QK__RENAME(a, b) (MoveFileExA((a), (b), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH) ? 0 : (errno = EACCES, -1))
#else
#define QK__OPEN_TMP(p) open((p), O_WRONLY | O_CREAT | O_EXCL, 0666)
#define QK__WRITE(fd, b, n) write((fd), (b), (n))
#define QK__FSYNC(fd) fsync(fd)
#define QK__CLOSE(fd) close(fd)
#define QK__GETPID() ((long)getpid())
#define QK__RENAME(a, b) rename((a), (b))
#endif

QK__PRIV int qk__write_all(int fd, const void *buf, size_t n);
QK__PRIV qk_result qk__open_tmp(const char *path, char **tmp_out, int *fd_out);
QK__PRIV qk_result qk__tmp_commit(const char *tmp, const char *path, int no_sync);
QK__PRIV void qk__tmp_discard(const char *tmp);
QK__PRIV void qk__sync_dir(const char *path);
QK__PRIV qk_result qk__write_file_atomic(const char *path, const void *a, size_t na, const void *b, size_t nb);
QK__PRIV size_t qk__npy_make_header(char hdr[192], qk_dtype dtype, int64_t rows, int64_t cols);
QK__PRIV qk_result qk__npy_shape_bytes(const char *who, qk_dtype dtype, int64_t rows, int64_t cols, size_t *nbytes);
#endif /* io.c */

/* ---- sink_npy.c: the streaming .npy writer ---- */
#if QK__LAYER >= QK__L_SINK_NPY
typedef struct qk__npyw {
    int fd;
    char *tmp;              /* temporary name (QK_MALLOC) */
    const char *path;
    size_t es, hdr;
    int64_t rows, cols;
    int no_sync;
    uint64_t written;
    int *cancel;            /* optional: a job's cancel flag, read before each write */
    qk__thread syncer;
    int syncer_on, stop, sync_errno;
    uint64_t dirty;         /* bytes written since the syncer last started an fsync */
    uint64_t written_mt, synced;  /* bytes written (under mu), and covered by a finished fsync */
    qk__mutex mu;
    qk__cond cv;
} qk__npyw;

QK__PRIV qk_result qk__npyw_open(qk__npyw *w, const char *path, qk_dtype dt, int64_t rows, int64_t cols, int no_sync,
                                 int syncer);
QK__PRIV qk_result qk__npyw_at_fd(qk__npyw *w, int fd, uint64_t off, const void *buf, size_t n);
QK__PRIV qk_result qk__npyw_at(qk__npyw *w, uint64_t off, const void *buf, size_t n);
QK__PRIV qk_result qk__npyw_rows(qk__npyw *w, int64_t i0, int64_t j0, int64_t m, int64_t n, const void *src, int64_t ld);
QK__PRIV qk_result qk__npyw_commit(qk__npyw *w);
QK__PRIV void qk__npyw_abort(qk__npyw *w);
/* the output of a Gram: opened once (qk_gram), written by the executor, committed once */
typedef struct qk__sink {
    qk_output kind;         /* plan->output */
    qk_dtype dtype;         /* plan->out_dtype */
    size_t es;              /* bytes per entry of K */
    int64_t rows, cols;     /* K's shape */
    void *out;              /* HOST, DEVICE: the caller's buffer */
    int64_t ld;             /* its leading dimension (default: cols) */
    qk_tile_fn tile_fn;     /* CALLBACK */
    void *tile_user;
    qk__npyw npy;           /* NPY: the temporary file, open between qk__sink_open and close */
} qk__sink;
#if defined(QK_CUDA) && QK_CUDA
QK__PRIV qk_result qk__npyw_fd(const qk__npyw *w, int *fd);   /* another descriptor of the file (several GPUs) */
#endif
QK__PRIV qk_result qk__sink_open(qk__sink *s, const qk_plan *plan, const qk_gram_desc *desc);
QK__PRIV qk_result qk__sink_close(qk__sink *s, qk_result r);
#endif /* sink_npy.c */

/* ---- cpu_stream.c: K streamed to a .npy by the CPU engine ---- */
#if QK__LAYER >= QK__L_CPU_STREAM
QK__PRIV qk_result qk__cpu_gram_npy(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, int nt,
                                    const qk__cpu_tiles *tl, qk__npyw *w);
#endif /* cpu_stream.c */

/* ---- cpu_run.c: the CPU engine's job ---- */
#if QK__LAYER >= QK__L_CPU_RUN
QK__PRIV void qk__cpu_job_init(qk__gram_job *j, const qk_plan *plan, const qk_gram_desc *desc, const qk__sink *sink, const double *A,
                               const double *B, int64_t stride, int64_t D, const void *mps, size_t scratch);
QK__PRIV void qk__cpu_job_free(qk__gram_job *j);
QK__PRIV qk_result qk__cpu_gram_run(const qk_plan *plan, const qk_gram_desc *desc, qk__gram_job *j, const double *A, const double *B,
                                    qk__sink *sink);
QK__PRIV qk_result qk__cpu_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink);
#endif /* cpu_run.c */

/* ---- engine_mps.c: the MPS engine and the path choice ---- */
#if QK__LAYER >= QK__L_ENGINE_MPS
/* The MPS path's cost against the statevector's on the GPU engine: the statevector Gram runs on
   cuBLAS near the FP32 peak (complex GEMM, 8 real flops per complex multiply-add), the MPS chain
   (qk_cuda.cu's register kernel, pair_flops counting 4 per complex multiply-add) at an estimated
   third of the FMA peak: about 4x the statevector's time per counted flop. An estimate until
   the mps-gpu case set of bench/run.sh measures the crossover (zz reps=2 linear). */
#ifndef QK__MPS_GPU_FLOP_RATIO
#define QK__MPS_GPU_FLOP_RATIO 4.0
#endif

QK__PRIV double *qk__mps_states(const qk__mps_prog *p, const qk_map *m, const double *x, int64_t n, int n_threads,
                                double *discarded, double *eps, struct qk__gram_job *job);
QK__PRIV qk_result qk__mps_check_trunc(const qk_gram_desc *d);
QK__PRIV qk_result qk__mps_decide(const qk_map *map, const qk_gram_desc *desc, double ratio, int sv_ok, int sv_big,
                                  qk__mps_prog *prog, int *use);
QK__PRIV qk_result qk__mps_plan(const qk_map *map, const qk_gram_desc *desc, qk_plan *p, qk__mps_prog *keep);
QK__PRIV qk_result qk__mps_decide_cpu(const qk_map *map, const qk_gram_desc *desc, qk__mps_prog *prog, int *use);
QK__PRIV int qk__mps_gpu_chi(int chi);
QK__PRIV void qk__plan_job_fields(qk_plan *p, const qk_map *map, const qk_gram_desc *desc, qk_dtype od, int64_t nx, int64_t ny, int sym);
QK__PRIV qk_result qk__plan_cuda_mps(const qk_device_info *info, double vram_fraction, const qk_map *map,
                                     const qk_gram_desc *desc, const qk__mps_prog *prog, qk_plan *p);
QK__PRIV qk_result qk__mps_gram(const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink,
                                const qk__mps_prog *planned);
QK__PRIV qk_result qk__mps_prog_of(const qk__mps_prog *planned, const qk_map *map, const qk_gram_desc *desc, qk__mps_prog *own,
                                   const qk__mps_prog **out);
#endif /* engine_mps.c */

/* ---- plan.c: the planner ---- */
#if QK__LAYER >= QK__L_PLAN
QK__PRIV qk_precision qk__auto_precision(const qk_map *map, qk_path path, double tol, int wgmma, char *note, size_t size);
QK__PRIV qk_result qk__plan_cpu_nt(const qk_device_info *info, const qk_map *map, const qk_gram_desc *desc, int nt, qk_plan *p,
                                   qk__mps_prog *keep);
QK__PRIV int qk__mgpu_parts(const qk_plan *plan, int k, int64_t part[2][3]);
QK__PRIV void qk__mgpu_part_desc(const qk_plan *plan, const qk_plan_part *pp, int d, const qk_gram_desc *desc, qk_gram_desc *sd);
QK__PRIV void qk__plan_part_plan(const qk_plan *plan, int i, const char *device_name, qk_plan *sp);
QK__PRIV qk_result qk__plan_part_set(qk_plan *plan, int i, const qk_plan *sp, const char *device_name);
QK__PRIV qk_result qk__mgpu_check_parts(const qk_plan *plan);
QK__PRIV const qk_map *qk__map_for_device(const qk_map *map, int k, qk_map *tmp, qk_op *op);
QK__PRIV qk_result qk__plan_for_devices(const qk_device_info *infos, const int *ordinals, int n, double vram_fraction,
                                        const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep);
#if defined(QK_CUDA) && QK_CUDA
QK__PRIV void qk__plan_autotune(const qk_device_info *info, int mode, const char *cache_dir, qk_log_fn log,
                                void *log_user, qk_plan *plan);
#endif
#endif /* plan.c */

/* ---- ctx.c: the context ---- */
#if QK__LAYER >= QK__L_CTX
struct qk_ctx {
    qk_ctx_desc desc;           /* resolved; desc.cache_dir points at cache_dir below */
    char cache_dir[1024];
    qk_device_info dev;         /* present == 0 on the CPU engine */
    qk_cuda_stats cuda_stats;   /* the last qk_gram on the GPU engine */
    void *stage[2];             /* pinned staging kept across calls (GPU engine, host outputs) */
    size_t stage_bytes;
    int n_dev;                  /* GPUs of the context (0 on the CPU engine); dev is dev_info[0] */
    int dev_ord[QK_MAX_DEVICES];
    qk_device_info dev_info[QK_MAX_DEVICES];
    void *dstage[QK_MAX_DEVICES][2];    /* several GPUs: each one's pinned staging (its thread's) */
    size_t dstage_bytes[QK_MAX_DEVICES];
#if defined(QK_CUDA) && QK_CUDA
    qk_cuda_pool *spool[QK_MAX_DEVICES]; /* each GPU's stream pool, made on its first job there */
#endif
    int n_dev_last;             /* GPUs of the last qk_gram, and when each finished (seconds) */
    double dev_seconds[QK_MAX_DEVICES];
    qk_cuda_stats dev_stats[QK_MAX_DEVICES];   /* several GPUs: each one's (qk_ctx_device_stats) */
    qk__tpool *pool;            /* started on the first qk_gram (NULL: none, threads per step) */
    qk__tpool *gpool;           /* several GPUs: the host threads of GPUs 1.., started on the first such job */
};

QK__PRIV qk_result qk__check_gram(const qk_ctx *ctx, const qk_map *map, const qk_gram_desc *d);
QK__PRIV qk__tpool *qk__ctx_pool_of(qk_ctx *ctx, qk__tpool **slot, int n, int spin);
QK__PRIV qk__tpool *qk__ctx_pool(qk_ctx *ctx);
QK__PRIV qk_result qk__plan_make(qk_ctx *ctx, const qk_map *map, const qk_gram_desc *desc, qk_plan *out, qk__mps_prog *keep);
#endif /* ctx.c */

/* ---- run_cuda.c: the host side of the GPU engine, one GPU and several ---- */
#if QK__LAYER >= QK__L_RUN_CUDA && defined(QK_CUDA) && QK_CUDA
QK__PRIV qk_result qk__cuda_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink,
                                const qk__mps_prog *mps, qk_cuda_stats *stats);
QK__PRIV qk_result qk__mgpu_run(qk_ctx *ctx, const qk_plan *plan, const qk_map *map, const qk_gram_desc *desc, qk__sink *sink);
QK__PRIV qk_cuda_pool *qk__cuda_pool(qk_ctx *ctx, int k);
QK__PRIV int qk__ctx_stage(qk_ctx *ctx, size_t need);
#endif /* run_cuda.c */

/* ---- gram.c: qk_gram, qk_states, K from given states ---- */
#if QK__LAYER >= QK__L_GRAM
QK__PRIV qk_result qk__smap_make(qk_ctx *ctx, const qk_states_desc *states, const qk_gram_desc *desc, const char *fn, qk__smap *sm,
                                 qk_gram_desc *g);
QK__PRIV void qk__smap_free(qk__smap *sm);
#endif /* gram.c */
#endif /* QK_INTERNAL_H */
