// log.hpp — TAGMEM_LOG: one line on stderr per phase switch, NCCL pause/resume and failure.
//
// The level is read from the environment once, when first asked for (tagmem_init asks, so does
// the driver's loader): off (the default), info, debug. Checking it is one relaxed load, so the
// hooks cost one branch when logging is off. Each line is written with a single write(2) so that
// lines from several threads never interleave. The format is `tagmem: <event> key=value ...`,
// described in docs/observe.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace tagmem {

enum class log_level : int { off = 0, info = 1, debug = 2 };

// The level in effect (reads TAGMEM_LOG on the first call; an invalid value counts as off here,
// tagmem_init refuses it with INVALID_ARGUMENT).
log_level current_log_level() noexcept;

inline bool logging(log_level at) noexcept { return current_log_level() >= at; }

// Writes "tagmem: " + `line` + "\n" to stderr (or to the test sink). Never throws.
void log_line(const std::string& line) noexcept;

// Reads TAGMEM_LOG and TAGMEM_TRACE again (when tagmem initialises).
void configure_observation() noexcept;

// Tests: sends lines to `sink` instead of stderr (empty: stderr again).
void set_log_sink_for_testing(std::function<void(const std::string&)> sink);

// Formatting shared by the log and the trace.
std::string format_ms(double ms);                   // "12.345"
std::string format_gbps(double bytes, double ms);   // "10.44", "0" when ms is 0
std::string format_address(std::uint64_t address);  // "0x7f3a00000000"

}  // namespace tagmem
