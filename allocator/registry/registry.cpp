// registry.cpp — devices, tags and the operations that span tags (see registry.hpp).
#include "registry/registry.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "disk/disk_tier.hpp"
#include "driver/driver.hpp"
#include "observe/log.hpp"
#include "offload/offload_engine.hpp"
#include "options/options.hpp"
#include "peers/job_identity.hpp"
#include "peers/private_dir.hpp"
#include "replica/replica_tier.hpp"
#include "replica/replication.hpp"
#include "replica/solo_offload.hpp"
#include "tags/external_tag.hpp"

namespace tagmem {

void check_tag_name(const char* name) {
  TAGMEM_EXPECTS(name != nullptr, TAGMEM_ERROR_INVALID_ARGUMENT, "tag name is NULL");
  std::size_t n = strnlen(name, TAGMEM_MAX_TAG_NAME + 1);
  TAGMEM_EXPECTS(n > 0, TAGMEM_ERROR_INVALID_ARGUMENT, "tag name is empty");
  TAGMEM_EXPECTS(n <= TAGMEM_MAX_TAG_NAME, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "tag name is longer than " + std::to_string(TAGMEM_MAX_TAG_NAME) + " bytes");
  for (std::size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    TAGMEM_EXPECTS(c > ' ' && c < 0x7f, TAGMEM_ERROR_INVALID_ARGUMENT,
                   "tag name may hold only printable ASCII without spaces");
  }
}

registry::registry(const config& cfg) : cfg_(cfg), disk_dir_(option_text(option::DISK_DIR)) {
  configure_observation();  // TAGMEM_LOG, TAGMEM_TRACE
  set_metadata_allocator(cfg_.metadata);
  driver::load();
  TAGMEM_CU(cuDeviceGetCount, &device_count_);
  TAGMEM_EXPECTS(device_count_ > 0, TAGMEM_ERROR_DRIVER,
                 "the CUDA driver '" + driver::library_path() + "' reports no device");
  for (int i = 0; i < device_count_; ++i) slots_.push_back(std::make_unique<device_slot>());
  if (cfg_.handoff) {  // opting in never silently does nothing
    try {
      handoff_job_ = peers::job_identity("handoff between processes (TAGMEM_HANDOFF=on)");
      handoff_dir_ = peers::private_dir();
    } catch (const error& e) {
      fail(TAGMEM_ERROR_INVALID_ARGUMENT, std::string("TAGMEM_HANDOFF=on: ") + e.what());
    }
  }
  if (cfg_.offload_return_queued) early_ = std::make_unique<early_offloads>();
  share_waits_ = std::make_unique<early_offloads>();
  if (cfg_.handoff && cfg_.handoff_map_ahead) ahead_ = std::make_unique<early_offloads>();
  if (cfg_.pin_ahead) {
    pinner_ = std::make_unique<background_pinning>([this]() -> host_store& { return store(); },
                                                   [this] { return planned_backup_bytes(); });
  }
}

registry::~registry() {
  early_.reset();  // waits for the offloads that returned early: they use everything below
  ahead_stop_ = true;
  ahead_.reset();  // it maps into the tags
  share_waits_stop_ = true;
  share_waits_.reset();
  exporter_.store(nullptr);
  ipc_server_.reset();  // it reads the tags
  imports_.clear();     // unmapped here; the exporters see their imports end
  pinner_.reset();      // it walks the tags and pins into the store
  store_.reset();       // host memory first: it is registered with device 0's context
  for (auto& s : slots_) {
    for (auto& [name, t] : s->tags) delete t;
    s->tags.clear();
    if (s->handoff) {  // before the device: it uses the device's release queue
      s->dev->set_peers(nullptr);
      s->handoff.reset();
    }
    s->dev.reset();
  }
}

registry::device_slot& registry::slot(int ordinal) {
  TAGMEM_EXPECTS(ordinal >= 0 && ordinal < device_count_, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "device " + std::to_string(ordinal) + " does not exist (" +
                     std::to_string(device_count_) + " devices)");
  return *slots_[ordinal];
}

int registry::resolve_device(int ordinal) {
  if (ordinal == TAGMEM_CURRENT_DEVICE) {
    CUcontext ctx = nullptr;
    TAGMEM_CU(cuCtxGetCurrent, &ctx);
    if (!ctx) return 0;
    CUdevice d = 0;
    TAGMEM_CU(cuCtxGetDevice, &d, nullptr);  // the current context
    return static_cast<int>(d);
  }
  slot(ordinal);
  return ordinal;
}

device& registry::dev(int ordinal) {
  device_slot& s = slot(ordinal);
  // A constructor that throws leaves the flag unset: the next call tries again.
  std::call_once(s.created, [&] {
    auto d = std::make_unique<device>(ordinal, cfg_);
    if (cfg_.handoff && d->exports_handles()) {
      s.handoff = std::make_unique<handoff::service>(*d, cfg_, handoff_job_, handoff_dir_);
      d->set_peers(s.handoff.get());
      if (cfg_.handoff_map_ahead) start_mapping_ahead(ordinal, *d, *s.handoff);
    }
    s.dev = std::move(d);
  });
  return *s.dev;
}

handoff::service* registry::handoff(int ordinal) {
  dev(ordinal);
  return slot(ordinal).handoff.get();
}

void registry::attach_handoff_for_test(int ordinal, int fd, bool giver) {
  handoff::service* h = handoff(ordinal);
  TAGMEM_EXPECTS(h, TAGMEM_ERROR_INVALID_ARGUMENT, "handoff is off (TAGMEM_HANDOFF)");
  h->attach_for_test(fd, giver);
}

void registry::note_offloaded(int ordinal) noexcept {
  handoff::service* h = slot(ordinal).handoff.get();
  if (!h) return;
  std::size_t bytes = 0, largest = 0;
  for (tag* t : tags(ordinal)) {
    std::lock_guard lock(t->mutex());
    if (!t->offloaded()) continue;
    const vm_arena::offloaded_extent o = t->arena().offloaded();
    // What is parked (Note [mapped ahead], Note [parked mappings]) its reload takes back.
    bytes +=
        o.bytes - std::min(o.bytes, t->dev().recycler().parked_bytes_at(t->arena().mappings()));
    largest = std::max(largest, o.largest_span);
  }
  h->offloaded(bytes, largest);
}

namespace {

// Tells the device's handoff what is offloaded once an operation is over and its tags unlocked.
template <class Note>
struct after_operation {
  Note note;
  ~after_operation() { note(); }
};
template <class Note>
after_operation(Note) -> after_operation<Note>;

}  // namespace

std::size_t registry::planned_backup_bytes() {
  std::size_t planned = 0;
  for (int d = 0; d < device_count(); ++d) {
    for (tag* t : tags(d)) {
      std::lock_guard lock(t->mutex());
      if (t->pins_ahead() && !t->offloaded()) planned += t->arena().mapped_bytes();
    }
  }
  return planned;
}

host_store& registry::store(int ordinal) {
  if (host_store* existing = existing_store()) return *existing;
  // Note [the host store's context]: pinned slabs are PORTABLE, so any context will do to pin
  // them; the store takes that of the device that first needs it (else the current one), never
  // device 0 by default: a rank that uses only GPU k must not hold a context on GPU 0.
  device& d = dev(ordinal == TAGMEM_CURRENT_DEVICE ? resolve_device(ordinal) : ordinal);
  std::lock_guard lock(devices_mutex_);
  if (!store_) {
    store_ = std::make_unique<host_store>(cfg_.host_slab_bytes, d.context(), cfg_.host_max_bytes);
  }
  return *store_;
}

host_store* registry::existing_store() noexcept {
  std::lock_guard lock(devices_mutex_);
  return store_.get();
}

tag* registry::find(int ordinal, const char* name) {
  // Every allocation comes through here: a name already in the map was checked when it was
  // added, so only a miss (and NULL, before looking) is checked.
  if (name == nullptr) check_tag_name(name);
  device_slot& s = slot(ordinal);
  {
    std::shared_lock lock(s.tags_mutex);
    if (auto it = s.tags.find(name); it != s.tags.end()) return it->second;
  }
  check_tag_name(name);
  return nullptr;
}

tag& registry::get(int ordinal, const char* name) {
  tag* t = find(ordinal, name);
  TAGMEM_EXPECTS(t, TAGMEM_ERROR_UNKNOWN_TAG,
                 std::string("no tag '") + name + "' on device " + std::to_string(ordinal));
  return *t;
}

tag& registry::get_or_create(int ordinal, const char* name) {
  if (tag* t = find(ordinal, name)) return *t;
  if (const external_tag* x = find_external_tag(name)) refuse_external(*x, "allocating");
  device& d = dev(ordinal);
  device_slot& s = slot(ordinal);
  std::unique_lock lock(s.tags_mutex);
  auto [it, inserted] = s.tags.emplace(meta_string(name), nullptr);
  if (inserted) {
    try {
      it->second = new tag(d, cfg_, name);
    } catch (...) {
      s.tags.erase(it);
      throw;
    }
  }
  return *it->second;
}

meta_vector<tag*> registry::tags(int ordinal) {
  device_slot& s = slot(ordinal);
  std::shared_lock lock(s.tags_mutex);
  meta_vector<tag*> out;
  for (auto& [name, t] : s.tags) out.push_back(t);
  return out;
}

void registry::drop_spare_copies() {
  for (int i = 0; i < device_count_; ++i) {
    for (tag* t : tags(i)) {
      std::lock_guard lock(t->mutex());
      drop_spare_copy(*t);
    }
  }
}

void* registry::allocate(std::size_t size, const char* name, int ordinal, CUstream stream) {
  TAGMEM_EXPECTS(size > 0, TAGMEM_ERROR_INVALID_ARGUMENT, "allocation of 0 bytes");
  device& d = dev(ordinal);
  TAGMEM_EXPECTS(size <= d.total_bytes(), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "allocation of " + std::to_string(size) + " bytes is larger than device " +
                     std::to_string(ordinal) + " (" + std::to_string(d.total_bytes()) + " bytes)");
  tag& t = get_or_create(ordinal, name);
  for (int attempt = 0;; ++attempt) {
    try {
      std::lock_guard lock(t.mutex());
      TAGMEM_EXPECTS(
          !t.offloaded(), TAGMEM_ERROR_TAG_OFFLOADED,
          std::string("cannot allocate in tag '") + name + "': it is offloaded; reload it first");
      context_guard guard(d.context());
      block* b = t.pool().allocate(size, stream);
      t.counters().alloc_count++;
      t.note_peaks();
      return reinterpret_cast<void*>(b->ptr);
    } catch (const error& e) {
      // Out of device memory: give back every tag's cached memory once, then try again.
      if (e.code() != TAGMEM_ERROR_OUT_OF_MEMORY || attempt > 0) throw;
      if (empty_cache(ordinal) == 0) throw;
    }
  }
}

meta_vector<tag*> registry::lookup_unique(const char* const* names, std::size_t count, int ordinal,
                                          const char* operation) {
  TAGMEM_EXPECTS(names != nullptr || count == 0, TAGMEM_ERROR_INVALID_ARGUMENT, "tag list is NULL");
  meta_vector<tag*> out;
  for (std::size_t i = 0; i < count; ++i) {
    if (const external_tag* x = find_external_tag(names[i])) refuse_external(*x, operation);
    tag* t = &get(ordinal, names[i]);
    TAGMEM_EXPECTS(std::find(out.begin(), out.end(), t) == out.end(), TAGMEM_ERROR_INVALID_ARGUMENT,
                   std::string("tag '") + names[i] + "' is listed twice");
    out.push_back(t);
  }
  return out;
}

namespace {

// Locks several tags in ascending address order (the registry's lock order).
class multi_lock {
 public:
  explicit multi_lock(meta_vector<tag*> tags) : tags_(std::move(tags)) {
    std::sort(tags_.begin(), tags_.end());
    for (std::size_t i = 0; i < tags_.size(); ++i) {
      tags_[i]->mutex().lock();
      locked_ = i + 1;
    }
  }
  ~multi_lock() { unlock(); }
  void unlock() noexcept {
    for (std::size_t i = 0; i < locked_; ++i) tags_[i]->mutex().unlock();
    locked_ = 0;
  }

