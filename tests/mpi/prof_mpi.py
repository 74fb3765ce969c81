#!/usr/bin/env python3
"""qk_prof's MPI-wide reports under mpirun -n 3 (tests/prof_mpi.c, QK_PROF_MPI, CLOCK_MONOTONIC
so both reports of a rank see the same numbers): the merged statistics of rank 0's report
against each rank's own report (per zone: every rank's total, min / mean / max over the ranks,
imbalance, slowest rank, calls; per rank: wall, threads, step p50 / p99), rank 0's own part of
the merged JSON equal to its local report, one host process per rank in the merged trace with
every rank's zones, on one clock (the zone each rank opens right after a barrier starts within
150 ms on all ranks (a loose bound for busy CI machines), although the ranks' own clocks start 400 ms apart), the text and HTML
reports' MPI sections. Exit 77 where MPI cannot start a process.
Usage: prof_mpi.py --mpirun MPIRUN --exe PROF_MPI --dir DIR [--ranks 3]"""
import argparse, json, os, shutil, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_env import mpi_env, oversubscribe  # noqa: E402  (tests/mpi is not a package)

ap = argparse.ArgumentParser()
ap.add_argument("--mpirun")
ap.add_argument("--exe")
ap.add_argument("--dir")
ap.add_argument("--ranks", type=int, default=3)
ap.add_argument("--skip")
args = ap.parse_args()
if args.skip:
    print("skipping:", args.skip)
    sys.exit(77)

env = mpi_env()   # the profiler's leaks are still reported
env["QK_PROF_ADVICE"] = "imbalance_min_share=0.01"  # the rank-imbalance check below
ver = subprocess.run([args.mpirun, "--version"], capture_output=True, text=True, env=env)
extra = oversubscribe(ver.stdout + ver.stderr)  # 3 ranks on 2 cores

fails = []
def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)

d = os.path.abspath(args.dir)
shutil.rmtree(d, ignore_errors=True)
os.makedirs(d)
R = args.ranks
p = subprocess.run([args.mpirun, "-n", str(R)] + extra + [args.exe, d], capture_output=True, text=True, env=env, timeout=240)
print(p.stdout[-3000:], p.stderr[-3000:])
if p.returncode != 0 and not os.path.exists(os.path.join(d, "rank0.json")):
    if "prof_mpi" not in p.stderr:
        print("skipping: mpirun cannot start the program here")
        sys.exit(77)
check(p.returncode == 0, "prof_mpi exited %d" % p.returncode)

own = [json.load(open(os.path.join(d, "rank%d.json" % r))) for r in range(R)]
merged = json.load(open(os.path.join(d, "merged.json")))
mpi = merged["mpi"]
check(mpi["ranks"] == R, "ranks %s" % mpi["ranks"])

# per zone: every rank's own total, then min / mean / max / imbalance / slowest computed here
def totals(name, gpu):
    out = []
    for o in own:
        z = [z for z in o["gpu_zones" if gpu else "cpu_zones"] if z["name"] == name]
        out.append(z[0]["total_ns"] if z else 0.0)
    return out

names = {(z["name"], False) for o in own for z in o["cpu_zones"]} | {(z["name"], True) for o in own for z in o["gpu_zones"]}
got = {(z["name"], z["gpu"]): z for z in mpi["zones"]}
check(set(got) == names, "merged zones %s vs the ranks' %s" % (sorted(got), sorted(names)))
for key, z in got.items():
    t = totals(*key)
    mean = sum(t) / R
    check(z["total_ns"] == t, "%s: per-rank totals %s vs %s" % (key[0], z["total_ns"], t))
    check(z["min_ns"] == min(t) and z["max_ns"] == max(t), "%s: min/max" % key[0])
    check(abs(z["mean_ns"] - mean) <= 1e-9 * mean, "%s: mean %s vs %s" % (key[0], z["mean_ns"], mean))
    check(abs(z["imbalance"] - max(t) / mean) <= 1e-9, "%s: imbalance %s vs %s" % (key[0], z["imbalance"], max(t) / mean))
    check(z["slowest_rank"] == t.index(max(t)), "%s: slowest rank %s vs %s" % (key[0], z["slowest_rank"], t.index(max(t))))
    check(z["ranks"] == sum(1 for o in own if any(x["name"] == key[0] for x in o["gpu_zones" if key[1] else "cpu_zones"])),
          "%s: ranks" % key[0])
    calls = sum(x["calls"] for o in own for x in o["gpu_zones" if key[1] else "cpu_zones"] if x["name"] == key[0])
    check(z["calls"] == calls, "%s: calls" % key[0])
# the planted difference that timing cannot blur: "only_rank1" runs on rank 1 alone
check(got[("only_rank1", False)]["ranks"] == 1 and got[("only_rank1", False)]["slowest_rank"] == 1, "only_rank1")
check(got[("only_rank1", False)]["imbalance"] == R, "a zone on one rank of R: imbalance R")
# rank-imbalance advice, recomputed here from each rank's own totals with the thresholds the run
# had (max / mean >= 1.25 over all ranks, the default; max - mean >= 1 % of the longest rank's
# wall, from QK_PROF_ADVICE: rank 0's wall holds the 800 ms its collective init waited for rank
# 2): the planted "work" (3 (r + 1) calls of 1 + r ms on rank r) is far beyond both
wall = max(pr["wall_ns"] for pr in mpi["per_rank"])
want = set()
for key in got:
    t = totals(*key)
    mean = sum(t) / R
    if mean > 0 and max(t) >= 1.25 * mean and max(t) - mean >= 0.01 * wall:
        want.add(key[0])
