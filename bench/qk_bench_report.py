#!/usr/bin/env python3
"""Joins qk-bench's JSON with the peer's (torch_qk.py, same job) and prints one table: qk, the
peer, the ratio, the issue's target and the ceiling of PERFORMANCE.md in the same rows. Where the
JSON has the roof case's rows (qk-bench --cases roof), it then prints issue 26's table as
markdown: each row with its floor (the bound that binds), its share of the floor and the target.

Usage: qk_bench_report.py [--roofline] BENCH.json [PEER.json]   (the files bench/run.sh gpu-bench
                                                                writes; the peer is optional)
       qk_bench_report.py [--roofline] RESULT.json             (a bench/results/ file: both inside)
--roofline: the roofline table alone.
"""
import json, os, sys

# case -> (peer map, qubits, n, peer field, target, ceiling, unit); H200 figures (issue 3, PERFORMANCE.md)
CASES = {
    "zz4": ("zz", 4, 32768, "gram_device_Gpairs_s", 500, "860 compute / 1060 write"),
    "zz8": ("zz", 8, 32768, "gram_device_Gpairs_s", 50, "54"),
    "zz12": ("zz", 12, 16384, "gram_device_Gpairs_s", 3.3, "3.4"),
    "zz16": ("zz", 16, 4096, "gram_device_Gpairs_s", 0.2, "0.21"),
    "hea12": ("hea", 12, 16384, "gram_device_Gpairs_s", 12, "13.4"),
    "host8": ("zz", 8, 32768, "gram_host_Gpairs_s", 12, "PCIe 13.7"),
}

# Issue 26's table: (label, qubits, precision asked, "gram" or "states"), in its order
ROOF = [
    ("4 q, n=32768, default", 4, "default", "gram"),
    ("7 q, n=32768, default", 7, "default", "gram"),
    ("8 q, n=32768, default", 8, "default", "gram"),
    ("8 q, fp32x3", 8, "fp32x3", "gram"),
    ("8 q, fp16", 8, "fp16", "gram"),
    ("12 q, n=16384, fp32x3", 12, "fp32x3", "gram"),
    ("12 q, fp16", 12, "fp16", "gram"),
    ("16 q, n=4096, fp32x3", 16, "fp32x3", "gram"),
    ("16 q, fp16", 16, "fp16", "gram"),
    ("states, 16 q", 16, "fp32", "states"),
]
# issue 26's targets (stated for the H100, "and the H200 likewise"): Gpairs/s at 8 qubits; 12 and
# 16 qubits "in proportion", read here as the same gain over the issue's H100 figures
# (ISSUE_H100: the issue's table, Gpairs/s, by (qubits, mode))
TARGET_8Q = {"fp32x3": 130.0, "fp16": 350.0}
ISSUE_H100 = {(8, "fp32x3"): 73.4, (8, "fp16"): 188.6, (12, "fp32x3"): 11.0, (12, "fp16"): 32.1,
              (16, "fp32x3"): 0.62, (16, "fp16"): 1.63}
TARGET_4Q_SHARE = 0.90       # of the write floor
TARGET_STATES_16Q = 1.5e6    # states/s


def peer_rows(p):
    """the peer's rows: torch_qk.py writes a list; some records wrap it as {"run": ..., "rows": [...]}"""
    if isinstance(p, dict):
        p = p.get("rows") or []
    return [r for r in p or [] if isinstance(r, dict)]


def load(args):
    """(bench header dict, qk rows, peer rows) from BENCH.json [PEER.json] or RESULT.json"""
    d = json.load(open(args[0]))
    if "qk" in d:   # a record: the bench's rows, or its whole JSON, beside the peer's
        qk = d.get("qk") or []
        return (qk, qk.get("rows") or [], peer_rows(d.get("peer"))) if isinstance(qk, dict) else (d, qk, peer_rows(d.get("peer")))
    peer = []
    if len(args) > 1:
        if os.path.exists(args[1]):
            peer = peer_rows(json.load(open(args[1])))
        else:
            print(f"(no peer: {args[1]} is missing)")
    return d, d.get("rows") or [], peer


def fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "states":
        return f"{v / 1e6:.2f} M/s" if v >= 1e5 else f"{v / 1e3:.1f} k/s"
    return f"{v:.3g}" if v < 10 else f"{v:.1f}"


