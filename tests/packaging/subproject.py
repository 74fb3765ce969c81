#!/usr/bin/env python3
"""qk as a Meson subproject (docs/vendoring.md): tests/packaging/subproject/ is a tiny parent project; it
is set up in a temporary directory with subprojects/qk linked to this source tree, and checked
with `meson introspect`:
  - by default the parent gets qk_dep and nothing else of qk's: no qk test in its suite, no qk
    test, example or benchmark target, nothing installed;
  - its own test, built against qk_dep, passes;
  - with -Dqk:tests=true -Dqk:install=true the same setup lists qk's tests and installs (so the
    checks above can fail).
Then through the documented wrap file (docs/qk.wrap): the parent's meson.build without its
subproject() call (dependency('qk') alone, found through the wrap's [provide]), subprojects/qk.wrap
copied from docs/qk.wrap with only its url changed, pointing at a local git repository of this
tree (its files committed and tagged with the wrap's revision): Meson clones it, the parent
builds, its test passes, dependency('qk-prof') gives the profiler-on qk_prof_dep, and nothing
of qk's besides is built or installed.
Usage: subproject.py MESON SRCROOT"""
import json, os, re, shlex, shutil, sys, tempfile

from pkg_common import CONSUMER, check, finish, run


def introspect(meson, build, what):
    r = run(meson + ["introspect", "--" + what, build])
    return json.loads(r.stdout) if r.returncode == 0 else None


def source_files(src):
    """The tree's files as a checkout has them: git's tracked and untracked-not-ignored files, or
    everything but build directories where src is not a git work tree."""
    r = run(["git", "-C", src, "ls-files", "-z", "-co", "--exclude-standard"])
    if r.returncode == 0 and r.stdout:
        return [f for f in r.stdout.split("\0") if f and os.path.isfile(os.path.join(src, f))]
    out = []
    for root, dirs, files in os.walk(src):
        dirs[:] = [x for x in dirs if not (x.startswith("build") or x.startswith(".") or x == "__pycache__")]
        out += [os.path.relpath(os.path.join(root, f), src) for f in files]
    return out


def wrap_check(meson, src, d):
    wrap = open(os.path.join(src, "docs", "qk.wrap")).read()
    rev = re.search(r"^revision\s*=\s*(\S+)", wrap, re.M)
    check(rev is not None and re.search(r"^\[wrap-git\]", wrap, re.M) and re.search(r"^qk\s*=\s*qk_dep\s*$", wrap, re.M),
          "docs/qk.wrap: [wrap-git] with a revision, [provide] qk = qk_dep")
    if rev is None:
        return
    # a git repository of this tree, its files committed and tagged as the wrap's revision
    repo = os.path.join(d, "qk-repo")
    for f in source_files(src):
        os.makedirs(os.path.dirname(os.path.join(repo, f)), exist_ok=True)
        shutil.copy2(os.path.join(src, f), os.path.join(repo, f))
    git = ["git", "-C", repo, "-c", "user.name=qk test", "-c", "user.email=qk@test.invalid", "-c", "commit.gpgsign=false"]
    ok = all(run(git + a).returncode == 0 for a in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "qk under test"],
                                                   ["tag", rev.group(1)]))
    check(ok, "a local git repository of the tree, tagged %s" % rev.group(1))
    parent = os.path.join(d, "wparent")
    shutil.copytree(os.path.join(src, "tests", "packaging", "subproject"), parent)
    shutil.copy(CONSUMER, parent)
    mb = os.path.join(parent, "meson.build")
    text = open(mb).read()
    check("subproject('qk')" in text, "the parent's meson.build calls subproject('qk') (removed here)")
    text = text.replace("subproject('qk')\n", "")
    text += "qk_prof_dep = dependency('qk-prof')  # the wrap's [provide]\n"
    text += "test('use_qk_prof', executable('use_qk_prof', 'consumer.c', dependencies: qk_prof_dep, c_args: ['-DQK_PROF_IMPLEMENTATION']))\n"
    open(mb, "w").write(text)
    os.makedirs(os.path.join(parent, "subprojects"))
    wrap = re.sub(r"^url\s*=.*$", "url = " + repo, wrap, count=1, flags=re.M)
    open(os.path.join(parent, "subprojects", "qk.wrap"), "w").write(wrap)
    build = os.path.join(d, "wbuild")
    r = run(meson + ["setup", build, parent, "-Dqk:cuda=disabled"])
    check(r.returncode == 0, "the parent configures through subprojects/qk.wrap (%s)" % (r.stdout + r.stderr).strip()[-1500:])
    if r.returncode != 0:
        return
    check(os.path.isfile(os.path.join(parent, "subprojects", "qk", "qk.h")), "Meson cloned qk into subprojects/qk")
    tests = introspect(meson, build, "tests") or []
    names = sorted(t["name"] for t in tests)
    check(names == ["use_qk", "use_qk_prof"], "the parent's tests are its own (%s)" % names)
    check(introspect(meson, build, "installed") == {}, "nothing of qk's installed")
    r = run(["ninja", "-C", build])
    check(r.returncode == 0, "the wrap parent builds (%s)" % (r.stdout + r.stderr).strip()[-800:])
    r = run(meson + ["test", "-C", build, "--print-errorlogs"])
    check(r.returncode == 0, "the wrap parent's tests pass (%s)" % r.stdout.strip()[-800:])


def main():
    meson, src = shlex.split(sys.argv[1]), os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory() as d:
        parent = os.path.join(d, "parent")
        shutil.copytree(os.path.join(src, "tests", "packaging", "subproject"), parent)
        shutil.copy(CONSUMER, parent)
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
        wrap_check(meson, src, d)
    return finish("subproject")


sys.exit(main())
