// step_log.cpp — the log line and span of an NCCL pause or resume (see step_log.hpp).
#include "step_log.hpp"

#include <string>

#include "api/runtime.hpp"
#include "collective.hpp"

namespace tagmem::nccl {

void logged_step(step which, const char* group, int rank, const std::function<void()>& body) {
  const bool resuming = which == step::resume;
  const char* event = resuming ? "nccl_resume" : "nccl_pause";
  if (!logging(log_level::info) && !trace::on()) return body();
  trace::span span(event);
  const double start = trace::now_us();
  std::string error;
  try {
    body();
  } catch (const std::exception& e) {
    error = e.what();
    if (!logging(log_level::info)) throw;
    log_line(std::string(event) + " FAILED group=" + (group ? group : "(default)") +
             " rank=" + std::to_string(rank) + " ms=" + format_ms((trace::now_us() - start) / 1e3) +
             " error=\"" + error + "\"");
    throw;
  }
  if (!logging(log_level::info)) return;
  const double ms = (trace::now_us() - start) / 1e3;
  const tagmem_nccl_stats s = stats();
  const std::size_t moved = resuming ? s.resident_bytes : s.last_released_bytes;
  log_line(std::string(event) + " group=" + (group ? group : "(default)") +
           " rank=" + std::to_string(rank) + (resuming ? " resident_bytes=" : " released_bytes=") +
           std::to_string(moved) + " kept_bytes=" + std::to_string(s.last_kept_bytes) +
           " ms=" + format_ms(ms) + " GBps=" + format_gbps(double(moved), ms) +
           " host_backup=" + std::to_string(s.backup_bytes));
}

}  // namespace tagmem::nccl
