#!/usr/bin/env python3
"""The installed CMake package (src/cmake/qkConfig.cmake.in), used as a CMake project would use it:
`meson install --destdir` of this build into a temporary directory (the package finds its
paths from its own location, so the tree works wherever it lies), then a consumer project that
calls find_package(qk 0.1 REQUIRED), links a C and a C++ program with qk::qk, builds them with
the project's own compilers and runs them (a 3 x 3 Gram: unit diagonal, symmetric, in (0, 1)).

  qk::qk     header-only CPU engine: the include directory, Threads::Threads, libm
  qk::cuda   COMPONENTS cuda, where the CUDA engine was built: -DQK_CUDA=1, libqk_cuda.a, the
             CUDA runtime, libdl, libstdc++ (the consumer runs on the CPU engine without a GPU)

and what must fail: a newer version (find_package(qk 9.9)), a component qk does not have, and
COMPONENTS cuda from a build without the CUDA engine (REQUIRED: an error that says why;
OPTIONAL_COMPONENTS: qk_cuda_FOUND false). Exit 77 (skip) without cmake. Usage:
  cmake_install.py MESON BUILDDIR yes|no(cuda engine built) -- CC... -- CXX..."""
import os, shlex, shutil, subprocess, sys, tempfile

fails = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        fails.append(what)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


CONSUMER = r"""
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <string.h>
int main(void)
{
    static const double X[3 * 2] = {0.1, 0.2, 0.3, -0.4, 1.1, 0.7};
    double K[9];
    qk_ctx *ctx = NULL;
    qk_map *map = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    int i;
    memset(&cd, 0, sizeof cd);
    memset(&g, 0, sizeof g);
    if (qk_ctx_create(&cd, &ctx) != QK_OK || qk_map_parse("zz(reps=2)", 2, &map) != QK_OK) {
        printf("setup: %s\n", qk_last_error());
        return 1;
    }
    g.x = X; g.n_x = 3; g.out = K; g.out_dtype = QK_F64;
    if (qk_gram(ctx, map, &g) != QK_OK) { printf("qk_gram: %s\n", qk_last_error()); return 1; }
    for (i = 0; i < 9; i++) printf("%.17g ", K[i]);
    printf("cuda=%d\n", (int)QK_CUDA_BUILD);
    qk_map_free(map);
    qk_ctx_destroy(ctx);
    return 0;
}
"""

CMAKELISTS = r"""
cmake_minimum_required(VERSION 3.11)
project(qk_consumer C CXX)
find_package(qk 0.1 REQUIRED)
if(NOT TARGET qk::qk OR NOT qk_VERSION VERSION_GREATER_EQUAL 0.1)
  message(FATAL_ERROR "find_package(qk) gave no qk::qk")
endif()
message(STATUS "qk_cuda_FOUND=${qk_cuda_FOUND}")
add_executable(consumer_c consumer.c)
target_compile_definitions(consumer_c PRIVATE QK_CUDA_BUILD=0)
target_link_libraries(consumer_c PRIVATE qk::qk)
add_executable(consumer_cpp consumer.cpp)
target_compile_definitions(consumer_cpp PRIVATE QK_CUDA_BUILD=0)
target_link_libraries(consumer_cpp PRIVATE qk::qk)
if(WANT_CUDA)
  find_package(qk REQUIRED COMPONENTS cuda)
  add_executable(consumer_cuda consumer.c)
  target_compile_definitions(consumer_cuda PRIVATE QK_CUDA_BUILD=QK_CUDA)
  target_link_libraries(consumer_cuda PRIVATE qk::cuda)
endif()
"""

# projects that must not configure (or must, with qk_cuda_FOUND false)
PROBE = r"""
cmake_minimum_required(VERSION 3.11)
project(qk_probe C)
%s
message(STATUS "probe: qk_FOUND=${qk_FOUND} qk_cuda_FOUND=${qk_cuda_FOUND}")
if(TARGET qk::cuda)
  message(STATUS "probe: qk::cuda defined")
endif()
"""


def compiler_args(cmd, lang):
    """-DCMAKE_<LANG>_COMPILER[_LAUNCHER] and flags from Meson's compiler command array."""
    cmd = list(cmd)
    out = []
    if os.path.basename(cmd[0]) in ("ccache", "sccache") and len(cmd) > 1:
        out.append("-DCMAKE_%s_COMPILER_LAUNCHER=%s" % (lang, cmd.pop(0)))
    out.append("-DCMAKE_%s_COMPILER=%s" % (lang, shutil.which(cmd[0]) or cmd[0]))
    if len(cmd) > 1:
        out.append("-DCMAKE_%s_FLAGS=%s" % (lang, " ".join(cmd[1:])))
    return out


