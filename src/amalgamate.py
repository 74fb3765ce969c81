#!/usr/bin/env python3
"""Generate the files users vendor from the development sources in src/.

    python3 src/amalgamate.py            write qk.h and qk_cuda.cu at the repository root
    python3 src/amalgamate.py --check    exit 1 (and say which) if a committed file is stale
    python3 src/amalgamate.py --layers   list the calls from one implementation source into a later
                                         one (exit 1 on any not in LAYER_EXCEPTIONS, or where
                                         src/qk_internal.h's layer numbers differ from the order)
    python3 src/amalgamate.py --lines -o DIR
                                         write both into DIR with #line directives, so a
                                         compiler error points into src/ (development builds)

Each generated file has a skeleton, src/qk_unity.h and src/cuda/qk_cuda.cu; both compile as they
are (-Isrc). A line `#include "NAME"` whose NAME is a file beside the including file is replaced
by that file's text, recursively; every other line is copied as it is. The skeleton's include
list is therefore the dependency order, and the generated file's contents block is made from the
`>>tag ---- description ---- */` lines of the files it inlines: a line `@contents` in a
skeleton's documentation block is replaced by that list (tag, description, source file), so the
list cannot go stale.
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUTPUTS = [('qk_unity.h', 'qk.h'), (os.path.join('cuda', 'qk_cuda.cu'), 'qk_cuda.cu')]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ONCE = re.compile(r'^\s*#\s*pragma\s+once\s*$')
TAG = re.compile(r'^/\* >>(\w+) ---- (.*) ---- \*/\s*$')
CONTENTS = re.compile(r'^(\s*)@contents\s*$')


def read(path):
    with open(path, encoding='utf-8', newline='') as f:
        return f.read().splitlines(keepends=True)


def expand(path, lines_mode, stack=(), tags=None, seen=None):
    """The text of path with its local includes inlined (each file once: a second include of
    the same file is dropped, as an include guard would); a list of lines. tags collects
    (tag, description, file) in order."""
    if seen is None:
        seen = set()
    seen.add(os.path.abspath(path))
    if path in stack:
        sys.exit('amalgamate: %s includes itself (%s)' % (path, ' -> '.join(stack)))
    rel = os.path.relpath(path, ROOT).replace(os.sep, '/')
    out = ['#line 1 "%s"\n' % rel] if lines_mode and stack else []
    for no, line in enumerate(read(path), 1):
        m = INCLUDE.match(line)
        inc = m and os.path.join(os.path.dirname(path), m.group(1))
        if inc and os.path.isfile(inc) and os.path.dirname(os.path.abspath(inc)).startswith(HERE):
            if os.path.abspath(inc) not in seen:
                out += expand(inc, lines_mode, stack + (path,), tags, seen)
            if lines_mode:
                out.append('#line %d "%s"\n' % (no + 1, rel))
            continue
        if stack and ONCE.match(line):
            continue                     # an inlined file's guard (each is inlined once anyway)
        t = TAG.match(line)
        if t and tags is not None:
            tags.append((t.group(1), t.group(2), os.path.relpath(path, HERE).replace(os.sep, '/')))
        out.append(line)
    return out


def generate(skeleton, lines_mode=False):
    tags = []
    lines = expand(os.path.join(HERE, skeleton), lines_mode, tags=tags)
    out = []
    for line in lines:
        c = CONTENTS.match(line)
        if not c:
            out.append(line)
            continue
        width = max(len(t) for t, _, _ in tags) + 2
        for tag, desc, src in tags:
            out.append('%s>>%-*s%s [%s]\n' % (c.group(1), width, tag, desc, src))
    return ''.join(out)


# Calls from an implementation source into a later one that are still there, each with the reason;
# the layering check (--layers, run by --check) fails on any other. Remove an entry when its call
# goes: a caller moves below its callee, or the code between them moves to the layer it serves.
LAYER_EXCEPTIONS = {
}

STRIP = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
DEF = re.compile(r'^(?:static|QKDEF|QK__PRIV)\b[^;{}()=]*?\b(qk_?_\w+)\s*\(([^;{}]*?)\)\s*(;|\{)', re.M)


def layer_violations():
    """(caller file, callee, callee file) for each call from an implementation source into a
    function defined in a later one, in the order of the qk.h skeleton."""
    order = [m.group(1) for m in map(INCLUDE.match, read(os.path.join(HERE, 'qk_unity.h')))
             if m and m.group(1).endswith('.c')]
    text = {f: STRIP.sub(lambda m: re.sub(r'[^\n]', ' ', m.group(0)), ''.join(read(os.path.join(HERE, f))))
            for f in order}
    where = {}
    for k, f in enumerate(order):
        for m in DEF.finditer(text[f]):
            if m.group(3) == '{':
                where.setdefault(m.group(1), k)
    out = []
    for k, f in enumerate(order):
        for name in sorted(set(re.findall(r'\b(qk_?_\w+)\s*\(', text[f]))):
            if where.get(name, -1) > k:
                out.append((f, name, order[where[name]]))
    return out


def layer_numbers():
    """Errors where src/qk_internal.h's layer numbers (QK__L_<SOURCE>, the development build's
    QK__LAYER) differ from the order of the qk.h skeleton's sources."""
    order = [m.group(1) for m in map(INCLUDE.match, read(os.path.join(HERE, 'qk_unity.h')))
             if m and m.group(1).endswith('.c')]
    want = [('QK__L_' + os.path.splitext(f)[0].upper(), str(k + 1)) for k, f in enumerate(order)]
    want.append(('QK__L_ALL', str(len(order) + 1)))
    have = re.findall(r'^#define (QK__L_\w+) (\d+)\s*$', ''.join(read(os.path.join(HERE, 'qk_internal.h'))), re.M)
    if have == want:
        return []
    return ['src/qk_internal.h: the layers must be, in this order, %s (src/qk_unity.h\'s sources); found %s'
            % (', '.join('%s %s' % w for w in want), ', '.join('%s %s' % h for h in have))]


