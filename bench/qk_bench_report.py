#!/usr/bin/env python3
"""Joins qk-bench's JSON with the peer's (torch_qk.py, same job) and prints one table: qk, the
peer, the ratio, the issue's target and the ceiling of PERFORMANCE.md in the same rows.

Usage: qk_bench_report.py BENCH.json PEER.json      (the files bench/run.sh gpu-bench writes)
       qk_bench_report.py RESULT.json               (a bench/results/ file: both inside)
"""
import json, sys

# case -> (peer map, qubits, n, peer field, target, ceiling, unit); H200 figures (issue 3, PERFORMANCE.md)
CASES = {
    "zz4": ("zz", 4, 32768, "gram_device_Gpairs_s", 500, "860 compute / 1060 write"),
    "zz8": ("zz", 8, 32768, "gram_device_Gpairs_s", 50, "54"),
    "zz12": ("zz", 12, 16384, "gram_device_Gpairs_s", 3.3, "3.4"),
    "zz16": ("zz", 16, 4096, "gram_device_Gpairs_s", 0.2, "0.21"),
    "hea12": ("hea", 12, 16384, "gram_device_Gpairs_s", 12, "13.4"),
    "host8": ("zz", 8, 32768, "gram_host_Gpairs_s", 12, "PCIe 13.7"),
}


def main():
    if len(sys.argv) == 2:
        d = json.load(open(sys.argv[1]))
        rows, peer = d["qk"], d["peer"]
    else:
        rows, peer = json.load(open(sys.argv[1]))["rows"], json.load(open(sys.argv[2]))
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


if __name__ == "__main__":
    main()
