#!/usr/bin/env python3
"""Runs one test file of tests/python: with pytest when it is installed, else with the small
runner below (every test_* function, unittest.SkipTest as a skip). Exit status: 0 passed (some
may have skipped), 1 failed, 77 everything skipped or numpy / the qk package not importable
(Meson's skip).

    PYTHONPATH=build/src/python python3 tests/python/run.py tests/python/test_gram.py
"""
import importlib.util
import os
import sys
import traceback
import unittest

SKIP = 77


def main() -> int:
    path = os.path.abspath(sys.argv[1])
    try:
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"skip: numpy is not installed ({e})")
        return SKIP
    try:
        import qk
    except ImportError as e:
        print(f"skip: the qk package cannot be imported ({e}); PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
        return SKIP
    print(f"qk {qk.__version__} from {os.path.dirname(qk.__file__)}, engine {qk.engine()}")
    try:
        import pytest
    except ImportError:
        pytest = None
    if pytest is not None:
        class Count:
            def __init__(self):
                self.passed = 0

            def pytest_runtest_logreport(self, report):
                if report.when == "call" and report.passed:
                    self.passed += 1

        c = Count()
        rc = pytest.main(["-q", "-s", "-rs", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", path], plugins=[c])
        # 5: no test collected (a module-level SkipTest, e.g. qiskit absent): a skip too
        if int(rc) == 5 or (rc == 0 and c.passed == 0):
            return SKIP
        return 0 if rc == 0 else 1
    print("pytest is not installed: running the tests with tests/python/run.py's own runner")
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except unittest.SkipTest as e:
        print(f"skip: {e}")
        return SKIP
    passed = failed = skipped = 0
    for name in sorted(n for n in dir(mod) if n.startswith("test_") and callable(getattr(mod, n))):
        try:
            getattr(mod, name)()
            passed += 1
            print(f"PASS {name}")
        except unittest.SkipTest as e:
            skipped += 1
            print(f"SKIP {name}: {e}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    if failed:
        return 1
    return 0 if passed else SKIP


if __name__ == "__main__":
    sys.exit(main())
