#!/usr/bin/env python3
"""GPU test of the CUPTI mode and the GPU advice rules on examples/mc_transport.cu (exit 77 where
there is no GPU). Runs the example in the CUPTI mode clean and with each problem planted, then
checks, against the counts the example keeps of what it launched (--counts), not against the
profiler's own tables:
  - the kernels CUPTI reported equal the example's own launches plus cuBLAS's (per SGEMM call, from
    a captured graph), the copies and memsets equal its calls; per kernel name the calls of
    k_stream / k_scatter / k_eloss equal the example's launches of each;
  - the kernels are attributed to their zones: the transport kernels to "transport A/B", every
    library kernel to "detector" (the zone open around cublasSgemm);
  - the trace has one CUPTI event per kernel, copy and memset, on named GPU stream lanes;
  - the clean run fires no advice; each planted run fires its rule.
Usage: prof_gpu_advice.py MC_TRANSPORT_EXE [STEPS]"""
import json, os, subprocess, sys, tempfile

PLANTS = {"pageable": "pageable-copy", "sync": "sync-in-loop", "serial": "serialized-copy",
          "leak": "memory-growth", "launch": "launch-bound", "idle": "gpu-idle"}
OWN = ("k_stream(", "k_scatter(", "k_eloss(")
fails = []

def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)

def run(exe, d, steps, plant):
    tag = plant or "clean"
    out = {k: os.path.join(d, "%s.%s" % (tag, k)) for k in ("json", "trace", "counts", "txt")}
    cmd = [exe, "--cupti", "--steps", str(steps), "--json", out["json"], "--trace", out["trace"],
           "--counts", out["counts"], "--text", out["txt"]] + (["--plant", plant] if plant else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    sys.stdout.write(r.stdout[-1500:])
    sys.stderr.write(r.stderr[-3000:])
    if r.returncode == 77:
        return None
    check(r.returncode == 0, "%s: exited %d" % (tag, r.returncode))
    if r.returncode != 0:
        return {}
    return {k: (json.load(open(v)) if k != "txt" else open(v).read()) for k, v in out.items()}

def check_run(tag, o):
    rep, cnt, tr = o["json"], o["counts"], o["trace"]
    act = rep["activities"]
    check(act["cupti"] == "on", "%s: CUPTI %s" % (tag, act["status"]))
    if act["cupti"] != "on":
        return
    check(act["dropped"] == 0 and act["dropped_cupti"] == 0, "%s: records dropped %s" % (tag, act))
    check(cnt["gemm_kernels_per_call"] > 0, "%s: a captured SGEMM has kernels" % tag)
    check(act["kernels"] == cnt["kernels"], "%s: CUPTI kernels %d != launched %d (own %d + cuBLAS %d x %d)" % (
        tag, act["kernels"], cnt["kernels"], cnt["own_kernels"], cnt["gemm_calls"], cnt["gemm_kernels_per_call"]))
    check(act["memcpys"] == cnt["memcpys"], "%s: CUPTI copies %d != %d" % (tag, act["memcpys"], cnt["memcpys"]))
    check(act["memsets"] == cnt["memsets"] + cnt["library_memsets"], "%s: CUPTI memsets %d != %d + %d" % (
        tag, act["memsets"], cnt["memsets"], cnt["library_memsets"]))
    names = act["kernel_names"]
    for p in OWN:
        k = [n for n in names if n["name"].startswith(p)]
        want = cnt["calls"][p[:-1]]
        check(len(k) == 1 and k[0]["calls"] == want, "%s: %s calls %s != %d" % (tag, p, [n["calls"] for n in k], want))
        check(len(k) == 1 and k[0]["zone"] in ("transport A", "transport B"), "%s: %s zone %s" % (tag, p, k and k[0]["zone"]))
    lib = [n for n in names if not n["name"].startswith(OWN)]
    check(sum(n["calls"] for n in lib) == cnt["library_kernels"], "%s: library kernels %d != %d" % (
        tag, sum(n["calls"] for n in lib), cnt["library_kernels"]))
    check(all(n["zone"] == "detector" and n["zones"] == 1 for n in lib), "%s: library kernels in zone detector: %s" % (
        tag, [(n["name"][:40], n["zone"]) for n in lib]))
    ev = tr["traceEvents"]
    cup = [e for e in ev if e.get("cat") == "cupti" and e["pid"] >= 2]
    named = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    check(len(cup) == act["kernels"] + act["memcpys"] + act["memsets"], "%s: %d CUPTI trace events" % (tag, len(cup)))
    check(all((e["pid"], e["tid"]) in named for e in cup), "%s: CUPTI lanes named" % tag)
    check(len({(e["pid"], e["tid"]) for e in cup}) >= (1 if tag == "serial" else 4), "%s: CUPTI lanes per stream" % tag)
    check("\nAdvice (" in o["txt"] and "GPU kernels" in o["txt"], "%s: text report sections" % tag)

def main():
    exe = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    with tempfile.TemporaryDirectory() as d:
        for plant in [None] + list(PLANTS):
            tag = plant or "clean"
            o = run(exe, d, steps, plant)
            if o is None:
                print("no CUDA device: skipped")
                return 77
            if not o:
                continue
            check_run(tag, o)
            rules = sorted(a["rule"] for a in o["json"]["advice"])
            print("%-9s advice: %s" % (tag, rules))
            if plant is None:
                check(rules == [], "clean run fired %s" % ["%s: %s" % (a["rule"], a["evidence"]) for a in o["json"]["advice"]])
            else:
                check(PLANTS[plant] in rules, "plant %s did not fire %s (fired %s)" % (plant, PLANTS[plant], rules))
                if PLANTS[plant] not in rules:  # what the rules saw: the streams, the steps, the activities
                    t = o["txt"]
                    for sec in ("GPU streams", "Steps", "GPU activities"):
                        i = t.find("\n" + sec)
                        if i >= 0:
                            print(t[i:i + 1500])
    print("prof_gpu_advice: %d failures" % len(fails))
    return 1 if fails else 0

if __name__ == "__main__":
    sys.exit(main())
