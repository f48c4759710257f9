// tms_abi.cpp — torch_memory_saver's C functions (tms_*, set_memory_margin_bytes), exported by the
// shim so that callers written against torch_memory_saver's hook library (ctypes through
// `_binary_wrapper.cdll`, or dlsym in the preloaded process) run over tagmem.
//
// torch_memory_saver keeps a per-thread configuration (whether allocations are tracked, their tag,
// whether a pause keeps a CPU copy, the copy's backend) and records it with each allocation. Here
// the configuration drives the shim's own switches: "tracked" is the thread's routing
// (tagmem_preload_set_thread_routing), and the tag with the backup wish picks the thread's tagmem
// tag scope (Note [one tagmem tag per backup wish]). tms_pause / tms_resume offload and reload the
// tagmem tags of a torch_memory_saver tag with tagmem_offload / tagmem_reload on every device that
// has them.
//
// Note [one tagmem tag per backup wish]: torch_memory_saver decides per allocation whether and
// where a pause keeps its bytes (a CPU copy, a disk copy, none), tagmem per tag. So a
// torch_memory_saver tag is one tagmem tag per backup wish: the wish it is first configured with
// (by a routed thread) gets the tag's own name, the others the name with kBackupSuffix,
// kDiskSuffix or kNoBackupSuffix appended. A tag always used one way (the usual case) keeps its
// name. The wish is settled by tms_set_enable_cpu_backup and then tms_set_enable_disk_backup, the
// last calls torch_memory_saver's set_config makes for a region (tag, tracking, CPU backup,
// backend, disk backup): the states it passes through before never claim a name (a CPU setter
// that turns the CPU backup off while the thread's disk wish is on leaves the claim to the disk
// setter that follows), and a tag only seen routed (tracking switched on without a backup wish
// being set) keeps the name unclaimed until one is. Callers that never call the disk setter
// settle the wish with the CPU one, as before torch_memory_saver had disk backups.
//
// The "mmap" backend is accepted and recorded: tagmem backs every tag up to pinned host memory,
// and a resume of a tag whose backup was asked for with "mmap" (and that keeps no copy) gives that
// backup's host memory back to the system (tagmem_set_unpin_backup), which is that backend's
// promise: the process's host memory drops after resume, while the other regions keep theirs
// pinned for their next pause. A disk wish pauses its tagmem tag with
// TAGMEM_BACKUP_DISK into the directory of tms_set_disk_backup_dir (created when missing), else
// TMS_DISK_BACKUP_DIR, else TAGMEM_DISK_DIR, else /tmp (torch_memory_saver's default).
#include <strings.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/runtime.hpp"  // option_env: the settings table; the runtime's settings
#include "shim_config.hpp"
#include "tagmem/tagmem.h"
#include "tagmem/tagmem_preload.h"
#include "thread_routing.hpp"

