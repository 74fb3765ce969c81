#!/usr/bin/env python3
"""The user's whole job, timed as a user feels it: qk-gram X.npy -> K.npy beside the PyTorch
peer (peers' torch_e2e.py) in the same job, with the floor of each row measured in the same job:
dd's sequential write speed of the output file system (with conv=fdatasync, since qk-gram
syncs), and the wall time and peak RSS of every command (getrusage of the child).

usage: whole_job.py --qk-gram PATH [--peer bench/.peer/torch_e2e.py] [--dir DIR] [--json OUT]
                    [--rows zz6:40000,zz8:20000,zz10:24000,hea10:20000] [--big zz6:80000]
A row "map<features>:<n>" runs qk-gram (and the peer); --big rows run qk-gram only (K larger
than the peer can hold comfortably) to check that peak RSS stays O(slab)."""
import argparse, json, os, resource, subprocess, sys, time

def run(cmd, env=None):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # ru_maxrss of RUSAGE_CHILDREN is the largest of all waited-for children so far (KiB): run
    # the big jobs last or read it per child from /usr/bin/time where available
    return p, wall, r1.ru_maxrss / 1024.0, r1.ru_maxrss > r0.ru_maxrss

def rss_of(cmd):
    """Peak RSS of one command in MiB, measured by a fresh Python child that waits for it."""
    code = ("import resource,subprocess,sys,time;t=time.perf_counter();p=subprocess.run(sys.argv[1:]);"
            "print('%d %.4f %d' % (p.returncode, time.perf_counter()-t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))")
    p = subprocess.run([sys.executable, "-c", code] + cmd, capture_output=True, text=True)
    last = p.stdout.strip().splitlines()[-1].split()
    return int(last[0]), float(last[1]), int(last[2]) / 1024.0, p.stdout, p.stderr

def dd_speed(path, mb, sync):
    args = ["dd", "if=/dev/zero", "of=" + path, "bs=1M", "count=%d" % mb] + (["conv=fdatasync"] if sync else [])
    t0 = time.perf_counter()
    subprocess.run(args, capture_output=True)
    dt = time.perf_counter() - t0
    os.remove(path)
    return mb * 1048576 / dt / 1e9

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qk-gram", required=True)
    ap.add_argument("--peer", default="bench/.peer/torch_e2e.py")
    ap.add_argument("--dir", default="/tmp/wj")
    ap.add_argument("--json")
    ap.add_argument("--rows", default="zz6:40000,zz8:20000,zz10:24000,hea10:20000")
    ap.add_argument("--big", default="")
    ap.add_argument("--extra", default="", help="extra qk-gram arguments, space separated")
    a = ap.parse_args()
    import numpy as np
    os.makedirs(a.dir, exist_ok=True)
    res = {"rows": []}
    res["dd_sync_GBps"] = dd_speed(os.path.join(a.dir, "dd.bin"), 2048, True)
    res["dd_cache_GBps"] = dd_speed(os.path.join(a.dir, "dd.bin"), 2048, False)
    print("dd: %.2f GB/s with fdatasync, %.2f GB/s into the page cache" % (res["dd_sync_GBps"], res["dd_cache_GBps"]), flush=True)
    # CUDA start-up: qk-gram on 2 samples
    rng = np.random.default_rng(7)
    np.save(os.path.join(a.dir, "x2.npy"), rng.uniform(0, 6.28, (2, 8)))
    rc, w, _, _, _ = rss_of([a.qk_gram, "--map", "zz(reps=2)", "--x", os.path.join(a.dir, "x2.npy"), "--out",
                             os.path.join(a.dir, "k2.npy"), "--device", "cuda", "--precision", "fp32", "--quiet"])
    res["startup_s"] = w
    print("qk-gram start-up (2 samples, CUDA): %.3f s" % w, flush=True)
    def one(spec, peer):
        name, n = spec.split(":")
        n = int(n)
        kind, d = ("hea", int(name[3:])) if name.startswith("hea") else ("zz", int(name[2:]))
        X = rng.uniform(0, 6.28 if kind == "zz" else 3.14, (n, d))
        xp, kp = os.path.join(a.dir, "X.npy"), os.path.join(a.dir, "K.npy")
        np.save(xp, X)
        m = "zz(reps=2)" if kind == "zz" else "hea(layers=2)"
        kbytes = 4.0 * n * n
        row = {"case": spec, "map": m, "n": n, "features": d, "K_GB": kbytes / 1e9}
        cmd = [a.qk_gram, "--map", m, "--x", xp, "--out", kp, "--device", "cuda", "--precision", "fp32"] + a.extra.split()
        rc, w, rss, out, err = rss_of(cmd)
        row.update(qk_rc=rc, qk_wall_s=w, qk_maxrss_MB=rss)
        if rc != 0: print(out, err)
        if rc == 0:
            K = np.load(kp, mmap_mode="r")
            idx = rng.integers(0, n, 64)
            row["qk_diag_maxerr"] = float(np.abs(np.asarray(K[idx, idx]) - 1).max())
            row["qk_sym_maxerr"] = float(np.abs(np.asarray(K[idx[:32]][:, idx[32:]]) - np.asarray(K[idx[32:]][:, idx[:32]]).T).max())
            del K
        os.remove(kp) if os.path.exists(kp) else None
        floor = res["startup_s"] + kbytes / (res["dd_sync_GBps"] * 1e9)
        row["floor_s"] = floor
        row["qk_over_floor"] = w / floor
        if peer:
            rc2, w2, rss2, out2, err2 = rss_of([sys.executable, a.peer, xp, kp, kind, os.path.join(os.path.dirname(a.peer), "torch_qk.py")])
            row.update(peer_rc=rc2, peer_wall_s=w2, peer_maxrss_MB=rss2, peer_phases=out2.strip().splitlines()[-2] if out2.strip() else err2[-300:])
            if os.path.exists(kp): os.remove(kp)
            row["qk_speedup_vs_peer"] = w2 / w if rc == 0 and rc2 == 0 else None
        print(json.dumps(row), flush=True)
        res["rows"].append(row)
    peer = os.path.exists(a.peer)  # without the peer the rows run qk-gram alone
    if not peer: print("no peer at %s: qk-gram alone" % a.peer, flush=True)
    for spec in [s for s in a.rows.split(",") if s]: one(spec, peer)
    for spec in [s for s in a.big.split(",") if s]: one(spec, False)
    if a.json:
        with open(a.json, "w") as f: json.dump(res, f, indent=1)

if __name__ == "__main__":
    main()
