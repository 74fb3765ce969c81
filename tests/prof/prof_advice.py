#!/usr/bin/env python3
"""Runs tests/prof_advice with an output directory, then checks what the reports say of the
injected GPU activities and the advice, against expect.json (what the program injected), not
against the profiler's own tables: the activity counts and the per-kernel-name calls and zones
in report.json, the rules that fired (each with evidence and a fix), one trace event per
activity on a named lane of its GPU stream, the text and HTML advice sections. Every JSON
object is checked for duplicate keys. Usage: prof_advice.py PROF_ADVICE_EXE"""
import json, os, subprocess, sys, tempfile

fails = []
def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)

def load(path):
    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        check(not dup, "%s: duplicate keys %s" % (os.path.basename(path), dup))
        return dict(pairs)
    with open(path) as f:
        return json.load(f, object_pairs_hook=no_dups)

def main():
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.argv[1], d], capture_output=True, text=True)
        sys.stdout.write(r.stdout[-3000:])
        sys.stderr.write(r.stderr)
        check(r.returncode == 0, "prof_advice exited %d" % r.returncode)
        exp = load(os.path.join(d, "expect.json"))
        rep = load(os.path.join(d, "report.json"))
        act = rep.get("activities", {})
        check(act.get("kernels") == exp["kernels"], "activities.kernels %s != %s" % (act.get("kernels"), exp["kernels"]))
        check(act.get("memcpys") == exp["memcpys"], "activities.memcpys %s != %s" % (act.get("memcpys"), exp["memcpys"]))
        check(act.get("cupti") == "off", "cupti off without desc.cupti")
        names = {k["name"]: k for k in act.get("kernel_names", [])}
        check(set(names) == set(exp["zones"]), "kernel names %s" % sorted(names))
        for n, z in exp["zones"].items():
            k = names.get(n, {})
            check(k.get("calls") == exp["per_step"][n] * exp["steps"], "%s calls %s" % (n, k.get("calls")))
            check(k.get("zone") == z, "%s zone %s != %s" % (n, k.get("zone"), z))
        check(sum(c["count"] for c in act.get("copies", [])) == exp["memcpys"], "copies table sums to the copies")
        rules = sorted(a["rule"] for a in rep.get("advice", []))
        check(rules == sorted(exp["rules"]), "advice %s != %s" % (rules, exp["rules"]))
        for a in rep.get("advice", []):
            check(a["where"] and a["evidence"] and a["fix"] and a["impact_ns"] >= 0, "advice %s complete" % a["rule"])
        impacts = [a["impact_ns"] for a in rep.get("advice", [])]
        check(impacts == sorted(impacts, reverse=True), "advice sorted by impact")

        tr = load(os.path.join(d, "trace.json"))["traceEvents"]
        cup = [e for e in tr if e.get("cat") == "cupti"]
        check(len(cup) == exp["kernels"] + exp["memcpys"], "trace: %d cupti events" % len(cup))
        lanes = {(e["pid"], e["tid"]) for e in tr if e["ph"] == "M" and e["name"] == "thread_name"}
        check(all((e["pid"], e["tid"]) in lanes for e in cup), "every CUPTI event on a named lane")
        check(all(e["pid"] >= 2 for e in cup), "kernels and copies in a GPU process")
        for e in cup:
            if e["name"] in exp["zones"]:
                check(e["args"]["zone"] == exp["zones"][e["name"]], "trace zone of %s" % e["name"])
                break
        txt = open(os.path.join(d, "report.txt")).read()
        html = open(os.path.join(d, "report.html")).read()
        check("\nAdvice (" in txt and "<h2>Advice</h2>" in html, "advice sections")
        for rule in exp["rules"]:
            check("[%s]" % rule in txt and "<b>%s</b>" % rule in html, "rule %s in text and HTML" % rule)
        check("GPU kernels" in txt and "<h2>GPU kernels</h2>" in html, "kernel tables")
    print("prof_advice.py: %d failures" % len(fails))
    return 1 if fails else 0

if __name__ == "__main__":
    sys.exit(main())
