#include "qk_internal.h"
/* >>cpu_pool ---- CPU engine: thread pool, the Gram job and its progress / cancel polls ---- */
/* ---- thread pool: a parallel-for over work items taken from an atomic counter ---- */
typedef struct qk__pool_arg { qk__work_fn fn; void *ctx; int thread; } qk__pool_arg;

static void *qk__pool_main(void *p)
{
    qk__pool_arg *a = (qk__pool_arg *)p;
    a->fn(a->ctx, a->thread);
    return NULL;
}

QK__PRIV int qk__ncores(void)
{
#ifndef QK_NO_THREADS
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > 256 ? 256 : n) : 1;
#else
    return 1;
#endif
}

/* ---- the CPU kernels' instruction set (runtime dispatch; qk_internal.h, cpu_gram.c) ---- */
/* -1 until chosen, then the level (QK__ISA_*) | the note << 4: why QK_CPU_ISA was not taken */
static int qk__isa_state = -1;
enum { QK__ISA_NOTE_NONE, QK__ISA_NOTE_UNKNOWN, QK__ISA_NOTE_LACKS, QK__ISA_NOTE_FIXED };
static const char *const qk__isa_names[3] = {"generic", "avx2", "avx512"};

#if !defined(QK__DISPATCH)
/* The name of a build's own kernels (no dispatch): its compile target's (-march) */
static const char *qk__isa_build_name(void)
{
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2";
#else
    return "generic";
#endif
}
#endif

/* The levels this build and CPU can run: bit l for QK__ISA_* l (generic always). The CPU's own
   word (__builtin_cpu_supports, which also checks that the OS saves the wider registers). */
static int qk__isa_avail(void)
{
#if defined(QK__DISPATCH)
    int m = 1;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) m |= 2;
    if ((m & 2) && __builtin_cpu_supports("avx512f")) m |= 4;
    return m;
#else
    return 1;
#endif
}

static int qk__isa_best(int avail) { return avail & 4 ? QK__ISA_AVX512 : avail & 2 ? QK__ISA_AVX2 : QK__ISA_GENERIC; }

/* generic / avx2 / avx512 -> QK__ISA_*; "auto" (or NULL, "") -> -2; else -1 */
static int qk__isa_parse(const char *s)
{
    int l;
    if (!s || !*s || !strcmp(s, "auto")) return -2;
    for (l = 0; l < 3; l++) if (!strcmp(s, qk__isa_names[l])) return l;
    return -1;
}

/* The level for a request s (QK_CPU_ISA's value, may be NULL), and why it was not taken */
static int qk__isa_pick(const char *s, int *note)
{
    const int avail = qk__isa_avail(), l = qk__isa_parse(s);
    *note = QK__ISA_NOTE_NONE;
    if (l == -2) return qk__isa_best(avail);
    if (l == -1) { *note = QK__ISA_NOTE_UNKNOWN; return qk__isa_best(avail); }
#if defined(QK__DISPATCH)
    if (!(avail >> l & 1)) { *note = QK__ISA_NOTE_LACKS; return qk__isa_best(avail); }
    return l;
#else
    if (strcmp(s, qk__isa_build_name())) *note = QK__ISA_NOTE_FIXED;
    return QK__ISA_GENERIC;
#endif
}

