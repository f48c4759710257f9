// log_stamp.hpp — what starts every TAGMEM_LOG line: the time, the process and its rank.
//
// The format is `tagmem: <UTC time, ms> pid=<pid> [rank=<rank>] <event> key=value ...`
// (docs/observe.md): lines of several processes (the ranks of a job) merged into one file can be
// told apart and put in order.
#pragma once

#include <string>

namespace tagmem {

// "2026-12-02T13:40:01.123Z pid=1234 rank=0": the rank set (set_log_rank), else the launcher's
// LOCAL_RANK when it is a number, else none.
std::string log_stamp();

// This process's rank, shown on every line from now on (-1: none). Set by the layer that learns
// it: peers/, when an NCCL pause or resume names this process's rank in its group. Lock-free.
void set_log_rank(int rank) noexcept;

}  // namespace tagmem