namespace tagmem::preload {
namespace {

constexpr const char* kDefaultTag = "default";  // torch_memory_saver's tag outside regions
constexpr int kMaxDevices = 1024;

bool env_true(const char* name) {
  const char* v = std::getenv(name);
  return v && (std::strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0);
}

// Whether this process's offloads return with their copies queued (TAGMEM_OFFLOAD_RETURN=queued,
// as tagmem read it when it started). Then a pause does not wait for the memory to go back to the
// driver, which would wait for the copies.
bool offload_returns_early() noexcept {
  try {
    return runtime::hold().settings().offload_return_queued;
  } catch (...) {  // no runtime could be made: nothing was offloaded, early or not
    return false;
  }
}

bool valid_backend(const char* b) {
  return b && (std::strcmp(b, "pinned") == 0 || std::strcmp(b, "mmap") == 0);
}

const char* env_backend() {
  const char* b = std::getenv("TMS_INIT_CPU_BACKUP_BACKEND");
  return valid_backend(b) ? b : "pinned";
}

struct thread_config {
  std::string tag = kDefaultTag;
  bool pushed = false;      // `scope` is on this thread's tag scope (the plain "default" is not)
  std::string scope;        // the tagmem tag pushed
  int routed = -1;          // -1: not set yet, the routing mode decides (tag scopes, default tag)
  int backup = -1;          // -1: not set yet, TMS_INIT_ENABLE_CPU_BACKUP decides
  int disk = -1;            // -1: not set yet, TMS_INIT_ENABLE_DISK_BACKUP decides
  std::string provisional;  // a record the CPU setter made, which the disk setter may undo
  std::string backend;      // empty: not set yet, TMS_INIT_CPU_BACKUP_BACKEND decides
};
thread_local thread_config t_config;

bool thread_backup() {
  if (t_config.backup < 0) t_config.backup = env_true("TMS_INIT_ENABLE_CPU_BACKUP") ? 1 : 0;
  return t_config.backup == 1;
}

bool thread_disk() {
  if (t_config.disk < 0) t_config.disk = env_true("TMS_INIT_ENABLE_DISK_BACKUP") ? 1 : 0;
  return t_config.disk == 1;
}

const std::string& thread_backend() {
  if (t_config.backend.empty()) t_config.backend = env_backend();
  return t_config.backend;
}

constexpr const char* kBackupSuffix = "+cpu_backup";
constexpr const char* kNoBackupSuffix = "+no_backup";
constexpr const char* kDiskSuffix = "+disk_backup";

struct tag_record {
  std::string name;   // the tagmem tag
  std::string tms;    // the torch_memory_saver tag it is a part of
  bool backup;        // a CPU copy
  bool reclaim;       // backed up with the "mmap" backend: host memory given back after resume
  bool claimed;       // its backup wish was set (Note [one tagmem tag per backup wish])
  bool disk = false;  // a disk copy (never with `backup`: a CPU backup wins)
};

const char* suffix(bool backup, bool disk) {
  return backup ? kBackupSuffix : disk ? kDiskSuffix : kNoBackupSuffix;
}

std::mutex g_mutex;
std::vector<tag_record>* g_tags = nullptr;  // in first-configured order; never destroyed
bool g_retain = false;
bool g_disk_dir_set = false;  // by tms_set_disk_backup_dir or TMS_DISK_BACKUP_DIR
std::once_flag g_once;

// The tagmem tag a torch_memory_saver tag's first backup wish goes to: its own name, except that
// "default" is the shim's default tag where one is set (TMS_INIT_ENABLE routes there).
std::string plain_name(const std::string& tms) {
  const std::string& d = config().default_tag;
  return tms == kDefaultTag && !d.empty() ? d : tms;
}

// Called with g_mutex held.
tag_record* find_locked(const std::string& name) {
  for (tag_record& r : *g_tags) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

// The tagmem tag of `tms` with backup wish (`backup`, `disk`). Called with g_mutex held.
std::string variant_locked(const std::string& tms, bool backup, bool disk) {
  disk = disk && !backup;
  for (const tag_record& r : *g_tags) {
    if (r.claimed && r.tms == tms && r.backup == backup && r.disk == disk) return r.name;
  }
  const std::string plain = plain_name(tms);
  const tag_record* owner = find_locked(plain);
  if (owner != nullptr && owner->claimed && (owner->backup != backup || owner->disk != disk)) {
    return tms + suffix(backup, disk);
  }
  return plain;
}

// Records the tagmem tag of (`tms`, `backup`, `disk`) and returns its name; `claim` settles the
// wish. Called with g_mutex held.
std::string note_locked(const std::string& tms, bool backup, bool disk, bool reclaim, bool claim) {
  const std::string name = variant_locked(tms, backup, disk);
  const tag_record record{name, tms, backup, backup && reclaim, claim, disk && !backup};
  tag_record* r = find_locked(name);
  if (r == nullptr) {
    g_tags->push_back(record);
    if (claim) t_config.provisional = name;
    return name;
  }
  if (claim && !r->claimed) t_config.provisional = name;
  if (claim) *r = record;
  return name;
}

// Makes `dir` (and its parents) when missing and points tagmem's disk tier at it.
void use_disk_dir(const char* dir) {
  std::string path;
  for (const char* c = dir; *c; ++c) {
    if (*c == '/' && !path.empty()) (void)mkdir(path.c_str(), 0700);  // exists: fine
    path += *c;
  }
  (void)mkdir(path.c_str(), 0700);
  if (tagmem_set_disk_dir(dir) != TAGMEM_SUCCESS) {
    std::fprintf(stderr, "tagmem: disk backup directory \"%s\": %s\n", dir, tagmem_last_error());
  }
}

void start() {
  std::call_once(g_once, [] {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_tags = new std::vector<tag_record>;
    g_retain = env_true("TMS_RETAIN_CPU_BACKUP");
    if (const char* dir = std::getenv("TMS_DISK_BACKUP_DIR"); dir && *dir) {
      use_disk_dir(dir);
      g_disk_dir_set = true;
    }
    // TMS_INIT_ENABLE=1: every cudaMalloc outside a region goes to the shim's default tag.
    if (const std::string& d = config().default_tag; !d.empty()) {
      const bool backup = env_true("TMS_INIT_ENABLE_CPU_BACKUP");
      const bool disk = !backup && env_true("TMS_INIT_ENABLE_DISK_BACKUP");
      g_tags->push_back(
          {d, kDefaultTag, backup, backup && env_backend() == std::string("mmap"), true, disk});
    }
  });
}

// Points this thread's tag scope at the tagmem tag of its configuration, and records that tag
// when the thread's allocations go to tagmem; `claim` settles its backup wish and plans its
// offload (a backed-up tag is pinned ahead as it grows, except with the "mmap" backend, whose
// promise is host memory only while the tag is paused).
bool apply(bool claim) {
  const bool backup = thread_backup();
  const bool disk = thread_disk();
  const bool reclaim = thread_backend() == "mmap";
  std::string name;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    name = variant_locked(t_config.tag, backup, disk);
  }
  // The plain "default" is no scope: outside regions the shim's own default tag applies.
  const bool push = !(t_config.tag == kDefaultTag && name == plain_name(kDefaultTag));
  // Left alone when it stays the same, so tag scopes a caller opened above it stay as they are.
  if (t_config.pushed && !(push && t_config.scope == name)) {
    tagmem_pop_tag();
    t_config.pushed = false;
  }
  if (push && !t_config.pushed) {
    if (tagmem_push_tag(name.c_str()) != TAGMEM_SUCCESS) {
      std::fprintf(stderr, "tagmem: tag \"%s\": %s\n", name.c_str(), tagmem_last_error());
      return false;
    }
    t_config.pushed = true;
    t_config.scope = name;
  }
  // The automatic mode (tag scopes and the shim's default tag decide) wherever it gives the
  // answer asked for, so that restoring a region's saved configuration gives the thread back the
  // routing it had, tagmem.tag() scopes included; a forced mode only where it does not. Decided
  // again whenever the scope changes, as the automatic mode's answer depends on it.
  if (t_config.routed >= 0) {
    tagmem_preload_set_thread_routing(TAGMEM_PRELOAD_ROUTE_AUTO);
    if (tagmem_preload_thread_routed() != t_config.routed) {
      tagmem_preload_set_thread_routing(t_config.routed ? TAGMEM_PRELOAD_ROUTE_ON
                                                        : TAGMEM_PRELOAD_ROUTE_OFF);
    }
  }
  if (routing_tag() == nullptr) return true;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    name = note_locked(t_config.tag, backup, disk, reclaim, claim);
  }
  if (claim) {
    tagmem_tag_plan_offload(name.c_str(), TAGMEM_CURRENT_DEVICE,
                            backup && !reclaim ? TAGMEM_BACKUP : TAGMEM_DISCARD);
    // From its first pause on, an "mmap" backup lies in host memory of its own, which its resume
    // can give back without touching what the other regions keep pinned.
    tagmem_set_unpin_backup(name.c_str(), TAGMEM_CURRENT_DEVICE, backup && reclaim ? 1 : 0);
  }
  return true;
}

// The tagmem tags of torch_memory_saver tag `tag` (NULL or "": of every configured tag).
std::vector<tag_record> selected(const char* tag) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (tag == nullptr || *tag == '\0') return *g_tags;
  std::vector<tag_record> out;
  for (const tag_record& r : *g_tags) {
    if (r.tms == tag) out.push_back(r);
  }
  // A tag this library never saw configured: paused without a backup, as torch_memory_saver
  // pauses allocations that asked for none.
  if (out.empty()) out.push_back({tag, tag, false, false, false, false});
  return out;
}

