#!/usr/bin/env python3
"""The PyTorch peer at reduced precision, beside qk's precision modes (bench/run.sh prec).

Imports the peer's state builders (torch_qk.py, not part of this repository: pass its folder
with --peer) and times its Gram, K = |S S^H|^2, the way a practitioner lowers precision in
PyTorch:
  tf32   torch.backends.cuda.matmul.allow_tf32 = True (cuBLAS TF32 tensor-core math, complex
         matmul included)
  fp16   real maps only: (S.half() @ S.half().T).float() ** 2 (PyTorch has no complex fp16 matmul
         that a user would reach for)
Each row also gives the error against a float64 Gram of the same float32 states over 512 evenly
spaced rows (max_err) and max |K_ii - 1| (diag_err), as qk-bench's prec cases do.

Usage: torch_prec.py --peer DIR [--cases zz:8:32768,...] [--json out.json]
"""
import argparse, json, math, sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True)
    ap.add_argument("--cases", default="zz:8:32768,zz:12:16384,zz:16:4096,hea:12:16384")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sys.path.insert(0, a.peer)
    import torch
    import torch_qk as P

    dev = torch.device("cuda")
    rows = []
    for case in a.cases.split(","):
        kind, q, n = case.split(":")
        q, n = int(q), int(n)
        g = torch.Generator(device="cpu").manual_seed(1234)
        if kind == "zz":
            X = (torch.rand(n, q, generator=g) * 2 * math.pi).to(dev)
            S = P.zz_states(X, reps=2)
        else:
            X = (torch.rand(n, q, generator=g) * math.pi).to(dev)
            W = torch.rand(2, q, generator=g).to(dev)
            S = P.hea_states(X, W)
        R = min(n, 512)
        idx = torch.arange(R, device=dev) * n // R
        S64 = S.to(torch.complex128 if S.is_complex() else torch.float64)
        Kref = (S64[idx] @ S64.conj().T).abs().square() if S.is_complex() else (S64[idx] @ S64.T).square()
        del S64
        modes = ["fp32", "tf32"] + ([] if S.is_complex() else ["fp16"])
        for mode in modes:
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            if mode == "fp16":
                Sh = S.half()
                fn = lambda: (Sh @ Sh.T).float().square()
            else:
                fn = lambda: P.gram(S, S)
            t = P.cuda_median(fn, reps=3, warm=1)
            K = fn()
            err = (K[idx].double() - Kref).abs().max().item()
            derr = (K.diagonal().double() - 1).abs().max().item()
            r = dict(peer="torch", mode=mode, map=kind, qubits=q, n=n, gram_device_Gpairs_s=round(n * n / t / 1e9, 3),
                     max_err=err, diag_err=derr, device=torch.cuda.get_device_name(0))
            rows.append(r)
            print(json.dumps(r), flush=True)
            del K
            torch.cuda.empty_cache()
        del S, Kref
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
