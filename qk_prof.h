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
   Names are string literals (anything else is a compile error): each call site keeps a static
   record (qk_prof_site), named once. Zones with
   the same name at several sites are one row in reports. QK_PROF_END's name is checked against
   the open zone; a mismatch is counted (summary.mismatched), the open zone is closed anyway.

   GPU activities (CUPTI mode) and advice
   --------------------------------------
     desc.cupti = 1 (or QK_PROF_CUPTI=1 in the environment), with QK_PROF_CUDA: every kernel (the
     libraries' too: cuBLAS, cuFFT, Thrust, ...), copy, memset and host wait on every stream and
     device, recorded through CUPTI (libcupti opened with dlopen at start: no link dependency; a
     missing library is a note in the reports), each attributed to the CPU zone open on the
     thread that launched it. Reports get a kernel table (per name: calls, times, zone), copies by
     direction and memory kinds, the trace one lane per stream. desc.cupti = 2 adds every CUDA
     runtime call. Every report also gets an "advice" section: rules over what was recorded
     (pageable copies, host waits in the step loop, GPU idle, launch-bound kernels, copies
     serialized with kernels, memory growing step after step, step time outliers and drift,
     imbalance across threads and, in the MPI report, across ranks), each with its evidence and fix;
     thresholds in desc.advice or QK_PROF_ADVICE="key=value,...". qk_prof_advise runs the rules on
     records of your own (plain arrays).

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
     >>acttypes, >>actapi, >>acthooks   GPU activities and advice: types, functions, the hooks
     >>cupti     the activity store, the CUPTI mode (dlopen, buffers, records)
     >>shutdown  freeing everything
     >>model     the report model: rows, streams, transfers; statistics queries
     >>writers   locale-free printf and escaping for every output
     >>text      text report       >>json  JSON report      >>trace  Chrome trace
     >>html      HTML report, a function per chart and per table
     >>steps     step markers (recording)   >>steps-report  step statistics in the reports
     >>mpi       MPI-wide reports (QK_PROF_MPI)
     >>advice    advice rules (a function each), the activity and advice parts of the reports
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

/* >>acttypes ---- GPU activities (CUPTI mode) and advice: types ---- */
/* A GPU activity: what CUPTI recorded (QK_PROF_CUDA with desc.cupti or QK_PROF_CUPTI=1), what a
   test or another tracer injected (qk_prof_activity_add), or a GPU zone of the macros given to
   the advice rules. Times are on the profiler's timeline: ns from its start, like the zones. */
typedef enum qk_prof_act_kind {
    QK_PROF_ACT_KERNEL = 1,     /* a kernel, the libraries' included */
    QK_PROF_ACT_MEMCPY,         /* a copy */
    QK_PROF_ACT_MEMSET,
    QK_PROF_ACT_SYNC,           /* the host waited for the GPU: cudaDeviceSynchronize, cudaStreamSynchronize,
                                   cudaEventSynchronize (sync says which), or cudaStreamWaitEvent (GPU side) */
    QK_PROF_ACT_RUNTIME,        /* a CUDA runtime call (desc.cupti = 2, or QK_PROF_CUPTI=2) */
    QK_PROF_ACT_ZONE            /* a GPU zone of the macros: the rules' input where CUPTI recorded nothing */
} qk_prof_act_kind;

/* Memory kinds of a copy's source and destination; the values are CUPTI's. */
typedef enum qk_prof_memk {
    QK_PROF_MEMK_UNKNOWN = 0,
    QK_PROF_MEMK_PAGEABLE,
    QK_PROF_MEMK_PINNED,
    QK_PROF_MEMK_DEVICE,
    QK_PROF_MEMK_ARRAY,
    QK_PROF_MEMK_MANAGED
} qk_prof_memk;

/* The types of QK_PROF_ACT_SYNC records (the values are CUPTI's). */
enum { QK_PROF_SYNC_EVENT = 1, QK_PROF_SYNC_STREAM_WAIT = 2, QK_PROF_SYNC_STREAM = 3, QK_PROF_SYNC_DEVICE = 4 };

typedef struct qk_prof_activity {
    int kind;                   /* qk_prof_act_kind */
    const char *name;           /* kernel (demangled), runtime call or GPU zone; NULL for copies, memsets, syncs */
    const char *zone;           /* the CPU zone open on the launching thread (CUPTI mode), or NULL */
    double start_ns, end_ns;
    int device;
    uint32_t stream;            /* a stream id: CUPTI's, or any id that tells streams apart */
    uint32_t correlation;       /* CUPTI's correlation id (0: none) */
    int grid[3], block[3];      /* kernels */
    int shared_bytes;           /* kernels: static + dynamic shared memory per block */
    int registers;              /* kernels: registers per thread */
    uint64_t bytes;             /* copies, memsets */
    int dir;                    /* copies: qk_prof_dir */
    int src_kind, dst_kind;     /* copies: qk_prof_memk (memsets: dst_kind) */
    int sync;                   /* copies, memsets: 1 when the call was synchronous (the host waited);
                                   QK_PROF_ACT_SYNC: its type (QK_PROF_SYNC_*) */
    double api_ns;              /* kernels: host time of the launch call (runtime records), 0 unknown */
} qk_prof_activity;

/* Thresholds of the advice rules (docs/profiler.md, "Advice"). 0 takes the default given here; a
   negative value turns its rule off. The environment variable QK_PROF_ADVICE overrides them at
   report time: "short_kernel_ns=5000,leak_min_bytes=2e6,step_zone=step" (the field names). */
typedef struct qk_prof_advice_cfg {
    const char *step_zone;      /* the CPU zone that is one step of the loop; NULL: the top-level zone
                                   with the most calls (at least min_steps) */
    double min_steps;           /* the loop rules need this many steps (3) */
    double pageable_min_bytes;  /* pageable-copy: from this many bytes copied through pageable memory (1 MiB) */
    double sync_min_step_share; /* sync-in-loop: host waits that left the GPU idle, in at least this share
                                   of the steps (0.5) ... */
    double sync_min_idle_ns;    /* ... a wait leaving the GPU idle at least this long after it (10 us) */
    double idle_max_busy;       /* gpu-idle: a GPU busy less than this share of the loop (0.5) ... */
    double idle_min_ns;         /* ... and idle at least this long in all (1 ms) */
    double short_kernel_ns;     /* launch-bound: a kernel shorter than this is short (10 us) ... */
    double launch_min_kernels;  /* ... from this many short kernels (100) ... */
    double launch_min_share;    /* ... that are at least this share of the kernels (0.5) */
    double serial_min_copy_share; /* serialized-copy: copies take at least this share of a stream's time (0.05) ... */
    double serial_max_overlap;  /* ... and kernels elsewhere overlap at most this share of them (0.1) */
    double leak_min_bytes;      /* memory-growth: grows at least this much over the loop (1 MiB) ... */
    double leak_min_step_share; /* ... growing from one step to the next in at least this share of the steps (0.8) */
    double step_skip;           /* step-outliers, step-drift: the first steps left out (1; negative: none) */
    double tail_ratio;          /* step-outliers: the step time's p99 at least this many times its p50 (2),
                                   over at least 10 steps */
    double drift_min_growth;    /* step-drift: the median step of the last third of the loop longer than the
                                   median of the first third by at least this share (0.2), over at least 9 steps */
    double thread_imbalance;    /* thread-imbalance: a zone's largest total on one thread at least this many
                                   times its mean over the threads that ran it (1.25) ... */
    double rank_imbalance;      /* rank-imbalance (QK_PROF_MPI): a zone's largest total on one rank at least
                                   this many times its mean over all ranks (1.25) ... */
    double imbalance_min_share; /* ... both: and the largest less the mean at least this share of the wall (0.05) */
} qk_prof_advice_cfg;

/* The rules' input: plain arrays, so a program (or a test) can run the rules on any records. */
typedef struct qk_prof_span { double t0_ns, t1_ns; } qk_prof_span;
typedef struct qk_prof_mem_sample {
    double t_ns;
    double host, device;        /* tracked bytes (QK_PROF_TRACK): host (pageable + pinned), device (+ managed) */
    double device_used;         /* device memory in use (QK_PROF_MEM_SNAPSHOT's cudaMemGetInfo), -1 unknown */
} qk_prof_mem_sample;
typedef struct qk_prof_stream_label { int device; uint32_t stream; const char *name; } qk_prof_stream_label;
/* A zone's total time on one thread (or, in the MPI report, on one rank): the imbalance rules' input. */
typedef struct qk_prof_zone_part {
    const char *zone;
    int gpu;                    /* 1: a GPU zone (ranks only) */
    int index;                  /* the thread's index, or the rank */
    const char *label;          /* the thread's name (or NULL) */
    double total_ns;
    uint64_t calls;
} qk_prof_zone_part;
typedef struct qk_prof_facts {
    const qk_prof_activity *acts;   /* any order */
    size_t n_acts;
    const qk_prof_span *steps;      /* the step loop, one span per step, in time order */
    size_t n_steps;
    const char *step_zone;          /* the steps' zone name, for the evidence (or NULL) */
    const qk_prof_mem_sample *mem;  /* in time order */
    size_t n_mem;
    const qk_prof_stream_label *streams; /* names of streams for the evidence (optional) */
    size_t n_streams;
    double wall_ns;                 /* the run's wall time (MPI: the longest rank's) */
    /* appended for the imbalance rules; zero where not known */
    const qk_prof_zone_part *threads; /* per zone name and thread, any order (CPU zones) */
    size_t n_threads;
    const qk_prof_zone_part *ranks; /* per zone name and rank, any order; a rank without a row counts 0 */
    size_t n_ranks_rows;
    int n_ranks;                    /* the ranks (0: no MPI) */
} qk_prof_facts;

/* One piece of advice: which rule, where, the numbers that made it fire, and the fix. */
typedef struct qk_prof_advice {
    const char *rule;           /* "pageable-copy", "sync-in-loop", "gpu-idle", "launch-bound",
                                   "serialized-copy", "memory-growth", "step-outliers", "step-drift",
                                   "thread-imbalance", "rank-imbalance" */
    double impact_ns;           /* the time at stake, an estimate (0: not time); the list is sorted by it */
    char where[160];            /* the zone, stream or memory the evidence points at */
    char evidence[640];
    char fix[400];
} qk_prof_advice;

/* What the CUPTI mode recorded (counts are exact also beyond the record store). */
typedef struct qk_prof_act_summary {
    int cupti;                  /* 1 recording, 0 not asked, -1 asked but unavailable (qk_prof_cupti_status) */
    uint64_t kernels, memcpys, memsets, syncs, runtime;
    uint64_t kept;              /* records kept for traces and advice */
    uint64_t dropped;           /* records not kept: the store was full (desc.cupti_records) */
    uint64_t dropped_cupti;     /* records CUPTI dropped (no buffer given) */
    uint64_t incomplete;        /* records without valid times (a forced flush) */
    uint64_t dropped_names;     /* records whose kernel or zone name could not be stored (out of
                                   memory): counted, but missing from the per-name tables */
} qk_prof_act_summary;
/* ---- end acttypes ---- */

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
    /* >>actdesc: GPU activities (CUPTI) and advice */
    int cupti;                  /* GPU activities through CUPTI (QK_PROF_CUDA): 1 kernels, copies, memsets, host
                                   waits; 2 also every CUDA runtime call; 0 (default): as the environment variable
                                   QK_PROF_CUPTI says (unset: off) */
    size_t cupti_records;       /* activity records kept for traces and advice; default 262144 (80 bytes each) */
    qk_prof_advice_cfg advice;  /* advice thresholds; zero fields take the defaults */
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
/* >>actapi ---- GPU activities (CUPTI mode) and advice ---- */
/* Adds an activity record (a test, or another tracer); times on the profiler's timeline. 0 or -1. */
QK_PROF_DEF int qk_prof_activity_add(const qk_prof_activity *a);
QK_PROF_DEF void qk_prof_activity_summary(qk_prof_act_summary *out);
/* "on: ...", "unavailable: <why>", or "off ..." */
QK_PROF_DEF const char *qk_prof_cupti_status(void);
/* Runs the advice rules on facts with thresholds cfg (NULL: the defaults; the environment is not
   read). Returns the number of items (the first max go to out), or -1. */
QK_PROF_DEF int qk_prof_advise(const qk_prof_facts *facts, const qk_prof_advice_cfg *cfg, qk_prof_advice *out, int max);
/* The advice of this run so far, as the reports give it (desc.advice, then QK_PROF_ADVICE). */
QK_PROF_DEF int qk_prof_get_advice(qk_prof_advice *out, int max);
/* ---- end actapi ---- */

/* >>macros ---- macros (enabled and disabled forms) ---- */
#define QK_PROF_CAT_(a, b) a##b
#define QK_PROF_CAT(a, b) QK_PROF_CAT_(a, b)

#ifdef QK_PROF_ENABLE
#define QK_PROF_ENABLED 1
/* "" name: a name that is not a string literal does not compile. A C++ static's initializer may be
   any expression, evaluated once, at the first pass: QK_PROF_BEGIN(h ? "b" : "a") would name
   every later zone of that site "a" (and count END("b") as mismatched). */
#define QK_PROF_SITE_(var, name, kind) \
    static qk_prof_site var = { "" name, __FILE__, __LINE__, kind, 0 }
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
/* The value 0, usable as a statement without an unused-value warning (-Wall -Wextra), and no code
   even at -O0: with clang a comma expression (a statement expression's unused value draws
   clang's -Wunused-value inside another macro's argument; a void-cast left operand and a constant
   right one draw nothing), with gcc a statement expression (gcc warns on the comma's unused 0);
   elsewhere an inline function. tests/prof/prof_codegen.py checks both compilers. */
#if defined(__clang__)
#define QK_PROF_ZERO_(x) (QK_PROF_U_(x), 0)
#elif defined(__GNUC__)
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
#include <locale.h>
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
#endif /* QK_PROF_MPI */
/* >>acthooks: where the recording paths call into the CUPTI mode (defined in >>cupti) */
static void qk__prof_cupti_autostart(void);
#ifdef QK_PROF_CUDA
static int qk__prof_cupti_ext;              /* 1 while CUPTI links activities to the CPU zones */
static void qk__prof_cupti_push(uint32_t site);
static void qk__prof_cupti_pop(void);
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
    if (rc == 0) qk__prof_cupti_autostart(); /* >>acthooks */
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
    qk__prof_cupti_autostart(); /* >>acthooks */
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
#ifdef QK_PROF_CUDA
    if (QK__PROF_UNLIKELY(qk__prof_cupti_ext)) qk__prof_cupti_push(id); /* >>acthooks */
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
#ifdef QK_PROF_CUDA
    if (QK__PROF_UNLIKELY(qk__prof_cupti_ext)) qk__prof_cupti_pop(); /* >>acthooks */
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
        const size_t win = (size_t)(qk__prof_st.window > 0 ? qk__prof_st.window : 1);
        n->val = (double *)qk__prof_calloc(win, sizeof(double));
        n->seq = (int64_t *)QK_PROF_MALLOC(win * sizeof(int64_t));
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
/* >>cupti ---- implementation: GPU activities: the record store, the CUPTI mode ---- */
/* Records come from CUPTI's buffers (the CUPTI mode) or from qk_prof_activity_add, into one store
   under its own lock: a record array of at most desc.cupti_records, and exact counts beside it
   (per kernel name, per copy direction and memory kinds) that go on when the array is full, so
   the tables stay exact and only the trace and the rules' evidence lose records (counted).

   The CUPTI mode (QK_PROF_CUDA; desc.cupti = 1 or 2, or QK_PROF_CUPTI=1 or 2 in the environment)
   opens libcupti with dlopen when the profiler starts: no link dependency, and a missing library
   is a note in the reports. It enables the activity kinds CONCURRENT_KERNEL, MEMCPY, MEMSET,
   SYNCHRONIZATION, EXTERNAL_CORRELATION, RUNTIME and DRIVER (CUPTI emits the external
   correlation of an API call only where it records the call; mode 1 keeps none of the API
   records, 2 keeps the runtime calls), gives CUPTI buffers of
   QK__PROF_CUPTI_BUF bytes (at most QK__PROF_CUPTI_BUFS at once: beyond, CUPTI drops records and
   counts them, and so do the reports), and processes the completed buffers in the thread CUPTI
   calls back on (its own worker, or the reporting thread's flush), never in the step loop. Each
   CPU zone pushes its site id as an external correlation id while CUPTI records (one predicted
   branch per zone otherwise), so every kernel, copy and sync is attributed to the innermost CPU
   zone open on the thread that launched it. The CUPTI structs are declared here with the fields
   this file reads: their common prefix, the same in every CUPTI version since CUDA 11
   (tests/prof_cupti_layout.c checks the offsets against the installed cupti_activity.h). */
#define QK__PROF_CUPTI_BUF (1u << 20)
#define QK__PROF_CUPTI_BUFS 64

typedef struct qk__prof_arec {      /* one stored activity */
    int64_t t0, t1;                 /* CUPTI ns timestamps, or (inj) ns on the profiler's timeline */
    uint64_t bytes;
    uint32_t corr, stream, name, zone; /* name, zone: index into the name table + 1 (0: none) */
    int32_t grid[3], block[3], shmem;
    uint16_t regs, device;
    uint8_t kind, dir, srck, dstk, sync, inj;
} qk__prof_arec;

typedef struct qk__prof_aname {     /* an interned name; kernels: exact statistics */
    char *key, *name;               /* as recorded (mangled), as shown (demangled) */
    uint64_t n;
    int64_t total, min, max;
    int32_t grid[3], block[3], shmem, regs; /* the last launch's */
} qk__prof_aname;

typedef struct qk__prof_astat { uint64_t n, bytes; int64_t total; } qk__prof_astat;

typedef struct qk__prof_corr { uint32_t corr, ext; } qk__prof_corr;

typedef struct qk__prof_actstore {
    pthread_mutex_t mu;
    qk__prof_arec *recs;
    size_t n, cap, max;
    qk__prof_aname *names;
    int n_names, cap_names;
    int *hash;                      /* open addressing over names: index + 1 */
    int cap_hash;
    qk__prof_corr *corrs;           /* (correlation id, external id): the zones */
    int n_corrs, cap_corrs;
    qk__prof_astat copies[5][6][6]; /* [dir][src kind][dst kind] */
    qk__prof_astat memsets, syncs, runtime;
    uint64_t kernels, dropped, dropped_cupti, incomplete, dropped_corr, dropped_names;
    uint32_t ctx_dev[64][2];        /* CUPTI context id -> device, from the kernel and copy records */
    int n_ctx;
    /* the CUPTI mode */
    int asked;                      /* desc.cupti or QK_PROF_CUPTI: 0, 1, 2 */
    int state;                      /* 0 not tried, 1 recording, -1 unavailable */
    int bufs;                       /* buffers given to CUPTI and not yet returned */
    char status[320];
    uint64_t ts0, ts1, tick0, tick1; /* CUPTI timestamp and profiler tick pairs: start, last report */
} qk__prof_actstore;

static qk__prof_actstore qk__prof_act = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0, NULL, 0, 0, NULL, 0, NULL, 0, 0,
                                          {{{{0, 0, 0}}}}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, 0, 0, 0, 0, 0, 0,
                                          {{0, 0}}, 0, 0, 0, 0, "", 0, 0, 0, 0 };

