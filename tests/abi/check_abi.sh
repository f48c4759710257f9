#!/usr/bin/env bash
# check_abi.sh LIBRARY [--update] [--baseline FILE]: compares the ABI that LIBRARY exports with its
# stored baseline, using libabigail (Debian: abigail-tools). LIBRARY is libtagmem.so.N or
# libtagmem_preload.so as built; its baseline is tests/abi/<name>.abi, the file name up to ".so"
# (libtagmem.abi, libtagmem_preload.abi), or FILE. Any difference fails, additions included: a
# change to the ABI is made on purpose, by running this with --update and committing the new
# baseline beside the change (docs/abi.md says which changes a minor release may make and which
# need a new soname). check_abi_selftest.py shows that a baseline lacking a function or a field,
# or naming one the library lacks, fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
usage="usage: check_abi.sh LIBRARY [--update] [--baseline FILE]"
lib=${1:?$usage}
shift
update=0
baseline="$here/$(basename "$lib" | sed 's/\.so.*$//').abi"
while [ $# -gt 0 ]; do
  case "$1" in
    --update) update=1 ;;
    --baseline) baseline=${2:?$usage}; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done
[ -f "$lib" ] || { echo "check_abi: no library $lib" >&2; exit 1; }
for tool in abidw abidiff; do
  command -v "$tool" >/dev/null || { echo "check_abi: $tool not found (apt-get install abigail-tools)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Only the types of the public headers: the library's internals are not its ABI.
abidw --headers-dir "$root/include/tagmem" --drop-private-types --drop-undefined-syms \
  --exported-interfaces-only --no-corpus-path --out-file "$work/now.abi" "$lib"
if [ "$update" = 1 ]; then
  cp "$work/now.abi" "$baseline"
  echo "check_abi: wrote $baseline"
  exit 0
fi
[ -f "$baseline" ] || {
  echo "check_abi: no baseline $baseline; make it with: bash tests/abi/check_abi.sh $lib --update" >&2
  exit 1
}
status=0
abidiff --headers-dir1 "$root/include/tagmem" --headers-dir2 "$root/include/tagmem" \
  "$baseline" "$work/now.abi" > "$work/diff.txt" || status=$?
if [ "$status" -ne 0 ]; then
  cat "$work/diff.txt"
  echo "check_abi: $(basename "$lib") differs from $baseline (abidiff status $status)." >&2
  echo "check_abi: if the change is meant, follow docs/abi.md and run: bash tests/abi/check_abi.sh $lib --update" >&2
  exit 1
fi
echo "check_abi: $(basename "$lib") exports the ABI of $baseline"
