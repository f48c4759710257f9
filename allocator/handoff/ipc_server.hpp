// ipc_server.hpp — tagged memory that other processes of the user map: the exporting side.
//
// Note [ipc]: tagmem_ipc_export names a tagged range with a 64-byte handle (ipc_messages.hpp)
// that any channel may carry (a pickle, a queue, a cudaIpcMemHandle_t under the shim). A process
// of the same user that opens it (ipc_import.hpp) connects to the exporter's socket in the
// user's private directory (ipc-<pid>.sock, a peers::rendezvous_listener), is checked as a
// handoff peer is (trust.hpp: uid and pid from SO_PEERCRED, start time, GPU, and the job where
// both have one: Note [ipc without a job] in registry/registry_ipc.cpp) and must show
// the export's random secret; only then does the exporter export the physical handles behind the
// range as POSIX fds and send them. The importer maps them at an address of its own: the same
// physical memory, no copy.
//  - Lifetime: the importer keeps its connection while it maps the range and says CLOSE when it
//    unmaps; a connection that ends (the importer exited or was killed) ends its import here too.
//    An import holds its own reference to the physical memory, so the exporter exiting or
//    shutting tagmem down never takes the pages from under an importer.
//  - Offload: a tag whose memory a live import maps cannot be offloaded or swapped out: the
//    offload fails with PEER naming the importing process (registry.cpp). Unmapping pages that
//    another process still maps would leave it on the old pages while the tag reloads onto new
//    ones: silently stale. An export that nobody maps does not hold its tag; opening it while the
//    tag is offloaded is refused (TAG_OFFLOADED), and after a reload maps the memory there is now.
//  - Free: freeing an exported allocation forgets its exports (later opens are refused). While a
//    live import maps any of it, the freed allocation is held out of the pool (Note [free while
//    imported] in registry/registry_ipc.cpp), so no later allocation of the exporter lands on
//    pages another process still reads and writes; it goes back to the pool when the last such
//    import ends (imports_ended below).
// One server per process, created by the first export; its thread serves one connection at a
// time, every wait bounded by TAGMEM_HANDOFF_TIMEOUT_MS.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "handoff/ipc_messages.hpp"
#include "peers/rendezvous_point.hpp"
#include "peers/unix_channel.hpp"

namespace tagmem::handoff {

struct ipc_importer {
  peers::process_identity who;
  std::uint64_t ptr = 0;
  std::uint64_t bytes = 0;
};

// Where the exports of a process live: the physical memory behind a range, now.
class ipc_source {
 public:
  virtual ~ipc_source() = default;
  // Exports, as POSIX fds appended to `fds`, the physical handles behind [ptr, ptr + bytes) and
  // says where the range lies in them; calls `live` while the memory cannot change under it (no
  // offload can start until it returns). Throws with the reason the importer will read.
  virtual ipc_mapped export_parts(std::uint64_t ptr, std::uint64_t bytes, peers::owned_fds& fds,
                                  const std::function<void()>& live) = 0;
  // Called on the server's thread, holding none of its locks, after imports ended; `live` are the
  // imports left (read after they ended).
  virtual void imports_ended(const std::vector<ipc_importer>& live) noexcept = 0;
};

struct ipc_server_counters {
  std::uint64_t exports = 0;    // now
  std::uint64_t importers = 0;  // now: live imports of this process's exports
  std::uint64_t opened = 0;     // ever
  std::uint64_t refused = 0;    // ever: not of this user or job, wrong secret, gone export
};

class ipc_server {
 public:
  // Listens in `dir` and starts the thread. Throws PEER.
  ipc_server(ipc_source& source, std::string job, const std::string& dir, int timeout_ms);
  ~ipc_server();  // stops; live imports keep their pages
  ipc_server(const ipc_server&) = delete;
  ipc_server& operator=(const ipc_server&) = delete;

  // The handle of [ptr, ptr + bytes) on the GPU `uuid` mapped in units of `granularity`; the
  // same range exported again gives the same handle.
  ipc_handle add(std::uint64_t ptr, std::uint64_t bytes, const gpu_uuid& uuid,
                 std::uint64_t granularity);
  // Forgets an export; false when there is none with that id and secret.
  bool remove(std::uint64_t id, const ipc_secret& secret);
  // Forgets the exports inside [base, base + size) (freed memory).
  void forget_within(std::uint64_t base, std::uint64_t size);
  std::vector<ipc_importer> importers() const;
  // Whether any import is live, without the lock: an import is counted before the importer
  // receives its handles, under the exporting tag's lock (ipc_source::export_parts), so a reader
  // holding that tag's lock never misses one of its memory; a stale "yes" only costs the caller
  // a look at importers().
  bool any_importer() const noexcept { return live_count_.load(std::memory_order_acquire) != 0; }
  ipc_server_counters counters() const;

 private:
  struct record {
    std::uint64_t id = 0, ptr = 0, bytes = 0, granularity = 0;
    ipc_secret secret{};
    gpu_uuid uuid{};
  };
  struct session {
    std::unique_ptr<peers::unix_channel> ch;
    int fd = -1;
    std::uint64_t key = 0;
  };
  void run() noexcept;
  void serve_open(session& s);  // throws: the session ends
  void end(std::uint64_t key) noexcept;
  void after_end() noexcept;  // tells the source which imports are left

  ipc_source& source_;
  std::string job_;
  int timeout_ms_;
  std::unique_ptr<peers::rendezvous_listener> listener_;
  mutable std::mutex mutex_;  // the fields below
  std::vector<record> records_;
  std::vector<std::pair<std::uint64_t, ipc_importer>> live_;  // session key -> import
  std::atomic<std::size_t> live_count_{0};                    // live_.size()
  std::uint64_t next_id_ = 1;
  ipc_server_counters stats_;
  bool stop_ = false;
  int wake_fd_ = -1;
  std::thread thread_;
};

// The socket an exporter of pid `pid` listens on in `dir`. Throws INVALID_ARGUMENT when too long.
peers::rendezvous_paths ipc_point(const std::string& dir, pid_t pid);

}  // namespace tagmem::handoff
