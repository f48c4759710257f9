#!/usr/bin/env python3
"""Proves that check_layers.py can fail: on copies of the real table, an include that runs up, an
include from a folder the table does not allow, a folder missing from the table and a table line
that names a folder below it as a user must each be reported, and a clean tree must pass."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, '..', '..'))
CHECK = os.path.join(HERE, 'check_layers.py')


def tree(files, table=None):
    root = tempfile.mkdtemp(prefix='layers-')
    os.makedirs(os.path.join(root, 'allocator'))
    if table is None:
        shutil.copy(os.path.join(REPO, 'allocator', 'layers.txt'), os.path.join(root, 'allocator'))
    else:
        with open(os.path.join(root, 'allocator', 'layers.txt'), 'w') as f:
            f.write(table)
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), 'w') as f:
            f.write(text)
    return root


def run(root):
    p = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)
    shutil.rmtree(root)
    return p.returncode, p.stdout


CASES = [
    ('clean', {'allocator/api/a.cpp': '#include "registry/r.hpp"\n',
               'allocator/registry/r.hpp': '#include "base/e.hpp"\n',
               'allocator/base/e.hpp': '#include <cstddef>\n'}, None, 0, None),
    ('up', {'allocator/base/e.hpp': '#include "api/a.hpp"\n', 'allocator/api/a.hpp': ''}, None, 1,
     'includes "api/a.hpp" from allocator/api, which allocator/base may not use'),
    ('sideways', {'allocator/peers/p.cpp': '#include "host/h.hpp"\n', 'allocator/host/h.hpp': ''},
     None, 1, 'which allocator/peers may not use'),
    ('unlisted', {'allocator/newfolder/n.cpp': '#include <cstdio>\n'}, None, 1,
     'its folder is not in allocator/layers.txt'),
    ('table runs up', {}, 'base: options\noptions: base\n', 1, 'which is not listed above it'),
]

failures = 0
for name, files, table, want_rc, want_text in CASES:
    rc, out = run(tree(files, table))
    ok = rc == want_rc and (want_text is None or want_text in out)
    print(f'{"ok  " if ok else "FAIL"} {name}: exit {rc}' + ('' if ok else f'\n{out}'))
    failures += not ok
print(f'{len(CASES) - failures} passed, {failures} failed')
sys.exit(1 if failures else 0)
