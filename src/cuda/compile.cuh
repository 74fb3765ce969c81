/* ======================================================================================== */
/* >>compile ---- qk__compile: a qk_map -> GATE/CNOT/DIAG instructions, param jobs, passes; qk__dprog on the device ---- */
/* ======================================================================================== */
#pragma once
#include "base.cuh"
#include "common.cuh"

struct qk__prog {
    int q = 0, d = 0;
    int has_amp = 0;
    int states = 0; /* given states (qk_gram_states): a load kernel, no program; the op's fields */
    int st_type = 0, st_flags = 0;
    int64_t st_dim = 0;
    std::vector<qk_angle> ang;
    std::vector<int> op_kind;
    std::vector<qk__instr> instr;
    std::vector<qk__job> jobs;
    std::vector<qk__contrib> con;
    std::vector<qk__pass> passes;
    int P = 0; /* params per sample (0: none, an analytic-only map of more than QK__MAXQ qubits) */
    /* product maps */
    std::vector<int> qops, qoff;
};

/* Adds one quadratic-form contribution: value (m*theta(op)+k) * f(b) with f by type. */
struct qk__diag_builder {
    int q;
    /* slot -> contributions; slot 0 = c0, 1+i = c_i, 1+q+i*q+j = d_ij (i<j) */
    std::vector<std::vector<qk__contrib>> slot;
    void init(int q_) { q = q_; slot.assign(1 + q + q * q, std::vector<qk__contrib>()); }
    void add(int s, int op, double m, double k) { qk__contrib c = {op, m, k}; slot[s].push_back(c); }
    void bit(int a, int op, double m, double k) { add(1 + a, op, m, k); }
    void cnst(int op, double m, double k) { add(0, op, m, k); }
    void pair(int a, int b, int op, double m, double k) { if (a > b) std::swap(a, b); add(1 + q + a * q + b, op, m, k); }
    void xr(int a, int b, int op, double m, double k) { bit(a, op, m, k); bit(b, op, m, k); pair(a, b, op, -2 * m, -2 * k); }
};

static void qk__diag_op1(qk__diag_builder &db, const qk_op &o, int oi, int qbit_xor_with)
{
    const double PI = 3.14159265358979323846;
    /* qbit_xor_with >= 0: the op sits between CNOT(c, t) pairs: its bit becomes b_c xor b_t */
    int t = o.q0;
    switch (o.kind) {
    case QK_OP_Z:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, -1, 0, PI); else db.bit(t, -1, 0, PI);
        break;
    case QK_OP_P:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, oi, 1, 0); else db.bit(t, oi, 1, 0);
        break;
    case QK_OP_RZ:
        if (qbit_xor_with >= 0) db.xr(qbit_xor_with, t, oi, 1, 0); else db.bit(t, oi, 1, 0);
        db.cnst(oi, -0.5, 0);
        break;
    default: break;
    }
}

/* qk__compile's steps, in order: the product path's per-qubit op lists, the folded start, the
   instructions (GATE / CNOT / DIAG runs with their param jobs), the passes. */

/* Product maps: per-qubit op lists (qops, qoff) for the analytic kernel. */
static qk_result qk__compile_product(const qk_map *map, qk__prog *pg, qk__err *E)
{
    const int q = map->n_qubits;
    pg->qoff.assign(q + 1, 0);
    if (map->cls != QK_CLASS_PRODUCT) return QK_OK;
    std::vector<std::vector<int>> per(q);
    for (int i = 0; i < map->n_ops; ++i) {
        int k = map->ops[i].kind;
        if (k == QK_OP_CNOT || k == QK_OP_CZ || k == QK_OP_RZZ || k == QK_OP_AMPLITUDE)
            return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "product map with an entangling or amplitude op");
        per[map->ops[i].q0].push_back(i);
    }
    pg->qops.clear();
    for (int k = 0; k < q; ++k) {
        pg->qoff[k] = (int)pg->qops.size();
        pg->qops.insert(pg->qops.end(), per[k].begin(), per[k].end());
    }
    pg->qoff[q] = (int)pg->qops.size();
    if (pg->qops.empty()) pg->qops.push_back(0);
    return QK_OK;
}

