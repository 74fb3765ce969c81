"""What the qk-gram end-to-end scripts share (test_cli.py and test_cli_stream.py here,
mps/test_mps_ref.py; the program under test is their first argument): numpy or a skip (exit
77), the check log (check prints what failed, and what passed too with VERBOSE), a seeded
numpy generator, a process's CPU time (Linux /proc: the stop tests measure a stop in it)."""
import os, sys

EXE = os.path.abspath(sys.argv[1])
VERBOSE = False
failures = []


def need_numpy(message):
    """numpy, or the message and exit 77 (a skip) where it is not installed."""
    try:
        import numpy
    except ImportError:
        print(message)
        sys.exit(77)
    return numpy


def check(cond, what):
    if VERBOSE:
        print(("ok   " if cond else "FAIL ") + what)
    elif not cond:
        print("FAIL:", what)
    if not cond:
        failures.append(what)


def seeded_rng():
    """A numpy generator from a fresh seed, printed: (generator, seed)."""
    import numpy
    seed = int(numpy.random.default_rng().integers(2**31))
    print("seed", seed)
    return numpy.random.default_rng(seed), seed


def cpu_seconds(pid):
    """User + system CPU seconds of process pid so far (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime, stime