static uint64_t qk__prof_strhash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static char *qk__prof_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = (char *)QK_PROF_MALLOC(n);
    if (p) memcpy(p, s, n);
    return p;
}

static char *(*qk__prof_demangler)(const char *, char *, size_t *, int *);

/* The name table index + 1 of key (as recorded), interned on first sight; 0 when out of memory
   (counted: dropped_names). Kernel names are shown demangled where the program has
   __cxa_demangle (C++ and CUDA programs: libstdc++ is loaded). Holds qk__prof_act.mu. */
static uint32_t qk__prof_intern(const char *key)
{
    qk__prof_actstore *A = &qk__prof_act;
    uint64_t h;
    int j, i;
    if (!key) return 0;
    if ((A->n_names + 1) * 2 > A->cap_hash) {
        int nc = A->cap_hash ? A->cap_hash * 2 : 256, k;
        int *nh = (int *)qk__prof_calloc((size_t)nc, sizeof *nh);
        if (!nh) { A->dropped_names++; return 0; }
        for (k = 0; k < A->n_names; k++) {
            j = (int)(qk__prof_strhash(A->names[k].key) & (uint64_t)(nc - 1));
            while (nh[j]) j = (j + 1) & (nc - 1);
            nh[j] = k + 1;
        }
        QK_PROF_FREE(A->hash);
        A->hash = nh;
        A->cap_hash = nc;
    }
    h = qk__prof_strhash(key);
    for (j = (int)(h & (uint64_t)(A->cap_hash - 1)); A->hash[j]; j = (j + 1) & (A->cap_hash - 1))
        if (strcmp(A->names[A->hash[j] - 1].key, key) == 0) return (uint32_t)A->hash[j];
    if (qk__prof_grow((void **)&A->names, &A->cap_names, A->n_names + 1, sizeof *A->names) != 0) { A->dropped_names++; return 0; }
    i = A->n_names;
    memset(&A->names[i], 0, sizeof A->names[i]);
    A->names[i].key = qk__prof_strdup(key);
    if (!A->names[i].key) { A->dropped_names++; return 0; }
    if (qk__prof_demangler && key[0] == '_' && key[1] == 'Z') {
        int st = -1;
        char *d = qk__prof_demangler(key, NULL, NULL, &st);
        if (d && st == 0) A->names[i].name = qk__prof_strdup(d);
        free(d); /* __cxa_demangle's buffer comes from malloc */
    }
    if (!A->names[i].name) A->names[i].name = A->names[i].key;
    A->n_names++;
    A->hash[j] = i + 1;
    return (uint32_t)(i + 1);
}

/* Counts a record and keeps it while the store has room. Holds qk__prof_act.mu. */
static void qk__prof_act_put(const qk__prof_arec *r)
{
    qk__prof_actstore *A = &qk__prof_act;
    int64_t d = r->t1 - r->t0;
    if (r->t0 == 0 || r->t1 < r->t0) { A->incomplete++; return; }
    if (r->kind == QK_PROF_ACT_KERNEL) {
        A->kernels++;
        if (r->name) {
            qk__prof_aname *nm = &A->names[r->name - 1];
            if (!nm->n || d < nm->min) nm->min = d;
            if (!nm->n || d > nm->max) nm->max = d;
            nm->n++;
            nm->total += d;
            memcpy(nm->grid, r->grid, sizeof nm->grid);
            memcpy(nm->block, r->block, sizeof nm->block);
            nm->shmem = r->shmem;
            nm->regs = r->regs;
        }
    } else {
        qk__prof_astat *s = r->kind == QK_PROF_ACT_MEMCPY ? &A->copies[r->dir % 5][r->srck % 6][r->dstk % 6]
                          : r->kind == QK_PROF_ACT_MEMSET ? &A->memsets
                          : r->kind == QK_PROF_ACT_SYNC ? &A->syncs : &A->runtime;
        s->n++;
        s->bytes += r->bytes;
        s->total += d;
    }
    if (A->n == A->cap) {
        size_t nc = A->cap ? A->cap * 2 : 4096;
        void *np;
        if (nc > A->max) nc = A->max;
        if (nc <= A->n || !(np = QK_PROF_REALLOC(A->recs, nc * sizeof *A->recs))) { A->dropped++; return; }
        A->recs = (qk__prof_arec *)np;
        A->cap = nc;
    }
    A->recs[A->n++] = *r;
}

static void qk__prof_act_limits(void)
{
    if (!qk__prof_act.max)
        qk__prof_act.max = qk__prof_g.desc.cupti_records ? qk__prof_g.desc.cupti_records : 262144;
}

QK_PROF_DEF int qk_prof_activity_add(const qk_prof_activity *a)
{
    qk__prof_arec r;
    int k;
    if (!a || a->kind < QK_PROF_ACT_KERNEL || a->kind > QK_PROF_ACT_ZONE || !(a->end_ns >= a->start_ns)) {
        qk__prof_seterr("qk_prof_activity_add: no record, an unknown kind or an end before the start");
        return -1;
    }
    memset(&r, 0, sizeof r);
    r.t0 = (int64_t)(a->start_ns + 0.5);
    r.t1 = (int64_t)(a->end_ns + 0.5);
    if (r.t0 <= 0) { r.t1 += 1 - r.t0; r.t0 = 1; } /* 0 means "no time" in the store */
    r.bytes = a->bytes;
    r.corr = a->correlation;
    r.stream = a->stream;
    for (k = 0; k < 3; k++) { r.grid[k] = a->grid[k]; r.block[k] = a->block[k]; }
    r.shmem = a->shared_bytes;
    r.regs = (uint16_t)a->registers;
    r.device = (uint16_t)a->device;
    r.kind = (uint8_t)a->kind;
    r.dir = (uint8_t)(a->dir >= 0 && a->dir < 5 ? a->dir : 0);
    r.srck = (uint8_t)(a->src_kind >= 0 && a->src_kind < 6 ? a->src_kind : 0);
    r.dstk = (uint8_t)(a->dst_kind >= 0 && a->dst_kind < 6 ? a->dst_kind : 0);
    r.sync = (uint8_t)a->sync;
    r.inj = 1;
    pthread_mutex_lock(&qk__prof_mu);
    if (!qk__prof_g.ready) qk__prof_init_locked(NULL);
    pthread_mutex_unlock(&qk__prof_mu);
    pthread_mutex_lock(&qk__prof_act.mu);
    qk__prof_act_limits();
    r.name = qk__prof_intern(a->name);
    r.zone = qk__prof_intern(a->zone);
    qk__prof_act_put(&r);
    pthread_mutex_unlock(&qk__prof_act.mu);
    return 0;
}

QK_PROF_DEF void qk_prof_activity_summary(qk_prof_act_summary *out)
{
    qk__prof_actstore *A = &qk__prof_act;
    int d, s, k;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&A->mu);
    out->cupti = A->state;
    out->kernels = A->kernels;
    for (d = 0; d < 5; d++) for (s = 0; s < 6; s++) for (k = 0; k < 6; k++) out->memcpys += A->copies[d][s][k].n;
    out->memsets = A->memsets.n;
    out->syncs = A->syncs.n;
    out->runtime = A->runtime.n;
    out->kept = A->n;
    out->dropped = A->dropped;
    out->dropped_cupti = A->dropped_cupti;
    out->incomplete = A->incomplete;
    out->dropped_names = A->dropped_names;
    pthread_mutex_unlock(&A->mu);
}

QK_PROF_DEF const char *qk_prof_cupti_status(void)
{
    return qk__prof_act.status[0] ? qk__prof_act.status : "off (desc.cupti = 0 and no QK_PROF_CUPTI)";
}

#ifdef QK_PROF_CUDA
#include <dlfcn.h>
/* The CUPTI records this file reads: the leading fields, as in cupti_activity.h (packed, 8-byte
   aligned; every field here sits at its natural alignment, so the layout is the plain one). */
typedef struct qk__cupti_rec { int32_t kind; } qk__cupti_rec;
typedef struct qk__cupti_kernel {
    int32_t kind;
    uint8_t cache_config, shared_memory_config;
    uint16_t registers_per_thread;
    int32_t pgc_requested, pgc_executed;
    uint64_t start, end, completed;
    uint32_t device_id, context_id, stream_id;
    int32_t grid_x, grid_y, grid_z, block_x, block_y, block_z;
    int32_t static_shared_memory, dynamic_shared_memory;
    uint32_t local_memory_per_thread, local_memory_total, correlation_id;
    int64_t grid_id;
    const char *name;
} qk__cupti_kernel;
typedef struct qk__cupti_memcpy {
    int32_t kind;
    uint8_t copy_kind, src_kind, dst_kind, flags;
    uint64_t bytes, start, end;
    uint32_t device_id, context_id, stream_id, correlation_id;
} qk__cupti_memcpy;
typedef struct qk__cupti_memset {
    int32_t kind;
    uint32_t value;
    uint64_t bytes, start, end;
    uint32_t device_id, context_id, stream_id, correlation_id;
    uint16_t flags, memory_kind;
} qk__cupti_memset;
typedef struct qk__cupti_sync {
    int32_t kind, type;
    uint64_t start, end;
    uint32_t correlation_id, context_id, stream_id, cuda_event_id;
} qk__cupti_sync;
typedef struct qk__cupti_extcorr {
    int32_t kind, external_kind;
    uint64_t external_id;
    uint32_t correlation_id, reserved;
} qk__cupti_extcorr;
typedef struct qk__cupti_api {
    int32_t kind;
    uint32_t cbid;
    uint64_t start, end;
    uint32_t process_id, thread_id, correlation_id, return_value;
} qk__cupti_api;
enum {
    QK__CUPTI_MEMCPY = 1, QK__CUPTI_MEMSET = 2, QK__CUPTI_DRIVER = 4, QK__CUPTI_RUNTIME = 5, QK__CUPTI_CONCURRENT_KERNEL = 10,
    QK__CUPTI_SYNCHRONIZATION = 38, QK__CUPTI_EXTERNAL_CORRELATION = 39,
    QK__CUPTI_EXT_CUSTOM0 = 3, QK__CUPTI_MAX_LIMIT_REACHED = 12, QK__CUPTI_FLUSH_FORCED = 1,
    QK__CUPTI_CB_DOMAIN_RUNTIME = 2
};

typedef void (*qk__cupti_req_fn)(uint8_t **, size_t *, size_t *);
typedef void (*qk__cupti_done_fn)(void *, uint32_t, uint8_t *, size_t, size_t);
#define QK__PROF_CUPTI_FNS(X) \
    X(1, int, cuptiActivityRegisterCallbacks, (qk__cupti_req_fn, qk__cupti_done_fn)) \
    X(1, int, cuptiActivityEnable, (int)) \
    X(1, int, cuptiActivityDisable, (int)) \
    X(1, int, cuptiActivityFlushAll, (uint32_t)) \
    X(1, int, cuptiActivityGetNextRecord, (uint8_t *, size_t, qk__cupti_rec **)) \
    X(1, int, cuptiActivityGetNumDroppedRecords, (void *, uint32_t, size_t *)) \
    X(1, int, cuptiActivityPushExternalCorrelationId, (int, uint64_t)) \
    X(1, int, cuptiActivityPopExternalCorrelationId, (int, uint64_t *)) \
    X(1, int, cuptiGetTimestamp, (uint64_t *)) \
    X(0, int, cuptiGetResultString, (int, const char **)) \
    X(0, int, cuptiActivityFlushPeriod, (uint32_t)) \
    X(0, int, cuptiGetStreamIdEx, (void *, void *, uint8_t, uint32_t *)) \
    X(0, int, cuptiGetCallbackName, (int, uint32_t, const char **)) \
    X(0, int, cuptiFinalize, (void))
static struct {
#define QK__CUPTI_FIELD(req, R, f, args) R(*f) args;
    QK__PROF_CUPTI_FNS(QK__CUPTI_FIELD)
#undef QK__CUPTI_FIELD
    void *lib;
} qk__cupti;

static void qk__prof_cupti_push(uint32_t site)
{
    qk__cupti.cuptiActivityPushExternalCorrelationId(QK__CUPTI_EXT_CUSTOM0, (uint64_t)site);
}

static void qk__prof_cupti_pop(void)
{
    uint64_t last;
    qk__cupti.cuptiActivityPopExternalCorrelationId(QK__CUPTI_EXT_CUSTOM0, &last);
}

static const char *qk__prof_cupti_err(int r)
{
    const char *s = NULL;
    if (qk__cupti.cuptiGetResultString && qk__cupti.cuptiGetResultString(r, &s) == 0 && s) return s;
    return "CUPTI error";
}

static void qk__prof_cupti_request(uint8_t **buffer, size_t *size, size_t *max_records)
{
    uint8_t *b = NULL;
    pthread_mutex_lock(&qk__prof_act.mu);
    if (qk__prof_act.bufs < QK__PROF_CUPTI_BUFS) {
        b = (uint8_t *)QK_PROF_MALLOC(QK__PROF_CUPTI_BUF); /* 16-byte aligned: CUPTI asks 8 */
        if (b) qk__prof_act.bufs++;
    }
    pthread_mutex_unlock(&qk__prof_act.mu);
    *buffer = b;
    *size = b ? QK__PROF_CUPTI_BUF : 0;
    *max_records = 0;
}

static uint16_t qk__prof_ctx_device(uint32_t ctx, int set, uint32_t dev) /* holds qk__prof_act.mu */
{
    qk__prof_actstore *A = &qk__prof_act;
    int i;
    for (i = 0; i < A->n_ctx; i++)
        if (A->ctx_dev[i][0] == ctx) return (uint16_t)A->ctx_dev[i][1];
    if (set && A->n_ctx < 64) { A->ctx_dev[A->n_ctx][0] = ctx; A->ctx_dev[A->n_ctx++][1] = dev; }
    return (uint16_t)dev;
}

static uint8_t qk__prof_cupti_dir(int k)
{
    switch (k) {
    case 1: case 3: return QK_PROF_H2D;  /* HtoD, HtoA */
    case 2: case 4: return QK_PROF_D2H;  /* DtoH, AtoH */
    case 9: return QK_PROF_H2H;
    case 5: case 6: case 7: case 8: case 10: return QK_PROF_D2D; /* arrays, DtoD, peer */
    default: return QK_PROF_DIR_NONE;
    }
}

/* CUPTI hands back a buffer of records (its worker thread, or the thread that flushes). */
static void qk__prof_cupti_complete(void *ctx, uint32_t stream_id, uint8_t *buffer, size_t size, size_t valid)
{
    qk__cupti_rec *rec = NULL;
    size_t dropped = 0;
    (void)size;
    pthread_mutex_lock(&qk__prof_act.mu);
    while (valid > 0 && qk__cupti.cuptiActivityGetNextRecord(buffer, valid, &rec) == 0) {
        qk__prof_arec r;
        memset(&r, 0, sizeof r);
        switch (rec->kind) {
        case QK__CUPTI_CONCURRENT_KERNEL: {
            const qk__cupti_kernel *k = (const qk__cupti_kernel *)rec;
            r.kind = QK_PROF_ACT_KERNEL;
            r.t0 = (int64_t)k->start; r.t1 = (int64_t)k->end;
            r.device = qk__prof_ctx_device(k->context_id, 1, k->device_id);
            r.stream = k->stream_id; r.corr = k->correlation_id;
            r.grid[0] = k->grid_x; r.grid[1] = k->grid_y; r.grid[2] = k->grid_z;
            r.block[0] = k->block_x; r.block[1] = k->block_y; r.block[2] = k->block_z;
            r.shmem = k->static_shared_memory + k->dynamic_shared_memory;
            r.regs = k->registers_per_thread;
            r.name = qk__prof_intern(k->name ? k->name : "(unnamed kernel)");
            qk__prof_act_put(&r);
            break;
        }
        case QK__CUPTI_MEMCPY: {
            const qk__cupti_memcpy *c = (const qk__cupti_memcpy *)rec;
            r.kind = QK_PROF_ACT_MEMCPY;
            r.t0 = (int64_t)c->start; r.t1 = (int64_t)c->end;
            r.device = qk__prof_ctx_device(c->context_id, 1, c->device_id);
            r.stream = c->stream_id; r.corr = c->correlation_id;
            r.bytes = c->bytes;
            r.dir = qk__prof_cupti_dir(c->copy_kind);
            r.srck = c->src_kind < 6 ? c->src_kind : 0;
            r.dstk = c->dst_kind < 6 ? c->dst_kind : 0;
            r.sync = !(c->flags & 1); /* CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC */
            qk__prof_act_put(&r);
            break;
        }
        case QK__CUPTI_MEMSET: {
            const qk__cupti_memset *s = (const qk__cupti_memset *)rec;
            r.kind = QK_PROF_ACT_MEMSET;
            r.t0 = (int64_t)s->start; r.t1 = (int64_t)s->end;
            r.device = qk__prof_ctx_device(s->context_id, 1, s->device_id);
            r.stream = s->stream_id; r.corr = s->correlation_id;
            r.bytes = s->bytes;
            r.dstk = s->memory_kind < 6 ? (uint8_t)s->memory_kind : 0;
            r.sync = !(s->flags & 1); /* CUPTI_ACTIVITY_FLAG_MEMSET_ASYNC */
            qk__prof_act_put(&r);
            break;
        }
        case QK__CUPTI_SYNCHRONIZATION: {
            const qk__cupti_sync *s = (const qk__cupti_sync *)rec;
            r.kind = QK_PROF_ACT_SYNC;
            r.t0 = (int64_t)s->start; r.t1 = (int64_t)s->end;
            r.device = qk__prof_ctx_device(s->context_id, 0, 0);
            r.stream = s->stream_id; r.corr = s->correlation_id;
            r.sync = (uint8_t)s->type;
            qk__prof_act_put(&r);
            break;
        }
        case QK__CUPTI_DRIVER:
            break;   /* enabled only so that CUPTI emits the external correlations of driver calls */
        case QK__CUPTI_RUNTIME: {
            const qk__cupti_api *a = (const qk__cupti_api *)rec;
            const char *nm = NULL;
            char buf[32];
            if (qk__prof_act.asked < 2) break;   /* mode 1: enabled for the correlations only */
            r.kind = QK_PROF_ACT_RUNTIME;
            r.t0 = (int64_t)a->start; r.t1 = (int64_t)a->end;
            r.corr = a->correlation_id;
            r.stream = a->thread_id;
            if (!qk__cupti.cuptiGetCallbackName ||
                qk__cupti.cuptiGetCallbackName(QK__CUPTI_CB_DOMAIN_RUNTIME, a->cbid, &nm) != 0 || !nm) {
                snprintf(buf, sizeof buf, "runtime call %u", a->cbid);
                nm = buf;
            }
            r.name = qk__prof_intern(nm);
            qk__prof_act_put(&r);
            break;
        }
        case QK__CUPTI_EXTERNAL_CORRELATION: {
            const qk__cupti_extcorr *e = (const qk__cupti_extcorr *)rec;
            qk__prof_actstore *A = &qk__prof_act;
            if (e->external_kind != QK__CUPTI_EXT_CUSTOM0) break;
            if (A->n_corrs < (int)A->max &&
                qk__prof_grow((void **)&A->corrs, &A->cap_corrs, A->n_corrs + 1, sizeof *A->corrs) == 0) {
                A->corrs[A->n_corrs].corr = e->correlation_id;
                A->corrs[A->n_corrs++].ext = (uint32_t)e->external_id;
            } else {
                A->dropped_corr++;
            }
            break;
        }
        default:
            break;
        }
    }
    if (qk__cupti.cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == 0) qk__prof_act.dropped_cupti += dropped;
    qk__prof_act.bufs--;
    pthread_mutex_unlock(&qk__prof_act.mu);
    QK_PROF_FREE(buffer);
}

