/* The rule for the two implementation defines (documentation block above): qk_prof.h's
   implementation goes in the file that defines QK_IMPLEMENTATION, and only there. */
#if defined(QK_PROF_ENABLE) && defined(QK_PROF_IMPLEMENTATION) && !defined(QK_IMPLEMENTATION)
#error "qk.h: QK_PROF_IMPLEMENTATION belongs in the file that defines QK_IMPLEMENTATION (define both there, before the first include of qk.h; qk.h, 'The profiler and the two implementation defines')"
#endif

#include <stddef.h>
#include <stdint.h>
#include <math.h> /* cos, sin of the shared one-qubit matrices (qk__u1) */

#define QK_VERSION_MAJOR 0
#define QK_VERSION_MINOR 1
#define QK_VERSION_PATCH 0
#define QK_VERSION_STRING "0.1.0"

/* Largest state (in qubits) the statevector engines build; product maps have no such limit. */
#define QK_MAX_STATE_QUBITS 30
/* Largest qubit count of any map (product maps evaluated analytically; entangled maps beyond
   QK_MAX_STATE_QUBITS on the MPS path). */
#define QK_MAX_PRODUCT_QUBITS 4096
/* Largest bond dimension of the MPS path (docs/mps.md): an entangled map is MPS-able when the exact
   bond bound of its circuit is at most this. Define before including qk.h to change it. */
#ifndef QK_MPS_MAX_BOND
#define QK_MPS_MAX_BOND 64
#endif

#ifndef QKDEF
#ifdef QK_STATIC
#define QKDEF static
#else
#define QKDEF extern
#endif
#endif

