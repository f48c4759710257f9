#!/usr/bin/env python3
"""code_blocks.py can fail: a page with one block of each kind it must refuse, run through it, must
report every one of them and exit non-zero; the blocks it must accept must not be reported.

    code_blocks_selftest.py WORK_DIR
"""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = """# A page

```sh
echo unclassified shell
```

<!-- not run -->
```sh
echo not run without a reason
```

<!-- tested: a_name_no_test_has -->
```python
pass
```

```python
raise SystemExit(3)
```

<!-- run -->
```python
pass
```

<!-- not run: output -->
```
accepted
```

```python
print("accepted")
```

<!-- not run: a fragment -->
```c
tagmem_offload(tags, 1, 0, TAGMEM_BACKUP);
```

<!-- not run: a fragment -->
```cpp
tagmem::offload({"weights"});
```

<!-- not run: needs nothing outside this machine -->
```python
import tagmem
```

<!-- not run: needs PyTorch and a GPU -->
```python
import torch
```

<!-- not run: needs PyTorch and a GPU -->
```python
import os
import tagmem.torch as tt
```

<!-- not run: needs Ray and a GPU -->
```python
from ray import get
```
"""
REFUSED = {3: "neither run nor classified", 8: "must say why", 13: "no file under tests/",
           17: "python exited 3", 22: "<!-- run --> is for", 36: "a C or C++ block must run",
           41: "a C or C++ block must run", 46: "a Python block that imports neither"}


def main():
    work = os.path.abspath(sys.argv[1])
    shutil.rmtree(work, ignore_errors=True)
    source = os.path.join(work, "source")
    os.makedirs(os.path.join(source, "include"))
    os.makedirs(os.path.join(source, "tests"))
    with open(os.path.join(source, "page.md"), "w") as f:
        f.write(PAGE)
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "code_blocks.py"), "--source", source, "--build", work,
         "--work", os.path.join(work, "out"), "--library", "/nonexistent/libtagmem.so",
         "--emu", "/nonexistent/libtagmem_emu.so", "page.md"],
        capture_output=True, text=True, timeout=120)
    report = result.stdout.split("block(s) failed:")[-1]
    problems = []
    if result.returncode != 1:
        problems.append(f"exit status {result.returncode}, expected 1")
    for line, words in REFUSED.items():
        if not any(l.startswith(f"page.md:{line} ") and words in l for l in report.splitlines()):
            problems.append(f"page.md:{line} not reported as '{words}'")
    if f"{len(REFUSED)} block(s) failed" not in result.stdout:
        problems.append(f"expected exactly {len(REFUSED)} failures")
    if problems:
        print(result.stdout, result.stderr, *problems, sep="\n")
        return 1
    print(f"code_blocks.py refused all {len(REFUSED)} bad blocks and accepted the rest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
