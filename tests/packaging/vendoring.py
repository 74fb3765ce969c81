#!/usr/bin/env python3
"""Vendoring checks with the project's own compilers, outside Meson (docs/vendoring.md):

  alone   qk.h copied alone into an include directory: a program with QK_IMPLEMENTATION
          compiles as C99 and C++11 (-Wall -Wextra -Werror -Wpedantic), links with -lm
          -lpthread and computes a Gram matrix whose diagonal is 1.
  rule    the rule for the two implementation defines (qk.h's documentation block):
          QK_PROF_ENABLE + QK_IMPLEMENTATION without QK_PROF_IMPLEMENTATION, and
          QK_PROF_IMPLEMENTATION in a file that includes qk.h without QK_IMPLEMENTATION (both
          include orders), must fail to compile with the rule's message; the documented layout
          (both defines in one file, the profiler's macros in a second file) compiles, links and
          writes a report holding qk's own zones.
  tune    a CPU-only program carries no autotune cache code (no qk__tune_parse in its object
          file; present with -DQK_TUNE_CACHE, so the check can fail) and its qk_tune_* calls
          return QK_ERROR_UNSUPPORTED.

Usage: vendoring.py SRCROOT [alone|rule|tune ...] -- CC... -- CXX...  (all parts by default)"""
import os, shutil, sys, tempfile

from pkg_common import CONSUMER, STRICT, check, compilers, consumer_output, finish, run, write


def part_alone(src, cc, cxx, d):
    inc = os.path.join(d, "inc")
    os.makedirs(inc)
    shutil.copy(os.path.join(src, "qk.h"), inc)
    for lang, comp, std, ext in (("C", cc, "-std=c99", "c"), ("C++", cxx, "-std=c++11", "cpp")):
        prog = os.path.join(d, "alone." + ext)
        exe = os.path.join(d, "alone_" + ext)
        shutil.copy(CONSUMER, prog)
        r = run(comp + [std] + STRICT + ["-I", inc, prog, "-o", exe, "-lm", "-lpthread"])
        check(r.returncode == 0, "alone: %s program with only qk.h in its include directory compiles (%s)"
              % (lang, r.stderr.strip()[:600]))
        if r.returncode != 0:
            continue
        r = run([exe])
        out = consumer_output(r)
        ok = out is not None and all(abs(out[0][4 * i] - 1.0) < 1e-12 for i in range(3))
        check(ok, "alone: %s program runs, K's diagonal is 1 (%r)" % (lang, r.stdout + r.stderr))
        check(ok and out[2] == "0", "alone: %s program sees QK_PROF_ENABLED == 0" % lang)


RULE_MSG = "QK_PROF_IMPLEMENTATION"
RULE_BAD = {
    "QK_PROF_ENABLE + QK_IMPLEMENTATION without QK_PROF_IMPLEMENTATION":
        '#define QK_PROF_ENABLE\n#define QK_IMPLEMENTATION\n#include "qk.h"\nint main(void) { return 0; }\n',
    "QK_PROF_IMPLEMENTATION beside a plain include of qk.h (qk.h first)":
        '#define QK_PROF_ENABLE\n#include "qk.h"\n#define QK_PROF_IMPLEMENTATION\n#include "qk_prof.h"\n'
        'int main(void) { return 0; }\n',
    "QK_PROF_IMPLEMENTATION beside a plain include of qk.h (qk_prof.h first)":
        '#define QK_PROF_ENABLE\n#define QK_PROF_IMPLEMENTATION\n#include "qk_prof.h"\n#include "qk.h"\n'
        'int main(void) { return 0; }\n',
}
RULE_A = r"""
#define QK_PROF_ENABLE
#define QK_IMPLEMENTATION
#define QK_PROF_IMPLEMENTATION
#include "qk.h"
#include <string.h>
int user_zone(void);
int main(int argc, char **argv)
{
    static const double X[2 * 2] = {0.1, 0.2, 0.3, -0.4};
    double K[4];
    qk_ctx *ctx = NULL;
    qk_map *map = NULL;
    qk_ctx_desc cd;
    qk_gram_desc g;
    (void)argc;
    memset(&cd, 0, sizeof cd);
    memset(&g, 0, sizeof g);
    cd.device = QK_DEVICE_CPU;
    if (qk_ctx_create(&cd, &ctx) != QK_OK || qk_map_parse("zz", 2, &map) != QK_OK) return 1;
    g.x = X; g.n_x = 2; g.out = K;
    if (qk_gram(ctx, map, &g) != QK_OK) return 1;
    qk_map_free(map);
    qk_ctx_destroy(ctx);
    if (user_zone() != 0) return 1;
    return QK_PROF_WRITE_JSON(argv[1]) == 0 ? 0 : 1;
}
"""
RULE_B = r"""
#define QK_PROF_ENABLE
#include "qk_prof.h"
#include "qk.h"
int user_zone(void)
{
    QK_PROF_BEGIN("user zone");
    QK_PROF_END("user zone");
    return 0;
}
"""


