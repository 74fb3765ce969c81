#include "qk_head.h"
#ifndef QK_H
#define QK_H

#include "qk_defs.h"
#ifdef __cplusplus
extern "C" {
#endif

#include "qk_api.h"
#include "qk_engine.h"
#ifdef __cplusplus
}
#endif
#endif /* QK_H */

#include "qk_mpi.h"
/* ======================================================================================== */
/*                                    IMPLEMENTATION                                        */
/* ======================================================================================== */
#if defined(QK_IMPLEMENTATION) && !defined(QK_IMPLEMENTATION_DONE)
#define QK_IMPLEMENTATION_DONE

#include "qk_internal.h"
#include "prof.c"
#include "base.c"
#include "mps_prog.c"
#include "map.c"
#include "map_parse.c"
#include "cpu_pool.c"
#include "cpu_states.c"
#include "cpu_gram.c"
#include "io.c"
#include "sink_npy.c"
#include "cpu_stream.c"
#include "cpu_run.c"
#include "schedule.c"
#include "engine_mps.c"
#include "tune.c"
#include "plan.c"
#include "ctx.c"
#include "run_cuda.c"
#include "gram.c"
#include "vjp.c"
#include "run_mpi.c"
#endif /* QK_IMPLEMENTATION */

/*
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