def roofline(head, rows, peer):
    roof = [r for r in rows if r.get("roof")]
    probes = head.get("probe") or []
    print(f"\n### Issue 26's table: {head.get('gpu', 'GPU ?')}, commit {head.get('commit', '?')}\n")
    floors = []
    for p in probes:
        if p.get("probe") == "write floor (cudaMemset)":
            floors.append(f"write of K n={p['n']}: {p['Gpairs_s']:.0f} Gpairs/s")
        elif p.get("probe") in ("hgemm fp16 in, fp32 acc", "sgemm tf32", "sgemm fp32") and p.get("tflops"):
            floors.append(f"{p['probe']}: {p['tflops']:.0f} TFLOP/s")
    if floors:
        print("Floors measured in the job: " + "; ".join(floors) + ".\n")
    print("| case | qk | peer | floor (bound) | share | target |")
    print("|---|---|---|---|---|---|")

    def find(q, asked, metric):
        return next((r for r in roof if r.get("qubits") == q and r.get("asked") == asked and r.get("roof") == metric), None)

    def peer_of(q, n):
        return next((p for p in peer if p.get("map") == "zz" and p.get("qubits") == q and (n is None or p.get("n") == n)), None)

    for label, q, asked, metric in ROOF:
        r = find(q, asked, metric)
        if not r:
            print(f"| {label} | not measured | | | | |")
            continue
        p = peer_of(q, r.get("n"))
        what = f"{r.get('kernel', r.get('engine', '?'))}, {r.get('precision', '?')}"
        share = r.get("share")
        target = ""
        if metric == "states":
            v, fl = r.get("states_per_s"), r.get("floor_states_per_s")
            qk = f"{fmt(v, 'states')} ({what})"
            pv = fmt(p.get("states_per_s"), "states") if p and p.get("states_per_s") else "-"
            floor = f"{fmt(fl, 'states')} ({r.get('bound', '?')})"
            if v is not None:
                target = f">= {TARGET_STATES_16Q / 1e6:.1f} M/s: {'met' if v >= TARGET_STATES_16Q else 'not met'}"
        else:
            v, fl = r.get("Gpairs_s", r.get("gram_Gpairs_s")), r.get("floor_Gpairs_s")
            qk = f"{fmt(v)} ({what})"
            pv = fmt(p.get("gram_device_Gpairs_s")) if p and p.get("gram_device_Gpairs_s") is not None else "-"
            cf, wf = r.get("compute_floor_Gpairs_s"), r.get("write_floor_Gpairs_s")
            other = f"compute {fmt(cf)}" if r.get("bound", "").startswith("write") and cf else f"write {fmt(wf)}" if wf else ""
            floor = f"{fmt(fl)} ({r.get('bound', '?')}{'; ' + other if other else ''})"
            if q == 4 and wf and v is not None:
                s = v / wf
                target = f">= {TARGET_4Q_SHARE:.0%} of the write floor ({s:.0%}): {'met' if s >= TARGET_4Q_SHARE else 'not met'}"
            elif q == 8 and asked in TARGET_8Q and v is not None:
                t = TARGET_8Q[asked]
                target = f">= {t:.0f} (H100): {'met' if v >= t else 'not met'}"
            elif (q, asked) in ISSUE_H100 and v is not None:
                was, gain = ISSUE_H100[(q, asked)], TARGET_8Q[asked] / ISSUE_H100[(8, asked)]
                target = f"~{fmt(was * gain)} ({fmt(was)} x {gain:.2f}, as 8 q; H100): {'met' if v >= was * gain else 'not met'}"
            elif asked == "default":
                target = "the fastest fp32-class mode"
        sh = f"{share:.1%}" if share is not None else "-"
        print(f"| {label} | {qk} | {pv} | {floor} | {sh} | {target} |")


def main():
    argv = sys.argv[1:]
    only_roof = "--roofline" in argv
    args = [a for a in argv if a != "--roofline"]
    if not args or len(args) > 2:
        sys.exit(__doc__)
    head, rows, peer = load(args)
    if not only_roof:
        if any(r.get("case") in CASES for r in rows) or not any(r.get("roof") for r in rows):
            print(f"{'case':6} {'output':20} {'engine':28} {'qk Gpairs/s':>12} {'peer':>8} {'ratio':>6} {'target':>7} {'ceiling':>24}")
        for r in rows:
            c = CASES.get(r["case"])
            if not c:
                continue
            m, q, n, field, target, ceil = c
            p = next((x for x in peer if x["map"] == m and x["qubits"] == q and x["n"] == n), None)
            qk = r["output_Gpairs_s"] if r["output"].startswith("host") else r["gram_Gpairs_s"]
            pv = p[field] if p else float("nan")
            print(f"{r['case']:6} {r['output']:20} {r['engine']:28} {qk:12.3f} {pv:8.3f} {qk / pv:6.2f} {target:7} {ceil:>24}")
        for r in rows:
            if r["case"] == "zz16" and "planned" in r["engine"]:
                p = next((x for x in peer if x["map"] == "zz" and x["qubits"] == 16), None)
                if p:
                    print(f"states 16 qubits: qk {r['states_per_s']:.0f}/s, peer {p['states_per_s']}/s, ratio {r['states_per_s'] / p['states_per_s']:.1f}, target 1e6/s")
            if r["case"] == "e2e8":
                print(f"e2e8 {r['output']:20}: {r['e2e_ms']:.1f} ms (target <= 60 ms)")
            if r["case"] == "amp16":
                print(f"amplitude encode 16 q batch 64: {r['states_per_s']:.0f} vectors/s (target >= 100000, PCIe ~107000)")
    if only_roof or any(r.get("roof") for r in rows):
        roofline(head, rows, peer)


if __name__ == "__main__":
    main()
