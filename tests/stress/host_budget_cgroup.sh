#!/usr/bin/env bash
# Runs tagmem_host_budget_probe (host_budget_probe.c) inside a fresh memory cgroup of <limit MiB>
# without swap. Needs root and a writable memory controller: cgroup v2 (the memory controller
# enabled for the children of the cgroup this script runs in) or cgroup v1 (a writable memory
# hierarchy). Where neither is there it says so and exits 77 (ctest: skipped).
#
#   bash tests/stress/host_budget_cgroup.sh <probe> <limit MiB> <MiB> <small MiB>
#     a <MiB> tag and its pinned backup cannot both fit: the probe must end with
#     HOST_OUT_OF_MEMORY and the tag intact (exit status 0), never be killed by the kernel's
#     out-of-memory killer.
#   bash tests/stress/host_budget_cgroup.sh <probe> <limit MiB> <MiB> fits <cache MiB>
#     first fills the cgroup with <cache MiB> of active file cache (a file on disk, read twice,
#     as a checkpoint loaded twice is): tag and backup fit once the kernel reclaims it, so the
#     offload must succeed and reload intact.
set -uo pipefail
probe=${1:?usage: host_budget_cgroup.sh <probe> <limit MiB> <MiB> <small MiB> | fits <cache MiB>}
limit_mib=${2:?limit MiB}
mib=${3:?MiB}
small_mib=${4:?small MiB}
cache_mib=0
if [[ $small_mib == fits ]]; then cache_mib=${5:?cache MiB}; fi
name="tagmem-host-budget-$$"

# Where a cgroup hierarchy is mounted: the mount point of the first mount whose filesystem type
# is $1 and, for cgroup v1, whose super options name the controller $2.
mount_of() {
  awk -v type="$1" -v want="$2" '{
    for (i = 7; $i != "-"; ++i) {}
    if ($(i + 1) != type) next
    if (want != "" && $(i + 3) !~ "(^|,)" want "(,|$)") next
    print $5; exit }' /proc/self/mountinfo
}

dir=""
v2_root=$(mount_of cgroup2 "")
v2_path=$(sed -n 's/^0:://p' /proc/self/cgroup)
v1_root=$(mount_of cgroup memory)
v1_path=$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}://p' /proc/self/cgroup)
if [[ -n $v2_root && -n $v2_path ]] &&
  grep -qw memory "$v2_root${v2_path%/}/cgroup.subtree_control" 2>/dev/null; then
  dir="$v2_root${v2_path%/}/$name"
  version=2
elif [[ -n $v1_root && -w $v1_root ]]; then
  parent="$v1_root${v1_path%/}"
  [[ -d $parent ]] || parent=$v1_root
  dir="$parent/$name"
  version=1
fi
if [[ -z $dir ]] || ! mkdir "$dir" 2>/dev/null; then
  echo "host_budget_cgroup: SKIPPED: no writable memory cgroup here (needs root and cgroup v2" \
    "with the memory controller delegated, or a writable cgroup v1 memory hierarchy)"
  exit 77
fi
cache_dir=""
cleanup() {
  [[ -n $cache_dir ]] && rm -rf "$cache_dir"
  rmdir "$dir" 2>/dev/null
}
trap cleanup EXIT

limit=$((limit_mib << 20))
if ((version == 2)); then
  echo "$limit" >"$dir/memory.max" || exit 2
  [[ -e $dir/memory.swap.max ]] && echo 0 >"$dir/memory.swap.max"
else
  echo "$limit" >"$dir/memory.limit_in_bytes" || exit 2
  [[ -e $dir/memory.memsw.limit_in_bytes ]] && echo "$limit" >"$dir/memory.memsw.limit_in_bytes"
fi
echo "host_budget_cgroup: cgroup v$version $dir, limit $limit_mib MiB, a $mib MiB BACKUP offload"

if ((cache_mib > 0)); then
  # Page cache is charged to the cgroup of the process that reads it: a shell in the cgroup
  # writes the file (on disk, not tmpfs: the current directory, ctest's build tree) and reads it
  # twice, which puts its pages on the active list.
  cache_dir=$(mktemp -d -p "$PWD" tagmem-cache.XXXXXX) || exit 2
  timeout 300 bash -c 'echo $$ >"$1/cgroup.procs" &&
    dd if=/dev/urandom of="$2/cache" bs=1M count="$3" conv=fsync status=none &&
    cat "$2/cache" >/dev/null && cat "$2/cache" >/dev/null' _ "$dir" "$cache_dir" "$cache_mib" ||
    exit 2
  stat_file=$dir/memory.stat
  if ((version == 2)); then keys="active_file|inactive_file"; else keys="total_active_file|total_inactive_file"; fi
  echo "host_budget_cgroup: after reading $cache_mib MiB twice:" \
    "$(grep -E "^($keys) " "$stat_file" | awk '{printf "%s %d MiB ", $1, $2 / 1048576}')"
fi

# The probe runs in a child shell that first moves itself into the cgroup.
timeout 300 bash -c 'echo $$ >"$1/cgroup.procs" && exec "${@:2}"' _ "$dir" \
  "$probe" "$mib" "$small_mib"
rc=$?
if ((cache_mib > 0)); then
  case $rc in
    0) echo "host_budget_cgroup: the offload took the memory the kernel reclaimed from the cache, reloaded intact: pass" ;;
    1) echo "host_budget_cgroup: FAIL: HOST_OUT_OF_MEMORY though the cache was reclaimable" ;;
    137) echo "host_budget_cgroup: FAIL: killed by SIGKILL (the kernel's out-of-memory killer)" ;;
    *) echo "host_budget_cgroup: FAIL: exit status $rc" ;;
  esac
  ((rc == 0))
  exit
fi
case $rc in
  0) echo "host_budget_cgroup: HOST_OUT_OF_MEMORY, the tag intact, a later offload fine: pass" ;;
  1) echo "host_budget_cgroup: FAIL: the offload succeeded beyond the cgroup's memory" ;;
  124) echo "host_budget_cgroup: FAIL: still running after 300 s" ;;
  137) echo "host_budget_cgroup: FAIL: killed by SIGKILL (the kernel's out-of-memory killer)" ;;
  *) echo "host_budget_cgroup: FAIL: exit status $rc" ;;
esac
((rc == 0))
