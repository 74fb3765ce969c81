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
            if (--t->busy == 0) qk__cond_signal(&t->done);
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
    for (i = 1; i < n; i++) {
        t->w[i - 1].pool = t;
        t->w[i - 1].index = i;
        if (!qk__thread_start(&t->th[i - 1], qk__tpool_main, &t->w[i - 1])) break;
        t->n_workers = i;
    }
    return QK_OK;
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

static void qk__tpool_run(qk__tpool *t, int n_threads, qk__work_fn fn, void *arg)
{
    qk__mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->want = n_threads < t->n_workers + 1 ? n_threads : t->n_workers + 1;
    t->busy = t->want - 1;
    t->gen++;
    qk__cond_broadcast(&t->go);
    qk__mutex_unlock(&t->mu);
    fn(arg, 0);
    qk__mutex_lock(&t->mu);
    while (t->busy > 0) qk__cond_wait(&t->done, &t->mu);
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
