// pause_steps.hpp — the steps of the NCCL pause, in the order collective.cpp runs them: wait for
// the devices to be idle, match the shared buffers, decide which are released, back up the bytes
// of those created here, detach (or put back, when a rank failed) and count. Each works on the
// records (and count_* on the counts in collective_state.hpp) with the record table's mutex
// held; the protocol and its Notes are in collective.cpp.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "api/runtime.hpp"
#include "collective_state.hpp"
#include "record_moves.hpp"

namespace tagmem::nccl::detail {

// Step 1: waits for every device with a record to be idle, each wait bounded (bounded_wait.hpp).
void synchronize_devices(const runtime::hold& rt, int timeout_ms);

// Step 2: exporters mail their fd duplicates; importers compare.
void match(group_session& s);

// Step 3: importers claim what they map; exporters decide; importers follow. Returns the ids
// of the records this process releases. An owner serves only the processes it exported to, an
// importer only the process it imported from; any other claim fails the pause on every rank,
// naming both sides, before anything is copied or released.
std::set<std::uint64_t> decide(group_session& s);

// Step 4: copies the bytes of the local records in `release` to pinned host memory.
void back_up(const runtime::hold& rt, const std::set<std::uint64_t>& release, int timeout_ms);
// Gives back the backups of the records in `release` that are resident.
void forget_backups(const std::set<std::uint64_t>& release);

// Step 5, first phase (Note [two-phase release]): detaches every record in `release`, in
// `off`. Stops at the first failure (that record is as it was).
void detach_all(const runtime::hold& rt, const std::set<std::uint64_t>& release,
                std::vector<detached>& off);

// Maps every detached record back. One that cannot be is released instead (it keeps its
// backup); returns false then, with the reasons in `failures`.
bool put_back(const runtime::hold& rt, std::vector<detached>& off, std::string& failures);

// The last pause's released bytes, by origin.
void count_released(const std::set<std::uint64_t>& release);
// The records still resident: what the last pause kept.
void count_kept();

}  // namespace tagmem::nccl::detail
