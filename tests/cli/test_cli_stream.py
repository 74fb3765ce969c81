#!/usr/bin/env python3
"""qk-gram's streamed output, end to end on the CPU engine: K is written into K.npy while it is
computed, so a SIGINT / SIGTERM mid-run exits 130 / 143 within a second, removes the temporary
file and leaves the previous K.npy as it was; a full file system (a 2 MB tmpfs in a user
namespace, where unshare allows it) is a clear error with no file left; peak RSS stays O(slab)
for a K of 1.6 GB (n = 20000, float32); --progress writes log lines.

usage: test_cli_stream.py PATH/TO/qk-gram   (exit 77 = skip when numpy is missing)"""
import os, resource, shutil, signal, subprocess, sys, tempfile, time

import cli_common
from cli_common import EXE, check, failures, need_numpy

np = need_numpy("numpy is not installed: skipping")
cli_common.VERBOSE = True
# A sanitizer build (CI's second pass) runs 10-50x slower and maps shadow memory: the timing and
# RSS bounds are for real builds; there the same runs check behaviour only, at a smaller size.
with open(EXE, "rb") as f:
    SANITIZED = b"__asan_init" in f.read()


def temps(d):
    return [f for f in os.listdir(d) if ".tmp." in f]


with tempfile.TemporaryDirectory() as d:
    P = lambda f: os.path.join(d, f)
    rng = np.random.default_rng()
    free_gb = shutil.disk_usage(d).free / 1e9

    # ---- SIGINT / SIGTERM during the compute ----
    np.save(P("x.npy"), rng.uniform(0, 6.28, (20000, 6)))
    # SIGHUP (the terminal or ssh session closed) writes to an output whose name holds an escape
    # sequence: the stop line quotes it escaped, never raw
    for sig, code, kname in ((signal.SIGINT, 130, "K.npy"), (signal.SIGTERM, 143, "K.npy"),
                             (signal.SIGHUP, 129, "K\x1b[2J.npy")):
        with open(P(kname), "wb") as f:
            f.write(b"previous K")
        p = subprocess.Popen([EXE, "--map", "zz(reps=2)", "--x", P("x.npy"), "--out", P(kname), "--device", "cpu",
                              "--precision", "fp32", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        if p.poll() is not None:
            check(False, "%s: the job ended before the signal (too fast to test): rc %d" % (sig.name, p.returncode))
            continue
        t0 = time.perf_counter()
        p.send_signal(sig)
        try:
            out, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        dt = time.perf_counter() - t0
        check(p.returncode == code, "%s: exit %d (got %s): %s" % (sig.name, code, p.returncode, err.strip()))
        if not SANITIZED:
            check(dt < 1.0, "%s: stopped %.2f s after the signal (< 1 s)" % (sig.name, dt))
        check(temps(d) == [], "%s: no temporary file left (%s)" % (sig.name, temps(d)))
        check(open(P(kname), "rb").read() == b"previous K", "%s: the previous K.npy is untouched" % sig.name)
        check("was not written" in err and "\x1b" not in err, "%s: the stop is reported, escaped: %r" % (sig.name, err))
        if sig == signal.SIGHUP:
            check("hung up (SIGHUP)" in err and "K\\x1b[2J.npy" in err, "SIGHUP: named, the output quoted escaped: %r" % err)
        os.remove(P(kname))

    # ---- peak RSS O(slab): K of 1.6 GB (float32, n = 20000) streamed on the CPU engine ----
    if free_gb < 4:
        print("skip: RSS case needs 4 GB of free disk (have %.1f GB)" % free_gb)
    else:
        NR = 1500 if SANITIZED else 20000
        np.save(P("xa.npy"), rng.uniform(0, 3.14, (NR, 4)))
        # the program's own floor (a CUDA build maps its runtime: ~220 MB before any work), read
        # by a fresh interpreter so that the children's maximum starts from zero
        code = ("import resource,subprocess,sys;subprocess.run(sys.argv[1:],capture_output=True);"
                "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        base_mb = int(subprocess.run([sys.executable, "-c", code, EXE, "--version"], capture_output=True,
                                     text=True).stdout.split()[-1]) / 1024.0
        t0 = time.perf_counter()
        r = subprocess.run([EXE, "--map", "angle(rot=y)", "--x", P("xa.npy"), "--out", P("Ka.npy"), "--device", "cpu",
                            "--precision", "fp32", "--progress"], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
        check(r.returncode == 0, "n=20000 streamed: exit 0: " + r.stderr[-300:])
        if not SANITIZED:
            check(rss_mb < base_mb + 350, "n=20000 (K 1.6 GB): peak RSS %.0f MB < %.0f MB (the program's %.0f MB + 350) (%.1f s)"
                  % (rss_mb, base_mb + 350, base_mb, wall))
        check("qk-gram: progress 100.0%" in r.stderr, "--progress writes a final log line: " + r.stderr[-200:])
        if r.returncode == 0:
            K = np.load(P("Ka.npy"), mmap_mode="r")
            X = np.load(P("xa.npy"))
            i, j = rng.integers(0, NR, 50), rng.integers(0, NR, 50)
            ref = np.prod(np.cos((X[i] - X[j]) / 2.0) ** 2, axis=1)   # RY product states: |<u|v>|^2 = cos^2(dx/2)
            check(K.shape == (NR, NR) and K.dtype == np.float32, "K shape and dtype")
            check(np.abs(np.asarray(K[i, j]) - ref).max() < 1e-5, "K entries equal the analytic angle kernel")
            check(np.array_equal(np.asarray(K[i, j]), np.asarray(K[j, i])), "K symmetric")
            del K
            os.remove(P("Ka.npy"))
        print("peak RSS %.0f MB, wall %.2f s, K 1.6 GB" % (rss_mb, wall))

    # ---- the same on the GPU engine, where one is present (the GPU machine runs this suite) ----
    np.save(P("x2.npy"), rng.uniform(0, 6.28, (2, 8)))
    gpu = subprocess.run([EXE, "--map", "zz", "--x", P("x2.npy"), "--out", P("k2.npy"), "--device", "cuda", "--quiet"],
                         capture_output=True, text=True).returncode == 0
    if not gpu or free_gb < 4:
        print("skip: GPU streamed-output case (no CUDA device, or < 4 GB free disk)")
    else:
        np.save(P("x8.npy"), rng.uniform(0, 6.28, (20000, 8)))
        code = ("import resource,subprocess,sys;p=subprocess.run(sys.argv[1:]);"
                "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        r = subprocess.run([sys.executable, "-c", code, EXE, "--map", "zz(reps=2)", "--x", P("x8.npy"), "--out", P("K8.npy"),
                            "--device", "cuda", "--precision", "fp32", "--quiet"], capture_output=True, text=True)
        rc, rss_kb = (int(v) for v in r.stdout.split()[-2:])
        check(rc == 0, "GPU n=20000 streamed: exit 0: " + r.stderr[-300:])
        check(rss_kb / 1024.0 < 1024, "GPU n=20000 (K 1.6 GB): peak RSS %.0f MB < 1024 MB" % (rss_kb / 1024.0))
        if rc == 0:
            K = np.load(P("K8.npy"), mmap_mode="r")
            i = rng.integers(0, 20000, 40)
            check(np.abs(np.asarray(K[i, i]) - 1).max() < 1e-4 and np.array_equal(np.asarray(K[i[:20]][:, i[20:]]), np.asarray(K[i[20:]][:, i[:20]]).T),
                  "GPU streamed K: unit diagonal, symmetric")
            del K
            os.remove(P("K8.npy"))

    # ---- a full file system: clear error, nothing left ----
    have_unshare = shutil.which("unshare") and subprocess.run(
        ["unshare", "-Urm", "true"], capture_output=True).returncode == 0
    if not have_unshare:
        print("skip: ENOSPC case needs unshare -Urm (user namespaces)")
    else:
        os.mkdir(P("small"))
        np.save(P("x1.npy"), rng.uniform(0, 6.28, (1500, 4)))
        script = 'mount -t tmpfs -o size=2m tmpfs "$1" && "$2" --map "zz(reps=2)" --x "$3" --out "$1/K.npy" --device cpu; rc=$?; ls -A "$1"; exit $rc'
        r = subprocess.run(["unshare", "-Urm", "sh", "-c", script, "sh", P("small"), EXE, P("x1.npy")],
                           capture_output=True, text=True)
        check(r.returncode == 1, "full file system: exit 1 (got %d)" % r.returncode)
        check("No space left on device" in r.stderr and "K.npy" in r.stderr, "full file system: clear message: " + r.stderr.strip()[-300:])
        check(r.stdout.strip().splitlines()[-1:] != ["K.npy"] and ".tmp." not in r.stdout,
              "full file system: no file left in the tmpfs: " + repr(r.stdout[-200:]))

if failures:
    print("%d failures" % len(failures))
    sys.exit(1)
print("all ok")
