#!/usr/bin/env bash
# Compiles and runs README.md's C example as written: the ```c block after
# <!-- tested: readme_c_example --> saved as app.c, then the lines of the ```sh block after
# <!-- tested: readme_c_compile --> run in a directory where include/ and build/ are the source
# tree's headers and the build tree under test, as they are at the repository root. The program
# checks every status and prints "done" last.
#   readme_c_example.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1 build=$2 work=$3

block() {  # the fenced block of language $2 right after the marker comment $1
  awk -v marker="<!-- tested: $1 -->" -v fence="\`\`\`$2" '
    $0 == marker { found = 1; next }
    found == 1 && $0 == fence { inside = 1; found = 2; next }
    inside && $0 == "```" { exit }
    inside { print }
    found == 1 && $0 != "" { exit }' "$src/README.md"
}

rm -rf "$work" && mkdir -p "$work"
ln -s "$src/include" "$work/include"
ln -s "$build" "$work/build"
block readme_c_example c >"$work/app.c"
block readme_c_compile sh >"$work/compile.sh"
for f in app.c compile.sh; do
  if [ ! -s "$work/$f" ]; then
    echo "README.md: no block for $f after its <!-- tested: ... --> marker" >&2
    exit 1
  fi
done
cd "$work"
out=$(bash -euo pipefail compile.sh)
echo "$out"
[ "$(printf '%s\n' "$out" | tail -n 1)" = "done" ] || { echo "the example did not finish" >&2; exit 1; }