/* Opens libcupti: QK_PROF_CUPTI_LIB (a path), the loader's search (LD_LIBRARY_PATH, ld.so.cache),
   then the toolkit's directories ($CUDA_HOME, /usr/local/cuda: extras/CUPTI/lib64 and lib64). */
static void *qk__prof_cupti_dlopen(char *why, size_t n)
{
    static const char *const dirs[] = { "/extras/CUPTI/lib64/", "/lib64/", "/lib/" };
    const char *roots[3], *env = getenv("QK_PROF_CUPTI_LIB");
    char so[32], path[1024];
    void *h;
    int r, d, v;
    const char *e;
    snprintf(so, sizeof so, "libcupti.so.%d", CUDART_VERSION / 1000);
    if (env && *env) {
        if ((h = dlopen(env, RTLD_NOW | RTLD_LOCAL))) return h;
        e = dlerror();
        snprintf(why, n, "QK_PROF_CUPTI_LIB=%.200s: %.200s", env, e ? e : "dlopen failed");
        return NULL;
    }
    if ((h = dlopen(so, RTLD_NOW | RTLD_LOCAL)) || (h = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL))) return h;
    e = dlerror();
    snprintf(why, n, "%s not found (%.200s); set QK_PROF_CUPTI_LIB to its path or add its directory "
             "(the CUDA toolkit's extras/CUPTI/lib64) to LD_LIBRARY_PATH", so, e ? e : "dlopen failed");
    roots[0] = getenv("CUDA_HOME");
    roots[1] = getenv("CUDA_PATH");
    roots[2] = "/usr/local/cuda";
    for (r = 0; r < 3; r++) {
        if (!roots[r] || !*roots[r]) continue;
        for (d = 0; d < 3; d++)
            for (v = 0; v < 2; v++) {
                snprintf(path, sizeof path, "%.900s%s%s", roots[r], dirs[d], v ? "libcupti.so" : so);
                if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) return h;
            }
    }
    return NULL;
}