adv = mpi.get("advice", [])
check(all(a["rule"] == "rank-imbalance" and a["evidence"] and a["fix"] for a in adv), "MPI advice items %s" % adv)
fired = {a["where"].split('"')[1] for a in adv}
check(fired == want, "rank-imbalance fired for %s, expected %s" % (sorted(fired), sorted(want)))
check("work" in fired, "the planted imbalance of \"work\" fires rank-imbalance")
w = [a for a in adv if a["where"].split('"')[1] == "work"]
# the rank the advice names is the one whose measured total is largest (planted: rank R - 1; a
# loaded machine can deschedule a rank's wall-clock spin long enough to change that)
tw = totals("work", False)
check(w and "rank %d" % tw.index(max(tw)) in w[0]["where"], "the slowest rank of \"work\" named: %s (totals %s)" % (w and w[0]["where"], tw))
for r, pr in enumerate(mpi["per_rank"]):
    check(pr["rank"] == r and pr["wall_ns"] == own[r]["wall_ns"], "rank %d wall %s vs %s" % (r, pr["wall_ns"], own[r]["wall_ns"]))
    check(pr["threads"] == own[r]["threads"] and pr["streams"] == own[r]["n_streams"], "rank %d threads/streams" % r)
    check(pr["step"]["p50_ns"] == own[r]["steps"]["step"]["p50_ns"] and pr["step"]["p99_ns"] == own[r]["steps"]["step"]["p99_ns"],
          "rank %d step p50/p99" % r)
check(mpi["per_rank"][0]["clock_offset_ns"] == 0, "rank 0's offset is 0")
# rank 0's own report follows the mpi key
check(merged["cpu_zones"] == own[0]["cpu_zones"], "the merged JSON's own part is rank 0's")

# the trace: one host process per rank, every rank's zones, one clock
tr = json.load(open(os.path.join(d, "merged_trace.json")))["traceEvents"]
pnames = {e["pid"]: e["args"]["name"] for e in tr if e["ph"] == "M" and e["name"] == "process_name"}
host = sorted(pid for pid, n in pnames.items() if n.endswith(" host"))
check(host == [64 * r + 1 for r in range(R)], "host processes %s" % pnames)
for r in range(R):
    check(pnames.get(64 * r + 1) == "rank %d host" % r, "rank %d's process name %r" % (r, pnames.get(64 * r + 1)))
    mine = [e for e in tr if e["ph"] == "X" and e["pid"] == 64 * r + 1]
    want = sum(z["calls"] for z in own[r]["cpu_zones"])
    check(len(mine) == want, "rank %d: %d zones in the trace, %d in its report" % (r, len(mine), want))
    check(len([e for e in mine if e["name"] == "work"]) == min(3 * (r + 1), 10), "rank %d's work zones" % r)
check(not [e for e in tr if e.get("pid", 1) % 64 != 1 and e["ph"] == "X"], "CPU zones only in host processes")
starts = [[e["ts"] for e in tr if e["ph"] == "X" and e["pid"] == 64 * r + 1 and e["name"] == "after_barrier"][0] for r in range(R)]
local = [[e["ts"] for e in json.load(open(os.path.join(d, "rank%d_trace.json" % r)))["traceEvents"]
          if e["ph"] == "X" and e["name"] == "after_barrier"][0] for r in range(R)]
print("after_barrier starts, us: aligned %s, each rank's own clock %s" % (starts, local))
check(max(local) - min(local) > 600e3, "the ranks' own clocks should start >= 600 ms apart (the test's premise)")
# a barrier's exit on 3 ranks sharing 2 busy cores can differ by tens of ms: the bound is loose,
# the unaligned spread (>= 800 ms) far beyond it
check(max(starts) - min(starts) < 150e3, "aligned starts %s spread over >= 150 ms" % starts)

txt = open(os.path.join(d, "merged.txt")).read()
check(txt.startswith("qk_prof MPI report: %d ranks" % R) and "==== rank 0 ====" in txt and "only_rank1" in txt, "text report")
check("Advice across ranks" in txt and txt.count("[rank-imbalance]") == len(adv), "text report: the advice across ranks")
page = open(os.path.join(d, "merged.html")).read()
check("<h2>MPI: %d ranks</h2>" % R in page and "Zones across ranks" in page and "Zones per rank" in page, "HTML report")
check("<h2>Advice across ranks</h2>" in page and page.count("<b>rank-imbalance</b>") == len(adv), "HTML: the advice across ranks")
check(page.count("<tr><td>") >= R + len(names), "HTML per-rank and per-zone rows")
check(page.index("<h2>MPI") < page.index("<h2>Time per zone"), "the MPI section comes first")
print("prof_mpi.py:", "%d failure(s)" % len(fails) if fails else "ok")
sys.exit(1 if fails else 0)
