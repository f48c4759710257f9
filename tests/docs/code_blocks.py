#!/usr/bin/env python3
"""Runs every fenced code block of README.md and docs/*.md as written, on the emulated driver.

Each block is run, or says in an HTML comment on the line before it (blank lines between are
allowed) why not; a block that neither runs nor says why fails the test, so a new example nobody
classified fails CI.

    (no comment)            a ```c, ```cpp or ```python block: compiled against the source tree's
                            include/ and the build's libtagmem and run (C, C++), or run by this
                            Python with the package on PYTHONPATH; TAGMEM_LIBCUDA names the
                            emulated driver. It must exit 0. Other languages need a comment.
    <!-- file: NAME -->     saved as NAME in the page's work directory, not run by itself
    <!-- run -->            a ```sh block run with bash -euo pipefail in the page's work
                            directory, where include/ and build/ are the source tree's headers and
                            the build under test (as at the repository root); it must exit 0
    <!-- tested: NAME -->   run by another test: some file under tests/ must contain
                            "tested: NAME" (so the comment cannot outlive that test)
    <!-- not run: WHY -->   not runnable here (needs PyTorch, a GPU, NCCL; shell commands that
                            install or build; output listings): WHY must say which. Refused for a
                            ```c or ```cpp block (it must be a complete program that runs on the
                            emulated driver) and for a ```python block that imports none of the
                            packages CI cannot have (NEEDS_OUTSIDE: PyTorch, through torch or
                            tagmem.torch and tagmem.compat, and Ray)

    code_blocks.py --source DIR --build DIR --work DIR --library LIBTAGMEM --emu LIBTAGMEM_EMU
                   [--cc CC] [--cxx CXX] [FILE.md ...]
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*(not run|tested|file|run)\s*(?::\s*(.*?))?\s*-->$")
RUN_TIMEOUT_S = 120
# A ```python block may be left unrun only when it imports one of these: the packages the emulated
# CI machine cannot have (PyTorch, and the parts of tagmem that import it; Ray).
NEEDS_OUTSIDE = re.compile(
    r"^\s*(?:import|from)\s+(?:torch|ray|tagmem\.torch|tagmem\.compat)\b", re.MULTILINE)


class Block:
    def __init__(self, page, line, language, text, marker, argument):
        self.page, self.line, self.language, self.text = page, line, language, text
        self.marker, self.argument = marker, argument

    def where(self):
        return f"{self.page}:{self.line} (```{self.language})"


def blocks_of(path, page):
    """The page's fenced blocks, each with the marker comment on its nearest non-blank line above."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, previous, i = [], "", 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        indent, fence, language = opening.groups()
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise SystemExit(f"{page}:{i + 1}: a code block that is never closed")
        marker = MARKER.match(previous)
        out.append(
            Block(page, i + 1, language, "\n".join(body) + "\n",
                  marker.group(1) if marker else None, (marker.group(2) or "") if marker else "")
        )
        previous, i = "", j + 1
    return out


def run(command, cwd, env, what):
    started = time.monotonic()
    result = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=RUN_TIMEOUT_S)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        return f"{what} exited {result.returncode}:\n{result.stdout}"
    print(f"    {what}: ok ({seconds:.1f} s)")
    return None


def tested_elsewhere(source, name):
    needle = f"tested: {name}"
    for path in glob.glob(os.path.join(source, "tests", "**", "*"), recursive=True):
        if os.path.isfile(path) and not path.endswith(".md") and path != os.path.abspath(__file__):
            with open(path, encoding="utf-8", errors="replace") as f:
                if needle in f.read():
                    return True
    return False


def check_page(args, page, env):
    """Runs one page's blocks in order; returns its failures as strings."""
    failures = []
    work = os.path.join(args.work, page.replace("/", "_").replace(".md", ""))
    os.makedirs(work)
    os.symlink(os.path.join(args.source, "include"), os.path.join(work, "include"))
    os.symlink(args.build, os.path.join(work, "build"))
    library_dir = os.path.dirname(args.library)
    for n, block in enumerate(blocks_of(os.path.join(args.source, page), page)):
        print(f"  {block.where()}: {block.marker or 'run'}{': ' + block.argument if block.argument else ''}")
        problem = None
        if block.marker == "not run":
            if not block.argument:
                problem = "<!-- not run --> must say why: <!-- not run: needs a GPU -->"
            elif block.language in ("c", "cpp"):
                problem = ("a C or C++ block must run: make it a complete program that checks "
                           "every status and runs on the emulated driver")
            elif block.language == "python" and not NEEDS_OUTSIDE.search(block.text):
                problem = ("a Python block that imports neither PyTorch (torch, tagmem.torch, "
                           "tagmem.compat) nor Ray must run on the emulated driver")
        elif block.marker == "tested":
            if not block.argument or not tested_elsewhere(args.source, block.argument):
                problem = f"no file under tests/ contains 'tested: {block.argument}'"
        elif block.marker == "file":
            name = block.argument
            if not name or "/" in name or name.startswith("."):
                problem = "<!-- file: NAME --> needs a plain file name"
            else:
                with open(os.path.join(work, name), "w", encoding="utf-8") as f:
                    f.write(block.text)
        elif block.marker == "run":
            if block.language not in ("sh", "bash"):
                problem = "<!-- run --> is for ```sh blocks; C, C++ and Python blocks run unmarked"
            else:
                problem = run(["bash", "-euo", "pipefail", "-c", block.text], work, env, "bash")
        elif block.language in ("c", "cpp"):
            c = block.language == "c"
            source = os.path.join(work, f"block{n}.{block.language}")
            program = os.path.join(work, f"block{n}")
            with open(source, "w", encoding="utf-8") as f:
                f.write(block.text)
            compiler = [args.cc, "-std=c11"] if c else [args.cxx, "-std=c++20"]
            problem = run(
                compiler + ["-Wall", "-Werror", source, "-I", os.path.join(args.source, "include"),
                            "-L", library_dir, "-ltagmem", f"-Wl,-rpath,{library_dir}", "-o", program],
                work, env, "compile",
            ) or run([program], work, env, "run")
        elif block.language == "python":
            problem = run([sys.executable, "-c", block.text], work, env, "python")
        else:
            problem = ("neither run nor classified: put <!-- not run: why --> (or <!-- run -->, "
                       "<!-- tested: NAME -->, <!-- file: NAME -->) on the line before it")
        if problem:
            failures.append(f"{block.where()}: {problem}")
            print(f"    FAILED: {problem}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--build", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--library", required=True, help="the build's libtagmem.so")
    parser.add_argument("--emu", required=True, help="the build's libtagmem_emu.so")
    parser.add_argument("--cc", default="cc")
    parser.add_argument("--cxx", default="c++")
    parser.add_argument("pages", nargs="*", help="default: README.md and docs/*.md")
    args = parser.parse_args()
    args.source, args.build = os.path.abspath(args.source), os.path.abspath(args.build)
    args.work = os.path.abspath(args.work)
    pages = args.pages or ["README.md"] + sorted(
        os.path.relpath(p, args.source) for p in glob.glob(os.path.join(args.source, "docs", "*.md"))
    )
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    env = dict(os.environ, TAGMEM_LIBCUDA=args.emu, TAGMEM_LIBRARY=args.library,
               PYTHONPATH=os.path.join(args.source, "integrations", "torch"))
    failures = []
    for page in pages:
        print(page)
        failures += check_page(args, page, env)
    if failures:
        print(f"\n{len(failures)} block(s) failed:", *failures, sep="\n")
        return 1
    print("every block runs or says why not")
    return 0


if __name__ == "__main__":
    sys.exit(main())
