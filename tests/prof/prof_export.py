#!/usr/bin/env python3
"""Runs tests/prof/prof_stats with an output directory, then checks what it wrote, independently:
report.json statistics against the drawn durations (python statistics), trace.json structure
(ph X/M/C, lanes, nesting, counter running sums, names round-tripped), the buffer-full trace,
report.txt tables, HTML escaping and the HTML timeline (a lane per nesting depth holding the
trace's zones of that depth, a tooltip on every bar and box, no fixed width, honest headers).
Every JSON object is checked for duplicate keys. Usage: prof_export.py PROF_STATS_EXE"""
import html.parser, math, os, re, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prof_json import check, fails, load  # noqa: E402  (tests/prof is not a package)

def close(a, b, rel=1e-9, abs_=1e-6):
    return abs(a - b) <= abs_ + rel * abs(b)

def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([exe, d], capture_output=True, text=True)
        sys.stderr.write(r.stderr)
        check(r.returncode == 0, "prof_stats exited %d" % r.returncode)
        sched = load(os.path.join(d, "schedule.json"))
        npt = sched["ns_per_tick"]
        weird = sched["weird"]
        rep = load(os.path.join(d, "report.json"))
        zones = {z["name"]: z for z in rep["cpu_zones"]}
        for name in ("outer", "inner", weird):
            durs = [x * npt for x in sched[name]]
            z = zones.get(name)
            check(z is not None, "zone %r in report.json" % name)
            if not z:
                continue
            check(z["calls"] == len(durs), "%r calls %s != %d" % (name, z["calls"], len(durs)))
            check(close(z["total_ns"], math.fsum(durs)), "%r total" % name)
            check(close(z["min_ns"], min(durs)) and close(z["max_ns"], max(durs)), "%r min/max" % name)
            check(close(z["mean_ns"], statistics.fmean(durs)), "%r mean" % name)
            check(close(z["std_ns"], statistics.pstdev(durs), rel=1e-7), "%r std %s vs %s" % (name, z["std_ns"], statistics.pstdev(durs)))
            check(close(z["pct_wall"], 100 * z["total_ns"] / rep["wall_ns"]), "%r pct" % name)
        check(zones["inner"]["sites"] == 2, "inner merges two call sites")
        # step statistics (QK_PROF_STEP per outer zone, warm-up 1): the outer zone's per-step
        # series is its durations less the first; percentiles by statistics.quantiles (inclusive
        # = linear interpolation), the trend by statistics.linear_regression
        steps = rep.get("steps")
        check(steps is not None, "report.json has steps")
        if steps:
            so = [z for z in steps["zones"] if z["name"] == "outer" and not z["gpu"]]
            series = [x * npt for x in sched["outer"][1:]]
            check(steps["warmup"] == 1 and steps["ended"] == len(sched["outer"]), "steps ended / warm-up")
            check(len(so) == 1 and so[0]["steps"] == len(series), "outer per-step series length")
            if so:
                q = statistics.quantiles(series, n=100, method="inclusive")
                for key, want in (("mean_ns", statistics.fmean(series)), ("min_ns", min(series)),
                                  ("max_ns", max(series)), ("p50_ns", q[49]), ("p95_ns", q[94]), ("p99_ns", q[98])):
                    check(close(so[0][key], want), "outer per step %s %s vs %s" % (key, so[0][key], want))
                if hasattr(statistics, "linear_regression"):
                    slope = statistics.linear_regression(list(range(len(series))), series).slope
                    check(close(so[0]["trend_ns_per_step"], slope, rel=1e-6, abs_=1e-6), "outer trend %s vs %s"
                          % (so[0]["trend_ns_per_step"], slope))
            st = steps["step"]
            check(st["steps"] == len(series) and st["min_ns"] >= so[0]["min_ns"] if so else False,
                  "step time covers the outer zone")
        # self (exclusive) time: outer less the inner and weird zones nested in it; leaves = total
        for name in ("outer", "inner", weird):
            z = zones.get(name, {})
            check("self_ns" in z and "self_pct_wall" in z, "%r has self_ns and self_pct_wall" % name)
        if "self_ns" in zones.get("outer", {}):
            check(close(zones["outer"]["self_ns"], sched["outer_self"] * npt), "outer self_ns %s vs %s"
                  % (zones["outer"]["self_ns"], sched["outer_self"] * npt))
            check(close(zones["outer"]["self_ns"], zones["outer"]["total_ns"] - zones["inner"]["total_ns"]
                        - zones[weird]["total_ns"]), "outer self = total - its children's totals")
            check(close(zones["inner"]["self_ns"], zones["inner"]["total_ns"]), "inner (a leaf): self = total")
            check(close(zones["outer"]["self_pct_wall"], 100 * zones["outer"]["self_ns"] / rep["wall_ns"]), "outer self pct")
            check(all("self_ns" not in z for z in rep["gpu_zones"]), "GPU zones carry no self_ns")
        top = rep["top"]
        want = sorted(rep["cpu_zones"], key=lambda z: -z["total_ns"])[:10]
        check([t["name"] for t in top] == [z["name"] for z in want] and top[0]["gpu"] is False,
              "top list = zones by total, largest first")
        check(all(t.get("self_ns") == zones[t["name"]].get("self_ns") for t in top if not t["gpu"]),
              "top list: the CPU zones' self_ns")
        ctr = {c["name"]: c for c in rep["counters"]}
        check(close(ctr["tiles"]["sum"], sched["tiles"]) and ctr["tiles"]["kind"] == "add", "tiles counter sum")
        check(close(ctr["temp"]["last"], sched["temp_last"]) and ctr["temp"]["kind"] == "set", "temp counter last")
        mem = rep["memory"]["kinds"]["host"]
        check(mem["current"] == sched["host_current"] and mem["peak"] == sched["host_peak"], "memory current/peak %s" % mem)
        xf = {(x["dir"], x["pinned"]): x for x in rep["transfers"]}
        h2d = xf.get(("H2D", True))
        check(h2d is not None and h2d["count"] == 2 and close(h2d["gbps"], 1.5e9 / 0.2 / 1e9), "H2D pinned GB/s")
        check(h2d is not None and close(h2d["min_gbps"], 5.0) and close(h2d["max_gbps"], 10.0), "H2D min/max GB/s")
        check(("D2H", False) in xf and close(xf[("D2H", False)]["gbps"], 2.0), "D2H pageable GB/s")
        check(rep["dropped"]["mismatched"] == 1 and rep["dropped"]["unbalanced"] >= 1, "mismatch/unbalanced counts")

        tr = load(os.path.join(d, "trace.json"))
        ev = tr["traceEvents"]
        check(all(e["ph"] in ("X", "M", "C") for e in ev), "only X/M/C events")
        xs = [e for e in ev if e["ph"] == "X"]
        for e in xs:
            ok = all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur", "pid", "tid")) and e["dur"] >= 0
            if not ok:
                check(False, "X event fields %r" % e)
                break
        names = {}
        for e in xs:
            names[e["name"]] = names.get(e["name"], 0) + 1
        for name in ("outer", "inner", weird):
            check(names.get(name) == len(sched[name]), "trace X count for %r: %s vs %d" % (name, names.get(name), len(sched[name])))
        tids = {e["tid"] for e in xs}
        tnames = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
        check(tids <= set(tnames), "every lane has a thread_name")
        check('main "thread"' in tnames.values(), "thread name round-trips with its quotes")
        # nesting: each depth-1 zone lies inside a depth-0 zone of the same lane
        tops = sorted((e["ts"], e["ts"] + e["dur"]) for e in xs if e["args"]["depth"] == 0)
        import bisect
        starts = [a for a, _ in tops]
        bad = 0
        for e in xs:
            if e["args"]["depth"] != 1:
                continue
            i = bisect.bisect_right(starts, e["ts"] + 5e-3) - 1
            if i < 0 or not (tops[i][0] - 5e-3 <= e["ts"] and e["ts"] + e["dur"] <= tops[i][1] + 5e-3):  # ts, dur in us with 3 decimals
                bad += 1
        check(bad == 0, "%d nested zones outside their parent" % bad)
        check(sum(1 for e in xs if e["args"]["depth"] == 1 and e["name"] not in ("rec", "leaf", "kid"))
              == len(sched["inner"]) + len(sched[weird]), "depth-1 zones = inner + weird (+ the self-time block's)")
        cs = [e for e in ev if e["ph"] == "C" and e["name"] == "tiles"]
        check(cs and close(cs[-1]["args"]["value"], sched["tiles"]) and all(
            cs[i]["ts"] <= cs[i + 1]["ts"] for i in range(len(cs) - 1)), "tiles counter running sum in trace")
        check(any(e["ph"] == "C" and e["name"] == "tracked memory" for e in ev), "memory counter track")

        full = load(os.path.join(d, "full.json"))
        check(sum(1 for e in full["traceEvents"] if e["ph"] == "X") == 8192, "buffer-full trace keeps exactly 8192 events")

        txt = open(os.path.join(d, "report.txt")).read()
        for key in ("CPU zones", "Top ", "Memory (tracked)", "Transfers", "Counters", "outer", "inner", "self ms", "self %"):
            check(key in txt, "report.txt has %r" % key)
        check(all(len(l) < 400 for l in txt.splitlines()), "report.txt lines are bounded")
        check("\\ttab\\nnewli" in txt, "control characters are escaped in report.txt")
        # the text table's self column: outer's row, "self ms" under its header, in ms
        head = next((l for l in txt.splitlines() if l.startswith("CPU zones")), "")
        row = next((l for l in txt.splitlines() if l.startswith("outer ")), "")
        cols = head.split("  ")
        m = re.match(r"outer\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s", row)
        check(m is not None and "self ms" in head and head.index("self ms") < head.index("mean us"), "report.txt: self columns")
        if m and "self_ns" in zones.get("outer", {}):
            # printed to d decimals: within half a unit of the last one (and a hair for the
            # binary value at the rounding boundary: 0.0435 prints 0.043 or 0.044)
            nd = len(m.group(4).split(".")[1]) if "." in m.group(4) else 0
            check(abs(float(m.group(4)) - zones["outer"]["self_ns"] * 1e-6) <= 0.5 * 10.0 ** -nd + 1e-9,
                  "report.txt outer self ms %s (json %.9f)" % (m.group(4), zones["outer"]["self_ns"] * 1e-6))

        h = open(os.path.join(d, "report.html")).read()
        check("<tag>" not in h and "&lt;tag&gt;" in h, "HTML escapes < and >")
        check("<th>self ms</th>" in h and "Self time" in h, "HTML zone table has a self time column, explained")
        check("&quot;" in h and "&amp;" in h, "HTML escapes quotes and &")
        check("http://" not in h.replace("http://www.w3.org/2000/svg", "") and "https://" not in h, "HTML has no network reference")
        check("<script" not in h, "HTML has no script")
        class P(html.parser.HTMLParser):
            def __init__(s):
                super().__init__()
                s.stack, s.err, s.svgs = [], 0, 0
            def handle_starttag(s, tag, attrs):
                if tag == "svg":
                    s.svgs += 1
                if tag not in ("meta", "rect", "polyline", "br"):
                    s.stack.append(tag)
            def handle_startendtag(s, tag, attrs):
                pass
            def handle_endtag(s, tag):
                if tag in ("rect", "polyline"):
                    return
                if not s.stack or s.stack[-1] != tag:
                    s.err += 1
                else:
                    s.stack.pop()
        p = P()
        p.feed(h)
        check(p.err == 0 and not p.stack, "HTML tags balance (%d errors, open %s)" % (p.err, p.stack[-3:]))
        check(p.svgs >= 3, "HTML has the SVG charts (%d)" % p.svgs)
        check("Top bottlenecks" in h, "HTML has the top-N table")
        check("exceeds 100 %" in h, "HTML explains why a total can exceed 100 % of wall")
        check("CPU vs GPU" not in h and "Busy share of wall time per thread" in h,
              "HTML says 'CPU vs GPU' only where there is a GPU")
        check(not re.search(r'<svg[^>]*\swidth="\d', h) and "svg{display:block;width:100%}" in h,
              "HTML charts have no fixed pixel width (responsive)")
        class T(html.parser.HTMLParser):
            """Timeline boxes (rect.box: lane y, tooltip) and bars, with their <title> tooltips."""
            def __init__(s):
                super().__init__()
                s.boxes, s.bars, s.cur, s.in_title = [], [], None, False
            def handle_starttag(s, tag, attrs):
                a = dict(attrs)
                if tag == "rect" and "box" in a.get("class", "").split():
                    s.cur = {"y": float(a["y"]), "title": ""}
                    s.boxes.append(s.cur)
                elif tag == "rect" and a.get("class") in ("cpu", "gpu", "xfer"):
                    s.cur = {"title": ""}
                    s.bars.append(s.cur)
                elif tag == "title" and s.cur is not None:
                    s.in_title = True
            def handle_endtag(s, tag):
                if tag == "title":
                    s.in_title = False
                elif tag == "rect":
                    s.cur = None
            def handle_data(s, data):
                if s.in_title and s.cur is not None:
                    s.cur["title"] += data
        t = T()
        t.feed(h)
        check(t.boxes and all(b["title"] for b in t.boxes) and t.bars and all(b["title"] for b in t.bars),
              "every timeline box and bar has a tooltip (%d boxes, %d bars)" % (len(t.boxes), len(t.bars)))
        by_depth = {}
        for e in xs:
            if e["cat"] == "cpu":
                by_depth[e["args"]["depth"]] = by_depth.get(e["args"]["depth"], 0) + 1
        lanes = {}
        for b in t.boxes:
            m = re.search(r"depth (\d+)$", b["title"])
            d_ = int(m.group(1)) if m else -1
            lanes.setdefault(d_, set()).add(b["y"])
            by_depth[d_] = by_depth.get(d_, 0) - 1
        check(len(lanes) >= 2 and all(len(v) == 1 for v in lanes.values()) and
              len({min(v) for v in lanes.values()}) == len(lanes),
              "timeline: one lane per nesting depth (%s)" % {k: sorted(v) for k, v in lanes.items()})
        check(lanes.get(0) and lanes.get(1) and min(lanes[1]) > min(lanes[0]), "timeline: nested zones under their parents")
        check(all(v == 0 for v in by_depth.values()), "timeline boxes per depth = the trace's zones per depth (%s)" % by_depth)
    if fails:
        print("%d failure(s)" % len(fails))
        return 1
    print("prof_export: ok")
    return 0

sys.exit(main())
