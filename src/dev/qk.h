/* src/dev/qk.h — qk.h for programs linked with the development build's library (the sources of
   src/ compiled one by one, libqk_dev; tests/meson.build, "development build"). Not for users:
   they vendor the generated qk.h at the repository root.

   A program includes it as "qk.h" (this directory before the root on the include path) and may
   define QK_IMPLEMENTATION as it does with qk.h: here that expands nothing (the implementation is
   the library), and the program sees qk.h's declarations and all of src/qk_internal.h, the
   internal functions the tests call included. The program's configuration macros must match the
   library's (the default: threads, no CUDA, no MPI, the default allocator and bounds). */
#ifndef QK_DEV_H
#define QK_DEV_H
#ifdef QK_IMPLEMENTATION
#undef QK_IMPLEMENTATION
#endif
#ifndef QK__LAYER
#define QK__LAYER QK__L_ALL
#endif
#include "../qk_internal.h"
#endif
