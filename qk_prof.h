/* qk_prof.h — an embeddable CPU + GPU profiler: zones, GPU zones, memory, transfers, counters,
   text / JSON / Chrome-trace / HTML reports, NVTX. Part of qk; usable on its own.

   A single-file (stb-style) C library. In ONE C or C++ file of your program write

       #define QK_PROF_ENABLE
       #define QK_PROF_IMPLEMENTATION
       #include "qk_prof.h"

   and include "qk_prof.h" (with QK_PROF_ENABLE defined the same way) everywhere else. In a
   program that also uses qk.h with QK_PROF_ENABLE, QK_PROF_IMPLEMENTATION goes in the file that
   defines QK_IMPLEMENTATION and in no other (qk.h's rule; a file that includes qk.h and defines
   QK_PROF_IMPLEMENTATION without QK_IMPLEMENTATION is a compile-time #error). Without
   QK_PROF_ENABLE every QK_PROF_* macro expands to nothing that generates code (the disabled
   build is checked by tests/prof_codegen.py: same object code with and without the macros),
   the implementation compiles to nothing, and the types stay, so instrumented code builds
   either way. Use the macros, not the qk_prof_* functions, in code that must build both ways.

   Zones
   -----
     QK_PROF_BEGIN("name"); ... QK_PROF_END("name");      CPU zone; nests per thread
     QK_PROF_SCOPE("name");                              zone to the end of the enclosing scope
                                                         (C++, or C with GCC/Clang)
     QK_PROF_FUNC();                                     QK_PROF_SCOPE(__func__)
     QK_PROF_GPU_BEGIN("name", stream); ...              GPU zone: timed by CUDA events on that
     QK_PROF_GPU_END("name", stream);                    stream, resolved later (no sync per zone)
     QK_PROF_MEMCPY(dst, src, bytes, kind, stream)       cudaMemcpyAsync as a GPU zone that also
                                                         logs bytes, direction, pinned/pageable;
                                                         returns the cudaError_t
     QK_PROF_TRANSFER("name", dir, bytes, pinned, s)     log a transfer you timed yourself
     QK_PROF_THREAD_NAME("name"), QK_PROF_STREAM_NAME(stream, "name")   lane names in traces
     QK_PROF_GPU_COLLECT()                               resolve finished GPU zones now (never
                                                         waits); reports call it with waiting
   Names are string literals: each call site keeps a static record (qk_prof_site). Zones with
   the same name at several sites are one row in reports. QK_PROF_END's name is checked against
   the open zone; a mismatch is counted (summary.mismatched), the open zone is closed anyway.

   Memory, counters
   ----------------
     QK_PROF_TRACK("name", ptr, bytes) / QK_PROF_UNTRACK(ptr)     current and peak per name and
     QK_PROF_TRACK_SHAPE("name", ptr, bytes, "f32", ndim, shape)  per kind (host, pinned, device,
                                                                  managed: asked of CUDA when
                                                                  QK_PROF_CUDA, else host)
     QK_PROF_MEM_SNAPSHOT("label")          device free/total (cudaMemGetInfo) + tracked totals
     QK_PROF_MEMPOOL("label", pool)         cudaMemPool_t reserved/used current and high
     QK_PROF_COUNTER("name", value)         set a named series;  QK_PROF_COUNT("name", delta) adds

   Steps (>>steps)
   -----
     QK_PROF_STEP(i)          end the open step, begin step i (at the top of the step loop's body)
     QK_PROF_STEP_END()       end the open step (after the loop, so the last step counts)
   Per-step series of every zone name (its time summed over the step; CPU zones count in the step
   they end in, GPU zones in the step they begin in) and of the step time: desc.step_warmup first
   steps left out (default 1), statistics over the last desc.step_window steps (default 4096; a
   ring per zone name, so memory stays bounded): mean, min, max, p50 / p95 / p99 (sorted, linear
   interpolation), trend (least-squares slope per step, and relative to the mean), in the text /
   JSON / HTML reports (an SVG plot of the step times) and qk_prof_zone_step_stats().

   Output (each returns 0, or -1 with qk_prof_last_error(); 0 and nothing when disabled)
   ------
     QK_PROF_REPORT(path)        text tables: zones (calls, total, %, self (CPU: total less the
                                 zones nested directly in it), mean, min, max, std; CPU and
                                 GPU), streams (utilization = union of busy intervals / wall),
                                 top-N bottlenecks, memory, transfers, counters; path "-" = stdout
     QK_PROF_WRITE_JSON(path)    the same as JSON
     QK_PROF_WRITE_TRACE(path)   Chrome trace-event JSON (Perfetto, chrome://tracing): one lane per
                                 host thread (pid 1) and per GPU stream (pid 2 + device)
     QK_PROF_WRITE_HTML(path)    self-contained HTML (inline SVG; no network, no script)
   Files are written to path.tmp<pid> and renamed, so a reader never sees a half-written file;
   the temporary file is created exclusively (O_EXCL | O_NOFOLLOW): a file or symlink planted at
   its name is skipped for the next name (path.tmp<pid>.1, .2, ...), never written through.

   Configuration macros
   --------------------
     QK_PROF_ENABLE          turn the profiler on (in every TU that uses the macros)
     QK_PROF_IMPLEMENTATION  expand the implementation here (needs QK_PROF_ENABLE to emit code)
     QK_PROF_CUDA            implementation: GPU zones, transfers, device memory through the CUDA
                             runtime (include path to cuda_runtime_api.h; link cudart). Without
                             it the GPU macros are accepted and counted as ignored.
     QK_PROF_NVTX            implementation: every zone is also an NVTX range (nvtx3 headers from
                             the CUDA toolkit, header-only), so Nsight Systems shows the names
     QK_PROF_MPI             implementation: the report calls become collective over MPI_COMM_WORLD
                             (once MPI is up): rank 0 writes one report of all ranks (>>mpi);
                             qk_prof_write_local / qk_prof_write_file_local write a rank's own
     QK_PROF_NO_RDTSC        use clock_gettime(CLOCK_MONOTONIC) even where rdtsc is invariant
     QK_PROF_STATIC          private (static) functions in the implementation TU
     QK_PROF_MALLOC(sz) / QK_PROF_REALLOC(p, sz) / QK_PROF_FREE(p)   allocator, all or none
     QK_PROF_MAX_SITES       call sites (default 1024; more go to one "(other sites)" row)
     QK_PROF_MAX_DEPTH       nesting depth per thread (default 64; deeper zones are counted only)
     QK_PROF_MAX_THREADS     recording threads (default 256; later threads are counted, dropped)
     QK_PROF_MAX_LANES       GPU streams (default 64)

   Clock
   -----
   x86-64 with an invariant TSC: rdtsc, calibrated against CLOCK_MONOTONIC over the whole run
   (at least 20 ms, spun at report time for shorter runs). Elsewhere CLOCK_MONOTONIC. A clock can
   be injected for tests (qk_prof_desc.clock). GPU times come from CUDA events: durations from
   the zone's own event pair; placement on the host timeline from one base event per device,
   synchronized once when the device is first seen, chained zone to zone on each stream.

   Thread safety
   -------------
   Zones, counters, tracking and transfers may be recorded from any number of threads at once
   (CPU zones touch only the calling thread's buffers; no lock on that path; GPU zones take the
   calling thread's own uncontended lock). Events beyond a thread's buffer are dropped and
   counted; statistics stay exact. Reports may be written while other threads record, but zones
   ending meanwhile may be missing. qk_prof_init / qk_prof_shutdown are not thread-safe: call
   them while no other thread records. GPU zones of one thread must stay on one CUDA device
   (one host thread per device is the usual multi-GPU pattern). Do not open GPU zones on a stream
   that is being captured into a CUDA graph; put them around the graph launch.

   Contents (grep for a tag to jump to its section)
   --------
     >>types     public types: sites, desc, stats, summary
     >>api       qk_prof_* functions (prefer the macros)
     >>macros    QK_PROF_* macros, enabled and disabled forms
     >>config    implementation: includes, allocator, limits
     >>state     per-thread buffers, GPU queues, global state
     >>clock     rdtsc / clock_gettime and calibration
     >>threads   init, thread registration, call sites
     >>zones     CPU zones (the hot path)
     >>counters  counters          >>memory  memory tracking, snapshots, pools
     >>gpu       GPU zones: CUDA events, resolution, memcpy
     >>shutdown  freeing everything
     >>model     the report model: rows, streams, transfers; statistics queries
     >>writers   locale-free printf and escaping for every output
     >>text      text report       >>json  JSON report      >>trace  Chrome trace
     >>html      HTML report, a function per chart and per table
     >>steps     step markers (recording)   >>steps-report  step statistics in the reports
     >>mpi       MPI-wide reports (QK_PROF_MPI)
     >>output    qk_prof_write, qk_prof_write_file (temporary file + rename)
     >>license

   License: MIT (end of file).
*/
#ifndef QK_PROF_H
#define QK_PROF_H

/* The implementation needs clock_gettime: in a strict -std=c99/c11 TU ask for POSIX (plus the
   glibc defaults) before the first system header. Where other headers came first, it falls
   back to C11 timespec_get (see "clock" in the implementation). */
#if defined(QK_PROF_IMPLEMENTATION) && defined(QK_PROF_ENABLE) && !defined(_GNU_SOURCE) && \
    !defined(_DEFAULT_SOURCE) && !defined(_POSIX_C_SOURCE) && !defined(_XOPEN_SOURCE)
#define _DEFAULT_SOURCE 1
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef QK_PROF_DEF
#ifdef QK_PROF_STATIC
#define QK_PROF_DEF static
#else
#define QK_PROF_DEF extern
#endif
#endif

#ifndef QK_PROF_MAX_SITES
#define QK_PROF_MAX_SITES 1024
#endif
#ifndef QK_PROF_MAX_DEPTH
#define QK_PROF_MAX_DEPTH 64
#endif
#ifndef QK_PROF_MAX_THREADS
#define QK_PROF_MAX_THREADS 256
#endif
#ifndef QK_PROF_MAX_LANES
#define QK_PROF_MAX_LANES 64
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* >>types ---- types (present in every build) ---- */
typedef enum qk_prof_site_kind {
    QK_PROF_SITE_CPU = 0,
    QK_PROF_SITE_GPU,
    QK_PROF_SITE_COUNTER
} qk_prof_site_kind;

/* One per call site, static, zero-initialised apart from the constant fields. */
typedef struct qk_prof_site {
    const char *name;
    const char *file;
    int line;
    int kind;               /* qk_prof_site_kind */
    uint32_t id;            /* 0 until first use; then an index into per-thread tables */
} qk_prof_site;

typedef enum qk_prof_dir {
    QK_PROF_DIR_NONE = 0,
    QK_PROF_H2D,
    QK_PROF_D2H,
    QK_PROF_D2D,
    QK_PROF_H2H
} qk_prof_dir;

typedef enum qk_prof_format {
    QK_PROF_TEXT = 1,
    QK_PROF_JSON,
    QK_PROF_TRACE,
    QK_PROF_HTML
} qk_prof_format;

typedef struct qk_prof_desc {
    size_t events_per_thread;   /* zone/counter events kept per thread for traces; default 262144 */
    size_t gpu_records_per_thread; /* resolved GPU zones kept per thread for traces; default 65536 */
    int gpu_queue;              /* open + unresolved GPU zones per (thread, stream); default 2048 */
    int top_n;                  /* rows in the bottleneck table; default 10 */
    /* >>steps (desc): step-loop statistics (QK_PROF_STEP) */
    int step_warmup;            /* first steps left out of the step statistics; default 1, -1: none */
    int step_window;            /* steps kept per zone (a ring: the statistics cover the last
                                   step_window steps); default 4096 */
    int preallocate;            /* 1: a thread's whole event buffer is allocated and touched when
                                   it first records, so no zone ever meets a page fault (about
                                   6 MiB a thread by default); 0 (default): chunk by chunk */
    /* Injected clock (tests): returns ticks; ns_per_tick converts (default 1.0). */
    uint64_t (*clock)(void *user);
    void *clock_user;
    double clock_ns_per_tick;
} qk_prof_desc;

/* Statistics of one zone name (all sites and threads), in nanoseconds. std is the population
   standard deviation. */
typedef struct qk_prof_stats {
    uint64_t calls;
    double total_ns, mean_ns, min_ns, max_ns, std_ns;
    double self_ns;             /* CPU zones: total_ns less the time of the zones nested directly
                                   in them (on their thread); -1 for GPU zones (not computed) */
} qk_prof_stats;

typedef struct qk_prof_summary {
    double wall_ns;             /* first to last recorded activity */
    int threads;                /* threads that recorded */
    int lanes;                  /* GPU streams seen */
    uint64_t events;            /* CPU zone + counter events kept for traces */
    uint64_t dropped_events;    /* not kept (buffer full); statistics still count them */
    uint64_t dropped_gpu;       /* GPU zones not recorded (queue full, event creation failed) */
    uint64_t dropped_gpu_records; /* GPU zones resolved into statistics but not kept for traces */
    uint64_t dropped_threads;   /* zones on threads beyond QK_PROF_MAX_THREADS */
    uint64_t unbalanced;        /* END without an open zone */
    uint64_t mismatched;        /* END whose name differs from the open zone's */
    uint64_t too_deep;          /* zones deeper than QK_PROF_MAX_DEPTH (counted, not timed) */
    uint64_t gpu_ignored;       /* GPU macros in a build without QK_PROF_CUDA */
    uint64_t gpu_pending;       /* GPU zones not yet resolved */
    double host_current, host_peak;     /* tracked bytes: host (pageable + pinned) */
    double device_current, device_peak; /* tracked bytes: device + managed */
    const char *clock;          /* "rdtsc", "clock_gettime", "injected" */
    double ns_per_tick;
} qk_prof_summary;

/* >>steps (types): one zone's per-step series (QK_PROF_STEP), or the step time itself. The
   statistics cover the steps in the window (the last desc.step_window steps after the warm-up);
   a step in which the zone did not run counts 0 (from the zone's first step on). Percentiles
   are linear interpolations between the sorted values (numpy's default method). */
typedef struct qk_prof_step_stats {
    int64_t steps;              /* steps in the statistics */
    int64_t marked;             /* steps ended since the first marker (warm-up included) */
    int64_t first, last;        /* the first and last step's index, as given to QK_PROF_STEP */
    double mean_ns, min_ns, max_ns, p50_ns, p95_ns, p99_ns;
    double trend_ns;            /* least-squares slope over the steps, ns per step */
    double trend_rel;           /* trend_ns / mean_ns: relative change per step */
} qk_prof_step_stats;

/* >>api ---- functions (defined only where QK_PROF_ENABLE and QK_PROF_IMPLEMENTATION are) ---- */
QK_PROF_DEF int qk_prof_init(const qk_prof_desc *desc); /* optional, before the first zone */
QK_PROF_DEF void qk_prof_shutdown(void);                /* frees everything; init may follow */
QK_PROF_DEF void qk_prof_begin(qk_prof_site *site);
QK_PROF_DEF void qk_prof_end(const char *name);
QK_PROF_DEF qk_prof_site *qk_prof_scope_begin(qk_prof_site *site);
QK_PROF_DEF void qk_prof_scope_end(qk_prof_site **site);
QK_PROF_DEF void qk_prof_thread_name(const char *name);
QK_PROF_DEF void qk_prof_gpu_begin(qk_prof_site *site, void *stream);
QK_PROF_DEF void qk_prof_gpu_end(const char *name, void *stream);
QK_PROF_DEF void qk_prof_stream_name(void *stream, const char *name);
QK_PROF_DEF int qk_prof_gpu_collect(int wait);
/* kind is a cudaMemcpyKind; returns a cudaError_t (or -1 without QK_PROF_CUDA). */
QK_PROF_DEF int qk_prof_memcpy(qk_prof_site *site, void *dst, const void *src, size_t bytes,
                               int kind, void *stream);
QK_PROF_DEF void qk_prof_transfer(const char *name, qk_prof_dir dir, size_t bytes, int pinned,
                                  double seconds);
QK_PROF_DEF void qk_prof_track(const char *name, const void *ptr, size_t bytes, const char *dtype,
                               int ndim, const int64_t *shape);
QK_PROF_DEF void qk_prof_untrack(const void *ptr);
QK_PROF_DEF void qk_prof_mem_snapshot(const char *label);
QK_PROF_DEF void qk_prof_mempool(const char *label, void *pool);
QK_PROF_DEF void qk_prof_counter(qk_prof_site *site, double value, int add);
/* Statistics of CPU (gpu = 0) or GPU (gpu = 1) zones named name; -1 when none recorded. */
QK_PROF_DEF int qk_prof_zone_stats(const char *name, int gpu, qk_prof_stats *out);
QK_PROF_DEF void qk_prof_get_summary(qk_prof_summary *out);
/* A GPU stream (of the calling thread's current device): resolved zones, busy time (union of
   the zones' intervals) and the wall time it is a share of; -1 when the stream was not seen. */
QK_PROF_DEF int qk_prof_stream_stats(void *stream, uint64_t *zones, double *busy_ns, double *wall_ns);
QK_PROF_DEF int qk_prof_write(qk_prof_format fmt, FILE *f);
QK_PROF_DEF int qk_prof_write_file(qk_prof_format fmt, const char *path);
QK_PROF_DEF const char *qk_prof_last_error(void);
/* >>steps (api): step markers. qk_prof_step(i) ends the open step (if any) and begins step i;
   qk_prof_step_end() ends the open step. Zones count in the step in which they end (GPU zones:
   in which they begin). Statistics of a zone's per-step time (name NULL: the step time);
   -1 when no step was recorded or the zone ran in none. */
QK_PROF_DEF void qk_prof_step(int64_t index);
QK_PROF_DEF void qk_prof_step_end(void);
QK_PROF_DEF int qk_prof_zone_step_stats(const char *name, int gpu, qk_prof_step_stats *out);
/* >>mpi (api): with QK_PROF_MPI the report calls are collective (rank 0 writes one report of all
   ranks); these write this rank's own report, collective or not. qk_prof_mpi_sync (collective)
   measures the ranks' clock offsets to rank 0 now (qk_prof_init does when MPI is already up). */
QK_PROF_DEF int qk_prof_write_local(qk_prof_format fmt, FILE *f);
QK_PROF_DEF int qk_prof_write_file_local(qk_prof_format fmt, const char *path);
QK_PROF_DEF int qk_prof_mpi_sync(void);

/* >>macros ---- macros (enabled and disabled forms) ---- */
#define QK_PROF_CAT_(a, b) a##b
#define QK_PROF_CAT(a, b) QK_PROF_CAT_(a, b)

#ifdef QK_PROF_ENABLE
#define QK_PROF_ENABLED 1
#define QK_PROF_SITE_(var, name, kind) \
    static qk_prof_site var = { name, __FILE__, __LINE__, kind, 0 }
#define QK_PROF_INIT(desc) qk_prof_init(desc)
#define QK_PROF_SHUTDOWN() qk_prof_shutdown()
#define QK_PROF_BEGIN(name) \
    do { QK_PROF_SITE_(qk__prof_site_, name, QK_PROF_SITE_CPU); qk_prof_begin(&qk__prof_site_); } while (0)
#define QK_PROF_END(name) qk_prof_end(name)
#define QK_PROF_THREAD_NAME(name) qk_prof_thread_name(name)
#define QK_PROF_GPU_BEGIN(name, stream) \
    do { QK_PROF_SITE_(qk__prof_site_, name, QK_PROF_SITE_GPU); \
         qk_prof_gpu_begin(&qk__prof_site_, (void *)(stream)); } while (0)
#define QK_PROF_GPU_END(name, stream) qk_prof_gpu_end(name, (void *)(stream))
#define QK_PROF_STREAM_NAME(stream, name) qk_prof_stream_name((void *)(stream), name)
#define QK_PROF_GPU_COLLECT() ((void)qk_prof_gpu_collect(0))
#if defined(__cplusplus)
/* The site's static record lives in the lambda-free block scope of the call site. */
#define QK_PROF_MEMCPY(dst, src, bytes, kind, stream) \
    ([&]() { QK_PROF_SITE_(qk__prof_site_, "memcpy", QK_PROF_SITE_GPU); \
        return (cudaError_t)qk_prof_memcpy(&qk__prof_site_, (void *)(dst), (const void *)(src), \
                                           (bytes), (int)(kind), (void *)(stream)); }())
#elif defined(__GNUC__)
#define QK_PROF_MEMCPY(dst, src, bytes, kind, stream) \
    __extension__({ QK_PROF_SITE_(qk__prof_site_, "memcpy", QK_PROF_SITE_GPU); \
        (cudaError_t)qk_prof_memcpy(&qk__prof_site_, (void *)(dst), (const void *)(src), \
                                    (bytes), (int)(kind), (void *)(stream)); })
#endif
#define QK_PROF_TRANSFER(name, dir, bytes, pinned, seconds) \
    qk_prof_transfer(name, dir, bytes, pinned, seconds)
#define QK_PROF_TRACK(name, ptr, bytes) qk_prof_track(name, (const void *)(ptr), bytes, NULL, 0, NULL)
#define QK_PROF_TRACK_SHAPE(name, ptr, bytes, dtype, ndim, shape) \
    qk_prof_track(name, (const void *)(ptr), bytes, dtype, ndim, shape)
#define QK_PROF_UNTRACK(ptr) qk_prof_untrack((const void *)(ptr))
#define QK_PROF_MEM_SNAPSHOT(label) qk_prof_mem_snapshot(label)
#define QK_PROF_MEMPOOL(label, pool) qk_prof_mempool(label, (void *)(pool))
#define QK_PROF_COUNTER(name, value) \
    do { QK_PROF_SITE_(qk__prof_site_, name, QK_PROF_SITE_COUNTER); \
         qk_prof_counter(&qk__prof_site_, (double)(value), 0); } while (0)
#define QK_PROF_COUNT(name, delta) \
    do { QK_PROF_SITE_(qk__prof_site_, name, QK_PROF_SITE_COUNTER); \
         qk_prof_counter(&qk__prof_site_, (double)(delta), 1); } while (0)
#define QK_PROF_REPORT(path) qk_prof_write_file(QK_PROF_TEXT, path)
#define QK_PROF_WRITE_JSON(path) qk_prof_write_file(QK_PROF_JSON, path)
#define QK_PROF_WRITE_TRACE(path) qk_prof_write_file(QK_PROF_TRACE, path)
#define QK_PROF_WRITE_HTML(path) qk_prof_write_file(QK_PROF_HTML, path)
#define QK_PROF_STEP(index) qk_prof_step((int64_t)(index))      /* >>steps */
#define QK_PROF_STEP_END() qk_prof_step_end()

#if defined(__cplusplus)
struct qk__prof_scope_guard {
    qk_prof_site *s;
    explicit qk__prof_scope_guard(qk_prof_site *site) : s(qk_prof_scope_begin(site)) {}
    ~qk__prof_scope_guard() { qk_prof_scope_end(&s); }
    qk__prof_scope_guard(const qk__prof_scope_guard &) = delete;
    qk__prof_scope_guard &operator=(const qk__prof_scope_guard &) = delete;
};
#define QK_PROF_SCOPE(name) \
    QK_PROF_SITE_(QK_PROF_CAT(qk__prof_ssite_, __LINE__), name, QK_PROF_SITE_CPU); \
    qk__prof_scope_guard QK_PROF_CAT(qk__prof_scope_, __LINE__)(&QK_PROF_CAT(qk__prof_ssite_, __LINE__))
#elif defined(__GNUC__)
#define QK_PROF_SCOPE(name) \
    QK_PROF_SITE_(QK_PROF_CAT(qk__prof_ssite_, __LINE__), name, QK_PROF_SITE_CPU); \
    qk_prof_site *QK_PROF_CAT(qk__prof_scope_, __LINE__) __attribute__((cleanup(qk_prof_scope_end), unused)) = \
        qk_prof_scope_begin(&QK_PROF_CAT(qk__prof_ssite_, __LINE__))
#endif
/* __func__ is not a literal: the site is named once, at its first use. */
#if defined(__cplusplus)
#define QK_PROF_FUNC() \
    static qk_prof_site QK_PROF_CAT(qk__prof_ssite_, __LINE__) = { 0, __FILE__, __LINE__, QK_PROF_SITE_CPU, 0 }; \
    QK_PROF_CAT(qk__prof_ssite_, __LINE__).name = __func__; \
    qk__prof_scope_guard QK_PROF_CAT(qk__prof_scope_, __LINE__)(&QK_PROF_CAT(qk__prof_ssite_, __LINE__))
#elif defined(__GNUC__)
#define QK_PROF_FUNC() \
    static qk_prof_site QK_PROF_CAT(qk__prof_ssite_, __LINE__) = { 0, __FILE__, __LINE__, QK_PROF_SITE_CPU, 0 }; \
    QK_PROF_CAT(qk__prof_ssite_, __LINE__).name = __func__; \
    qk_prof_site *QK_PROF_CAT(qk__prof_scope_, __LINE__) __attribute__((cleanup(qk_prof_scope_end), unused)) = \
        qk_prof_scope_begin(&QK_PROF_CAT(qk__prof_ssite_, __LINE__))
#endif

#else /* !QK_PROF_ENABLE: nothing that generates code; sizeof marks arguments used */
#define QK_PROF_ENABLED 0
#define QK_PROF_U_(x) ((void)sizeof(x))
#define QK_PROF_INIT(desc) QK_PROF_ZERO_(desc)
#define QK_PROF_SHUTDOWN() ((void)0)
#define QK_PROF_BEGIN(name) QK_PROF_U_(name)
#define QK_PROF_END(name) QK_PROF_U_(name)
#define QK_PROF_SCOPE(name) QK_PROF_U_(name)
#define QK_PROF_FUNC() ((void)0)
#define QK_PROF_THREAD_NAME(name) QK_PROF_U_(name)
#define QK_PROF_GPU_BEGIN(name, stream) (QK_PROF_U_(name), QK_PROF_U_(stream))
#define QK_PROF_GPU_END(name, stream) (QK_PROF_U_(name), QK_PROF_U_(stream))
#define QK_PROF_STREAM_NAME(stream, name) (QK_PROF_U_(stream), QK_PROF_U_(name))
#define QK_PROF_GPU_COLLECT() ((void)0)
#define QK_PROF_MEMCPY(dst, src, bytes, kind, stream) cudaMemcpyAsync(dst, src, bytes, kind, stream)
#define QK_PROF_TRANSFER(name, dir, bytes, pinned, seconds) \
    (QK_PROF_U_(name), QK_PROF_U_(dir), QK_PROF_U_(bytes), QK_PROF_U_(pinned), QK_PROF_U_(seconds))
#define QK_PROF_TRACK(name, ptr, bytes) (QK_PROF_U_(name), QK_PROF_U_(ptr), QK_PROF_U_(bytes))
#define QK_PROF_TRACK_SHAPE(name, ptr, bytes, dtype, ndim, shape) \
    (QK_PROF_U_(name), QK_PROF_U_(ptr), QK_PROF_U_(bytes), QK_PROF_U_(dtype), QK_PROF_U_(ndim), QK_PROF_U_(shape))
#define QK_PROF_UNTRACK(ptr) QK_PROF_U_(ptr)
#define QK_PROF_MEM_SNAPSHOT(label) QK_PROF_U_(label)
#define QK_PROF_MEMPOOL(label, pool) (QK_PROF_U_(label), QK_PROF_U_(pool))
#define QK_PROF_COUNTER(name, value) (QK_PROF_U_(name), QK_PROF_U_(value))
#define QK_PROF_COUNT(name, delta) (QK_PROF_U_(name), QK_PROF_U_(delta))
#define QK_PROF_REPORT(path) QK_PROF_ZERO_(path)
#define QK_PROF_WRITE_JSON(path) QK_PROF_ZERO_(path)
#define QK_PROF_WRITE_TRACE(path) QK_PROF_ZERO_(path)
#define QK_PROF_WRITE_HTML(path) QK_PROF_ZERO_(path)
#define QK_PROF_STEP(index) QK_PROF_U_(index)                  /* >>steps */
#define QK_PROF_STEP_END() ((void)0)
/* The value 0, usable as a statement without an unused-value warning, and no code even at
   -O0 where the compiler has statement expressions; elsewhere an inline function. */
#if defined(__GNUC__) || defined(__clang__)
#define QK_PROF_ZERO_(x) __extension__({ QK_PROF_U_(x); 0; })
#else
#define QK_PROF_ZERO_(x) qk__prof_zero((const void *)(x))
static inline int qk__prof_zero(const void *p) { (void)p; return 0; }
#endif
#endif /* QK_PROF_ENABLE */

#ifdef __cplusplus
}
#endif
#endif /* QK_PROF_H */

/* ======================================================================================== */
/*                                    IMPLEMENTATION                                        */
/* ======================================================================================== */
#if defined(QK_PROF_IMPLEMENTATION) && defined(QK_PROF_ENABLE) && !defined(QK_PROF_IMPLEMENTATION_DONE)
#define QK_PROF_IMPLEMENTATION_DONE
#if defined(QK_H) && !defined(QK_IMPLEMENTATION)
#error "qk_prof.h: QK_PROF_IMPLEMENTATION belongs in the file that defines QK_IMPLEMENTATION (qk.h's rule for the two implementation defines)"
#endif

/* >>config ---- implementation: includes and config ---- */
#if !defined(__GNUC__) && !defined(__clang__)
#error "qk_prof.h: the implementation needs GCC or Clang (atomics builtins, __thread)"
#endif
#if defined(_WIN32)
#error "qk_prof.h: the implementation supports POSIX systems (Linux, macOS) only for now"
#endif
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if (defined(__x86_64__) || defined(__i386__)) && !defined(QK_PROF_NO_RDTSC)
#include <cpuid.h>
#include <x86intrin.h>
#define QK__PROF_HAVE_TSC 1
#else
#define QK__PROF_HAVE_TSC 0
#endif
#ifdef QK_PROF_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef QK_PROF_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

#if defined(QK_PROF_MALLOC) && defined(QK_PROF_REALLOC) && defined(QK_PROF_FREE)
#elif !defined(QK_PROF_MALLOC) && !defined(QK_PROF_REALLOC) && !defined(QK_PROF_FREE)
#define QK_PROF_MALLOC(sz) malloc(sz)
#define QK_PROF_REALLOC(p, sz) realloc(p, sz)
#define QK_PROF_FREE(p) free(p)
#else
#error "qk_prof.h: define all of QK_PROF_MALLOC, QK_PROF_REALLOC and QK_PROF_FREE, or none"
#endif

