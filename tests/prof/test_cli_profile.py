#!/usr/bin/env python3
"""qk-gram --profile/--trace/--html: qk's own pipeline zones reach the report, the Chrome trace
and the HTML file. The trace is validated by prof_trace_check.check; the number of "gram tile"
zones must equal the tiles of the CPU plan (n=200, 64x64 tiles, symmetric: 4*5/2 = 10); the run
names --device cpu so the CPU plan holds on machines with a GPU too (the GPU zones are checked
by bench/run.sh prof on the GPU machine).
Usage: test_cli_profile.py QK_GRAM. Skips (77) without numpy."""
import json, os, subprocess, sys, tempfile

try:
    import numpy as np
except ImportError:
    sys.exit(77)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prof_trace_check

exe = sys.argv[1]
fails = []
with tempfile.TemporaryDirectory() as d:
    x = os.path.join(d, "x.npy")
    np.save(x, np.random.default_rng().uniform(0, 3, size=(200, 5)))
    rep, tr, html = (os.path.join(d, f) for f in ("rep.txt", "trace.json", "rep.html"))
    p = subprocess.run([exe, "--map", "zz(reps=1)", "--x", x, "--out", os.path.join(d, "K.npy"), "--threads", "2", "--device", "cpu",
                        "--profile", rep, "--trace", tr, "--html", html], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(1)
    text = open(rep).read()
    for zone in ("qk_gram", "validate", "plan", "states", "gram tile"):
        if zone not in text:
            fails.append(f"zone {zone!r} missing from the report")
    if prof_trace_check.check(tr, 0):
        fails.append("trace structure check failed")
    ev = json.load(open(tr))["traceEvents"]
    tiles = [e for e in ev if e.get("ph") == "X" and e.get("name") == "gram tile"]
    if len(tiles) != 10:
        fails.append(f"{len(tiles)} 'gram tile' zones in the trace, the plan has 10 tiles")
    top = [e for e in ev if e.get("ph") == "X" and e.get("name") == "qk_gram"]
    if len(top) != 1 or any(t["ts"] < top[0]["ts"] - 1 or t["ts"] + t["dur"] > top[0]["ts"] + top[0]["dur"] + 1 for t in tiles):
        fails.append("tiles do not lie inside the one qk_gram zone")
    h = open(html).read()
    if "<svg" not in h or "gram tile" not in h:
        fails.append("HTML report lacks the chart or the zone")
    # a bad path: clear error, non-zero exit
    p = subprocess.run([exe, "--map", "zz", "--x", x, "--out", os.path.join(d, "K2.npy"), "--trace",
                        os.path.join(d, "no", "such", "dir", "t.json")], capture_output=True, text=True)
    if p.returncode == 0 or "trace" not in p.stderr:
        fails.append(f"unwritable trace path: exit {p.returncode}, stderr {p.stderr!r}")

    # issue 27, item 1: symlinks planted at the profiler's predictable temporary names (the
    # child's pid is the pid after exec) point at a victim file: the victim must stay as it was,
    # the reports must be written as regular files
    victim = os.path.join(d, "victim.txt")
    with open(victim, "w") as f:
        f.write("DATA\n")
    outs = [os.path.join(d, n) for n in ("plant.txt", "plant.json", "plant.html")]

    def plant():
        pid = os.getpid()
        for o in outs:
            for k in range(3):
                os.symlink(victim, f"{o}.tmp{pid}" + (f".{k}" if k else ""))

    p = subprocess.run([exe, "--map", "zz(reps=1)", "--x", x, "--out", os.path.join(d, "K3.npy"), "--device", "cpu", "--quiet",
                        "--profile", outs[0], "--trace", outs[1], "--html", outs[2]], capture_output=True, text=True,
                       preexec_fn=plant)
    if p.returncode != 0:
        fails.append(f"planted temporary symlinks: exit {p.returncode}, stderr {p.stderr!r}")
    if open(victim).read() != "DATA\n":
        fails.append("planted temporary symlinks: the victim file was overwritten through the link")
    for o in outs:
        if not os.path.isfile(o) or os.path.islink(o) or os.path.getsize(o) == 0:
            fails.append(f"planted temporary symlinks: {os.path.basename(o)} is not a written regular file")

    # issue 27, item 4: the profiler's outputs are checked before any work, as --out is: exit 1,
    # a message naming the option and the path, and no file written (neither K nor another
    # profiler output)
    os.mkdir(os.path.join(d, "adir"))
    bad = [("--profile", os.path.join(d, "nonexist", "p.txt"), "does not exist"),
           ("--trace", os.path.join(d, "nonexist", "t.json"), "does not exist"),
           ("--html", os.path.join(d, "nonexist", "r.html"), "does not exist"),
           ("--html", os.path.join(d, "adir") + "/", "is a directory"),
           ("--trace", os.path.join(d, "adir"), "is a directory"),
           ("--profile", os.path.join(d, "gone") + "/", "ends with '/'"),
           ("--profile", os.path.join(d, "fifo"), "not a regular file")]
    os.mkfifo(os.path.join(d, "fifo"))   # never a device node: the old code renamed over it (as root, /dev/null)
    for opt, path, why in bad:
        kout, good = os.path.join(d, "K4.npy"), os.path.join(d, "good.html" if opt != "--html" else "good.txt")
        other = ["--html" if opt != "--html" else "--profile", good]
        p = subprocess.run([exe, "--map", "zz", "--x", x, "--out", kout, "--device", "cpu", "--quiet", opt, path] + other,
                           capture_output=True, text=True)
        if p.returncode != 1 or opt not in p.stderr or path not in p.stderr or why not in p.stderr:
            fails.append(f"{opt} {path}: exit {p.returncode} (want 1), stderr {p.stderr!r} (want the option, the path, {why!r})")
        if os.path.exists(kout):
            fails.append(f"{opt} {path}: exit {p.returncode} but K was written")
            os.remove(kout)
        if os.path.exists(good):
            fails.append(f"{opt} {path}: exit {p.returncode} but {os.path.basename(good)} was written")
            os.remove(good)
    # --demo checks them too, before its work
    p = subprocess.run([exe, "--demo", "--quiet", "--trace", os.path.join(d, "nonexist", "t.json")], capture_output=True, text=True)
    if p.returncode != 1 or "--trace" not in p.stderr:
        fails.append(f"--demo --trace into a missing directory: exit {p.returncode}, stderr {p.stderr!r}")
for f in fails:
    print("FAIL", f)
print("ok" if not fails else f"{len(fails)} failures")
sys.exit(1 if fails else 0)
