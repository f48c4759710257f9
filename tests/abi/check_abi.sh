#!/usr/bin/env bash
# check_abi.sh LIBRARY [--update]: compares the ABI that LIBRARY (libtagmem.so.N as built) exports
# with the stored baseline, tests/abi/libtagmem.abi, using libabigail (Debian: abigail-tools).
# Any difference fails, additions included: a change to the ABI is made on purpose, by running
# this with --update and committing the new baseline beside the change (docs/abi.md says which
# changes a minor release may make and which need a new soname).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
baseline="$here/libtagmem.abi"
lib=${1:?usage: check_abi.sh LIBRARY [--update]}
for tool in abidw abidiff; do
  command -v "$tool" >/dev/null || { echo "check_abi: $tool not found (apt-get install abigail-tools)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Only the types of the public headers: the library's internals are not its ABI.
abidw --headers-dir "$root/include/tagmem" --drop-private-types --drop-undefined-syms \
  --exported-interfaces-only --no-corpus-path --out-file "$work/now.abi" "$lib"
if [ "${2:-}" = --update ]; then
  cp "$work/now.abi" "$baseline"
  echo "check_abi: wrote $baseline"
  exit 0
fi
status=0
abidiff --headers-dir1 "$root/include/tagmem" --headers-dir2 "$root/include/tagmem" \
  "$baseline" "$work/now.abi" > "$work/diff.txt" || status=$?
if [ "$status" -ne 0 ]; then
  cat "$work/diff.txt"
  echo "check_abi: $(basename "$lib") differs from tests/abi/libtagmem.abi (abidiff status $status)." >&2
  echo "check_abi: if the change is meant, follow docs/abi.md and run: bash tests/abi/check_abi.sh $lib --update" >&2
  exit 1
fi
echo "check_abi: $(basename "$lib") exports the ABI of tests/abi/libtagmem.abi"
