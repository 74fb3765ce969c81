#!/usr/bin/env python3
"""Zone and counter names must be string literals, and one that is not is a compile error (C and
C++), not a silent misnaming: in C++ a call site's static record may be initialized by any
expression, evaluated once, so QK_PROF_BEGIN(h ? "transport B" : "transport A") named every zone
of that site "transport A" and counted each END("transport B") as mismatched
(examples/mc_transport.cu's 100 mismatched ENDs). Compiles, with each compiler given:
  - a TU with literal names (plain, concatenated, from a macro) and QK_PROF_FUNC: must compile;
  - one TU per non-literal name (a conditional of two literals of one length, a pointer
    variable, __func__, a parenthesized literal) through QK_PROF_BEGIN / GPU_BEGIN / COUNTER /
    SCOPE: each must fail, with the diagnostic on the macro's line.
Usage: prof_names.py SRC_ROOT -- CC ARGS... -- CXX ARGS..."""
import os, subprocess, sys, tempfile

GOOD = r'''
#define QK_PROF_ENABLE
#include "qk_prof.h"
#define NAME "from a macro"
int f(int h);
int f(int h)
{
    QK_PROF_BEGIN("plain");
    QK_PROF_BEGIN("concat" "enated");
    QK_PROF_BEGIN(NAME);
    QK_PROF_COUNTER("counter", h);
    QK_PROF_GPU_BEGIN("gpu", 0);
    QK_PROF_GPU_END("gpu", 0);
    QK_PROF_END(NAME);
    QK_PROF_END("concatenated");
    QK_PROF_END("plain");
    return h;
}
#if defined(__cplusplus) || defined(__GNUC__)
int g(int h);
int g(int h)
{
    QK_PROF_FUNC();
    QK_PROF_SCOPE("scope");
    return h;
}
#endif
'''

BAD = {
    "conditional": 'QK_PROF_BEGIN(h ? "transport B" : "transport A"); QK_PROF_END("transport A");',
    "pointer": 'const char *n = "x"; QK_PROF_BEGIN(n); QK_PROF_END("x");',
    "func": 'QK_PROF_BEGIN(__func__); QK_PROF_END(__func__);',
    "parenthesized": 'QK_PROF_BEGIN(("x")); QK_PROF_END("x");',
    "gpu": 'QK_PROF_GPU_BEGIN(h ? "b" : "a", 0); QK_PROF_GPU_END("a", 0);',
    "counter": 'QK_PROF_COUNTER(h ? "b" : "a", 1);',
    "scope": '{ QK_PROF_SCOPE(h ? "b" : "a"); }',
}

def main():
    root = sys.argv[1]
    rest = sys.argv[2:]
    cmds, cur = [], None
    for a in rest:
        if a == "--":
            cur = []
            cmds.append(cur)
        else:
            cur.append(a)
    fails = []
    with tempfile.TemporaryDirectory() as d:
        for cmd in cmds:
            cxx = any(x in os.path.basename(cmd[0]) for x in ("++", "clang++")) or "-std=c++" in " ".join(cmd)
            ext = ".cpp" if cxx else ".c"
            def compile(src, tag):
                p = os.path.join(d, tag + ext)
                with open(p, "w") as f:
                    f.write(src)
                r = subprocess.run(cmd + ["-I", root, "-Wall", "-Wextra", "-fsyntax-only", p], capture_output=True, text=True)
                return r
            r = compile(GOOD, "good")
            print("%s: literal names: rc %d" % (" ".join(cmd), r.returncode))
            if r.returncode != 0:
                fails.append("%s: literal names do not compile:\n%s" % (cmd[0], r.stderr[-2000:]))
            for tag, body in BAD.items():
                src = '#define QK_PROF_ENABLE\n#include "qk_prof.h"\nint f(int h);\nint f(int h)\n{\n    %s\n    return h;\n}\n' % body
                r = compile(src, "bad_" + tag)
                line_ok = ("bad_%s%s:6" % (tag, ext)) in r.stderr
                print("%s: %s: rc %d%s" % (cmd[0], tag, r.returncode, "" if line_ok else " (no diagnostic on line 6)"))
                if r.returncode == 0 or not line_ok:
                    fails.append("%s: the non-literal name (%s) %s" % (cmd[0], tag, "compiled" if r.returncode == 0 else
                                 "failed elsewhere:\n" + r.stderr[-1500:]))
    for f in fails:
        print("FAIL:", f)
    print("prof_names: %d failures" % len(fails))
    return 1 if fails else 0

if __name__ == "__main__":
    sys.exit(main())
