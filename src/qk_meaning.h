/* >>meaning ---- the map's meaning, one definition for both engines ---- */
/* Small inline helpers that the CPU engine (qk.h) and the GPU engine (qk_cuda.cu, where QK__HD
   is __host__ __device__) both call, so that the CPU oracle and the GPU cannot drift: an op's
   angle, the 2x2 matrix of a one-qubit op, the BASIS op's bit, and the layout of a product
   map's per-qubit 2-vectors. Private (qk__), declared here because qk_cuda.cu includes qk.h
   without QK_IMPLEMENTATION. */
#if defined(__CUDACC__)
#define QK__HD __host__ __device__
#else
#define QK__HD
#endif

/* theta = scale * f(x, w) + offset, f by the angle's kind (qk_map_angles, docs/maps.md). */
static QK__HD inline double qk__angle_value(const qk_angle *a, const double *x, const double *w)
{
    double f;
    switch (a->kind) {
    case QK_ARG_X: f = x[a->x0]; break;
    case QK_ARG_XX: f = x[a->x0] * x[a->x1]; break;
    case QK_ARG_PIXX: f = (3.14159265358979323846 - x[a->x0]) * (3.14159265358979323846 - x[a->x1]); break;
    case QK_ARG_W: f = w[a->w]; break;
    case QK_ARG_WX: f = w[a->w] * x[a->x0]; break;
    case QK_ARG_CONST: default: f = 0.0; break;
    }
    return a->scale * f + a->offset;
}

/* The BASIS op flips its qubit where its feature is 1 (qk_map_check_data admits 0 or 1 only). */
static QK__HD inline int qk__basis_one(double feature) { return feature > 0.5; }

/* The 2x2 matrix of a one-qubit op of kind `kind` at angle t (conventions at the top of this
   file), m = (m00 re, m00 im, m01 re, m01 im, m10 re, m10 im, m11 re, m11 im); basis_one: a
   BASIS op's qk__basis_one. Returns 0, with m the identity, where the op acts as the identity
   (BASIS on a 0) or is no one-qubit op. */
static QK__HD inline int qk__u1(int kind, double t, int basis_one, double *m)
{
    const double c = cos(0.5 * t), s = sin(0.5 * t), h = 0.70710678118654752440;
    int i;
    for (i = 0; i < 8; ++i) m[i] = 0;
    switch (kind) {
    case QK_OP_H: m[0] = h; m[2] = h; m[4] = h; m[6] = -h; return 1;
    case QK_OP_X: m[2] = 1; m[4] = 1; return 1;
    case QK_OP_Y: m[3] = -1; m[5] = 1; return 1;
    case QK_OP_Z: m[0] = 1; m[6] = -1; return 1;
    case QK_OP_RX: m[0] = c; m[3] = -s; m[5] = -s; m[6] = c; return 1;
    case QK_OP_RY: m[0] = c; m[2] = -s; m[4] = s; m[6] = c; return 1;
    case QK_OP_RZ: m[0] = c; m[1] = -s; m[6] = c; m[7] = s; return 1;
    case QK_OP_P: m[0] = 1; m[6] = cos(t); m[7] = sin(t); return 1;
    case QK_OP_BASIS: if (basis_one) { m[2] = 1; m[4] = 1; return 1; } break;
    default: break;
    }
    m[0] = 1; m[6] = 1;
    return 0;
}

/* A product map's per-qubit 2-vector u = u0 |0> + u1 |1> (its one-qubit ops applied to |0>), as
   4 values (double on the CPU, the precision on the GPU): qubit k of row s at 4 * (s * q + k),
   in this order. */
enum { QK__QV_RE0 = 0, QK__QV_IM0 = 1, QK__QV_RE1 = 2, QK__QV_IM1 = 3 };
/* ---- end meaning ---- */