#define QK__PROF_LIKELY(x) __builtin_expect(!!(x), 1)
#define QK__PROF_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define QK__PROF_OTHER_SITE (QK_PROF_MAX_SITES - 1) /* sites beyond the table share this row */
#define QK__PROF_CHUNK 4096                         /* events per buffer chunk */

#ifdef __cplusplus
extern "C" {
#endif

/* >>state ---- implementation: state ---- */
/* Running statistics of one site on one thread. Sums are of (d - shift), shift the first
   duration, so the variance does not cancel catastrophically for long, steady zones. */
typedef struct qk__prof_stat {
    uint64_t n, total, min, max, shift;
    double s1, s2;
    uint64_t child;             /* CPU zones: time of the zones nested directly in these calls */
} qk__prof_stat;

typedef struct qk__prof_cstat { /* counter */
    uint64_t n;
    double sum, last, min, max;
    int add;
} qk__prof_cstat;

typedef struct qk__prof_ev {    /* one zone or counter event: traces, and zone statistics */
    uint64_t t0, t1;            /* ticks; counters keep their value's bits in t1 */
    uint64_t meta;              /* site | depth << 32 | kind << 48 (kind: 0 zone, 1 set, 2 add) */
} qk__prof_ev;
#define QK__PROF_META(site, depth, kind) ((uint64_t)(site) | (uint64_t)(depth) << 32 | (uint64_t)(kind) << 48)
#define QK__PROF_SITE(e) ((uint32_t)(e)->meta)
#define QK__PROF_DEPTH(e) ((int)(((e)->meta >> 32) & 0xffff))
#define QK__PROF_KIND(e) ((int)((e)->meta >> 48))

typedef struct qk__prof_frame {
    const char *name;           /* the site's, to check END's name with one load */
    uint64_t id;
    uint64_t t0;
} qk__prof_frame;

typedef struct qk__prof_grec {  /* a resolved GPU zone, for traces */
    double start_ns, dur_ns;    /* start relative to the device's base event */
    uint64_t bytes;
    uint32_t site;
    uint16_t lane;
    uint8_t dir, pinned;
    uint16_t depth;
} qk__prof_grec;

#ifdef QK_PROF_CUDA
typedef struct qk__prof_gz {    /* a GPU zone from begin to resolution */
    qk_prof_site *site;
    uint32_t id;
    cudaEvent_t e0, e1;
    uint64_t bytes;
    uint8_t dir, pinned, ended, done;
    uint16_t depth;
    int64_t step;               /* >>steps: the step open at begin, -1 outside steps */
} qk__prof_gz;

typedef struct qk__prof_lanec { /* one (thread, stream) pair */
    void *stream;
    int lane;
    qk__prof_gz *q;             /* ring in begin order */
    int cap, head, count;
    cudaEvent_t prev;           /* e0 of the last resolved zone (or the base event) */
    double prev_ms;             /* its time after the device's base event */
    int64_t head_seq;           /* sequence number of the zone at head */
    int64_t *ends;              /* ring (cap) of zones in the order their e1 was recorded */
    int e_head, e_count;
    int next_resolve;           /* e_count that triggers the next pass from END */
} qk__prof_lanec;

typedef struct qk__prof_gopen { int lanec; int64_t seq; } qk__prof_gopen;
#endif

typedef struct qk__prof_gthread {
    pthread_mutex_t mu;
    int device;
    qk__prof_stat *stats;       /* [QK_PROF_MAX_SITES] */
    qk__prof_grec *recs;
    size_t n_recs, cap_recs;
    uint64_t dropped, dropped_recs, pending;
#ifdef QK_PROF_CUDA
    qk__prof_lanec *lanes;
    int n_lanes, cap_lanes;
    cudaEvent_t *pool;
    int n_pool, cap_pool;
    qk__prof_gopen stack[QK_PROF_MAX_DEPTH];
    int depth;
#endif
} qk__prof_gthread;

typedef struct qk__prof_thread {
    int index;
    char name[64];
    int depth;
    uint64_t last_tick;
    qk__prof_ev *cur, *end;     /* cur is published with release order after each event */
    qk__prof_ev **chunks;
    size_t n_chunks, n_alloc, max_chunks; /* chunks in use, allocated, allowed */
    uint64_t dropped, unbalanced, mismatched, too_deep;
    qk__prof_stat *stats;       /* [QK_PROF_MAX_SITES]: zones whose events were dropped; the
                                   kept ones are summed from the events at report time, which
                                   keeps the fast path to two clock reads and four stores */
    qk__prof_cstat *cstats;     /* [QK_PROF_MAX_SITES], on first counter */
    qk__prof_gthread *gpu;
    struct qk__prof_thread *next;
    struct qk__prof_thread *next_free;
    qk__prof_frame stack[QK_PROF_MAX_DEPTH];
    uint64_t dchild[QK_PROF_MAX_DEPTH]; /* dropped zones ended at each depth since the last END
                                           one level up: the children of the frame above */
} qk__prof_thread;

typedef struct qk__prof_lane {
    void *stream;
    int device;
    char name[64];
} qk__prof_lane;

typedef struct qk__prof_alloc { const void *ptr; size_t bytes; int name; int kind; } qk__prof_alloc;
typedef struct qk__prof_mname {
    char name[64];
    char dtype[16];
    char shape[48];
    int kind;
    double current, peak;
    uint64_t allocs;
} qk__prof_mname;
typedef struct qk__prof_mpoint { uint64_t t; double host, device; } qk__prof_mpoint;
typedef struct qk__prof_snap {
    uint64_t t;
    char label[48];
    double dev_free, dev_total, host_tracked, device_tracked;
    double pool_reserved, pool_reserved_high, pool_used, pool_used_high;
    int is_pool;
} qk__prof_snap;
typedef struct qk__prof_xfer {
    char name[48];
    int dir, pinned;
    double bytes, seconds;
} qk__prof_xfer;

enum { QK__PROF_MEM_HOST = 0, QK__PROF_MEM_PINNED, QK__PROF_MEM_DEVICE, QK__PROF_MEM_MANAGED, QK__PROF_MEM_KINDS };

typedef struct qk__prof_state {
    int ready;
    int clock_mode;             /* 0 rdtsc, 1 CLOCK_MONOTONIC, 2 injected */
    qk_prof_desc desc;
    int use_tsc;
    uint64_t t_origin;          /* ticks at init */
    struct timespec ts_origin;  /* CLOCK_MONOTONIC at init (TSC calibration) */
    double ns_per_tick;
    qk_prof_site *sites[QK_PROF_MAX_SITES];
    uint32_t n_sites;
    qk_prof_site other_site;
    qk__prof_thread *threads;
    qk__prof_thread *free_threads; /* of threads that exited: reused by new threads */
    int n_threads;
    uint64_t dropped_threads, gpu_ignored;
    qk__prof_lane lanes[QK_PROF_MAX_LANES];
    int n_lanes;
    /* per device: base event (host-aligned once), as void* to keep this struct CUDA-free */
    void *base_ev[16];
    uint64_t base_tick[16];
    /* memory */
    qk__prof_alloc *allocs;
    size_t cap_allocs, n_allocs, n_tomb;
    qk__prof_mname *mnames;
    int n_mnames, cap_mnames;
    double mem_cur[QK__PROF_MEM_KINDS], mem_peak[QK__PROF_MEM_KINDS];
    qk__prof_mpoint *mseries;
    size_t n_mseries, cap_mseries;
    uint64_t dropped_mpoints;
    qk__prof_snap *snaps;
    int n_snaps, cap_snaps;
    qk__prof_xfer *xfers;
    int n_xfers, cap_xfers;
    uint64_t last_tick_other;   /* last tick of memory/transfer activity */
} qk__prof_state;

static qk__prof_state qk__prof_g;
static pthread_mutex_t qk__prof_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread qk__prof_thread *qk__prof_tls;
static __thread char qk__prof_err[256];
/* Threads beyond QK_PROF_MAX_THREADS (or that could not allocate) write here: fixed arrays, no
   chunks, so every event is a counted drop and nothing is ever out of bounds. */
static pthread_key_t qk__prof_key;
static pthread_once_t qk__prof_key_once = PTHREAD_ONCE_INIT;
static qk__prof_thread qk__prof_dummy;
static qk__prof_stat qk__prof_dummy_stats[QK_PROF_MAX_SITES];

/* >>steps, >>mpi (forward): step-loop statistics and MPI-wide reports, defined in their own
   sections further down; these are the hooks the code above them calls. */
static int64_t qk__prof_step_cur = -1;  /* the open step's sequence number (-1: none); relaxed */
__attribute__((unused)) static void qk__prof_steps_gpu(uint32_t site, int64_t step, double dur_ns);
static void qk__prof_steps_free(void);
static const char *qk__prof_site_name(uint32_t id);
struct qk__prof_model;
static void qk__prof_steps_text(FILE *f, const struct qk__prof_model *m, int w);
static void qk__prof_steps_json(FILE *f, const struct qk__prof_model *m);
static void qk__prof_html_steps(FILE *f, const struct qk__prof_model *m);
static void qk__prof_mpi_free(void);
#ifdef QK_PROF_MPI
static __thread int qk__prof_mpi_local;
static __thread const char *qk__prof_mpi_buf;
static __thread size_t qk__prof_mpi_len;
static int qk__prof_mpi_up(void);
static int qk__prof_mpi_write(qk_prof_format fmt, FILE *f, const char *path);
#endif

static void qk__prof_seterr(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(qk__prof_err, sizeof qk__prof_err, fmt, ap);
    va_end(ap);
}

QK_PROF_DEF const char *qk_prof_last_error(void) { return qk__prof_err; }

static void *qk__prof_calloc(size_t n, size_t size)
{
    void *p;
    size_t bytes;
    if (size && n > (size_t)-1 / size) return NULL;
    bytes = n * size;
    p = QK_PROF_MALLOC(bytes > 0 ? bytes : 1);
    if (p) memset(p, 0, bytes);
    return p;
}

/* Grow *p (elements of size) to hold at least need; 0 on success. */
static int qk__prof_grow(void **p, int *cap, int need, size_t size)
{
    int nc;
    void *np;
    if (need <= *cap) return 0;
    nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    np = QK_PROF_REALLOC(*p, (size_t)nc * size);
    if (!np) return -1;
    *p = np;
    *cap = nc;
    return 0;
}

static void qk__prof_copy(char *dst, size_t size, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= size) n = size - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

/* >>clock ---- implementation: clock ---- */
#if !defined(CLOCK_MONOTONIC) && defined(__linux__)
/* A strict -std=c99/c11 TU whose system headers came before this one (so the feature macro at
   the top came too late) hides clock_gettime. glibc and musl always define it, with clockid_t
   an int and CLOCK_MONOTONIC 1 (the Linux ABI): declare it here. */
extern int clock_gettime(int clock_id, struct timespec *ts);
#define CLOCK_MONOTONIC 1
#endif
#ifdef CLOCK_MONOTONIC
#define QK__PROF_MONO(ts) clock_gettime(CLOCK_MONOTONIC, ts)
#else
#error "qk_prof.h: clock_gettime(CLOCK_MONOTONIC) is hidden: define _POSIX_C_SOURCE 200809L before any #include"
#endif

static uint64_t qk__prof_mono_ns(void)
{
    struct timespec ts;
    QK__PROF_MONO(&ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One load and one predicted branch decide the clock: clock_mode is 0 for rdtsc, 1 for
   CLOCK_MONOTONIC, 2 for an injected clock. */
static inline uint64_t qk__prof_now(void)
{
#if QK__PROF_HAVE_TSC
    if (QK__PROF_LIKELY(qk__prof_g.clock_mode == 0)) return __rdtsc();
#endif
    if (qk__prof_g.clock_mode == 2) return qk__prof_g.desc.clock(qk__prof_g.desc.clock_user);
    return qk__prof_mono_ns();
}

static int qk__prof_tsc_invariant(void)
{
#if QK__PROF_HAVE_TSC
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return 0;
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    return (d >> 8) & 1; /* invariant TSC: constant rate in all power states */
#else
    return 0;
#endif
}

/* Ticks to ns over the whole run: the longer the span, the better the rate. Spins until at
   least 20 ms have passed since init, so very short runs still get a usable rate. */
static void qk__prof_calibrate(void)
{
    if (qk__prof_g.desc.clock) {
        qk__prof_g.ns_per_tick = qk__prof_g.desc.clock_ns_per_tick > 0 ? qk__prof_g.desc.clock_ns_per_tick : 1.0;
        return;
    }
    if (!qk__prof_g.use_tsc) { qk__prof_g.ns_per_tick = 1.0; return; }
    {
        uint64_t ns0 = (uint64_t)qk__prof_g.ts_origin.tv_sec * 1000000000u + (uint64_t)qk__prof_g.ts_origin.tv_nsec;
        uint64_t ns1, t1;
        do {
            ns1 = qk__prof_mono_ns();
            t1 = qk__prof_now();
        } while (ns1 - ns0 < 20000000u);
        qk__prof_g.ns_per_tick = (double)(ns1 - ns0) / (double)(t1 - qk__prof_g.t_origin);
    }
}

/* >>threads ---- implementation: init, threads, sites ---- */
static void qk__prof_init_locked(const qk_prof_desc *desc)
{
    qk_prof_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (!d.events_per_thread) d.events_per_thread = 262144;
    if (!d.gpu_records_per_thread) d.gpu_records_per_thread = 65536;
    if (d.gpu_queue <= 0) d.gpu_queue = 2048;
    if (d.top_n <= 0) d.top_n = 10;
    if (d.clock_ns_per_tick <= 0) d.clock_ns_per_tick = 1.0;
    qk__prof_g.desc = d;
    qk__prof_g.use_tsc = !d.clock && qk__prof_tsc_invariant();
    qk__prof_g.clock_mode = d.clock ? 2 : qk__prof_g.use_tsc ? 0 : 1;
    QK__PROF_MONO(&qk__prof_g.ts_origin);
    qk__prof_g.t_origin = qk__prof_now();
    qk__prof_g.ns_per_tick = 1.0;
    qk__prof_g.other_site.name = "(other sites)";
    qk__prof_g.other_site.file = "";
    qk__prof_g.other_site.id = QK__PROF_OTHER_SITE;
    qk__prof_g.sites[QK__PROF_OTHER_SITE] = &qk__prof_g.other_site;
    qk__prof_g.n_sites = 1; /* id 0 means "not registered" */
    qk__prof_dummy.stats = qk__prof_dummy_stats;
    qk__prof_dummy.index = -1;
    qk__prof_g.ready = 1;
}

QK_PROF_DEF int qk_prof_init(const qk_prof_desc *desc)
{
    int rc = 0;
    pthread_mutex_lock(&qk__prof_mu);
    if (qk__prof_g.ready && qk__prof_g.n_threads > 0) {
        qk__prof_seterr("qk_prof_init: zones were already recorded; call qk_prof_shutdown first");
        rc = -1;
    } else {
        qk__prof_init_locked(desc);
    }
    pthread_mutex_unlock(&qk__prof_mu);
#ifdef QK_PROF_MPI /* >>mpi: the first clock-offset measurement, where MPI is up (collective) */
    if (rc == 0 && qk__prof_mpi_up()) qk_prof_mpi_sync();
#endif
    return rc;
}

/* A thread that exits hands its buffers to the next new thread: codes that start threads per
   step reuse a few lanes instead of filling QK_PROF_MAX_THREADS. Their zones never overlap in
   time, so sharing a lane (and its statistics) is exact. */
#ifdef QK_PROF_CUDA
static void qk__prof_ev_put(qk__prof_gthread *g, cudaEvent_t e);
#endif

static void qk__prof_thread_exit(void *p)
{
    qk__prof_thread *t = (qk__prof_thread *)p;
    if (!t || t == &qk__prof_dummy) return;
    pthread_mutex_lock(&qk__prof_mu);
    t->next_free = qk__prof_g.free_threads;
    qk__prof_g.free_threads = t;
    pthread_mutex_unlock(&qk__prof_mu);
}

static void qk__prof_key_make(void) { pthread_key_create(&qk__prof_key, qk__prof_thread_exit); }

static qk__prof_thread *qk__prof_register_thread(void)
{
    qk__prof_thread *t = NULL;
    pthread_once(&qk__prof_key_once, qk__prof_key_make);
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.ready) qk__prof_init_locked(NULL);
    if (qk__prof_g.free_threads) {
        t = qk__prof_g.free_threads;
        qk__prof_g.free_threads = t->next_free;
        if (t->depth) t->unbalanced += (uint64_t)(t->depth > 0 ? t->depth : 0); /* left open at exit */
        t->depth = 0;
        memset(t->dchild, 0, sizeof t->dchild);
#ifdef QK_PROF_CUDA
        if (t->gpu) { /* GPU zones left open: close them empty so their lanes drain */
            qk__prof_gthread *g = t->gpu;
            int d;
            pthread_mutex_lock(&g->mu);
            for (d = 0; d < g->depth && d < QK_PROF_MAX_DEPTH; d++) {
                if (g->stack[d].lanec >= 0) {
                    qk__prof_lanec *L = &g->lanes[g->stack[d].lanec];
                    qk__prof_gz *z = &L->q[(L->head + (int)(g->stack[d].seq - L->head_seq)) % L->cap];
                    qk__prof_ev_put(g, z->e1);
                    z->e1 = z->e0;
                    z->ended = 1;
                    L->ends[(L->e_head + L->e_count++) % L->cap] = g->stack[d].seq;
                }
                t->unbalanced++;
            }
            g->depth = 0;
            pthread_mutex_unlock(&g->mu);
        }
#endif
        snprintf(t->name, sizeof t->name, "thread %d", t->index);
    } else if (qk__prof_g.n_threads < QK_PROF_MAX_THREADS) {
        t = (qk__prof_thread *)qk__prof_calloc(1, sizeof *t);
        if (t) {
            t->stats = (qk__prof_stat *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof *t->stats);
            t->max_chunks = (qk__prof_g.desc.events_per_thread + QK__PROF_CHUNK - 1) / QK__PROF_CHUNK;
            t->chunks = (qk__prof_ev **)qk__prof_calloc(t->max_chunks, sizeof *t->chunks);
            if (!t->stats || !t->chunks) {
                QK_PROF_FREE(t->stats);
                QK_PROF_FREE(t->chunks);
                QK_PROF_FREE(t);
                t = NULL;
            }
        }
        if (t && qk__prof_g.desc.preallocate) {
            while (t->n_alloc < t->max_chunks) {
                qk__prof_ev *c = (qk__prof_ev *)QK_PROF_MALLOC(QK__PROF_CHUNK * sizeof *c);
                if (!c) break;
                memset(c, 0, QK__PROF_CHUNK * sizeof *c); /* touch every page now */
                t->chunks[t->n_alloc++] = c;
            }
        }
        if (t) {
            t->index = qk__prof_g.n_threads++;
            snprintf(t->name, sizeof t->name, "thread %d", t->index);
            t->next = qk__prof_g.threads;
            qk__prof_g.threads = t;
        }
    }
    if (!t) {
        qk__prof_g.dropped_threads++;
        t = &qk__prof_dummy;
    }
    pthread_mutex_unlock(&qk__prof_mu);
    qk__prof_tls = t;
    pthread_setspecific(qk__prof_key, t);
    return t;
}

static inline qk__prof_thread *qk__prof_thread_get(void)
{
    qk__prof_thread *t = qk__prof_tls;
    return QK__PROF_LIKELY(t != NULL) ? t : qk__prof_register_thread();
}

static uint32_t qk__prof_site_register(qk_prof_site *site)
{
    uint32_t id;
    pthread_mutex_lock(&qk__prof_mu);
    id = __atomic_load_n(&site->id, __ATOMIC_ACQUIRE);
    if (!id) {
        if (qk__prof_g.n_sites < QK__PROF_OTHER_SITE) {
            id = qk__prof_g.n_sites++;
            qk__prof_g.sites[id] = site;
        } else {
            id = QK__PROF_OTHER_SITE;
        }
        __atomic_store_n(&site->id, id, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&qk__prof_mu);
    return id;
}

static inline uint32_t qk__prof_site_id(qk_prof_site *site)
{
    uint32_t id = __atomic_load_n(&site->id, __ATOMIC_ACQUIRE);
    return QK__PROF_LIKELY(id != 0) ? id : qk__prof_site_register(site);
}

QK_PROF_DEF void qk_prof_thread_name(const char *name)
{
    qk__prof_thread *t = qk__prof_thread_get();
    if (t != &qk__prof_dummy) qk__prof_copy(t->name, sizeof t->name, name);
}

/* >>zones ---- implementation: CPU zones ---- */
static inline void qk__prof_stat_add(qk__prof_stat *s, uint64_t d)
{
    double x;
    if (QK__PROF_UNLIKELY(s->n == 0)) {
        s->shift = s->min = s->max = d;
    } else {
        if (d < s->min) s->min = d;
        if (d > s->max) s->max = d;
    }
    s->n++;
    s->total += d;
    x = (double)(int64_t)(d - s->shift);
    s->s1 += x;
    s->s2 += x * x;
}

/* Slow path: the current chunk is full; start the next, or count a drop (returns 0). */
static int qk__prof_push_slow(qk__prof_thread *t, uint64_t t0, uint64_t t1, uint64_t meta)
{
    qk__prof_ev *c;
    if (t->n_chunks >= t->max_chunks) { t->dropped++; return 0; }
    if (t->n_chunks < t->n_alloc) {
        c = t->chunks[t->n_chunks];
    } else {
        c = (qk__prof_ev *)QK_PROF_MALLOC(QK__PROF_CHUNK * sizeof *c);
        /* the first drop ends the thread's kept events for good: a kept zone never has a
           dropped child, which the self times rely on (qk__prof_dropped_end) */
        if (!c) { t->max_chunks = t->n_chunks; t->dropped++; return 0; }
        t->chunks[t->n_chunks] = c;
        t->n_alloc++;
    }
    __atomic_store_n(&t->n_chunks, t->n_chunks + 1, __ATOMIC_RELEASE);
    c->t0 = t0;
    c->t1 = t1;
    c->meta = meta;
    t->end = c + QK__PROF_CHUNK;
    __atomic_store_n(&t->cur, c + 1, __ATOMIC_RELEASE);
    return 1;
}

/* Self time. A zone's self time is its time less that of the zones nested directly in it on its
   thread; per name, the sum over calls: total - child, child summed in qk__prof_stat. For kept
   events the report finds the children from the event order (qk__prof_model_build: events are
   stored at END, so a zone's children come before it, one level deeper). A thread's events are
   kept up to its first drop and dropped from then on (qk__prof_push_slow), so a kept zone's
   children are all kept; a dropped zone's children are the dropped ones ended since the last
   END at its own depth (dchild) plus, for a zone open when the drops began, kept events one
   level deeper that started inside it (a backward scan that stops at the first event ended
   before the zone began: empty for every zone that began after the drops did). */
static uint64_t qk__prof_kept_children(qk__prof_thread *t, int d, uint64_t t0);
static void qk__prof_dropped_end(qk__prof_thread *t, const qk__prof_frame *f, int d, uint64_t t1)
{
    qk__prof_stat *s = &t->stats[f->id];
    uint64_t dur = t1 - f->t0, ch = qk__prof_kept_children(t, d, f->t0);
    qk__prof_stat_add(s, dur);
    if (d + 1 < QK_PROF_MAX_DEPTH) { ch += t->dchild[d + 1]; t->dchild[d + 1] = 0; }
    s->child += ch;
    t->dchild[d] += dur;
    t->last_tick = t1;
}

/* Returns 1 when the event was kept. */
static inline int qk__prof_push(qk__prof_thread *t, uint64_t t0, uint64_t t1, uint64_t meta)
{
    qk__prof_ev *e = t->cur;
    if (QK__PROF_LIKELY(e < t->end)) {
        e->t0 = t0;
        e->t1 = t1;
        e->meta = meta;
        __atomic_store_n(&t->cur, e + 1, __ATOMIC_RELEASE);
        return 1;
    }
    return qk__prof_push_slow(t, t0, t1, meta);
}

/* Events a thread has published: from cur and the chunk it lies in (cur is stored after
   n_chunks, so a reader that sees a new cur sees its chunk). */
static size_t qk__prof_count(qk__prof_thread *t)
{
    uintptr_t cur = (uintptr_t)__atomic_load_n(&t->cur, __ATOMIC_ACQUIRE);
    size_t nch = __atomic_load_n(&t->n_chunks, __ATOMIC_ACQUIRE), k;
    for (k = nch; k-- > 0 && k + 2 >= nch;) {
        uintptr_t c0 = (uintptr_t)t->chunks[k];
        if (cur >= c0 && cur <= c0 + QK__PROF_CHUNK * sizeof(qk__prof_ev))
            return k * QK__PROF_CHUNK + (size_t)(cur - c0) / sizeof(qk__prof_ev);
    }
    return 0;
}

static uint64_t qk__prof_kept_children(qk__prof_thread *t, int d, uint64_t t0)
{
    size_t e = qk__prof_count(t);
    uint64_t sum = 0;
    while (e-- > 0) {
        const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
        int zone = QK__PROF_KIND(ev) == 0;
        if ((zone ? ev->t1 : ev->t0) < t0) break; /* ended (counters: set) before the zone began */
        if (zone && QK__PROF_DEPTH(ev) == d + 1 && ev->t0 >= t0) sum += ev->t1 - ev->t0;
    }
    return sum;
}

QK_PROF_DEF void qk_prof_begin(qk_prof_site *site)
{
    qk__prof_thread *t = qk__prof_thread_get();
    uint32_t id = qk__prof_site_id(site);
    int d = t->depth++;
#ifdef QK_PROF_NVTX
    nvtxRangePushA(site->name);
#endif
    if (QK__PROF_LIKELY((unsigned)d < QK_PROF_MAX_DEPTH)) {
        qk__prof_frame *f = &t->stack[d];
        f->name = site->name;
        f->id = id;
        f->t0 = qk__prof_now(); /* last, so the bookkeeping above is not in the zone */
    } else {
        t->too_deep++;
    }
}

QK_PROF_DEF void qk_prof_end(const char *name)
{
    uint64_t t1 = qk__prof_now(); /* first, for the same reason */
    qk__prof_thread *t = qk__prof_tls;
    qk__prof_frame *f;
    int d;
#ifdef QK_PROF_NVTX
    nvtxRangePop();
#endif
    if (QK__PROF_UNLIKELY(!t || t->depth <= 0)) {
        if (t) t->unbalanced++;
        return;
    }
    d = --t->depth;
    if (QK__PROF_UNLIKELY((unsigned)d >= QK_PROF_MAX_DEPTH)) return; /* counted at begin */
    f = &t->stack[d];
    if (QK__PROF_UNLIKELY(f->name != name) && (!name || !f->name || strcmp(f->name, name) != 0))
        t->mismatched++;
    if (QK__PROF_UNLIKELY(!qk__prof_push(t, f->t0, t1, QK__PROF_META(f->id, d, 0))))
        qk__prof_dropped_end(t, f, d, t1);
}

QK_PROF_DEF qk_prof_site *qk_prof_scope_begin(qk_prof_site *site)
{
    qk_prof_begin(site);
    return site;
}

QK_PROF_DEF void qk_prof_scope_end(qk_prof_site **site)
{
    qk_prof_end((*site)->name);
}

/* >>counters ---- implementation: counters ---- */
QK_PROF_DEF void qk_prof_counter(qk_prof_site *site, double value, int add)
{
    qk__prof_thread *t = qk__prof_thread_get();
    uint32_t id = qk__prof_site_id(site);
    uint64_t now = qk__prof_now(), bits;
    qk__prof_cstat *c;
    if (QK__PROF_UNLIKELY(!t->cstats)) {
        if (t == &qk__prof_dummy) { t->dropped++; return; }
        t->cstats = (qk__prof_cstat *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof *t->cstats);
        if (!t->cstats) { t->dropped++; return; }
    }
    c = &t->cstats[id];
    if (c->n == 0) { c->min = c->max = value; }
    if (value < c->min) c->min = value;
    if (value > c->max) c->max = value;
    c->n++;
    c->sum += value;
    c->last = value;
    c->add = add;
    t->last_tick = now;
    memcpy(&bits, &value, sizeof bits);
    qk__prof_push(t, now, bits, QK__PROF_META(id, 0, add ? 2 : 1));
}

/* >>memory ---- implementation: memory tracking ---- */
static size_t qk__prof_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33;
    return (size_t)x;
}

#define QK__PROF_TOMB ((const void *)(uintptr_t)1)

static int qk__prof_alloc_rehash(size_t cap)
{
    qk__prof_alloc *old = qk__prof_g.allocs, *na;
    size_t oc = qk__prof_g.cap_allocs, i;
    na = (qk__prof_alloc *)qk__prof_calloc(cap, sizeof *na);
    if (!na) return -1;
    for (i = 0; i < oc; i++) {
        if (old[i].ptr && old[i].ptr != QK__PROF_TOMB) {
            size_t j = qk__prof_hash(old[i].ptr) & (cap - 1);
            while (na[j].ptr) j = (j + 1) & (cap - 1);
            na[j] = old[i];
        }
    }
    QK_PROF_FREE(old);
    qk__prof_g.allocs = na;
    qk__prof_g.cap_allocs = cap;
    qk__prof_g.n_tomb = 0;
    return 0;
}

static void qk__prof_mem_point(uint64_t now)
{
    qk__prof_mpoint *p;
    if (qk__prof_g.n_mseries == qk__prof_g.cap_mseries) {
        size_t nc = qk__prof_g.cap_mseries ? qk__prof_g.cap_mseries * 2 : 256;
        void *np;
        if (nc > 65536) { qk__prof_g.dropped_mpoints++; return; }
        np = QK_PROF_REALLOC(qk__prof_g.mseries, nc * sizeof *p);
        if (!np) { qk__prof_g.dropped_mpoints++; return; }
        qk__prof_g.mseries = (qk__prof_mpoint *)np;
        qk__prof_g.cap_mseries = nc;
    }
    p = &qk__prof_g.mseries[qk__prof_g.n_mseries++];
    p->t = now;
    p->host = qk__prof_g.mem_cur[QK__PROF_MEM_HOST] + qk__prof_g.mem_cur[QK__PROF_MEM_PINNED];
    p->device = qk__prof_g.mem_cur[QK__PROF_MEM_DEVICE] + qk__prof_g.mem_cur[QK__PROF_MEM_MANAGED];
}

static int qk__prof_mem_kind(const void *ptr)
{
#ifdef QK_PROF_CUDA
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) { cudaGetLastError(); return QK__PROF_MEM_HOST; }
    if (a.type == cudaMemoryTypeDevice) return QK__PROF_MEM_DEVICE;
    if (a.type == cudaMemoryTypeManaged) return QK__PROF_MEM_MANAGED;
    if (a.type == cudaMemoryTypeHost) return QK__PROF_MEM_PINNED;
#else
    (void)ptr;
#endif
    return QK__PROF_MEM_HOST;
}

QK_PROF_DEF void qk_prof_track(const char *name, const void *ptr, size_t bytes, const char *dtype,
                               int ndim, const int64_t *shape)
{
    int kind, ni;
    size_t j;
    uint64_t now;
    qk__prof_mname *mn;
    if (!ptr) return;
    kind = qk__prof_mem_kind(ptr); /* outside the lock: may call into CUDA */
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.ready) qk__prof_init_locked(NULL);
    now = qk__prof_now();
    if ((qk__prof_g.n_allocs + qk__prof_g.n_tomb + 1) * 2 > qk__prof_g.cap_allocs &&
        qk__prof_alloc_rehash(qk__prof_g.cap_allocs ? qk__prof_g.cap_allocs * 2 : 64) != 0)
        goto out;
    for (ni = 0; ni < qk__prof_g.n_mnames; ni++)
        if (qk__prof_g.mnames[ni].kind == kind && strncmp(qk__prof_g.mnames[ni].name, name ? name : "", 63) == 0) break;
    if (ni == qk__prof_g.n_mnames) {
        if (qk__prof_grow((void **)&qk__prof_g.mnames, &qk__prof_g.cap_mnames, ni + 1, sizeof *mn) != 0) goto out;
        mn = &qk__prof_g.mnames[ni];
        memset(mn, 0, sizeof *mn);
        qk__prof_copy(mn->name, sizeof mn->name, name ? name : "");
        mn->kind = kind;
        qk__prof_g.n_mnames++;
    }
    mn = &qk__prof_g.mnames[ni];
    if (dtype) qk__prof_copy(mn->dtype, sizeof mn->dtype, dtype);
    if (shape && ndim > 0) {
        int k, o = 0;
        for (k = 0; k < ndim && o < (int)sizeof mn->shape - 1; k++)
            o += snprintf(mn->shape + o, sizeof mn->shape - (size_t)o, k ? "x%lld" : "%lld", (long long)shape[k]);
    }
    j = qk__prof_hash(ptr) & (qk__prof_g.cap_allocs - 1);
    while (qk__prof_g.allocs[j].ptr && qk__prof_g.allocs[j].ptr != ptr) j = (j + 1) & (qk__prof_g.cap_allocs - 1);
    if (qk__prof_g.allocs[j].ptr == ptr) { /* re-tracked without untrack: replace */
        qk__prof_alloc *a = &qk__prof_g.allocs[j];
        qk__prof_g.mnames[a->name].current -= (double)a->bytes;
        qk__prof_g.mem_cur[a->kind] -= (double)a->bytes;
    } else {
        qk__prof_g.n_allocs++;
    }
    qk__prof_g.allocs[j].ptr = ptr;
    qk__prof_g.allocs[j].bytes = bytes;
    qk__prof_g.allocs[j].name = ni;
    qk__prof_g.allocs[j].kind = kind;
    mn->current += (double)bytes;
    mn->allocs++;
    if (mn->current > mn->peak) mn->peak = mn->current;
    qk__prof_g.mem_cur[kind] += (double)bytes;
    if (qk__prof_g.mem_cur[kind] > qk__prof_g.mem_peak[kind]) qk__prof_g.mem_peak[kind] = qk__prof_g.mem_cur[kind];
    qk__prof_mem_point(now);
    qk__prof_g.last_tick_other = now;
out:
    pthread_mutex_unlock(&qk__prof_mu);
}

