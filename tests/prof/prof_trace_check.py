#!/usr/bin/env python3
"""Validates a qk_prof Chrome trace: it parses; events are X/M/C with numeric fields; host thread
lanes (pid 1) and GPU stream lanes (pid >= 2) are named by M events; at least --min-gpu-lanes GPU
lanes carry X events; GPU zones on one lane nest or follow each other (never partly overlap);
counters are C events. With --run, first runs the program (its last args: trace path, html
path, report path, from a temporary directory) and skips (77) when it does.
Usage: prof_trace_check.py [--min-gpu-lanes N] (TRACE | --run EXE [ARGS...])"""
import json, os, subprocess, sys, tempfile

def check(trace, min_gpu):
    fails = []
    tr = json.load(open(trace))
    ev = tr["traceEvents"]
    bad = [e for e in ev if e.get("ph") not in ("X", "M", "C")]
    if bad:
        fails.append("unexpected events %r" % bad[:2])
    xs = [e for e in ev if e["ph"] == "X"]
    for e in xs:
        if not all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur", "pid", "tid")) or e["dur"] < 0:
            fails.append("bad X event %r" % e)
            break
    named = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    pnamed = {e["pid"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    lanes = {(e["pid"], e["tid"]) for e in xs}
    if not lanes <= named:
        fails.append("lanes without a name: %s" % sorted(lanes - named))
    if not {p for p, _ in lanes} <= pnamed:
        fails.append("processes without a name")
    cpu = {l for l in lanes if l[0] == 1}
    gpu = {l for l in lanes if l[0] >= 2}
    if not cpu:
        fails.append("no host thread lane")
    if len(gpu) < min_gpu:
        fails.append("%d GPU lanes, want >= %d" % (len(gpu), min_gpu))
    partial = 0
    for lane in gpu:
        iv = sorted((e["ts"], e["ts"] + e["dur"]) for e in xs if (e["pid"], e["tid"]) == lane)
        stack = []
        for a, b in iv:
            while stack and stack[-1] <= a + 1e-3:
                stack.pop()
            if stack and b > stack[-1] + 1e-3:
                partial += 1
            stack.append(b)
    if partial:
        fails.append("%d GPU zones partly overlap another on their lane" % partial)
    names = {}
    for e in xs:
        names.setdefault((e["pid"] >= 2, e["name"]), 0)
        names[(e["pid"] >= 2, e["name"])] += 1
    print("trace: %d events, %d host lanes, %d GPU lanes, %d counter samples" % (
        len(ev), len(cpu), len(gpu), sum(1 for e in ev if e["ph"] == "C")))
    for (g, n), c in sorted(names.items()):
        print("  %s %-24s %d" % ("GPU" if g else "CPU", n, c))
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0

def main():
    a = sys.argv[1:]
    min_gpu = 0
    if a[:1] == ["--min-gpu-lanes"]:
        min_gpu = int(a[1])
        a = a[2:]
    if a[:1] == ["--run"]:
        with tempfile.TemporaryDirectory() as d:
            t = os.path.join(d, "trace.json")
            r = subprocess.run(a[1:] + [t, os.path.join(d, "r.html"), os.path.join(d, "r.txt")], capture_output=True, text=True)
            sys.stdout.write(r.stdout[-3000:])
            sys.stderr.write(r.stderr[-3000:])
            if r.returncode == 77:
                return 77
            if r.returncode != 0:
                print("FAIL: program exited %d" % r.returncode)
                return 1
            return check(t, min_gpu)
    return check(a[0], min_gpu)

if __name__ == "__main__":
    sys.exit(main())