def cuda_include_order():
    """Errors where a src/cuda/*.cuh includes one that comes later in the qk_cuda.cu skeleton (each
    operation's file includes what it uses, so it compiles alone: tests/tu_compile.py --cuda; a
    later one would be a call into a later section) or is not in the skeleton."""
    cdir = os.path.join(HERE, 'cuda')
    order = [m.group(1) for m in map(INCLUDE.match, read(os.path.join(cdir, 'qk_cuda.cu')))
             if m and m.group(1).endswith('.cuh')]
    out = []
    for f in sorted(x for x in os.listdir(cdir) if x.endswith('.cuh')):
        if f not in order:
            out.append('src/cuda/%s is not included by src/cuda/qk_cuda.cu' % f)
            continue
        for m in filter(None, map(INCLUDE.match, read(os.path.join(cdir, f)))):
            inc = m.group(1)
            if inc.endswith('.cuh') and (inc not in order or order.index(inc) >= order.index(f)):
                out.append('src/cuda/%s includes %s, which comes later in src/cuda/qk_cuda.cu' % (f, inc))
    return out


def check_layers(verbose):
    bad = 0
    for e in cuda_include_order():
        bad += 1
        print('error: ' + e, file=sys.stderr)
    for e in layer_numbers():
        bad += 1
        print('error: ' + e, file=sys.stderr)
    found = layer_violations()
    for key in sorted(set(LAYER_EXCEPTIONS) - {(f, n) for f, n, _ in found}):
        bad += 1
        print('error: LAYER_EXCEPTIONS lists %s -> %s, which is no longer there: remove the entry' % key,
              file=sys.stderr)
    for f, name, d in found:
        why = LAYER_EXCEPTIONS.get((f, name))
        if why is None:
            bad += 1
        if verbose or why is None:
            print('%s: %s calls %s, defined later in %s%s' % ('allowed' if why else 'error', f, name, d,
                                                            ' (' + why + ')' if why else ''),
                  file=sys.stderr if why is None else sys.stdout)
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--check', action='store_true', help='compare with the committed files; exit 1 if stale')
    ap.add_argument('--lines', action='store_true', help='add #line directives (not for committing)')
    ap.add_argument('--layers', action='store_true', help='list calls into later sources (exit 1 on a new one)')
    ap.add_argument('-o', '--outdir', default=ROOT, help='where to write (default: the repository root)')
    a = ap.parse_args()
    if a.lines and os.path.abspath(a.outdir) == ROOT:
        sys.exit('amalgamate: --lines output is for development builds; give -o DIR outside the root')
    if a.layers:
        return 1 if check_layers(True) else 0
    stale, bad_layers = [], False
    if a.check and check_layers(False):
        print('amalgamate: a source calls into a later one (see above): move the caller below the callee '
              'or the callee into an earlier layer', file=sys.stderr)
        bad_layers = True
    for skel, name in OUTPUTS:
        text = generate(skel, a.lines)
        dest = os.path.join(a.outdir, name)
        old = open(dest, encoding='utf-8', newline='').read() if os.path.exists(dest) else None
        if a.check:
            if old != text:
                stale.append(name)
        elif old != text:
            tmp = dest + '.tmp'
            with open(tmp, 'w', encoding='utf-8', newline='') as f:
                f.write(text)
            os.replace(tmp, dest)
    if bad_layers and not stale:
        return 1
    if stale:
        print('amalgamate: stale: %s differ from a fresh amalgamation of src/ '
              '(run python3 src/amalgamate.py and commit)' % ', '.join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