def main():
    argv = sys.argv[1:]
    meson, build, cuda = argv[0], argv[1], argv[2] == "yes"
    rest = argv[argv.index("--") + 1:]
    cc, cxx = rest[:rest.index("--")], rest[rest.index("--") + 1:]
    cmake = shutil.which("cmake")
    if not cmake:
        print("no cmake: skipped")
        return 77
    with tempfile.TemporaryDirectory() as d:
        dest = os.path.join(d, "dest")
        r = run(shlex.split(meson) + ["install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"])
        check(r.returncode == 0, "meson install --destdir (%s)" % (r.stdout + r.stderr).strip()[-800:])
        found = {}
        for root, _, files in os.walk(dest):
            for f in files:
                if f in ("qkConfig.cmake", "qkConfigVersion.cmake", "qk.pc", "qk.h"):
                    found[f] = root
        check("qkConfig.cmake" in found and found.get("qkConfigVersion.cmake") == found.get("qkConfig.cmake"),
              "qkConfig.cmake and qkConfigVersion.cmake installed together (%s)" % found)
        if "qkConfig.cmake" not in found:
            return 1
        cmdir = found["qkConfig.cmake"]
        check(os.path.basename(cmdir) == "qk" and os.path.basename(os.path.dirname(cmdir)) == "cmake"
              and os.path.dirname(os.path.dirname(cmdir)) == os.path.dirname(found.get("qk.pc", "")),
              "in <libdir>/cmake/qk beside <libdir>/pkgconfig (%s, %s)" % (cmdir, found.get("qk.pc")))
        # The install tree, moved: the package must find its files from where it lies now.
        moved = os.path.join(d, "moved")
        shutil.move(dest, moved)
        # the prefix: the directory above include/ holding qk.h
        prefix = os.path.dirname(found["qk.h"].replace(dest, moved, 1))
        comp = compiler_args(cc, "C") + compiler_args(cxx, "CXX")
        base = [cmake, "-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_BUILD_TYPE=Release"] + comp

        proj = os.path.join(d, "proj")
        os.makedirs(proj)
        open(os.path.join(proj, "CMakeLists.txt"), "w").write(CMAKELISTS)
        for f in ("consumer.c", "consumer.cpp"):
            open(os.path.join(proj, f), "w").write(CONSUMER)
        bdir = os.path.join(d, "build")
        r = run(base + ["-S", proj, "-B", bdir, "-DWANT_CUDA=" + ("ON" if cuda else "OFF")])
        check(r.returncode == 0, "consumer project configures with find_package(qk 0.1 REQUIRED) (%s)"
              % (r.stdout + r.stderr).strip()[-1500:])
        check(("qk_cuda_FOUND=%s" % ("TRUE" if cuda else "FALSE")) in r.stdout,
              "qk_cuda_FOUND says whether the CUDA engine was built")
        if r.returncode == 0:
            r = run([cmake, "--build", bdir])
            check(r.returncode == 0, "consumer builds (%s)" % (r.stdout + r.stderr).strip()[-1500:])
            Kcpu = None
            for exe, want in (("consumer_c", "0"), ("consumer_cpp", "0")) + ((("consumer_cuda", "1"),) if cuda else ()):
                path = os.path.join(bdir, exe)
                r = run([path]) if os.path.exists(path) else None
                v = r.stdout.split() if r else []
                ok = r is not None and r.returncode == 0 and len(v) == 10
                # the CPU engine computes in fp64; the CUDA one (on a GPU) in its default fp32
                tol = 1e-12 if want == "0" else 1e-5
                if ok:
                    K = [float(x) for x in v[:9]]
                    ok = (all(abs(K[4 * i] - 1) < tol for i in range(3))
                          and all(K[3 * i + j] == K[3 * j + i] and 0 < K[3 * i + j] < 1 for i in range(3) for j in range(3) if i != j)
                          and (Kcpu is None or all(abs(a - b) < tol for a, b in zip(K, Kcpu))))
                    if Kcpu is None:
                        Kcpu = K
                check(ok and v[-1] == "cuda=" + want, "%s runs: a unit-diagonal symmetric Gram (as the C one's within %g), cuda=%s (%r)"
                      % (exe, tol, want, ((r.stdout + r.stderr).strip()[-300:] if r else "not built")))

        def probe(name, body, want_ok, want_text):
            p = os.path.join(d, "probe_" + name)
            os.makedirs(p)
            open(os.path.join(p, "CMakeLists.txt"), "w").write(PROBE % body)
            r = run(base + ["-S", p, "-B", os.path.join(p, "build")])
            out = r.stdout + r.stderr
            check((r.returncode == 0) == want_ok and all(t in out for t in want_text),
                  "%s: %s, saying %s (rc %d: %s)" % (name, "configures" if want_ok else "fails", want_text, r.returncode,
                                                       out.strip()[-600:]))

        probe("newer version", "find_package(qk 9.9 REQUIRED)", False, ["0.1.0"])
        probe("other minor (0.x)", "find_package(qk 0.7 REQUIRED)", False, ["0.1.0"])
        probe("unknown component", "find_package(qk REQUIRED COMPONENTS fortran)", False, ["fortran", "no component"])
        if not cuda:
            probe("cuda without the CUDA engine", "find_package(qk REQUIRED COMPONENTS cuda)", False,
                  ["without its CUDA engine"])
        probe("cuda optional", "find_package(qk REQUIRED OPTIONAL_COMPONENTS cuda)", True,
              ["qk_FOUND=1", "qk_cuda_FOUND=%s" % ("TRUE" if cuda else "FALSE")] + (["qk::cuda defined"] if cuda else []))
    if fails:
        print("%d failure(s)" % len(fails))
        return 1
    print("cmake_install: ok")
    return 0


sys.exit(main())