 private:
  meta_vector<tag*> tags_;
  std::size_t locked_ = 0;
};

}  // namespace

void registry::offload(const char* const* names, std::size_t count, int ordinal,
                       tagmem_offload_mode mode) {
  TAGMEM_EXPECTS(mode == TAGMEM_BACKUP || mode == TAGMEM_DISCARD || mode == TAGMEM_BACKUP_DISK,
                 TAGMEM_ERROR_INVALID_ARGUMENT,
                 "offload mode must be TAGMEM_BACKUP, TAGMEM_DISCARD or TAGMEM_BACKUP_DISK");
  meta_vector<tag*> list = lookup_unique(names, count, ordinal, "tagmem_offload");
  if (list.empty()) return;
  host_store& hs = store(ordinal);
  device& d = dev(ordinal);
  auto refuse_offloaded = [](tag* t) {
    TAGMEM_EXPECTS(!t->offloaded() || t->partial(), TAGMEM_ERROR_TAG_OFFLOADED,
                   std::string("tag '") + t->name() + "' is already offloaded");
    // A disk offload that stopped part way: its files hold what is unmapped (Note [disk tier]).
    TAGMEM_EXPECTS(!t->offloaded() || t->mode() != TAGMEM_BACKUP_DISK, TAGMEM_ERROR_TAG_OFFLOADED,
                   std::string("tag '") + t->name() +
                       "' is partly offloaded to disk; reload it before offloading it again");
  };
  if (mode == TAGMEM_BACKUP_DISK) {  // Note [disk tier]: written before the call returns
    after_operation noted{[&]() noexcept { note_offloaded(ordinal); }};
    multi_lock lock(list);
    for (tag* t : list) {
      refuse_offloaded(t);
      TAGMEM_EXPECTS(
          !t->offloaded(), TAGMEM_ERROR_TAG_OFFLOADED,
          std::string("tag '") + t->name() +
              "' is partly offloaded; finish with TAGMEM_BACKUP before TAGMEM_BACKUP_DISK");
    }
    refuse_if_imported(list, "offloaded");
    const disk_settings s = disk_settings_now();
    TAGMEM_EXPECTS(!s.dir.empty(), TAGMEM_ERROR_INVALID_ARGUMENT,
                   "TAGMEM_BACKUP_DISK needs a directory: set TAGMEM_DISK_DIR or call "
                   "tagmem_set_disk_dir()");
    offload_to_disk(d, list.data(), list.size(), hs, cfg_, s);
    return;
  }
  if (mode == TAGMEM_BACKUP) {  // Note [replicated offload]: with the tag's replicas, at once
    meta_vector<tag*> replicated;
    for (tag* t : list) {
      if (replication_of(*t)) replicated.push_back(t);
    }
    if (!replicated.empty()) {
      std::erase_if(list, [](tag* t) { return replication_of(*t) != nullptr; });
      offload_replicated_tags(ordinal, std::move(replicated));
      if (list.empty()) return;
    }
  }
  auto body = [this, list, &hs, &d, ordinal, mode,
               refuse_offloaded](const std::function<void()>& queued) {
    after_operation noted{[&]() noexcept { note_offloaded(ordinal); }};
    multi_lock lock(list);
    for (tag* t : list) {
      refuse_offloaded(t);
    }
    refuse_if_imported(list, "offloaded");
    offload_tags(d, list.data(), list.size(), mode, hs, cfg_, queued);
  };
  if (early_) {
    early_->start(ordinal, std::move(body));  // Note [early return]
  } else {
    body({});
  }
}

void registry::offload_replicated_tags(int ordinal, meta_vector<tag*> list) {
  after_operation noted{[&]() noexcept { note_offloaded(ordinal); }};
  multi_lock lock(list);
  for (tag* t : list) {
    TAGMEM_EXPECTS(!t->offloaded(), TAGMEM_ERROR_TAG_OFFLOADED,
                   std::string("tag '") + t->name() +
                       (t->partial() ? "' is partly offloaded; reload it before offloading it again"
                                     : "' is already offloaded"));
  }
  refuse_if_imported(list, "offloaded");
  // Every replica takes its tags in one order, whatever order its caller listed them in.
  std::sort(list.begin(), list.end(),
            [](tag* a, tag* b) { return std::strcmp(a->name(), b->name()) < 0; });
  const int timeout_ms = static_cast<int>(option_number(option::REPLICA_TIMEOUT_MS));
  device& d = dev(ordinal);
  host_store& hs = store(ordinal);
  meta_vector<tag*> waiting;
  // Waiters start once the tags are unlocked, also when a later tag's offload fails.
  auto start_waiters = [&]() noexcept {
    lock.unlock();
    for (tag* t : waiting) {
      try {
        share_waits_->start(ordinal, [this, &d, &hs, t, timeout_ms](const auto& queued) {
          queued();
          wait_for_shares(d, *t, hs, cfg_, timeout_ms, share_waits_stop_);
        });
      } catch (const std::exception& e) {  // no thread: what waits stays mapped until the reload
        if (logging(log_level::info)) log_line(e.what());
      }
    }
  };
  try {
    for (tag* t : list) {
      if (!can_offload_alone(*t)) {
        offload_replicated(d, *t, hs, cfg_, timeout_ms);
      } else if (offload_alone(d, *t, hs, cfg_)) {  // Note [offload alone]
        waiting.push_back(t);
      }
    }
  } catch (...) {
    start_waiters();
    throw;
  }
  start_waiters();
}

void registry::reload(const char* const* names, std::size_t count, int ordinal) {
  meta_vector<tag*> list = lookup_unique(names, count, ordinal, "tagmem_reload");
  if (list.empty()) return;
  host_store& hs = store(ordinal);
  after_operation noted{[&]() noexcept { note_offloaded(ordinal); }};
  multi_lock lock(list);
  for (tag* t : list) {
    TAGMEM_EXPECTS(t->offloaded(), TAGMEM_ERROR_TAG_RESIDENT,
                   std::string("tag '") + t->name() + "' is resident; nothing to reload");
  }
  // Tags on disk (Note [disk tier]) and tags offloaded through their replicas' shared copy
  // (Note [replicated offload]) are read back after the others' pipeline.
  const auto shared = std::stable_partition(list.begin(), list.end(),
                                            [](tag* t) { return !holds_shared_copy(*t); });
  const auto on_disk = std::stable_partition(
      list.begin(), shared, [](tag* t) { return t->mode() != TAGMEM_BACKUP_DISK; });
  const std::size_t in_memory = static_cast<std::size_t>(on_disk - list.begin());
  const std::size_t disk_end = static_cast<std::size_t>(shared - list.begin());
  if (in_memory) reload_tags(dev(ordinal), list.data(), in_memory, hs, cfg_);  // one pipeline
  std::exception_ptr first;
  if (in_memory < disk_end) {
    try {
      reload_from_disk(dev(ordinal), list.data() + in_memory, disk_end - in_memory, hs, cfg_,
                       disk_settings_now());
    } catch (...) {
      first = std::current_exception();
    }
  }
  for (std::size_t i = disk_end; i < list.size(); ++i) {
    try {
      reload_replicated(dev(ordinal), *list[i], hs, cfg_);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

disk_settings registry::disk_settings_now() {
  std::lock_guard lock(disk_mutex_);
  return {disk_dir_, cfg_.disk_piece_bytes,
          disk_file_bytes_ ? disk_file_bytes_ : cfg_.disk_file_bytes, cfg_.disk_depth};
}

void registry::set_disk_file_bytes(std::size_t bytes) {
  TAGMEM_EXPECTS(bytes % (1u << 20) == 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "disk file size " + std::to_string(bytes) + " is not a multiple of 1 MiB");
  std::lock_guard lock(disk_mutex_);
  disk_file_bytes_ = bytes;
}

void registry::set_disk_dir(const char* dir) {
  std::string chosen = dir && *dir ? dir : option_text(option::DISK_DIR);
  if (!chosen.empty()) {
    struct stat st {};
    TAGMEM_EXPECTS(
        ::stat(chosen.c_str(), &st) == 0 && S_ISDIR(st.st_mode), TAGMEM_ERROR_INVALID_ARGUMENT,
        "disk directory '" + chosen + "' is not a directory: " +
            (errno ? std::string(std::strerror(errno)) : std::string("not a directory")));
  }
  std::lock_guard lock(disk_mutex_);
  disk_dir_ = std::move(chosen);
}

void registry::swap(const char* const* out_names, std::size_t out_count,
                    const char* const* in_names, std::size_t in_count, int ordinal,
                    tagmem_offload_mode mode) {
  TAGMEM_EXPECTS(mode == TAGMEM_BACKUP || mode == TAGMEM_DISCARD, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "a swap's offload mode must be TAGMEM_BACKUP or TAGMEM_DISCARD (offload to disk "
                 "and reload instead)");
  meta_vector<tag*> outs = lookup_unique(out_names, out_count, ordinal, "tagmem_swap");
  meta_vector<tag*> ins = lookup_unique(in_names, in_count, ordinal, "tagmem_swap");
  for (tag* t : ins) {
    TAGMEM_EXPECTS(std::find(outs.begin(), outs.end(), t) == outs.end(),
                   TAGMEM_ERROR_INVALID_ARGUMENT,
                   std::string("tag '") + t->name() + "' is in both lists");
  }
  if (outs.empty() && ins.empty()) return;
  host_store& hs = store(ordinal);
  after_operation noted{[&]() noexcept { note_offloaded(ordinal); }};
  meta_vector<tag*> all(outs);
  all.insert(all.end(), ins.begin(), ins.end());
  multi_lock lock(std::move(all));
  for (tag* t : outs) {
    TAGMEM_EXPECTS(!t->offloaded() || t->partial(), TAGMEM_ERROR_TAG_OFFLOADED,
                   std::string("tag '") + t->name() + "' is already offloaded");
  }
  for (tag* t : ins) {
    TAGMEM_EXPECTS(t->offloaded(), TAGMEM_ERROR_TAG_RESIDENT,
                   std::string("tag '") + t->name() + "' is resident; nothing to reload");
    TAGMEM_EXPECTS(t->mode() != TAGMEM_BACKUP_DISK, TAGMEM_ERROR_INVALID_ARGUMENT,
                   std::string("tag '") + t->name() +
                       "' is offloaded to disk: reload it with tagmem_reload, not in a swap");
    TAGMEM_EXPECTS(!holds_shared_copy(*t), TAGMEM_ERROR_INVALID_ARGUMENT,
                   std::string("tag '") + t->name() +
                       "' is offloaded through its replicas' shared host copy: reload it with "
                       "tagmem_reload, not in a swap");
  }
  refuse_if_imported(outs, "swapped out");
  // One pipeline: the out-tags' copies and unmaps overlap the in-tags' maps and copies.
  move_tags(dev(ordinal), outs.data(), outs.size(), mode, ins.data(), ins.size(), hs, cfg_);
}

std::size_t registry::empty_cache(int ordinal) {
  device& d = dev(ordinal);
  std::size_t released = 0;
  for (tag* t : tags(ordinal)) {
    std::lock_guard lock(t->mutex());
    if (t->offloaded() || !t->pool().has_releasable()) continue;
    // Note [offload waits] applies here too: the last block of a chunk may have been freed on a
    // stream whose queued work still uses it (tagmem_free is stream-ordered), and unmapping
    // memory under a running copy or kernel faults. Wait for the device first, holding the tag's
    // lock so that no block of it can be freed between the wait and the unmap.
    {
      context_guard guard(d.context());
      TAGMEM_CU(cuCtxSynchronize, d.context());
    }
    released += t->pool().release_cached();
  }
  wait_released(ordinal);
  return released;
}

void registry::plan_offload(const char* name, int ordinal, tagmem_offload_mode mode) {
  TAGMEM_EXPECTS(mode == TAGMEM_BACKUP || mode == TAGMEM_DISCARD || mode == TAGMEM_BACKUP_DISK,
                 TAGMEM_ERROR_INVALID_ARGUMENT,
                 "offload mode must be TAGMEM_BACKUP, TAGMEM_DISCARD or TAGMEM_BACKUP_DISK");
  tag& t = get_or_create(ordinal, name);
  bool newly_planned = false;
  {
    std::lock_guard lock(t.mutex());
    newly_planned = mode == TAGMEM_BACKUP && !t.pins_ahead();
    t.set_pins_ahead(mode == TAGMEM_BACKUP);
  }
  // What it holds already. A repeated plan changes nothing: callers repeat theirs at every region
  // (the torch_memory_saver drop-in does), and a wake there would pin again at once what a trim
  // or a freed backup had just given back; growth wakes the pinner as before.
  if (newly_planned && pinner_) pinner_->wake();
}

void registry::wait_released(int ordinal) {
  device& d = dev(ordinal);
  if (early_) early_->wait(ordinal);                    // Note [early return]
  d.releases().wait_for_copies();                       // Note [releases wait for copies]
  if (peer_memory* p = d.peers()) p->release_unfit(0);  // received and not mapped: as kept ones
  context_guard guard(d.context());                     // parked mappings are unmapped first
  d.recycler().release_all(d.releases());               // Note [physical recycling]
  driver::check(d.releases().drain(), "cuMemRelease");
}

}  // namespace tagmem