QK_PROF_DEF void qk_prof_untrack(const void *ptr)
{
    size_t j, cap;
    if (!ptr) return;
    pthread_mutex_lock(&qk__prof_mu);
    cap = qk__prof_g.cap_allocs;
    if (cap) {
        j = qk__prof_hash(ptr) & (cap - 1);
        while (qk__prof_g.allocs[j].ptr && qk__prof_g.allocs[j].ptr != ptr) j = (j + 1) & (cap - 1);
        if (qk__prof_g.allocs[j].ptr == ptr) {
            qk__prof_alloc *a = &qk__prof_g.allocs[j];
            uint64_t now = qk__prof_now();
            qk__prof_g.mnames[a->name].current -= (double)a->bytes;
            qk__prof_g.mem_cur[a->kind] -= (double)a->bytes;
            a->ptr = QK__PROF_TOMB;
            qk__prof_g.n_allocs--;
            qk__prof_g.n_tomb++;
            qk__prof_mem_point(now);
            qk__prof_g.last_tick_other = now;
        }
    }
    pthread_mutex_unlock(&qk__prof_mu);
}

static void qk__prof_add_snap(const qk__prof_snap *s)
{
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.ready) qk__prof_init_locked(NULL);
    if (qk__prof_grow((void **)&qk__prof_g.snaps, &qk__prof_g.cap_snaps, qk__prof_g.n_snaps + 1, sizeof *s) == 0) {
        qk__prof_snap *d = &qk__prof_g.snaps[qk__prof_g.n_snaps++];
        *d = *s;
        d->t = qk__prof_now();
        d->host_tracked = qk__prof_g.mem_cur[QK__PROF_MEM_HOST] + qk__prof_g.mem_cur[QK__PROF_MEM_PINNED];
        d->device_tracked = qk__prof_g.mem_cur[QK__PROF_MEM_DEVICE] + qk__prof_g.mem_cur[QK__PROF_MEM_MANAGED];
        qk__prof_g.last_tick_other = d->t;
    }
    pthread_mutex_unlock(&qk__prof_mu);
}

QK_PROF_DEF void qk_prof_mem_snapshot(const char *label)
{
    qk__prof_snap s;
    memset(&s, 0, sizeof s);
    qk__prof_copy(s.label, sizeof s.label, label);
    s.dev_free = s.dev_total = -1;
#ifdef QK_PROF_CUDA
    {
        size_t fr = 0, to = 0;
        if (cudaMemGetInfo(&fr, &to) == cudaSuccess) { s.dev_free = (double)fr; s.dev_total = (double)to; }
        else cudaGetLastError();
    }
#endif
    qk__prof_add_snap(&s);
}

QK_PROF_DEF void qk_prof_mempool(const char *label, void *pool)
{
    qk__prof_snap s;
    memset(&s, 0, sizeof s);
    qk__prof_copy(s.label, sizeof s.label, label);
    s.dev_free = s.dev_total = -1;
    s.is_pool = 1;
#ifdef QK_PROF_CUDA
    {
        cudaMemPool_t p = (cudaMemPool_t)pool;
        unsigned long long v[4] = { 0, 0, 0, 0 };
        if (cudaMemPoolGetAttribute(p, cudaMemPoolAttrReservedMemCurrent, &v[0]) != cudaSuccess ||
            cudaMemPoolGetAttribute(p, cudaMemPoolAttrReservedMemHigh, &v[1]) != cudaSuccess ||
            cudaMemPoolGetAttribute(p, cudaMemPoolAttrUsedMemCurrent, &v[2]) != cudaSuccess ||
            cudaMemPoolGetAttribute(p, cudaMemPoolAttrUsedMemHigh, &v[3]) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
        s.pool_reserved = (double)v[0]; s.pool_reserved_high = (double)v[1];
        s.pool_used = (double)v[2]; s.pool_used_high = (double)v[3];
    }
#else
    (void)pool;
    return;
#endif
    qk__prof_add_snap(&s);
}

static void qk__prof_add_xfer(const char *name, int dir, int pinned, double bytes, double seconds)
{
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.ready) qk__prof_init_locked(NULL);
    if (qk__prof_grow((void **)&qk__prof_g.xfers, &qk__prof_g.cap_xfers, qk__prof_g.n_xfers + 1, sizeof(qk__prof_xfer)) == 0) {
        qk__prof_xfer *x = &qk__prof_g.xfers[qk__prof_g.n_xfers++];
        qk__prof_copy(x->name, sizeof x->name, name);
        x->dir = dir; x->pinned = pinned; x->bytes = bytes; x->seconds = seconds;
    }
    pthread_mutex_unlock(&qk__prof_mu);
}

QK_PROF_DEF void qk_prof_transfer(const char *name, qk_prof_dir dir, size_t bytes, int pinned, double seconds)
{
    qk__prof_add_xfer(name, (int)dir, pinned ? 1 : 0, (double)bytes, seconds);
}

/* >>gpu ---- implementation: GPU zones ---- */
static int qk__prof_lane_id(void *stream, int device)
{
    int i, id = -1;
    pthread_mutex_lock(&qk__prof_mu);
    for (i = 0; i < qk__prof_g.n_lanes; i++)
        if (qk__prof_g.lanes[i].stream == stream && qk__prof_g.lanes[i].device == device) { id = i; break; }
    if (id < 0 && qk__prof_g.n_lanes < QK_PROF_MAX_LANES) {
        qk__prof_lane *l = &qk__prof_g.lanes[id = qk__prof_g.n_lanes++];
        l->stream = stream;
        l->device = device;
        if (stream) snprintf(l->name, sizeof l->name, "stream %d", id);
        else snprintf(l->name, sizeof l->name, "default stream");
    }
    pthread_mutex_unlock(&qk__prof_mu);
    return id;
}

QK_PROF_DEF void qk_prof_stream_name(void *stream, const char *name)
{
    int device = 0, id;
#ifdef QK_PROF_CUDA
    if (cudaGetDevice(&device) != cudaSuccess) { cudaGetLastError(); device = 0; }
#endif
    id = qk__prof_lane_id(stream, device);
    if (id < 0) return;
    pthread_mutex_lock(&qk__prof_mu);
    qk__prof_copy(qk__prof_g.lanes[id].name, sizeof qk__prof_g.lanes[id].name, name);
    pthread_mutex_unlock(&qk__prof_mu);
}

__attribute__((unused)) static void qk__prof_grec_add(qk__prof_gthread *g, uint32_t id, int lane, double start_ns, double dur_ns,
                              uint64_t bytes, int dir, int pinned, int depth)
{
    qk__prof_grec *r;
    uint64_t d = dur_ns > 0 ? (uint64_t)(dur_ns + 0.5) : 0;
    qk__prof_stat_add(&g->stats[id], d);
    if (g->n_recs == g->cap_recs) {
        size_t nc = g->cap_recs ? g->cap_recs * 2 : 1024;
        void *np;
        if (nc > qk__prof_g.desc.gpu_records_per_thread) nc = qk__prof_g.desc.gpu_records_per_thread;
        if (nc <= g->n_recs || !(np = QK_PROF_REALLOC(g->recs, nc * sizeof *r))) { g->dropped_recs++; return; }
        g->recs = (qk__prof_grec *)np;
        g->cap_recs = nc;
    }
    r = &g->recs[g->n_recs];
    r->start_ns = start_ns; r->dur_ns = dur_ns; r->bytes = bytes; r->site = id; r->lane = (uint16_t)lane;
    r->dir = (uint8_t)dir; r->pinned = (uint8_t)pinned; r->depth = (uint16_t)depth;
    __atomic_store_n(&g->n_recs, g->n_recs + 1, __ATOMIC_RELEASE);
}

static qk__prof_gthread *qk__prof_gpu_thread(qk__prof_thread *t)
{
    qk__prof_gthread *g;
    if (QK__PROF_LIKELY(t->gpu != NULL)) return t->gpu;
    if (t == &qk__prof_dummy) return NULL;
    g = (qk__prof_gthread *)qk__prof_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->stats = (qk__prof_stat *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof *g->stats);
    if (!g->stats) { QK_PROF_FREE(g); return NULL; }
    pthread_mutex_init(&g->mu, NULL);
#ifdef QK_PROF_CUDA
    if (cudaGetDevice(&g->device) != cudaSuccess) { cudaGetLastError(); g->device = 0; }
    if (g->device < 0 || g->device >= 16) g->device = 0;
    /* The base event of this device: recorded and waited for once, so GPU times can be placed
       on the host timeline (the only synchronization the profiler makes outside reports). */
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.base_ev[g->device]) {
        /* On a private non-blocking stream: no implicit wait for the caller's work (as the
           legacy default stream would make) and nothing recorded into the caller's streams. */
        cudaEvent_t base;
        cudaStream_t bs;
        if (cudaStreamCreateWithFlags(&bs, cudaStreamNonBlocking) == cudaSuccess) {
            if (cudaEventCreate(&base) == cudaSuccess) {
                cudaEventRecord(base, bs);
                cudaEventSynchronize(base);
                qk__prof_g.base_tick[g->device] = qk__prof_now();
                qk__prof_g.base_ev[g->device] = (void *)base;
            }
            cudaStreamDestroy(bs);
        }
        cudaGetLastError();
    }
    pthread_mutex_unlock(&qk__prof_mu);
#endif
    __atomic_store_n(&t->gpu, g, __ATOMIC_RELEASE);
    return g;
}

#ifdef QK_PROF_CUDA
static cudaEvent_t qk__prof_ev_get(qk__prof_gthread *g)
{
    cudaEvent_t e = NULL;
    if (g->n_pool > 0) return g->pool[--g->n_pool];
    if (cudaEventCreate(&e) != cudaSuccess) { cudaGetLastError(); return NULL; }
    return e;
}

static void qk__prof_ev_put(qk__prof_gthread *g, cudaEvent_t e)
{
    if (!e) return;
    if (qk__prof_grow((void **)&g->pool, &g->cap_pool, g->n_pool + 1, sizeof e) != 0) { cudaEventDestroy(e); return; }
    g->pool[g->n_pool++] = e;
}

/* Resolves finished zones of one lane. Completion is monotone in the order the zones' e1 were
   recorded on the stream (the ends ring), so a binary search with O(log n) cudaEventQuery calls
   finds every finished zone; then the head of the lane (begin order) is resolved while done:
   start from the previous zone's e0 (chained, so the float milliseconds of
   cudaEventElapsedTime never grow large), duration from the zone's own pair. */
#define QK__PROF_ZONE(L, seq) (&(L)->q[((L)->head + (int)((seq) - (L)->head_seq)) % (L)->cap])
static int qk__prof_ev_done(cudaEvent_t e, int wait)
{
    cudaError_t r = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
    if (r == cudaErrorNotReady) return 0;
    if (r != cudaSuccess) cudaGetLastError(); /* a failed event counts as done: never block on it */
    return 1;
}

static void qk__prof_lane_resolve(qk__prof_gthread *g, qk__prof_lanec *L, int wait)
{
    int lo = -1, hi = L->e_count, k;
    if (hi > 0) {
        if (qk__prof_ev_done(QK__PROF_ZONE(L, L->ends[(L->e_head + hi - 1) % L->cap])->e1, wait)) {
            lo = hi - 1;
        } else {
            hi--;
            while (hi - lo > 1) {
                int mid = (lo + hi) / 2;
                if (qk__prof_ev_done(QK__PROF_ZONE(L, L->ends[(L->e_head + mid) % L->cap])->e1, 0)) lo = mid;
                else hi = mid;
            }
        }
        for (k = 0; k <= lo; k++) QK__PROF_ZONE(L, L->ends[(L->e_head + k) % L->cap])->done = 1;
        L->e_head = (L->e_head + lo + 1) % L->cap;
        L->e_count -= lo + 1;
    }
    while (L->count > 0) {
        qk__prof_gz *z = &L->q[L->head];
        float a = 0, b = 0;
        double start_ms;
        if (!z->done) break;
        if (cudaEventElapsedTime(&a, L->prev, z->e0) != cudaSuccess ||
            cudaEventElapsedTime(&b, z->e0, z->e1) != cudaSuccess) {
            cudaGetLastError(); /* an event failed (e.g. recorded in a capture): skip the zone */
            a = 0; b = -1;
        }
        start_ms = L->prev_ms + (double)a;
        if (b >= 0) {
            qk__prof_grec_add(g, z->id, L->lane, start_ms * 1e6, (double)b * 1e6, z->bytes, z->dir, z->pinned, z->depth);
            if (z->step >= 0) qk__prof_steps_gpu(z->id, z->step, (double)b * 1e6); /* >>steps */
        }
        if (L->prev != (cudaEvent_t)qk__prof_g.base_ev[g->device]) qk__prof_ev_put(g, L->prev);
        L->prev = z->e0;
        L->prev_ms = start_ms;
        if (z->e1 != z->e0) qk__prof_ev_put(g, z->e1);
        L->head = (L->head + 1) % L->cap;
        L->head_seq++;
        L->count--;
        g->pending--;
    }
}

static void qk__prof_gpu_resolve(qk__prof_gthread *g, int wait)
{
    int i;
    for (i = 0; i < g->n_lanes; i++) qk__prof_lane_resolve(g, &g->lanes[i], wait);
}

static int qk__prof_lanec_find(qk__prof_gthread *g, void *stream)
{
    int i;
    for (i = 0; i < g->n_lanes; i++)
        if (g->lanes[i].stream == stream) return i;
    return -1;
}

/* Lock order: the global lock before a thread's GPU lock, never the reverse. So the lane id of
   a new stream is looked up (global lock) before the caller takes g->mu; only the owning thread
   adds lanes, so the search is stable in between. */
static int qk__prof_lanec_get(qk__prof_gthread *g, void *stream, int lane)
{
    int i;
    qk__prof_lanec *L;
    if ((i = qk__prof_lanec_find(g, stream)) >= 0) return i;
    if (lane < 0) return -1;
    if (qk__prof_grow((void **)&g->lanes, &g->cap_lanes, g->n_lanes + 1, sizeof *L) != 0) return -1;
    L = &g->lanes[g->n_lanes];
    memset(L, 0, sizeof *L);
    L->q = (qk__prof_gz *)qk__prof_calloc((size_t)qk__prof_g.desc.gpu_queue, sizeof *L->q);
    L->ends = (int64_t *)qk__prof_calloc((size_t)qk__prof_g.desc.gpu_queue, sizeof *L->ends);
    if (!L->q || !L->ends) { QK_PROF_FREE(L->q); QK_PROF_FREE(L->ends); return -1; }
    L->stream = stream;
    L->lane = lane;
    L->cap = qk__prof_g.desc.gpu_queue;
    L->prev = (cudaEvent_t)qk__prof_g.base_ev[g->device];
    L->prev_ms = 0;
    L->next_resolve = L->cap / 4 > 1 ? L->cap / 4 : 1;
    return g->n_lanes++;
}
#endif /* QK_PROF_CUDA */

static void qk__prof_gpu_begin_x(qk_prof_site *site, void *stream)
{
    qk__prof_thread *t = qk__prof_thread_get();
    qk__prof_gthread *g = qk__prof_gpu_thread(t);
    uint32_t id = qk__prof_site_id(site);
#ifdef QK_PROF_NVTX
    nvtxRangePushA(site->name);
#endif
    if (!g) { t->dropped++; return; }
#ifdef QK_PROF_CUDA
    {
        int lane = qk__prof_lanec_find(g, stream) >= 0 ? 0 : qk__prof_lane_id(stream, g->device);
        pthread_mutex_lock(&g->mu);
        int li = qk__prof_lanec_get(g, stream, lane), d = g->depth++;
        qk__prof_lanec *L;
        qk__prof_gz *z;
        if ((unsigned)d >= QK_PROF_MAX_DEPTH) { t->too_deep++; goto out; }
        g->stack[d].lanec = -1;
        if (li < 0) { g->dropped++; goto out; }
        L = &g->lanes[li];
        if (L->count == L->cap) qk__prof_lane_resolve(g, L, 0);
        if (L->count == L->cap) { g->dropped++; goto out; }
        z = &L->q[(L->head + L->count) % L->cap];
        memset(z, 0, sizeof *z);
        z->e0 = qk__prof_ev_get(g);
        z->e1 = qk__prof_ev_get(g);
        if (!z->e0 || !z->e1) {
            qk__prof_ev_put(g, z->e0);
            qk__prof_ev_put(g, z->e1);
            g->dropped++;
            goto out;
        }
        z->site = site;
        z->id = id;
        z->depth = (uint16_t)d;
        z->step = __atomic_load_n(&qk__prof_step_cur, __ATOMIC_RELAXED); /* >>steps */
        if (cudaEventRecord(z->e0, (cudaStream_t)stream) != cudaSuccess) {
            cudaGetLastError();
            qk__prof_ev_put(g, z->e0);
            qk__prof_ev_put(g, z->e1);
            g->dropped++;
            goto out;
        }
        L->count++;
        g->pending++;
        g->stack[d].lanec = li;
        g->stack[d].seq = L->head_seq + L->count - 1;
    }
out:
    pthread_mutex_unlock(&g->mu);
#else
    (void)stream; (void)id;
    pthread_mutex_lock(&qk__prof_mu);
    qk__prof_g.gpu_ignored++;
    pthread_mutex_unlock(&qk__prof_mu);
#endif
}

static void qk__prof_gpu_end_x(const char *name, void *stream, uint64_t bytes, int dir, int pinned)
{
    qk__prof_thread *t = qk__prof_tls;
    qk__prof_gthread *g = t ? t->gpu : NULL;
#ifdef QK_PROF_NVTX
    nvtxRangePop();
#endif
    (void)stream;
    if (!g) { if (t) t->unbalanced++; return; }
#ifdef QK_PROF_CUDA
    pthread_mutex_lock(&g->mu);
    if (g->depth <= 0) { t->unbalanced++; goto out; }
    {
        int d = --g->depth, li;
        qk__prof_lanec *L;
        qk__prof_gz *z;
        if ((unsigned)d >= QK_PROF_MAX_DEPTH || g->stack[d].lanec < 0) goto out; /* begin was dropped */
        li = g->stack[d].lanec;
        L = &g->lanes[li];
        /* An open zone cannot resolve (it has no e1), so it is still in the ring. */
        z = &L->q[(L->head + (int)(g->stack[d].seq - L->head_seq)) % L->cap];
        if (z->site->name != name && (!name || strcmp(z->site->name, name) != 0)) t->mismatched++;
        /* e1 goes on the zone's own stream, so completion stays monotone along the lane. */
        if (cudaEventRecord(z->e1, (cudaStream_t)L->stream) != cudaSuccess) {
            cudaGetLastError();
            z->e1 = z->e0; /* resolves as zero length rather than corrupting the lane */
        }
        z->ended = 1;
        z->bytes = bytes;
        z->dir = (uint8_t)dir;
        z->pinned = (uint8_t)pinned;
        L->ends[(L->e_head + L->e_count++) % L->cap] = g->stack[d].seq;
        t->last_tick = qk__prof_now();
        /* Resolve without waiting each time another quarter of the lane's queue has ended:
           a few queries per pass; while the GPU is far behind, passes stay that far apart. */
        if (L->e_count >= L->next_resolve) {
            qk__prof_lane_resolve(g, L, 0);
            L->next_resolve = L->e_count + (L->cap / 4 > 1 ? L->cap / 4 : 1);
        }
    }
out:
    pthread_mutex_unlock(&g->mu);
#else
    (void)name; (void)bytes; (void)dir; (void)pinned;
#endif
}

QK_PROF_DEF void qk_prof_gpu_begin(qk_prof_site *site, void *stream) { qk__prof_gpu_begin_x(site, stream); }
QK_PROF_DEF void qk_prof_gpu_end(const char *name, void *stream) { qk__prof_gpu_end_x(name, stream, 0, 0, 0); }

QK_PROF_DEF int qk_prof_gpu_collect(int wait)
{
#ifdef QK_PROF_CUDA
    qk__prof_thread *t;
    pthread_mutex_lock(&qk__prof_mu);
    t = qk__prof_g.threads;
    pthread_mutex_unlock(&qk__prof_mu);
    for (; t; t = t->next) {
        qk__prof_gthread *g = __atomic_load_n(&t->gpu, __ATOMIC_ACQUIRE);
        if (!g) continue;
        pthread_mutex_lock(&g->mu);
        qk__prof_gpu_resolve(g, wait);
        pthread_mutex_unlock(&g->mu);
    }
#else
    (void)wait;
#endif
    return 0;
}

QK_PROF_DEF int qk_prof_memcpy(qk_prof_site *site, void *dst, const void *src, size_t bytes, int kind, void *stream)
{
#ifdef QK_PROF_CUDA
    int dir = QK_PROF_DIR_NONE, pinned = 0, kd, ks;
    cudaError_t err;
    kd = qk__prof_mem_kind(dst);
    ks = qk__prof_mem_kind(src);
    {
        int dd = kd == QK__PROF_MEM_DEVICE || kd == QK__PROF_MEM_MANAGED;
        int sd = ks == QK__PROF_MEM_DEVICE || ks == QK__PROF_MEM_MANAGED;
        if (kind == cudaMemcpyHostToDevice || (kind == cudaMemcpyDefault && dd && !sd)) dir = QK_PROF_H2D;
        else if (kind == cudaMemcpyDeviceToHost || (kind == cudaMemcpyDefault && !dd && sd)) dir = QK_PROF_D2H;
        else if (kind == cudaMemcpyDeviceToDevice || (kind == cudaMemcpyDefault && dd && sd)) dir = QK_PROF_D2D;
        else dir = QK_PROF_H2H;
        if (dir == QK_PROF_H2D) pinned = ks == QK__PROF_MEM_PINNED;
        else if (dir == QK_PROF_D2H) pinned = kd == QK__PROF_MEM_PINNED;
        else if (dir == QK_PROF_H2H) pinned = ks == QK__PROF_MEM_PINNED && kd == QK__PROF_MEM_PINNED;
    }
    qk__prof_gpu_begin_x(site, stream);
    err = cudaMemcpyAsync(dst, src, bytes, (enum cudaMemcpyKind)kind, (cudaStream_t)stream);
    qk__prof_gpu_end_x(site->name, stream, (uint64_t)bytes, dir, pinned);
    return (int)err;
#else
    (void)site; (void)dst; (void)src; (void)bytes; (void)kind; (void)stream;
    return -1;
#endif
}

/* >>steps ---- implementation: step markers (recording) ---- */
/* QK_PROF_STEP(i) closes the open step and opens step i. Closing a step sums, per zone name, the
   time of the CPU zones that ended in it: the events every thread published since the last
   marker (the marker reads them as a report does, without stopping the threads) plus the zones
   whose events were dropped (their running totals' growth). The hot path is untouched: all the
   work is the marker's, proportional to the zones of the step. GPU zones carry the step open at
   their begin and are added when they resolve. Memory is bounded: per zone name a ring of the
   last desc.step_window per-step totals (with the step each slot holds), per thread a scan
   position and, once it dropped events, a copy of its dropped totals. */
typedef struct qk__prof_sname {
    const char *name;
    int gpu;
    int64_t first;              /* the first step (sequence number) the zone ran in */
    double *val;                /* [window]: per-step total, ticks (CPU) or ns (GPU) */
    int64_t *seq;               /* [window]: the step a slot holds (-1: none) */
} qk__prof_sname;

typedef struct qk__prof_steps {
    int ready, open;
    int warmup, window;
    int64_t seq;                /* the open step's sequence number (0, 1, ... in marker order) */
    int64_t closed;             /* steps closed */
    int64_t user;               /* the open step's index as given */
    uint64_t t0;                /* the open step's start tick */
    double *step_ticks;         /* [window]: step durations */
    int64_t *step_user;         /* [window]: their indices as given */
    qk__prof_sname *names;
    int n_names, cap_names;
    int slot[2][QK_PROF_MAX_SITES]; /* site id -> names index + 1, CPU and GPU */
    size_t pos[QK_PROF_MAX_THREADS];  /* events of each thread (by index) already counted */
    uint64_t *dseen[QK_PROF_MAX_THREADS]; /* dropped-zone totals already counted, per site */
    uint64_t late_gpu;          /* GPU zones resolved after their step left the window */
    uint64_t dropped;           /* zone names that could not be allocated */
} qk__prof_steps;

static qk__prof_steps qk__prof_st;
static pthread_mutex_t qk__prof_st_mu = PTHREAD_MUTEX_INITIALIZER;

static int qk__prof_steps_setup(void)
{
    int w;
    if (qk__prof_st.ready) return 0;
    w = qk__prof_g.desc.step_window > 0 ? qk__prof_g.desc.step_window : 4096;
    qk__prof_st.step_ticks = (double *)qk__prof_calloc((size_t)w, sizeof(double));
    qk__prof_st.step_user = (int64_t *)qk__prof_calloc((size_t)w, sizeof(int64_t));
    if (!qk__prof_st.step_ticks || !qk__prof_st.step_user) {
        QK_PROF_FREE(qk__prof_st.step_ticks);
        QK_PROF_FREE(qk__prof_st.step_user);
        qk__prof_st.step_ticks = NULL;
        qk__prof_st.step_user = NULL;
        return -1;
    }
    qk__prof_st.window = w;
    qk__prof_st.warmup = qk__prof_g.desc.step_warmup > 0 ? qk__prof_g.desc.step_warmup
                         : qk__prof_g.desc.step_warmup < 0 ? 0 : 1;
    qk__prof_st.ready = 1;
    return 0;
}

