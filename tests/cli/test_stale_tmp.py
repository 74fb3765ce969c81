#!/usr/bin/env python3
"""Stale temporary files of K.npy (docs/cli.md, "Output files"): a run of qk-gram removes the
temporaries of its --out that dead processes of this host left (K.npy.tmp.<pid>.<k>.<host>, the
pid not running), and never a live process's, another host's, another output's, or a name of
another form; a symlink at such a name is removed as a link (its target is left).

usage: test_stale_tmp.py PATH/TO/qk-gram   (exit 77 = skip off Linux)"""
import os, re, subprocess, sys, tempfile

if not sys.platform.startswith("linux") or not os.path.isdir("/proc/self"):
    print("stale temporaries are recognised on Linux (/proc) only: skipping")
    sys.exit(77)

EXE = os.path.abspath(sys.argv[1])
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


host = re.sub(r"[^A-Za-z0-9-]", "_", os.uname().nodename)[:40]
p = subprocess.Popen(["true"])
p.wait()
dead = p.pid   # reaped: not running (pid reuse within the test is not expected)
while os.path.exists("/proc/%d" % dead):   # reused after all: another dead pid
    p = subprocess.Popen(["true"])
    p.wait()
    dead = p.pid
sleeper = subprocess.Popen(["sleep", "120"])
try:
    with tempfile.TemporaryDirectory() as d:
        P = lambda f: os.path.join(d, f)
        with open(P("X.csv"), "w") as f:
            f.write("0.1,0.2\n0.3,0.4\n0.5,0.6\n")
        with open(P("K.npy"), "wb") as f:
            f.write(b"previous K")
        with open(P("victim"), "wb") as f:
            f.write(b"victim data")
        gone = ["K.npy.tmp.%d.0.%s" % (dead, host), "K.npy.tmp.%d.7.%s" % (dead, host)]
        kept = ["K.npy.tmp.%d.0.%s" % (sleeper.pid, host),        # a live process's
                "K.npy.tmp.%d.1.%s" % (os.getpid(), host),        # this test's own (alive)
                "K.npy.tmp.%d.0.%s" % (dead, host + "x"),         # another host's
                "K.npy.tmp.%d.0" % dead,                          # no host in the name
                "L.npy.tmp.%d.0.%s" % (dead, host),               # another output's
                "K.npy.tmp.%dx.0.%s" % (dead, host)]              # not a pid
        for f in gone + kept:
            with open(P(f), "wb") as fh:
                fh.write(b"\x93NUMPY partial")
        link = "K.npy.tmp.%d.2.%s" % (dead, host)
        os.symlink(P("victim"), P(link))
        r = subprocess.run([EXE, "--map", "zz", "--x", P("X.csv"), "--out", P("K.npy"), "--device", "cpu", "--quiet"],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, "qk-gram exit 0 (got %d): %s" % (r.returncode, r.stderr.strip()))
        left = set(os.listdir(d))
        for f in gone:
            check(f not in left, "a dead process's temporary %s is removed" % f)
        check(link not in left, "a symlink at a dead process's temporary name is removed")
        with open(P("victim"), "rb") as fh:
            check(fh.read() == b"victim data", "the symlink's target is left as it was")
        for f in kept:
            check(f in left, "%s is kept" % f)
        with open(P("K.npy"), "rb") as fh:
            check(fh.read(6) == b"\x93NUMPY", "K.npy is written")
finally:
    sleeper.kill()
    sleeper.wait()

if failures:
    print("%d failures" % len(failures))
    sys.exit(1)
print("ok")
