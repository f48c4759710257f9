// c_api.cpp — the C ABI (include/tagmem/tagmem.h) over the registry.
//
// Every entry point runs its body through c_boundary (c_error.hpp), which turns any exception into
// a status and a thread-local message, so no C caller ever sees an exception or an abort. The body
// runs under a hold on the runtime (runtime.hpp), created on first use (or by tagmem_init with a
// configuration) and destroyed by tagmem_shutdown, which waits for every hold. In a child
// forked after tagmem started, both refuse before touching anything (Note [fork]). The external
// tag (external_tag.hpp) is listed and counted beside the registry's tags.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "api/c_error.hpp"
#include "api/runtime.hpp"
#include "api/sized_struct.hpp"
#include "api/tag_scope.hpp"
#include "device/address_index.hpp"
#include "disk/disk_backup.hpp"
#include "driver/driver.hpp"
#include "host/metadata_heap.hpp"
#include "observe/log.hpp"
#include "observe/trace.hpp"
#include "options/options.hpp"
#include "registry/oom_message.hpp"
#include "registry/registry.hpp"
#include "replica/replication.hpp"
#include "tagmem/tagmem.h"
#include "tags/backup_retention.hpp"
#include "tags/host_view.hpp"

namespace tagmem {
namespace {

// Runs `body` with the registry behind the C boundary, creating the registry with defaults on
// first use.
template <class F>
tagmem_status guarded(F&& body) noexcept {
  return c_boundary([&] {
    runtime::hold h;
    body(h.core());
  });
}

// Note [enums from C]: a C caller may pass any int where the ABI has an enum, but in C++
// loading an enum object whose value lies outside the enumeration's range is undefined
// (UBSan's -fsanitize=enum reports it). Enum arguments are therefore read through their bytes
// and checked before they are used as enums.
int enum_bits(const void* e) {
  int raw = 0;
  std::memcpy(&raw, e, sizeof raw);
  return raw;
}
static_assert(sizeof(tagmem_offload_mode) == sizeof(int) && sizeof(tagmem_status) == sizeof(int));

tagmem_offload_mode checked_mode(const tagmem_offload_mode& mode) {
  const int raw = enum_bits(&mode);
  TAGMEM_EXPECTS(raw == TAGMEM_BACKUP || raw == TAGMEM_DISCARD || raw == TAGMEM_BACKUP_DISK,
                 TAGMEM_ERROR_INVALID_ARGUMENT,
                 "offload mode must be TAGMEM_BACKUP, TAGMEM_DISCARD or TAGMEM_BACKUP_DISK");
  if (raw == TAGMEM_BACKUP_DISK) return TAGMEM_BACKUP_DISK;
  return raw == TAGMEM_BACKUP ? TAGMEM_BACKUP : TAGMEM_DISCARD;
}

// The first released size of each struct (Note [sized structs]): what the fields before the first
// one added since end at. The unsized entry points of that release write exactly this much.
constexpr std::size_t kFirstConfig = offsetof(tagmem_config, host_max_bytes);
constexpr std::size_t kFirstTagStats = offsetof(tagmem_tag_stats, peak_allocated_bytes);
constexpr std::size_t kFirstDeviceStats = offsetof(tagmem_device_stats, host_budget_bytes);
constexpr std::size_t kFirstIpcStats = offsetof(tagmem_ipc_stats, held_allocations);

void expect_non_null(const void* p, const char* what) {
  TAGMEM_EXPECTS(p != nullptr, TAGMEM_ERROR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

std::atomic<std::size_t> g_memory_margin{0};  // tagmem_set_memory_margin

// Refuses `size` bytes on `d` when the driver's free memory would fall below the margin.
void check_margin(registry& r, int d, std::size_t size) {
  const std::size_t margin = g_memory_margin.load(std::memory_order_relaxed);
  if (margin == 0) return;
  std::size_t free_bytes = 0, total_bytes = 0;
  r.dev(d).memory_info(&free_bytes, &total_bytes);
  TAGMEM_EXPECTS(free_bytes >= margin && free_bytes - margin >= size, TAGMEM_ERROR_OUT_OF_MEMORY,
                 "allocation of " + std::to_string(size) + " bytes refused: the device has " +
                     std::to_string(free_bytes) + " bytes free and the memory margin is " +
                     std::to_string(margin));
}

void malloc_in(registry& r, void** ptr, std::size_t size, const char* name, int device,
               tagmem_stream stream) {
  expect_non_null(ptr, "ptr");
  *ptr = nullptr;
  const int d = r.resolve_device(device);
  explain_out_of_memory(r, d, "allocation in", &name, 1, size, [&] {
    check_margin(r, d, size);
    *ptr = r.allocate(size, name, d, stream);
  });
}

}  // namespace
}  // namespace tagmem

using namespace tagmem;

extern "C" {

// Exported for programs built against an earlier tagmem.h; this one makes macros of their names.
TAGMEM_API void(tagmem_config_init)(tagmem_config* config);
TAGMEM_API tagmem_status(tagmem_tag_stats_get)(const char* tag, int device, tagmem_tag_stats* out);
TAGMEM_API tagmem_status(tagmem_device_stats_get)(int device, tagmem_device_stats* out);

void tagmem_config_init_sized(tagmem_config* config, size_t size) {
  if (!config || size < kFirstConfig || size > kLargestStruct) return;
  std::memset(config, 0, size);
  config->struct_size = size;
}

// The names tagmem.h makes macros of, as a program built against an earlier header (where they
// were functions) links them: they fill the first released struct, a prefix of every later one.
// The parentheses keep the macros from expanding.
void(tagmem_config_init)(tagmem_config* config) { tagmem_config_init_sized(config, kFirstConfig); }

tagmem_status tagmem_init(const tagmem_config* config) {
  return c_boundary([&] {
    if (!config) return runtime::start(make_config(nullptr));
    const tagmem_config user =
        read_sized<tagmem_config>(config, config->struct_size, kFirstConfig, "tagmem_config");
    runtime::start(make_config(&user));
  });
}

tagmem_status tagmem_config_describe(char* buf, size_t capacity, size_t* needed) {
  return c_boundary([&] {
    TAGMEM_EXPECTS(buf || capacity == 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                   "tagmem_config_describe: buf is NULL");
    const std::string text = describe_options();
    if (needed) *needed = text.size() + 1;
    if (!buf) return;
    TAGMEM_EXPECTS(text.size() < capacity, TAGMEM_ERROR_INVALID_ARGUMENT,
                   "tagmem_config_describe: " + std::to_string(text.size() + 1) +
                       " bytes needed, " + std::to_string(capacity) + " given");
    std::memcpy(buf, text.c_str(), text.size() + 1);
  });
}

tagmem_status tagmem_shutdown(void) {
  return c_boundary([] {
    runtime::stop();
    note_config_fields({});
    try {
      trace::close();  // a trace that cannot be written does not fail the shutdown
    } catch (const std::exception& e) {
      log_line(e.what());
    }
  });
}

const char* tagmem_last_error(void) { return last_c_error(); }

const char* tagmem_status_string(tagmem_status status) {
  switch (enum_bits(&status)) {  // Note [enums from C]
#define TAGMEM_NAME(s) \
  case s:              \
    return #s;
    TAGMEM_NAME(TAGMEM_SUCCESS)
    TAGMEM_NAME(TAGMEM_ERROR_INVALID_ARGUMENT)
    TAGMEM_NAME(TAGMEM_ERROR_UNKNOWN_TAG)
    TAGMEM_NAME(TAGMEM_ERROR_TAG_OFFLOADED)
    TAGMEM_NAME(TAGMEM_ERROR_TAG_RESIDENT)
    TAGMEM_NAME(TAGMEM_ERROR_UNKNOWN_POINTER)
    TAGMEM_NAME(TAGMEM_ERROR_OUT_OF_MEMORY)
    TAGMEM_NAME(TAGMEM_ERROR_HOST_OUT_OF_MEMORY)
    TAGMEM_NAME(TAGMEM_ERROR_DRIVER)
    TAGMEM_NAME(TAGMEM_ERROR_NO_DRIVER)
    TAGMEM_NAME(TAGMEM_ERROR_SCOPE_EMPTY)
    TAGMEM_NAME(TAGMEM_ERROR_PEER)
    TAGMEM_NAME(TAGMEM_ERROR_TIMEOUT)
    TAGMEM_NAME(TAGMEM_ERROR_INTERNAL)
    TAGMEM_NAME(TAGMEM_ERROR_FORKED)
    TAGMEM_NAME(TAGMEM_ERROR_IO)
#undef TAGMEM_NAME
  }
  return "TAGMEM_UNKNOWN_STATUS";
}

tagmem_status tagmem_push_tag(const char* tag) {
  // The name first: a bad one is INVALID_ARGUMENT even where tagmem cannot initialise.
  if (tagmem_status s = c_boundary([&] { check_tag_name(tag); }); s != TAGMEM_SUCCESS) return s;
  return guarded([&](registry& r) {
    r.get_or_create(r.resolve_device(TAGMEM_CURRENT_DEVICE), tag);  // tagmem.h: exists from here
    push_tag(tag);
  });
}

tagmem_status tagmem_pop_tag(void) {
  return c_boundary([] { pop_tag(); });
}

const char* tagmem_current_tag(void) { return current_tag(); }

tagmem_status tagmem_malloc(void** ptr, size_t size, int device, tagmem_stream stream) {
  if (ptr) *ptr = nullptr;  // also when initialising tagmem fails
  return guarded([&](registry& r) { malloc_in(r, ptr, size, current_tag(), device, stream); });
}

tagmem_status tagmem_malloc_tagged(void** ptr, size_t size, const char* tag, int device,
                                   tagmem_stream stream) {
  if (ptr) *ptr = nullptr;  // also when initialising tagmem fails
  return guarded([&](registry& r) { malloc_in(r, ptr, size, tag, device, stream); });
}

tagmem_status tagmem_free(void* ptr, tagmem_stream stream) {
  return guarded([&](registry& r) {
    auto address = reinterpret_cast<CUdeviceptr>(ptr);
    tagmem::tag* t = global_address_index().find(address);
    TAGMEM_EXPECTS(t, TAGMEM_ERROR_UNKNOWN_POINTER,
                   "tagmem_free: " + std::to_string(address) + " was not allocated by tagmem");
    std::size_t size = 0;
    {
      std::lock_guard lock(t->mutex());
      const block* b = t->pool().find_containing(address);
      size = b ? b->size : 0;
      const auto unused = b ? free_span_around(*b) : std::pair<CUdeviceptr, std::size_t>{};
      // Note [free while imported] in registry/registry_ipc.cpp: another process maps it.
      const bool held = b && b->ptr == address && r.ipc_hold_if_imported(*t, address, size, stream);
      TAGMEM_EXPECTS(held || t->pool().free(address, stream), TAGMEM_ERROR_UNKNOWN_POINTER,
                     "tagmem_free: " + std::to_string(address) + " in tag '" + t->name() +
                         "' is not a live allocation (already freed, or not its start)");
      t->counters().free_count++;
      // Note [a freed allocation's host copy]: a backup exists only once the store does. A held
      // allocation's tag is resident (an imported tag cannot be offloaded).
      if (host_store* hs = r.existing_store(); hs && !held) {
        release_freed_backup(*t, unused.first, unused.second, *hs);
      }
      if (auto& disk = t->disk_backup()) {  // Note [a freed allocation's disk copy]
        release_freed_disk_copy(static_cast<disk_backup&>(*disk), unused.first, unused.second);
      }
    }
    r.ipc_forget(address, size);  // Note [ipc] in handoff/ipc_server.hpp
  });
}

tagmem_status tagmem_pointer_info(const void* ptr, char* tag, size_t tag_len, int* device,
                                  void** base, size_t* size) {
  return guarded([&](registry&) {
    auto address = reinterpret_cast<CUdeviceptr>(ptr);
    tagmem::tag* t = global_address_index().find(address);
    TAGMEM_EXPECTS(t, TAGMEM_ERROR_UNKNOWN_POINTER, "pointer was not allocated by tagmem");
    std::lock_guard lock(t->mutex());
    block* b = t->pool().find_containing(address);
    TAGMEM_EXPECTS(b, TAGMEM_ERROR_UNKNOWN_POINTER, "pointer is not inside a live allocation");
    if (tag && tag_len) {
      std::strncpy(tag, t->name(), tag_len - 1);
      tag[tag_len - 1] = '\0';
    }
    if (device) *device = t->dev().ordinal();
    if (base) *base = reinterpret_cast<void*>(b->ptr);
    if (size) *size = b->requested;
  });
}

tagmem_status tagmem_offload(const char* const* tags, size_t count, int device,
                             tagmem_offload_mode mode) {
  return guarded([&](registry& r) {
    r.offload(tags, count, r.resolve_device(device), checked_mode(mode));  // Note [enums from C]
  });
}

tagmem_status tagmem_reload(const char* const* tags, size_t count, int device) {
  return guarded([&](registry& r) {
    const int d = r.resolve_device(device);
    explain_out_of_memory(r, d, "reload of", tags, count, 0, [&] { r.reload(tags, count, d); });
  });
}

tagmem_status tagmem_swap(const char* const* out_tags, size_t out_count, const char* const* in_tags,
                          size_t in_count, int device, tagmem_offload_mode mode) {
  return guarded([&](registry& r) {
    const int d = r.resolve_device(device);
    explain_out_of_memory(r, d, "swap bringing in", in_tags, in_count, 0, [&] {
      r.swap(out_tags, out_count, in_tags, in_count, d, checked_mode(mode));  // Note [enums from C]
    });
  });
}

tagmem_status tagmem_empty_cache(int device) {
  return guarded([&](registry& r) { r.empty_cache(r.resolve_device(device)); });
}

tagmem_status tagmem_wait_released(int device) {
  return guarded([&](registry& r) { r.wait_released(r.resolve_device(device)); });
}

tagmem_status tagmem_tag_plan_offload(const char* tag, int device, tagmem_offload_mode mode) {
  return guarded([&](registry& r) {
    r.plan_offload(tag, r.resolve_device(device), checked_mode(mode));  // Note [enums from C]
  });
}

tagmem_status tagmem_release_physical(int device) {
  return guarded([&](registry& r) {
    tagmem::device& d = r.dev(r.resolve_device(device));
    context_guard guard(d.context());  // parked mappings are unmapped first
    d.recycler().release_all(d.releases());
    if (peer_memory* p = d.peers()) p->release_unfit(0);  // received, not mapped
  });
}

namespace {

handoff::service& handoff_of(registry& r, int device) {
  handoff::service* h = r.handoff(r.resolve_device(device));
  TAGMEM_EXPECTS(h, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "handoff is off on device " + std::to_string(device) +
                     " (set TAGMEM_HANDOFF=on; a device that cannot export POSIX-fd handles has "
                     "none)");
  return *h;
}

}  // namespace

tagmem_status tagmem_handoff_expect(int device, size_t bytes) {
  return guarded([&](registry& r) { handoff_of(r, device).expect(bytes); });
}

tagmem_status tagmem_handoff_cancel(int device) {
  return guarded([&](registry& r) { handoff_of(r, device).cancel(); });
}

tagmem_status tagmem_handoff_stats_get_sized(int device, tagmem_handoff_stats* out,
                                             size_t out_size) {
  return guarded([&](registry& r) {
    expect_non_null(out, "out");
    check_struct_size(out_size, sizeof(tagmem_handoff_stats), sizeof(tagmem_handoff_stats),
                      "tagmem_handoff_stats");
    handoff::service& h = handoff_of(r, device);
    const handoff::counters& c = h.stats();
    tagmem_handoff_stats s{};
    s.given_bytes = c.given_bytes;
    s.given_handles = c.given_handles;
    s.received_bytes = c.received_bytes;
    s.received_handles = c.received_handles;
    s.mapped_received_bytes = c.mapped_received_bytes;
    s.returned_bytes = c.returned_bytes;
    s.held_bytes = h.held_bytes();
    s.refused_peers = c.refused_peers;
    s.reload_waits = c.reload_waits;
    s.reload_wait_timeouts = c.reload_wait_timeouts;
    s.reload_wait_ns = c.reload_wait_ns;
    s.listening = h.listening() ? 1 : 0;
    write_sized(s, out, out_size, sizeof(tagmem_handoff_stats), "tagmem_handoff_stats");
  });
}

tagmem_status tagmem_host_reserve(size_t bytes, int wait) {
  return guarded([&](registry& r) {
    r.store().reserve(bytes, wait ? host_store::growth::now : host_store::growth::in_background);
  });
}

tagmem_status tagmem_host_trim(size_t keep_bytes) {
  return guarded([&](registry& r) {
    r.drop_spare_copies();
    r.store().trim(keep_bytes);
  });
}

tagmem_status tagmem_tag_stats_get_sized(const char* tag, int device, tagmem_tag_stats* out,
                                         size_t out_size) {
  return guarded([&](registry& r) {
    expect_non_null(out, "out");
    check_struct_size(out_size, kFirstTagStats, sizeof(tagmem_tag_stats), "tagmem_tag_stats");
    tagmem_tag_stats s;
    if (const external_tag* x = find_external_tag(tag)) {
      s = x->stats(r.resolve_device(device));
    } else {
      tagmem::tag& t = r.get(r.resolve_device(device), tag);
      std::lock_guard lock(t.mutex());
      s = t.stats();
    }
    write_sized(s, out, out_size, kFirstTagStats, "tagmem_tag_stats");
  });
}

tagmem_status(tagmem_tag_stats_get)(const char* tag, int device, tagmem_tag_stats* out) {
  return tagmem_tag_stats_get_sized(tag, device, out, kFirstTagStats);
}

tagmem_status tagmem_device_stats_get_sized(int device, tagmem_device_stats* out, size_t out_size) {
  return guarded([&](registry& r) {
    expect_non_null(out, "out");
    check_struct_size(out_size, kFirstDeviceStats, sizeof(tagmem_device_stats),
                      "tagmem_device_stats");
    int d = r.resolve_device(device);
    tagmem_device_stats s{};
    for (tagmem::tag* t : r.tags(d)) {
      std::lock_guard lock(t->mutex());
      tagmem_tag_stats ts = t->stats();
      s.allocated_bytes += ts.allocated_bytes;
      s.reserved_bytes += ts.reserved_bytes;
      s.mapped_bytes += ts.mapped_bytes;
      s.tags++;
    }
    if (const external_tag* x = registered_external_tag(); x && x->listed(d)) {
      tagmem_tag_stats ts = x->stats(d);
      s.allocated_bytes += ts.allocated_bytes;
      s.reserved_bytes += ts.reserved_bytes;
      s.mapped_bytes += ts.mapped_bytes;
      s.tags++;
    }
    r.dev(d).memory_info(&s.device_free_bytes, &s.device_total_bytes);
    s.release_pending_bytes = r.dev(d).releases().pending_bytes() + r.dev(d).recycler().bytes();
    if (peer_memory* p = r.dev(d).peers()) s.release_pending_bytes += p->held().bytes();
    host_store_stats hs = r.store().stats();
    s.host_pinned_bytes = hs.pinned_bytes;
    s.host_pinned_high_water = hs.high_water;
    s.host_used_bytes = hs.used_bytes;
    s.host_budget_bytes = hs.budget_bytes;
    write_sized(s, out, out_size, kFirstDeviceStats, "tagmem_device_stats");
  });
}

tagmem_status(tagmem_device_stats_get)(int device, tagmem_device_stats* out) {
  return tagmem_device_stats_get_sized(device, out, kFirstDeviceStats);
}

tagmem_status tagmem_list_tags(int device, char (*names)[TAGMEM_MAX_TAG_NAME + 1], size_t capacity,
                               size_t* count) {
  return guarded([&](registry& r) {
    expect_non_null(count, "count");
    TAGMEM_EXPECTS(names || capacity == 0, TAGMEM_ERROR_INVALID_ARGUMENT, "names is NULL");
    const int d = r.resolve_device(device);
    meta_vector<const char*> list;
    for (tagmem::tag* t : r.tags(d)) list.push_back(t->name());
    if (const external_tag* x = registered_external_tag(); x && x->listed(d)) {
      list.push_back(x->name);
    }
    for (std::size_t i = 0; i < list.size() && i < capacity; ++i) {
      std::strncpy(names[i], list[i], TAGMEM_MAX_TAG_NAME);
      names[i][TAGMEM_MAX_TAG_NAME] = '\0';
    }
    *count = list.size();
  });
}

tagmem_status tagmem_host_view(const void* ptr, int flags, void** host, size_t* bytes) {
  return guarded([&](registry&) {
    expect_non_null(host, "host");
    expect_non_null(bytes, "bytes");
    TAGMEM_EXPECTS((flags & ~TAGMEM_HOST_VIEW_WRITABLE) == 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                   "tagmem_host_view: unknown flags " + std::to_string(flags));
    auto address = reinterpret_cast<CUdeviceptr>(ptr);
    tagmem::tag* t = global_address_index().find(address);
    TAGMEM_EXPECTS(t, TAGMEM_ERROR_UNKNOWN_POINTER,
                   "tagmem_host_view: pointer was not allocated by tagmem");
    std::lock_guard lock(t->mutex());
    block* b = t->pool().find_containing(address);
    TAGMEM_EXPECTS(b && address < b->ptr + b->requested, TAGMEM_ERROR_UNKNOWN_POINTER,
                   "tagmem_host_view: pointer is not inside a live allocation");
    host_span span =
        backup_span(*t, address, b->ptr + b->requested, (flags & TAGMEM_HOST_VIEW_WRITABLE) != 0);
    *host = span.host;
    *bytes = span.bytes;
  });
}

tagmem_status tagmem_ipc_export(const void* ptr, size_t bytes, tagmem_ipc_handle* handle) {
  return guarded([&](registry& r) {
    expect_non_null(ptr, "ptr");
    expect_non_null(handle, "handle");
    const auto bytes_out =
        handoff::encode_ipc_handle(r.ipc_export(reinterpret_cast<std::uintptr_t>(ptr), bytes));
    std::memcpy(handle->bytes, bytes_out.data(), sizeof handle->bytes);
  });
}

tagmem_status tagmem_ipc_unexport(const tagmem_ipc_handle* handle) {
  return guarded([&](registry& r) {
    expect_non_null(handle, "handle");
    r.ipc_unexport(handoff::decode_ipc_handle(handle->bytes));
  });
}

tagmem_status tagmem_ipc_open(const tagmem_ipc_handle* handle, void** ptr, size_t* bytes,
                              int* device) {
  return guarded([&](registry& r) {
    expect_non_null(handle, "handle");
    expect_non_null(ptr, "ptr");
    expect_non_null(bytes, "bytes");
    const handoff::ipc_import& i = r.ipc_open(handoff::decode_ipc_handle(handle->bytes));
    *ptr = reinterpret_cast<void*>(i.ptr());
    *bytes = i.bytes();
    if (device) *device = i.ordinal();
  });
}

tagmem_status tagmem_ipc_close(void* ptr) {
  return guarded([&](registry& r) { r.ipc_close(reinterpret_cast<std::uintptr_t>(ptr)); });
}

tagmem_status tagmem_ipc_stats_get_sized(tagmem_ipc_stats* out, size_t out_size) {
  return guarded([&](registry& r) {
    expect_non_null(out, "out");
    const handoff::ipc_server_counters c = r.ipc_counters();
    tagmem_ipc_stats s{};
    s.exports = c.exports;
    s.importers = c.importers;
    s.opened_by_peers = c.opened;
    s.refused_peers = c.refused;
    s.open_here = r.ipc_open_here();
    const registry::held_totals held = r.ipc_held();
    s.held_allocations = held.allocations;
    s.held_bytes = held.bytes;
    write_sized(s, out, out_size, kFirstIpcStats, "tagmem_ipc_stats");
  });
}

tagmem_status tagmem_set_keep_backup(const char* tag, int device, int keep) {
  return guarded([&](registry& r) {
    tagmem::tag& t = r.get(r.resolve_device(device), tag);
    std::lock_guard lock(t.mutex());
    t.set_keep_backup(keep != 0);
  });
}

tagmem_status tagmem_set_unpin_backup(const char* tag, int device, int unpin) {
  return guarded([&](registry& r) {
    tagmem::tag& t = r.get(r.resolve_device(device), tag);
    std::lock_guard lock(t.mutex());
    t.set_unpin_backup(unpin != 0);
  });
}

tagmem_status tagmem_set_replicated(const char* tag, int device, const char* group, int rank,
                                    int size) {
  return guarded([&](registry& r) {
    tagmem::tag& t = r.get(r.resolve_device(device), tag);
    std::lock_guard lock(t.mutex());
    set_replication(t, group, rank, size);
  });
}

tagmem_status tagmem_set_disk_dir(const char* dir) {
  return guarded([&](registry& r) { r.set_disk_dir(dir); });
}

tagmem_status tagmem_set_disk_file_bytes(size_t bytes) {
  return guarded([&](registry& r) { r.set_disk_file_bytes(bytes); });
}

void tagmem_set_memory_margin(size_t bytes) {
  g_memory_margin.store(bytes, std::memory_order_relaxed);
}

tagmem_status tagmem_trace_flush(void) {
  return c_boundary([] { trace::flush(); });
}

size_t tagmem_memory_margin(void) { return g_memory_margin.load(std::memory_order_relaxed); }

const char* tagmem_metadata_heap(void) {
  return tagmem::current_metadata_allocator() == tagmem::metadata_allocator::mimalloc ? "mimalloc"
                                                                                      : "system";
}

}  // extern "C"