/* The name slot of a site (CPU or GPU), created on first use; NULL when out of memory. */
static qk__prof_sname *qk__prof_steps_name(uint32_t site, int gpu)
{
    int *slot = &qk__prof_st.slot[gpu][site % QK_PROF_MAX_SITES], i;
    const char *name;
    qk__prof_sname *n;
    if (*slot > 0) return &qk__prof_st.names[*slot - 1];
    name = qk__prof_site_name(site);
    for (i = 0; i < qk__prof_st.n_names; i++)
        if (qk__prof_st.names[i].gpu == gpu && strcmp(qk__prof_st.names[i].name, name) == 0) break;
    if (i == qk__prof_st.n_names) {
        int k;
        if (qk__prof_grow((void **)&qk__prof_st.names, &qk__prof_st.cap_names, i + 1, sizeof *n) != 0) {
            qk__prof_st.dropped++;
            return NULL;
        }
        n = &qk__prof_st.names[i];
        memset(n, 0, sizeof *n);
        n->val = (double *)qk__prof_calloc((size_t)qk__prof_st.window, sizeof(double));
        n->seq = (int64_t *)QK_PROF_MALLOC((size_t)qk__prof_st.window * sizeof(int64_t));
        if (!n->val || !n->seq) {
            QK_PROF_FREE(n->val);
            QK_PROF_FREE(n->seq);
            qk__prof_st.dropped++;
            return NULL;
        }
        for (k = 0; k < qk__prof_st.window; k++) n->seq[k] = -1;
        n->name = name;
        n->gpu = gpu;
        n->first = -1;
        qk__prof_st.n_names++;
    }
    *slot = i + 1;
    return &qk__prof_st.names[i];
}

static void qk__prof_steps_add(qk__prof_sname *n, int64_t step, double v)
{
    int k = (int)(step % qk__prof_st.window);
    if (!n) return;
    if (n->seq[k] != step) { n->seq[k] = step; n->val[k] = 0; }
    n->val[k] += v;
    if (n->first < 0 || step < n->first) n->first = step;
}

/* Counts (add = 1) or skips (add = 0) the zones every thread ended since the last marker. */
static void qk__prof_steps_scan(qk__prof_thread *threads, uint32_t n_sites, int add)
{
    qk__prof_thread *t;
    for (t = threads; t; t = t->next) {
        int idx = t->index;
        size_t n, e;
        uint32_t i;
        if (idx < 0 || idx >= QK_PROF_MAX_THREADS) continue;
        n = qk__prof_count(t);
        for (e = qk__prof_st.pos[idx]; add && e < n; e++) {
            const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
            if (QK__PROF_KIND(ev) == 0)
                qk__prof_steps_add(qk__prof_steps_name(QK__PROF_SITE(ev), 0), qk__prof_st.seq, (double)(ev->t1 - ev->t0));
        }
        qk__prof_st.pos[idx] = n;
        if (!t->dropped) continue;
        if (!qk__prof_st.dseen[idx]) {  /* first look since it dropped: all of it is this step's */
            qk__prof_st.dseen[idx] = (uint64_t *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof(uint64_t));
            if (!qk__prof_st.dseen[idx]) continue;
        }
        for (i = 1; i < QK_PROF_MAX_SITES; i++) {
            uint64_t tot = __atomic_load_n(&t->stats[i].total, __ATOMIC_RELAXED);
            if (i >= n_sites && i != QK__PROF_OTHER_SITE) continue;
            if (add && tot > qk__prof_st.dseen[idx][i])
                qk__prof_steps_add(qk__prof_steps_name(i, 0), qk__prof_st.seq, (double)(tot - qk__prof_st.dseen[idx][i]));
            qk__prof_st.dseen[idx][i] = tot;
        }
    }
}

static void qk__prof_steps_mark(int64_t index, int begin)
{
    qk__prof_thread *threads;
    uint32_t n_sites;
    uint64_t now;
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.ready) qk__prof_init_locked(NULL);
    threads = qk__prof_g.threads;
    n_sites = qk__prof_g.n_sites;
    pthread_mutex_unlock(&qk__prof_mu);
    now = qk__prof_now();
    pthread_mutex_lock(&qk__prof_st_mu);
    if (qk__prof_steps_setup() != 0) { pthread_mutex_unlock(&qk__prof_st_mu); return; }
    if (qk__prof_st.open) {
        int64_t s = qk__prof_st.seq;
        int k = (int)(s % qk__prof_st.window);
        qk__prof_steps_scan(threads, n_sites, s >= qk__prof_st.warmup);
        qk__prof_st.step_ticks[k] = (double)(now - qk__prof_st.t0);
        qk__prof_st.step_user[k] = qk__prof_st.user;
        qk__prof_st.closed = s + 1;
        qk__prof_st.open = 0;
    } else {
        qk__prof_steps_scan(threads, n_sites, 0); /* zones between steps count in none */
    }
    if (begin) {
        qk__prof_st.open = 1;
        qk__prof_st.seq = qk__prof_st.closed;
        qk__prof_st.user = index;
        qk__prof_st.t0 = now;
    }
    __atomic_store_n(&qk__prof_step_cur, begin ? qk__prof_st.seq : -1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&qk__prof_st_mu);
}

QK_PROF_DEF void qk_prof_step(int64_t index) { qk__prof_steps_mark(index, 1); }
QK_PROF_DEF void qk_prof_step_end(void) { qk__prof_steps_mark(0, 0); }

/* A resolved GPU zone of step `step` (called with its thread's GPU lock held). */
__attribute__((unused)) static void qk__prof_steps_gpu(uint32_t site, int64_t step, double dur_ns)
{
    pthread_mutex_lock(&qk__prof_st_mu);
    if (qk__prof_st.ready && step >= qk__prof_st.warmup) {
        int64_t newest = qk__prof_st.open ? qk__prof_st.seq : qk__prof_st.closed - 1;
        if (step + qk__prof_st.window <= newest) qk__prof_st.late_gpu++;
        else qk__prof_steps_add(qk__prof_steps_name(site, 1), step, dur_ns);
    }
    pthread_mutex_unlock(&qk__prof_st_mu);
}

static void qk__prof_steps_free(void)
{
    int i;
    pthread_mutex_lock(&qk__prof_st_mu);
    for (i = 0; i < qk__prof_st.n_names; i++) {
        QK_PROF_FREE(qk__prof_st.names[i].val);
        QK_PROF_FREE(qk__prof_st.names[i].seq);
    }
    QK_PROF_FREE(qk__prof_st.names);
    for (i = 0; i < QK_PROF_MAX_THREADS; i++) QK_PROF_FREE(qk__prof_st.dseen[i]);
    QK_PROF_FREE(qk__prof_st.step_ticks);
    QK_PROF_FREE(qk__prof_st.step_user);
    memset(&qk__prof_st, 0, sizeof qk__prof_st);
    __atomic_store_n(&qk__prof_step_cur, -1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&qk__prof_st_mu);
}
/* >>steps (recording) end */

/* >>shutdown ---- implementation: shutdown ---- */
QK_PROF_DEF void qk_prof_shutdown(void)
{
    qk__prof_thread *t, *n;
    uint32_t i;
    pthread_mutex_lock(&qk__prof_mu);
    for (t = qk__prof_g.threads; t; t = n) {
        size_t c;
        n = t->next;
        for (c = 0; c < t->n_alloc; c++) QK_PROF_FREE(t->chunks[c]);
        QK_PROF_FREE(t->chunks);
        QK_PROF_FREE(t->stats);
        QK_PROF_FREE(t->cstats);
        if (t->gpu) {
            qk__prof_gthread *g = t->gpu;
#ifdef QK_PROF_CUDA
            int l, k;
            for (l = 0; l < g->n_lanes; l++) {
                qk__prof_lanec *L = &g->lanes[l];
                for (k = 0; k < L->count; k++) {
                    qk__prof_gz *z = &L->q[(L->head + k) % L->cap];
                    cudaEventDestroy(z->e0);
                    if (z->e1 != z->e0) cudaEventDestroy(z->e1);
                }
                if (L->prev != (cudaEvent_t)qk__prof_g.base_ev[g->device]) cudaEventDestroy(L->prev);
                QK_PROF_FREE(L->q);
                QK_PROF_FREE(L->ends);
            }
            for (k = 0; k < g->n_pool; k++) cudaEventDestroy(g->pool[k]);
            QK_PROF_FREE(g->pool);
            QK_PROF_FREE(g->lanes);
#endif
            pthread_mutex_destroy(&g->mu);
            QK_PROF_FREE(g->stats);
            QK_PROF_FREE(g->recs);
            QK_PROF_FREE(g);
        }
        QK_PROF_FREE(t);
    }
#ifdef QK_PROF_CUDA
    for (i = 0; i < 16; i++)
        if (qk__prof_g.base_ev[i]) cudaEventDestroy((cudaEvent_t)qk__prof_g.base_ev[i]);
    cudaGetLastError();
#endif
    for (i = 1; i < qk__prof_g.n_sites; i++)
        if (qk__prof_g.sites[i]) qk__prof_g.sites[i]->id = 0;
    QK_PROF_FREE(qk__prof_g.allocs);
    QK_PROF_FREE(qk__prof_g.mnames);
    QK_PROF_FREE(qk__prof_g.mseries);
    QK_PROF_FREE(qk__prof_g.snaps);
    QK_PROF_FREE(qk__prof_g.xfers);
    qk__prof_steps_free(); /* >>steps */
    qk__prof_mpi_free(); /* >>mpi */
    memset(&qk__prof_g, 0, sizeof qk__prof_g);
    memset(&qk__prof_dummy, 0, sizeof qk__prof_dummy);
    memset(qk__prof_dummy_stats, 0, sizeof qk__prof_dummy_stats);
    pthread_mutex_unlock(&qk__prof_mu);
    qk__prof_tls = NULL; /* other threads must have exited (see Thread safety) */
    pthread_once(&qk__prof_key_once, qk__prof_key_make);
    pthread_setspecific(qk__prof_key, NULL);
}

/* >>model ---- implementation: report model and statistics queries ---- */
typedef struct qk__prof_row {
    const char *name;
    int sites;
    uint64_t n;
    double total, min, max, mean, m2;
    double child;               /* time of the zones nested directly in these calls (CPU) */
} qk__prof_row;

typedef struct qk__prof_crow {
    const char *name;
    uint64_t n;
    double sum, last, min, max;
    int add;
} qk__prof_crow;

typedef struct qk__prof_lrow {
    const char *name;
    int device, id;
    uint64_t zones;
    double busy, first, last;
} qk__prof_lrow;

typedef struct qk__prof_xrow {
    int dir, pinned;
    uint64_t count;
    double bytes, seconds, min_gbps, max_gbps;
} qk__prof_xrow;

typedef struct qk__prof_model {
    double npt;                 /* ns per tick */
    uint64_t t0;                /* origin tick */
    double wall;                /* ns */
    double base_ns[16];         /* device base events on the host timeline, ns from origin */
    qk__prof_row *cpu, *gpu;
    int n_cpu, n_gpu;
    qk__prof_crow *ctr;
    int n_ctr;
    qk__prof_lrow lanes[QK_PROF_MAX_LANES];
    int n_lanes;
    qk__prof_xrow xr[5][2];
    qk_prof_summary sum;
    qk__prof_thread **threads;  /* by index */
    int n_threads;
} qk__prof_model;

static void qk__prof_row_add(qk__prof_row *r, const qk__prof_stat *s, double f)
{
    double nb, mb, m2b, delta, n;
    if (!s->n) return;
    nb = (double)s->n;
    mb = f * ((double)s->shift + s->s1 / nb);
    m2b = f * f * (s->s2 - s->s1 * s->s1 / nb);
    if (m2b < 0) m2b = 0;
    if (r->n == 0) {
        r->mean = mb; r->m2 = m2b; r->min = f * (double)s->min; r->max = f * (double)s->max;
    } else {
        n = (double)r->n + nb;
        delta = mb - r->mean;
        r->m2 += m2b + delta * delta * (double)r->n * nb / n;
        r->mean += delta * nb / n;
        if (f * (double)s->min < r->min) r->min = f * (double)s->min;
        if (f * (double)s->max > r->max) r->max = f * (double)s->max;
    }
    r->n += s->n;
    r->total += f * (double)s->total;
    r->child += f * (double)s->child;
}

/* A row's self time: total less its direct children (never below 0: a clock that steps back
   between cores must not make it negative). */
static double qk__prof_self(const qk__prof_row *r)
{
    return r->total > r->child ? r->total - r->child : 0.0;
}

static int qk__prof_row_cmp_name(const void *a, const void *b)
{
    return strcmp(((const qk__prof_row *)a)->name, ((const qk__prof_row *)b)->name);
}

static int qk__prof_row_cmp_total(const void *a, const void *b)
{
    double x = ((const qk__prof_row *)a)->total, y = ((const qk__prof_row *)b)->total;
    if (x != y) return x < y ? 1 : -1;
    return strcmp(((const qk__prof_row *)a)->name, ((const qk__prof_row *)b)->name);
}

/* Per-site rows merged by name; n_sites rows in, distinct names out (sorted by total). */
static int qk__prof_rows_merge(qk__prof_row *rows, int n)
{
    int i, o = 0;
    if (n <= 0) return 0;
    qsort(rows, (size_t)n, sizeof *rows, qk__prof_row_cmp_name);
    for (i = 0; i < n; i++) {
        if (o > 0 && strcmp(rows[o - 1].name, rows[i].name) == 0) {
            qk__prof_row *r = &rows[o - 1];
            qk__prof_stat s; /* re-merge through the stat form: exact n, total, min, max */
            double nb = (double)rows[i].n, delta = rows[i].mean - r->mean, nn = (double)r->n + nb;
            (void)s;
            r->m2 += rows[i].m2 + delta * delta * (double)r->n * nb / nn;
            r->mean += delta * nb / nn;
            if (rows[i].min < r->min) r->min = rows[i].min;
            if (rows[i].max > r->max) r->max = rows[i].max;
            r->n += rows[i].n;
            r->total += rows[i].total;
            r->child += rows[i].child;
            r->sites++;
        } else {
            rows[o++] = rows[i];
        }
    }
    for (i = 0; i < o; i++) if (rows[i].n) rows[i].mean = rows[i].total / (double)rows[i].n;
    qsort(rows, (size_t)o, sizeof *rows, qk__prof_row_cmp_total);
    return o;
}

static double qk__prof_std(const qk__prof_row *r)
{
    return r->n ? sqrt(r->m2 / (double)r->n) : 0.0;
}

static int qk__prof_dcmp(const void *a, const void *b)
{
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? -1 : x > y;
}

static const char *qk__prof_site_name(uint32_t id)
{
    qk_prof_site *s = id < QK_PROF_MAX_SITES ? qk__prof_g.sites[id] : NULL;
    return s && s->name ? s->name : "(unnamed)";
}

static void qk__prof_model_free(qk__prof_model *m)
{
    QK_PROF_FREE(m->cpu);
    QK_PROF_FREE(m->gpu);
    QK_PROF_FREE(m->ctr);
    QK_PROF_FREE(m->threads);
    memset(m, 0, sizeof *m);
}

static double qk__prof_gabs(const qk__prof_model *m, const qk__prof_grec *r)
{
    int dev = qk__prof_g.lanes[r->lane].device;
    return m->base_ns[dev >= 0 && dev < 16 ? dev : 0] + r->start_ns;
}

static int qk__prof_model_build(qk__prof_model *m)
{
    qk__prof_thread *t;
    uint32_t ns, i;
    int k, nt = 0;
    double end = 0;
    qk__prof_stat *tmp;
    memset(m, 0, sizeof *m);
    qk_prof_gpu_collect(1);
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.ready) qk__prof_init_locked(NULL);
    qk__prof_calibrate();
    m->npt = qk__prof_g.ns_per_tick;
    m->t0 = qk__prof_g.t_origin;
    for (k = 0; k < 16; k++)
        m->base_ns[k] = qk__prof_g.base_ev[k] ? (double)(int64_t)(qk__prof_g.base_tick[k] - m->t0) * m->npt : 0;
    ns = qk__prof_g.n_sites;
    m->cpu = (qk__prof_row *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof *m->cpu);
    m->gpu = (qk__prof_row *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof *m->gpu);
    m->ctr = (qk__prof_crow *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof *m->ctr);
    m->threads = (qk__prof_thread **)qk__prof_calloc((size_t)qk__prof_g.n_threads + 1, sizeof *m->threads);
    tmp = (qk__prof_stat *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof *tmp);
    if (!m->cpu || !m->gpu || !m->ctr || !m->threads || !tmp) {
        QK_PROF_FREE(tmp);
        pthread_mutex_unlock(&qk__prof_mu);
        qk__prof_model_free(m);
        qk__prof_seterr("qk_prof: out of memory building the report");
        return -1;
    }
    for (t = qk__prof_g.threads; t; t = t->next) {
        if (t->index >= 0 && t->index < qk__prof_g.n_threads) m->threads[t->index] = t;
        nt++;
    }
    m->n_threads = qk__prof_g.n_threads;
    m->sum.threads = nt;
    m->sum.lanes = qk__prof_g.n_lanes;
    m->sum.clock = qk__prof_g.desc.clock ? "injected" : qk__prof_g.use_tsc ? "rdtsc" : "clock_gettime";
    m->sum.ns_per_tick = m->npt;
    m->sum.dropped_threads = qk__prof_g.dropped_threads;
    m->sum.gpu_ignored = qk__prof_g.gpu_ignored;
    m->sum.dropped_events = qk__prof_dummy.dropped;
    m->sum.host_current = qk__prof_g.mem_cur[QK__PROF_MEM_HOST] + qk__prof_g.mem_cur[QK__PROF_MEM_PINNED];
    m->sum.device_current = qk__prof_g.mem_cur[QK__PROF_MEM_DEVICE] + qk__prof_g.mem_cur[QK__PROF_MEM_MANAGED];
    m->sum.host_peak = qk__prof_g.mem_peak[QK__PROF_MEM_HOST] + qk__prof_g.mem_peak[QK__PROF_MEM_PINNED];
    m->sum.device_peak = qk__prof_g.mem_peak[QK__PROF_MEM_DEVICE] + qk__prof_g.mem_peak[QK__PROF_MEM_MANAGED];
    if (qk__prof_g.last_tick_other) end = (double)(int64_t)(qk__prof_g.last_tick_other - m->t0) * m->npt;
    for (i = 0; i < QK_PROF_MAX_SITES; i++) {
        m->cpu[i].name = m->gpu[i].name = m->ctr[i].name = qk__prof_site_name(i);
        m->cpu[i].sites = m->gpu[i].sites = 1;
    }
    for (k = 0; k < qk__prof_g.n_lanes; k++) {
        m->lanes[k].name = qk__prof_g.lanes[k].name;
        m->lanes[k].device = qk__prof_g.lanes[k].device;
        m->lanes[k].id = k;
    }
    m->n_lanes = qk__prof_g.n_lanes;
    for (t = qk__prof_g.threads; t; t = t->next) {
        qk__prof_gthread *g = __atomic_load_n(&t->gpu, __ATOMIC_ACQUIRE);
        size_t ne = qk__prof_count(t), e;
        /* zone statistics: the dropped zones' running sums plus the kept events. acc[k]: time
           of the depth-k zones ended since the last END at depth k - 1, which claims it as its
           children's (self time, above qk__prof_dropped_end); zones still open leave theirs. */
        uint64_t acc[QK_PROF_MAX_DEPTH + 1];
        int maxd = 0;
        memset(acc, 0, sizeof acc);
        memcpy(tmp, t->stats, QK_PROF_MAX_SITES * sizeof *tmp);
        for (e = 0; e < ne; e++) {
            const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
            uint64_t last = ev->t0;
            if (QK__PROF_KIND(ev) == 0) {
                qk__prof_stat *st = &tmp[QK__PROF_SITE(ev) % QK_PROF_MAX_SITES];
                int dd = QK__PROF_DEPTH(ev), x;
                qk__prof_stat_add(st, ev->t1 - ev->t0);
                if (dd < QK_PROF_MAX_DEPTH) {
                    st->child += acc[dd + 1];
                    for (x = dd + 1; x <= maxd; x++) acc[x] = 0; /* deeper: unclaimed (unbalanced ENDs) */
                    acc[dd] += ev->t1 - ev->t0;
                    if (dd > maxd) maxd = dd;
                }
                last = ev->t1;
            }
            if (last - m->t0 < (uint64_t)1 << 62 && (double)(int64_t)(last - m->t0) * m->npt > end)
                end = (double)(int64_t)(last - m->t0) * m->npt;
        }
        m->sum.events += ne;
        m->sum.dropped_events += t->dropped;
        m->sum.unbalanced += t->unbalanced;
        m->sum.mismatched += t->mismatched;
        m->sum.too_deep += t->too_deep;
        if (t->last_tick) {
            double e = (double)(int64_t)(t->last_tick - m->t0) * m->npt;
            if (e > end) end = e;
        }
        for (i = 0; i < QK_PROF_MAX_SITES; i++) {
            if (tmp[i].n) qk__prof_row_add(&m->cpu[i], &tmp[i], m->npt);
            if (t->cstats && t->cstats[i].n) {
                qk__prof_crow *c = &m->ctr[i];
                const qk__prof_cstat *s = &t->cstats[i];
                if (!c->n || s->min < c->min) c->min = s->min;
                if (!c->n || s->max > c->max) c->max = s->max;
                c->n += s->n;
                c->sum += s->sum;
                c->last = s->last;
                c->add = s->add;
            }
        }
        if (g) {
            size_t r, nr = __atomic_load_n(&g->n_recs, __ATOMIC_ACQUIRE);
            pthread_mutex_lock(&g->mu);
            m->sum.dropped_gpu += g->dropped;
            m->sum.dropped_gpu_records += g->dropped_recs;
            m->sum.gpu_pending += g->pending;
            for (i = 0; i < QK_PROF_MAX_SITES; i++)
                if (g->stats[i].n) qk__prof_row_add(&m->gpu[i], &g->stats[i], 1.0);
            for (r = 0; r < nr; r++) {
                const qk__prof_grec *gr = &g->recs[r];
                double a = qk__prof_gabs(m, gr), b = a + gr->dur_ns;
                if (b > end) end = b;
                if (gr->dir && gr->bytes && gr->dir < 5) {
                    qk__prof_xrow *x = &m->xr[gr->dir][gr->pinned ? 1 : 0];
                    double gbps = gr->dur_ns > 0 ? (double)gr->bytes / gr->dur_ns : 0;
                    if (!x->count || gbps < x->min_gbps) x->min_gbps = gbps;
                    if (!x->count || gbps > x->max_gbps) x->max_gbps = gbps;
                    x->count++;
                    x->bytes += (double)gr->bytes;
                    x->seconds += gr->dur_ns * 1e-9;
                }
            }
            pthread_mutex_unlock(&g->mu);
        }
    }
    for (k = 0; k < qk__prof_g.n_xfers; k++) {
        const qk__prof_xfer *xf = &qk__prof_g.xfers[k];
        if (xf->dir > 0 && xf->dir < 5) {
            qk__prof_xrow *x = &m->xr[xf->dir][xf->pinned ? 1 : 0];
            double gbps = xf->seconds > 0 ? xf->bytes / xf->seconds * 1e-9 : 0;
            if (!x->count || gbps < x->min_gbps) x->min_gbps = gbps;
            if (!x->count || gbps > x->max_gbps) x->max_gbps = gbps;
            x->count++;
            x->bytes += xf->bytes;
            x->seconds += xf->seconds;
        }
    }
    for (k = 1; k < 5; k++) { m->xr[k][0].dir = m->xr[k][1].dir = k; m->xr[k][1].pinned = 1; }
    /* Rows: only sites that recorded, then merged by name. */
    {
        int nc = 0, ng = 0, nk = 0;
        for (i = 1; i < QK_PROF_MAX_SITES; i++) {
            if (i >= ns && i != QK__PROF_OTHER_SITE) continue;
            if (m->cpu[i].n) m->cpu[nc++] = m->cpu[i];
            if (m->gpu[i].n) m->gpu[ng++] = m->gpu[i];
            if (m->ctr[i].n) m->ctr[nk++] = m->ctr[i];
        }
        m->n_cpu = qk__prof_rows_merge(m->cpu, nc);
        m->n_gpu = qk__prof_rows_merge(m->gpu, ng);
        /* counters with one name at several sites: fold */
        {
            int a, b, o = 0;
            for (a = 0; a < nk; a++) {
                for (b = 0; b < o; b++) if (strcmp(m->ctr[b].name, m->ctr[a].name) == 0) break;
                if (b < o) {
                    if (m->ctr[a].min < m->ctr[b].min) m->ctr[b].min = m->ctr[a].min;
                    if (m->ctr[a].max > m->ctr[b].max) m->ctr[b].max = m->ctr[a].max;
                    m->ctr[b].n += m->ctr[a].n;
                    m->ctr[b].sum += m->ctr[a].sum;
                    m->ctr[b].last = m->ctr[a].last;
                } else {
                    m->ctr[o++] = m->ctr[a];
                }
            }
            m->n_ctr = o;
        }
    }
    QK_PROF_FREE(tmp);
    pthread_mutex_unlock(&qk__prof_mu);
    /* Stream utilization: union of the resolved zones' intervals per lane. */
    for (k = 0; k < m->n_lanes; k++) {
        size_t cnt = 0, o = 0, r, j;
        double *iv, cs = 0, ce = -1;
        for (t = qk__prof_g.threads; t; t = t->next)
            if (t->gpu) cnt += __atomic_load_n(&t->gpu->n_recs, __ATOMIC_ACQUIRE);
        if (!cnt) continue;
        iv = (double *)QK_PROF_MALLOC((cnt + 1024) * 2 * sizeof *iv);
        if (!iv) continue;
        for (t = qk__prof_g.threads; t; t = t->next) {
            qk__prof_gthread *g = t->gpu;
            if (!g) continue;
            pthread_mutex_lock(&g->mu); /* the owner may be growing recs */
            for (r = 0; r < g->n_recs && o < cnt + 1024; r++)
                if (g->recs[r].lane == k) {
                    iv[2 * o] = qk__prof_gabs(m, &g->recs[r]);
                    iv[2 * o + 1] = iv[2 * o] + g->recs[r].dur_ns;
                    o++;
                }
            pthread_mutex_unlock(&g->mu);
        }
        qsort(iv, o, 2 * sizeof *iv, qk__prof_dcmp);
        m->lanes[k].zones = o;
        for (j = 0; j < o; j++) {
            if (j == 0) m->lanes[k].first = iv[0];
            if (iv[2 * j + 1] > m->lanes[k].last) m->lanes[k].last = iv[2 * j + 1];
            if (iv[2 * j] > ce) {
                if (ce > cs) m->lanes[k].busy += ce - cs;
                cs = iv[2 * j];
                ce = iv[2 * j + 1];
            } else if (iv[2 * j + 1] > ce) {
                ce = iv[2 * j + 1];
            }
        }
        if (ce > cs) m->lanes[k].busy += ce - cs;
        QK_PROF_FREE(iv);
    }
    m->wall = end > 0 ? end : 0;
    m->sum.wall_ns = m->wall;
    return 0;
}

QK_PROF_DEF int qk_prof_zone_stats(const char *name, int gpu, qk_prof_stats *out)
{
    qk__prof_model m;
    int i, rc = -1, n;
    qk__prof_row *rows;
    if (qk__prof_model_build(&m) != 0) return -1;
    rows = gpu ? m.gpu : m.cpu;
    n = gpu ? m.n_gpu : m.n_cpu;
    for (i = 0; i < n; i++) {
        if (strcmp(rows[i].name, name) == 0) {
            out->calls = rows[i].n;
            out->total_ns = rows[i].total;
            out->mean_ns = rows[i].mean;
            out->min_ns = rows[i].min;
            out->max_ns = rows[i].max;
            out->std_ns = qk__prof_std(&rows[i]);
            out->self_ns = gpu ? -1.0 : qk__prof_self(&rows[i]);
            rc = 0;
            break;
        }
    }
    if (rc) qk__prof_seterr("qk_prof_zone_stats: no %s zone named \"%s\"", gpu ? "GPU" : "CPU", name);
    qk__prof_model_free(&m);
    return rc;
}

QK_PROF_DEF void qk_prof_get_summary(qk_prof_summary *out)
{
    qk__prof_model m;
    memset(out, 0, sizeof *out);
    if (qk__prof_model_build(&m) != 0) return;
    *out = m.sum;
    qk__prof_model_free(&m);
}

QK_PROF_DEF int qk_prof_stream_stats(void *stream, uint64_t *zones, double *busy_ns, double *wall_ns)
{
    qk__prof_model m;
    int k, device = 0, rc = -1;
#ifdef QK_PROF_CUDA
    if (cudaGetDevice(&device) != cudaSuccess) { cudaGetLastError(); device = 0; }
#endif
    if (qk__prof_model_build(&m) != 0) return -1;
    for (k = 0; k < m.n_lanes; k++) {
        if (qk__prof_g.lanes[k].stream == stream && qk__prof_g.lanes[k].device == device) {
            if (zones) *zones = m.lanes[k].zones;
            if (busy_ns) *busy_ns = m.lanes[k].busy;
            if (wall_ns) *wall_ns = m.wall;
            rc = 0;
        }
    }
    if (rc) qk__prof_seterr("qk_prof_stream_stats: stream %p not seen on device %d", stream, device);
    qk__prof_model_free(&m);
    return rc;
}

/* >>writers ---- implementation: writers (locale-free printf, escaping) ---- */
/* Numbers in every output are written with '.' as the decimal point, whatever locale the host
   program chose (after setlocale(LC_ALL, "de_DE.UTF-8") printf writes 0,5: invalid JSON, a
   garbled HTML). The writers print through qk__prof_pf / qk__prof_spf, printf with the same
   format checking: each conversion is formatted alone by snprintf, and in a floating-point one
   the bytes that no C-locale number holds (the locale's decimal point, one or more bytes) become
   one '.', the field width kept. Integers need nothing (no grouping without the ' flag). */
typedef struct qk__prof_sink {
    FILE *f;                /* a file, or */
    char *buf;              /* a buffer of cap bytes (snprintf's contract) */
    size_t cap, len;
} qk__prof_sink;

static void qk__prof_put(qk__prof_sink *k, const char *s, size_t n)
{
    if (k->f) {
        fwrite(s, 1, n, k->f);
    } else if (k->cap) {
        size_t room = k->len + 1 < k->cap ? k->cap - 1 - k->len : 0, m = n < room ? n : room;
        if (m) memcpy(k->buf + k->len, s, m);
        if (k->len + m < k->cap) k->buf[k->len + m] = 0;
    }
    k->len += n;
}

