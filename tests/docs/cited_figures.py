#!/usr/bin/env python3
"""The README states no figure of its own: every number in a README table row that cites a section
of the docs must appear in that section, so a figure has one source and cannot drift from it.

A table cites when its last column is "source" or "section". That cell names the section in
double quotes ("Swap"), optionally after the page (docs/performance.md, "Swap"; the default page is
docs/performance.md); "the same" repeats the row above. Every number in the row's cells between
the first and the last (a range 0.546–0.564 counts as its two ends) must occur in the section: the
text from its heading to the next heading of the same or a higher level.

    cited_figures.py SOURCE_DIR            checks README.md
    cited_figures.py --selftest            shows that a figure missing from its section fails
"""

import os
import re
import sys
import tempfile

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
DEFAULT_PAGE = "docs/performance.md"


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def section(text, name):
    """The text under the heading `name`, or None."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        heading = re.match(r"^(#+)\s+(.*?)\s*$", line)
        if heading and heading.group(2) == name:
            level = len(heading.group(1))
            end = next((j for j in range(i + 1, len(lines))
                        if re.match(r"^#{1,%d}\s" % level, lines[j])), len(lines))
            return "\n".join(lines[i + 1 : end])
    return None


def check(source, readme="README.md"):
    problems, header, cited = [], None, None
    with open(os.path.join(source, readme), encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if not line.startswith("|"):
            header = None
            continue
        row = cells(line)
        if header is None:
            header = [c.lower() for c in row]
            continue
        if set("".join(row)) <= set("-: ") or header[-1] not in ("source", "section"):
            continue
        cell = row[-1]
        if cell != "the same":
            quoted = re.search(r'"([^"]+)"', cell)
            page = re.search(r"docs/[\w.-]+\.md", cell)
            if not quoted:
                problems.append(f"{readme}:{n}: the last cell names no section in double quotes")
                continue
            cited = (page.group(0) if page else DEFAULT_PAGE, quoted.group(1))
        if cited is None:
            problems.append(f"{readme}:{n}: 'the same' with no section above it")
            continue
        with open(os.path.join(source, cited[0]), encoding="utf-8") as f:
            text = section(f.read(), cited[1])
        if text is None:
            problems.append(f"{readme}:{n}: {cited[0]} has no section \"{cited[1]}\"")
            continue
        for value in NUMBER.findall(" ".join(row[1:-1])):
            if not re.search(r"(?<![\d.])" + re.escape(value) + r"(?![\d]|\.\d)", text):
                problems.append(f"{readme}:{n}: {value} is not in {cited[0]}, \"{cited[1]}\"")
    return problems


def selftest():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "docs"))
        with open(os.path.join(d, DEFAULT_PAGE), "w") as f:
            f.write("# P\n\n## Swap\n\nswap 0.546 and 0.564 of the time\n\n## Other\n\n0.600\n")
        with open(os.path.join(d, "README.md"), "w") as f:
            f.write("| what | measured | section |\n| --- | --- | --- |\n"
                    '| swap | 0.546–0.564 | "Swap" |\n| swap | 0.546–0.600 | the same |\n'
                    '| swap | 0.56 | "Swap" |\n| swap | 1 | "Missing" |\n')
        found = check(d)
    expected = ["README.md:4: 0.600 is not", "README.md:5: 0.56 is not", "README.md:6: docs/"]
    if len(found) != len(expected) or not all(f.startswith(e) for f, e in zip(found, expected)):
        print("selftest: expected", expected, "got", found, sep="\n")
        return 1
    print("selftest: a figure missing from its section is reported")
    return 0


def main():
    if sys.argv[1:] == ["--selftest"]:
        return selftest()
    problems = check(sys.argv[1])
    for p in problems:
        print(p)
    if problems:
        print("README figures must be copied from the section they cite")
        return 1
    print("every figure the README cites is in its section")
    return 0


if __name__ == "__main__":
    sys.exit(main())
