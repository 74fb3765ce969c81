#!/usr/bin/env python3
"""The installed pkg-config files, used as a program outside Meson would use them:
`meson install --destdir` of this build into a temporary directory, the .pc files' prefix
pointed there, then a C and a C++ consumer compiled and linked with the plain compilers and
`pkg-config --cflags --libs qk` (and, where the CUDA engine was built, `qk-cuda`), and run.

  qk       header-only CPU engine: -lm and -lpthread in Libs, nothing about CUDA
  qk-cuda  -DQK_CUDA=1, libqk_cuda.a with its CUDA runtime, cuBLAS and libstdc++ (the consumer
           runs on the CPU engine where no GPU is present)

Exit 77 (skip) without pkg-config. Usage:
  pkgconfig_install.py MESON BUILDDIR yes|no(cuda engine built) -- CC... -- CXX..."""
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
    static const double X[2 * 2] = {0.1, 0.2, 0.3, -0.4};
    double K[4];
    qk_ctx *ctx = NULL;
    qk_map *map = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    memset(&cd, 0, sizeof cd);
    memset(&g, 0, sizeof g);
    if (qk_ctx_create(&cd, &ctx) != QK_OK || qk_map_parse("zz(reps=2)", 2, &map) != QK_OK) {
        printf("setup: %s\n", qk_last_error());
        return 1;
    }
    g.x = X; g.n_x = 2; g.out = K; g.out_dtype = QK_F64; /* the GPU engine's default is float32 */
    if (qk_gram(ctx, map, &g) != QK_OK) { printf("qk_gram: %s\n", qk_last_error()); return 1; }
    printf("%.12f %.12f cuda=%d\n", K[0], K[3], (int)QK_CUDA_BUILD);
    qk_map_free(map);
    qk_ctx_destroy(ctx);
    return 0;
}
"""


def main():
    argv = sys.argv[1:]
    meson, build, cuda = argv[0], argv[1], argv[2] == "yes"
    rest = argv[argv.index("--") + 1:]
    cc, cxx = rest[:rest.index("--")], rest[rest.index("--") + 1:]
    pkgconf = shutil.which("pkg-config") or shutil.which("pkgconf")
    if not pkgconf:
        print("no pkg-config: skipped")
        return 77
    with tempfile.TemporaryDirectory() as d:
        dest = os.path.join(d, "dest")
        r = run(shlex.split(meson) + ["install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"])
        check(r.returncode == 0, "meson install --destdir (%s)" % (r.stdout + r.stderr).strip()[-800:])
        pcs = {}
        for root, _, files in os.walk(dest):
            for f in files:
                if f.endswith(".pc"):
                    pcs[f[:-3]] = os.path.join(root, f)
        check("qk" in pcs, "qk.pc installed (%s)" % sorted(pcs))
        check(("qk-cuda" in pcs) == cuda, "qk-cuda.pc installed exactly where the CUDA engine is built")
        if "qk" not in pcs:
            return 1
        # The prefix written in the files is the real one; point it into the DESTDIR.
        pcdir = os.path.join(d, "pkgconfig")
        os.makedirs(pcdir)
        for name, path in pcs.items():
            lines = open(path).read().splitlines()
            out = [("prefix=" + dest + l[len("prefix="):]) if l.startswith("prefix=") else l for l in lines]
            open(os.path.join(pcdir, name + ".pc"), "w").write("\n".join(out) + "\n")
        env = dict(os.environ, PKG_CONFIG_PATH=pcdir, PKG_CONFIG_LIBDIR=pcdir)
        src_c, src_cpp = os.path.join(d, "consumer.c"), os.path.join(d, "consumer.cpp")
        for p in (src_c, src_cpp):
            open(p, "w").write(CONSUMER)
        for pc in ["qk"] + (["qk-cuda"] if cuda else []):
            r = run([pkgconf, "--cflags", "--libs", pc], env=env)
            check(r.returncode == 0, "pkg-config --cflags --libs %s (%s)" % (pc, r.stderr.strip()))
            flags = shlex.split(r.stdout)
            print("  %s: %s" % (pc, r.stdout.strip()))
            if pc == "qk":
                check("-lm" in flags and ("-lpthread" in flags or "-pthread" in flags), "qk: -lm and -lpthread")
                check(not any("cuda" in f.lower() for f in flags), "qk: nothing about CUDA")
            else:
                check("-DQK_CUDA=1" in flags and "-lqk_cuda" in flags and "-lstdc++" in flags,
                      "qk-cuda: -DQK_CUDA=1, -lqk_cuda, -lstdc++")
                # cuBLAS is opened with dlopen on first use (qk_cuda.cu), not linked
                check(any("cudart" in f for f in flags) and "-ldl" in flags and not any("cublas" in f for f in flags),
                      "qk-cuda: the CUDA runtime and -ldl, no cuBLAS")
            libdirs = sorted({os.path.dirname(f) for f in flags if f.endswith(".so") and os.path.isabs(f)})
            renv = dict(os.environ, LD_LIBRARY_PATH=":".join(libdirs + [os.environ.get("LD_LIBRARY_PATH", "")]))
            for lang, comp, src in (("C", cc, src_c), ("C++", cxx, src_cpp)):
                exe = os.path.join(d, "consumer_%s_%s" % (pc, "c" if lang == "C" else "cpp"))
                want = "1" if pc == "qk-cuda" else "0"
                # QK_CUDA_BUILD: what the consumer believes it was built with (QK_CUDA from Cflags).
                define = "-DQK_CUDA_BUILD=" + ("QK_CUDA" if pc == "qk-cuda" else "0")
                r = run(comp + [define, src, "-o", exe] + flags)
                check(r.returncode == 0, "%s consumer links with %s and pkg-config %s (%s)"
                      % (lang, " ".join(comp), pc, r.stderr.strip()[-800:]))
                if r.returncode != 0:
                    continue
                r = run([exe], env=renv)
                v = r.stdout.split()
                ok = r.returncode == 0 and len(v) == 3 and all(abs(float(x) - 1) < 1e-6 for x in v[:2])
                check(ok and v[2] == "cuda=" + want, "%s consumer of %s runs: %r" % (lang, pc, (r.stdout + r.stderr).strip()[-300:]))
    if fails:
        print("%d failure(s)" % len(fails))
        return 1
    print("pkgconfig_install: ok")
    return 0


sys.exit(main())
