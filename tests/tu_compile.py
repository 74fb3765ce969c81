#!/usr/bin/env python3
"""Every source of qk compiles alone, warning-free (the development build's layering check).

    tu_compile.py SRCROOT [--mpicc MPICC] -- CC [ARGS...]

Each src/*.c listed in src/qk_unity.h is compiled as its own translation unit (-fsyntax-only)
with -DQK__LAYER=QK__L_<SOURCE>, -Wall -Wextra -Werror -Wpedantic -Wmissing-prototypes, -std=c99,
in each configuration below: it then sees only qk.h's declarations and the sections of
src/qk_internal.h up to its own, so a call into a later source, or into a function another
source does not export, fails (docs/vendoring.md, "Developing qk"). The QK_MPI configuration
runs where --mpicc names MPI's compiler wrapper, which compiles it (the MPI headers' path). Exit 1 on any warning or error, with the
compiler's message.
"""
import concurrent.futures
import os
import re
import subprocess
import sys

FLAGS = ['-std=c99', '-Wall', '-Wextra', '-Werror', '-Wpedantic', '-Wmissing-prototypes', '-fsyntax-only']
# The configurations: the default, then each macro that selects code in the sources (a source is
# compiled in a configuration when its text or qk_internal.h's names the macro).
CONFIGS = [
    ('default', [], None),
    ('QK_NO_THREADS', ['-DQK_NO_THREADS'], 'QK_NO_THREADS'),
    ('QK_NO_VECTOR_EXT', ['-DQK_NO_VECTOR_EXT'], 'QK_NO_VECTOR_EXT'),
    ('QK_NO_DISPATCH', ['-DQK_NO_DISPATCH'], 'QK_NO_DISPATCH'),
    ('QK_CUDA', ['-DQK_CUDA=1'], 'QK_CUDA'),
    ('QK_TUNE_CACHE', ['-DQK_TUNE_CACHE'], 'QK_TUNE_CACHE'),
    ('QK_PROF_ENABLE', ['-DQK_PROF_ENABLE', '-DQK_CUDA=1'], 'QK_PROF'),
]


def main():
    argv = sys.argv[1:]
    if '--' not in argv or not argv:
        sys.exit(__doc__)
    k = argv.index('--')
    root, opts, cc = argv[0], argv[1:k], argv[k + 1:]
    mpicc = opts[opts.index('--mpicc') + 1] if '--mpicc' in opts else None
    src = os.path.join(root, 'src')
    order = [m.group(1) for m in (re.match(r'\s*#\s*include\s+"([^"]+\.c)"', l)
                                  for l in open(os.path.join(src, 'qk_unity.h'))) if m]
    configs = [c + (cc,) for c in CONFIGS]
    if mpicc:
        configs.append(('QK_MPI', ['-DQK_MPI'], 'QK_MPI', [mpicc]))
    internal = open(os.path.join(src, 'qk_internal.h')).read()
    jobs = []
    for name, defs, macro, comp in configs:
        for f in order:
            text = open(os.path.join(src, f)).read()
            if macro and macro not in text and macro not in internal:
                continue
            layer = 'QK__L_' + os.path.splitext(f)[0].upper()
            jobs.append((name, f, comp + FLAGS + ['-I' + src, '-I' + root, '-DQK__LAYER=' + layer] + defs
                         + [os.path.join(src, f)]))

    def run(job):
        name, f, cmd = job
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        return name, f, cmd, p.returncode, p.stdout

    bad = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        for name, f, cmd, rc, out in ex.map(run, jobs):
            if rc != 0 or out.strip():
                bad += 1
                print('FAIL %s [%s]: %s\n%s' % (f, name, ' '.join(cmd), out))
    print('%d translation units (%d sources x %d configurations, where they apply), %d failed'
          % (len(jobs), len(order), len(configs), bad))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
