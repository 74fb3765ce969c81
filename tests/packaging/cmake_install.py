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
import os, shutil, sys, tempfile

from pkg_common import CONSUMER, check, consumer_output, finish, install, install_args, run

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
    meson, build, cuda, cc, cxx = install_args(sys.argv[1:])
    cmake = shutil.which("cmake")
    if not cmake:
        print("no cmake: skipped")
        return 77
    with tempfile.TemporaryDirectory() as d:
        dest = os.path.join(d, "dest")
        found = {f: root for f, root in install(meson, build, dest).items()
                 if f in ("qkConfig.cmake", "qkConfigVersion.cmake", "qk.pc", "qk.h")}
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
            shutil.copy(CONSUMER, os.path.join(proj, f))
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
                out = consumer_output(r)
                ok = out is not None
                # the CPU engine computes in fp64; the CUDA one (on a GPU) in its default fp32
                tol = 1e-12 if want == "0" else 1e-5
                if ok:
                    K = out[0]
                    ok = (all(abs(K[4 * i] - 1) < tol for i in range(3))
                          and all(K[3 * i + j] == K[3 * j + i] and 0 < K[3 * i + j] < 1 for i in range(3) for j in range(3) if i != j)
                          and (Kcpu is None or all(abs(a - b) < tol for a, b in zip(K, Kcpu))))
                    if Kcpu is None:
                        Kcpu = K
                check(ok and out[1] == want, "%s runs: a unit-diagonal symmetric Gram (as the C one's within %g), cuda=%s (%r)"
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
    return finish("cmake_install")


sys.exit(main())