/* A formatted floating-point field s (n bytes) in the C locale's form; returns its length. */
static size_t qk__prof_cnum(char *s, size_t n, size_t cap, int width, int left)
{
    size_t i, o = 0;
    int in_dp = 0;
    for (i = 0; i < n; i++) {
        char c = s[i];
        if ((c >= '0' && c <= '9') || (c != 0 && strchr("+- eEinfaINFA", c))) {
            s[o++] = c;
            in_dp = 0;
        } else if (!in_dp) {
            s[o++] = '.';
            in_dp = 1;
        }
    }
    if (width > 0 && o < (size_t)width && (size_t)width < cap) {  /* a multi-byte point left it short */
        size_t pad = (size_t)width - o;
        if (left) memset(s + o, ' ', pad);
        else { memmove(s + pad, s, o); memset(s, ' ', pad); }
        o = (size_t)width;
    }
    return o;
}

static void qk__prof_vout(qk__prof_sink *k, const char *fmt, va_list ap)
{
    while (*fmt) {
        char spec[48], num[160];
        const char *p = fmt;
        size_t sl = 0;
        int width = -1, left = 0, longs = 0, size_t_arg = 0, long_double = 0, n = 0;
        char conv;
        if (*p != '%') {
            size_t m = strcspn(p, "%");
            qk__prof_put(k, p, m);
            fmt = p + m;
            continue;
        }
        if (p[1] == '%') {
            qk__prof_put(k, "%", 1);
            fmt = p + 2;
            continue;
        }
        spec[sl++] = *p++;
        while (*p && strchr("-+ #0", *p) && sl < 8) { if (*p == '-') left = 1; spec[sl++] = *p++; }
        if (*p == '*') {
            width = va_arg(ap, int);
            sl += (size_t)snprintf(spec + sl, sizeof spec - sl, "%d", width); /* a negative one: '-' */
            if (width < 0) { left = 1; width = -width; }
            p++;
        } else {
            for (; *p >= '0' && *p <= '9' && sl < 16; p++) { width = (width < 0 ? 0 : width * 10) + (*p - '0'); spec[sl++] = *p; }
        }
        if (*p == '.') {
            spec[sl++] = *p++;
            if (*p == '*') { sl += (size_t)snprintf(spec + sl, sizeof spec - sl, "%d", va_arg(ap, int)); p++; }
            else while (*p >= '0' && *p <= '9' && sl < 32) spec[sl++] = *p++;
        }
        for (; *p && strchr("hlzL", *p) && sl < 40; p++) {
            if (*p == 'l') longs++;
            else if (*p == 'z') size_t_arg = 1;
            else if (*p == 'L') long_double = 1;
            spec[sl++] = *p;
        }
        conv = *p;
        if (!conv) break;
        spec[sl++] = conv;
        spec[sl] = 0;
        fmt = p + 1;
        switch (conv) {
        case 'd': case 'i':
            if (longs >= 2) n = snprintf(num, sizeof num, spec, va_arg(ap, long long));
            else if (longs == 1) n = snprintf(num, sizeof num, spec, va_arg(ap, long));
            else if (size_t_arg) n = snprintf(num, sizeof num, spec, (size_t)va_arg(ap, size_t));
            else n = snprintf(num, sizeof num, spec, va_arg(ap, int));
            break;
        case 'u': case 'x': case 'X': case 'o':
            if (longs >= 2) n = snprintf(num, sizeof num, spec, va_arg(ap, unsigned long long));
            else if (longs == 1) n = snprintf(num, sizeof num, spec, va_arg(ap, unsigned long));
            else if (size_t_arg) n = snprintf(num, sizeof num, spec, va_arg(ap, size_t));
            else n = snprintf(num, sizeof num, spec, va_arg(ap, unsigned));
            break;
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': case 'a': case 'A':
            if (long_double) n = snprintf(num, sizeof num, spec, va_arg(ap, long double));
            else n = snprintf(num, sizeof num, spec, va_arg(ap, double));
            if (n > 0) n = (int)qk__prof_cnum(num, (size_t)n < sizeof num ? (size_t)n : sizeof num - 1, sizeof num, width, left);
            break;
        case 'c':
            n = snprintf(num, sizeof num, spec, va_arg(ap, int));
            break;
        case 'p':
            n = snprintf(num, sizeof num, spec, va_arg(ap, void *));
            break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (k->f) { int w = fprintf(k->f, spec, s); k->len += w > 0 ? (size_t)w : 0; }
            else {
                size_t room = k->len < k->cap ? k->cap - k->len : 0;
                int w = snprintf(room ? k->buf + k->len : NULL, room, spec, s);
                k->len += w > 0 ? (size_t)w : 0;
            }
            continue;
        }
        default: /* not used by the writers */
            qk__prof_put(k, spec, sl);
            continue;
        }
        if (n > 0) qk__prof_put(k, num, (size_t)n < sizeof num ? (size_t)n : sizeof num - 1);
    }
}

__attribute__((format(printf, 2, 3))) static void qk__prof_pf(FILE *f, const char *fmt, ...)
{
    char buf[1024];
    qk__prof_sink k;
    va_list ap, ap2;
    memset(&k, 0, sizeof k);
    k.buf = buf;               /* into a buffer first: one fwrite per call */
    k.cap = sizeof buf;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    qk__prof_vout(&k, fmt, ap);
    if (k.len < sizeof buf) {
        fwrite(buf, 1, k.len, f);
    } else {                   /* longer than the buffer: again, straight to the file */
        memset(&k, 0, sizeof k);
        k.f = f;
        qk__prof_vout(&k, fmt, ap2);
    }
    va_end(ap2);
    va_end(ap);
}

__attribute__((format(printf, 3, 4))) static int qk__prof_spf(char *buf, size_t n, const char *fmt, ...)
{
    qk__prof_sink k;
    va_list ap;
    memset(&k, 0, sizeof k);
    k.buf = buf;
    k.cap = n;
    if (n) buf[0] = 0;
    va_start(ap, fmt);
    qk__prof_vout(&k, fmt, ap);
    va_end(ap);
    return (int)k.len;
}

static const char *qk__prof_dir_name(int d)
{
    static const char *n[5] = { "none", "H2D", "D2H", "D2D", "H2H" };
    return d >= 0 && d < 5 ? n[d] : "?";
}

static const char *qk__prof_kind_name(int k)
{
    static const char *n[4] = { "host", "pinned", "device", "managed" };
    return k >= 0 && k < 4 ? n[k] : "?";
}

static void qk__prof_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { fputc('\\', f); fputc((int)c, f); }
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) qk__prof_pf(f, "\\u%04x", c);
        else fputc((int)c, f);
    }
    fputc('"', f);
}

static void qk__prof_html_str(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A label cut to at most max bytes (on a UTF-8 character boundary), with an ellipsis. */
static void qk__prof_html_label(FILE *f, const char *s, size_t max)
{
    char buf[256];
    size_t n = s ? strlen(s) : 0;
    if (n <= max || max >= sizeof buf) { qk__prof_html_str(f, s); return; }
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;
    memcpy(buf, s, n);
    buf[n] = 0;
    qk__prof_html_str(f, buf);
    fputs("&#8230;", f);
}

/* JSON has no NaN/Inf: such values become null. */
static void qk__prof_json_num(FILE *f, double v)
{
    if (v != v || v > 1e300 || v < -1e300) fputs("null", f);
    else if (v == (double)(int64_t)v && fabs(v) < 9e15) qk__prof_pf(f, "%lld", (long long)v);
    else qk__prof_pf(f, "%.17g", v);
}

static const char *qk__prof_bytes(double b, char *buf, size_t n)
{
    const char *u[5] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int i = 0;
    while (fabs(b) >= 1024 && i < 4) { b /= 1024; i++; }
    if (i == 0) qk__prof_spf(buf, n, "%.0f B", b);
    else qk__prof_spf(buf, n, "%.2f %s", b, u[i]);
    return buf;
}

/* >>text ---- implementation: text report ---- */
/* A name in a text column: control characters shown as \n, \t, \xNN; padded or cut to w. */
static void qk__prof_text_name(FILE *f, const char *s, int w)
{
    char buf[256];
    int o = 0;
    for (; s && *s && o < w && o < (int)sizeof buf - 5; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n') { buf[o++] = '\\'; buf[o++] = 'n'; }
        else if (c == '\t') { buf[o++] = '\\'; buf[o++] = 't'; }
        else if (c < 0x20 || c == 0x7f) o += snprintf(buf + o, sizeof buf - (size_t)o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    if (o > w) o = w;
    buf[o] = 0;
    qk__prof_pf(f, "%-*s", w, buf);
}

/* with_self: the CPU tables, with self (exclusive) time: total less the nested zones' */
static void qk__prof_text_rows(FILE *f, const char *title, const qk__prof_row *rows, int n, double wall, int w,
                               int with_self)
{
    int i;
    qk__prof_pf(f, "\n%-*s %9s %13s %7s", w, title, "calls", "total ms", "%");
    if (with_self) qk__prof_pf(f, " %13s %7s", "self ms", "self %");
    qk__prof_pf(f, " %12s %12s %12s %12s\n", "mean us", "min us", "max us", "std us");
    for (i = 0; i < n; i++) {
        const qk__prof_row *r = &rows[i];
        qk__prof_text_name(f, r->name, w);
        qk__prof_pf(f, " %9llu %13.3f %7.1f", (unsigned long long)r->n, r->total * 1e-6,
                wall > 0 ? 100.0 * r->total / wall : 0.0);
        if (with_self)
            qk__prof_pf(f, " %13.3f %7.1f", qk__prof_self(r) * 1e-6, wall > 0 ? 100.0 * qk__prof_self(r) / wall : 0.0);
        qk__prof_pf(f, " %12.3f %12.3f %12.3f %12.3f\n", r->mean * 1e-3, r->min * 1e-3, r->max * 1e-3,
                qk__prof_std(r) * 1e-3);
    }
    if (!n) qk__prof_pf(f, "(none)\n");
    else if (with_self)
        qk__prof_pf(f, "(self: total less the zones nested directly in it, on its thread: the time spent in the zone's "
                       "own code)\n");
}

typedef struct qk__prof_top { const char *name; int gpu; double total, self; } qk__prof_top; /* self: CPU */

static int qk__prof_top_cmp(const void *a, const void *b)
{
    double x = ((const qk__prof_top *)a)->total, y = ((const qk__prof_top *)b)->total;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* CPU and GPU rows together, largest total first; *n gets the count (caller frees). */
static qk__prof_top *qk__prof_tops(const qk__prof_model *m, int *n)
{
    int i, nt = m->n_cpu + m->n_gpu;
    qk__prof_top *tp = (qk__prof_top *)QK_PROF_MALLOC((size_t)(nt ? nt : 1) * sizeof *tp);
    *n = 0;
    if (!tp) return NULL;
    for (i = 0; i < m->n_cpu; i++) {
        tp[i].name = m->cpu[i].name; tp[i].gpu = 0; tp[i].total = m->cpu[i].total; tp[i].self = qk__prof_self(&m->cpu[i]);
    }
    for (i = 0; i < m->n_gpu; i++) { tp[m->n_cpu + i].name = m->gpu[i].name; tp[m->n_cpu + i].gpu = 1; tp[m->n_cpu + i].total = m->gpu[i].total; }
    qsort(tp, (size_t)nt, sizeof *tp, qk__prof_top_cmp);
    *n = nt < qk__prof_g.desc.top_n ? nt : qk__prof_g.desc.top_n;
    return tp;
}

static void qk__prof_write_text(FILE *f, qk__prof_model *m)
{
    int i, w = 24, k;
    char b1[32], b2[32];
    for (i = 0; i < m->n_cpu; i++) if ((int)strlen(m->cpu[i].name) > w) w = (int)strlen(m->cpu[i].name);
    for (i = 0; i < m->n_gpu; i++) if ((int)strlen(m->gpu[i].name) > w) w = (int)strlen(m->gpu[i].name);
    for (k = 0; k < m->n_lanes; k++) if ((int)strlen(m->lanes[k].name) + 8 > w) w = (int)strlen(m->lanes[k].name) + 8;
    if (w > 48) w = 48;
    qk__prof_pf(f, "qk_prof report: wall %.3f ms, clock %s (%.4f ns/tick), %d thread%s, %d GPU stream%s\n",
            m->wall * 1e-6, m->sum.clock, m->npt, m->sum.threads, m->sum.threads == 1 ? "" : "s",
            m->n_lanes, m->n_lanes == 1 ? "" : "s");
    qk__prof_text_rows(f, "CPU zones", m->cpu, m->n_cpu, m->wall, w, 1);
    if (m->n_gpu || m->n_lanes) {
        qk__prof_text_rows(f, "GPU zones (device time)", m->gpu, m->n_gpu, m->wall, w, 0);
        qk__prof_pf(f, "\n%-*s %9s %13s %7s %9s\n", w, "GPU streams", "zones", "busy ms", "wall %", "active %");
        for (k = 0; k < m->n_lanes; k++) {
            const qk__prof_lrow *l = &m->lanes[k];
            double span = l->last - l->first;
            char nm[96];
            snprintf(nm, sizeof nm, "%s (GPU %d)", l->name, l->device);
            qk__prof_pf(f, "%-*.*s %9llu %13.3f %7.1f %9.1f\n", w, w, nm, (unsigned long long)l->zones, l->busy * 1e-6,
                    m->wall > 0 ? 100.0 * l->busy / m->wall : 0.0, span > 0 ? 100.0 * l->busy / span : 0.0);
        }
    }
    {
        int nt;
        qk__prof_top *tp = qk__prof_tops(m, &nt);
        if (tp) {
            qk__prof_pf(f, "\nTop %d bottlenecks (total time summed over calls and threads, as a share of wall time: "
                           "nested zones count in their parents, a zone on several threads at once can exceed 100 %%)\n", nt);
            for (i = 0; i < nt; i++) {
                qk__prof_pf(f, "%3d. %s  ", i + 1, tp[i].gpu ? "GPU" : "CPU");
                qk__prof_text_name(f, tp[i].name, w);
                qk__prof_pf(f, " %13.3f ms %7.1f %% of wall", tp[i].total * 1e-6,
                        m->wall > 0 ? 100.0 * tp[i].total / m->wall : 0.0);
                if (!tp[i].gpu) qk__prof_pf(f, "  (self %.3f ms)", tp[i].self * 1e-6);
                qk__prof_pf(f, "\n");
            }
            QK_PROF_FREE(tp);
        }
    }
    pthread_mutex_lock(&qk__prof_mu);
    if (qk__prof_g.n_mnames) {
        qk__prof_pf(f, "\n%-*s %-8s %12s %12s %7s  %s\n", w, "Memory (tracked)", "kind", "current", "peak", "allocs", "dtype shape");
        for (i = 0; i < qk__prof_g.n_mnames; i++) {
            const qk__prof_mname *mn = &qk__prof_g.mnames[i];
            qk__prof_text_name(f, mn->name, w);
            qk__prof_pf(f, " %-8s %12s %12s %7llu  %s %s\n", qk__prof_kind_name(mn->kind),
                    qk__prof_bytes(mn->current, b1, sizeof b1), qk__prof_bytes(mn->peak, b2, sizeof b2),
                    (unsigned long long)mn->allocs, mn->dtype, mn->shape);
        }
        for (k = 0; k < QK__PROF_MEM_KINDS; k++)
            if (qk__prof_g.mem_peak[k] > 0)
                qk__prof_pf(f, "%-*s %-8s %12s %12s\n", w, "  total", qk__prof_kind_name(k),
                        qk__prof_bytes(qk__prof_g.mem_cur[k], b1, sizeof b1), qk__prof_bytes(qk__prof_g.mem_peak[k], b2, sizeof b2));
    }
    if (qk__prof_g.n_snaps) {
        qk__prof_pf(f, "\n%-*s %10s %14s %14s %14s %14s\n", w, "Memory snapshots", "t ms", "device used", "device total",
                "tracked host", "tracked dev");
        for (i = 0; i < qk__prof_g.n_snaps; i++) {
            const qk__prof_snap *s = &qk__prof_g.snaps[i];
            double tms = (double)(int64_t)(s->t - m->t0) * m->npt * 1e-6;
            char b3[32], b4[32];
            qk__prof_text_name(f, s->label, w);
            if (s->is_pool)
                qk__prof_pf(f, " %10.3f pool reserved %s (high %s), used %s (high %s)\n", tms,
                        qk__prof_bytes(s->pool_reserved, b1, sizeof b1), qk__prof_bytes(s->pool_reserved_high, b2, sizeof b2),
                        qk__prof_bytes(s->pool_used, b3, sizeof b3), qk__prof_bytes(s->pool_used_high, b4, sizeof b4));
            else
                qk__prof_pf(f, " %10.3f %14s %14s %14s %14s\n", tms,
                        s->dev_total >= 0 ? qk__prof_bytes(s->dev_total - s->dev_free, b1, sizeof b1) : "-",
                        s->dev_total >= 0 ? qk__prof_bytes(s->dev_total, b2, sizeof b2) : "-",
                        qk__prof_bytes(s->host_tracked, b3, sizeof b3), qk__prof_bytes(s->device_tracked, b4, sizeof b4));
        }
    }
    pthread_mutex_unlock(&qk__prof_mu);
    {
        int any = 0, p;
        for (k = 1; k < 5; k++) for (p = 0; p < 2; p++) any |= m->xr[k][p].count > 0;
        if (any) {
            qk__prof_pf(f, "\n%-*s %-9s %8s %12s %12s %10s %10s %10s\n", w, "Transfers", "memory", "count", "bytes",
                    "time ms", "GB/s", "min GB/s", "max GB/s");
            for (k = 1; k < 5; k++)
                for (p = 0; p < 2; p++) {
                    const qk__prof_xrow *x = &m->xr[k][p];
                    if (!x->count) continue;
                    qk__prof_pf(f, "%-*s %-9s %8llu %12s %12.3f %10.2f %10.2f %10.2f\n", w, qk__prof_dir_name(k),
                            k == QK_PROF_D2D ? "device" : p ? "pinned" : "pageable", (unsigned long long)x->count,
                            qk__prof_bytes(x->bytes, b1, sizeof b1), x->seconds * 1e3,
                            x->seconds > 0 ? x->bytes / x->seconds * 1e-9 : 0.0, x->min_gbps, x->max_gbps);
                }
        }
    }
    if (m->n_ctr) {
        qk__prof_pf(f, "\n%-*s %9s %14s %14s %14s\n", w, "Counters", "updates", "total / last", "min", "max");
        for (i = 0; i < m->n_ctr; i++) {
            const qk__prof_crow *c = &m->ctr[i];
            qk__prof_text_name(f, c->name, w);
            qk__prof_pf(f, " %9llu %14.6g %14.6g %14.6g\n", (unsigned long long)c->n,
                    c->add ? c->sum : c->last, c->min, c->max);
        }
    }
    qk__prof_steps_text(f, m, w); /* >>steps */
    if (m->sum.dropped_events || m->sum.dropped_gpu || m->sum.dropped_gpu_records || m->sum.dropped_threads ||
        m->sum.unbalanced || m->sum.mismatched || m->sum.too_deep || m->sum.gpu_ignored || m->sum.gpu_pending)
        qk__prof_pf(f, "\nNotes: dropped events %llu (statistics still exact), GPU zones dropped %llu, GPU trace records "
                   "dropped %llu, threads over the limit %llu, unbalanced END %llu, mismatched END %llu, too deep %llu, "
                   "GPU zones ignored (no QK_PROF_CUDA) %llu, GPU zones still open %llu\n",
                (unsigned long long)m->sum.dropped_events, (unsigned long long)m->sum.dropped_gpu,
                (unsigned long long)m->sum.dropped_gpu_records, (unsigned long long)m->sum.dropped_threads,
                (unsigned long long)m->sum.unbalanced, (unsigned long long)m->sum.mismatched,
                (unsigned long long)m->sum.too_deep, (unsigned long long)m->sum.gpu_ignored,
                (unsigned long long)m->sum.gpu_pending);
}

/* >>json ---- implementation: JSON report ---- */
static void qk__prof_json_rows(FILE *f, const char *key, const qk__prof_row *rows, int n, double wall, int with_self)
{
    int i;
    qk__prof_pf(f, ",\n\"%s\":[", key);
    for (i = 0; i < n; i++) {
        const qk__prof_row *r = &rows[i];
        fputs(i ? ",\n {\"name\":" : "\n {\"name\":", f);
        qk__prof_json_str(f, r->name);
        qk__prof_pf(f, ",\"sites\":%d,\"calls\":%llu,\"total_ns\":", r->sites, (unsigned long long)r->n);
        qk__prof_json_num(f, r->total);
        fputs(",\"pct_wall\":", f); qk__prof_json_num(f, wall > 0 ? 100.0 * r->total / wall : 0.0);
        if (with_self) {
            fputs(",\"self_ns\":", f); qk__prof_json_num(f, qk__prof_self(r));
            fputs(",\"self_pct_wall\":", f); qk__prof_json_num(f, wall > 0 ? 100.0 * qk__prof_self(r) / wall : 0.0);
        }
        fputs(",\"mean_ns\":", f); qk__prof_json_num(f, r->mean);
        fputs(",\"min_ns\":", f); qk__prof_json_num(f, r->min);
        fputs(",\"max_ns\":", f); qk__prof_json_num(f, r->max);
        fputs(",\"std_ns\":", f); qk__prof_json_num(f, qk__prof_std(r));
        fputc('}', f);
    }
    fputs("]", f);
}

static void qk__prof_write_json(FILE *f, qk__prof_model *m)
{
    int i, k, p;
    const qk_prof_summary *s = &m->sum;
    fputs("{\"generator\":\"qk_prof\",\"version\":2,\"clock\":", f);
    qk__prof_json_str(f, s->clock);
    fputs(",\"ns_per_tick\":", f); qk__prof_json_num(f, m->npt);
    fputs(",\"wall_ns\":", f); qk__prof_json_num(f, m->wall);
    qk__prof_pf(f, ",\"threads\":%d,\"n_streams\":%d", s->threads, m->n_lanes);
    qk__prof_pf(f, ",\n\"dropped\":{\"events\":%llu,\"gpu_zones\":%llu,\"gpu_records\":%llu,\"threads\":%llu,"
               "\"unbalanced\":%llu,\"mismatched\":%llu,\"too_deep\":%llu,\"gpu_ignored\":%llu,\"gpu_pending\":%llu}",
            (unsigned long long)s->dropped_events, (unsigned long long)s->dropped_gpu,
            (unsigned long long)s->dropped_gpu_records, (unsigned long long)s->dropped_threads,
            (unsigned long long)s->unbalanced, (unsigned long long)s->mismatched, (unsigned long long)s->too_deep,
            (unsigned long long)s->gpu_ignored, (unsigned long long)s->gpu_pending);
    qk__prof_json_rows(f, "cpu_zones", m->cpu, m->n_cpu, m->wall, 1);
    qk__prof_json_rows(f, "gpu_zones", m->gpu, m->n_gpu, m->wall, 0);
    {
        int nt;
        qk__prof_top *tp = qk__prof_tops(m, &nt);
        fputs(",\n\"top\":[", f);
        for (i = 0; tp && i < nt; i++) {
            fputs(i ? ",\n {\"name\":" : "\n {\"name\":", f);
            qk__prof_json_str(f, tp[i].name);
            qk__prof_pf(f, ",\"gpu\":%s,\"total_ns\":", tp[i].gpu ? "true" : "false");
            qk__prof_json_num(f, tp[i].total);
            fputs(",\"pct_wall\":", f);
            qk__prof_json_num(f, m->wall > 0 ? 100.0 * tp[i].total / m->wall : 0.0);
            if (!tp[i].gpu) { fputs(",\"self_ns\":", f); qk__prof_json_num(f, tp[i].self); }
            fputc('}', f);
        }
        fputs("]", f);
        QK_PROF_FREE(tp);
    }
    qk__prof_steps_json(f, m); /* >>steps */
    fputs(",\n\"streams\":[", f);
    for (k = 0; k < m->n_lanes; k++) {
        const qk__prof_lrow *l = &m->lanes[k];
        fputs(k ? ",\n {\"name\":" : "\n {\"name\":", f);
        qk__prof_json_str(f, l->name);
        qk__prof_pf(f, ",\"device\":%d,\"zones\":%llu,\"busy_ns\":", l->device, (unsigned long long)l->zones);
        qk__prof_json_num(f, l->busy);
        fputs(",\"util_wall\":", f); qk__prof_json_num(f, m->wall > 0 ? l->busy / m->wall : 0.0);
        fputs(",\"util_active\":", f); qk__prof_json_num(f, l->last > l->first ? l->busy / (l->last - l->first) : 0.0);
        fputc('}', f);
    }
    fputs("],\n\"transfers\":[", f);
    for (k = 1, i = 0; k < 5; k++)
        for (p = 0; p < 2; p++) {
            const qk__prof_xrow *x = &m->xr[k][p];
            if (!x->count) continue;
            qk__prof_pf(f, "%s\n {\"dir\":\"%s\",\"pinned\":%s,\"count\":%llu,\"bytes\":", i++ ? "," : "",
                    qk__prof_dir_name(k), p ? "true" : "false", (unsigned long long)x->count);
            qk__prof_json_num(f, x->bytes);
            fputs(",\"seconds\":", f); qk__prof_json_num(f, x->seconds);
            fputs(",\"gbps\":", f); qk__prof_json_num(f, x->seconds > 0 ? x->bytes / x->seconds * 1e-9 : 0.0);
            fputs(",\"min_gbps\":", f); qk__prof_json_num(f, x->min_gbps);
            fputs(",\"max_gbps\":", f); qk__prof_json_num(f, x->max_gbps);
            fputc('}', f);
        }
    fputs("],\n\"counters\":[", f);
    for (i = 0; i < m->n_ctr; i++) {
        const qk__prof_crow *c = &m->ctr[i];
        fputs(i ? ",\n {\"name\":" : "\n {\"name\":", f);
        qk__prof_json_str(f, c->name);
        qk__prof_pf(f, ",\"kind\":\"%s\",\"updates\":%llu,\"sum\":", c->add ? "add" : "set", (unsigned long long)c->n);
        qk__prof_json_num(f, c->sum);
        fputs(",\"last\":", f); qk__prof_json_num(f, c->last);
        fputs(",\"min\":", f); qk__prof_json_num(f, c->min);
        fputs(",\"max\":", f); qk__prof_json_num(f, c->max);
        fputc('}', f);
    }
    pthread_mutex_lock(&qk__prof_mu);
    fputs("],\n\"memory\":{\"kinds\":{", f);
    for (k = 0; k < QK__PROF_MEM_KINDS; k++) {
        qk__prof_pf(f, "%s\"%s\":{\"current\":", k ? "," : "", qk__prof_kind_name(k));
        qk__prof_json_num(f, qk__prof_g.mem_cur[k]);
        fputs(",\"peak\":", f); qk__prof_json_num(f, qk__prof_g.mem_peak[k]);
        fputc('}', f);
    }
    fputs("},\n \"names\":[", f);
    for (i = 0; i < qk__prof_g.n_mnames; i++) {
        const qk__prof_mname *mn = &qk__prof_g.mnames[i];
        fputs(i ? ",\n  {\"name\":" : "\n  {\"name\":", f);
        qk__prof_json_str(f, mn->name);
        qk__prof_pf(f, ",\"kind\":\"%s\",\"allocs\":%llu,\"current\":", qk__prof_kind_name(mn->kind), (unsigned long long)mn->allocs);
        qk__prof_json_num(f, mn->current);
        fputs(",\"peak\":", f); qk__prof_json_num(f, mn->peak);
        fputs(",\"dtype\":", f); qk__prof_json_str(f, mn->dtype);
        fputs(",\"shape\":", f); qk__prof_json_str(f, mn->shape);
        fputc('}', f);
    }
    fputs("],\n \"snapshots\":[", f);
    for (i = 0; i < qk__prof_g.n_snaps; i++) {
        const qk__prof_snap *s2 = &qk__prof_g.snaps[i];
        fputs(i ? ",\n  {\"label\":" : "\n  {\"label\":", f);
        qk__prof_json_str(f, s2->label);
        fputs(",\"t_ns\":", f); qk__prof_json_num(f, (double)(int64_t)(s2->t - m->t0) * m->npt);
        if (s2->is_pool) {
            fputs(",\"pool_reserved\":", f); qk__prof_json_num(f, s2->pool_reserved);
            fputs(",\"pool_reserved_high\":", f); qk__prof_json_num(f, s2->pool_reserved_high);
            fputs(",\"pool_used\":", f); qk__prof_json_num(f, s2->pool_used);
            fputs(",\"pool_used_high\":", f); qk__prof_json_num(f, s2->pool_used_high);
        } else {
            fputs(",\"device_free\":", f); qk__prof_json_num(f, s2->dev_free);
            fputs(",\"device_total\":", f); qk__prof_json_num(f, s2->dev_total);
            fputs(",\"tracked_host\":", f); qk__prof_json_num(f, s2->host_tracked);
            fputs(",\"tracked_device\":", f); qk__prof_json_num(f, s2->device_tracked);
        }
        fputc('}', f);
    }
    fputs("]}}\n", f);
    pthread_mutex_unlock(&qk__prof_mu);
}

/* >>trace ---- implementation: Chrome trace ---- */
/* Counter events of all threads, sorted by (site, time): "add" counters become running sums. */
typedef struct qk__prof_cev { uint32_t site; int kind; uint64_t t; double v; } qk__prof_cev;

static int qk__prof_cev_cmp(const void *a, const void *b)
{
    const qk__prof_cev *x = (const qk__prof_cev *)a, *y = (const qk__prof_cev *)b;
    int c = strcmp(qk__prof_site_name(x->site), qk__prof_site_name(y->site));
    if (c) return c;
    return x->t < y->t ? -1 : x->t > y->t;
}

static void qk__prof_write_trace(FILE *f, qk__prof_model *m)
{
    int i, k, first = 1;
    qk__prof_thread *t;
    size_t nce = 0, ci = 0;
    qk__prof_cev *ce = NULL;
#define QK__PROF_SEP() (fputs(first ? "\n" : ",\n", f), first = 0)
    fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"qk_prof\"},\"traceEvents\":[", f);
    QK__PROF_SEP();
    fputs("{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"host\"}}", f);
    QK__PROF_SEP();
    fputs("{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":0}}", f);
    for (i = 0; i < m->n_threads; i++) {
        if (!m->threads[i]) continue;
        QK__PROF_SEP();
        qk__prof_pf(f, "{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", i + 1);
        qk__prof_json_str(f, m->threads[i]->name);
        fputs("}}", f);
        QK__PROF_SEP();
        qk__prof_pf(f, "{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}", i + 1, i);
    }
    {
        int seen[16] = { 0 };
        for (k = 0; k < m->n_lanes; k++) {
            int dv = m->lanes[k].device & 15;
            if (!seen[dv]) {
                seen[dv] = 1;
                QK__PROF_SEP();
                qk__prof_pf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"GPU %d\"}}", 2 + dv, dv);
                QK__PROF_SEP();
                qk__prof_pf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}", 2 + dv, 1 + dv);
            }
            QK__PROF_SEP();
            qk__prof_pf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", 2 + dv, k + 1);
            qk__prof_json_str(f, m->lanes[k].name);
            fputs("}}", f);
        }
    }
    for (t = qk__prof_g.threads; t; t = t->next) {
        size_t n = qk__prof_count(t), e;
        for (e = 0; e < n; e++) {
            const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
            if (QK__PROF_KIND(ev)) { nce++; continue; }
            QK__PROF_SEP();
            fputs("{\"ph\":\"X\",\"cat\":\"cpu\",\"name\":", f);
            qk__prof_json_str(f, qk__prof_site_name(QK__PROF_SITE(ev)));
            qk__prof_pf(f, ",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"depth\":%d}}", t->index + 1,
                    (double)(int64_t)(ev->t0 - m->t0) * m->npt * 1e-3, (double)(ev->t1 - ev->t0) * m->npt * 1e-3, QK__PROF_DEPTH(ev));
        }
        if (t->gpu) {
            qk__prof_gthread *g = t->gpu;
            size_t r;
            pthread_mutex_lock(&g->mu);
            for (r = 0; r < g->n_recs; r++) {
                const qk__prof_grec *gr = &g->recs[r];
                QK__PROF_SEP();
                fputs("{\"ph\":\"X\",\"cat\":\"gpu\",\"name\":", f);
                qk__prof_json_str(f, qk__prof_site_name(gr->site));
                qk__prof_pf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"depth\":%d,\"thread\":%d",
                        2 + (qk__prof_g.lanes[gr->lane].device & 15), gr->lane + 1, qk__prof_gabs(m, gr) * 1e-3,
                        gr->dur_ns * 1e-3, gr->depth, t->index + 1);
                if (gr->dir)
                    qk__prof_pf(f, ",\"bytes\":%llu,\"dir\":\"%s\",\"pinned\":%s,\"GB/s\":%.3f", (unsigned long long)gr->bytes,
                            qk__prof_dir_name(gr->dir), gr->pinned ? "true" : "false",
                            gr->dur_ns > 0 ? (double)gr->bytes / gr->dur_ns : 0.0);
                fputs("}}", f);
            }
            pthread_mutex_unlock(&g->mu);
        }
    }
    if (nce) ce = (qk__prof_cev *)QK_PROF_MALLOC(nce * sizeof *ce);
    if (ce) {
        for (t = qk__prof_g.threads; t; t = t->next) {
            size_t n = qk__prof_count(t), e;
            for (e = 0; e < n && ci < nce; e++) {
                const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
                if (!QK__PROF_KIND(ev)) continue;
                ce[ci].site = QK__PROF_SITE(ev); ce[ci].kind = QK__PROF_KIND(ev); ce[ci].t = ev->t0;
                memcpy(&ce[ci].v, &ev->t1, sizeof ce[ci].v);
                ci++;
            }
        }
        qsort(ce, ci, sizeof *ce, qk__prof_cev_cmp);
        {
            size_t e;
            double run = 0;
            for (e = 0; e < ci; e++) {
                if (e == 0 || strcmp(qk__prof_site_name(ce[e].site), qk__prof_site_name(ce[e - 1].site)) != 0) run = 0;
                run = ce[e].kind == 2 ? run + ce[e].v : ce[e].v;
                QK__PROF_SEP();
                fputs("{\"ph\":\"C\",\"pid\":1,\"name\":", f);
                qk__prof_json_str(f, qk__prof_site_name(ce[e].site));
                qk__prof_pf(f, ",\"ts\":%.3f,\"args\":{\"value\":", (double)(int64_t)(ce[e].t - m->t0) * m->npt * 1e-3);
                qk__prof_json_num(f, run);
                fputs("}}", f);
            }
        }
        QK_PROF_FREE(ce);
    }
    pthread_mutex_lock(&qk__prof_mu);
    for (ci = 0; ci < qk__prof_g.n_mseries; ci++) {
        const qk__prof_mpoint *p = &qk__prof_g.mseries[ci];
        QK__PROF_SEP();
        qk__prof_pf(f, "{\"ph\":\"C\",\"pid\":1,\"name\":\"tracked memory\",\"ts\":%.3f,\"args\":{\"host\":",
                (double)(int64_t)(p->t - m->t0) * m->npt * 1e-3);
        qk__prof_json_num(f, p->host);
        fputs(",\"device\":", f);
        qk__prof_json_num(f, p->device);
        fputs("}}", f);
    }
    pthread_mutex_unlock(&qk__prof_mu);
    fputs("\n]}\n", f);
