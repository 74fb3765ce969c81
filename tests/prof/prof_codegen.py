#!/usr/bin/env python3
"""The disabled profiler generates nothing: tests/prof/prof_codegen_tu.c compiled with the macros
(USE_MACROS) and without them, both without QK_PROF_ENABLE, must give identical code, data and
symbols, for C and C++, at -O0 and -O2. As a check that the comparison can fail, the same TU
with QK_PROF_ENABLE must differ. Usage: prof_codegen.py SRC INCDIR OBJCOPY NM -- CC... [-- CXX...]"""
import os, subprocess, sys, tempfile

def sections(obj, objcopy, nm, tmp):
    out = {}
    for sec in (".text", ".rodata", ".data", ".bss"):
        b = os.path.join(tmp, "sec.bin")
        if os.path.exists(b):
            os.remove(b)
        subprocess.run([objcopy, "-O", "binary", "--only-section=" + sec, obj, b], check=True)
        out[sec] = open(b, "rb").read() if os.path.exists(b) else b""
    syms = subprocess.run([nm, "-P", obj], capture_output=True, text=True, check=True).stdout.split("\n")
    # names and types, not addresses; section-local labels differ by name only with debug info
    out["symbols"] = sorted(l.split()[0] + " " + l.split()[1] for l in syms if l.strip())
    return out

def main():
    args = sys.argv[1:]
    src, inc, objcopy, nm = args[:4]
    rest = args[5:]
    compilers = []
    cur = []
    for a in rest:
        if a == "--":
            compilers.append(cur)
            cur = []
        else:
            cur.append(a)
    if cur:
        compilers.append(cur)
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        for cc in compilers:
            # the compiler may come behind a launcher (ccache): look at every word
            is_cxx = any(x in os.path.basename(w) for w in cc for x in ("++", "clang++", "cxx")) or "-std=c++17" in cc
            lang = ["-x", "c++"] if is_cxx else ["-x", "c"]
            for opt in ("-O0", "-O2"):
                objs = {}
                for tag, defs in (("plain", []), ("macros", ["-DUSE_MACROS"]),
                                  ("enabled", ["-DUSE_MACROS", "-DQK_PROF_ENABLE"])):
                    obj = os.path.join(tmp, "%s%s.o" % (tag, opt))
                    cmd = cc + lang + [opt, "-g0", "-Wall", "-Wextra", "-Werror", "-I", inc] + defs + ["-c", src, "-o", obj]
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    if r.returncode != 0:
                        print("compile failed:", " ".join(cmd), r.stderr)
                        return 1
                    objs[tag] = sections(obj, objcopy, nm, tmp)
                name = "%s %s" % (" ".join(cc), opt)
                a, b, c = objs["plain"], objs["macros"], objs["enabled"]
                same = all(a[k] == b[k] for k in a)
                differs = a[".text"] != c[".text"] and a["symbols"] != c["symbols"]
                print("%-40s disabled: .text %d vs %d bytes, %s; enabled: .text %d bytes, %d symbols" % (
                    name, len(a[".text"]), len(b[".text"]), "identical" if same else "DIFFERENT",
                    len(c[".text"]), len(c["symbols"])))
                if not same:
                    for k in a:
                        if a[k] != b[k]:
                            print("  differs in", k, a[k] if k == "symbols" else "", b[k] if k == "symbols" else "")
                    fails += 1
                if not differs:
                    print("  the enabled build should differ (the check itself is broken)")
                    fails += 1
    print("prof_codegen:", "ok" if not fails else "%d failure(s)" % fails)
    return 1 if fails else 0

sys.exit(main())