// The selected tags that exist on `device`, with their states.
std::vector<std::pair<tag_record, tagmem_tag_state>> present(const std::vector<tag_record>& want,
                                                             int device) {
  std::vector<std::pair<tag_record, tagmem_tag_state>> out;
  for (const tag_record& r : want) {
    tagmem_tag_stats s{};
    if (tagmem_tag_stats_get(r.name.c_str(), device, &s) == TAGMEM_SUCCESS) {
      out.emplace_back(r, s.state);
    }
  }
  return out;
}

bool device_exists(int device) {
  size_t count = 0;
  return tagmem_list_tags(device, nullptr, 0, &count) != TAGMEM_ERROR_INVALID_ARGUMENT;
}

int offload_group(const std::vector<std::string>& names, int device, tagmem_offload_mode mode) {
  if (names.empty()) return TAGMEM_SUCCESS;
  std::vector<const char*> list;
  for (const std::string& n : names) list.push_back(n.c_str());
  return tagmem_offload(list.data(), list.size(), device, mode);
}

// Before a disk offload: torch_memory_saver's default directory when none was named.
void ensure_disk_dir() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_disk_dir_set || option_env(option::DISK_DIR) != nullptr) return;
  use_disk_dir("/tmp");
  g_disk_dir_set = true;
}

}  // namespace
}  // namespace tagmem::preload