QK__PRIV int qk__cpu_isa(void)
{
    int st = QK__LOAD(&qk__isa_state);
    if (st < 0) {   /* the first call: QK_CPU_ISA, else the best (racing first calls agree) */
        int note = 0, want = -1;
        const int l = qk__isa_pick(getenv("QK_CPU_ISA"), &note);   /* before note is read: `|`'s operands are unsequenced */
        st = l | note << 4;
#ifndef QK_NO_THREADS
        if (!__atomic_compare_exchange_n(&qk__isa_state, &want, st, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) st = want;
#else
        (void)want;
        qk__isa_state = st;
#endif
    }
    return st & 15;
}

QKDEF const char *qk_cpu_isa(void)
{
    const int l = qk__cpu_isa();
#if defined(QK__DISPATCH)
    return qk__isa_names[l];
#else
    (void)l;
    return qk__isa_build_name();
#endif
}

QKDEF qk_result qk_cpu_isa_set(const char *isa)
{
    const int avail = qk__isa_avail();
    int l = qk__isa_parse(isa);
    char e[QK__ESC_ARG_SIZE];
    if (l == -1)
        return qk__fail(QK_ERROR_INVALID_ARGUMENT, "qk_cpu_isa_set: unknown instruction set %s (generic, avx2, avx512 or auto)",
                        qk__esc_arg(e, sizeof e, isa));
    if (l == -2) l = qk__isa_best(avail);
#if defined(QK__DISPATCH)
    else if (!(avail >> l & 1))
        return qk__fail(QK_ERROR_UNSUPPORTED, "qk_cpu_isa_set: this CPU lacks %s (%s); the kernels stay %s (the best it has: %s)",
                        qk__isa_names[l], l == QK__ISA_AVX512 ? "avx512f" : "avx2 and fma", qk_cpu_isa(), qk__isa_names[qk__isa_best(avail)]);
#else
    else if (strcmp(isa, qk__isa_build_name()))
        return qk__fail(QK_ERROR_UNSUPPORTED, "qk_cpu_isa_set: this build has no runtime dispatch: its kernels are %s, its compile "
                        "target's (-march=native or another target with AVX2, not x86-64, QK_NO_DISPATCH or QK_NO_VECTOR_EXT); "
                        "a portable x86-64 build (no -march, Meson -Dnative=false) chooses at run time", qk__isa_build_name());
    else l = QK__ISA_GENERIC;
#endif
    QK__STORE(&qk__isa_state, l);
    return QK_OK;
}

QKDEF const char *qk_cpu_isa_note(void)
{
    static QK__TLS char buf[QK__ESC_ARG_SIZE + 192];
    const int note = (qk__cpu_isa(), QK__LOAD(&qk__isa_state)) >> 4;
    char e[QK__ESC_ARG_SIZE];
    const char *v = getenv("QK_CPU_ISA");
    buf[0] = 0;
    if (note == QK__ISA_NOTE_NONE || !v) return buf;
    qk__esc_arg(e, sizeof e, v);
    if (note == QK__ISA_NOTE_UNKNOWN)
        snprintf(buf, sizeof buf, "QK_CPU_ISA=%s is not generic, avx2, avx512 or auto: the kernels use %s, the best this CPU has", e, qk_cpu_isa());
    else if (note == QK__ISA_NOTE_LACKS)
        snprintf(buf, sizeof buf, "QK_CPU_ISA=%s: this CPU lacks %s: the kernels use %s, the best it has", e,
                 !strcmp(v, "avx512") ? "avx512f" : "avx2 and fma", qk_cpu_isa());
    else
        snprintf(buf, sizeof buf, "QK_CPU_ISA=%s ignored: this build has no runtime dispatch; its kernels are %s, its compile target's", e,
                 qk_cpu_isa());
    return buf;
}

/* A context's pool of worker threads, started once (on its first qk_gram) and reused by every
   parallel step of its calls: the CPU engine's states and tiles, the GPU engine's host copy-out
   (a 1.6 GB K is 24 slabs; starting 15 threads per slab cost more than a tenth of the copy).
   qk_gram makes it the calling thread's current pool for the call; qk__parallel uses the current
   pool when there is one, else starts threads for the step. Without threads (QK_NO_THREADS) a
   pool has no workers: its caller runs every step alone. */
/* qk__tpool: in qk_internal.h */

static void *qk__tpool_main(void *p)
{
    qk__tpool_worker *w = (qk__tpool_worker *)p;
    qk__tpool *t = w->pool;
    unsigned seen = 0;
    qk__mutex_lock(&t->mu);
    for (;;) {
        while (!t->quit && t->gen == seen) qk__cond_wait(&t->go, &t->mu);
        if (t->quit) break;
        seen = t->gen;
        if (w->index < t->want) {
            qk__work_fn fn = t->fn;
            void *arg = t->arg;
            qk__mutex_unlock(&t->mu);
            fn(arg, w->index);
            qk__mutex_lock(&t->mu);
            if (QK__FETCH_ADD(&t->busy, -1) == 1) qk__cond_signal(&t->done);
        }
    }
    qk__mutex_unlock(&t->mu);
    return NULL;
}

/* Starts up to n - 1 workers (the caller is thread 0); fewer when threads cannot be started. */
QK__PRIV qk_result qk__tpool_start(qk__tpool *t, int n)
{
    int i;
    memset(t, 0, sizeof *t);
    if (qk__mutex_init(&t->mu) != 0) return QK_ERROR_OUT_OF_MEMORY;
    if (qk__cond_init(&t->go) != 0) { qk__mutex_destroy(&t->mu); return QK_ERROR_OUT_OF_MEMORY; }
    if (qk__cond_init(&t->done) != 0) {
        qk__cond_destroy(&t->go);
        qk__mutex_destroy(&t->mu);
        return QK_ERROR_OUT_OF_MEMORY;
    }
    if (n > 256) n = 256;
    t->pid = qk__pid();
    for (i = 1; i < n; i++) {
        t->w[i - 1].pool = t;
        t->w[i - 1].index = i;
        if (!qk__thread_start(&t->th[i - 1], qk__tpool_main, &t->w[i - 1])) break;
        t->n_workers = i;
    }
    return QK_OK;
}

/* 1: t was started by another process, of which this one is a fork. Its workers stayed there
   (a fork copies only the calling thread), so a step would wait for them forever, and its mutex
   may have been held by one of them at the fork: such a pool is neither run nor stopped, only
   forgotten (qk__ctx_pool_of, qk_ctx_destroy). */
QK__PRIV int qk__tpool_forked(const qk__tpool *t)
{
    return t->pid != qk__pid();
}

QK__PRIV void qk__tpool_stop(qk__tpool *t)
{
    int i;
    qk__mutex_lock(&t->mu);
    t->quit = 1;
    qk__cond_broadcast(&t->go);
    qk__mutex_unlock(&t->mu);
    for (i = 0; i < t->n_workers; i++) qk__thread_join(t->th[i]);
    qk__cond_destroy(&t->done);
    qk__cond_destroy(&t->go);
    qk__mutex_destroy(&t->mu);
}

/* fn(arg, t) for t = 0..min(n_threads, workers + 1) - 1, thread 0 the caller; returns when all have */
QK__PRIV void qk__tpool_run(qk__tpool *t, int n_threads, qk__work_fn fn, void *arg)
{
    int s;
    qk__mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->want = n_threads < t->n_workers + 1 ? n_threads : t->n_workers + 1;
    QK__STORE(&t->busy, t->want - 1);
    t->gen++;
    qk__cond_broadcast(&t->go);
    qk__mutex_unlock(&t->mu);
    fn(arg, 0);
    /* a caller that sleeps on the condition wakes up to a few tenths of a millisecond after the
       last worker signals; a pool whose steps are that short (several GPUs' shares) yields first */
    for (s = t->spin; s > 0 && QK__LOAD(&t->busy) > 0; s--) qk__yield();
    qk__mutex_lock(&t->mu);
    while (QK__LOAD(&t->busy) > 0) qk__cond_wait(&t->done, &t->mu);
    qk__mutex_unlock(&t->mu);
}

QK__PRIV QK__TLS qk__tpool *qk__cur_pool;

/* Runs fn(ctx, t) for t = 0..n_threads-1; thread 0 is the caller: on the current context's pool
   when there is one, else on threads started for the step. If a thread cannot be started, the
   threads that did start (and the caller) still drain the shared work. */
QK__PRIV void qk__parallel(int n_threads, qk__work_fn fn, void *ctx)
{
    qk__thread th[256];
    qk__pool_arg args[256];
    int i, started = 0;
    if (qk__cur_pool && n_threads > 1) { qk__tpool_run(qk__cur_pool, n_threads, fn, ctx); return; }
    if (n_threads > 256) n_threads = 256;
    for (i = 1; i < n_threads; i++) {
        args[i].fn = fn; args[i].ctx = ctx; args[i].thread = i;
        if (!qk__thread_start(&th[i], qk__pool_main, &args[i])) break;
        started = i;
    }
    fn(ctx, 0);
    for (i = 1; i <= started; i++) qk__thread_join(th[i]);
}


/* qk__poll, qk__gram_job (the job of the CPU engine and the MPS engine): in qk_internal.h */

/* The progress callback (cancel when it says so), from one thread at a time: compute thread 0
   after each tile, the state builders every few ms of work (qk__poll), and the streamed output's
   writer thread while it writes (qk.h's CPU streaming), so that a cancel is seen while the states
   are built or the writer is the bottleneck too. */
QK__PRIV void qk__job_poll(qk__gram_job *j)
{
    if (!j->progress) return;
    if (!qk__mutex_trylock(&j->cb_lock)) return;
    /* once cancelled, no more calls (another thread may have polled since this one looked) */
    if (!QK__LOAD(&j->cancel) && j->progress(QK__LOAD(&j->pairs_done), j->pairs_total, j->progress_user)) QK__STORE(&j->cancel, 1);
    qk__mutex_unlock(&j->cb_lock);
}

/* The state builders' polls (qk__poll above): thread 0 every QK__POLL_WORK, the others 8x. */
QK__PRIV void qk__poll_init(qk__poll *p, qk__gram_job *job, int thread)
{
    p->job = job;
    p->work = 0;
    p->every = thread == 0 ? QK__POLL_WORK : 8 * QK__POLL_WORK;
}

/* Counts work; polls when enough has been done since the last poll. 1: the job is cancelled. */
QK__PRIV int qk__poll_tick(qk__poll *p, int64_t work)
{
    if (!p->job) return 0;
    p->work += work;
    if (p->work >= p->every) {
        p->work = 0;
        qk__job_poll(p->job);
    }
    return QK__LOAD(&p->job->cancel) != 0;
}
