#!/usr/bin/env bash
# tagmem_gpu_launch's skip rule (gpu_launch.c), checked on the emulated driver: it skips (77) when
# the driver cannot be loaded or reports no device, and otherwise runs the test with its arguments
# and exit status untouched, whatever that status is.
# Usage: gpu_launch_test.sh <tagmem_gpu_launch> <libtagmem_emu.so>
set -uo pipefail
launch=$1 emu=$2
failures=0
expect() {  # expect <status> <description> -- env... command...
  local want=$1 what=$2
  shift 3
  local got
  env "$@" >/tmp/gpu_launch_test.$$ 2>&1
  got=$?
  if [ "$got" != "$want" ]; then
    echo "FAIL: $what: exit $got, expected $want"; cat /tmp/gpu_launch_test.$$
    failures=$((failures + 1))
  else
    echo "ok: $what (exit $got)"
  fi
}
code=$((RANDOM % 60 + 3))
token="a b'$RANDOM\"c"

expect 77 "no driver library" -- TAGMEM_LIBCUDA=/nonexistent/libcuda.so.1 "$launch" sh -c 'exit 0'
expect 77 "a driver with no device" -- TAGMEM_LIBCUDA="$emu" TAGMEM_EMU_DEVICE_COUNT=0 \
  "$launch" sh -c 'exit 0'
expect "$code" "a driver with devices runs the test" -- TAGMEM_LIBCUDA="$emu" \
  TAGMEM_EMU_DEVICE_COUNT=2 "$launch" sh -c "exit $code"
expect 0 "arguments pass unchanged" -- TAGMEM_LIBCUDA="$emu" "$launch" sh -c '[ "$1" = "$2" ]' _ \
  "$token" "$token"
expect 1 "arguments pass unchanged (control)" -- TAGMEM_LIBCUDA="$emu" "$launch" sh -c \
  '[ "$1" = "$2" ]' _ "$token" "${token}x"
# The launcher execs the test, so the test's own status, 77 included, is what ctest sees: GPU tests
# must not exit with 77 themselves (GoogleTest and pytest never do).
expect 77 "the test's own status is passed through" -- TAGMEM_LIBCUDA="$emu" "$launch" \
  sh -c 'exit 77'
expect 2 "no program" -- TAGMEM_LIBCUDA="$emu" "$launch"
rm -f /tmp/gpu_launch_test.$$
[ "$failures" = 0 ]