#undef QK__PROF_SEP
}

/* >>html ---- implementation: HTML report ---- */
/* One self-contained page (no script, no network): a function per chart, then the tables.
   Charts are as wide as the window: bars and boxes are placed in percent of the plot width, the
   labels sit in a column of their own, so text keeps its size. Every bar and box carries a
   tooltip (an SVG <title>). */
#define QK__PROF_HTML_MAX_BOXES 20000  /* timeline boxes drawn; the trace has every zone */
#define QK__PROF_HTML_MAX_DEPTH 12     /* timeline lanes per thread or stream */
#define QK__PROF_HTML_LANE 14          /* px per timeline lane */

static double qk__prof_pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

/* A duration in the unit that suits it, 4 significant digits: "12.35 ms", "870 ns". */
static const char *qk__prof_time(double ns, char *buf, size_t n)
{
    double a = ns < 0 ? -ns : ns;
    if (a >= 1e9) qk__prof_spf(buf, n, "%.4g s", ns * 1e-9);
    else if (a >= 1e6) qk__prof_spf(buf, n, "%.4g ms", ns * 1e-6);
    else if (a >= 1e3) qk__prof_spf(buf, n, "%.4g us", ns * 1e-3);
    else qk__prof_spf(buf, n, "%.4g ns", ns);
    return buf;
}

static void qk__prof_html_head(FILE *f, const qk__prof_model *m)
{
    char t1[32];
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>qk_prof report</title>\n<style>\n"
          "body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222;background:#fff}\n"
          "h1{font-size:20px;margin:0 0 4px}h2{margin:28px 0 4px;font-size:17px}\n"
          "p.note{color:#555;font-size:13px;margin:0 0 8px;max-width:72em}\n"
          "table{border-collapse:collapse;margin:8px 0 16px}td,th{padding:2px 10px;border-bottom:1px solid #ddd;"
          "text-align:right}td:first-child,th:first-child{text-align:left}\n"
          ".chart{display:grid;grid-template-columns:minmax(9em, 18em) minmax(0, 1fr) 7em;gap:3px 8px;align-items:center}\n"
          ".tl{display:grid;grid-template-columns:minmax(9em, 18em) minmax(0, 1fr);gap:4px 8px;align-items:start}\n"
          ".lbl{text-align:right;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;font-size:12px}\n"
          ".lbl small{color:#777}.val{font-size:12px;white-space:nowrap}\n"
          "svg{display:block;width:100%}svg text{font:11px sans-serif;fill:#555}\n"
          ".cpu{fill:#4e79a7}.gpu{fill:#59a14f}.xfer{fill:#f28e2b}.bg{fill:#f3f3f3}.track{fill:#e8e8e8}\n"
          ".d1{fill-opacity:.8}.d2{fill-opacity:.65}.d3{fill-opacity:.5}.dn{fill-opacity:.4}\n"
          "rect.box{stroke:#fff;stroke-width:.5}\n"
          "</style></head><body>\n<h1>qk_prof report</h1>\n", f);
    qk__prof_pf(f, "<p>wall %s &middot; clock %s &middot; %d host thread%s", qk__prof_time(m->wall, t1, sizeof t1),
                m->sum.clock, m->sum.threads, m->sum.threads == 1 ? "" : "s");
    if (m->n_lanes) qk__prof_pf(f, " &middot; %d GPU stream%s", m->n_lanes, m->n_lanes == 1 ? "" : "s");
    fputs("</p>\n<p class=\"note\">Wall time runs from the profiler's start to the last recorded activity. "
          "Hover a bar or a box for its numbers.</p>\n", f);
}

/* One row of a bar chart: label, a bar of pct percent (0..100) with a tooltip, a value. */
static void qk__prof_html_bar(FILE *f, const char *kind, const char *name, const char *cls, double pct,
                              const char *value, const char *tip)
{
    double w = pct < 0 ? 0 : pct > 100 ? 100 : pct;
    fputs("<div class=\"lbl\" title=\"", f);
    qk__prof_html_str(f, name);
    qk__prof_pf(f, "\">%s ", kind);
    qk__prof_html_label(f, name, 64);
    qk__prof_pf(f, "</div><svg height=\"18\"><rect class=\"track\" x=\"0\" y=\"2\" width=\"100%%\" height=\"14\"/>"
                   "<rect class=\"%s\" x=\"0\" y=\"2\" width=\"%.3f%%\" height=\"14\"><title>", cls, w > 0 && w < 0.2 ? 0.2 : w);
    qk__prof_html_str(f, tip);
    qk__prof_pf(f, "</title></rect></svg><div class=\"val\">%s</div>\n", value);
}

/* Chart: total time per zone name, CPU and GPU, the 20 largest of each. */
static void qk__prof_html_zone_bars(FILE *f, const qk__prof_model *m)
{
    double maxt = 0;
    int i, k;
    for (i = 0; i < m->n_cpu; i++) if (m->cpu[i].total > maxt) maxt = m->cpu[i].total;
    for (i = 0; i < m->n_gpu; i++) if (m->gpu[i].total > maxt) maxt = m->gpu[i].total;
    fputs("<h2>Time per zone</h2>\n<p class=\"note\">Total time of each zone name, summed over its calls and "
          "threads (GPU zones: device time). A zone's time includes the zones nested in it. Bars are relative to "
          "the largest total.</p>\n<div class=\"chart\">\n", f);
    for (k = 0; k < 2; k++) {
        const qk__prof_row *rows = k ? m->gpu : m->cpu;
        int n = k ? m->n_gpu : m->n_cpu;
        for (i = 0; i < n && i < 20; i++) {
            const qk__prof_row *r = &rows[i];
            char val[48], tip[512], t1[32], t2[32], t3[32];
            char t4[48], self[64] = "";
            qk__prof_time(r->total, val, sizeof val);
            if (!k) qk__prof_spf(self, sizeof self, ", self %s", qk__prof_time(qk__prof_self(r), t4, sizeof t4));
            qk__prof_spf(tip, sizeof tip, "%s zone %.200s: %llu call%s, total %s%s, mean %s, min %s, max %s, "
                         "%.1f %% of wall", k ? "GPU" : "CPU", r->name, (unsigned long long)r->n, r->n == 1 ? "" : "s",
                         val, self, qk__prof_time(r->mean, t1, sizeof t1), qk__prof_time(r->min, t2, sizeof t2),
                         qk__prof_time(r->max, t3, sizeof t3), qk__prof_pct(r->total, m->wall));
            qk__prof_html_bar(f, k ? "GPU" : "CPU", r->name, k ? "gpu" : "cpu", qk__prof_pct(r->total, maxt), val, tip);
        }
    }
    fputs("</div>\n", f);
}

/* A thread's busy time: its top-level zones (kept events). */
static double qk__prof_thread_busy(const qk__prof_model *m, qk__prof_thread *t)
{
    double busy = 0;
    size_t n = qk__prof_count(t), e;
    for (e = 0; e < n; e++) {
        const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
        if (!QK__PROF_KIND(ev) && QK__PROF_DEPTH(ev) == 0) busy += (double)(ev->t1 - ev->t0) * m->npt;
    }
    return busy;
}

/* Chart: busy share of the wall time per host thread and, where there is a GPU, per stream. */
static void qk__prof_html_busy(FILE *f, const qk__prof_model *m)
{
    int i, k;
    if (m->n_lanes) fputs("<h2>CPU vs GPU: busy share of wall time</h2>\n", f);
    else fputs("<h2>Busy share of wall time per thread</h2>\n", f);
    fputs("<p class=\"note\">A host thread is busy inside its top-level zones; a GPU stream while any of its zones "
          "runs (the union of their intervals). Each bar is a share of the wall time, at most 100 %.</p>\n"
          "<div class=\"chart\">\n", f);
    for (i = 0; i < m->n_threads; i++) {
        qk__prof_thread *t = m->threads[i];
        double busy, pct;
        char val[32], tip[256], t1[32], t2[32];
        if (!t) continue;
        busy = qk__prof_thread_busy(m, t);
        pct = qk__prof_pct(busy, m->wall);
        qk__prof_spf(val, sizeof val, "%.1f %%", pct);
        qk__prof_spf(tip, sizeof tip, "thread %.64s: busy %s of %s wall", t->name, qk__prof_time(busy, t1, sizeof t1),
                     qk__prof_time(m->wall, t2, sizeof t2));
        qk__prof_html_bar(f, "CPU", t->name, "cpu", pct, val, tip);
    }
    for (k = 0; k < m->n_lanes; k++) {
        const qk__prof_lrow *l = &m->lanes[k];
        double pct = qk__prof_pct(l->busy, m->wall);
        char kind[24], val[32], tip[256], t1[32], t2[32];
        qk__prof_spf(kind, sizeof kind, "GPU %d", l->device);
        qk__prof_spf(val, sizeof val, "%.1f %%", pct);
        qk__prof_spf(tip, sizeof tip, "GPU %d stream %.64s: %llu zones, busy %s of %s wall, %.1f %% of its active span",
                     l->device, l->name, (unsigned long long)l->zones, qk__prof_time(l->busy, t1, sizeof t1),
                     qk__prof_time(m->wall, t2, sizeof t2), qk__prof_pct(l->busy, l->last - l->first));
        qk__prof_html_bar(f, kind, l->name, "gpu", pct, val, tip);
    }
    fputs("</div>\n", f);
}

/* One timeline box: start and duration in ns from the origin, on lane depth. */
static void qk__prof_html_box(FILE *f, const qk__prof_model *m, const char *cls, int depth, double start,
                              double dur, const char *name, const char *extra)
{
    double x = qk__prof_pct(start, m->wall), w = qk__prof_pct(dur, m->wall);
    static const char *const dcls[4] = { "", " d1", " d2", " d3" };
    char t1[32], t2[32];
    qk__prof_pf(f, "<rect class=\"box %s%s\" x=\"%.4f%%\" y=\"%d\" width=\"%.4f%%\" height=\"%d\"><title>", cls,
                depth < 4 ? dcls[depth] : " dn", x, 1 + depth * QK__PROF_HTML_LANE, w < 0.05 ? 0.05 : w,
                QK__PROF_HTML_LANE - 2);
    qk__prof_html_str(f, name);
    qk__prof_pf(f, ": %s at %s, depth %d%s</title></rect>\n", qk__prof_time(dur, t1, sizeof t1),
                qk__prof_time(start, t2, sizeof t2), depth, extra);
}

/* The label cell and the opening of a lane group's SVG: one lane per nesting depth up to maxd,
   at most QK__PROF_HTML_MAX_DEPTH. Returns the number of lanes. */
static int qk__prof_html_lanes_open(FILE *f, const char *kind, const char *name, int maxd)
{
    int lanes = maxd + 1 < QK__PROF_HTML_MAX_DEPTH ? maxd + 1 : QK__PROF_HTML_MAX_DEPTH;
    fputs("<div class=\"lbl\" title=\"", f);
    qk__prof_html_str(f, name);
    qk__prof_pf(f, "\">%s ", kind);
    qk__prof_html_label(f, name, 64);
    if (lanes > 1) qk__prof_pf(f, "<br><small>%d levels of nesting</small>", lanes);
    qk__prof_pf(f, "</div><svg height=\"%d\"><rect class=\"bg\" x=\"0\" y=\"0\" width=\"100%%\" height=\"%d\"/>\n",
                lanes * QK__PROF_HTML_LANE + 1, lanes * QK__PROF_HTML_LANE + 1);
    return lanes;
}

/* The timeline's box budget, shared by its lane groups: boxes drawn, zones left out because the
   budget was spent (skipped) or because they sit deeper than the lanes (deep). */
typedef struct qk__prof_html_tl {
    int boxes, skipped, deep;
} qk__prof_html_tl;

/* Whether the timeline draws a zone at depth (counting what it leaves out). */
static int qk__prof_html_tl_take(qk__prof_html_tl *tl, int depth, int lanes)
{
    if (depth >= lanes) { tl->deep++; return 0; }
    if (tl->boxes >= QK__PROF_HTML_MAX_BOXES) { tl->skipped++; return 0; }
    tl->boxes++;
    return 1;
}

/* Timeline: one host thread's lane group, its kept zones. */
static void qk__prof_html_thread_lanes(FILE *f, const qk__prof_model *m, qk__prof_thread *t, qk__prof_html_tl *tl)
{
    size_t n = qk__prof_count(t), e;
    int maxd = 0, lanes;
    for (e = 0; e < n; e++) {
        const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
        if (!QK__PROF_KIND(ev) && QK__PROF_DEPTH(ev) > maxd) maxd = QK__PROF_DEPTH(ev);
    }
    lanes = qk__prof_html_lanes_open(f, "", t->name, maxd);
    for (e = 0; e < n; e++) {
        const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
        if (QK__PROF_KIND(ev) || !qk__prof_html_tl_take(tl, QK__PROF_DEPTH(ev), lanes)) continue;
        qk__prof_html_box(f, m, "cpu", QK__PROF_DEPTH(ev), (double)(int64_t)(ev->t0 - m->t0) * m->npt,
                          (double)(ev->t1 - ev->t0) * m->npt, qk__prof_site_name(QK__PROF_SITE(ev)), "");
    }
    fputs("</svg>\n", f);
}

/* Timeline: GPU stream k's lane group, the resolved zones of every thread on it (transfers with
   their bytes and rate). */
static void qk__prof_html_stream_lanes(FILE *f, const qk__prof_model *m, int k, qk__prof_html_tl *tl)
{
    qk__prof_thread *t;
    int maxd = 0, lanes;
    char kind[24];
    for (t = qk__prof_g.threads; t; t = t->next) {
        size_t r;
        if (!t->gpu) continue;
        pthread_mutex_lock(&t->gpu->mu);
        for (r = 0; r < t->gpu->n_recs; r++)
            if (t->gpu->recs[r].lane == k && t->gpu->recs[r].depth > maxd) maxd = t->gpu->recs[r].depth;
        pthread_mutex_unlock(&t->gpu->mu);
    }
    qk__prof_spf(kind, sizeof kind, "GPU %d", m->lanes[k].device);
    lanes = qk__prof_html_lanes_open(f, kind, m->lanes[k].name, maxd);
    for (t = qk__prof_g.threads; t; t = t->next) {
        size_t r;
        if (!t->gpu) continue;
        pthread_mutex_lock(&t->gpu->mu);
        for (r = 0; r < t->gpu->n_recs; r++) {
            const qk__prof_grec *gr = &t->gpu->recs[r];
            char extra[96] = "";
            if (gr->lane != k || !qk__prof_html_tl_take(tl, gr->depth, lanes)) continue;
            if (gr->dir)
                qk__prof_spf(extra, sizeof extra, ", %s %llu bytes, %.2f GB/s", qk__prof_dir_name(gr->dir),
                             (unsigned long long)gr->bytes, gr->dur_ns > 0 ? (double)gr->bytes / gr->dur_ns : 0.0);
            qk__prof_html_box(f, m, gr->dir ? "xfer" : "gpu", gr->depth, qk__prof_gabs(m, gr), gr->dur_ns,
                              qk__prof_site_name(gr->site), extra);
        }
        pthread_mutex_unlock(&t->gpu->mu);
    }
    fputs("</svg>\n", f);
}

/* Timeline: the time axis (five ticks over the wall time) and a note on the zones not drawn. */
static void qk__prof_html_time_axis(FILE *f, const qk__prof_model *m, const qk__prof_html_tl *tl)
{
    int tick;
    fputs("<div></div><svg height=\"18\">", f);
    for (tick = 0; tick <= 4; tick++) {
        char t1[32];
        qk__prof_pf(f, "<rect class=\"track\" x=\"%d%%\" y=\"0\" width=\"1\" height=\"4\"/>"
                       "<text x=\"%d%%\" y=\"15\" text-anchor=\"%s\">%s</text>",
                    tick * 25, tick * 25, tick == 0 ? "start" : tick == 4 ? "end" : "middle",
                    qk__prof_time(m->wall * tick / 4, t1, sizeof t1));
    }
    fputs("</svg>\n</div>\n", f);
    if (tl->skipped || tl->deep)
        qk__prof_pf(f, "<p class=\"note\">Not drawn: %d zone%s beyond the first %d boxes, %d zone%s nested deeper than "
                       "%d levels (the trace has every zone).</p>\n", tl->skipped, tl->skipped == 1 ? "" : "s",
                    QK__PROF_HTML_MAX_BOXES, tl->deep, tl->deep == 1 ? "" : "s", QK__PROF_HTML_MAX_DEPTH);
}

/* Chart: the timeline. One group per host thread and per GPU stream, one lane per nesting depth
   (a zone sits under the zone it is nested in); at most QK__PROF_HTML_MAX_BOXES boxes. */
static void qk__prof_html_timeline(FILE *f, const qk__prof_model *m)
{
    qk__prof_html_tl tl = {0, 0, 0};
    int i, k;
    fputs("<h2>Timeline</h2>\n<p class=\"note\">One row per host thread and per GPU stream, one lane per nesting "
          "depth: a zone is drawn under the zone it is nested in.</p>\n<div class=\"tl\">\n", f);
    for (i = 0; i < m->n_threads; i++)
        if (m->threads[i]) qk__prof_html_thread_lanes(f, m, m->threads[i], &tl);
    for (k = 0; k < m->n_lanes; k++) qk__prof_html_stream_lanes(f, m, k, &tl);
    qk__prof_html_time_axis(f, m, &tl);
}

/* Chart: tracked memory over time, host and device (holds qk__prof_mu). */
static void qk__prof_html_memory(FILE *f, const qk__prof_model *m)
{
    const int H = 160;
    double mx = 1;
    size_t p;
    int k;
    char b1[32];
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.n_mseries) { pthread_mutex_unlock(&qk__prof_mu); return; }
    for (p = 0; p < qk__prof_g.n_mseries; p++) {
        if (qk__prof_g.mseries[p].host > mx) mx = qk__prof_g.mseries[p].host;
        if (qk__prof_g.mseries[p].device > mx) mx = qk__prof_g.mseries[p].device;
    }
    qk__prof_pf(f, "<h2>Tracked memory over time</h2>\n<p class=\"note\">Bytes tracked with QK_PROF_TRACK, "
                   "<span style=\"color:#4e79a7\">host</span> and <span style=\"color:#59a14f\">device</span>, "
                   "from 0 to the peak (%s).</p>\n<div class=\"tl\"><div class=\"lbl\" style=\"height:%dpx;display:flex;"
                   "flex-direction:column;justify-content:space-between\"><span>%s</span><span>0</span></div>"
                   "<svg height=\"%d\" viewBox=\"0 0 1000 %d\" preserveAspectRatio=\"none\">"
                   "<rect class=\"bg\" x=\"0\" y=\"0\" width=\"1000\" height=\"%d\"/>\n",
                qk__prof_bytes(mx, b1, sizeof b1), H, b1, H, H, H);
    for (k = 0; k < 2; k++) {
        double prev = 0;
        qk__prof_pf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" vector-effect=\"non-scaling-stroke\" "
                       "points=\"0 %d", k ? "#59a14f" : "#4e79a7", H);
        for (p = 0; p < qk__prof_g.n_mseries; p++) {
            const qk__prof_mpoint *q = &qk__prof_g.mseries[p];
            double x = 10 * qk__prof_pct((double)(int64_t)(q->t - m->t0) * m->npt, m->wall), v = k ? q->device : q->host;
            qk__prof_pf(f, " %.1f %.1f %.1f %.1f", x, H - (H - 2) * prev / mx, x, H - (H - 2) * v / mx);
            prev = v;
        }
        qk__prof_pf(f, " 1000 %.1f\"><title>%s</title></polyline>\n", H - (H - 2) * prev / mx, k ? "device" : "host");
    }
    fputs("</svg></div>\n", f);
    pthread_mutex_unlock(&qk__prof_mu);
}

/* A table's title, a note (or NULL) and its header row; cols: the column names, '|' between. */
static void qk__prof_html_table_open(FILE *f, const char *title, const char *note, const char *cols)
{
    qk__prof_pf(f, "<h2>%s</h2>\n", title);
    if (note) qk__prof_pf(f, "<p class=\"note\">%s</p>\n", note);
    fputs("<table><tr><th>", f);
    for (; *cols; cols++) {
        if (*cols == '|') fputs("</th><th>", f);
        else fputc(*cols, f);
    }
    fputs("</th></tr>\n", f);
}

static void qk__prof_html_rows(FILE *f, const char *title, const qk__prof_row *rows, int n, double wall, int with_self)
{
    int i;
    if (with_self)
        qk__prof_html_table_open(f, title, "Self time = the zone's total less the time of the zones nested directly in "
                                 "it on its thread: the time spent in the zone's own code, summed over its calls.",
                                 "name|calls|total ms|% of wall|self ms|self % of wall|mean us|min us|max us|std us");
    else
        qk__prof_html_table_open(f, title, NULL, "name|calls|total ms|% of wall|mean us|min us|max us|std us");
    for (i = 0; i < n; i++) {
        const qk__prof_row *r = &rows[i];
        fputs("<tr><td>", f);
        qk__prof_html_str(f, r->name);
        qk__prof_pf(f, "</td><td>%llu</td><td>%.3f</td><td>%.1f</td>", (unsigned long long)r->n, r->total * 1e-6,
                    qk__prof_pct(r->total, wall));
        if (with_self)
            qk__prof_pf(f, "<td>%.3f</td><td>%.1f</td>", qk__prof_self(r) * 1e-6, qk__prof_pct(qk__prof_self(r), wall));
        qk__prof_pf(f, "<td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td></tr>\n", r->mean * 1e-3,
                    r->min * 1e-3, r->max * 1e-3, qk__prof_std(r) * 1e-3);
    }
    fputs("</table>\n", f);
}

/* Table: the top bottlenecks (the largest zone totals, CPU and GPU). */
static void qk__prof_html_bottlenecks(FILE *f, const qk__prof_model *m)
{
    int i, nt;
    qk__prof_top *tp = qk__prof_tops(m, &nt);
    qk__prof_html_table_open(f, "Top bottlenecks", "Total time = the zone's time summed over all its calls on all "
                             "threads, as a share of the wall time. It exceeds 100 % when the zone runs on several "
                             "threads at once (4 threads for the whole run: 400 %); nested zones also count in their "
                             "parents (self time: without them; CPU zones).", "zone|kind|total ms|total / wall|self ms");
    for (i = 0; tp && i < nt; i++) {
        fputs("<tr><td>", f);
        qk__prof_html_str(f, tp[i].name);
        qk__prof_pf(f, "</td><td>%s</td><td>%.3f</td><td>%.1f %%</td>", tp[i].gpu ? "GPU" : "CPU",
                    tp[i].total * 1e-6, qk__prof_pct(tp[i].total, m->wall));
        if (tp[i].gpu) fputs("<td>&mdash;</td></tr>\n", f);
        else qk__prof_pf(f, "<td>%.3f</td></tr>\n", tp[i].self * 1e-6);
    }
    fputs("</table>\n", f);
    QK_PROF_FREE(tp);
}

/* Table: the GPU streams (zones, busy time), where there are any. */
static void qk__prof_html_streams(FILE *f, const qk__prof_model *m)
{
    int k;
    if (!m->n_lanes) return;
    qk__prof_html_table_open(f, "GPU streams", NULL, "stream|device|zones|busy ms|busy / wall|busy / active span");
    for (k = 0; k < m->n_lanes; k++) {
        const qk__prof_lrow *l = &m->lanes[k];
        fputs("<tr><td>", f);
        qk__prof_html_str(f, l->name);
        qk__prof_pf(f, "</td><td>%d</td><td>%llu</td><td>%.3f</td><td>%.1f %%</td><td>%.1f %%</td></tr>\n", l->device,
                    (unsigned long long)l->zones, l->busy * 1e-6, qk__prof_pct(l->busy, m->wall),
                    qk__prof_pct(l->busy, l->last - l->first));
    }
    fputs("</table>\n", f);
}

/* Table: transfers per direction and memory kind, where there are any. */
static void qk__prof_html_transfers(FILE *f, const qk__prof_model *m)
{
    int k, p, any = 0;
    char b1[32];
    for (k = 1; k < 5; k++) for (p = 0; p < 2; p++) any |= m->xr[k][p].count > 0;
    if (!any) return;
    qk__prof_html_table_open(f, "Transfers", NULL, "direction|memory|count|bytes|time ms|GB/s");
    for (k = 1; k < 5; k++)
        for (p = 0; p < 2; p++) {
            const qk__prof_xrow *x = &m->xr[k][p];
            if (!x->count) continue;
            qk__prof_pf(f, "<tr><td>%s</td><td>%s</td><td>%llu</td><td>%s</td><td>%.3f</td><td>%.2f</td></tr>\n",
                        qk__prof_dir_name(k), k == QK_PROF_D2D ? "device" : p ? "pinned" : "pageable",
                        (unsigned long long)x->count, qk__prof_bytes(x->bytes, b1, sizeof b1), x->seconds * 1e3,
                        x->seconds > 0 ? x->bytes / x->seconds * 1e-9 : 0.0);
        }
    fputs("</table>\n", f);
}

