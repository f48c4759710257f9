// registry.hpp — the initialised library: configuration, devices, their tags, the host store.
//
// Lock order (never acquired in the other direction): registry::tags_mutex (shared) → tag
// mutexes, taken in ascending address order when several are needed → host_store mutex. A
// device's release_queue mutex is a leaf: taken under any of these, it takes nothing else.
// The registry's own mutexes are never held while a tag operation runs a driver call that can
// block for long, except the brief shared lock that finds tags. Tags are created on first use
// and destroyed only by the registry's destructor (tagmem_shutdown), so tag pointers found
// under a lock stay valid after it is released.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <shared_mutex>

#include "device/device.hpp"
#include "disk/disk_backup.hpp"
#include "handoff/ipc_import.hpp"
#include "handoff/ipc_server.hpp"
#include "handoff/service.hpp"
#include "host/background_pinning.hpp"
#include "host/host_store.hpp"
#include "options/config.hpp"
#include "registry/early_offloads.hpp"
#include "registry/ipc_source.hpp"
#include "registry/nccl_holds.hpp"
#include "tags/tag.hpp"

namespace tagmem {

class registry {
 public:
  explicit registry(const config& cfg);  // loads the driver; throws
  ~registry();                           // releases everything

  const config& settings() const noexcept { return cfg_; }
  // Created on first use, with the context of device `ordinal` (TAGMEM_CURRENT_DEVICE: the
  // current one): Note [the host store's context].
  host_store& store(int ordinal = TAGMEM_CURRENT_DEVICE);
  host_store* existing_store() noexcept;  // nullptr before that
  int device_count() const noexcept { return device_count_; }

  // Resolves TAGMEM_CURRENT_DEVICE and checks the ordinal.
  int resolve_device(int ordinal);
  device& dev(int ordinal);  // created on first use

  // The tag, created on first use / nullptr or UNKNOWN_TAG when missing. The external tag's
  // name (external_tag.hpp) is refused with INVALID_ARGUMENT: it is never a tag of the registry.
  tag& get_or_create(int ordinal, const char* name);
  tag* find(int ordinal, const char* name);
  tag& get(int ordinal, const char* name);  // throws UNKNOWN_TAG
  meta_vector<tag*> tags(int ordinal);
  // Gives back the shared host copies that resident replicated tags keep for their next offload
  // (Note [shared copy reuse] in replica/replica_tier.hpp).
  void drop_spare_copies();

  // Operations that span tags.
  void* allocate(std::size_t size, const char* name, int ordinal, CUstream stream);
  void offload(const char* const* names, std::size_t count, int ordinal, tagmem_offload_mode mode);
  void reload(const char* const* names, std::size_t count, int ordinal);
  void swap(const char* const* out_names, std::size_t out_count, const char* const* in_names,
            std::size_t in_count, int ordinal, tagmem_offload_mode mode);
  std::size_t empty_cache(int ordinal);
  // Note [background release]; first waits for the device's offloads that returned early (Note
  // [early return]) and throws the first failure they met. Throws DRIVER.
  void wait_released(int ordinal);
  // Records how the tag will be offloaded (creating it): BACKUP pins ahead (Note [pin ahead]).
  void plan_offload(const char* name, int ordinal, tagmem_offload_mode mode);
  // The directory TAGMEM_BACKUP_DISK writes to from now on ("" or null: TAGMEM_DISK_DIR).
  void set_disk_dir(const char* dir);
  // The largest file it writes (0: TAGMEM_DISK_FILE_BYTES).
  void set_disk_file_bytes(std::size_t bytes);

  // The device's handoff (Note [handoff] in handoff/service.hpp); null without TAGMEM_HANDOFF=on
  // or where the device cannot export handles. Creates the device.
  handoff::service* handoff(int ordinal);
  // Tests of the data path: hands `fd`, a connected socket, to the device's handoff as a giver's
  // or a taker's channel. Throws INVALID_ARGUMENT without handoff.
  void attach_handoff_for_test(int ordinal, int fd, bool giver);

