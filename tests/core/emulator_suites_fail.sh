#!/usr/bin/env bash
# Runs the core suite's Emulator* tests without the emulated driver (on the real one, or with no
# driver at all), where they cannot pass, and checks that each fails as a test (exit status 1,
# every test reported failed) rather than crashing the binary on the emulator's controls, which
# are null there.
#
#   bash tests/core/emulator_suites_fail.sh <tagmem_core_tests>
set -uo pipefail
tests=${1:?usage: emulator_suites_fail.sh <tagmem_core_tests>}
unset TAGMEM_LIBCUDA
listed=$("$tests" --gtest_filter='Emulator*:*/Emulator*' --gtest_list_tests | grep -c '^  ')
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$tests" --gtest_filter='Emulator*:*/Emulator*' >"$log" 2>&1
rc=$?
failed=$(sed -n 's/^ *\([0-9]*\) FAILED TESTS\?$/\1/p' "$log")
failed=${failed:-0}
echo "Emulator* tests: $listed listed, $failed failed, exit status $rc"
if [[ $rc -ne 1 || $failed -ne $listed || $listed -eq 0 ]]; then
  tail -n 20 "$log"
  echo "expected exit status 1 with every listed test failed" >&2
  exit 1
fi
