#!/usr/bin/env python3
"""Compiles every C code block of README.md and docs/*.md as C (c99) and as C++ (c++11), with
-Wall -Wextra -Werror -Wpedantic, so that what the docs show builds in both languages.

How a block is marked (the fence's info string; GitHub colours by the first word only):
  ```c               a complete translation unit, compiled as it is
  ```c fragment      statements: its leading #define / #include lines go to the top of a file,
                     the rest into the body of int main(void) (which may `return 1;`); names it
                     uses without declaring them come from an HTML comment right above the fence,
                     <!-- snippet-context: ... -->, placed at file scope (not shown on the page)
  ```cuda, ```sh, ```json, ```text, ...   not compiled (CUDA needs nvcc: examples/ and tests/
                     compile the real CUDA programs)
A block without an info string that looks like C (#include, #define QK_..., a qk_ call) fails
the test: mark it. Usage: doc_snippets.py SRCROOT -- CC... -- CXX..."""
import glob, os, re, subprocess, sys, tempfile

FLAGS = ["-Wall", "-Wextra", "-Werror", "-Wpedantic", "-fsyntax-only"]
LOOKS_LIKE_C = re.compile(r"^\s*#\s*(include|define)\b|\bqk_\w+\s*\(.*\)\s*;", re.M)
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
CONTEXT = re.compile(r"<!--\s*snippet-context:(.*)-->$", re.S)


def blocks(path):
    text = open(path, encoding="utf-8").read()
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip()
        ctx = CONTEXT.match(before[before.rfind("<!--"):]) if before.endswith("-->") else None
        yield line, m.group(1).strip().split(), m.group(2), ctx.group(1) if ctx else ""


def program(kind, body, ctx):
    if kind == "unit":
        return body
    lines = body.splitlines()
    head = []
    while lines and (lines[0].startswith("#") or not lines[0].strip()):
        head.append(lines.pop(0))
    return ("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n" + "\n".join(head) + "\n" + ctx +
            "\nint main(void)\n{\n" + "\n".join(lines) + "\n    return 0;\n}\n")


def main():
    argv = sys.argv[1:]
    src = argv[0]
    rest = argv[argv.index("--") + 1:]
    cc, cxx = rest[:rest.index("--")], rest[rest.index("--") + 1:]
    docs = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))
    fails, compiled = [], 0
    with tempfile.TemporaryDirectory() as d:
        for doc in docs:
            rel = os.path.relpath(doc, src)
            for line, info, body, ctx in blocks(doc):
                where = "%s:%d" % (rel, line)
                if not info:
                    if LOOKS_LIKE_C.search(body):
                        fails.append(where)
                        print("FAIL %s: an unmarked block that looks like C (mark it ```c, ```c fragment or ```text)" % where)
                    continue
                if info[0] != "c":
                    continue
                kind = "fragment" if "fragment" in info[1:] else "unit"
                text = program(kind, body, ctx)
                for lang, comp, std, ext in (("C", cc, "-std=c99", "c"), ("C++", cxx, "-std=c++11", "cpp")):
                    path = os.path.join(d, "snippet_%d.%s" % (compiled, ext))
                    open(path, "w").write(text)
                    r = subprocess.run(comp + [std] + FLAGS + ["-I", src, path], capture_output=True, text=True)
                    ok = r.returncode == 0
                    print("%s %s (%s) as %s" % ("ok  " if ok else "FAIL", where, kind, lang))
                    if not ok:
                        fails.append("%s as %s" % (where, lang))
                        print(r.stderr.strip()[-1500:])
                    compiled += 1
    if compiled == 0:
        print("FAIL: no C block found")
        return 1
    if fails:
        print("%d failure(s)" % len(fails))
        return 1
    print("doc_snippets: %d compilations ok" % compiled)
    return 0


sys.exit(main())
