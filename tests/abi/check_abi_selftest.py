#!/usr/bin/env python3
"""check_abi_selftest.py LIBTAGMEM LIBTAGMEM_PRELOAD: shows that check_abi.sh fails when a
library's ABI and its baseline differ, for each library it guards. For each, check_abi.sh --update
writes a baseline of the library as built into a scratch directory (so this test says whether the
check works, and abi_baseline_emu / abi_baseline_preload_emu whether the stored baselines are
current; the stored files are never changed). Against that baseline unchanged, check_abi.sh
passes; against a copy lacking a function the library exports (an addition, which check_abi.sh
refuses too), lacking the last field of a caller-sized struct (a struct grown), or naming a
function the library does not export (a removal), it fails, and its report names the function or
field. Exits 1 if any case did not go as expected."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_abi.sh")

# Per library (its file name up to ".so"): functions to drop, fields to drop (the last of a sized
# struct), a function to rename.
CASES = {
    "libtagmem": {
        "drop_functions": ["tagmem_ipc_stats_get_sized"],
        "drop_fields": ["listening", "host_budget_bytes"],
        "rename_function": "tagmem_handoff_cancel",
    },
    "libtagmem_preload": {
        "drop_functions": ["tagmem_nccl_stats_get_sized", "tms_pause"],
        "drop_fields": ["backup_store_used_bytes"],
        "rename_function": "tagmem_preload_default_tag",
    },
}


def drop_function(text, name):
    q = re.escape(name)
    out, n1 = re.subn(r"\n[ \t]*<elf-symbol name='%s' [^>]*/>" % q, "", text)
    out, n2 = re.subn(
        r"\n[ \t]*<function-decl name='%s' [^>]*?(/>|>.*?</function-decl>)" % q,
        "",
        out,
        flags=re.S,
    )
    return out if n1 == 1 and n2 == 1 else None


def drop_field(text, name):
    out, n = re.subn(
        r"\n[ \t]*<data-member [^>]*>\s*<var-decl name='%s' [^>]*/>\s*</data-member>"
        % re.escape(name),
        "",
        text,
    )
    return out if n == 1 else None


def rename_function(text, name):
    out, n = re.subn(r"'%s'" % re.escape(name), "'%s_gone'" % name, text)
    return out if n >= 2 else None  # the ELF symbol and the declaration at least


def run_check(lib, baseline, *extra):
    p = subprocess.run(
        ["bash", CHECK, lib, "--baseline", baseline] + list(extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return p.returncode, p.stdout


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    failures = []
    work = tempfile.mkdtemp(prefix="tagmem-abi-selftest-")
    try:
        for lib in sys.argv[1:]:
            baseline_name = re.sub(r"\.so.*$", "", os.path.basename(lib))
            cases = CASES[baseline_name]
            fresh = os.path.join(work, baseline_name + ".abi")
            rc, out = run_check(lib, fresh, "--update")
            if rc != 0:
                print(out)
                failures.append("%s: check_abi.sh --update exit %d" % (baseline_name, rc))
                continue
            with open(fresh) as f:
                text = f.read()
            variants = [("unchanged", None, text, 0)]
            for fn in cases["drop_functions"]:
                variants.append(("without function " + fn, fn, drop_function(text, fn), 1))
            for field in cases["drop_fields"]:
                variants.append(("without field " + field, field, drop_field(text, field), 1))
            fn = cases["rename_function"]
            variants.append(("naming %s_gone for %s" % (fn, fn), fn, rename_function(text, fn), 1))
            for what, name, mutated, want in variants:
                label = "%s %s" % (baseline_name, what)
                if mutated is None:
                    failures.append("%s: the baseline has no such entry to change" % label)
                    continue
                copy = os.path.join(work, "copy.abi")
                with open(copy, "w") as f:
                    f.write(mutated)
                rc, out = run_check(lib, copy)
                ok = rc == want and (name is None or name in out)
                print("%s: check_abi.sh exit %d (want %d)%s" % (label, rc, want,
                                                                 "" if ok else "  <-- WRONG"))
                if not ok:
                    print(out)
                    failures.append(label)
    finally:
        shutil.rmtree(work)
    if failures:
        print("check_abi_selftest: FAILED: " + "; ".join(failures))
        return 1
    print("check_abi_selftest: every changed baseline failed, the unchanged ones passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