/* Leading one-qubit gates on qubits nothing else has touched yet act on |0> alone: fold them
   into a per-sample product start state (a 2-vector per qubit, built by the prep kernel). zz's
   first H layer disappears this way: 16 qubits take 2 passes instead of 3. Marks the folded ops;
   returns the offset of the q 2-vectors in the params (*P grows by 4q), or -1. */
static int qk__compile_fold(const qk_map *map, qk__prog *pg, std::vector<char> &folded, int *P)
{
    const int q = map->n_qubits;
    std::vector<std::vector<int>> fold_ops(q);
    bool any_fold = false;
    std::vector<char> touched(q, 0);
    bool amp = map->n_ops > 0 && map->ops[0].kind == QK_OP_AMPLITUDE;
    for (int i = 0; i < map->n_ops && !amp; ++i) {
        const qk_op &o = map->ops[i];
        int k = o.kind;
        bool one = k == QK_OP_H || k == QK_OP_X || k == QK_OP_Y || k == QK_OP_RX || k == QK_OP_RY || k == QK_OP_BASIS;
        if (one && !touched[o.q0]) { folded[i] = 1; fold_ops[o.q0].push_back(i); any_fold = true; continue; }
        if (o.q0 >= 0 && o.q0 < q) touched[o.q0] = 1;
        if ((k == QK_OP_CNOT || k == QK_OP_CZ || k == QK_OP_RZZ) && o.q1 >= 0 && o.q1 < q) touched[o.q1] = 1;
    }
    if (!any_fold) return -1;
    const int fold_off = *P;
    for (int b = 0; b < q; ++b) {
        qk__job j = {2, -1, *P + 4 * b, (int)pg->con.size(), 0};
        for (int op : fold_ops[b]) { qk__contrib c = {op, 0, 0}; pg->con.push_back(c); }
        j.c1 = (int)pg->con.size();
        pg->jobs.push_back(j);
    }
    *P += 4 * q;
    return fold_off;
}

/* The instructions: every run of diagonal ops (and CX P CX parity patterns) becomes one DIAG
   with its 1 + q + q*q coefficient jobs; other one-qubit gates a GATE with its matrix job; CNOT
   stays. *P counts the params per sample. */
static qk_result qk__compile_instr(const qk_map *map, qk__prog *pg, const std::vector<char> &folded, int *P, qk__err *E)
{
    const int q = map->n_qubits;
    qk__diag_builder db;
    bool in_diag = false;
    auto flush_diag = [&]() {
        if (!in_diag) return;
        qk__instr ins = {QK__I_DIAG, -1, -1, 0, 0, *P, 0};
        pg->instr.push_back(ins);
        for (size_t s = 0; s < db.slot.size(); ++s) {
            qk__job j;
            j.kind = 1;
            j.op = -1;
            j.out = *P + (int)s;
            j.c0 = (int)pg->con.size();
            for (auto &c : db.slot[s]) pg->con.push_back(c);
            j.c1 = (int)pg->con.size();
            pg->jobs.push_back(j);
        }
        *P += (int)db.slot.size();
        in_diag = false;
    };
    for (int i = 0; i < map->n_ops; ++i) {
        const qk_op &o = map->ops[i];
        int k = o.kind;
        if (folded[i]) continue;
        if (k == QK_OP_AMPLITUDE) {
            if (i != 0) return qk__fail_msg(E, QK_ERROR_INVALID_ARGUMENT, "amplitude op must come first");
            pg->has_amp = 1;
            continue;
        }
        /* CNOT(c,t) D(t) CNOT(c,t) with D one diagonal one-qubit op: a parity phase */
        if (qk__parity_at(map->ops, map->n_ops, i)) {   /* the parity rule (qk_engine.h) */
            if (!in_diag) { db.init(q); in_diag = true; }
            qk__diag_op1(db, map->ops[i + 1], i + 1, o.q0);
            i += 2;
            continue;
        }
        if (qk__op_diag1(k) || k == QK_OP_CZ || k == QK_OP_RZZ) {
            if (!in_diag) { db.init(q); in_diag = true; }
            if (k == QK_OP_CZ) db.pair(o.q0, o.q1, -1, 0, 3.14159265358979323846);
            else if (k == QK_OP_RZZ) { db.xr(o.q0, o.q1, i, 1, 0); db.cnst(i, -0.5, 0); }
            else qk__diag_op1(db, o, i, -1);
            continue;
        }
        flush_diag();
        if (k == QK_OP_CNOT) {
            qk__instr ins = {QK__I_CNOT, o.q0, o.q1, 0, 0, 0, 0};
            pg->instr.push_back(ins);
        } else {
            qk__instr ins = {QK__I_GATE, o.q0, -1, 0, 0, *P, k == QK_OP_H};
            pg->instr.push_back(ins);
            qk__job j = {0, i, *P, 0, 0};
            pg->jobs.push_back(j);
            *P += 8;
        }
    }
    flush_diag();
    return QK_OK;
}