using namespace tagmem::preload;

#define TMS_EXPORT extern "C" __attribute__((visibility("default")))

TMS_EXPORT void tms_set_interesting_region(bool value) {
  start();
  t_config.routed = value ? 1 : 0;
  apply(false);
}

TMS_EXPORT bool tms_get_interesting_region() { return tagmem_preload_thread_routed() == 1; }

TMS_EXPORT void tms_set_current_tag(const char* tag) {
  start();
  if (tag == nullptr) {
    std::fprintf(stderr, "tagmem: tms_set_current_tag(NULL): a tag is needed; nothing changed\n");
    return;
  }
  const std::string previous = t_config.tag;
  t_config.tag = tag;
  if (!apply(false)) {
    std::fprintf(stderr, "tagmem: tms_set_current_tag(\"%s\"): the tag stays \"%s\"\n", tag,
                 previous.c_str());
    t_config.tag = previous;
    apply(false);
  }
}

TMS_EXPORT const char* tms_get_current_tag() { return t_config.tag.c_str(); }

TMS_EXPORT bool tms_get_enable_cpu_backup() { return thread_backup(); }

TMS_EXPORT void tms_set_enable_cpu_backup(bool value) {
  start();
  t_config.provisional.clear();
  t_config.backup = value ? 1 : 0;
  apply(value || !thread_disk());  // else the disk setter settles it
}

TMS_EXPORT const char* tms_get_cpu_backup_backend() { return thread_backend().c_str(); }

TMS_EXPORT void tms_set_cpu_backup_backend(const char* backend) {
  start();
  if (!valid_backend(backend)) {
    std::fprintf(stderr,
                 "tagmem: tms_set_cpu_backup_backend(%s%s%s): expected \"pinned\" or \"mmap\"; "
                 "nothing changed\n",
                 backend ? "\"" : "", backend ? backend : "NULL", backend ? "\"" : "");
    return;
  }
  t_config.backend = backend;
  if (thread_backup()) apply(true);
}

TMS_EXPORT bool tms_get_enable_disk_backup() { return thread_disk(); }

TMS_EXPORT void tms_set_enable_disk_backup(bool value) {
  start();
  // The CPU setter just before claimed a name for the wish without a disk backup, which this call
  // changes: that claim is undone, so that the wish settled here may take the tag's own name.
  if (value != thread_disk() && !thread_backup() && !t_config.provisional.empty()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto it = g_tags->begin(); it != g_tags->end(); ++it) {
      if (it->name == t_config.provisional && !it->backup && !it->disk) {
        it->claimed = false;
        break;
      }
    }
  }
  t_config.provisional.clear();
  t_config.disk = value ? 1 : 0;
  apply(true);
}

