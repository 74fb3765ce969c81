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

struct qk__dprog {
    qk_angle *ang = nullptr;
    int *op_kind = nullptr;
    qk__instr *instr = nullptr;
    qk__job *jobs = nullptr;
    qk__contrib *con = nullptr;
    double *w = nullptr;
    int *qops = nullptr, *qoff = nullptr;
};

template <typename V>
static qk_result qk__upload(const std::vector<V> &v, V **d, qk__err *E)
{
    size_t bytes = std::max<size_t>(1, v.size()) * sizeof(V);
    QK_CK(cudaMalloc((void **)d, bytes));
    if (!v.empty()) {
        /* landed before any stream reads it: the legacy stream's cudaMemcpy does not order the
           engine's non-blocking streams, and from pageable memory it may return before its DMA */
        QK_CK(cudaMemcpyAsync(*d, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice, 0));
        QK_CK(cudaStreamSynchronize(0));
    }
    return QK_OK;
}

static void qk__dprog_free(qk__dprog *d)
{
    cudaFree(d->ang); cudaFree(d->op_kind); cudaFree(d->instr); cudaFree(d->jobs);
    cudaFree(d->con); cudaFree(d->w); cudaFree(d->qops); cudaFree(d->qoff);
    *d = qk__dprog();
}

static qk_result qk__dprog_make(const qk__prog &pg, const qk_map *map, qk__dprog *d, qk__err *E)
{
    QK_TRY(qk__upload(pg.ang, &d->ang, E));
    QK_TRY(qk__upload(pg.op_kind, &d->op_kind, E));
    QK_TRY(qk__upload(pg.instr, &d->instr, E));
    QK_TRY(qk__upload(pg.jobs, &d->jobs, E));
    QK_TRY(qk__upload(pg.con, &d->con, E));
    std::vector<double> w(map->weights, map->weights + map->n_weights);
    QK_TRY(qk__upload(w, &d->w, E));
    QK_TRY(qk__upload(pg.qops, &d->qops, E));
    QK_TRY(qk__upload(pg.qoff, &d->qoff, E));
    return QK_OK;
}