/* The passes: instructions packed greedily into passes of at most QK__LMAX qubits, each filled
   with the lowest qubits (coalesced global accesses); the first starts from the folded state. */
static void qk__compile_passes(qk__prog *pg, int q, int fold_off)
{
    pg->passes.clear();
    const int L = std::min(q, QK__LMAX);
    uint32_t S = 0;
    qk__pass cur;
    memset(&cur, 0, sizeof cur);
    cur.i0 = 0;
    cur.first = 1;
    cur.fold = fold_off;
    auto close = [&](int i1) {
        for (int b = 0; b < q && __builtin_popcount(S) < L; ++b) S |= 1u << b;
        cur.L = L;
        int np = 0, nn = 0;
        for (int b = 0; b < q; ++b) {
            if (S >> b & 1) cur.pos[np++] = b; else cur.npos[nn++] = b;
        }
        cur.a = 0;
        while (cur.a < L && cur.pos[cur.a] == cur.a) cur.a++;
        cur.i1 = i1;
        for (int ii = cur.i0; ii < i1; ++ii) {
            qk__instr &in_ = pg->instr[ii];
            for (int r = 0; r < L; ++r) {
                if (cur.pos[r] == in_.q0) in_.b0 = r;
                if (cur.pos[r] == in_.q1) in_.b1 = r;
            }
        }
        pg->passes.push_back(cur);
    };
    for (int ii = 0; ii < (int)pg->instr.size(); ++ii) {
        const qk__instr &in_ = pg->instr[ii];
        uint32_t need = 0;
        if (in_.kind == QK__I_GATE) need = 1u << in_.q0;
        else if (in_.kind == QK__I_CNOT) need = (1u << in_.q0) | (1u << in_.q1);
        if ((S | need) == S) continue;
        if (__builtin_popcount(S | need) <= L) { S |= need; continue; }
        close(ii);
        memset(&cur, 0, sizeof cur);
        cur.i0 = ii;
        cur.first = 0;
        cur.fold = -1;
        S = need;
    }
    close((int)pg->instr.size());
}

static qk_result qk__compile(const qk_map *map, qk__prog *pg, qk__err *E)
{
    const int q = map->n_qubits;
    pg->q = q;
    pg->d = map->n_features;
    pg->has_amp = 0;
    pg->ang.resize(std::max(1, map->n_ops));
    pg->op_kind.resize(std::max(1, map->n_ops));
    for (int i = 0; i < map->n_ops; ++i) {
        pg->ang[i] = map->ops[i].angle;
        pg->op_kind[i] = (int)map->ops[i].kind;
    }
    pg->states = 0;
    if (qk__map_is_states(map)) {   /* the states are loaded, not built (qk__launch_load_states) */
        pg->states = 1;
        pg->st_type = map->ops[0].q0;
        pg->st_flags = map->ops[0].q1;
        pg->st_dim = map->ops[0].angle.x0;
        pg->instr.clear(); pg->jobs.clear(); pg->con.clear(); pg->passes.clear();
        pg->qoff.assign(q + 1, 0);
        pg->qops.assign(1, 0);
        pg->P = 1;
        return QK_OK;
    }
    QK_TRY(qk__compile_product(map, pg, E));
    if (q > QK__MAXQ) { pg->P = 0; return QK_OK; } /* analytic only: no state program, no params */
    pg->instr.clear();
    pg->jobs.clear();
    pg->con.clear();
    int P = 0;
    std::vector<char> folded(std::max(1, map->n_ops), 0);
    const int fold_off = qk__compile_fold(map, pg, folded, &P);
    QK_TRY(qk__compile_instr(map, pg, folded, &P, E));
    pg->P = std::max(P, 1);
    qk__compile_passes(pg, q, fold_off);
    return QK_OK;
}