TMS_EXPORT void tms_set_disk_backup_dir(const char* dir) {
  start();
  if (dir == nullptr || *dir == '\0') {
    std::fprintf(stderr,
                 "tagmem: tms_set_disk_backup_dir: a directory is needed; nothing changed\n");
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  use_disk_dir(dir);
  g_disk_dir_set = true;
}

TMS_EXPORT void set_memory_margin_bytes(uint64_t value) {
  tagmem_set_memory_margin(static_cast<size_t>(value));
}

TMS_EXPORT void tms_set_retain_cpu_backup(bool value) {
  start();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_retain = value;
}

TMS_EXPORT bool tms_get_retain_cpu_backup() {
  start();
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_retain;
}

// Pauses `tag` (NULL or "": every tag configured through these functions) on every device: its
// tagmem tags that want a CPU copy with BACKUP, a disk copy with BACKUP_DISK, the others with
// DISCARD; returns once the memory is back with the driver (with TAGMEM_OFFLOAD_RETURN=queued, once
// the copies are queued: Note [early return]). The caller has finished the work that
// uses the memory (torch_memory_saver's callers synchronise first). Returns a tagmem_status: a
// named tag that is paused already (none of its tagmem tags resident) is TAG_OFFLOADED (tagmem is
// stricter than torch_memory_saver here); a tag with no memory anywhere has nothing to pause (0).
// On an error, the devices before it stay paused.
TMS_EXPORT int tms_pause(const char* tag) {
  start();
  const bool named = tag != nullptr && *tag != '\0';
  const std::vector<tag_record> want = selected(tag);
  for (int d = 0; d < kMaxDevices && device_exists(d); ++d) {
    std::vector<std::string> backup, disk, discard;
    const auto here = present(want, d);
    for (const auto& [r, state] : here) {
      if (state == TAGMEM_RESIDENT) (r.backup ? backup : r.disk ? disk : discard).push_back(r.name);
    }
    if (backup.empty() && disk.empty() && discard.empty()) {
      if (named && !here.empty()) return TAGMEM_ERROR_TAG_OFFLOADED;
      continue;
    }  // no context is made on devices unused here
    // What has no copy goes first (Note [drop before copying]).
    if (int s = offload_group(discard, d, TAGMEM_DISCARD)) return s;
    if (int s = offload_group(backup, d, TAGMEM_BACKUP)) return s;
    if (!disk.empty()) ensure_disk_dir();
    if (int s = offload_group(disk, d, TAGMEM_BACKUP_DISK)) return s;
    if (offload_returns_early()) continue;  // the copies run on (Note [early return])
    if (int s = tagmem_wait_released(d)) return s;
  }
  return TAGMEM_SUCCESS;
}

// Resumes `tag` (NULL or "": every paused tag configured here) on every device at its old
// addresses. With tms_set_retain_cpu_backup(true) the host copies of backed-up tags are kept
// (tagmem_set_keep_backup); otherwise they are given back, to the system for a tag backed up with
// the "mmap" backend (tagmem_set_unpin_backup). Returns a tagmem_status:
// a named tag that is resident (none of its tagmem tags paused) is TAG_RESIDENT; a resume that does
// not fit is OUT_OF_MEMORY with the tag still paused and its backup intact; a tag with no memory
// anywhere has nothing to resume.
TMS_EXPORT int tms_resume(const char* tag) {
  start();
  const bool named = tag != nullptr && *tag != '\0';
  const std::vector<tag_record> want = selected(tag);
  const bool retain = tms_get_retain_cpu_backup();
  for (int d = 0; d < kMaxDevices && device_exists(d); ++d) {
    std::vector<const char*> names;
    const auto here = present(want, d);
    for (const auto& [r, state] : here) {
      if (state == TAGMEM_RESIDENT) continue;
      if (r.backup) {
        tagmem_set_keep_backup(r.name.c_str(), d, retain ? 1 : 0);
        // The "mmap" backend's host memory goes back after the resume; the others' stays pinned.
        tagmem_set_unpin_backup(r.name.c_str(), d, r.reclaim && !retain ? 1 : 0);
      }
      names.push_back(r.name.c_str());
    }
    if (names.empty()) {
      if (named && !here.empty()) return TAGMEM_ERROR_TAG_RESIDENT;
      continue;
    }
    if (int s = tagmem_reload(names.data(), names.size(), d)) return s;
  }
  return TAGMEM_SUCCESS;
}

// The host address of the CPU copy of [ptr, ptr + size) — the backup of a paused tag, or the copy
// a retaining resume kept — or NULL when there is none or it is not one contiguous piece.
TMS_EXPORT uint8_t* tms_get_cpu_backup_pointer(const uint8_t* ptr, uint64_t size) {
  void* host = nullptr;
  size_t bytes = 0;
  if (tagmem_host_view(ptr, 0, &host, &bytes) != TAGMEM_SUCCESS || bytes < size) return nullptr;
  return static_cast<uint8_t*>(host);
}