def part_rule(src, cc, cxx, d):
    for what, text in RULE_BAD.items():
        for lang, comp, std, ext in (("C", cc, "-std=c11", "c"), ("C++", cxx, "-std=c++17", "cpp")):
            prog = os.path.join(d, "bad." + ext)
            write(prog, text)
            r = run(comp + [std, "-I", src, "-c", prog, "-o", os.path.join(d, "bad.o")])
            check(r.returncode != 0 and "#error" in r.stderr and RULE_MSG in r.stderr,
                  "rule: %s fails to compile as %s with the rule's message" % (what, lang))
    a, b = os.path.join(d, "a.c"), os.path.join(d, "b.c")
    write(a, RULE_A)
    write(b, RULE_B)
    exe, js = os.path.join(d, "rule_ok"), os.path.join(d, "rule.json")
    r = run(cc + ["-std=c11"] + STRICT + ["-I", src, a, b, "-o", exe, "-lm", "-lpthread"])
    check(r.returncode == 0, "rule: the documented two-file layout compiles and links (%s)" % r.stderr.strip()[:600])
    if r.returncode == 0:
        r = run([exe, js])
        text = open(js).read() if os.path.exists(js) else ""
        check(r.returncode == 0 and '"qk_gram"' in text and '"user zone"' in text,
              "rule: its report holds qk's zones and the user's")


TUNE = r"""
#define QK_IMPLEMENTATION
#include "qk.h"
#include <stdio.h>
#include <string.h>
int main(void)
{
    qk_tune_key k;
    qk_tune_entry e;
    char path[512];
    qk_tune_key_init(&k, "dev", 9, 0, 12080, "gram", QK_PATH_REAL, QK_PRECISION_FP32, 8);
    memset(&e, 0, sizeof e);
    e.key = k;
    strcpy(e.config, "blas=0,cfg=1");
    printf("%d %d %d\n", qk_tune_cache_lookup(NULL, &k, &e, NULL, NULL) == QK_ERROR_UNSUPPORTED,
           qk_tune_cache_store(NULL, &e, NULL, NULL) == QK_ERROR_UNSUPPORTED,
           qk_tune_cache_path(NULL, path, sizeof path) == QK_ERROR_UNSUPPORTED);
    return 0;
}
"""


def part_tune(src, cc, cxx, d):
    nm = shutil.which("nm")
    prog = os.path.join(d, "tune.c")
    write(prog, TUNE)
    objs = {}
    for name, extra in (("cpu", []), ("cache", ["-DQK_TUNE_CACHE"]), ("cuda", ["-DQK_CUDA=1"])):
        obj = os.path.join(d, "tune_%s.o" % name)
        r = run(cc + ["-std=c11", "-O0", "-I", src, "-c", prog, "-o", obj] + extra + STRICT)
        check(r.returncode == 0, "tune: %s build compiles (%s)" % (name, r.stderr.strip()[:600]))
        objs[name] = obj if r.returncode == 0 else None
    if nm and all(objs.values()):
        syms = {k: run([nm, v]).stdout for k, v in objs.items()}
        check("qk__tune_parse" not in syms["cpu"] and "qk__tj_str" not in syms["cpu"],
              "tune: a CPU-only object carries no autotune JSON code")
        check("qk__tune_parse" in syms["cache"] and "qk__tune_parse" in syms["cuda"],
              "tune: with QK_TUNE_CACHE or QK_CUDA it does (the check can fail)")
    exe = os.path.join(d, "tune_cpu")
    r = run(cc + ["-std=c11", "-I", src, prog, "-o", exe, "-lm", "-lpthread"])
    if r.returncode == 0:
        r = run([exe])
    check(r.returncode == 0 and r.stdout.split() == ["1", "1", "1"],
          "tune: CPU-only qk_tune_* calls return QK_ERROR_UNSUPPORTED (%r)" % (r.stdout + r.stderr))


def main():
    argv = sys.argv[1:]
    src = argv[0]
    i = argv.index("--")
    parts = argv[1:i] or ["alone", "rule", "tune"]
    cc, cxx = compilers(argv[i + 1:])
    with tempfile.TemporaryDirectory() as d:
        for p in parts:
            sub = os.path.join(d, p)
            os.makedirs(sub)
            {"alone": part_alone, "rule": part_rule, "tune": part_tune}[p](src, cc, cxx, sub)
    return finish("vendoring")


sys.exit(main())
