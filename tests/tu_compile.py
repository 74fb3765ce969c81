#!/usr/bin/env python3
"""Every source of qk compiles alone, warning-free (the development build's layering check).

    tu_compile.py SRCROOT [--mpicc MPICC] -- CC [ARGS...]
    tu_compile.py SRCROOT --cuda NVCC -- CXX [ARGS...]

Each src/*.c listed in src/qk_unity.h is compiled as its own translation unit (-fsyntax-only)
with -DQK__LAYER=QK__L_<SOURCE>, -Wall -Wextra -Werror -Wpedantic -Wmissing-prototypes, -std=c99,
in each configuration below: it then sees only qk.h's declarations and the sections of
src/qk_internal.h up to its own, so a call into a later source, or into a function another
source does not export, fails (docs/vendoring.md, "Developing qk"). The QK_MPI configuration
runs where --mpicc names MPI's compiler wrapper, which compiles it (the MPI headers' path). Exit 1 on any warning or error, with the
compiler's message.

--cuda: each src/cuda/*.cuh (the CUDA engine's operations, in src/cuda/qk_cuda.cu's order) is
compiled alone: a one-line file including only it goes through nvcc (-cuda: host and device code
parsed and checked, the device side to unoptimised PTX for sm_90, -Werror all-warnings), and the host translation it
produces through CXX -fsyntax-only -Wall -Wextra -Werror. Each operation includes what it uses
(src/amalgamate.py --check refuses an include of a later one), so a use of a later section, or of
one it does not include, fails here. Exit 77 when NVCC cannot run.
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


def cuda_main(root, nvcc, cxx):
    import tempfile
    src = os.path.join(root, 'src', 'cuda')
    order = [m.group(1) for m in (re.match(r'\s*#\s*include\s+"([^"]+\.cuh)"', l)
                                  for l in open(os.path.join(src, 'qk_cuda.cu'))) if m]
    try:
        subprocess.run([nvcc, '--version'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    except (OSError, subprocess.CalledProcessError):
        print('nvcc (%s) cannot run: skipped' % nvcc)
        return 77
    tmp = tempfile.mkdtemp(prefix='qk-cuh-')

    def run(f):
        stem = os.path.splitext(f)[0]
        cu, ii = os.path.join(tmp, stem + '.cu'), os.path.join(tmp, stem + '.ii')
        with open(cu, 'w') as o:
            o.write('#include "%s"\n' % f)
        # PTX only, unoptimised (no ptxas): the device side is checked, not optimised
        cmd = [nvcc, '-x', 'cu', '-cuda', '--std=c++17', '-gencode', 'arch=compute_90,code=compute_90', '-Xcicc', '-O0',
               '-Werror', 'all-warnings', '-I' + root, '-I' + src, cu, '-o', ii]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        if p.returncode != 0 or p.stdout.strip():
            return f, cmd, p.returncode or 1, p.stdout
        cmd = cxx + ['-std=c++17', '-fsyntax-only', '-Wall', '-Wextra', '-Werror', '-x', 'c++', ii]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        return f, cmd, p.returncode, p.stdout

    bad = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        for f, cmd, rc, out in ex.map(run, order):
            if rc != 0 or out.strip():
                bad += 1
                print('FAIL src/cuda/%s: %s\n%s' % (f, ' '.join(cmd), out))
    print('%d CUDA operation files compiled alone, %d failed' % (len(order), bad))
    return 1 if bad else 0


def main():
    argv = sys.argv[1:]
    if '--' not in argv or not argv:
        sys.exit(__doc__)
    k = argv.index('--')
    root, opts, cc = argv[0], argv[1:k], argv[k + 1:]
    if '--cuda' in opts:
        return cuda_main(root, opts[opts.index('--cuda') + 1], cc)
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
