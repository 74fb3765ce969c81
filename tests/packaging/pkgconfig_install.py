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
import os, shlex, shutil, sys, tempfile

from pkg_common import CONSUMER, check, consumer_output, finish, install, install_args, run


def main():
    meson, build, cuda, cc, cxx = install_args(sys.argv[1:])
    pkgconf = shutil.which("pkg-config") or shutil.which("pkgconf")
    if not pkgconf:
        print("no pkg-config: skipped")
        return 77
    with tempfile.TemporaryDirectory() as d:
        dest = os.path.join(d, "dest")
        pcs = {f[:-3]: os.path.join(root, f) for f, root in install(meson, build, dest).items() if f.endswith(".pc")}
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
            shutil.copy(CONSUMER, p)
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
                out = consumer_output(r)
                ok = out is not None and all(abs(out[0][4 * i] - 1) < 1e-6 for i in range(3))
                check(ok and out[1] == want, "%s consumer of %s runs: %r" % (lang, pc, (r.stdout + r.stderr).strip()[-300:]))
    return finish("pkgconfig_install")


sys.exit(main())