static int qk__prof_cupti_start(int mode)
{
    qk__prof_actstore *A = &qk__prof_act;
    char why[512] = "";
    void *self;
    int rc, k;
    /* RUNTIME and DRIVER always: CUPTI emits an external correlation (a kernel's or copy's CPU
       zone) only for the API calls it records; mode 1 keeps none of their records */
    static const int kinds[] = { QK__CUPTI_CONCURRENT_KERNEL, QK__CUPTI_MEMCPY, QK__CUPTI_MEMSET,
                                 QK__CUPTI_SYNCHRONIZATION, QK__CUPTI_EXTERNAL_CORRELATION, QK__CUPTI_RUNTIME,
                                 QK__CUPTI_DRIVER };
    if (!qk__cupti.lib) {
        void *h = qk__prof_cupti_dlopen(why, sizeof why);
        if (!h) { snprintf(A->status, sizeof A->status, "unavailable: %.300s", why); return -1; }
        /* through memcpy: ISO C has no conversion from dlsym's void * to a function pointer */
#define QK__CUPTI_SYM(req, R, f, args) \
        { void *p_ = dlsym(h, #f); memcpy(&qk__cupti.f, &p_, sizeof p_); } \
        if (req && !qk__cupti.f) { snprintf(A->status, sizeof A->status, "unavailable: libcupti has no %s", #f); return -1; }
        QK__PROF_CUPTI_FNS(QK__CUPTI_SYM)
#undef QK__CUPTI_SYM
        qk__cupti.lib = h;
    }
    if ((self = dlopen(NULL, RTLD_NOW))) {
        void *p = dlsym(self, "__cxa_demangle");
        memcpy(&qk__prof_demangler, &p, sizeof p);
    }
    if ((rc = qk__cupti.cuptiActivityRegisterCallbacks(qk__prof_cupti_request, qk__prof_cupti_complete)) != 0) {
        snprintf(A->status, sizeof A->status, "unavailable: cuptiActivityRegisterCallbacks: %s (another tool, "
                 "such as Nsight Systems, may hold CUPTI)", qk__prof_cupti_err(rc));
        return -1;
    }
    for (k = 0; k < 7; k++) {
        if ((rc = qk__cupti.cuptiActivityEnable(kinds[k])) != 0) {
            int j;
            snprintf(A->status, sizeof A->status, "unavailable: cuptiActivityEnable(%d): %s", kinds[k], qk__prof_cupti_err(rc));
            for (j = 0; j < k; j++) qk__cupti.cuptiActivityDisable(kinds[j]);
            return -1;
        }
    }
    if (qk__cupti.cuptiActivityFlushPeriod) qk__cupti.cuptiActivityFlushPeriod(200); /* ms: buffers come back steadily */
    qk__cupti.cuptiGetTimestamp(&A->ts0);
    A->tick0 = qk__prof_now();
    A->ts1 = A->ts0;
    A->tick1 = A->tick0;
    snprintf(A->status, sizeof A->status, "on: kernels, copies, memsets, syncs%s", mode >= 2 ? ", runtime calls" : "");
    return 0;
}

static void qk__prof_cupti_stop(void)
{
    static const int kinds[] = { QK__CUPTI_CONCURRENT_KERNEL, QK__CUPTI_MEMCPY, QK__CUPTI_MEMSET,
                                 QK__CUPTI_SYNCHRONIZATION, QK__CUPTI_EXTERNAL_CORRELATION, QK__CUPTI_RUNTIME,
                                 QK__CUPTI_DRIVER };
    int k;
    __atomic_store_n(&qk__prof_cupti_ext, 0, __ATOMIC_RELAXED);
    for (k = 0; k < 7; k++) qk__cupti.cuptiActivityDisable(kinds[k]);
    qk__cupti.cuptiActivityFlushAll(QK__CUPTI_FLUSH_FORCED);
    if (qk__cupti.cuptiFinalize) qk__cupti.cuptiFinalize();
}

/* Before a report: the completed buffers (CUDA work still running is not in them yet: synchronize
   before the report for every kernel), and a new pair of timestamps for the clock map. */
static void qk__prof_cupti_flush(void)
{
    uint64_t ts = 0, tick;
    if (qk__prof_act.state != 1) return;
    qk__cupti.cuptiActivityFlushAll(0);
    qk__cupti.cuptiGetTimestamp(&ts);
    tick = qk__prof_now();
    pthread_mutex_lock(&qk__prof_act.mu);
    qk__prof_act.ts1 = ts;
    qk__prof_act.tick1 = tick;
    pthread_mutex_unlock(&qk__prof_act.mu);
}
#else
static void qk__prof_cupti_flush(void) {}
#endif /* QK_PROF_CUDA */

/* Starts the CUPTI mode once, when the profiler starts (qk_prof_init, or the first thread that
   records) and desc.cupti or QK_PROF_CUPTI asks for it. Not under qk__prof_mu. */
static void qk__prof_cupti_autostart(void)
{
    qk__prof_actstore *A = &qk__prof_act;
    const char *env = getenv("QK_PROF_CUPTI");
    int mode = qk__prof_g.desc.cupti;
    if (__atomic_load_n(&A->state, __ATOMIC_ACQUIRE) != 0 || A->asked) return;
    if (!mode && env && *env) mode = atoi(env);
    pthread_mutex_lock(&A->mu);
    if (A->asked || mode <= 0) { pthread_mutex_unlock(&A->mu); return; }
    A->asked = mode;
    qk__prof_act_limits();
    pthread_mutex_unlock(&A->mu);
#ifdef QK_PROF_CUDA
    if (qk__prof_cupti_start(mode) == 0) {
        __atomic_store_n(&A->state, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&qk__prof_cupti_ext, 1, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&A->state, -1, __ATOMIC_RELEASE);
    }
#else
    snprintf(A->status, sizeof A->status, "unavailable: the implementation was compiled without QK_PROF_CUDA");
    __atomic_store_n(&A->state, -1, __ATOMIC_RELEASE);
#endif
}

/* qk_prof_shutdown: stop CUPTI (its last buffers come back now), free the store. */
static void qk__prof_act_shutdown(void)
{
    qk__prof_actstore *A = &qk__prof_act;
    int i;
#ifdef QK_PROF_CUDA
    if (A->state == 1) qk__prof_cupti_stop();
#endif
    pthread_mutex_lock(&A->mu);
    for (i = 0; i < A->n_names; i++) {
        if (A->names[i].name != A->names[i].key) QK_PROF_FREE(A->names[i].name);
        QK_PROF_FREE(A->names[i].key);
    }
    QK_PROF_FREE(A->names);
    QK_PROF_FREE(A->hash);
    QK_PROF_FREE(A->recs);
    QK_PROF_FREE(A->corrs);
    {   /* all but the lock, and the buffers CUPTI still holds (returned and freed later) */
        int bufs = A->bufs;
        memset(&A->recs, 0, sizeof *A - offsetof(qk__prof_actstore, recs));
        A->bufs = bufs;
    }
    pthread_mutex_unlock(&A->mu);
}
/* ---- end cupti ---- */

/* >>shutdown ---- implementation: shutdown ---- */
QK_PROF_DEF void qk_prof_shutdown(void)
{
    qk__prof_thread *t, *n;
    uint32_t i;
    qk__prof_act_shutdown(); /* >>cupti */
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
    qk_prof_zone_part *tz;      /* per thread and CPU site: its total (the thread-imbalance rule) */
    int n_tz, cap_tz;
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
    QK_PROF_FREE(m->tz);
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
    qk__prof_cupti_flush(); /* >>cupti: the completed activity buffers */
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
            if (tmp[i].n && qk__prof_grow((void **)&m->tz, &m->cap_tz, m->n_tz + 1, sizeof *m->tz) == 0) {
                qk_prof_zone_part *z = &m->tz[m->n_tz++];
                memset(z, 0, sizeof *z);
                z->zone = m->cpu[i].name;
                z->index = t->index;
                z->label = t->name;
                z->total_ns = m->npt * (double)tmp[i].total;
                z->calls = tmp[i].n;
            }
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

/* >>acthooks: the activity and advice parts of each report (defined in >>advice) */
static void qk__prof_act_text(FILE *f, qk__prof_model *m, int w);
static void qk__prof_act_json(FILE *f, qk__prof_model *m);
static void qk__prof_act_trace(FILE *f, qk__prof_model *m, int *first);
static void qk__prof_act_html_advice(FILE *f, qk__prof_model *m);
static void qk__prof_act_html(FILE *f, qk__prof_model *m);
struct qk__prof_html_tl;
static void qk__prof_act_html_lanes(FILE *f, qk__prof_model *m, struct qk__prof_html_tl *tl); /* the timeline's GPU lanes */
#ifdef QK_PROF_MPI /* >>mpi: the rank-imbalance advice of the merged report (thresholds as the reports take
                      them); returns the count, *out the items (caller frees) */
static int qk__prof_adv_ranks(const qk_prof_zone_part *rows, size_t n, int ranks, double wall, qk_prof_advice **out);
#endif

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
    qk__prof_act_text(f, m, w); /* >>advice: GPU activities, advice */
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
    fputs("]}", f);
    pthread_mutex_unlock(&qk__prof_mu);
    qk__prof_act_json(f, m); /* >>advice: "activities", "advice" */
    fputs("}\n", f);
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
    qk__prof_act_trace(f, m, &first); /* >>advice: the CUPTI lanes */
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
          "rect.box{stroke:#fff;stroke-width:.5}rect.box.act{stroke:none}\n"
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
          "depth: a zone is drawn under the zone it is nested in. GPU activities (the CUPTI mode): a row per stream, "
          "kernels green, copies and memsets orange.</p>\n<div class=\"tl\">\n", f);
    for (i = 0; i < m->n_threads; i++)
        if (m->threads[i]) qk__prof_html_thread_lanes(f, m, m->threads[i], &tl);
    for (k = 0; k < m->n_lanes; k++) qk__prof_html_stream_lanes(f, m, k, &tl);
    qk__prof_act_html_lanes(f, (qk__prof_model *)m, &tl); /* >>advice: a lane per stream of the CUPTI records */
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
    qk__prof_act_html_advice(f, m); /* >>advice */
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
    qk__prof_act_html(f, m); /* >>advice: the CUPTI tables */
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
    int64_t c = 0;
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

/* Merged zones (caller frees); *n the count, -1 when out of memory (NULL then). */
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
                if (qk__prof_grow((void **)&z, &cap, nz + 1, sizeof *z) != 0) { QK_PROF_FREE(z); *n = -1; return NULL; }
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

/* The rank-imbalance advice over the merged zones: each zone's total on every rank that ran it
   (the rule counts the others 0); wall: the longest rank's. Returns the count; caller frees *out. */
static int qk__prof_mpi_advice(const qk__prof_mrank *rk, int size, const qk__prof_mzone *z, int nz, qk_prof_advice **out)
{
    qk_prof_zone_part *rows = (qk_prof_zone_part *)qk__prof_calloc((size_t)size * (size_t)nz + 1, sizeof *rows);
    char *names = (char *)qk__prof_calloc((size_t)nz + 1, 256);
    size_t n = 0;
    double wall = 0;
    int r, j, na = 0;
    *out = NULL;
    if (rows && names) {
        for (r = 0; r < size; r++) if (rk[r].wall > wall) wall = rk[r].wall;
        for (j = 0; j < nz; j++) {
            qk__prof_mpi_name(names + 256 * (size_t)j, 256, z[j].name, z[j].len);
            for (r = 0; r < size; r++) {
                int i;
                for (i = 0; i < rk[r].n_rows; i++)
                    if (rk[r].rows[i].gpu == z[j].gpu && rk[r].rows[i].len == z[j].len &&
                        memcmp(rk[r].rows[i].name, z[j].name, z[j].len) == 0) {
                        rows[n].zone = names + 256 * (size_t)j;
                        rows[n].gpu = z[j].gpu;
                        rows[n].index = r;
                        rows[n].total_ns = rk[r].rows[i].v[1];
                        rows[n++].calls = (uint64_t)rk[r].rows[i].v[0];
                        break;
                    }
            }
        }
        na = qk__prof_adv_ranks(rows, n, size, wall, out);
        /* the items quote the names in their own text: the rows can go */
    }
    QK_PROF_FREE(rows);
    QK_PROF_FREE(names);
    return na;
}

static void qk__prof_mpi_text(FILE *f, const qk__prof_mrank *rk, int size, const qk__prof_mzone *z, int nz)
{
    qk_prof_advice *adv;
    int na;
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
    qk__prof_pf(f, "(min / mean / max over all %d ranks, a rank without the zone counting 0; imbalance = max / mean)\n", size);
    na = qk__prof_mpi_advice(rk, size, z, nz, &adv);
    qk__prof_pf(f, "\nAdvice across ranks (rank-imbalance; thresholds in docs/profiler.md, QK_PROF_ADVICE)\n");
    if (!na) qk__prof_pf(f, "(none: no rule fired)\n");
    for (j = 0; j < na; j++) {
        char b[32];
        qk__prof_pf(f, "%2d. [%s] %s (about %s at stake)\n    evidence: %s\n    fix: %s\n", j + 1, adv[j].rule, adv[j].where,
                    qk__prof_time(adv[j].impact_ns, b, sizeof b), adv[j].evidence, adv[j].fix);
    }
    QK_PROF_FREE(adv);
    qk__prof_pf(f, "\n==== rank 0 ====\n");
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
    fputs("],\n\"advice\":[", f);
    {
        qk_prof_advice *adv;
        int na = qk__prof_mpi_advice(rk, size, z, nz, &adv);
        for (j = 0; j < na; j++) {
            fputs(j ? ",\n {\"rule\":" : "\n {\"rule\":", f);
            qk__prof_json_str(f, adv[j].rule);
            fputs(",\"where\":", f); qk__prof_json_str(f, adv[j].where);
            fputs(",\"evidence\":", f); qk__prof_json_str(f, adv[j].evidence);
            fputs(",\"fix\":", f); qk__prof_json_str(f, adv[j].fix);
            fputs(",\"impact_ns\":", f); qk__prof_json_num(f, adv[j].impact_ns);
            fputc('}', f);
        }
        QK_PROF_FREE(adv);
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
    {
        qk_prof_advice *adv;
        int na = qk__prof_mpi_advice(rk, size, z, nz, &adv);
        fputs("<h2>Advice across ranks</h2>\n", f);
        if (!na) fputs("<p>No rule fired.</p>\n", f);
        else fputs("<ol class=\"adv\">\n", f);
        for (j = 0; j < na; j++) {
            qk__prof_pf(f, "<li><b>%s</b> &middot; ", adv[j].rule);
            qk__prof_html_str(f, adv[j].where);
            qk__prof_pf(f, " &middot; about %s at stake<br><span class=\"note\">", qk__prof_time(adv[j].impact_ns, t1, sizeof t1));
            qk__prof_html_str(f, adv[j].evidence);
            fputs("</span><br><i>Fix:</i> ", f);
            qk__prof_html_str(f, adv[j].fix);
            fputs("</li>\n", f);
        }
        if (na) fputs("</ol>\n", f);
        QK_PROF_FREE(adv);
    }
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
    /* A rank that could not build its part (out of memory) fails the report on every rank (the
       highest such rank + 1 in bad), rather than being left out of it unsaid. */
    {
        int bad = (!ok || b.oom || (fmt == QK_PROF_TRACE && !mine)) ? rank + 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm);
        if (bad) { qk__prof_seterr("qk_prof: out of memory on rank %d building or gathering the MPI report", bad - 1); goto done; }
    }
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
        /* a rank's part that came but cannot be read back (out of memory: it is our own format)
           fails the report, as a part that could not be built does */
        for (r = 0; r < size; r++)
            if (qk__prof_mpi_parse(all + displs[r], (size_t)lens[r], &rk[r]) != 0) {
                rk[r].n_rows = 0;
                if (lens[r] > 0) ok = 0;
            }
        qk__prof_mpi_offsets(rk, size, rep);
        z = qk__prof_mpi_zones(rk, size, &nz);
        if (nz < 0) { nz = 0; ok = 0; }
        ms = ok ? open_memstream(&out, len) : NULL;
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
        if (!out) qk__prof_seterr(ok ? "qk_prof: cannot render the MPI report" : "qk_prof: out of memory merging the ranks' reports");
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
/* >>advice ---- implementation: advice rules, and the activity and advice parts of the reports ---- */
/* The rules read plain arrays (qk_prof_facts): the GPU activities, the steps of the loop, the
   memory samples. A rule is one function that appends its items to the list; to add one, write
   the function and add a line to qk__prof_rules. qk_prof_advise runs them on any facts (the
   tests plant records), the reports on the facts of this run (qk__prof_aview_build). */
typedef struct qk__prof_advlist { qk_prof_advice *items; int n, cap; } qk__prof_advlist;

/* A new, zeroed item of rule, or NULL when out of memory. */
static qk_prof_advice *qk__prof_adv_new(qk__prof_advlist *L, const char *rule, double impact_ns)
{
    qk_prof_advice *a;
    if (qk__prof_grow((void **)&L->items, &L->cap, L->n + 1, sizeof *L->items) != 0) return NULL;
    a = &L->items[L->n++];
    memset(a, 0, sizeof *a);
    a->rule = rule;
    a->impact_ns = impact_ns > 0 ? impact_ns : 0;
    return a;
}

static const struct { const char *key; size_t off; double def; } qk__prof_adv_keys[] = {
    { "min_steps", offsetof(qk_prof_advice_cfg, min_steps), 3 },
    { "pageable_min_bytes", offsetof(qk_prof_advice_cfg, pageable_min_bytes), 1048576 },
    { "sync_min_step_share", offsetof(qk_prof_advice_cfg, sync_min_step_share), 0.5 },
    { "sync_min_idle_ns", offsetof(qk_prof_advice_cfg, sync_min_idle_ns), 10000 },
    { "idle_max_busy", offsetof(qk_prof_advice_cfg, idle_max_busy), 0.5 },
    { "idle_min_ns", offsetof(qk_prof_advice_cfg, idle_min_ns), 1e6 },
    { "short_kernel_ns", offsetof(qk_prof_advice_cfg, short_kernel_ns), 10000 },
    { "launch_min_kernels", offsetof(qk_prof_advice_cfg, launch_min_kernels), 100 },
    { "launch_min_share", offsetof(qk_prof_advice_cfg, launch_min_share), 0.5 },
    { "serial_min_copy_share", offsetof(qk_prof_advice_cfg, serial_min_copy_share), 0.05 },
    { "serial_max_overlap", offsetof(qk_prof_advice_cfg, serial_max_overlap), 0.1 },
    { "leak_min_bytes", offsetof(qk_prof_advice_cfg, leak_min_bytes), 1048576 },
    { "leak_min_step_share", offsetof(qk_prof_advice_cfg, leak_min_step_share), 0.8 },
    { "step_skip", offsetof(qk_prof_advice_cfg, step_skip), 1 },
    { "tail_ratio", offsetof(qk_prof_advice_cfg, tail_ratio), 2 },
    { "drift_min_growth", offsetof(qk_prof_advice_cfg, drift_min_growth), 0.2 },
    { "thread_imbalance", offsetof(qk_prof_advice_cfg, thread_imbalance), 1.25 },
    { "rank_imbalance", offsetof(qk_prof_advice_cfg, rank_imbalance), 1.25 },
    { "imbalance_min_share", offsetof(qk_prof_advice_cfg, imbalance_min_share), 0.05 },
};
#define QK__PROF_ADV_NKEYS ((int)(sizeof qk__prof_adv_keys / sizeof qk__prof_adv_keys[0]))
#define QK__PROF_CFG(c, k) (*(double *)((char *)(c) + qk__prof_adv_keys[k].off))

/* A number of QK_PROF_ADVICE, whatever the locale: the whole of s[0..n) in C syntax ('.' the point),
   finite; 0 and *out set, or -1 (then *out is untouched). */
static int qk__prof_adv_num(const char *s, size_t n, double *out)
{
    char num[64], *end = NULL, *dot;
    const char *lp = localeconv()->decimal_point;
    double v;
    if (n == 0 || n >= sizeof num || memchr(s, 0, n)) return -1;
    memcpy(num, s, n);
    num[n] = 0;
    if (strcspn(num, "0123456789") == n) return -1;        /* no digit: not inf, nan, "" */
    if (strchr(num, ',') || (lp && lp[0] && lp[0] != '.' && strchr(num, lp[0]))) return -1; /* only '.' is the point */
    if ((dot = strchr(num, '.')) && lp && lp[0] && lp[0] != '.' && !lp[1]) *dot = lp[0]; /* the locale's point for strtod */
    errno = 0;
    v = strtod(num, &end);
    if (end != num + n || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* QK_PROF_ADVICE's "key=value,key=value,..." over c: each known key with a valid number sets its
   field (0: the default again, as in desc.advice; the last occurrence wins); step_zone's value is
   copied to step_name (n bytes, truncated). An item without '=', an unknown key or a value that
   is not a whole finite number is skipped. */
static void qk__prof_adv_parse(const char *e, qk_prof_advice_cfg *c, char *step_name, size_t n)
{
    int k;
    while (e && *e) {
        size_t kl = strcspn(e, "=,"), vl;
        const char *v = e + kl;
        if (*v != '=') { e = v + (*v == ','); continue; }  /* no value: skip the item */
        v++;
        vl = strcspn(v, ",");
        if (kl == 9 && strncmp(e, "step_zone", 9) == 0 && step_name && n > 0) {
            size_t l = vl < n - 1 ? vl : n - 1;
            memcpy(step_name, v, l);
            step_name[l] = 0;
            c->step_zone = step_name;
        }
        for (k = 0; k < QK__PROF_ADV_NKEYS; k++) {
            double x;
            if (strlen(qk__prof_adv_keys[k].key) != kl || strncmp(e, qk__prof_adv_keys[k].key, kl) != 0) continue;
            if (qk__prof_adv_num(v, vl, &x) == 0) QK__PROF_CFG(c, k) = x == 0 ? qk__prof_adv_keys[k].def : x;
        }
        e = v + vl + (v[vl] == ',');
    }
}

/* The thresholds in force: in's (NULL: none) over the defaults, then (env) QK_PROF_ADVICE's
   "key=value,..." over both. step_name: storage for a step_zone given in the environment. */
static void qk__prof_adv_cfg(const qk_prof_advice_cfg *in, qk_prof_advice_cfg *c, int env, char *step_name, size_t n)
{
    int k;
    memset(c, 0, sizeof *c);
    if (in) *c = *in;
    for (k = 0; k < QK__PROF_ADV_NKEYS; k++)
        if (QK__PROF_CFG(c, k) == 0) QK__PROF_CFG(c, k) = qk__prof_adv_keys[k].def;
    if (env) qk__prof_adv_parse(getenv("QK_PROF_ADVICE"), c, step_name, n);
}

static int qk__prof_is_work(int kind)
{
    return kind == QK_PROF_ACT_KERNEL || kind == QK_PROF_ACT_MEMCPY || kind == QK_PROF_ACT_MEMSET || kind == QK_PROF_ACT_ZONE;
}

static int qk__prof_is_wait(const qk_prof_activity *a)
{
    return (a->kind == QK_PROF_ACT_SYNC && a->sync != QK_PROF_SYNC_STREAM_WAIT) ||
           ((a->kind == QK_PROF_ACT_MEMCPY || a->kind == QK_PROF_ACT_MEMSET) && a->sync == 1);
}

/* Sorts n intervals (pairs of doubles) and merges them in place; returns the merged count. */
static size_t qk__prof_merge(double *iv, size_t n)
{
    size_t i, o = 0;
    if (!n) return 0;
    qsort(iv, n, 2 * sizeof *iv, qk__prof_dcmp);
    for (i = 1; i < n; i++) {
        if (iv[2 * i] <= iv[2 * o + 1]) { if (iv[2 * i + 1] > iv[2 * o + 1]) iv[2 * o + 1] = iv[2 * i + 1]; }
        else { o++; iv[2 * o] = iv[2 * i]; iv[2 * o + 1] = iv[2 * i + 1]; }
    }
    return o + 1;
}

static double qk__prof_len(const double *iv, size_t n)
{
    double s = 0;
    size_t i;
    for (i = 0; i < n; i++) s += iv[2 * i + 1] - iv[2 * i];
    return s;
}

/* Length of [a, b] covered by merged intervals iv. */
static double qk__prof_cover(const double *iv, size_t n, double a, double b)
{
    size_t lo = 0, hi = n;
    double s = 0;
    while (lo < hi) { size_t mid = (lo + hi) / 2; if (iv[2 * mid + 1] <= a) lo = mid + 1; else hi = mid; }
    for (; lo < n && iv[2 * lo] < b; lo++) {
        double x = iv[2 * lo] > a ? iv[2 * lo] : a, y = iv[2 * lo + 1] < b ? iv[2 * lo + 1] : b;
        if (y > x) s += y - x;
    }
    return s;
}

/* The GPU work intervals of device dev (stream: only that one, or any when stream_any), clipped to
   [t0, t1], merged; caller frees. kernels_only: kernels and GPU zones. */
static double *qk__prof_work(const qk_prof_facts *f, int dev, int stream_any, uint32_t stream, int kernels_only,
                             int exclude_stream, double t0, double t1, size_t *n)
{
    double *iv = (double *)QK_PROF_MALLOC(((size_t)(f->n_acts > 0 ? f->n_acts : 0) + 1) * 2 * sizeof *iv);
    size_t i, o = 0;
    *n = 0;
    if (!iv) return NULL;
    for (i = 0; i < f->n_acts; i++) {
        const qk_prof_activity *a = &f->acts[i];
        double x = a->start_ns > t0 ? a->start_ns : t0, y = a->end_ns < t1 ? a->end_ns : t1;
        if (!qk__prof_is_work(a->kind) || a->device != dev || y <= x) continue;
        if (kernels_only && a->kind != QK_PROF_ACT_KERNEL && a->kind != QK_PROF_ACT_ZONE) continue;
        if (!stream_any && (exclude_stream ? a->stream == stream : a->stream != stream)) continue;
        iv[2 * o] = x;
        iv[2 * o + 1] = y;
        o++;
    }
    *n = qk__prof_merge(iv, o);
    return iv;
}

/* The loop: from the first step's start to the last step's end, then on over the GPU work still
   queued when the last step ended: a host that launches asynchronously ends its steps before the
   GPU has run them, so the busy stretch of the GPUs that runs through the last step's end (gaps
   shorter than QK__PROF_QUEUE_GAP_NS, the GPU going from one queued item to the next) is the loop's
   work too. Without (enough) steps, the span of the GPU work. Returns 1 with steps. */
#define QK__PROF_QUEUE_GAP_NS 200000.0
static int qk__prof_loop(const qk_prof_facts *f, const qk_prof_advice_cfg *c, double *t0, double *t1)
{
    size_t i;
    if (f->n_steps >= (size_t)c->min_steps && f->n_steps > 0) {
        double *iv;
        size_t o = 0, n;
        *t0 = f->steps[0].t0_ns;
        *t1 = f->steps[f->n_steps - 1].t1_ns;
        iv = (double *)QK_PROF_MALLOC(((size_t)f->n_acts + 1) * 2 * sizeof *iv);
        if (!iv) return 1;      /* no memory: the steps' span alone */
        for (i = 0; i < f->n_acts; i++)
            if (qk__prof_is_work(f->acts[i].kind) && f->acts[i].end_ns > *t1) {
                iv[2 * o] = f->acts[i].start_ns;
                iv[2 * o + 1] = f->acts[i].end_ns;
                o++;
            }
        n = qk__prof_merge(iv, o);
        for (i = 0; i < n; i++)
            if (iv[2 * i] <= *t1 + QK__PROF_QUEUE_GAP_NS && iv[2 * i + 1] > *t1) *t1 = iv[2 * i + 1];
        QK_PROF_FREE(iv);
        return 1;
    }
    *t0 = 1e300;
    *t1 = -1e300;
    for (i = 0; i < f->n_acts; i++)
        if (qk__prof_is_work(f->acts[i].kind)) {
            if (f->acts[i].start_ns < *t0) *t0 = f->acts[i].start_ns;
            if (f->acts[i].end_ns > *t1) *t1 = f->acts[i].end_ns;
        }
    return 0;
}

/* The step holding time t, or -1. */
static long qk__prof_step_of(const qk_prof_facts *f, double t)
{
    size_t lo = 0, hi = f->n_steps;
    while (lo < hi) { size_t mid = (lo + hi) / 2; if (f->steps[mid].t0_ns <= t) lo = mid + 1; else hi = mid; }
    if (lo == 0 || t > f->steps[lo - 1].t1_ns) return -1;
    return (long)lo - 1;
}

/* The most frequent (by weight) of a few names: zones, kernels. */
typedef struct qk__prof_tally { const char *name[32]; double w[32]; int n; } qk__prof_tally;
static void qk__prof_tally_add(qk__prof_tally *t, const char *name, double w)
{
    int i;
    if (!name) name = "(no zone)";
    for (i = 0; i < t->n; i++) if (t->name[i] == name || strcmp(t->name[i], name) == 0) { t->w[i] += w; return; }
    if (t->n < 32) { t->name[t->n] = name; t->w[t->n++] = w; }
}
static const char *qk__prof_tally_top(const qk__prof_tally *t)
{
    int i, b = 0;
    for (i = 1; i < t->n; i++) if (t->w[i] > t->w[b]) b = i;
    return t->n ? t->name[b] : "(none)";
}

static const char *qk__prof_stream_label(const qk_prof_facts *f, int dev, uint32_t stream, char *buf, size_t n)
{
    size_t i;
    for (i = 0; i < f->n_streams; i++)
        if (f->streams[i].device == dev && f->streams[i].stream == stream && f->streams[i].name) {
            qk__prof_spf(buf, n, "stream \"%.60s\" (GPU %d)", f->streams[i].name, dev);
            return buf;
        }
    qk__prof_spf(buf, n, "stream %u (GPU %d)", stream, dev);
    return buf;
}

/* Rule pageable-copy: host <-> device copies through pageable host memory, with the rates of the
   pageable and the pinned copies of this run. */
static void qk__prof_rule_pageable(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    double pb[2] = { 0, 0 }, pt[2] = { 0, 0 }, qb[2] = { 0, 0 }, qt[2] = { 0, 0 }, save = 0;
    unsigned long long pn[2] = { 0, 0 }, qn[2] = { 0, 0 };
    qk__prof_tally z;
    char e[2][160], b1[32], t1[32];
    qk_prof_advice *a;
    size_t i;
    int d;
    memset(&z, 0, sizeof z);
    for (i = 0; i < f->n_acts; i++) {
        const qk_prof_activity *x = &f->acts[i];
        int k, host;
        if (x->kind != QK_PROF_ACT_MEMCPY || (x->dir != QK_PROF_H2D && x->dir != QK_PROF_D2H)) continue;
        k = x->dir == QK_PROF_D2H;
        host = k ? x->dst_kind : x->src_kind;
        if (host == QK_PROF_MEMK_PAGEABLE) {
            pb[k] += (double)x->bytes; pt[k] += x->end_ns - x->start_ns; pn[k]++;
            qk__prof_tally_add(&z, x->zone, (double)x->bytes);
        } else if (host == QK_PROF_MEMK_PINNED) {
            qb[k] += (double)x->bytes; qt[k] += x->end_ns - x->start_ns; qn[k]++;
        }
    }
    if (c->pageable_min_bytes < 0 || pb[0] + pb[1] <= 0 || pb[0] + pb[1] < c->pageable_min_bytes) return;
    for (d = 0; d < 2; d++) {
        char pin[64];
        /* the time pinned copies at this run's pinned rate would have saved (half, with none to compare) */
        if (pn[d] && qb[d] > 0 && qt[d] > 0) { double sv = pt[d] - pb[d] * qt[d] / qb[d]; save += sv > 0 ? sv : 0; }
        else save += 0.5 * pt[d];
        e[d][0] = 0;
        if (!pn[d]) continue;
        if (qn[d] && qt[d] > 0) qk__prof_spf(pin, sizeof pin, "%.2f GB/s over %llu copies", qb[d] / qt[d], qn[d]);
        else qk__prof_spf(pin, sizeof pin, "none in this run");
        qk__prof_spf(e[d], sizeof e[d], "%s %llu copies, %s at %.2f GB/s (pinned: %s)", d ? "D2H" : "H2D", pn[d],
                     qk__prof_bytes(pb[d], b1, sizeof b1), pt[d] > 0 ? pb[d] / pt[d] : 0.0, pin);
    }
    if (!(a = qk__prof_adv_new(L, "pageable-copy", save))) return;
    qk__prof_spf(a->where, sizeof a->where, "zone \"%.100s\"", qk__prof_tally_top(&z));
    qk__prof_spf(a->evidence, sizeof a->evidence, "%llu copies between device and pageable host memory took %s: "
                 "%s%s%s", pn[0] + pn[1], qk__prof_time(pt[0] + pt[1], t1, sizeof t1), e[0], e[0][0] && e[1][0] ? "; " : "", e[1]);
    qk__prof_spf(a->fix, sizeof a->fix, "Allocate these host buffers pinned (cudaMallocHost, cudaHostAlloc) or pin them "
                 "once with cudaHostRegister: a pageable copy is staged through a driver buffer at a lower rate, and "
                 "cudaMemcpyAsync from pageable memory makes the host wait for it.");
}

static const char *qk__prof_wait_name(const qk_prof_activity *a)
{
    if (a->kind == QK_PROF_ACT_MEMCPY) return "synchronous cudaMemcpy";
    if (a->kind == QK_PROF_ACT_MEMSET) return "synchronous cudaMemset";
    switch (a->sync) {
    case QK_PROF_SYNC_EVENT: return "cudaEventSynchronize";
    case QK_PROF_SYNC_STREAM: return "cudaStreamSynchronize";
    case QK_PROF_SYNC_DEVICE: return "cudaDeviceSynchronize";
    default: return "synchronization";
    }
}

/* Rule sync-in-loop: the host waits for the GPU inside the step loop and the GPU drains: it sits
   idle from the end of its work until the host has launched more. A wait counts when the GPU was
   idle at its end for at least sync_min_idle_ns (the gap of the device's busy time it ends in). */
static void qk__prof_rule_sync(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    unsigned char *hit;
    double wait = 0, idle = 0, t0, t1;
    unsigned long long n = 0, nb = 0, steps_hit = 0;
    qk__prof_tally z, kinds;
    size_t i, s;
    int dev;
    char b1[32], b2[32], b3[32];
    qk_prof_advice *a;
    if (c->sync_min_step_share < 0 || !qk__prof_loop(f, c, &t0, &t1)) return;
    hit = (unsigned char *)qk__prof_calloc(f->n_steps, 1);
    if (!hit) return;
    memset(&z, 0, sizeof z);
    memset(&kinds, 0, sizeof kinds);
    for (dev = 0; dev < 16; dev++) {
        size_t nw;
        double *w = NULL;
        for (i = 0; i < f->n_acts; i++) {
            const qk_prof_activity *x = &f->acts[i];
            long st;
            double gap0, gap1;
            size_t lo, hi;
            if (!qk__prof_is_wait(x) || x->device != dev || (st = qk__prof_step_of(f, x->start_ns)) < 0) continue;
            if (!w && !(w = qk__prof_work(f, dev, 1, 0, 0, 0, -1e300, 1e300, &nw))) break;
            n++;
            wait += x->end_ns - x->start_ns;
            /* the gap of the busy time that holds the wait's end: [end of the work before, start of the next] */
            lo = 0; hi = nw;
            while (lo < hi) { size_t mid = (lo + hi) / 2; if (w[2 * mid] <= x->end_ns) lo = mid + 1; else hi = mid; }
            if (lo > 0 && w[2 * (lo - 1) + 1] > x->end_ns) continue; /* the GPU was busy: no drain */
            gap0 = lo > 0 ? w[2 * (lo - 1) + 1] : x->start_ns;
            if (gap0 < x->start_ns) gap0 = x->start_ns;
            gap1 = lo < nw ? w[2 * lo] : x->end_ns;
            if (gap1 - gap0 < c->sync_min_idle_ns) continue;
            nb++;
            idle += gap1 - gap0;
            if (!hit[st]) { hit[st] = 1; steps_hit++; }
            qk__prof_tally_add(&z, x->zone, 1);
            qk__prof_tally_add(&kinds, qk__prof_wait_name(x), 1);
        }
        QK_PROF_FREE(w);
    }
    QK_PROF_FREE(hit);
    s = f->n_steps;
    if (!nb || (double)steps_hit < c->sync_min_step_share * (double)s) return;
    if (!(a = qk__prof_adv_new(L, "sync-in-loop", idle))) return;
    qk__prof_spf(a->where, sizeof a->where, "%s in zone \"%.80s\"", qk__prof_tally_top(&kinds), qk__prof_tally_top(&z));
    qk__prof_spf(a->evidence, sizeof a->evidence, "%llu host waits for the GPU in the loop of %zu steps (\"%.60s\"), "
                 "%llu of them in %llu steps leaving the GPU idle: the host waited %s in all, the GPU sat idle %s "
                 "around those waits (%s each) until the host had launched more", n, s,
                 f->step_zone ? f->step_zone : "steps", nb, steps_hit, qk__prof_time(wait, b1, sizeof b1),
                 qk__prof_time(idle, b2, sizeof b2), qk__prof_time(idle / (double)nb, b3, sizeof b3));
    qk__prof_spf(a->fix, sizeof a->fix, "Take the wait out of the loop: order the work with events (cudaEventRecord + "
                 "cudaStreamWaitEvent) instead of synchronizing, copy results with cudaMemcpyAsync into pinned memory "
                 "and read them a step later (cudaEventQuery), synchronize once after the loop.");
}

/* Rule gpu-idle: a GPU busy (kernels, copies, memsets, GPU zones) for less than idle_max_busy of
   the loop, per device, with the busy share of each stream. */
static void qk__prof_rule_idle(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    double t0, t1, len;
    int dev, steps;
    if (c->idle_max_busy < 0) return;
    steps = qk__prof_loop(f, c, &t0, &t1);
    if ((len = t1 - t0) <= 0) return;
    for (dev = 0; dev < 16; dev++) {
        size_t n, i, gaps = 0;
        double *w = qk__prof_work(f, dev, 1, 0, 0, 0, t0, t1, &n), busy, longest = 0;
        uint32_t seen[8];
        int ns = 0, k;
        char b1[32], b2[32], b3[32], st[400] = "";
        qk_prof_advice *a;
        if (!w) return;
        busy = qk__prof_len(w, n);
        for (i = 0; i + 1 < n; i++) {
            double g = w[2 * (i + 1)] - w[2 * i + 1];
            if (g >= 10000) gaps++;
            if (g > longest) longest = g;
        }
        QK_PROF_FREE(w);
        if (!n || busy >= c->idle_max_busy * len || len - busy < c->idle_min_ns) continue;
        for (i = 0; i < f->n_acts && ns < 8; i++) { /* the busy share of the first few streams */
            const qk_prof_activity *x = &f->acts[i];
            if (!qk__prof_is_work(x->kind) || x->device != dev) continue;
            for (k = 0; k < ns; k++) if (seen[k] == x->stream) break;
            if (k == ns) {
                size_t m;
                double *v = qk__prof_work(f, dev, 0, x->stream, 0, 0, t0, t1, &m);
                char lb[96];
                seen[ns++] = x->stream;
                if (!v) continue;
                qk__prof_spf(st + strlen(st), sizeof st - strlen(st), "%s%s %.1f %%", ns > 1 ? ", " : "",
                             qk__prof_stream_label(f, dev, x->stream, lb, sizeof lb), 100.0 * qk__prof_len(v, m) / len);
                QK_PROF_FREE(v);
            }
        }
        if (!(a = qk__prof_adv_new(L, "gpu-idle", len - busy))) return;
        qk__prof_spf(a->where, sizeof a->where, "GPU %d, %s \"%.80s\"", dev, steps ? "the loop of" : "from its first work to its last,",
                     steps ? (f->step_zone ? f->step_zone : "steps") : "no step zone");
        qk__prof_spf(a->evidence, sizeof a->evidence, "busy %.1f %% of the %s (idle %s; %zu gaps of 10 us or more, the longest "
                     "%s); busy share per stream: %s", 100.0 * busy / len, qk__prof_time(len, b1, sizeof b1),
                     qk__prof_time(len - busy, b2, sizeof b2), gaps, qk__prof_time(longest, b3, sizeof b3), st);
        qk__prof_spf(a->fix, sizeof a->fix, "Keep work queued ahead of the GPU: remove host waits from the loop, launch "
                     "the next step's work before processing this step's results on the host, overlap copies with kernels "
                     "on other streams, or give each launch more work.");
    }
}

/* Rule launch-bound: most kernels shorter than short_kernel_ns, so launches, not the work, set the
   pace: the gaps between consecutive short kernels on a stream are the launch overhead. */
typedef struct qk__prof_kiv { double key, t0, t1; } qk__prof_kiv; /* key: device and stream */
static int qk__prof_kiv_cmp(const void *x, const void *y)
{
    const qk__prof_kiv *a = (const qk__prof_kiv *)x, *b = (const qk__prof_kiv *)y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->t0 < b->t0 ? -1 : a->t0 > b->t0;
}

static void qk__prof_rule_launch(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    qk__prof_kiv *iv;
    double sdur = 0, gaps = 0, api = 0;
    unsigned long long nk = 0, ns = 0, ng = 0, na = 0;
    qk__prof_tally names;
    size_t i, o = 0;
    char b1[32], b2[32], b3[32], b4[32], extra[160] = "";
    qk_prof_advice *a;
    if (c->short_kernel_ns < 0) return;
    memset(&names, 0, sizeof names);
    iv = (qk__prof_kiv *)qk__prof_calloc(f->n_acts + 1, sizeof *iv);
    if (!iv) return;
    for (i = 0; i < f->n_acts; i++) {
        const qk_prof_activity *x = &f->acts[i];
        double d = x->end_ns - x->start_ns;
        if (x->kind != QK_PROF_ACT_KERNEL) continue;
        nk++;
        if (d >= c->short_kernel_ns) continue;
        ns++;
        sdur += d;
        if (x->api_ns > 0) { api += x->api_ns; na++; }
        qk__prof_tally_add(&names, x->name, 1);
        iv[o].key = (double)x->device * 4294967296.0 + (double)x->stream;
        iv[o].t0 = x->start_ns;
        iv[o++].t1 = x->end_ns;
    }
    if (!ns || (double)ns < c->launch_min_kernels || (double)ns < c->launch_min_share * (double)nk) { QK_PROF_FREE(iv); return; }
    qsort(iv, o, sizeof *iv, qk__prof_kiv_cmp);
    for (i = 1; i < o; i++) { /* consecutive short kernels of one stream, closer than 5 short kernels */
        double g = iv[i].t0 - iv[i - 1].t1;
        if (iv[i].key == iv[i - 1].key && g >= 0 && g < 5 * c->short_kernel_ns) { gaps += g; ng++; }
    }
    QK_PROF_FREE(iv);
    if (f->n_steps > 0) qk__prof_spf(extra, sizeof extra, "; %.0f short kernels per step", (double)ns / (double)f->n_steps);
    if (na) qk__prof_spf(extra + strlen(extra), sizeof extra - strlen(extra), "; each launch call took the host %s",
                         qk__prof_time(api / (double)na, b4, sizeof b4));
    if (!(a = qk__prof_adv_new(L, "launch-bound", gaps))) return;
    qk__prof_spf(a->where, sizeof a->where, "kernel %.120s", qk__prof_tally_top(&names));
    qk__prof_spf(a->evidence, sizeof a->evidence, "%llu of %llu kernels ran shorter than %s (mean %s); between consecutive "
                 "short kernels on a stream the GPU waited %s on average, %s in all: the launch overhead%s", ns, nk,
                 qk__prof_time(c->short_kernel_ns, b1, sizeof b1), qk__prof_time(sdur / (double)ns, b2, sizeof b2),
                 qk__prof_time(ng ? gaps / (double)ng : 0.0, b3, sizeof b3), qk__prof_time(gaps, b4, sizeof b4), extra);
    qk__prof_spf(a->fix, sizeof a->fix, "Launch the step's kernels as one CUDA graph (capture them once with "
                 "cudaStreamBeginCapture / cudaStreamEndCapture, then cudaGraphLaunch every step), or fuse the small "
                 "kernels into fewer, larger ones: each launch costs microseconds of host and GPU time whatever it does.");
}

/* Rule serialized-copy: a stream that carries both copies (host <-> device) and kernels, where
   kernels on the device's other streams overlap at most serial_max_overlap of the copy time: the
   copies and the kernels take turns. */
static void qk__prof_rule_serial(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    double t0, t1;
    size_t i;
    uint32_t done[64];
    int dev, nd = 0;
    if (c->serial_min_copy_share < 0) return;
    qk__prof_loop(f, c, &t0, &t1);
    for (i = 0; i < f->n_acts && nd < 64; i++) {
        const qk_prof_activity *x = &f->acts[i];
        double cp = 0, ov = 0, kt;
        unsigned long long nc = 0, nkr = 0, bytes = 0;
        size_t nk, no, j;
        double *k, *o;
        int seen = 0;
        char b1[32], b2[32], b3[32], lb[96];
        qk_prof_advice *a;
        if (x->kind != QK_PROF_ACT_MEMCPY || (x->dir != QK_PROF_H2D && x->dir != QK_PROF_D2H)) continue;
        for (j = 0; j < (size_t)nd; j++) if (done[j] == x->stream) seen = 1;
        if (seen) continue;
        done[nd++] = x->stream;
        dev = x->device;
        k = qk__prof_work(f, dev, 0, x->stream, 1, 0, t0, t1, &nk);
        o = qk__prof_work(f, dev, 0, x->stream, 1, 1, t0, t1, &no);
        if (k && o) {
            kt = qk__prof_len(k, nk);
            for (j = 0; j < f->n_acts; j++) {
                const qk_prof_activity *y = &f->acts[j];
                if (y->kind == QK_PROF_ACT_KERNEL || y->kind == QK_PROF_ACT_ZONE) {
                    if (y->device == dev && y->stream == x->stream && y->end_ns > t0 && y->start_ns < t1) nkr++;
                    continue;
                }
                if (y->kind != QK_PROF_ACT_MEMCPY || (y->dir != QK_PROF_H2D && y->dir != QK_PROF_D2H) || y->device != dev ||
                    y->stream != x->stream || y->end_ns <= t0 || y->start_ns >= t1)
                    continue;
                nc++;
                bytes += y->bytes;
                cp += y->end_ns - y->start_ns;
                ov += qk__prof_cover(o, no, y->start_ns, y->end_ns);
            }
            if (nc >= 2 && nkr && cp > 0 && cp >= c->serial_min_copy_share * (cp + kt) && ov <= c->serial_max_overlap * cp &&
                (a = qk__prof_adv_new(L, "serialized-copy", cp - ov))) {
                qk__prof_spf(a->where, sizeof a->where, "%s", qk__prof_stream_label(f, dev, x->stream, lb, sizeof lb));
                qk__prof_spf(a->evidence, sizeof a->evidence, "%llu copies (%s, %s) and %llu kernels (%s) run on this one "
                             "stream; kernels on other streams ran during %.1f %% of the copy time: the copies and the "
                             "kernels take turns", nc, qk__prof_bytes((double)bytes, b1, sizeof b1),
                             qk__prof_time(cp, b2, sizeof b2), nkr, qk__prof_time(kt, b3, sizeof b3), 100.0 * ov / cp);
                qk__prof_spf(a->fix, sizeof a->fix, "Give the copies a stream of their own, with pinned host buffers, and "
                             "order them with events (cudaEventRecord / cudaStreamWaitEvent), double-buffered, so one step's "
                             "copy runs while the next step's kernels do.");
            }
        }
        QK_PROF_FREE(k);
        QK_PROF_FREE(o);
    }
}

/* Rule memory-growth: tracked device or host memory, or the device memory in use, larger at the
   end of step after step (a leak, or a buffer that grows every step). */
static void qk__prof_rule_growth(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    static const char *const what[3] = { "tracked device memory (QK_PROF_TRACK)", "tracked host memory (QK_PROF_TRACK)",
                                         "device memory in use (QK_PROF_MEM_SNAPSHOT)" };
    int k;
    if (c->leak_min_bytes < 0 || f->n_steps < 4 || (double)f->n_steps < c->min_steps || !f->n_mem) return;
    for (k = 0; k < 3; k++) {
        size_t s, m = 0;
        double first = 0, last = 0, prev = 0;
        unsigned long long vals = 0, up = 0;
        int have = 0;
        char b1[32], b2[32], b3[32];
        qk_prof_advice *a;
        for (s = 0; s < f->n_steps; s++) {
            double v = 0;
            int got = 0;
            for (; m < f->n_mem && f->mem[m].t_ns <= f->steps[s].t1_ns; m++) {
                double x = k == 0 ? f->mem[m].device : k == 1 ? f->mem[m].host : f->mem[m].device_used;
                if (k == 2 && x < 0) continue;
                v = x; got = 1; have = 1;
            }
            if (!got) { if (!have) continue; v = prev; } /* no new sample in this step: unchanged */
            if (!vals) first = v;
            else if (v > prev) up++;
            prev = last = v;
            vals++;
        }
        if (vals < 4 || last - first < c->leak_min_bytes || last - first <= 0 ||
            (double)up < c->leak_min_step_share * (double)(vals - 1))
            continue;
        if (!(a = qk__prof_adv_new(L, "memory-growth", 0))) return;
        qk__prof_spf(a->where, sizeof a->where, "%s", what[k]);
        qk__prof_spf(a->evidence, sizeof a->evidence, "grew from %s to %s over %llu steps of \"%.60s\" (%s per step), larger "
                     "at the end of %llu of %llu steps", qk__prof_bytes(first, b1, sizeof b1), qk__prof_bytes(last, b2, sizeof b2),
                     vals, f->step_zone ? f->step_zone : "steps", qk__prof_bytes((last - first) / (double)(vals - 1), b3, sizeof b3),
                     up, vals - 1);
        qk__prof_spf(a->fix, sizeof a->fix, "Free what each step allocates (cudaFree / free, and QK_PROF_UNTRACK) or "
                     "allocate once before the loop and reuse it; a stream-ordered pool (cudaMallocAsync / cudaFreeAsync) "
                     "recycles per-step buffers. A buffer meant to grow (a tally) can be ignored here.");
    }
}

/* The step times (ns) after the first step_skip steps, into a new array (caller frees); *n the
   count, *first the index of the first. NULL when there are none. */
static double *qk__prof_step_times(const qk_prof_facts *f, const qk_prof_advice_cfg *c, size_t *n, size_t *first)
{
    size_t skip = c->step_skip > 0 ? (size_t)c->step_skip : 0, i;
    double *d;
    *n = 0;
    *first = skip;
    if (f->n_steps <= skip) return NULL;
    d = (double *)QK_PROF_MALLOC((f->n_steps - skip) * sizeof *d);
    if (!d) return NULL;
    for (i = skip; i < f->n_steps; i++) d[i - skip] = f->steps[i].t1_ns - f->steps[i].t0_ns;
    *n = f->n_steps - skip;
    return d;
}

/* Rule step-outliers: a heavy tail of the step time (p99 / p50 at least tail_ratio): some steps
   take much longer than the typical one. The slow steps are listed, and their period where they
   recur at a fixed interval (output, checkpoints, a rebuild every k steps). */
static void qk__prof_rule_outliers(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    size_t n, first, i, no = 0, period = 0;
    double *d, *sorted, p50, p95, p99, excess = 0, worst = 0;
    long worst_i = -1, prev = -1;
    int regular = 1;
    char b1[32], b2[32], b3[32], b4[32], b5[32], list[120] = "", per[48] = "";
    qk_prof_advice *a;
    if (c->tail_ratio < 0 || (double)f->n_steps < c->min_steps) return;
    if (!(d = qk__prof_step_times(f, c, &n, &first))) return;
    if (n < 10 || !(sorted = (double *)QK_PROF_MALLOC(n * sizeof *sorted))) { QK_PROF_FREE(d); return; }
    memcpy(sorted, d, n * sizeof *d);
    qsort(sorted, n, sizeof *sorted, qk__prof_dcmp);
    p50 = qk__prof_quantile(sorted, (int64_t)n, 50);
    p95 = qk__prof_quantile(sorted, (int64_t)n, 95);
    p99 = qk__prof_quantile(sorted, (int64_t)n, 99);
    QK_PROF_FREE(sorted);
    if (!(p50 > 0) || p99 < c->tail_ratio * p50) { QK_PROF_FREE(d); return; }
    for (i = 0; i < n; i++) {
        if (d[i] < c->tail_ratio * p50) continue;
        excess += d[i] - p50;
        if (d[i] > worst) { worst = d[i]; worst_i = (long)(i + first); }
        if (prev >= 0) {
            size_t gap = (size_t)((long)(i + first) - prev);
            if (period && gap != period) regular = 0;
            period = gap;
        }
        if (no < 8) qk__prof_spf(list + strlen(list), sizeof list - strlen(list), "%s%zu", no ? ", " : "", i + first);
        prev = (long)(i + first);
        no++;
    }
    QK_PROF_FREE(d);
    if (no > 8) qk__prof_spf(list + strlen(list), sizeof list - strlen(list), ", ...");
    if (no >= 3 && regular) qk__prof_spf(per, sizeof per, ", every %zu steps", period);
    if (!(a = qk__prof_adv_new(L, "step-outliers", excess))) return;
    qk__prof_spf(a->where, sizeof a->where, "the steps of \"%.80s\", the slowest step %ld", f->step_zone ? f->step_zone : "steps",
                 worst_i);
    qk__prof_spf(a->evidence, sizeof a->evidence, "over %zu steps (the first %zu left out) the step time has p50 %s, p95 %s, "
                 "p99 %s: p99 / p50 = %.2f; %zu steps took %.2f times the p50 or more (steps %s%s), the slowest %s; they "
                 "cost %s beyond the typical step", n, first, qk__prof_time(p50, b1, sizeof b1), qk__prof_time(p95, b2, sizeof b2),
                 qk__prof_time(p99, b3, sizeof b3), p99 / p50, no, c->tail_ratio, list, per, qk__prof_time(worst, b4, sizeof b4),
                 qk__prof_time(excess, b5, sizeof b5));
    qk__prof_spf(a->fix, sizeof a->fix, "Open the trace at the slow steps and find what they do that the others do not: "
                 "periodic work (output, checkpoints, a rebuild or rebalance every k steps: make it asynchronous or spread "
                 "it), allocations or first-use costs inside the step (allocate before the loop), a wait that sometimes "
                 "blocks, or other processes on the cores (pin the threads).");
}

/* Rule step-drift: the step time grows over the loop: the median step of the last third longer
   than the median of the first third by drift_min_growth (medians: one slow step does not make a
   drift), with the least-squares trend per step. */
static void qk__prof_rule_drift(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    size_t n, first, i, k;
    double *d, *t, m0, m1, xm, ym = 0, sxy = 0, sxx = 0, slope, excess = 0;
    char b1[32], b2[32], b3[32], b4[32];
    qk_prof_advice *a;
    if (c->drift_min_growth < 0 || (double)f->n_steps < c->min_steps) return;
    if (!(d = qk__prof_step_times(f, c, &n, &first))) return;
    k = n / 3;
    if (n < 9 || !(t = (double *)QK_PROF_MALLOC(k * sizeof *t))) { QK_PROF_FREE(d); return; }
    memcpy(t, d, k * sizeof *t);
    qsort(t, k, sizeof *t, qk__prof_dcmp);
    m0 = qk__prof_quantile(t, (int64_t)k, 50);
    memcpy(t, d + n - k, k * sizeof *t);
    qsort(t, k, sizeof *t, qk__prof_dcmp);
    m1 = qk__prof_quantile(t, (int64_t)k, 50);
    QK_PROF_FREE(t);
    xm = (double)(n - 1) / 2;
    for (i = 0; i < n; i++) ym += d[i] / (double)n;
    for (i = 0; i < n; i++) {
        sxy += ((double)i - xm) * (d[i] - ym);
        sxx += ((double)i - xm) * ((double)i - xm);
        if (d[i] > m0) excess += d[i] - m0;
    }
    QK_PROF_FREE(d);
    slope = sxx > 0 ? sxy / sxx : 0;
    if (!(m0 > 0) || m1 < (1 + c->drift_min_growth) * m0 || slope <= 0) return;
    if (!(a = qk__prof_adv_new(L, "step-drift", excess))) return;
    qk__prof_spf(a->where, sizeof a->where, "the steps of \"%.80s\"", f->step_zone ? f->step_zone : "steps");
    qk__prof_spf(a->evidence, sizeof a->evidence, "over %zu steps (the first %zu left out) the median step grew from %s (first "
                 "third) to %s (last third), +%.0f %%; least-squares trend %s per step (%+.3f %% of the mean step per step); "
                 "the steps slower than the first third's median cost %s beyond it", n, first, qk__prof_time(m0, b1, sizeof b1),
                 qk__prof_time(m1, b2, sizeof b2), 100.0 * (m1 / m0 - 1), qk__prof_time(slope, b3, sizeof b3),
                 ym > 0 ? 100.0 * slope / ym : 0.0, qk__prof_time(excess, b4, sizeof b4));
    qk__prof_spf(a->fix, sizeof a->fix, "Find the zone whose time grows (the trend column of the Steps table): work that "
                 "grows with the run (a list, a tally or a neighbour structure that is never pruned or rebuilt, a log "
                 "searched every step), memory that grows and fragments, particles piling up in one region (sort or "
                 "rebalance them), or a device that throttles (its clocks and temperature).");
}

/* The imbalance of the rows of one kind (threads, or ranks over n_ranks with absent ranks 0): per
   zone (and kind) the largest total against the mean. */
static void qk__prof_imbalance(const qk_prof_facts *f, const qk_prof_zone_part *rows, size_t nr, int ranks, double ratio,
                               double min_share, qk__prof_advlist *L)
{
    unsigned char *done;
    size_t i, j;
    if (ratio < 0 || !rows || nr < 2 || (ranks && f->n_ranks < 2)) return;
    if (!(done = (unsigned char *)qk__prof_calloc(nr, 1))) return;
    for (i = 0; i < nr; i++) {
        double sum = 0, max = -1, min = 1e300, mean;
        size_t parts = 0, imax = i;
        char b1[32], b2[32], b3[32], b4[32], b5[32], who[96];
        qk_prof_advice *a;
        if (done[i] || !rows[i].zone) continue;
        for (j = i; j < nr; j++) {
            const qk_prof_zone_part *r = &rows[j];
            if (done[j] || !r->zone || r->gpu != rows[i].gpu || strcmp(r->zone, rows[i].zone) != 0) continue;
            done[j] = 1;
            parts++;
            sum += r->total_ns;
            if (r->total_ns > max) { max = r->total_ns; imax = j; }
            if (r->total_ns < min) min = r->total_ns;
        }
        if (ranks) { if ((int)parts < f->n_ranks) min = 0; parts = (size_t)f->n_ranks; }
        else if (parts < 2) continue;
        mean = sum / (double)parts;
        if (!(mean > 0) || max < ratio * mean || max - mean < min_share * f->wall_ns) continue;
        if (!(a = qk__prof_adv_new(L, ranks ? "rank-imbalance" : "thread-imbalance", max - mean))) break;
        if (ranks) qk__prof_spf(who, sizeof who, "rank %d", rows[imax].index);
        else if (rows[imax].label && rows[imax].label[0]) qk__prof_spf(who, sizeof who, "thread \"%.60s\"", rows[imax].label);
        else qk__prof_spf(who, sizeof who, "thread %d", rows[imax].index);
        qk__prof_spf(a->where, sizeof a->where, "%s zone \"%.100s\", slowest on %s", rows[i].gpu ? "GPU" : "CPU", rows[i].zone, who);
        qk__prof_spf(a->evidence, sizeof a->evidence, "its total time on the %zu %s%s: min %s, mean %s, max %s (%s): max / mean "
                     "= %.2f; the slowest is %s (%.1f %% of the wall %s) beyond the mean", parts, ranks ? "ranks" : "threads",
                     ranks ? " (a rank without it counts 0)" : " that ran it", qk__prof_time(min, b1, sizeof b1),
                     qk__prof_time(mean, b2, sizeof b2), qk__prof_time(max, b3, sizeof b3), who, max / mean,
                     qk__prof_time(max - mean, b4, sizeof b4), f->wall_ns > 0 ? 100.0 * (max - mean) / f->wall_ns : 0.0,
                     qk__prof_time(f->wall_ns, b5, sizeof b5));
        if (ranks)
            qk__prof_spf(a->fix, sizeof a->fix, "The other ranks wait for the slowest at the next collective or exchange: "
                         "balance the decomposition by work, not by size (weight cells or particles by their cost, "
                         "repartition every few steps), or overlap the wait with independent work. A zone only some "
                         "ranks run (output on rank 0) is imbalanced by design: move it off the critical path.");
        else
            qk__prof_spf(a->fix, sizeof a->fix, "The threads that finish first wait for the slowest at the next join or "
                         "barrier: split the work in more, smaller pieces handed out dynamically (a work queue, OpenMP "
                         "schedule(dynamic) or guided), or weight the static split by cost.");
    }
    QK_PROF_FREE(done);
}

/* Rule thread-imbalance: a CPU zone that several threads run, with one thread's total far above
   the mean over those threads. */
static void qk__prof_rule_threads(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    qk__prof_imbalance(f, f->threads, f->n_threads, 0, c->thread_imbalance, c->imbalance_min_share, L);
}

/* Rule rank-imbalance (the MPI report): a zone whose total on one rank is far above the mean over
   all ranks. */
static void qk__prof_rule_ranks(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    qk__prof_imbalance(f, f->ranks, f->n_ranks_rows, 1, c->rank_imbalance, c->imbalance_min_share, L);
}

typedef void (*qk__prof_rule_fn)(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L);
static const struct { const char *id; qk__prof_rule_fn fn; } qk__prof_rules[] = {
    { "pageable-copy", qk__prof_rule_pageable },
    { "sync-in-loop", qk__prof_rule_sync },
    { "gpu-idle", qk__prof_rule_idle },
    { "launch-bound", qk__prof_rule_launch },
    { "serialized-copy", qk__prof_rule_serial },
    { "memory-growth", qk__prof_rule_growth },
    { "step-outliers", qk__prof_rule_outliers },
    { "step-drift", qk__prof_rule_drift },
    { "thread-imbalance", qk__prof_rule_threads },
    { "rank-imbalance", qk__prof_rule_ranks },
    /* a new rule: its function above, a line here, a row in docs/profiler.md's table */
};
#define QK__PROF_NRULES ((int)(sizeof qk__prof_rules / sizeof qk__prof_rules[0]))

static int qk__prof_adv_cmp(const void *x, const void *y)
{
    const qk_prof_advice *a = (const qk_prof_advice *)x, *b = (const qk_prof_advice *)y;
    return a->impact_ns < b->impact_ns ? 1 : a->impact_ns > b->impact_ns ? -1 : strcmp(a->rule, b->rule);
}

/* Runs every rule; the list (caller frees items) sorted by impact, largest first. */
static void qk__prof_advise_all(const qk_prof_facts *f, const qk_prof_advice_cfg *c, qk__prof_advlist *L)
{
    int r;
    memset(L, 0, sizeof *L);
    for (r = 0; r < QK__PROF_NRULES; r++) qk__prof_rules[r].fn(f, c, L);
    if (L->n > 1) qsort(L->items, (size_t)L->n, sizeof *L->items, qk__prof_adv_cmp);
}

QK_PROF_DEF int qk_prof_advise(const qk_prof_facts *facts, const qk_prof_advice_cfg *cfg, qk_prof_advice *out, int max)
{
    qk_prof_advice_cfg c;
    qk__prof_advlist L;
    char sz[8];
    int n;
    if (!facts) { qk__prof_seterr("qk_prof_advise: no facts"); return -1; }
    qk__prof_adv_cfg(cfg, &c, 0, sz, sizeof sz);
    qk__prof_advise_all(facts, &c, &L);
    n = L.n;
    if (out && max > 0 && n > 0 && L.items) memcpy(out, L.items, (size_t)(n < max ? n : max) * sizeof *out);
    QK_PROF_FREE(L.items);
    return n;
}

#ifdef QK_PROF_MPI
static int qk__prof_adv_ranks(const qk_prof_zone_part *rows, size_t n, int ranks, double wall, qk_prof_advice **out)
{
    qk_prof_facts f;
    qk_prof_advice_cfg c;
    qk__prof_advlist L;
    char sz[96];
    memset(&f, 0, sizeof f);
    f.ranks = rows;
    f.n_ranks_rows = n;
    f.n_ranks = ranks;
    f.wall_ns = wall;
    qk__prof_adv_cfg(&qk__prof_g.desc.advice, &c, 1, sz, sizeof sz);
    memset(&L, 0, sizeof L);
    qk__prof_rule_ranks(&f, &c, &L);
    if (L.n > 1) qsort(L.items, (size_t)L.n, sizeof *L.items, qk__prof_adv_cmp);
    *out = L.items;
    return L.n;
}
#endif

/* ---- the activities and the advice of this run, for the reports ---- */
typedef struct qk__prof_aview {
    qk_prof_activity *acts;
    size_t n_acts;
    size_t n_store;              /* the first n_store of acts: the store's records (CUPTI, injected); then GPU zones */
    qk_prof_span *steps;
    size_t n_steps;
    qk_prof_mem_sample *mem;
    size_t n_mem;
    qk_prof_stream_label streams[QK_PROF_MAX_LANES];
    size_t n_streams;
    char step_zone[96];
    char env_step[96];
    qk_prof_facts facts;
    qk_prof_advice_cfg cfg;
    qk__prof_advlist adv;
    /* the exact tables */
    qk__prof_aname *names;       /* kernels, by total time; name strings borrowed from the store */
    const char **name_zone;      /* the zone most of a kernel name's kept launches came from */
    int *name_zones;             /* how many zones they came from */
    int n_names;
    qk__prof_astat copies[5][6][6], memsets, syncs, runtime;
    uint64_t kernels, kept, dropped, dropped_cupti, incomplete, dropped_corr, dropped_names;
    int state, asked, cupti_kernels, cupti_copies;
    char status[320];
} qk__prof_aview;

static int qk__prof_corr_cmp(const void *x, const void *y)
{
    uint32_t a = ((const qk__prof_corr *)x)->corr, b = ((const qk__prof_corr *)y)->corr;
    return a < b ? -1 : a > b;
}

static uint32_t qk__prof_corr_find(const qk__prof_corr *c, int n, uint32_t corr)
{
    int lo = 0, hi = n;
    while (lo < hi) { int mid = (lo + hi) / 2; if (c[mid].corr < corr) lo = mid + 1; else hi = mid; }
    return lo < n && c[lo].corr == corr ? c[lo].ext : 0;
}

static int qk__prof_aname_cmp(const void *x, const void *y)
{
    int64_t a = ((const qk__prof_aname *)x)->total, b = ((const qk__prof_aname *)y)->total;
    return a < b ? 1 : a > b ? -1 : 0;
}

typedef struct qk__prof_nz { const char *name, *zone; } qk__prof_nz;
static int qk__prof_nz_cmp(const void *x, const void *y)
{
    const qk__prof_nz *a = (const qk__prof_nz *)x, *b = (const qk__prof_nz *)y;
    int c = a->name < b->name ? -1 : a->name > b->name;
    return c ? c : (a->zone < b->zone ? -1 : a->zone > b->zone);
}

static int qk__prof_span_cmp(const void *x, const void *y)
{
    double a = ((const qk_prof_span *)x)->t0_ns, b = ((const qk_prof_span *)y)->t0_ns;
    return a < b ? -1 : a > b;
}

static int qk__prof_mem_cmp(const void *x, const void *y)
{
    double a = ((const qk_prof_mem_sample *)x)->t_ns, b = ((const qk_prof_mem_sample *)y)->t_ns;
    return a < b ? -1 : a > b;
}

/* The steps: the spans of the step zone (cfg.step_zone, or the top-level CPU zone with the most
   calls, at least min_steps), from the kept events of every thread. */
static void qk__prof_aview_steps(const qk__prof_model *m, qk__prof_aview *v)
{
    qk__prof_thread *t;
    uint64_t *cnt = (uint64_t *)qk__prof_calloc(QK_PROF_MAX_SITES, sizeof *cnt);
    const char *best = v->cfg.step_zone;
    size_t n = 0, cap = 0;
    if (!cnt) return;
    if (!best) {
        uint64_t bn = 0;
        uint32_t i, j;
        for (t = qk__prof_g.threads; t; t = t->next) {
            size_t ne = qk__prof_count(t), e;
            for (e = 0; e < ne; e++) {
                const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
                if (!QK__PROF_KIND(ev) && QK__PROF_DEPTH(ev) == 0) cnt[QK__PROF_SITE(ev) % QK_PROF_MAX_SITES]++;
            }
        }
        for (i = 1; i < QK_PROF_MAX_SITES; i++) { /* sites of one name count together */
            uint64_t s = 0;
            if (!cnt[i]) continue;
            for (j = i; j < QK_PROF_MAX_SITES; j++)
                if (cnt[j] && strcmp(qk__prof_site_name(j), qk__prof_site_name(i)) == 0) { s += cnt[j]; if (j != i) cnt[j] = 0; }
            if (s > bn) { bn = s; best = qk__prof_site_name(i); }
        }
        if ((double)bn < v->cfg.min_steps) best = NULL;
    }
    QK_PROF_FREE(cnt);
    if (!best) return;
    qk__prof_copy(v->step_zone, sizeof v->step_zone, best);
    for (t = qk__prof_g.threads; t; t = t->next) {
        size_t ne = qk__prof_count(t), e;
        for (e = 0; e < ne; e++) {
            const qk__prof_ev *ev = &t->chunks[e / QK__PROF_CHUNK][e % QK__PROF_CHUNK];
            if (QK__PROF_KIND(ev) || strcmp(qk__prof_site_name(QK__PROF_SITE(ev)), v->step_zone) != 0) continue;
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 256;
                void *np = QK_PROF_REALLOC(v->steps, nc * sizeof *v->steps);
                if (!np) break;
                v->steps = (qk_prof_span *)np;
                cap = nc;
            }
            v->steps[n].t0_ns = (double)(int64_t)(ev->t0 - m->t0) * m->npt;
            v->steps[n].t1_ns = (double)(int64_t)(ev->t1 - m->t0) * m->npt;
            n++;
        }
    }
    if (n > 1) qsort(v->steps, n, sizeof *v->steps, qk__prof_span_cmp);
    v->n_steps = n;
}

/* The memory samples: every change of the tracked totals, and the snapshots (device in use). */
static void qk__prof_aview_mem(const qk__prof_model *m, qk__prof_aview *v)
{
    size_t k, n = 0;
    pthread_mutex_lock(&qk__prof_mu);
    v->mem = (qk_prof_mem_sample *)QK_PROF_MALLOC((qk__prof_g.n_mseries + (size_t)qk__prof_g.n_snaps + 1) * sizeof *v->mem);
    if (v->mem) {
        for (k = 0; k < qk__prof_g.n_mseries; k++) {
            const qk__prof_mpoint *p = &qk__prof_g.mseries[k];
            v->mem[n].t_ns = (double)(int64_t)(p->t - m->t0) * m->npt;
            v->mem[n].host = p->host;
            v->mem[n].device = p->device;
            v->mem[n++].device_used = -1;
        }
        for (k = 0; k < (size_t)qk__prof_g.n_snaps; k++) {
            const qk__prof_snap *s = &qk__prof_g.snaps[k];
            if (s->is_pool) continue;
            v->mem[n].t_ns = (double)(int64_t)(s->t - m->t0) * m->npt;
            v->mem[n].host = s->host_tracked;
            v->mem[n].device = s->device_tracked;
            v->mem[n++].device_used = s->dev_total >= 0 ? s->dev_total - s->dev_free : -1;
        }
        qsort(v->mem, n, sizeof *v->mem, qk__prof_mem_cmp);
        v->n_mem = n;
    }
    pthread_mutex_unlock(&qk__prof_mu);
}

/* The GPU zones of the macros as activities, where CUPTI gave no kernels (zones) or no copies
   (the zones of QK_PROF_MEMCPY): stream ids 0x40000000 + lane. */
static void qk__prof_aview_zones(const qk__prof_model *m, qk__prof_aview *v, int kernels, int copies)
{
    qk__prof_thread *t;
    size_t cap = v->n_acts, r;
    for (t = qk__prof_g.threads; t; t = t->next) {
        qk__prof_gthread *g = __atomic_load_n(&t->gpu, __ATOMIC_ACQUIRE);
        if (!g) continue;
        pthread_mutex_lock(&g->mu);
        for (r = 0; r < g->n_recs; r++) {
            const qk__prof_grec *gr = &g->recs[r];
            qk_prof_activity *a;
            int pin = gr->pinned ? QK_PROF_MEMK_PINNED : QK_PROF_MEMK_PAGEABLE;
            if (gr->dir ? !copies : !kernels) continue;
            if (v->n_acts == cap) {
                size_t nc = cap ? cap * 2 : 1024;
                void *np = QK_PROF_REALLOC(v->acts, nc * sizeof *v->acts);
                if (!np) break;
                v->acts = (qk_prof_activity *)np;
                cap = nc;
            }
            a = &v->acts[v->n_acts++];
            memset(a, 0, sizeof *a);
            a->kind = gr->dir ? QK_PROF_ACT_MEMCPY : QK_PROF_ACT_ZONE;
            a->name = qk__prof_site_name(gr->site);
            a->start_ns = qk__prof_gabs(m, gr);
            a->end_ns = a->start_ns + gr->dur_ns;
            a->device = qk__prof_g.lanes[gr->lane].device;
            a->stream = 0x40000000u + gr->lane;
            a->bytes = gr->bytes;
            a->dir = gr->dir;
            a->src_kind = gr->dir == QK_PROF_H2D || gr->dir == QK_PROF_H2H ? pin : QK_PROF_MEMK_DEVICE;
            a->dst_kind = gr->dir == QK_PROF_D2H || gr->dir == QK_PROF_H2H ? pin : QK_PROF_MEMK_DEVICE;
        }
        pthread_mutex_unlock(&g->mu);
    }
    for (r = 0; r < (size_t)m->n_lanes && v->n_streams < QK_PROF_MAX_LANES; r++) {
        qk_prof_stream_label *s = &v->streams[v->n_streams++];
        s->device = m->lanes[r].device;
        s->stream = 0x40000000u + (uint32_t)r;
        s->name = m->lanes[r].name;
    }
}

static void qk__prof_aview_free(qk__prof_aview *v)
{
    QK_PROF_FREE(v->acts);
    QK_PROF_FREE(v->steps);
    QK_PROF_FREE(v->mem);
    QK_PROF_FREE(v->adv.items);
    QK_PROF_FREE(v->names);
    QK_PROF_FREE(v->name_zone);
    QK_PROF_FREE(v->name_zones);
    memset(v, 0, sizeof *v);
}

/* Everything the activity tables and the advice need, copied out of the store (CUPTI's thread may
   be adding records meanwhile), times mapped onto the profiler's timeline. */
static void qk__prof_aview_build(const qk__prof_model *m, qk__prof_aview *v)
{
    qk__prof_actstore *A = &qk__prof_act;
    qk__prof_corr *corrs = NULL, *api = NULL;
    int nc = 0, na = 0, i;
    double base = 0, scale = 1;
    size_t k;
    memset(v, 0, sizeof *v);
    qk__prof_adv_cfg(&qk__prof_g.desc.advice, &v->cfg, 1, v->env_step, sizeof v->env_step);
    pthread_mutex_lock(&A->mu);
    v->state = A->state;
    v->asked = A->asked;
    qk__prof_copy(v->status, sizeof v->status, qk_prof_cupti_status());
    memcpy(v->copies, A->copies, sizeof v->copies);
    v->memsets = A->memsets; v->syncs = A->syncs; v->runtime = A->runtime;
    v->kernels = A->kernels; v->kept = A->n; v->dropped = A->dropped; v->dropped_cupti = A->dropped_cupti;
    v->incomplete = A->incomplete; v->dropped_corr = A->dropped_corr; v->dropped_names = A->dropped_names;
    /* CUPTI's clock onto the profiler's: two (timestamp, tick) pairs, at start and at the last flush */
    base = (double)(int64_t)(A->tick0 - m->t0) * m->npt;
    if (A->ts1 > A->ts0 + 50000000u && A->tick1 > A->tick0)
        scale = (double)(A->tick1 - A->tick0) * m->npt / (double)(A->ts1 - A->ts0);
    v->acts = (qk_prof_activity *)QK_PROF_MALLOC((A->n + 1) * sizeof *v->acts);
    if (A->n_corrs > 0) corrs = (qk__prof_corr *)QK_PROF_MALLOC((size_t)A->n_corrs * sizeof *corrs);
    if (corrs) { memcpy(corrs, A->corrs, (size_t)A->n_corrs * sizeof *corrs); nc = A->n_corrs; }
    if (A->runtime.n) api = (qk__prof_corr *)QK_PROF_MALLOC(A->n * sizeof *api);
    v->names = (qk__prof_aname *)QK_PROF_MALLOC(((size_t)A->n_names + 1) * sizeof *v->names);
    if (v->names) {
        for (i = 0; i < A->n_names; i++)
            if (A->names[i].n) v->names[v->n_names++] = A->names[i];
    }
    if (v->acts) {
        for (k = 0; k < A->n; k++) {
            const qk__prof_arec *r = &A->recs[k];
            qk_prof_activity *a = &v->acts[v->n_acts++];
            memset(a, 0, sizeof *a);
            a->kind = r->kind;
            a->name = r->name ? A->names[r->name - 1].name : NULL;
            a->zone = r->zone ? A->names[r->zone - 1].name : NULL;
            if (r->inj) { a->start_ns = (double)r->t0; a->end_ns = (double)r->t1; }
            else {
                a->start_ns = base + (double)(r->t0 - (int64_t)A->ts0) * scale;
                a->end_ns = base + (double)(r->t1 - (int64_t)A->ts0) * scale;
            }
            a->device = r->device;
            a->stream = r->stream;
            a->correlation = r->corr;
            memcpy(a->grid, r->grid, sizeof a->grid);
            memcpy(a->block, r->block, sizeof a->block);
            a->shared_bytes = r->shmem;
            a->registers = r->regs;
            a->bytes = r->bytes;
            a->dir = r->dir;
            a->src_kind = r->srck;
            a->dst_kind = r->dstk;
            a->sync = r->sync;
            if (!r->inj && r->kind == QK_PROF_ACT_KERNEL) v->cupti_kernels = 1;
            if (!r->inj && r->kind == QK_PROF_ACT_MEMCPY) v->cupti_copies = 1;
            if (api && r->kind == QK_PROF_ACT_RUNTIME) { api[na].corr = r->corr; api[na++].ext = (uint32_t)(r->t1 - r->t0); }
        }
    }
    pthread_mutex_unlock(&A->mu);
    /* zones of the CUPTI records (their correlation ids), launch times of the kernels */
    if (corrs) qsort(corrs, (size_t)nc, sizeof *corrs, qk__prof_corr_cmp);
    if (api) qsort(api, (size_t)na, sizeof *api, qk__prof_corr_cmp);
    for (k = 0; k < v->n_acts; k++) {
        qk_prof_activity *a = &v->acts[k];
        uint32_t ext;
        if (!a->zone && a->correlation && corrs && (ext = qk__prof_corr_find(corrs, nc, a->correlation)) != 0)
            a->zone = qk__prof_site_name(ext);
        if (api && a->kind == QK_PROF_ACT_KERNEL) a->api_ns = (double)qk__prof_corr_find(api, na, a->correlation);
    }
    QK_PROF_FREE(corrs);
    QK_PROF_FREE(api);
    /* per kernel name: the zone most of its kept launches came from, and how many zones */
    if (v->n_names) {
        qk__prof_nz *nz = (qk__prof_nz *)QK_PROF_MALLOC(((size_t)(v->n_acts > 0 ? v->n_acts : 0) + 1) * sizeof *nz);
        size_t n = 0, j;
        qsort(v->names, (size_t)v->n_names, sizeof *v->names, qk__prof_aname_cmp);
        v->name_zone = (const char **)qk__prof_calloc((size_t)v->n_names, sizeof *v->name_zone);
        v->name_zones = (int *)qk__prof_calloc((size_t)v->n_names, sizeof *v->name_zones);
        if (nz && v->name_zone && v->name_zones) {
            for (k = 0; k < v->n_acts; k++)
                if (v->acts[k].kind == QK_PROF_ACT_KERNEL && v->acts[k].name) {
                    nz[n].name = v->acts[k].name;
                    nz[n++].zone = v->acts[k].zone;
                }
            qsort(nz, n, sizeof *nz, qk__prof_nz_cmp);
            for (i = 0; i < v->n_names; i++) {
                size_t lo = 0, hi = n, best = 0;
                while (lo < hi) { size_t mid = (lo + hi) / 2; if (nz[mid].name < v->names[i].name) lo = mid + 1; else hi = mid; }
                for (j = lo; j < n && nz[j].name == v->names[i].name;) {
                    size_t e = j;
                    while (e < n && nz[e].name == nz[j].name && nz[e].zone == nz[j].zone) e++;
                    if (e - j > best) { best = e - j; v->name_zone[i] = nz[j].zone; }
                    v->name_zones[i]++;
                    j = e;
                }
            }
        }
        QK_PROF_FREE(nz);
    }
    v->n_store = v->n_acts;
    qk__prof_aview_zones(m, v, !v->cupti_kernels, !v->cupti_copies);
#ifdef QK_PROF_CUDA
    if (v->state == 1 && qk__cupti.cuptiGetStreamIdEx) { /* the names of the streams the macros named */
        int dev0 = 0;
        if (cudaGetDevice(&dev0) != cudaSuccess) cudaGetLastError();
        for (i = 0; i < m->n_lanes && v->n_streams < QK_PROF_MAX_LANES; i++) {
            uint32_t id = 0;
            if (qk__prof_g.lanes[i].device != dev0 || !qk__prof_g.lanes[i].stream) continue;
            if (qk__cupti.cuptiGetStreamIdEx(NULL, qk__prof_g.lanes[i].stream, 0, &id) != 0) continue;
            v->streams[v->n_streams].device = dev0;
            v->streams[v->n_streams].stream = id;
            v->streams[v->n_streams++].name = m->lanes[i].name;
        }
    }
#endif
    qk__prof_aview_steps(m, v);
    qk__prof_aview_mem(m, v);
    v->facts.acts = v->acts;
    v->facts.n_acts = v->n_acts;
    v->facts.steps = v->steps;
    v->facts.n_steps = v->n_steps;
    v->facts.step_zone = v->step_zone[0] ? v->step_zone : NULL;
    v->facts.mem = v->mem;
    v->facts.n_mem = v->n_mem;
    v->facts.streams = v->streams;
    v->facts.n_streams = v->n_streams;
    v->facts.wall_ns = m->wall;
    v->facts.threads = m->tz;
    v->facts.n_threads = (size_t)m->n_tz;
    qk__prof_advise_all(&v->facts, &v->cfg, &v->adv);
}

QK_PROF_DEF int qk_prof_get_advice(qk_prof_advice *out, int max)
{
    qk__prof_model m;
    qk__prof_aview v;
    int n;
    if (qk__prof_model_build(&m) != 0) return -1;
    qk__prof_aview_build(&m, &v);
    n = v.adv.n;
    if (out && max > 0 && n > 0 && v.adv.items) memcpy(out, v.adv.items, (size_t)(n < max ? n : max) * sizeof *out);
    qk__prof_aview_free(&v);
    qk__prof_model_free(&m);
    return n;
}

/* ---- the activity tables and the advice in each report ---- */
static const char *qk__prof_memk_name(int k)
{
    static const char *n[6] = { "unknown", "pageable", "pinned", "device", "array", "managed" };
    return k >= 0 && k < 6 ? n[k] : "?";
}

static const char *qk__prof_cupti_word(int state) { return state == 1 ? "on" : state < 0 ? "unavailable" : "off"; }

/* Whether the run has activities to show (CUPTI asked, or records injected). */
static int qk__prof_aview_any(const qk__prof_aview *v)
{
    return v->asked || v->kernels || v->kept || v->dropped || v->memsets.n || v->syncs.n || v->runtime.n;
}

static void qk__prof_act_text(FILE *f, qk__prof_model *m, int w)
{
    qk__prof_aview v;
    int i, d, s, k;
    char b1[32], b2[32];
    qk__prof_aview_build(m, &v);
    if (qk__prof_aview_any(&v)) {
        uint64_t nc = 0;
        for (d = 0; d < 5; d++) for (s = 0; s < 6; s++) for (k = 0; k < 6; k++) nc += v.copies[d][s][k].n;
        qk__prof_pf(f, "\nGPU activities: %llu kernels, %llu copies, %llu memsets, %llu syncs (CUPTI %s)\n",
                    (unsigned long long)v.kernels, (unsigned long long)nc, (unsigned long long)v.memsets.n,
                    (unsigned long long)v.syncs.n, v.status);
        if (v.n_names) {
            int kw = w;
            for (i = 0; i < v.n_names; i++) if ((int)strlen(v.names[i].name) > kw) kw = (int)strlen(v.names[i].name);
            if (kw > 72) kw = 72;
            qk__prof_pf(f, "\n%-*s %9s %13s %12s %12s %12s  %s\n", kw, "GPU kernels", "calls", "total ms", "mean us",
                        "min us", "max us", "zone (launched in)");
            for (i = 0; i < v.n_names; i++) {
                const qk__prof_aname *nm = &v.names[i];
                qk__prof_text_name(f, nm->name, kw);
                qk__prof_pf(f, " %9llu %13.3f %12.3f %12.3f %12.3f  ", (unsigned long long)nm->n, (double)nm->total * 1e-6,
                            (double)nm->total / (double)nm->n * 1e-3, (double)nm->min * 1e-3, (double)nm->max * 1e-3);
                {
                    const char *zn = v.name_zone && v.name_zone[i] ? v.name_zone[i] : "-";
                    qk__prof_text_name(f, zn, strlen(zn) < 48 ? (int)strlen(zn) : 48);
                }
                if (v.name_zones && v.name_zones[i] > 1) qk__prof_pf(f, " (+%d more)", v.name_zones[i] - 1);
                qk__prof_pf(f, "\n");
            }
        }
        {
            int any = 0;
            for (d = 0; d < 5; d++) for (s = 0; s < 6; s++) for (k = 0; k < 6; k++) any |= v.copies[d][s][k].n > 0;
            if (any) {
                qk__prof_pf(f, "\n%-*s %-19s %8s %12s %12s %10s\n", w, "GPU copies", "from -> to", "count", "bytes",
                            "time ms", "GB/s");
                for (d = 0; d < 5; d++) for (s = 0; s < 6; s++) for (k = 0; k < 6; k++) {
                    const qk__prof_astat *x = &v.copies[d][s][k];
                    char ft[40];
                    if (!x->n) continue;
                    qk__prof_spf(ft, sizeof ft, "%s -> %s", qk__prof_memk_name(s), qk__prof_memk_name(k));
                    qk__prof_pf(f, "%-*s %-19s %8llu %12s %12.3f %10.2f\n", w, qk__prof_dir_name(d), ft,
                                (unsigned long long)x->n, qk__prof_bytes((double)x->bytes, b1, sizeof b1),
                                (double)x->total * 1e-6, x->total > 0 ? (double)x->bytes / (double)x->total : 0.0);
                }
            }
        }
        if (v.memsets.n)
            qk__prof_pf(f, "%-*s %-19s %8llu %12s %12.3f\n", w, "GPU memsets", "", (unsigned long long)v.memsets.n,
                        qk__prof_bytes((double)v.memsets.bytes, b1, sizeof b1), (double)v.memsets.total * 1e-6);
        if (v.syncs.n)
            qk__prof_pf(f, "%-*s %-19s %8llu %12s %12.3f\n", w, "Syncs (host, stream waits)", "", (unsigned long long)v.syncs.n, "",
                        (double)v.syncs.total * 1e-6);
        if (v.runtime.n)
            qk__prof_pf(f, "%-*s %-19s %8llu %12s %12.3f\n", w, "CUDA runtime calls", "", (unsigned long long)v.runtime.n, "",
                        (double)v.runtime.total * 1e-6);
        if (v.dropped || v.dropped_cupti || v.incomplete || v.dropped_corr)
            qk__prof_pf(f, "Activity notes: records not kept %llu (the tables still count them), dropped by CUPTI %llu, "
                        "incomplete %llu, zone links dropped %llu\n", (unsigned long long)v.dropped,
                        (unsigned long long)v.dropped_cupti, (unsigned long long)v.incomplete, (unsigned long long)v.dropped_corr);
        if (v.dropped_names)
            qk__prof_pf(f, "Activity notes: names not stored (out of memory) %llu: those records are counted above, not in "
                        "the per-name table\n", (unsigned long long)v.dropped_names);
    }
    qk__prof_pf(f, "\nAdvice (%d rules on this run's records; thresholds in docs/profiler.md, QK_PROF_ADVICE)\n", QK__PROF_NRULES);
    if (!v.adv.n) qk__prof_pf(f, "(none: no rule fired)\n");
    for (i = 0; i < v.adv.n; i++) {
        const qk_prof_advice *a = &v.adv.items[i];
        qk__prof_pf(f, "%2d. [%s] %s", i + 1, a->rule, a->where);
        if (a->impact_ns > 0) qk__prof_pf(f, " (about %s at stake)", qk__prof_time(a->impact_ns, b2, sizeof b2));
        qk__prof_pf(f, "\n    evidence: %s\n    fix: %s\n", a->evidence, a->fix);
    }
    qk__prof_aview_free(&v);
}

static void qk__prof_act_json(FILE *f, qk__prof_model *m)
{
    qk__prof_aview v;
    int i, d, s, k, o = 0;
    uint64_t copies = 0;
    qk__prof_aview_build(m, &v);
    for (d = 0; d < 5; d++) for (s = 0; s < 6; s++) for (k = 0; k < 6; k++) copies += v.copies[d][s][k].n;
    qk__prof_pf(f, ",\n\"activities\":{\"cupti\":\"%s\",\"status\":", qk__prof_cupti_word(v.state));
    qk__prof_json_str(f, v.status);
    qk__prof_pf(f, ",\"kernels\":%llu,\"memcpys\":%llu,\"memsets\":%llu,\"syncs\":%llu,\"runtime\":%llu,\"kept\":%llu,"
                "\"dropped\":%llu,\"dropped_cupti\":%llu,\"incomplete\":%llu,\"dropped_zone_links\":%llu,\"dropped_names\":%llu,"
                "\n \"kernel_names\":[",
                (unsigned long long)v.kernels, (unsigned long long)copies, (unsigned long long)v.memsets.n,
                (unsigned long long)v.syncs.n, (unsigned long long)v.runtime.n, (unsigned long long)v.kept,
                (unsigned long long)v.dropped, (unsigned long long)v.dropped_cupti, (unsigned long long)v.incomplete,
                (unsigned long long)v.dropped_corr, (unsigned long long)v.dropped_names);
    for (i = 0; i < v.n_names; i++) {
        const qk__prof_aname *nm = &v.names[i];
        fputs(i ? ",\n  {\"name\":" : "\n  {\"name\":", f);
        qk__prof_json_str(f, nm->name);
        fputs(",\"mangled\":", f);
        qk__prof_json_str(f, nm->key);
        qk__prof_pf(f, ",\"calls\":%llu,\"total_ns\":%lld,\"mean_ns\":", (unsigned long long)nm->n, (long long)nm->total);
        qk__prof_json_num(f, (double)nm->total / (double)nm->n);
        qk__prof_pf(f, ",\"min_ns\":%lld,\"max_ns\":%lld,\"zone\":", (long long)nm->min, (long long)nm->max);
        if (v.name_zone && v.name_zone[i]) qk__prof_json_str(f, v.name_zone[i]);
        else fputs("null", f);
        qk__prof_pf(f, ",\"zones\":%d,\"grid\":[%d,%d,%d],\"block\":[%d,%d,%d],\"registers\":%d,\"shared_bytes\":%d}",
                    v.name_zones ? v.name_zones[i] : 0, nm->grid[0], nm->grid[1], nm->grid[2], nm->block[0], nm->block[1],
                    nm->block[2], nm->regs, nm->shmem);
    }
    fputs("],\n \"copies\":[", f);
    for (d = 0; d < 5; d++) for (s = 0; s < 6; s++) for (k = 0; k < 6; k++) {
        const qk__prof_astat *x = &v.copies[d][s][k];
        if (!x->n) continue;
        qk__prof_pf(f, "%s\n  {\"dir\":\"%s\",\"src\":\"%s\",\"dst\":\"%s\",\"count\":%llu,\"bytes\":%llu,\"time_ns\":%lld,\"gbps\":",
                    o++ ? "," : "", qk__prof_dir_name(d), qk__prof_memk_name(s), qk__prof_memk_name(k),
                    (unsigned long long)x->n, (unsigned long long)x->bytes, (long long)x->total);
        qk__prof_json_num(f, x->total > 0 ? (double)x->bytes / (double)x->total : 0.0);
        fputc('}', f);
    }
    qk__prof_pf(f, "],\n \"memset\":{\"count\":%llu,\"bytes\":%llu,\"time_ns\":%lld},\"sync\":{\"count\":%llu,\"time_ns\":%lld}},"
                "\n\"advice\":[", (unsigned long long)v.memsets.n, (unsigned long long)v.memsets.bytes,
                (long long)v.memsets.total, (unsigned long long)v.syncs.n, (long long)v.syncs.total);
    for (i = 0; i < v.adv.n; i++) {
        const qk_prof_advice *a = &v.adv.items[i];
        fputs(i ? ",\n {\"rule\":" : "\n {\"rule\":", f);
        qk__prof_json_str(f, a->rule);
        fputs(",\"where\":", f); qk__prof_json_str(f, a->where);
        fputs(",\"evidence\":", f); qk__prof_json_str(f, a->evidence);
        fputs(",\"fix\":", f); qk__prof_json_str(f, a->fix);
        fputs(",\"impact_ns\":", f); qk__prof_json_num(f, a->impact_ns);
        fputc('}', f);
    }
    fputs("]", f);
    qk__prof_aview_free(&v);
}

/* The trace: a lane per (device, stream) of CUPTI records in process "GPU d" (tid 100000 + stream
   id), host waits and runtime calls in the host process. *first: the trace writer's separator. */
static void qk__prof_act_trace(FILE *f, qk__prof_model *m, int *first)
{
    qk__prof_aview v;
    size_t k;
    uint32_t lanes[256][2];
    int n_lanes = 0, i, waits = 0;
    uint32_t threads[64];
    int n_threads = 0;
    int dev_named[16] = { 0 };
#define QK__PROF_ASEP() (fputs(*first ? "\n" : ",\n", f), *first = 0)
    qk__prof_aview_build(m, &v);
    for (i = 0; i < m->n_lanes; i++) dev_named[m->lanes[i].device & 15] = 1;
    for (k = 0; k < v.n_acts; k++) {
        const qk_prof_activity *a = &v.acts[k];
        char nm[64], lb[96];
        int j, pid = 2 + (a->device & 15);
        uint32_t tid;
        if (a->kind == QK_PROF_ACT_ZONE) continue;
        if (a->kind == QK_PROF_ACT_SYNC) {
            pid = 1;
            tid = 99999;
            if (!waits++) {
                QK__PROF_ASEP();
                fputs("{\"ph\":\"M\",\"pid\":1,\"tid\":99999,\"name\":\"thread_name\",\"args\":{\"name\":\"CUDA host waits (CUPTI)\"}}", f);
            }
        } else if (a->kind == QK_PROF_ACT_RUNTIME) {
            pid = 1;
            tid = 200000 + a->stream % 100000;
            for (j = 0; j < n_threads; j++) if (threads[j] == a->stream) break;
            if (j == n_threads && n_threads < 64) {
                threads[n_threads++] = a->stream;
                QK__PROF_ASEP();
                qk__prof_pf(f, "{\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"name\":\"thread_name\",\"args\":{\"name\":\"CUDA runtime "
                            "(OS thread %u, CUPTI)\"}}", tid, a->stream);
            }
        } else {
            tid = 100000 + a->stream % 100000;
            if (!dev_named[a->device & 15]) {
                dev_named[a->device & 15] = 1;
                QK__PROF_ASEP();
                qk__prof_pf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"GPU %d\"}}",
                            pid, a->device & 15);
            }
            for (j = 0; j < n_lanes; j++) if (lanes[j][0] == (uint32_t)a->device && lanes[j][1] == a->stream) break;
            if (j == n_lanes && n_lanes < 256) {
                lanes[n_lanes][0] = (uint32_t)a->device;
                lanes[n_lanes++][1] = a->stream;
                QK__PROF_ASEP();
                qk__prof_pf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%u,\"name\":\"thread_name\",\"args\":{\"name\":", pid, tid);
                qk__prof_spf(nm, sizeof nm, "%s (CUPTI)", qk__prof_stream_label(&v.facts, a->device, a->stream, lb, sizeof lb));
                qk__prof_json_str(f, nm);
                fputs("}}", f);
            }
        }
        QK__PROF_ASEP();
        fputs("{\"ph\":\"X\",\"cat\":\"cupti\",\"name\":", f);
        if (a->kind == QK_PROF_ACT_MEMCPY) { qk__prof_spf(nm, sizeof nm, "memcpy %s", qk__prof_dir_name(a->dir)); qk__prof_json_str(f, nm); }
        else if (a->kind == QK_PROF_ACT_MEMSET) fputs("\"memset\"", f);
        else if (a->kind == QK_PROF_ACT_SYNC) qk__prof_json_str(f, qk__prof_wait_name(a));
        else qk__prof_json_str(f, a->name ? a->name : "(unnamed)");
        qk__prof_pf(f, ",\"pid\":%d,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"zone\":", pid, tid, a->start_ns * 1e-3,
                    (a->end_ns - a->start_ns) * 1e-3);
        if (a->zone) qk__prof_json_str(f, a->zone);
        else fputs("null", f);
        qk__prof_pf(f, ",\"correlation\":%u", a->correlation);
        if (a->kind == QK_PROF_ACT_KERNEL)
            qk__prof_pf(f, ",\"grid\":[%d,%d,%d],\"block\":[%d,%d,%d],\"registers\":%d,\"shared_bytes\":%d", a->grid[0],
                        a->grid[1], a->grid[2], a->block[0], a->block[1], a->block[2], a->registers, a->shared_bytes);
        else if (a->kind == QK_PROF_ACT_MEMCPY)
            qk__prof_pf(f, ",\"bytes\":%llu,\"src\":\"%s\",\"dst\":\"%s\",\"sync\":%s,\"GB/s\":%.3f",
                        (unsigned long long)a->bytes, qk__prof_memk_name(a->src_kind), qk__prof_memk_name(a->dst_kind),
                        a->sync ? "true" : "false", a->end_ns > a->start_ns ? (double)a->bytes / (a->end_ns - a->start_ns) : 0.0);
        else if (a->kind == QK_PROF_ACT_MEMSET)
            qk__prof_pf(f, ",\"bytes\":%llu,\"sync\":%s", (unsigned long long)a->bytes, a->sync ? "true" : "false");
        fputs("}}", f);
    }
#undef QK__PROF_ASEP
    qk__prof_aview_free(&v);
}

static void qk__prof_act_html_advice(FILE *f, qk__prof_model *m)
{
    qk__prof_aview v;
    int i;
    char b1[32];
    qk__prof_aview_build(m, &v);
    qk__prof_pf(f, "<h2>Advice</h2>\n<p class=\"note\">%d rules read this run's records (GPU activities, steps of the "
                "loop, memory); thresholds in docs/profiler.md, settable with QK_PROF_ADVICE.</p>\n", QK__PROF_NRULES);
    if (!v.adv.n) fputs("<p>No rule fired.</p>\n", f);
    else fputs("<ol class=\"adv\">\n", f);
    for (i = 0; i < v.adv.n; i++) {
        const qk_prof_advice *a = &v.adv.items[i];
        qk__prof_pf(f, "<li><b>%s</b> &middot; ", a->rule);
        qk__prof_html_str(f, a->where);
        if (a->impact_ns > 0) qk__prof_pf(f, " &middot; about %s at stake", qk__prof_time(a->impact_ns, b1, sizeof b1));
        fputs("<br><span class=\"note\">", f);
        qk__prof_html_str(f, a->evidence);
        fputs("</span><br><i>Fix:</i> ", f);
        qk__prof_html_str(f, a->fix);
        fputs("</li>\n", f);
    }
    if (v.adv.n) fputs("</ol>\n", f);
    qk__prof_aview_free(&v);
}

static void qk__prof_act_html(FILE *f, qk__prof_model *m)
{
    qk__prof_aview v;
    int i, d, s, k, any = 0;
    char b1[32], note[512];
    qk__prof_aview_build(m, &v);
    if (!qk__prof_aview_any(&v)) { qk__prof_aview_free(&v); return; }
    qk__prof_spf(note, sizeof note, "CUPTI %s. Kernels by name (all launches, the libraries' included), total device "
                 "time; zone: the CPU zone most launches came from.", v.status);
    fputs("<h2>GPU kernels</h2>\n<p class=\"note\">", f);
    qk__prof_html_str(f, note); /* the status quotes the loader's message: escaped */
    fputs("</p>\n<table><tr><th>kernel</th><th>calls</th><th>total ms</th><th>mean us</th><th>min us</th><th>max us</th>"
          "<th>zone</th><th>grid</th><th>block</th></tr>\n", f);
    for (i = 0; i < v.n_names; i++) {
        const qk__prof_aname *nm = &v.names[i];
        fputs("<tr><td>", f);
        qk__prof_html_label(f, nm->name, 120);
        qk__prof_pf(f, "</td><td>%llu</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>", (unsigned long long)nm->n,
                    (double)nm->total * 1e-6, (double)nm->total / (double)nm->n * 1e-3, (double)nm->min * 1e-3,
                    (double)nm->max * 1e-3);
        qk__prof_html_str(f, v.name_zone && v.name_zone[i] ? v.name_zone[i] : "-");
        if (v.name_zones && v.name_zones[i] > 1) qk__prof_pf(f, " (+%d)", v.name_zones[i] - 1);
        qk__prof_pf(f, "</td><td>%dx%dx%d</td><td>%dx%dx%d</td></tr>\n", nm->grid[0], nm->grid[1], nm->grid[2],
                    nm->block[0], nm->block[1], nm->block[2]);
    }
    fputs("</table>\n", f);
    for (d = 0; d < 5; d++) for (s = 0; s < 6; s++) for (k = 0; k < 6; k++) any |= v.copies[d][s][k].n > 0;
    if (any || v.memsets.n || v.syncs.n) {
        qk__prof_html_table_open(f, "GPU copies, memsets and syncs", NULL, "what|from -> to|count|bytes|time ms|GB/s");
        for (d = 0; d < 5; d++) for (s = 0; s < 6; s++) for (k = 0; k < 6; k++) {
            const qk__prof_astat *x = &v.copies[d][s][k];
            if (!x->n) continue;
            qk__prof_pf(f, "<tr><td>copy %s</td><td>%s -&gt; %s</td><td>%llu</td><td>%s</td><td>%.3f</td><td>%.2f</td></tr>\n",
                        qk__prof_dir_name(d), qk__prof_memk_name(s), qk__prof_memk_name(k), (unsigned long long)x->n,
                        qk__prof_bytes((double)x->bytes, b1, sizeof b1), (double)x->total * 1e-6,
                        x->total > 0 ? (double)x->bytes / (double)x->total : 0.0);
        }
        if (v.memsets.n)
            qk__prof_pf(f, "<tr><td>memset</td><td></td><td>%llu</td><td>%s</td><td>%.3f</td><td></td></tr>\n",
                        (unsigned long long)v.memsets.n, qk__prof_bytes((double)v.memsets.bytes, b1, sizeof b1),
                        (double)v.memsets.total * 1e-6);
        if (v.syncs.n)
            qk__prof_pf(f, "<tr><td>syncs (host, stream waits)</td><td></td><td>%llu</td><td></td><td>%.3f</td><td></td></tr>\n",
                        (unsigned long long)v.syncs.n, (double)v.syncs.total * 1e-6);
        fputs("</table>\n", f);
    }
    if (v.dropped || v.dropped_cupti || v.incomplete || v.dropped_names)
        qk__prof_pf(f, "<p class=\"note\">Activity records not kept %llu (the tables still count them), dropped by CUPTI "
                    "%llu, incomplete %llu, names not stored (out of memory) %llu.</p>\n", (unsigned long long)v.dropped,
                    (unsigned long long)v.dropped_cupti, (unsigned long long)v.incomplete, (unsigned long long)v.dropped_names);
    qk__prof_aview_free(&v);
}
typedef struct qk__prof_slane { int device; uint32_t stream; } qk__prof_slane;
static int qk__prof_slane_cmp(const void *x, const void *y)
{
    const qk__prof_slane *a = (const qk__prof_slane *)x, *b = (const qk__prof_slane *)y;
    if (a->device != b->device) return a->device < b->device ? -1 : 1;
    return a->stream < b->stream ? -1 : a->stream > b->stream;
}

/* The timeline's GPU activity lanes, as in the trace: one row per (device, stream) of the store's
   kernels, copies and memsets (a stream runs them one after another: one lane), named as the
   trace names them, each box with its tooltip (kernel: zone, grid, block; copy: direction, memory
   kinds, bytes, GB/s). The timeline's box budget holds for them too. Their boxes have no white
   edge (class act): thousands of microsecond kernels would be edges only. */
static void qk__prof_act_html_lanes(FILE *f, qk__prof_model *m, struct qk__prof_html_tl *tl)
{
    qk__prof_aview v;
    qk__prof_slane *sl;
    size_t i, j, ns = 0;
    qk__prof_aview_build(m, &v);
    sl = (qk__prof_slane *)QK_PROF_MALLOC((v.n_store + 1) * sizeof *sl);
    if (!sl) { qk__prof_aview_free(&v); return; }
    for (i = 0; i < v.n_store; i++) {
        const qk_prof_activity *a = &v.acts[i];
        if (a->kind != QK_PROF_ACT_KERNEL && a->kind != QK_PROF_ACT_MEMCPY && a->kind != QK_PROF_ACT_MEMSET) continue;
        sl[ns].device = a->device;
        sl[ns++].stream = a->stream;
    }
    if (ns > 1) qsort(sl, ns, sizeof *sl, qk__prof_slane_cmp);
    for (i = 0; i < ns; i++) {
        char kind[24], name[128];
        if (i > 0 && sl[i].device == sl[i - 1].device && sl[i].stream == sl[i - 1].stream) continue;
        qk__prof_spf(kind, sizeof kind, "GPU %d", sl[i].device);
        qk__prof_stream_label(&v.facts, sl[i].device, sl[i].stream, name, sizeof name - 8);
        qk__prof_copy(name + strlen(name), 9, " (CUPTI)");
        qk__prof_html_lanes_open(f, kind, name, 0);
        for (j = 0; j < v.n_store; j++) {
            const qk_prof_activity *a = &v.acts[j];
            char extra[160], b1[32], what[320];
            if ((a->kind != QK_PROF_ACT_KERNEL && a->kind != QK_PROF_ACT_MEMCPY && a->kind != QK_PROF_ACT_MEMSET) ||
                a->device != sl[i].device || a->stream != sl[i].stream || !qk__prof_html_tl_take(tl, 0, 1))
                continue;
            /* the names go in the box's name (escaped), the numbers in extra */
            qk__prof_spf(what, sizeof what, "%.200s in zone %.100s", a->kind == QK_PROF_ACT_KERNEL ? (a->name ? a->name : "kernel")
                         : a->kind == QK_PROF_ACT_MEMCPY ? "copy" : "memset", a->zone ? a->zone : "-");
            if (a->kind == QK_PROF_ACT_KERNEL)
                qk__prof_spf(extra, sizeof extra, ", grid %dx%dx%d, block %dx%dx%d", a->grid[0], a->grid[1], a->grid[2],
                             a->block[0], a->block[1], a->block[2]);
            else if (a->kind == QK_PROF_ACT_MEMCPY)
                qk__prof_spf(extra, sizeof extra, ", %s %s -&gt; %s, %s, %.2f GB/s", qk__prof_dir_name(a->dir),
                             qk__prof_memk_name(a->src_kind), qk__prof_memk_name(a->dst_kind),
                             qk__prof_bytes((double)a->bytes, b1, sizeof b1),
                             a->end_ns > a->start_ns ? (double)a->bytes / (a->end_ns - a->start_ns) : 0.0);
            else
                qk__prof_spf(extra, sizeof extra, ", %s", qk__prof_bytes((double)a->bytes, b1, sizeof b1));
            qk__prof_html_box(f, m, a->kind == QK_PROF_ACT_KERNEL ? "gpu act" : "xfer act", 0, a->start_ns, a->end_ns - a->start_ns,
                              what, extra);
        }
        fputs("</svg>\n", f);
    }
    QK_PROF_FREE(sl);
    qk__prof_aview_free(&v);
}
/* ---- end advice ---- */

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
