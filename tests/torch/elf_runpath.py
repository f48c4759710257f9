"""The run paths and needed libraries of ELF files, read without any ELF tool or library, and the
rule packaged libraries follow (integrations/torch/setup.py: Note [packaged run paths]).

    python3 tests/torch/elf_runpath.py DIR...   checks every ELF file under each DIR; exit 1 and
                                                 one line per offence when any breaks the rule.
"""

import os
import struct
import sys

_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29
_SHT_DYNAMIC = 6


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def dynamic_entries(path):
    """{"NEEDED": [...], "RPATH": [...], "RUNPATH": [...]} of a 64- or 32-bit ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path}: not an ELF file")
    wide = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    if wide:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
        section = order + "IIQQQQIIQQ"  # name type flags addr offset size link info align entsize
        entry = order + "qQ"
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
        section = order + "IIIIIIIIII"
        entry = order + "iI"
    sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    out = {"NEEDED": [], "RPATH": [], "RUNPATH": []}
    for s in sections:
        if s[1] != _SHT_DYNAMIC:
            continue
        strtab = sections[s[6]]
        strings = data[strtab[4] : strtab[4] + strtab[5]]
        for at in range(s[4], s[4] + s[5], struct.calcsize(entry)):
            tag, value = struct.unpack_from(entry, data, at)
            if tag == 0:
                break
            name = {_DT_NEEDED: "NEEDED", _DT_RPATH: "RPATH", _DT_RUNPATH: "RUNPATH"}.get(tag)
            if name:
                out[name].append(strings[value : strings.index(b"\0", value)].decode())
    return out


def offences(path):
    """What is wrong with packaged ELF file `path` (an empty list when nothing): a run path is
    "$ORIGIN" and nothing else (an empty entry is the current directory, an absolute one a
    directory of the machine that built it), DT_RUNPATH only (DT_RPATH outranks LD_LIBRARY_PATH),
    and a file that needs libtagmem.so.1 finds it beside itself."""
    entries = dynamic_entries(path)
    found = []
    if entries["RPATH"]:
        found.append(f"DT_RPATH {entries['RPATH']}")
    for runpath in entries["RUNPATH"]:
        if runpath != "$ORIGIN":
            found.append(f"run path {runpath!r} (only '$ORIGIN' is allowed)")
    if "libtagmem.so.1" in entries["NEEDED"] and entries["RUNPATH"] != ["$ORIGIN"]:
        found.append("needs libtagmem.so.1 but has no run path '$ORIGIN'")
    return found


def elf_files(directory):
    for root, _, names in os.walk(directory):
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path) and is_elf(path):
                yield path


def main(directories):
    checked, bad = 0, 0
    for directory in directories:
        for path in elf_files(directory):
            checked += 1
            for offence in offences(path):
                bad += 1
                print(f"{path}: {offence}")
    print(f"elf_runpath: {checked} ELF files checked, {bad} offences")
    return 1 if bad or not checked else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
