// phase_report.cpp — the log line and trace of one phase switch (see phase_report.hpp).
#include "offload/phase_report.hpp"

#include <optional>
#include <string>
#include <vector>

#include "driver/driver.hpp"
#include "observe/log.hpp"
#include "observe/trace.hpp"
#include "transfer/copy_clock.hpp"

namespace tagmem {
namespace {

const char* kind_of(std::size_t outs, std::size_t ins) {
  if (outs && ins) return "swap";
  return outs ? "offload" : "reload";
}

std::uint64_t moved(const tag& t) {
  auto& c = const_cast<tag&>(t).counters();
  return c.bytes_offloaded + c.bytes_reloaded;
}

std::size_t mapped(tag& t) { return t.arena().mapped_bytes(); }

const char* state_name(const tag& t) {
  switch (t.state()) {
    case TAGMEM_RESIDENT:
      return "resident";
    case TAGMEM_OFFLOADED_BACKUP:
      return "offloaded_backup";
    default:
      return "offloaded_discard";
  }
}

}  // namespace

struct phase_report::impl {
  device& dev;
  host_store& store;
  const char* kind;
  tagmem_offload_mode mode;
  std::vector<tag*> outs, ins;
  std::vector<std::size_t> mapped_before;  // outs then ins
  std::uint64_t moved_before = 0;
  double start_us = trace::now_us();
  std::optional<trace::span> whole;
  std::optional<trace::copy_clock> clock;
  std::string error;

  impl(device& d, host_store& s, const char* k, tagmem_offload_mode m)
      : dev(d), store(s), kind(k), mode(m) {}

  std::vector<tag*> all() const {
    std::vector<tag*> a(outs);
    a.insert(a.end(), ins.begin(), ins.end());
    return a;
  }
  std::string line() const;
};

phase_report::phase_report(device& dev, tag* const* outs, std::size_t out_count,
                           tagmem_offload_mode mode, tag* const* ins, std::size_t in_count,
                           host_store& store) noexcept {
  if (!logging(log_level::info) && !trace::on()) return;
  try {
    impl_ = std::make_unique<impl>(dev, store, kind_of(out_count, in_count), mode);
    impl_->outs.assign(outs, outs + out_count);
    impl_->ins.assign(ins, ins + in_count);
    for (tag* t : impl_->all()) {
      impl_->mapped_before.push_back(mapped(*t));
      impl_->moved_before += moved(*t);
      trace::set_mapped(t->name(), mapped(*t));
    }
    impl_->whole.emplace(impl_->kind);
    // Its own span: the record waits while the driver is busy (a release running, say).
    trace::span start("trace clock");
    impl_->clock.emplace(dev.context(), dev.d2h_stream(0));
  } catch (...) {  // no memory to observe: the switch runs unobserved
    impl_.reset();
  }
}

void phase_report::failed(const std::exception& e) noexcept {
  if (!impl_) return;
  try {
    impl_->error = e.what();
  } catch (...) {
  }
}

std::string phase_report::impl::line() const {
  const double ms = (trace::now_us() - start_us) / 1e3;
  std::size_t out_bytes = 0, in_bytes = 0;
  std::uint64_t moved_after = 0;
  std::string out_names, in_names;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    out_bytes += mapped_before[i] - std::min(mapped_before[i], mapped(*outs[i]));
    out_names += (i ? "," : "") + std::string(outs[i]->name());
    moved_after += moved(*outs[i]);
  }
  for (std::size_t i = 0; i < ins.size(); ++i) {
    const std::size_t before = mapped_before[outs.size() + i];
    in_bytes += mapped(*ins[i]) - std::min(before, mapped(*ins[i]));
    in_names += (i ? "," : "") + std::string(ins[i]->name());
    moved_after += moved(*ins[i]);
  }
  const std::uint64_t copied = moved_after - moved_before;
  std::string l = std::string(kind) + (error.empty() ? "" : " FAILED") +
                  " device=" + std::to_string(dev.ordinal());
  if (!outs.empty()) {
    l += std::string(" mode=") + (mode == TAGMEM_BACKUP ? "backup" : "discard") +
         " out=" + out_names + " out_bytes=" + std::to_string(out_bytes);
  }
  if (!ins.empty()) l += " in=" + in_names + " in_bytes=" + std::to_string(in_bytes);
  l += " copied_bytes=" + std::to_string(copied) + " ms=" + format_ms(ms) +
       " GBps=" + format_gbps(double(copied), ms);
  std::size_t free_bytes = 0, total_bytes = 0;
  try {
    dev.memory_info(&free_bytes, &total_bytes);
    l += " device_free=" + std::to_string(free_bytes);
  } catch (...) {
    l += " device_free=unknown";
  }
  const host_store_stats hs = store.stats();
  l += " release_pending=" + std::to_string(dev.releases().pending_bytes()) +
       " host_pinned=" + std::to_string(hs.pinned_bytes) +
       " host_used=" + std::to_string(hs.used_bytes);
  if (!error.empty()) {
    l += " states=";
    bool first = true;
    for (tag* t : all()) {
      l += (first ? "" : ",") + std::string(t->name()) + ":" + state_name(*t);
      first = false;
    }
    l += " error=\"" + error + "\"";
  }
  return l;
}

phase_report::~phase_report() {
  if (!impl_) return;
  impl_->clock.reset();  // the copies' spans, before the switch's own ends
  try {
    for (tag* t : impl_->all()) trace::set_mapped(t->name(), mapped(*t));
    if (trace::on()) {
      const host_store_stats hs = impl_->store.stats();
      trace::counter("host_pinned_bytes", hs.pinned_bytes);
      trace::counter("host_used_bytes", hs.used_bytes);
      std::size_t free_bytes = 0, total_bytes = 0;
      impl_->dev.memory_info(&free_bytes, &total_bytes);
      trace::counter("device_free_bytes " + std::to_string(impl_->dev.ordinal()), free_bytes);
    }
    if (logging(log_level::info)) log_line(impl_->line());
  } catch (...) {  // a report that cannot be made is skipped; the switch's outcome stands
  }
  impl_->whole.reset();
}

}  // namespace tagmem
