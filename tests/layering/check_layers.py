#!/usr/bin/env python3
"""Checks the allocator's layering: every #include in allocator/ and integrations/ must come from
the including file's own folder, the public headers, or a folder that allocator/layers.txt allows
for it; and the table itself must list each folder after every folder it uses, so that no include
runs back up. Prints one line per violation and exits 1 if there is any.

Usage: check_layers.py [REPO_ROOT]
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), '..', '..'))
TABLE = os.path.join(ROOT, 'allocator', 'layers.txt')
SOURCE = re.compile(r'\.(c|cc|cpp|cu|h|hpp|def|S)$')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Where a quoted include is looked for after the including file's own folder: the build's
# include directories (allocator/CMakeLists.txt and the integrations' own).
SEARCH = ['allocator', 'include', 'allocator/driver', 'allocator/options', 'integrations/nccl',
          'integrations/preload']


def folder_key(name):
    """A table key as a repository path: integrations/... as written, the rest under allocator/."""
    return name if name.startswith('integrations/') else 'allocator/' + name


def read_table():
    order, allowed, problems = [], {}, []
    with open(TABLE) as f:
        for number, line in enumerate(f, 1):
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            if ':' not in line:
                problems.append(f'{TABLE}:{number}: expected "folder: uses..."')
                continue
            name, uses = line.split(':', 1)
            key = folder_key(name.strip())
            if key in allowed:
                problems.append(f'{TABLE}:{number}: {name.strip()} is listed twice')
            deps = [folder_key(u) for u in uses.split()]
            for d in deps:
                if d not in allowed:
                    problems.append(f'{TABLE}:{number}: {name.strip()} uses {d}, which is not '
                                    'listed above it (includes must never run back up)')
            order.append(key)
            allowed[key] = set(deps)
    return order, allowed, problems


def owner(path, folders):
    """The most specific table folder holding `path`, or None."""
    best = None
    for f in folders:
        if path.startswith(f + '/') and (best is None or len(f) > len(best)):
            best = f
    return best


def resolve(includer, name, files):
    here = os.path.normpath(os.path.join(os.path.dirname(includer), name))
    if here in files:
        return here
    for d in SEARCH:
        p = os.path.normpath(os.path.join(d, name))
        if p in files:
            return p
    return None  # generated or external: not ours to check


def main():
    order, allowed, problems = read_table()
    files = set()
    for top in ('allocator', 'include', 'integrations'):
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for n in names:
                if SOURCE.search(n):
                    files.add(os.path.relpath(os.path.join(dirpath, n), ROOT))
    checked = 0
    for path in sorted(files):
        if path.startswith('include/'):
            continue
        mine = owner(path, order)
        if mine is None:
            if path.startswith('allocator/'):
                problems.append(f'{path}: its folder is not in allocator/layers.txt')
            continue
        with open(os.path.join(ROOT, path), errors='replace') as f:
            text = f.read()
        for m in INCLUDE.finditer(text):
            target = resolve(path, m.group(1), files)
            if target is None or target.startswith('include/'):
                continue
            theirs = owner(target, order)
            checked += 1
            if theirs == mine or theirs in allowed[mine]:
                continue
            line = text.count('\n', 0, m.start()) + 1
            where = theirs or os.path.dirname(target)
            problems.append(f'{path}:{line}: includes "{m.group(1)}" from {where}, which '
                            f'{mine} may not use (allocator/layers.txt)')
    for p in problems:
        print(p)
    print(f'layering: {checked} includes in {len(files)} files checked, {len(problems)} problems')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
