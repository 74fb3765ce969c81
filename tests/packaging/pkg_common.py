"""What the packaging tests share (vendoring.py, pkgconfig_install.py, cmake_install.py,
subproject.py; the scripts' folder is on sys.path when they run): the check log, running a
command, the compiler command lines Meson passes, the installed tree, and the consumer program
(consumer.c here) with the reading of what it prints."""
import os, shlex, subprocess

STRICT = ["-Wall", "-Wextra", "-Werror", "-Wpedantic"]
CONSUMER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "consumer.c")
fails = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        fails.append(what)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def finish(name):
    """The exit status: 1 after any failed check, with the count; 0 with NAME: ok."""
    if fails:
        print("%d failure(s)" % len(fails))
        return 1
    print("%s: ok" % name)
    return 0


def compilers(rest):
    """CC... -- CXX... (Meson's compiler command arrays) as two lists."""
    j = rest.index("--")
    return rest[:j], rest[j + 1:]


def install_args(argv):
    """MESON BUILDDIR yes|no -- CC... -- CXX...: meson, build, cuda engine built, cc, cxx."""
    cc, cxx = compilers(argv[argv.index("--") + 1:])
    return argv[0], argv[1], argv[2] == "yes", cc, cxx


def install(meson, build, dest):
    """`meson install --destdir DEST` of the build (checked); {file name: its folder} of the tree."""
    r = run(shlex.split(meson) + ["install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"])
    check(r.returncode == 0, "meson install --destdir (%s)" % (r.stdout + r.stderr).strip()[-800:])
    found = {}
    for root, _, files in os.walk(dest):
        for f in files:
            found[f] = root
    return found


def consumer_output(r):
    """What the consumer printed: (K's 9 entries, cuda, prof), or None where it did not run
    through (r: its run, or None where it was not built)."""
    v = r.stdout.split() if r is not None and r.returncode == 0 else []
    if len(v) != 11 or not v[9].startswith("cuda=") or not v[10].startswith("prof="):
        return None
    return [float(x) for x in v[:9]], v[9][5:], v[10][5:]