/* Table: tracked memory per name, where any was tracked (holds qk__prof_mu). */
static void qk__prof_html_memory_table(FILE *f)
{
    int i;
    char b1[32], b2[32];
    pthread_mutex_lock(&qk__prof_mu);
    if (qk__prof_g.n_mnames) {
        qk__prof_html_table_open(f, "Memory (tracked)", NULL, "name|kind|current|peak|allocs|dtype|shape");
        for (i = 0; i < qk__prof_g.n_mnames; i++) {
            const qk__prof_mname *mn = &qk__prof_g.mnames[i];
            fputs("<tr><td>", f);
            qk__prof_html_str(f, mn->name);
            qk__prof_pf(f, "</td><td>%s</td><td>%s</td><td>%s</td><td>%llu</td><td>", qk__prof_kind_name(mn->kind),
                        qk__prof_bytes(mn->current, b1, sizeof b1), qk__prof_bytes(mn->peak, b2, sizeof b2),
                        (unsigned long long)mn->allocs);
            qk__prof_html_str(f, mn->dtype);
            fputs("</td><td>", f);
            qk__prof_html_str(f, mn->shape);
            fputs("</td></tr>\n", f);
        }
        fputs("</table>\n", f);
    }
    pthread_mutex_unlock(&qk__prof_mu);
}

/* Table: counters, where there are any. */
static void qk__prof_html_counters(FILE *f, const qk__prof_model *m)
{
    int i;
    if (!m->n_ctr) return;
    qk__prof_html_table_open(f, "Counters", NULL, "name|updates|total / last|min|max");
    for (i = 0; i < m->n_ctr; i++) {
        fputs("<tr><td>", f);
        qk__prof_html_str(f, m->ctr[i].name);
        qk__prof_pf(f, "</td><td>%llu</td><td>%.6g</td><td>%.6g</td><td>%.6g</td></tr>\n", (unsigned long long)m->ctr[i].n,
                    m->ctr[i].add ? m->ctr[i].sum : m->ctr[i].last, m->ctr[i].min, m->ctr[i].max);
    }
    fputs("</table>\n", f);
}

/* The closing note: what the profiler dropped or found unbalanced. */
static void qk__prof_html_notes(FILE *f, const qk__prof_model *m)
{
    qk__prof_pf(f, "<p class=\"note\">Dropped events %llu (statistics still exact), GPU zones dropped %llu, "
                   "unbalanced END %llu, mismatched END %llu.</p>\n",
                (unsigned long long)m->sum.dropped_events, (unsigned long long)m->sum.dropped_gpu,
                (unsigned long long)m->sum.unbalanced, (unsigned long long)m->sum.mismatched);
}

/* The report, top to bottom: the header, the charts, the tables, the notes. */
static void qk__prof_write_html(FILE *f, qk__prof_model *m)
{
    qk__prof_html_head(f, m);
    qk__prof_html_zone_bars(f, m);
    qk__prof_html_busy(f, m);
    qk__prof_html_timeline(f, m);
    qk__prof_html_memory(f, m);
    qk__prof_html_steps(f, m); /* >>steps */
    qk__prof_html_bottlenecks(f, m);
    qk__prof_html_rows(f, "CPU zones", m->cpu, m->n_cpu, m->wall, 1);
    if (m->n_gpu) qk__prof_html_rows(f, "GPU zones (device time)", m->gpu, m->n_gpu, m->wall, 0);
    qk__prof_html_streams(f, m);
    qk__prof_html_transfers(f, m);
    qk__prof_html_memory_table(f);
    qk__prof_html_counters(f, m);
    qk__prof_html_notes(f, m);
    fputs("</body></html>\n", f);
}

/* >>steps-report ---- implementation: step statistics in the reports ---- */
/* The statistics of one series over the window: the steps from max(warm-up, the zone's first
   step, newest - window + 1) to the newest closed step; a step without the zone counts 0.
   Percentiles: the values sorted, linear interpolation between the two nearest ranks
   (h = (n - 1) q / 100). Trend: the least-squares slope of the value against the step's
   sequence number, with centred sums (no cancellation for long runs). */
typedef struct qk__prof_srow {
    const char *name;           /* NULL: the step time */
    int gpu;
    qk_prof_step_stats s;
} qk__prof_srow;

static double qk__prof_quantile(const double *v, int64_t n, double q)
{
    double h = (double)(n - 1) * q / 100.0;
    int64_t lo = (int64_t)floor(h);
    if (n <= 0) return 0;
    if (lo >= n - 1) return v[n - 1];
    return v[lo] + (h - (double)lo) * (v[lo + 1] - v[lo]);
}

/* Series values (ns) of a name (n) or of the step time (n NULL) into buf (window entries);
   returns the count, *lo the first step's sequence number. Holds qk__prof_st_mu. */
static int64_t qk__prof_steps_series(const qk__prof_sname *n, double npt, double *buf, int64_t *lo_out)
{
    int64_t hi = qk__prof_st.closed - 1, lo = hi - qk__prof_st.window + 1, s, c = 0;
    if (lo < qk__prof_st.warmup) lo = qk__prof_st.warmup;
    if (n && n->first > lo) lo = n->first;
    if (n && n->first < 0) return 0;
    for (s = lo; s <= hi; s++) {
        int k = (int)(s % qk__prof_st.window);
        if (!n) buf[c++] = qk__prof_st.step_ticks[k] * npt;
        else buf[c++] = n->seq[k] == s ? n->val[k] * (n->gpu ? 1.0 : npt) : 0.0;
    }
    *lo_out = lo;
    return c;
}

static void qk__prof_steps_stat(const double *v, int64_t c, int64_t lo, double *sorted, qk_prof_step_stats *o)
{
    int64_t i;
    double mx = 0, my = 0, sxy = 0, sxx = 0;
    o->steps = c;
    o->marked = qk__prof_st.closed;
    if (!c) return;
    o->first = qk__prof_st.step_user[lo % qk__prof_st.window];
    o->last = qk__prof_st.step_user[(lo + c - 1) % qk__prof_st.window];
    memcpy(sorted, v, (size_t)c * sizeof *sorted);
    qsort(sorted, (size_t)c, sizeof *sorted, qk__prof_dcmp);
    for (i = 0; i < c; i++) my += v[i];
    my /= (double)c;
    mx = (double)(c - 1) / 2.0;
    for (i = 0; i < c; i++) {
        sxy += ((double)i - mx) * (v[i] - my);
        sxx += ((double)i - mx) * ((double)i - mx);
    }
    o->mean_ns = my;
    o->min_ns = sorted[0];
    o->max_ns = sorted[c - 1];
    o->p50_ns = qk__prof_quantile(sorted, c, 50);
    o->p95_ns = qk__prof_quantile(sorted, c, 95);
    o->p99_ns = qk__prof_quantile(sorted, c, 99);
    o->trend_ns = sxx > 0 ? sxy / sxx : 0;
    o->trend_rel = my > 0 ? o->trend_ns / my : 0;
}

/* All rows: the step time first, then every zone name (CPU, then GPU), in first-seen order.
   *n gets the count (0: no step recorded); the caller frees. */
static qk__prof_srow *qk__prof_steps_rows(double npt, int *n)
{
    qk__prof_srow *rows = NULL;
    double *buf = NULL, *sorted = NULL;
    int i, o = 0;
    *n = 0;
    pthread_mutex_lock(&qk__prof_st_mu);
    if (qk__prof_st.ready && qk__prof_st.closed > 0) {
        rows = (qk__prof_srow *)qk__prof_calloc((size_t)qk__prof_st.n_names + 1, sizeof *rows);
        buf = (double *)qk__prof_calloc((size_t)qk__prof_st.window, sizeof *buf);
        sorted = (double *)qk__prof_calloc((size_t)qk__prof_st.window, sizeof *sorted);
        if (rows && buf && sorted) {
            int64_t lo = 0, c = qk__prof_steps_series(NULL, npt, buf, &lo);
            qk__prof_steps_stat(buf, c, lo, sorted, &rows[o++].s);
            for (i = 0; i < 2 * qk__prof_st.n_names; i++) {
                const qk__prof_sname *sn = &qk__prof_st.names[i % qk__prof_st.n_names];
                if (sn->gpu != (i >= qk__prof_st.n_names)) continue;
                c = qk__prof_steps_series(sn, npt, buf, &lo);
                if (!c) continue;
                rows[o].name = sn->name;
                rows[o].gpu = sn->gpu;
                qk__prof_steps_stat(buf, c, lo, sorted, &rows[o++].s);
            }
            *n = o;
        } else {
            QK_PROF_FREE(rows);
            rows = NULL;
        }
    }
    pthread_mutex_unlock(&qk__prof_st_mu);
    QK_PROF_FREE(buf);
    QK_PROF_FREE(sorted);
    return rows;
}

QK_PROF_DEF int qk_prof_zone_step_stats(const char *name, int gpu, qk_prof_step_stats *out)
{
    qk__prof_model m;
    qk__prof_srow *rows;
    int n, i, rc = -1;
    if (qk__prof_model_build(&m) != 0) return -1; /* resolves GPU zones, calibrates the clock */
    rows = qk__prof_steps_rows(m.npt, &n);
    for (i = 0; i < n; i++) {
        if (name ? rows[i].name && rows[i].gpu == (gpu != 0) && strcmp(rows[i].name, name) == 0 : !rows[i].name) {
            *out = rows[i].s;
            rc = 0;
            break;
        }
    }
    if (rc) qk__prof_seterr("qk_prof_zone_step_stats: %s", !n ? "no step recorded (QK_PROF_STEP)" : "the zone ran in no step");
    QK_PROF_FREE(rows);
    qk__prof_model_free(&m);
    return rc;
}

static void qk__prof_steps_text(FILE *f, const qk__prof_model *m, int w)
{
    int n, i;
    qk__prof_srow *rows = qk__prof_steps_rows(m->npt, &n);
    if (!n) { QK_PROF_FREE(rows); return; }
    qk__prof_pf(f, "\nSteps: %lld ended, warm-up %d left out; statistics over %lld steps (%lld to %lld; window %d); "
                   "a zone's time per step (0 where it did not run)\n",
                (long long)rows[0].s.marked, qk__prof_st.warmup, (long long)rows[0].s.steps, (long long)rows[0].s.first,
                (long long)rows[0].s.last, qk__prof_st.window);
    qk__prof_pf(f, "%-*s %4s %8s %11s %11s %11s %11s %11s %8s %12s\n", w, "per step", "kind", "steps", "mean us",
                "p50 us", "p95 us", "p99 us", "max us", "p99/p50", "trend %/step");
    for (i = 0; i < n; i++) {
        const qk_prof_step_stats *s = &rows[i].s;
        qk__prof_text_name(f, rows[i].name ? rows[i].name : "(step time)", w);
        qk__prof_pf(f, " %4s %8lld %11.3f %11.3f %11.3f %11.3f %11.3f %8.2f %+12.4f\n", !rows[i].name ? "step" : rows[i].gpu ? "GPU" : "CPU",
                    (long long)s->steps, s->mean_ns * 1e-3, s->p50_ns * 1e-3, s->p95_ns * 1e-3, s->p99_ns * 1e-3,
                    s->max_ns * 1e-3, s->p50_ns > 0 ? s->p99_ns / s->p50_ns : 0.0, 100.0 * s->trend_rel);
    }
    QK_PROF_FREE(rows);
}

static void qk__prof_steps_json_one(FILE *f, const qk_prof_step_stats *s)
{
    qk__prof_pf(f, "\"steps\":%lld,\"first\":%lld,\"last\":%lld", (long long)s->steps, (long long)s->first, (long long)s->last);
    fputs(",\"mean_ns\":", f); qk__prof_json_num(f, s->mean_ns);
    fputs(",\"min_ns\":", f); qk__prof_json_num(f, s->min_ns);
    fputs(",\"max_ns\":", f); qk__prof_json_num(f, s->max_ns);
    fputs(",\"p50_ns\":", f); qk__prof_json_num(f, s->p50_ns);
    fputs(",\"p95_ns\":", f); qk__prof_json_num(f, s->p95_ns);
    fputs(",\"p99_ns\":", f); qk__prof_json_num(f, s->p99_ns);
    fputs(",\"trend_ns_per_step\":", f); qk__prof_json_num(f, s->trend_ns);
    fputs(",\"trend_rel_per_step\":", f); qk__prof_json_num(f, s->trend_rel);
}

/* ,"steps":{...} (nothing where no step was recorded). */
static void qk__prof_steps_json(FILE *f, const qk__prof_model *m)
{
    int n, i;
    qk__prof_srow *rows = qk__prof_steps_rows(m->npt, &n);
    if (!n) { QK_PROF_FREE(rows); return; }
    qk__prof_pf(f, ",\n\"steps\":{\"ended\":%lld,\"warmup\":%d,\"window\":%d,\"late_gpu\":%llu,\"step\":{",
                (long long)rows[0].s.marked, qk__prof_st.warmup, qk__prof_st.window, (unsigned long long)qk__prof_st.late_gpu);
    qk__prof_steps_json_one(f, &rows[0].s);
    fputs("},\"zones\":[", f);
    for (i = 1; i < n; i++) {
        fputs(i > 1 ? ",\n {\"name\":" : "\n {\"name\":", f);
        qk__prof_json_str(f, rows[i].name);
        qk__prof_pf(f, ",\"gpu\":%s,", rows[i].gpu ? "true" : "false");
        qk__prof_steps_json_one(f, &rows[i].s);
        fputc('}', f);
    }
    fputs("]}", f);
    QK_PROF_FREE(rows);
}

/* Chart: the step time and the per-step time of the (up to) 5 zones with the largest mean, over
   the window, with the p50 and p99 of the step time as dashed lines; then the table. */
static void qk__prof_html_steps(FILE *f, const qk__prof_model *m)
{
    static const char *const col[6] = { "#222", "#4e79a7", "#59a14f", "#f28e2b", "#e15759", "#b07aa1" };
    const int H = 200;
    int n, i, k, pick[6], np = 0;
    double mx = 0, *buf = NULL;
    int64_t c = 0, lo = 0;
    char t1[32], t2[32], t3[32];
    qk__prof_srow *rows = qk__prof_steps_rows(m->npt, &n);
    if (!n || !rows[0].s.steps) { QK_PROF_FREE(rows); return; }
    pick[np++] = 0;
    for (k = 0; k < 5; k++) {   /* the zones with the largest mean per step */
        int best = -1;
        for (i = 1; i < n; i++) {
            int taken = 0, j;
            for (j = 0; j < np; j++) taken |= pick[j] == i;
            if (!taken && (best < 0 || rows[i].s.mean_ns > rows[best].s.mean_ns)) best = i;
        }
        if (best < 0) break;
        pick[np++] = best;
    }
    for (k = 0; k < np; k++) if (rows[pick[k]].s.max_ns > mx) mx = rows[pick[k]].s.max_ns;
    if (mx <= 0) mx = 1;
    qk__prof_pf(f, "<h2>Step times</h2>\n<p class=\"note\">Time per step (QK_PROF_STEP) over the last %lld steps "
                   "(%lld to %lld; warm-up %d left out): the step time in black, the zones with the largest mean per "
                   "step in colour (a zone's time summed over the step, 0 where it did not run); dashed: the step "
                   "time's p50 (%s) and p99 (%s). From 0 to %s.</p>\n",
                (long long)rows[0].s.steps, (long long)rows[0].s.first, (long long)rows[0].s.last, qk__prof_st.warmup,
                qk__prof_time(rows[0].s.p50_ns, t1, sizeof t1), qk__prof_time(rows[0].s.p99_ns, t2, sizeof t2),
                qk__prof_time(mx, t3, sizeof t3));
    fputs("<div class=\"tl\"><div class=\"lbl\">", f);
    for (k = 0; k < np; k++) {
        qk__prof_pf(f, "%s<span style=\"color:%s\">", k ? "<br>" : "", col[k]);
        qk__prof_html_label(f, k ? rows[pick[k]].name : "step time", 40);
        fputs("</span>", f);
    }
    qk__prof_pf(f, "</div><svg class=\"steps\" height=\"%d\" viewBox=\"0 0 1000 %d\" preserveAspectRatio=\"none\">"
                   "<rect class=\"bg\" x=\"0\" y=\"0\" width=\"1000\" height=\"%d\"/>\n", H, H, H);
    buf = (double *)qk__prof_calloc((size_t)rows[0].s.steps + 1, sizeof *buf);
    pthread_mutex_lock(&qk__prof_st_mu);
    for (k = np - 1; buf && k >= 0; k--) {
        const qk__prof_sname *sn = NULL;
        int64_t s0 = 0, j;
        const qk__prof_srow *r = &rows[pick[k]];
        for (i = 0; r->name && i < qk__prof_st.n_names; i++)
            if (qk__prof_st.names[i].gpu == r->gpu && strcmp(qk__prof_st.names[i].name, r->name) == 0) sn = &qk__prof_st.names[i];
        if (r->name && !sn) continue;
        c = qk__prof_steps_series(sn, m->npt, buf, &s0);
        if (!k) lo = s0;
        qk__prof_pf(f, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"%d\" "
                       "vector-effect=\"non-scaling-stroke\" points=\"", col[k], k ? 1 : 2);
        for (j = 0; j < c; j++) {
            /* x across the window's steps (the step time's), a zone that began later starts later */
            double x = rows[0].s.steps > 1 ? 1000.0 * (double)(s0 - (qk__prof_st.closed - rows[0].s.steps) + j) / (double)(rows[0].s.steps - 1) : 500.0;
            qk__prof_pf(f, "%s%.1f %.1f", j ? " " : "", x, H - (H - 2) * buf[j] / mx);
        }
        fputs("\"><title>", f);
        qk__prof_html_str(f, r->name ? r->name : "step time");
        qk__prof_pf(f, ": mean %s, p50 %s, p99 %s per step</title></polyline>\n", qk__prof_time(r->s.mean_ns, t1, sizeof t1),
                    qk__prof_time(r->s.p50_ns, t2, sizeof t2), qk__prof_time(r->s.p99_ns, t3, sizeof t3));
    }
    pthread_mutex_unlock(&qk__prof_st_mu);
    (void)lo;
    QK_PROF_FREE(buf);
    for (k = 0; k < 2; k++) {
        double v = k ? rows[0].s.p99_ns : rows[0].s.p50_ns, y = H - (H - 2) * v / mx;
        qk__prof_pf(f, "<line x1=\"0\" x2=\"1000\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" stroke-dasharray=\"6 4\" "
                       "vector-effect=\"non-scaling-stroke\"><title>step time p%d: %s</title></line>\n",
                    y, y, k ? 99 : 50, qk__prof_time(v, t1, sizeof t1));
    }
    fputs("</svg></div>\n", f);
    qk__prof_html_table_open(f, "Per-step statistics", "A zone's time per step: the sum of its calls in the step "
                             "(CPU zones count in the step they end in, GPU zones in the step they begin in), 0 where "
                             "it did not run, over the steps above. Trend: the least-squares slope per step, relative to "
                             "the mean.", "zone|kind|steps|mean us|p50 us|p95 us|p99 us|max us|p99 / p50|trend % / step");
    for (i = 0; i < n; i++) {
        const qk_prof_step_stats *s = &rows[i].s;
        fputs("<tr><td>", f);
        qk__prof_html_str(f, rows[i].name ? rows[i].name : "(step time)");
        qk__prof_pf(f, "</td><td>%s</td><td>%lld</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td>"
                       "<td>%.2f</td><td>%+.4f</td></tr>\n", !rows[i].name ? "step" : rows[i].gpu ? "GPU" : "CPU",
                    (long long)s->steps, s->mean_ns * 1e-3, s->p50_ns * 1e-3, s->p95_ns * 1e-3, s->p99_ns * 1e-3,
                    s->max_ns * 1e-3, s->p50_ns > 0 ? s->p99_ns / s->p50_ns : 0.0, 100.0 * s->trend_rel);
    }
    fputs("</table>\n", f);
    QK_PROF_FREE(rows);
}
/* >>steps-report end */

/* >>mpi ---- implementation: MPI-wide reports (QK_PROF_MPI) ---- */
/* Each rank records on its own. With QK_PROF_MPI (the implementation TU includes mpi.h) the
   report calls are collective over MPI_COMM_WORLD once MPI is initialized (and not finalized):
   every rank sends its per-zone statistics (and, for a trace, its whole trace) to rank 0, which
   writes one report; the other ranks write nothing and return rank 0's result. What rank 0
   writes: per rank its wall time, threads, streams, GPU busy time and step times; per zone the
   min / mean / max of its total over the ranks (a rank without the zone counts 0), the imbalance
   max / mean and the slowest rank; then rank 0's own report. The trace has every rank's events,
   rank r's processes numbered 64 r + the single-process pid (host: 64 r + 1) and named
   "rank r ...", on rank 0's clock: each rank's offset to rank 0 is measured by a ping-pong (the
   round trip of the fewest ticks of QK__PROF_MPI_PINGS) at init (qk_prof_init after MPI_Init,
   or qk_prof_mpi_sync) and at the report, and interpolated linearly between the two.
   qk_prof_write_local / qk_prof_write_file_local write this rank's own report (not collective). */
#ifdef QK_PROF_MPI
#include <mpi.h>
#ifndef __cplusplus
extern FILE *open_memstream(char **buf, size_t *size);
#endif
#define QK__PROF_MPI_PINGS 16
#define QK__PROF_MPI_TAG 7411
/* qk__prof_mpi_local (forward, above): 1 while writing this rank's own report; qk__prof_mpi_buf,
   _len: rank 0's merged output, written instead of a report by the calls below */

typedef struct qk__prof_mpi_pt { uint64_t mid0, tr; int ok; } qk__prof_mpi_pt; /* rank 0's tick, the rank's */
static qk__prof_mpi_pt *qk__prof_mpi_init_pts; /* rank 0: the init measurement, per rank */
static int qk__prof_mpi_init_n;

static int qk__prof_mpi_up(void)
{
    int a = 0, b = 0;
    MPI_Initialized(&a);
    if (a) MPI_Finalized(&b);
    return a && !b;
}

/* Collective ping-pong: rank 0 gets, per rank, its tick at the midpoint of the shortest round
   trip and the rank's tick at the reply (NULL elsewhere, or when out of memory: then no pair). */
static qk__prof_mpi_pt *qk__prof_mpi_measure(MPI_Comm comm, int *n_out)
{
    int rank, size, r, k, one = 1;
    qk__prof_mpi_pt *pts = NULL;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    *n_out = size;
    if (rank == 0) {
        pts = (qk__prof_mpi_pt *)qk__prof_calloc((size_t)size, sizeof *pts);
        for (r = 1; r < size; r++) {
            uint64_t best = (uint64_t)-1;
            for (k = 0; k < QK__PROF_MPI_PINGS; k++) {
                uint64_t a, b, tr = 0;
                a = qk__prof_now();
                MPI_Send(&one, 1, MPI_INT, r, QK__PROF_MPI_TAG, comm);
                MPI_Recv(&tr, 1, MPI_UINT64_T, r, QK__PROF_MPI_TAG, comm, MPI_STATUS_IGNORE);
                b = qk__prof_now();
                if (pts && b - a < best) { best = b - a; pts[r].mid0 = a + (b - a) / 2; pts[r].tr = tr; pts[r].ok = 1; }
            }
        }
    } else {
        for (k = 0; k < QK__PROF_MPI_PINGS; k++) {
            uint64_t tr;
            MPI_Recv(&one, 1, MPI_INT, 0, QK__PROF_MPI_TAG, comm, MPI_STATUS_IGNORE);
            tr = qk__prof_now();
            MPI_Send(&tr, 1, MPI_UINT64_T, 0, QK__PROF_MPI_TAG, comm);
        }
    }
    return pts;
}

QK_PROF_DEF int qk_prof_mpi_sync(void)
{
    int n;
    qk__prof_mpi_pt *pts;
    if (!qk__prof_mpi_up()) { qk__prof_seterr("qk_prof_mpi_sync: MPI is not initialized"); return -1; }
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.ready) qk__prof_init_locked(NULL);
    pthread_mutex_unlock(&qk__prof_mu);
    pts = qk__prof_mpi_measure(MPI_COMM_WORLD, &n);
    QK_PROF_FREE(qk__prof_mpi_init_pts);
    qk__prof_mpi_init_pts = pts;
    qk__prof_mpi_init_n = n;
    return 0;
}

static void qk__prof_mpi_free(void)
{
    QK_PROF_FREE(qk__prof_mpi_init_pts);
    qk__prof_mpi_init_pts = NULL;
    qk__prof_mpi_init_n = 0;
}

