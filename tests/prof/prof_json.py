"""What the profiler's report checkers (prof_advice.py, prof_export.py, prof_locale.py) share:
check(cond, what), which records and prints a failure in fails, and load(path), json.load that
fails the test on a duplicate key in any object (json keeps the last value silently)."""
import json, os

fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what)


def load(path):
    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        check(not dup, "%s: duplicate keys %s in one object" % (os.path.basename(path), dup))
        return dict(pairs)
    with open(path) as f:
        return json.load(f, object_pairs_hook=no_dups)