  // Tagged memory mapped by other processes (Note [ipc] in handoff/ipc_server.hpp;
  // registry_ipc.cpp). Export: the range must lie in one live allocation of a resident tag on a
  // device whose memory is exportable; starts this process's IPC server on first use (PEER when
  // it cannot listen, INVALID_ARGUMENT without a job identity or private directory).
  handoff::ipc_handle ipc_export(std::uint64_t ptr, std::uint64_t bytes);
  void ipc_unexport(const handoff::ipc_handle& h);  // UNKNOWN_POINTER when not exported
  // Maps an export of another process; returns the import, owned here until ipc_close.
  const handoff::ipc_import& ipc_open(const handoff::ipc_handle& h);
  void ipc_close(std::uint64_t ptr);  // UNKNOWN_POINTER when no import starts there
  // Forgets the exports inside freed memory.
  void ipc_forget(std::uint64_t base, std::uint64_t size) noexcept;
  // Note [free while imported]: with `t`'s lock held, frees the live allocation [ptr, ptr + size)
  // into hold (block_pool::hold) when a live import maps any of it; false when none does (or no
  // live allocation starts at ptr), for the caller to free it. Throws DRIVER, nothing changed.
  bool ipc_hold_if_imported(tag& t, std::uint64_t ptr, std::size_t size, CUstream stream);
  handoff::ipc_server_counters ipc_counters();
  struct held_totals {
    std::uint64_t allocations = 0, bytes = 0;
  };
  // The allocations freed while imported and not yet given back (Note [free while imported]).
  held_totals ipc_held();
  std::size_t ipc_open_here();
  // Tagged memory NCCL holds, as the LD_PRELOAD shim reports it (Note [nccl holds]).
  nccl_holds& held_by_nccl() noexcept { return nccl_holds_; }

 private:
  struct device_slot {
    std::once_flag created;  // dev is set once, without a lock on every later use
    std::unique_ptr<device> dev;
    std::unique_ptr<handoff::service> handoff;  // created with dev when handoff is on
    std::shared_mutex tags_mutex;
    meta_map<meta_string, tag*, std::less<>> tags;  // looked up by const char*, no copy
  };
  device_slot& slot(int ordinal);
  // Tells the device's handoff how many bytes its tags have offloaded now, and the longest span of
  // a tag's offloaded mappings side by side (the largest handle its reload can map), after each
  // offload, reload and swap: a process with offloaded tags takes memory, Note [handoff].
  void note_offloaded(int ordinal) noexcept;
  // What the background pinner pins toward: the mapped bytes of resident planned-BACKUP tags.
  std::size_t planned_backup_bytes();
  // Throws INVALID_ARGUMENT naming `operation` for the external tag.
  meta_vector<tag*> lookup_unique(const char* const* names, std::size_t count, int ordinal,
                                  const char* operation);

  disk_settings disk_settings_now();

  config cfg_;
  std::mutex disk_mutex_;
  std::string disk_dir_;  // TAGMEM_DISK_DIR or tagmem_set_disk_dir()
  std::size_t disk_file_bytes_ = 0;
  std::string handoff_job_, handoff_dir_;  // with TAGMEM_HANDOFF=on
  int device_count_ = 0;
  std::mutex devices_mutex_;  // creating the store
  meta_vector<std::unique_ptr<device_slot>> slots_;
  std::unique_ptr<host_store> store_;
  std::unique_ptr<background_pinning> pinner_;  // null with TAGMEM_PIN_AHEAD=off
  std::unique_ptr<early_offloads> early_;       // with TAGMEM_OFFLOAD_RETURN=queued
  // Replicas that offloaded alone and wait for the others' shares (Note [offload alone]).
  std::unique_ptr<early_offloads> share_waits_;
  std::atomic<bool> share_waits_stop_{false};
  // A thread per device with handoff that maps received memory into offloaded DISCARD tags
  // (Note [mapped ahead] in offload/map_ahead.hpp); with TAGMEM_HANDOFF_MAP_AHEAD=on.
  std::unique_ptr<early_offloads> ahead_;
  std::atomic<bool> ahead_stop_{false};
  void start_mapping_ahead(int ordinal, device& d, handoff::service& h);
  void map_ahead_loop(int ordinal, device& d, handoff::service& h) noexcept;
  // Throws PEER, naming the process, when a live import maps memory of one of `tags`, or
  // naming the hold when NCCL holds some (Note [nccl holds]).
  void refuse_if_imported(const meta_vector<tag*>& tags, const char* operation);
  // The replicated tags of a BACKUP offload, each with its replicas (Note [replicated offload]).
  void offload_replicated_tags(int ordinal, meta_vector<tag*> list);
  // Gives back to their pools the held allocations that no import in `live` maps.
  void ipc_imports_ended(const std::vector<handoff::ipc_importer>& live) noexcept;
  struct held_free {
    tag* owner;
    std::uint64_t ptr;
    std::size_t size;
    std::chrono::steady_clock::time_point since;  // when it was freed, for the log line
  };
  std::mutex ipc_mutex_;         // the fields below
  std::vector<held_free> held_;  // freed while imported (Note [free while imported])
  tag_ipc_source ipc_source_{[this](const auto& live) { ipc_imports_ended(live); }};
  std::unique_ptr<handoff::ipc_server> ipc_server_;            // created by the first export
  std::atomic<const handoff::ipc_server*> exporter_{nullptr};  // ipc_server_, read without the lock
  std::vector<std::unique_ptr<handoff::ipc_import>> imports_;
  nccl_holds nccl_holds_;
};

// Checks a tag name (non-empty, at most TAGMEM_MAX_TAG_NAME bytes, printable, no spaces).
void check_tag_name(const char* name);

}  // namespace tagmem
