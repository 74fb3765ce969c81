#!/usr/bin/env python3
"""Runs tests/prof_advice with an output directory, then checks what the reports say of the
injected GPU activities and the advice, against expect.json (what the program injected), not
against the profiler's own tables: the activity counts and the per-kernel-name calls and zones
in report.json, the rules that fired (each with evidence and a fix), one trace event per
activity on a named lane of its GPU stream, the text and HTML advice sections. Every JSON
object is checked for duplicate keys. Usage: prof_advice.py PROF_ADVICE_EXE"""
import os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prof_json import check, fails, load  # noqa: E402  (tests/prof is not a package)

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

        # the HTML timeline: a row per stream of the injected activities, named as the trace names
        # its lane, a box per activity (kernels green "gpu", copies orange "xfer") whose tooltip
        # names the kernel (escaped) and its zone, placed at its start over the wall time
        import html as htmllib, re
        groups = re.findall(r'<div class="lbl" title="([^"]*)">.*?</div><svg[^>]*>(.*?)</svg>', html, re.S)
        cupti = {t: body for t, body in groups if t.endswith("(CUPTI)")}
        want_lanes = {"stream %s (GPU 0) (CUPTI)" % k for k in exp["streams"]}
        check(set(cupti) == want_lanes, "timeline CUPTI rows %s, want %s" % (sorted(cupti), sorted(want_lanes)))
        trace_lanes = {e["args"]["name"] for e in tr if e["ph"] == "M" and e["name"] == "thread_name"}
        check(all(t in trace_lanes for t in cupti), "timeline rows named as the trace's lanes %s" % sorted(trace_lanes))
        wall = rep["wall_ns"]
        for k, want in exp["streams"].items():
            body = cupti.get("stream %s (GPU 0) (CUPTI)" % k, "")
            boxes = re.findall(r'<rect class="box (\w+)[^"]*" x="([\d.]+)%"[^>]*><title>(.*?)</title>', body)
            kind, n = list(want.items())[0]
            check(len(boxes) == n, "stream %s: %d timeline boxes, %d injected" % (k, len(boxes), n))
            cls = {"kernels": "gpu", "copies": "xfer"}[kind]
            check(all(b[0] == cls for b in boxes), "stream %s: boxes of class %s" % (k, cls))
            for b in boxes:
                tip = htmllib.unescape(b[2])
                if kind == "kernels":
                    name = [nm for nm in exp["zones"] if tip.startswith(nm + " in zone ")]
                    ok = len(name) == 1 and tip.startswith("%s in zone %s:" % (name[0], exp["zones"][name[0]]))
                else:
                    ok = tip.startswith("copy in zone %s:" % exp["copy_zone"])
                if not ok:
                    check(False, "stream %s: tooltip %r" % (k, tip))
                    break
            # the first box: the first injected activity of the stream, at 100 us (kernels) or 500 us (copies)
            t0 = {"kernels": 100e3, "copies": 500e3}[kind]
            check(boxes and abs(float(boxes[0][1]) - 100 * t0 / wall) < 1e-3, "stream %s: first box at %s%%, want %.4f%%" % (
                k, boxes and boxes[0][1], 100 * t0 / wall))
    print("prof_advice.py: %d failures" % len(fails))
    return 1 if fails else 0

if __name__ == "__main__":
    sys.exit(main())
