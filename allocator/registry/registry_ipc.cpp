// registry_ipc.cpp — the registry's part of tagged-memory IPC (Note [ipc] in
// handoff/ipc_server.hpp): exports, imports, and offloads refused while imported.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "base/error.hpp"
#include "device/address_index.hpp"
#include "observe/log.hpp"
#include "peers/job_identity.hpp"
#include "peers/private_dir.hpp"
#include "registry/registry.hpp"

namespace tagmem {
namespace {

struct meeting {
  std::string job, dir;
};

// Whether `i` maps any of [ptr, ptr + size).
bool maps(const handoff::ipc_importer& i, std::uint64_t ptr, std::size_t size) {
  return i.ptr < ptr + size && ptr < i.ptr + i.bytes;
}

// Note [ipc without a job]: a plain `python train.py` handing tensors to its
// torch.multiprocessing children sets no job identity, and legacy CUDA IPC needs none, so tagged
// IPC works without one: the job is then "" and the exporter compares jobs only where both sides
// have one (ipc_server::serve_open). What authorises an opener without a job is what authorises
// any opener: the same uid, a pid the kernel reports and whose start time matches, and the
// handle's random 128-bit secret. A job, where both have one, only narrows that. The socket still
// lives in the user's private directory (peers/private_dir.hpp), which children inherit.
// Handoff keeps requiring a job: it hands memory to whoever asks, with no secret to hold.
meeting ipc_meeting() {
  try {
    std::string job;
    if (peers::has_job_identity()) job = peers::job_identity("CUDA IPC of tagged memory");
    return {job, peers::private_dir()};
  } catch (const error& e) {
    fail(TAGMEM_ERROR_INVALID_ARGUMENT, std::string("tagged-memory IPC: ") + e.what());
  }
}

}  // namespace

handoff::ipc_handle registry::ipc_export(std::uint64_t ptr, std::uint64_t bytes) {
  tag& t = tag_of_range(ptr, bytes);
  handoff::gpu_uuid uuid{};
  std::uint64_t granularity = 0;
  {
    std::lock_guard lock(t.mutex());
    const block* b = t.pool().find_containing(ptr);
    TAGMEM_EXPECTS(b, TAGMEM_ERROR_UNKNOWN_POINTER,
                   "tagmem_ipc_export: address " + std::to_string(ptr) + " in tag '" + t.name() +
                       "' is not inside a live allocation");
    TAGMEM_EXPECTS(bytes <= b->size - (ptr - b->ptr), TAGMEM_ERROR_INVALID_ARGUMENT,
                   "tagmem_ipc_export: the range of " + std::to_string(bytes) +
                       " bytes runs past its allocation in tag '" + t.name() + "'");
    TAGMEM_EXPECTS(t.dev().exports_handles(), TAGMEM_ERROR_INVALID_ARGUMENT,
                   "tagmem_ipc_export: device " + std::to_string(t.dev().ordinal()) +
                       " makes no exportable memory (TAGMEM_IPC=off, or no POSIX-fd handles)");
    std::memcpy(uuid.data(), t.dev().uuid().bytes, uuid.size());
    granularity = t.dev().granularity();
  }
  std::lock_guard lock(ipc_mutex_);
  if (!ipc_server_) {
    const meeting m = ipc_meeting();
    ipc_server_ =
        std::make_unique<handoff::ipc_server>(ipc_source_, m.job, m.dir, cfg_.handoff_timeout_ms);
    exporter_.store(ipc_server_.get(), std::memory_order_release);
  }
  return ipc_server_->add(ptr, bytes, uuid, granularity);
}

void registry::ipc_unexport(const handoff::ipc_handle& h) {
  std::lock_guard lock(ipc_mutex_);
  TAGMEM_EXPECTS(h.owner.same_as(peers::identity_of(::getpid())), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "tagmem_ipc_unexport: the handle was exported by " + h.owner.describe() +
                     ", not by this process");
  TAGMEM_EXPECTS(ipc_server_ && ipc_server_->remove(h.id, h.secret), TAGMEM_ERROR_UNKNOWN_POINTER,
                 "tagmem_ipc_unexport: no such export (unexported already, or its memory freed)");
}

const handoff::ipc_import& registry::ipc_open(const handoff::ipc_handle& h) {
  TAGMEM_EXPECTS(h.owner.pid != ::getpid(), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "tagmem_ipc_open: the handle was exported by this process; use the memory as it "
                 "is");
  const meeting m = ipc_meeting();
  // Not under ipc_mutex_: the wait for the exporter is bounded but may be long.
  auto import = std::make_unique<handoff::ipc_import>(h, m.job, m.dir, cfg_.handoff_timeout_ms);
  std::lock_guard lock(ipc_mutex_);
  imports_.push_back(std::move(import));
  return *imports_.back();
}

void registry::ipc_close(std::uint64_t ptr) {
  std::unique_ptr<handoff::ipc_import> gone;
  {
    std::lock_guard lock(ipc_mutex_);
    auto it = std::find_if(imports_.begin(), imports_.end(),
                           [&](const auto& i) { return i->ptr() == ptr; });
    TAGMEM_EXPECTS(it != imports_.end(), TAGMEM_ERROR_UNKNOWN_POINTER,
                   "tagmem_ipc_close: " + std::to_string(ptr) +
                       " is not an address tagmem_ipc_open returned (or it was closed)");
    gone = std::move(*it);
    imports_.erase(it);
  }
  gone.reset();  // unmaps outside the lock
}

// Note [free while imported]: another process that opened an export maps the exporter's physical
// memory, and keeps doing so after the exporter frees the allocation (its import holds its own
// reference). Cached at once, the freed block would be the next allocation of its size, whose
// owner and the importer would then read and write the same bytes unknowingly. So the free holds
// it instead: the caller sees it freed (the totals, a second free is UNKNOWN_POINTER, its stream
// ordering recorded now), but the pool neither caches nor merges it, nor releases its segment,
// until no live import maps any of it; the IPC server's thread then gives it back
// (ipc_imports_ended). PyTorch's CUDA IPC keeps a sent block from reuse until its receivers let
// go the same way. Lock order: the tag's lock, then ipc_mutex_, then the server's; the release
// takes the tag's lock only after letting go of ipc_mutex_.
bool registry::ipc_hold_if_imported(tag& t, std::uint64_t ptr, std::size_t size, CUstream stream) {
  // Every free asks: without a live import (nearly always) it costs two atomic loads, not the lock
  // and a copy of the importers.
  const handoff::ipc_server* exporter = exporter_.load(std::memory_order_acquire);
  if (!exporter || !exporter->any_importer()) return false;
  std::string by;  // the processes that keep it, for the log line
  {
    std::lock_guard lock(ipc_mutex_);
    if (!ipc_server_) return false;
    const std::vector<handoff::ipc_importer> live = ipc_server_->importers();
    if (std::none_of(live.begin(), live.end(), [&](const auto& i) { return maps(i, ptr, size); })) {
      return false;
    }
    if (logging(log_level::info)) {
      std::vector<pid_t> pids;
      for (const handoff::ipc_importer& i : live) {
        if (maps(i, ptr, size) && std::find(pids.begin(), pids.end(), i.who.pid) == pids.end()) {
          pids.push_back(i.who.pid);
          by += (by.empty() ? "" : ",") + std::to_string(i.who.pid);
        }
      }
    }
    held_.reserve(held_.size() + 1);  // may throw: nothing changed yet
    if (!t.pool().hold(ptr, stream)) return false;
    held_.push_back({&t, ptr, size, std::chrono::steady_clock::now()});
  }
  // A hold has no time limit (the importer's mapping must stay valid), so the line names who
  // keeps the memory out of the pool; its end is logged too, with how long it lasted.
  if (logging(log_level::info)) {
    try {
      log_line("ipc held-after-free tag=" + std::string(t.name()) + " ptr=" + format_address(ptr) +
               " bytes=" + std::to_string(size) + " by_pids=" + by);
    } catch (...) {  // no memory for the line: the free has happened all the same
    }
  }
  return true;
}

void registry::ipc_imports_ended(const std::vector<handoff::ipc_importer>& live) noexcept {
  std::vector<held_free> ready;
  {
    std::lock_guard lock(ipc_mutex_);
    for (std::size_t k = held_.size(); k-- > 0;) {
      const held_free h = held_[k];
      if (std::any_of(live.begin(), live.end(),
                      [&](const auto& i) { return maps(i, h.ptr, h.size); })) {
        continue;
      }
      try {
        ready.push_back(h);
      } catch (...) {  // no memory: it stays held until the next import ends
        continue;
      }
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (const held_free& h : ready) {
    {
      std::lock_guard lock(h.owner->mutex());
      h.owner->pool().release_held(h.ptr);
    }
    if (logging(log_level::info)) {
      const double ms = std::chrono::duration<double, std::milli>(now - h.since).count();
      try {
        log_line("ipc held-returned ptr=" + format_address(h.ptr) +
                 " bytes=" + std::to_string(h.size) + " held_ms=" + format_ms(ms));
      } catch (...) {  // no memory for the line: the block is back all the same
      }
    }
  }
}

void registry::ipc_forget(std::uint64_t base, std::uint64_t size) noexcept {
  std::lock_guard lock(ipc_mutex_);
  if (ipc_server_) ipc_server_->forget_within(base, size);
}

handoff::ipc_server_counters registry::ipc_counters() {
  std::lock_guard lock(ipc_mutex_);
  return ipc_server_ ? ipc_server_->counters() : handoff::ipc_server_counters{};
}

registry::held_totals registry::ipc_held() {
  std::lock_guard lock(ipc_mutex_);
  held_totals t;
  for (const held_free& h : held_) {
    ++t.allocations;
    t.bytes += h.size;
  }
  return t;
}

std::size_t registry::ipc_open_here() {
  std::lock_guard lock(ipc_mutex_);
  return imports_.size();
}

void registry::refuse_if_imported(const meta_vector<tag*>& tags, const char* operation) {
  nccl_holds_.refuse(tags, operation);
  std::vector<handoff::ipc_importer> live;
  {
    std::lock_guard lock(ipc_mutex_);
    if (!ipc_server_) return;
    live = ipc_server_->importers();
  }
  for (const handoff::ipc_importer& i : live) {
    tag* t = global_address_index().find(i.ptr);
    if (std::find(tags.begin(), tags.end(), t) == tags.end()) continue;
    fail(TAGMEM_ERROR_PEER, std::string("tag '") + t->name() + "' cannot be " + operation + ": " +
                                i.who.describe() + " maps " + std::to_string(i.bytes) +
                                " bytes of it (tagmem_ipc_open); it closes them first");
  }
}

}  // namespace tagmem
