#!/usr/bin/env bash
# Runs tagmem_exit_probe (exit_probe.c) <runs> times in each mode and fails if any run exits
# non-zero, dies of a signal or hangs: a process that returns from main without tagmem_shutdown
# while the release or pinning thread is inside the driver must still leave cleanly.
#
#   bash tests/stress/exit_probe.sh <tagmem_exit_probe> <runs> <MiB>
set -uo pipefail
probe=${1:?usage: exit_probe.sh <tagmem_exit_probe> <runs> <MiB>}
runs=${2:?runs}
mib=${3:?MiB}
failed=0
for mode in discard swap reserve; do
  bad=0
  for ((i = 1; i <= runs; ++i)); do
    timeout 60 "$probe" "$mode" "$mib"
    rc=$?
    if ((rc != 0)); then
      why="exit status $rc"
      ((rc == 124)) && why="still running after 60 s"
      ((rc > 128)) && why="$why (signal $((rc - 128)))"
      echo "exit_probe $mode $mib MiB, run $i: $why"
      bad=$((bad + 1))
    fi
  done
  echo "exit_probe $mode, $mib MiB: $((runs - bad)) of $runs runs left cleanly"
  ((bad == 0)) || failed=1
done
exit $failed