/* A growing byte buffer (the per-rank record). */
typedef struct qk__prof_bb { char *p; size_t n, cap; int oom; } qk__prof_bb;
static void qk__prof_bb_put(qk__prof_bb *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 4096;
        void *np;
        while (nc < b->n + n) nc *= 2;
        if (!(np = QK_PROF_REALLOC(b->p, nc))) { b->oom = 1; return; }
        b->p = (char *)np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void qk__prof_bb_str(qk__prof_bb *b, const char *s)
{
    uint32_t n = (uint32_t)(s ? strlen(s) : 0);
    qk__prof_bb_put(b, &n, sizeof n);
    qk__prof_bb_put(b, s, n);
}
typedef struct qk__prof_rd { const char *p; size_t n, o; int bad; } qk__prof_rd;
static void qk__prof_rd_get(qk__prof_rd *r, void *dst, size_t n)
{
    if (r->bad || r->o + n > r->n) { r->bad = 1; memset(dst, 0, n); return; }
    memcpy(dst, r->p + r->o, n);
    r->o += n;
}
/* A string of the record, pointed to in place; *len its length. */
static const char *qk__prof_rd_str(qk__prof_rd *r, uint32_t *len)
{
    const char *s;
    qk__prof_rd_get(r, len, sizeof *len);
    if (r->bad || r->o + *len > r->n) { r->bad = 1; *len = 0; return ""; }
    s = r->p + r->o;
    r->o += *len;
    return s;
}

/* One rank as rank 0 sees it. */
typedef struct qk__prof_mrow { const char *name; uint32_t len; int gpu; double v[7]; } qk__prof_mrow; /* calls total self mean min max std */
typedef struct qk__prof_mrank {
    int32_t threads, lanes, n_rows, have_step;
    uint64_t origin;
    double npt, wall, gpu_busy, step[4];  /* step time: steps, mean, p50, p99 */
    const char *host;
    uint32_t host_len;
    qk__prof_mrow *rows;
    double off_a, off_b, at_a, at_b;      /* offsets (ns) to rank 0 at this rank's times at_a, at_b */
    int n_off;
} qk__prof_mrank;

/* This rank's record: header, then one entry per zone row. */
static void qk__prof_mpi_record(qk__prof_bb *b, const qk__prof_model *m)
{
    int32_t h[4];
    double d[7];
    char host[MPI_MAX_PROCESSOR_NAME + 1];
    int hl = 0, i, k, nr;
    qk__prof_srow *srows = qk__prof_steps_rows(m->npt, &nr);
    double busy = 0;
    for (k = 0; k < m->n_lanes; k++) busy += m->lanes[k].busy;
    memset(host, 0, sizeof host);
    MPI_Get_processor_name(host, &hl);
    h[0] = m->sum.threads; h[1] = m->n_lanes; h[2] = m->n_cpu + m->n_gpu; h[3] = nr > 0 && srows[0].s.steps > 0;
    qk__prof_bb_put(b, h, sizeof h);
    qk__prof_bb_put(b, &qk__prof_g.t_origin, sizeof qk__prof_g.t_origin);
    d[0] = m->npt; d[1] = m->wall; d[2] = busy;
    d[3] = h[3] ? (double)srows[0].s.steps : 0; d[4] = h[3] ? srows[0].s.mean_ns : 0;
    d[5] = h[3] ? srows[0].s.p50_ns : 0; d[6] = h[3] ? srows[0].s.p99_ns : 0;
    qk__prof_bb_put(b, d, sizeof d);
    QK_PROF_FREE(srows);
    qk__prof_bb_str(b, host);
    for (i = 0; i < m->n_cpu + m->n_gpu; i++) {
        const qk__prof_row *r = i < m->n_cpu ? &m->cpu[i] : &m->gpu[i - m->n_cpu];
        int32_t gpu = i >= m->n_cpu;
        qk__prof_bb_put(b, &gpu, sizeof gpu);
        qk__prof_bb_str(b, r->name);
        d[0] = (double)r->n; d[1] = r->total; d[2] = gpu ? -1.0 : qk__prof_self(r); d[3] = r->mean;
        d[4] = r->min; d[5] = r->max; d[6] = qk__prof_std(r);
        qk__prof_bb_put(b, d, sizeof d);
    }
}

static int qk__prof_mpi_parse(const char *p, size_t n, qk__prof_mrank *o)
{
    qk__prof_rd r;
    int32_t h[4];
    double d[7];
    int i;
    r.p = p; r.n = n; r.o = 0; r.bad = 0;
    memset(o, 0, sizeof *o);
    qk__prof_rd_get(&r, h, sizeof h);
    qk__prof_rd_get(&r, &o->origin, sizeof o->origin);
    qk__prof_rd_get(&r, d, sizeof d);
    o->threads = h[0]; o->lanes = h[1]; o->n_rows = h[2]; o->have_step = h[3];
    o->npt = d[0]; o->wall = d[1]; o->gpu_busy = d[2];
    memcpy(o->step, d + 3, sizeof o->step);
    o->host = qk__prof_rd_str(&r, &o->host_len);
    if (r.bad || o->n_rows < 0 || (size_t)o->n_rows > n) return -1;
    o->rows = (qk__prof_mrow *)qk__prof_calloc((size_t)o->n_rows + 1, sizeof *o->rows);
    if (!o->rows) return -1;
    for (i = 0; i < o->n_rows; i++) {
        int32_t gpu;
        qk__prof_rd_get(&r, &gpu, sizeof gpu);
        o->rows[i].gpu = gpu;
        o->rows[i].name = qk__prof_rd_str(&r, &o->rows[i].len);
        qk__prof_rd_get(&r, o->rows[i].v, sizeof o->rows[i].v);
    }
    return r.bad ? -1 : 0;
}

/* Rank 0's view across the ranks, per zone. */
typedef struct qk__prof_mzone {
    const char *name;
    uint32_t len;
    int gpu, ranks, slowest;
    double calls, min, mean, max, sum;
} qk__prof_mzone;

static int qk__prof_mzone_cmp(const void *a, const void *b)
{
    const qk__prof_mzone *x = (const qk__prof_mzone *)a, *y = (const qk__prof_mzone *)b;
    if (x->max != y->max) return x->max < y->max ? 1 : -1;
    return x->gpu - y->gpu;
}

/* The offset (ns, to add) of a rank's time t (ns on its own timeline). */
static double qk__prof_mpi_off(const qk__prof_mrank *k, double t)
{
    if (k->n_off == 2 && k->at_b > k->at_a) return k->off_a + (t - k->at_a) * (k->off_b - k->off_a) / (k->at_b - k->at_a);
    return k->n_off ? k->off_b : 0.0;
}

static void qk__prof_mpi_offsets(qk__prof_mrank *rk, int size, const qk__prof_mpi_pt *rep)
{
    int r;
    for (r = 1; r < size; r++) {
        qk__prof_mrank *k = &rk[r];
        const qk__prof_mpi_pt *pi = qk__prof_mpi_init_pts && r < qk__prof_mpi_init_n ? &qk__prof_mpi_init_pts[r] : NULL;
        const qk__prof_mpi_pt *pp = rep ? &rep[r] : NULL;
        if (pp && pp->ok) {
            k->at_b = (double)(int64_t)(pp->tr - k->origin) * k->npt;
            k->off_b = (double)(int64_t)(pp->mid0 - rk[0].origin) * rk[0].npt - k->at_b;
            k->n_off = 1;
        }
        if (pi && pi->ok && k->n_off) {
            k->at_a = (double)(int64_t)(pi->tr - k->origin) * k->npt;
            k->off_a = (double)(int64_t)(pi->mid0 - rk[0].origin) * rk[0].npt - k->at_a;
            k->n_off = 2;
        }
    }
}

/* Merged zones (caller frees); *n the count. */
static qk__prof_mzone *qk__prof_mpi_zones(const qk__prof_mrank *rk, int size, int *n)
{
    int r, i, j, nz = 0, cap = 0;
    qk__prof_mzone *z = NULL;
    for (r = 0; r < size; r++)
        for (i = 0; i < rk[r].n_rows; i++) {
            const qk__prof_mrow *w = &rk[r].rows[i];
            for (j = 0; j < nz; j++)
                if (z[j].gpu == w->gpu && z[j].len == w->len && memcmp(z[j].name, w->name, w->len) == 0) break;
            if (j == nz) {
                if (qk__prof_grow((void **)&z, &cap, nz + 1, sizeof *z) != 0) { *n = nz; return z; }
                memset(&z[nz], 0, sizeof *z);
                z[nz].name = w->name; z[nz].len = w->len; z[nz].gpu = w->gpu; z[nz].slowest = r;
                z[nz].min = w->v[1];
                nz++;
            }
            z[j].ranks++;
            z[j].calls += w->v[0];
            z[j].sum += w->v[1];
            if (w->v[1] > z[j].max) { z[j].max = w->v[1]; z[j].slowest = r; }
            if (w->v[1] < z[j].min) z[j].min = w->v[1];
        }
    for (j = 0; j < nz; j++) {
        z[j].mean = z[j].sum / size;
        if (z[j].ranks < size) z[j].min = 0; /* a rank without the zone: 0 */
    }
    if (nz) qsort(z, (size_t)nz, sizeof *z, qk__prof_mzone_cmp);
    *n = nz;
    return z;
}

/* The total (ns) of zone z on rank r, 0 where it has none. */
static double qk__prof_mpi_total(const qk__prof_mrank *k, const qk__prof_mzone *z)
{
    int i;
    for (i = 0; i < k->n_rows; i++)
        if (k->rows[i].gpu == z->gpu && k->rows[i].len == z->len && memcmp(k->rows[i].name, z->name, z->len) == 0)
            return k->rows[i].v[1];
    return 0;
}

static void qk__prof_mpi_name(char *buf, size_t cap, const char *s, uint32_t len)
{
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(buf, s, n);
    buf[n] = 0;
}

static void qk__prof_mpi_text(FILE *f, const qk__prof_mrank *rk, int size, const qk__prof_mzone *z, int nz)
{
    int r, j;
    char nm[256];
    qk__prof_pf(f, "qk_prof MPI report: %d rank%s (clocks aligned to rank 0's by ping-pong at init and at the report)\n",
                size, size == 1 ? "" : "s");
    qk__prof_pf(f, "\n%-6s %-20s %12s %8s %8s %14s %12s %12s %14s\n", "rank", "host", "wall ms", "threads", "streams",
                "GPU busy ms", "step p50 us", "step p99 us", "offset us");
    for (r = 0; r < size; r++) {
        const qk__prof_mrank *k = &rk[r];
        qk__prof_mpi_name(nm, sizeof nm, k->host, k->host_len);
        qk__prof_pf(f, "%-6d %-20.20s %12.3f %8d %8d %14.3f %12.3f %12.3f %14.3f\n", r, nm, k->wall * 1e-6, k->threads,
                    k->lanes, k->gpu_busy * 1e-6, k->have_step ? k->step[2] * 1e-3 : 0.0,
                    k->have_step ? k->step[3] * 1e-3 : 0.0, qk__prof_mpi_off(k, k->wall) * 1e-3);
    }
    qk__prof_pf(f, "\n%-32s %4s %6s %13s %13s %13s %9s %8s\n", "Zones across ranks (total ms)", "kind", "ranks", "min",
                "mean", "max", "max/mean", "slowest");
    for (j = 0; j < nz; j++) {
        qk__prof_mpi_name(nm, sizeof nm, z[j].name, z[j].len);
        qk__prof_text_name(f, nm, 32);
        qk__prof_pf(f, " %4s %6d %13.3f %13.3f %13.3f %9.3f %8d\n", z[j].gpu ? "GPU" : "CPU", z[j].ranks, z[j].min * 1e-6,
                    z[j].mean * 1e-6, z[j].max * 1e-6, z[j].mean > 0 ? z[j].max / z[j].mean : 0.0, z[j].slowest);
    }
    qk__prof_pf(f, "(min / mean / max over all %d ranks, a rank without the zone counting 0; imbalance = max / mean)\n"
                   "\n==== rank 0 ====\n", size);
}

static void qk__prof_mpi_json(FILE *f, const qk__prof_mrank *rk, int size, const qk__prof_mzone *z, int nz)
{
    int r, j;
    qk__prof_pf(f, "{\"mpi\":{\"ranks\":%d,\"per_rank\":[", size);
    for (r = 0; r < size; r++) {
        const qk__prof_mrank *k = &rk[r];
        char nm[MPI_MAX_PROCESSOR_NAME + 1];
        qk__prof_mpi_name(nm, sizeof nm, k->host, k->host_len);
        qk__prof_pf(f, "%s\n {\"rank\":%d,\"host\":", r ? "," : "", r);
        qk__prof_json_str(f, nm);
        fputs(",\"wall_ns\":", f); qk__prof_json_num(f, k->wall);
        qk__prof_pf(f, ",\"threads\":%d,\"streams\":%d,\"gpu_busy_ns\":", k->threads, k->lanes);
        qk__prof_json_num(f, k->gpu_busy);
        fputs(",\"clock_offset_ns\":", f); qk__prof_json_num(f, qk__prof_mpi_off(k, k->wall));
        if (k->have_step) {
            qk__prof_pf(f, ",\"step\":{\"steps\":%lld,\"mean_ns\":", (long long)k->step[0]);
            qk__prof_json_num(f, k->step[1]);
            fputs(",\"p50_ns\":", f); qk__prof_json_num(f, k->step[2]);
            fputs(",\"p99_ns\":", f); qk__prof_json_num(f, k->step[3]);
            fputc('}', f);
        }
        fputc('}', f);
    }
    fputs("],\n\"zones\":[", f);
    for (j = 0; j < nz; j++) {
        char nm[1024];
        qk__prof_mpi_name(nm, sizeof nm, z[j].name, z[j].len);
        fputs(j ? ",\n {\"name\":" : "\n {\"name\":", f);
        qk__prof_json_str(f, nm);
        qk__prof_pf(f, ",\"gpu\":%s,\"ranks\":%d,\"calls\":", z[j].gpu ? "true" : "false", z[j].ranks);
        qk__prof_json_num(f, z[j].calls);
        fputs(",\"min_ns\":", f); qk__prof_json_num(f, z[j].min);
        fputs(",\"mean_ns\":", f); qk__prof_json_num(f, z[j].mean);
        fputs(",\"max_ns\":", f); qk__prof_json_num(f, z[j].max);
        fputs(",\"imbalance\":", f); qk__prof_json_num(f, z[j].mean > 0 ? z[j].max / z[j].mean : 0.0);
        qk__prof_pf(f, ",\"slowest_rank\":%d,\"total_ns\":[", z[j].slowest);
        for (r = 0; r < size; r++) { if (r) fputc(',', f); qk__prof_json_num(f, qk__prof_mpi_total(&rk[r], &z[j])); }
        fputs("]}", f);
    }
    fputs("]},\n", f);
}

static void qk__prof_mpi_html(FILE *f, const qk__prof_mrank *rk, int size, const qk__prof_mzone *z, int nz)
{
    int r, j;
    double maxw = 0;
    char t1[32], t2[32], nm[256], tip[512];
    qk__prof_pf(f, "<h2>MPI: %d rank%s</h2>\n<p class=\"note\">Every rank recorded on its own; rank 0 gathered their "
                   "statistics. The rest of this page below the MPI section is rank 0's own report.</p>\n",
                size, size == 1 ? "" : "s");
    for (r = 0; r < size; r++) if (rk[r].wall > maxw) maxw = rk[r].wall;
    fputs("<h2>Per rank: wall time and GPU busy time</h2>\n<div class=\"chart\">\n", f);
    for (r = 0; r < size; r++) {
        char kind[24], val[48];
        qk__prof_mpi_name(nm, sizeof nm, rk[r].host, rk[r].host_len);
        qk__prof_spf(kind, sizeof kind, "rank %d", r);
        qk__prof_time(rk[r].wall, val, sizeof val);
        qk__prof_spf(tip, sizeof tip, "rank %d on %.64s: wall %s, GPU busy %s, %d threads, %d streams", r, nm, val,
                     qk__prof_time(rk[r].gpu_busy, t1, sizeof t1), rk[r].threads, rk[r].lanes);
        qk__prof_html_bar(f, kind, nm, "cpu", qk__prof_pct(rk[r].wall, maxw), val, tip);
        if (rk[r].lanes) {
            qk__prof_time(rk[r].gpu_busy, val, sizeof val);
            qk__prof_html_bar(f, kind, "GPU busy", "gpu", qk__prof_pct(rk[r].gpu_busy, maxw), val, tip);
        }
    }
    fputs("</div>\n", f);
    qk__prof_html_table_open(f, "Per rank", NULL, "rank|host|wall|threads|streams|GPU busy|step p50|step p99|clock offset");
    for (r = 0; r < size; r++) {
        qk__prof_mpi_name(nm, sizeof nm, rk[r].host, rk[r].host_len);
        qk__prof_pf(f, "<tr><td>%d</td><td>", r);
        qk__prof_html_str(f, nm);
        qk__prof_pf(f, "</td><td>%s</td><td>%d</td><td>%d</td><td>%s</td>", qk__prof_time(rk[r].wall, t1, sizeof t1),
                    rk[r].threads, rk[r].lanes, qk__prof_time(rk[r].gpu_busy, t2, sizeof t2));
        if (rk[r].have_step) {
            qk__prof_pf(f, "<td>%s</td>", qk__prof_time(rk[r].step[2], t1, sizeof t1));
            qk__prof_pf(f, "<td>%s</td>", qk__prof_time(rk[r].step[3], t1, sizeof t1));
        } else {
            fputs("<td>&mdash;</td><td>&mdash;</td>", f);
        }
        qk__prof_pf(f, "<td>%s</td></tr>\n", qk__prof_time(qk__prof_mpi_off(&rk[r], rk[r].wall), t1, sizeof t1));
    }
    fputs("</table>\n", f);
    qk__prof_html_table_open(f, "Zones across ranks", "A zone's total time on each rank: min / mean / max over all ranks "
                             "(a rank without the zone counts 0), imbalance = max / mean, and the slowest rank.",
                             "zone|kind|ranks|min|mean|max|max / mean|slowest rank");
    for (j = 0; j < nz; j++) {
        qk__prof_mpi_name(nm, sizeof nm, z[j].name, z[j].len);
        fputs("<tr><td>", f);
        qk__prof_html_str(f, nm);
        qk__prof_pf(f, "</td><td>%s</td><td>%d</td><td>%s</td>", z[j].gpu ? "GPU" : "CPU", z[j].ranks,
                    qk__prof_time(z[j].min, t1, sizeof t1));
        qk__prof_pf(f, "<td>%s</td>", qk__prof_time(z[j].mean, t1, sizeof t1));
        qk__prof_pf(f, "<td>%s</td><td>%.3f</td><td>%d</td></tr>\n", qk__prof_time(z[j].max, t1, sizeof t1),
                    z[j].mean > 0 ? z[j].max / z[j].mean : 0.0, z[j].slowest);
    }
    fputs("</table>\n", f);
    if (size <= 64) { /* per-rank bars of the 8 zones with the largest max */
        fputs("<h2>Zones per rank</h2>\n<p class=\"note\">Each zone's total time on every rank, relative to its "
              "largest.</p>\n<div class=\"chart\">\n", f);
        for (j = 0; j < nz && j < 8; j++) {
            qk__prof_mpi_name(nm, sizeof nm, z[j].name, z[j].len);
            for (r = 0; r < size; r++) {
                double v = qk__prof_mpi_total(&rk[r], &z[j]);
                char kind[24], val[48];
                qk__prof_spf(kind, sizeof kind, "rank %d", r);
                qk__prof_time(v, val, sizeof val);
                qk__prof_spf(tip, sizeof tip, "%s zone %.200s on rank %d: %s (mean over ranks %s)", z[j].gpu ? "GPU" : "CPU",
                             nm, r, val, qk__prof_time(z[j].mean, t1, sizeof t1));
                qk__prof_html_bar(f, kind, nm, z[j].gpu ? "gpu" : "cpu", qk__prof_pct(v, z[j].max), val, tip);
            }
        }
        fputs("</div>\n", f);
    }
}

/* A locale-free decimal number at *p (as the writers print them); advances *p. */
static double qk__prof_mpi_num(const char **p)
{
    const char *s = *p;
    double v = 0, sc = 1;
    int neg = 0;
    if (*s == '-') { neg = 1; s++; }
    for (; *s >= '0' && *s <= '9'; s++) v = v * 10 + (*s - '0');
    if (*s == '.') for (s++; *s >= '0' && *s <= '9'; s++) { sc /= 10; v += (*s - '0') * sc; }
    *p = s;
    return neg ? -v : v;
}

/* Rank r's trace events into rank 0's trace: pids 64 r + pid, times on rank 0's clock, process
   names "rank r ...". The writers put one event per line and escape every '"' inside strings,
   so ,"pid": and ,"ts": are always the fields. */
static void qk__prof_mpi_trace_rank(FILE *f, const char *txt, size_t n, int r, const qk__prof_mrank *k, int *first)
{
    const char *p = txt, *end = txt + n;
    while (p < end) {
        const char *nl = (const char *)memchr(p, '\n', (size_t)(end - p)), *q, *e;
        size_t len;
        if (!nl) nl = end;
        len = (size_t)(nl - p);
        if (len && p[len - 1] == ',') len--;
        if (len > 6 && memcmp(p, "{\"ph\":", 6) == 0) {
            fputs(*first ? "\n" : ",\n", f);
            *first = 0;
            q = p;
            e = p + len;
            while (q < e) {
                const char *pid = (const char *)memchr(q, ',', (size_t)(e - q));
                if (!pid) { fwrite(q, 1, (size_t)(e - q), f); break; }
                fwrite(q, 1, (size_t)(pid - q), f);
                q = pid;
                if ((size_t)(e - q) > 7 && memcmp(q, ",\"pid\":", 7) == 0) {
                    const char *s = q + 7;
                    double v = qk__prof_mpi_num(&s);
                    qk__prof_pf(f, ",\"pid\":%lld", (long long)v + 64LL * r);
                    q = s;
                } else if ((size_t)(e - q) > 6 && memcmp(q, ",\"ts\":", 6) == 0) {
                    const char *s = q + 6;
                    double v = qk__prof_mpi_num(&s);
                    qk__prof_pf(f, ",\"ts\":%.3f", v + qk__prof_mpi_off(k, v * 1e3) * 1e-3);
                    q = s;
                } else if ((size_t)(e - q) > 39 && memcmp(q, ",\"name\":\"process_name\",\"args\":{\"name\":\"", 39) == 0) {
                    qk__prof_pf(f, ",\"name\":\"process_name\",\"args\":{\"name\":\"rank %d ", r);
                    q += 39;
                } else if ((size_t)(e - q) > 14 && memcmp(q, ",\"sort_index\":", 14) == 0) { /* args of process_sort_index only */
                    const char *s = q + 14;
                    double v = qk__prof_mpi_num(&s);
                    qk__prof_pf(f, ",\"sort_index\":%lld", (long long)v + 64LL * r);
                    q = s;
                } else {
                    fputc(',', f);
                    q++;
                }
            }
        }
        p = nl + 1;
    }
}

/* This rank's own output of fmt into a malloc'ed buffer. */
static char *qk__prof_mpi_render(qk_prof_format fmt, size_t *len)
{
    char *buf = NULL;
    FILE *ms = open_memstream(&buf, len);
    int rc;
    if (!ms) return NULL;
    qk__prof_mpi_local++;
    rc = qk_prof_write(fmt, ms);
    qk__prof_mpi_local--;
    if (fclose(ms) != 0 || rc != 0) { free(buf); return NULL; }
    return buf;
}

/* The collective part of every report call: on rank 0 the merged output (malloc'ed, *len), NULL
   elsewhere or on an error (set). */
static char *qk__prof_mpi_collect(qk_prof_format fmt, size_t *len)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    int rank, size, n_rep = 0, r, i, ok = 1;
    qk__prof_mpi_pt *rep;
    qk__prof_model m;
    qk__prof_bb b;
    char *mine = NULL, *all = NULL, *tall = NULL, *out = NULL;
    size_t mlen = 0;
    int *lens = NULL, *displs = NULL, *tlens = NULL, *tdispls = NULL, blen, tl = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    *len = 0;
    rep = qk__prof_mpi_measure(comm, &n_rep);
    memset(&b, 0, sizeof b);
    if (qk__prof_model_build(&m) == 0) {
        qk__prof_mpi_record(&b, &m);
        qk__prof_model_free(&m);
    } else {
        b.oom = 1;
    }
    blen = b.oom || b.n > (size_t)0x7fffffff ? 0 : (int)b.n;
    if (fmt == QK_PROF_TRACE) {
        mine = qk__prof_mpi_render(QK_PROF_TRACE, &mlen);
        tl = mine && mlen <= (size_t)0x7fffffff ? (int)mlen : 0;
    }
    if (rank == 0) {
        lens = (int *)qk__prof_calloc((size_t)size, sizeof *lens);
        displs = (int *)qk__prof_calloc((size_t)size, sizeof *displs);
        tlens = (int *)qk__prof_calloc((size_t)size, sizeof *tlens);
        tdispls = (int *)qk__prof_calloc((size_t)size, sizeof *tdispls);
        ok = lens && displs && tlens && tdispls;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
    if (!ok) { qk__prof_seterr("qk_prof: out of memory gathering the ranks' reports"); goto done; }
    MPI_Gather(&blen, 1, MPI_INT, lens, 1, MPI_INT, 0, comm);
    if (fmt == QK_PROF_TRACE) MPI_Gather(&tl, 1, MPI_INT, tlens, 1, MPI_INT, 0, comm);
    if (rank == 0) {
        long long tot = 0, ttot = 0;
        for (r = 0; r < size; r++) { displs[r] = (int)tot; tot += lens[r]; tdispls[r] = (int)ttot; ttot += tlens[r]; }
        ok = tot <= 0x7fffffff && ttot <= 0x7fffffff;
        if (ok) {
            all = (char *)QK_PROF_MALLOC((size_t)tot + 1);
            tall = (char *)QK_PROF_MALLOC((size_t)ttot + 1);
            ok = all && tall;
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
    if (!ok) { qk__prof_seterr("qk_prof: the ranks' reports do not fit in memory (or in 2 GB)"); goto done; }
    MPI_Gatherv(b.p, blen, MPI_BYTE, all, lens, displs, MPI_BYTE, 0, comm);
    if (fmt == QK_PROF_TRACE) MPI_Gatherv(mine, tl, MPI_BYTE, tall, tlens, tdispls, MPI_BYTE, 0, comm);
    if (rank == 0) {
        qk__prof_mrank *rk = (qk__prof_mrank *)qk__prof_calloc((size_t)size, sizeof *rk);
        qk__prof_mzone *z = NULL;
        int nz = 0;
        FILE *ms;
        if (!rk) { qk__prof_seterr("qk_prof: out of memory merging the ranks' reports"); goto done; }
        for (r = 0; r < size; r++)
            if (qk__prof_mpi_parse(all + displs[r], (size_t)lens[r], &rk[r]) != 0) rk[r].n_rows = 0;
        qk__prof_mpi_offsets(rk, size, rep);
        z = qk__prof_mpi_zones(rk, size, &nz);
        ms = open_memstream(&out, len);
        if (ms) {
            if (fmt == QK_PROF_TRACE) {
                int first = 1;
                fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"qk_prof\",\"mpi_ranks\":", ms);
                qk__prof_pf(ms, "%d},\"traceEvents\":[", size);
                for (r = 0; r < size; r++) qk__prof_mpi_trace_rank(ms, tall + tdispls[r], (size_t)tlens[r], r, &rk[r], &first);
                fputs("\n]}\n", ms);
            } else {
                size_t l0 = 0;
                char *own = qk__prof_mpi_render(fmt, &l0);
                if (!own) {
                    ok = 0;
                } else if (fmt == QK_PROF_TEXT) {
                    qk__prof_mpi_text(ms, rk, size, z, nz);
                    fwrite(own, 1, l0, ms);
                } else if (fmt == QK_PROF_JSON) {
                    qk__prof_mpi_json(ms, rk, size, z, nz);
                    fwrite(own + 1, 1, l0 - 1, ms); /* rank 0's object, its '{' already written */
                } else {
                    const char *h2 = strstr(own, "<h2>");
                    size_t at = h2 ? (size_t)(h2 - own) : l0;
                    fwrite(own, 1, at, ms);
                    qk__prof_mpi_html(ms, rk, size, z, nz);
                    fwrite(own + at, 1, l0 - at, ms);
                }
                free(own);
            }
            if (fclose(ms) != 0 || !ok) { free(out); out = NULL; }
        }
        if (!out) qk__prof_seterr("qk_prof: cannot render the MPI report");
        for (r = 0; r < size; r++) QK_PROF_FREE(rk[r].rows);
        QK_PROF_FREE(rk);
        QK_PROF_FREE(z);
    }
done:
    QK_PROF_FREE(rep);
    QK_PROF_FREE(b.p);
    free(mine);
    QK_PROF_FREE(all);
    QK_PROF_FREE(tall);
    QK_PROF_FREE(lens);
    QK_PROF_FREE(displs);
    QK_PROF_FREE(tlens);
    QK_PROF_FREE(tdispls);
    (void)i;
    return out;
}

/* Rank 0's result on every rank (with its message). */
static int qk__prof_mpi_result(int rc)
{
    char msg[256];
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    qk__prof_copy(msg, sizeof msg, qk__prof_err);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rc != 0 && rank != 0) qk__prof_seterr("rank 0: %s", msg);
    return rc;
}

/* qk_prof_write / qk_prof_write_file when collective: path NULL writes to f. */
static int qk__prof_mpi_write(qk_prof_format fmt, FILE *f, const char *path)
{
    size_t len = 0;
    int rank, rc = 0;
    char *buf;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    buf = qk__prof_mpi_collect(fmt, &len);
    if (rank == 0) {
        if (!buf) {
            rc = -1;
        } else {
            qk__prof_mpi_buf = buf;
            qk__prof_mpi_len = len;
            qk__prof_mpi_local++;
            rc = path ? qk_prof_write_file(fmt, path) : qk_prof_write(fmt, f);
            qk__prof_mpi_local--;
            qk__prof_mpi_buf = NULL;
        }
    }
    free(buf);
    return qk__prof_mpi_result(rc);
}
#else
static void qk__prof_mpi_free(void) {}
QK_PROF_DEF int qk_prof_mpi_sync(void) { return 0; }
#endif /* QK_PROF_MPI */

QK_PROF_DEF int qk_prof_write_local(qk_prof_format fmt, FILE *f)
{
#ifdef QK_PROF_MPI
    int rc;
    qk__prof_mpi_local++;
    rc = qk_prof_write(fmt, f);
    qk__prof_mpi_local--;
    return rc;
#else
    return qk_prof_write(fmt, f);
#endif
}

QK_PROF_DEF int qk_prof_write_file_local(qk_prof_format fmt, const char *path)
{
#ifdef QK_PROF_MPI
    int rc;
    qk__prof_mpi_local++;
    rc = qk_prof_write_file(fmt, path);
    qk__prof_mpi_local--;
    return rc;
#else
    return qk_prof_write_file(fmt, path);
#endif
}
/* >>mpi end */

/* >>output ---- implementation: qk_prof_write, qk_prof_write_file ---- */
QK_PROF_DEF int qk_prof_write(qk_prof_format fmt, FILE *f)
{
    qk__prof_model m;
#ifdef QK_PROF_MPI /* >>mpi: collective, or rank 0's merged output */
    if (!qk__prof_mpi_local && qk__prof_mpi_up()) return qk__prof_mpi_write(fmt, f, NULL);
    if (qk__prof_mpi_buf && f) {
        fwrite(qk__prof_mpi_buf, 1, qk__prof_mpi_len, f);
        if (ferror(f)) { qk__prof_seterr("qk_prof_write: write error"); return -1; }
        return 0;
    }
#endif
    if (!f) { qk__prof_seterr("qk_prof_write: no file"); return -1; }
    if (qk__prof_model_build(&m) != 0) return -1;
    switch (fmt) {
    case QK_PROF_TEXT: qk__prof_write_text(f, &m); break;
    case QK_PROF_JSON: qk__prof_write_json(f, &m); break;
    case QK_PROF_TRACE: qk__prof_write_trace(f, &m); break;
    case QK_PROF_HTML: qk__prof_write_html(f, &m); break;
    default:
        qk__prof_model_free(&m);
        qk__prof_seterr("qk_prof_write: unknown format %d", (int)fmt);
        return -1;
    }
    qk__prof_model_free(&m);
    if (ferror(f)) { qk__prof_seterr("qk_prof_write: write error"); return -1; }
    return 0;
}

/* The temporary file is created exclusively (O_EXCL, O_NOFOLLOW): a file or a symlink planted at
   its name is never opened or followed; a taken name is skipped for the next one (path.tmp<pid>,
   then path.tmp<pid>.1, .2, ...; QK__PROF_TMP_TRIES names in all). The mode is fopen's (0666 less
   the umask). Returns the stream, or NULL with the error set (nothing left behind). */
#ifdef O_NOFOLLOW
#define QK__PROF_O_NOFOLLOW O_NOFOLLOW
#else
#define QK__PROF_O_NOFOLLOW 0
#endif
#ifdef O_CLOEXEC
#define QK__PROF_O_CLOEXEC O_CLOEXEC
#else
#define QK__PROF_O_CLOEXEC 0
#endif
#define QK__PROF_TMP_TRIES 100
#ifndef __cplusplus
/* a strict -std=c99/c11 TU whose system headers came first hides fdopen (POSIX): declare it */
extern FILE *fdopen(int fd, const char *mode);
#endif
static FILE *qk__prof_open_tmp(const char *path, char *tmp, size_t cap)
{
    FILE *f;
    int fd = -1, i, n;
    for (i = 0; i < QK__PROF_TMP_TRIES; i++) {
        n = i == 0 ? snprintf(tmp, cap, "%s.tmp%ld", path, (long)getpid())
                   : snprintf(tmp, cap, "%s.tmp%ld.%d", path, (long)getpid(), i);
        if (n < 0 || (size_t)n >= cap) { qk__prof_seterr("qk_prof_write_file: path too long"); return NULL; }
        do fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | QK__PROF_O_NOFOLLOW | QK__PROF_O_CLOEXEC, 0666);
        while (fd < 0 && errno == EINTR);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        if (errno == EEXIST)
            qk__prof_seterr("qk_prof_write_file: cannot create a temporary file next to %s: %d names taken (the last %s)",
                            path, QK__PROF_TMP_TRIES, tmp);
        else qk__prof_seterr("qk_prof_write_file: cannot create %s: %s", tmp, strerror(errno));
        return NULL;
    }
    f = fdopen(fd, "w");
    if (!f) {
        qk__prof_seterr("qk_prof_write_file: cannot open %s: %s", tmp, strerror(errno));
        close(fd);
        remove(tmp);
    }
    return f;
}

QK_PROF_DEF int qk_prof_write_file(qk_prof_format fmt, const char *path)
{
    char tmp[4096];
    FILE *f;
    int rc;
    if (!path || !*path) { qk__prof_seterr("qk_prof_write_file: no path"); return -1; }
#ifdef QK_PROF_MPI /* >>mpi: collective */
    if (!qk__prof_mpi_local && qk__prof_mpi_up()) return qk__prof_mpi_write(fmt, NULL, path);
#endif
    if (strcmp(path, "-") == 0) { rc = qk_prof_write(fmt, stdout); fflush(stdout); return rc; }
    {   /* the rename would replace a directory's or a device's entry (as root, /dev/null's) */
        struct stat st;
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            qk__prof_seterr("qk_prof_write_file: %s exists and is not a regular file (\"-\" is standard output)", path);
            return -1;
        }
    }
    f = qk__prof_open_tmp(path, tmp, sizeof tmp);
    if (!f) return -1;
    rc = qk_prof_write(fmt, f);
    if (fclose(f) != 0 && rc == 0) { qk__prof_seterr("qk_prof_write_file: cannot write %s: %s", tmp, strerror(errno)); rc = -1; }
    if (rc == 0 && rename(tmp, path) != 0) { qk__prof_seterr("qk_prof_write_file: cannot rename to %s: %s", path, strerror(errno)); rc = -1; }
    if (rc != 0) remove(tmp);
    return rc;
}

#ifdef __cplusplus
}
#endif
#endif /* QK_PROF_IMPLEMENTATION */

/* >>license
MIT License

Copyright (c) 2026 the qk authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
