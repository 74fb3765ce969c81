#!/usr/bin/env python3
"""Generate the files users vendor from the development sources in src/.

    python3 src/amalgamate.py            write qk.h and qk_cuda.cu at the repository root
    python3 src/amalgamate.py --check    exit 1 (and say which) if a committed file is stale
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--check', action='store_true', help='compare with the committed files; exit 1 if stale')
    ap.add_argument('--lines', action='store_true', help='add #line directives (not for committing)')
    ap.add_argument('-o', '--outdir', default=ROOT, help='where to write (default: the repository root)')
    a = ap.parse_args()
    if a.lines and os.path.abspath(a.outdir) == ROOT:
        sys.exit('amalgamate: --lines output is for development builds; give -o DIR outside the root')
    stale = []
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
    if stale:
        print('amalgamate: stale: %s differ from a fresh amalgamation of src/ '
              '(run python3 src/amalgamate.py and commit)' % ', '.join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