/* The compiled program on the device: its eight arrays packed into one buffer (each at a
   16-byte boundary), uploaded with one copy. base: that buffer; owned: allocated here (else a
   stream pool's, qk__dprog_make's buf). */
struct qk__dprog {
    qk_angle *ang = nullptr;
    int *op_kind = nullptr;
    qk__instr *instr = nullptr;
    qk__job *jobs = nullptr;
    qk__contrib *con = nullptr;
    double *w = nullptr;
    int *qops = nullptr, *qoff = nullptr;
    void *base = nullptr;
    bool owned = false;
};

/* The packed layout: each array's offset in the buffer, and the buffer's size (at least 16). */
struct qk__dprog_layout {
    size_t off[8], sz[8], bytes;
};
static qk__dprog_layout qk__dprog_plan(const qk__prog &pg, const qk_map *map)
{
    const size_t sz[8] = {pg.ang.size() * sizeof(qk_angle), pg.op_kind.size() * sizeof(int), pg.instr.size() * sizeof(qk__instr),
                          pg.jobs.size() * sizeof(qk__job), pg.con.size() * sizeof(qk__contrib), (size_t)map->n_weights * sizeof(double),
                          pg.qops.size() * sizeof(int), pg.qoff.size() * sizeof(int)};
    qk__dprog_layout L;
    size_t at = 0;
    for (int i = 0; i < 8; ++i) {
        L.off[i] = at;
        L.sz[i] = sz[i];
        at += (sz[i] + 15) & ~(size_t)15;
    }
    L.bytes = std::max<size_t>(16, at);
    return L;
}
/* Its size: what a stream pool's buffer for it must hold. */
static size_t qk__dprog_bytes(const qk__prog &pg, const qk_map *map) { return qk__dprog_plan(pg, map).bytes; }

static void qk__dprog_free(qk__dprog *d)
{
    if (d->owned) cudaFree(d->base);
    *d = qk__dprog();
}

/* Uploads the program. buf: a device buffer of at least qk__dprog_bytes to use (NULL: one is
   allocated, and qk__dprog_free frees it). st: the stream the copy is ordered on; the copy comes
   from pageable memory, which cudaMemcpyAsync has staged when it returns, so the host vector may
   go; with the legacy stream 0 (the default) it is also waited for, since the engine's other
   (non-blocking) streams are not ordered after stream 0. */
static qk_result qk__dprog_make(const qk__prog &pg, const qk_map *map, qk__dprog *d, qk__err *E, void *buf = nullptr,
                                cudaStream_t st = 0)
{
    const qk__dprog_layout L = qk__dprog_plan(pg, map);
    std::vector<unsigned char> h(L.bytes, 0);
    const void *src[8] = {pg.ang.data(), pg.op_kind.data(), pg.instr.data(), pg.jobs.data(), pg.con.data(), map->weights,
                          pg.qops.data(), pg.qoff.data()};
    for (int i = 0; i < 8; ++i)
        if (L.sz[i] > 0 && src[i]) memcpy(h.data() + L.off[i], src[i], L.sz[i]);
    *d = qk__dprog();
    if (buf) d->base = buf;
    else {
        QK_CK(cudaMalloc(&d->base, L.bytes));
        d->owned = true;
    }
    unsigned char *b = (unsigned char *)d->base;
    d->ang = (qk_angle *)(b + L.off[0]);
    d->op_kind = (int *)(b + L.off[1]);
    d->instr = (qk__instr *)(b + L.off[2]);
    d->jobs = (qk__job *)(b + L.off[3]);
    d->con = (qk__contrib *)(b + L.off[4]);
    d->w = (double *)(b + L.off[5]);
    d->qops = (int *)(b + L.off[6]);
    d->qoff = (int *)(b + L.off[7]);
    QK_CK(cudaMemcpyAsync(d->base, h.data(), L.bytes, cudaMemcpyHostToDevice, st));
    if (st == 0) QK_CK(cudaStreamSynchronize(0));
    return QK_OK;
}

