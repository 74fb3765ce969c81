#!/usr/bin/env python3
"""qk as a Meson subproject (docs/vendoring.md): tests/subproject/ is a tiny parent project; it
is set up in a temporary directory with subprojects/qk linked to this source tree, and checked
with `meson introspect`:
  - by default the parent gets qk_dep and nothing else of qk's: no qk test in its suite, no qk
    test, example or benchmark target, nothing installed;
  - its own test, built against qk_dep, passes;
  - with -Dqk:tests=true -Dqk:install=true the same setup lists qk's tests and installs (so the
    checks above can fail).
Usage: subproject.py MESON SRCROOT"""
import json, os, shlex, shutil, subprocess, sys, tempfile

fails = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        fails.append(what)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def introspect(meson, build, what):
    r = run(meson + ["introspect", "--" + what, build])
    return json.loads(r.stdout) if r.returncode == 0 else None


def main():
    meson, src = shlex.split(sys.argv[1]), os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory() as d:
        parent = os.path.join(d, "parent")
        shutil.copytree(os.path.join(src, "tests", "subproject"), parent)
        os.makedirs(os.path.join(parent, "subprojects"))
        os.symlink(src, os.path.join(parent, "subprojects", "qk"))
        build = os.path.join(d, "build")
        r = run(meson + ["setup", build, parent, "-Dqk:cuda=disabled"])
        check(r.returncode == 0, "parent project configures (%s)" % (r.stdout + r.stderr).strip()[-1500:])
        if r.returncode != 0:
            return 1
        tests = introspect(meson, build, "tests") or []
        targets = introspect(meson, build, "targets") or []
        installed = introspect(meson, build, "installed")
        names = sorted(t["name"] for t in tests)
        check(names == ["use_qk"], "the parent's test suite is its own (%s)" % names)
        qk_targets = sorted(t["name"] for t in targets if t.get("subproject") == "qk")
        check(qk_targets == [], "no qk test, example or benchmark target (%s)" % qk_targets)
        check(installed == {}, "nothing installed (%s)" % installed)
        r = run(["ninja", "-C", build])
        check(r.returncode == 0, "parent builds (%s)" % (r.stdout + r.stderr).strip()[-800:])
        r = run(meson + ["test", "-C", build, "--print-errorlogs"])
        check(r.returncode == 0, "parent's test against qk_dep passes (%s)" % r.stdout.strip()[-800:])
        # asked for: qk's tests and installs appear (the checks above can fail)
        r = run(meson + ["configure", build, "-Dqk:tests=true", "-Dqk:install=true"])
        check(r.returncode == 0, "reconfigure with -Dqk:tests=true -Dqk:install=true (%s)" % r.stderr.strip()[-800:])
        r = run(["ninja", "-C", build, "build.ninja"])
        tests = introspect(meson, build, "tests") or []
        installed = introspect(meson, build, "installed") or {}
        check(len(tests) > 5 and any(os.path.basename(k) == "qk.h" for k in installed),
              "asked for, qk's tests (%d) and installs (%d files) are there" % (len(tests), len(installed)))
    if fails:
        print("%d failure(s)" % len(fails))
        return 1
    print("subproject: ok")
    return 0


sys.exit(main())
