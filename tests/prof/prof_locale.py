#!/usr/bin/env python3
"""Runs tests/prof/prof_locale (the host program sets de_DE.UTF-8, a ',' decimal point) and checks
what it wrote: report.json and trace.json parse as JSON (no duplicate keys) and hold the
numbers of the injected clock (0.43478 ns per tick); report.html and report.txt hold no number
with a decimal comma. Exit 77 (skip) where the locale is not installed (the program says so).
Usage: prof_locale.py PROF_LOCALE_EXE"""
import math, os, re, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prof_json import check, fails, load  # noqa: E402  (tests/prof is not a package)

def main():
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.argv[1], d], capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode == 77:
            return 77
        check(r.returncode == 0, "prof_locale exited %d" % r.returncode)
        npt = 0.43478
        try:
            rep = load(os.path.join(d, "report.json"))
        except ValueError as e:
            check(False, "report.json is not JSON under de_DE: %s" % e)
            rep = None
        if rep:
            check(rep["ns_per_tick"] == npt, "ns_per_tick %r" % rep["ns_per_tick"])
            z = {x["name"]: x for x in rep["cpu_zones"]}
            check(math.isclose(z["inner"]["total_ns"], 3 * 777 * npt, rel_tol=1e-12), "inner total %r" % z["inner"]["total_ns"])
            check(math.isclose(z["outer"]["mean_ns"], 1778 * npt, rel_tol=1e-12), "outer mean %r" % z["outer"]["mean_ns"])
            c = {x["name"]: x for x in rep["counters"]}
            check(c["temperature"]["last"] == 23.5, "counter last %r" % c["temperature"]["last"])
            x = rep["transfers"][0]
            check(math.isclose(x["gbps"], 12.0, rel_tol=1e-12), "transfer GB/s %r" % x["gbps"])
        try:
            tr = load(os.path.join(d, "trace.json"))
        except ValueError as e:
            check(False, "trace.json is not JSON under de_DE: %s" % e)
            tr = None
        if tr:
            xs = [e for e in tr["traceEvents"] if e["ph"] == "X" and e["name"] == "inner"]
            check(len(xs) == 3 and all(abs(e["dur"] - 777 * npt * 1e-3) < 1e-3 for e in xs),
                  "trace inner durations %r" % [e["dur"] for e in xs])
        comma = re.compile(r"\d,\d")
        for name in ("report.html", "report.txt"):
            t = open(os.path.join(d, name), encoding="utf-8").read()
            m = comma.search(t)
            check(m is None, "%s has a decimal comma: %r" % (name, t[max(0, m.start() - 40):m.end() + 40] if m else ""))
        t = open(os.path.join(d, "report.txt"), encoding="utf-8").read()
        check("0.4348 ns/tick" in t, "report.txt states the clock with a '.'")
    if fails:
        print("%d failure(s)" % len(fails))
        return 1
    print("prof_locale: ok")
    return 0

sys.exit(main())
