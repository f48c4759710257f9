// records.hpp — what the shim knows about NCCL's physical allocations (the `nccl` tag).
//
// One record per device-located allocation made through the wrapped driver entry points:
// created by cuMemCreate, imported from another process, or served by the shim to cuMemAlloc.
// A record keeps what resume needs to rebuild it exactly: the allocation's properties, every
// mapping (address, size, offset) with the access rights last set on it, the references the
// application holds, and — for matching across processes — duplicates of the POSIX fds handed
// out or taken in (Note [matching shared allocations] in collective.cpp).
//
// Note [virtual handles]: the application (NCCL) keeps allocation handles in its own structures
// and uses them long after a resume, when the driver's handle is a new one. So it never sees the
// driver's handle of a recorded allocation: it gets a value of the shim's own (kVisibleTag | id,
// far outside the driver's handle values), and every wrapped call translates it. The shim holds
// one driver reference while the application holds any (create, import and retain add one,
// release removes one), so the driver's reference count needs no replay on resume. A handle the
// shim does not know passes through untouched.
//
// All access goes through the table's mutex; the wrapped calls hold it across their driver call
// so that a pause never sees half an operation.
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "api/runtime.hpp"
#include "peers/process_identity.hpp"

namespace tagmem::nccl {

using peers::process_identity;

inline constexpr std::uint64_t kVisibleTag = 0x7a67000000000000ull;  // Note [virtual handles]

enum class origin : std::uint8_t { created, imported, classic };

struct mapping_record {
  CUdeviceptr va = 0;
  std::size_t size = 0;
  std::size_t offset = 0;
  meta_vector<CUmemAccessDesc> access;  // one entry per location, the flags last set
};

// A duplicate of a POSIX fd the allocation was exported as, kept to match it with the peer
// that imports it (Note [matching shared allocations] in collective.cpp).
struct export_record {
  int fd = -1;
  bool matched = false;  // this process found a process of the group holding it
};

struct allocation : meta_object {
  std::uint64_t id = 0;  // unique in this process, never reused
  origin from = origin::created;
  CUmemGenericAllocationHandle visible = 0;  // what the application holds
  CUmemGenericAllocationHandle real = 0;     // the driver's handle; 0 while released
  bool real_held = false;                    // the shim holds a driver reference on `real`
  std::size_t size = 0;                      // imported: the largest mapped extent
  CUmemAllocationProp prop{};
  // The device this process works with the allocation from: the location for one created
  // here; for an import, the device of the context that imported it (never the exporter's,
  // whose primary context this process must not create). -1 when unknown.
  int home_device = -1;
  int app_refs = 1;  // the application's references (Note [virtual handles])
  meta_vector<mapping_record> mappings;
  meta_vector<export_record> exports;  // fds handed out since the last release
  int import_fd = -1;                  // dup of the fd imported, until matched
  bool exported_ever = false;          // a POSIX fd was handed out at some time
  bool foreign_export = false;         // exported as a non-POSIX handle: cannot be re-shared
  bool multicast = false;              // bound to a multicast object (NVLS): cannot be rebuilt
  bool dma_buf = false;                // exported as a dma-buf (a NIC registers it): cannot move
  // Imported: the owner, set by a pause's matching — its rank in that pause, its record id and
  // its process, which must be rank `source_rank` again in every later pause and resume.
  int source_rank = -1;
  std::uint64_t source_id = 0;
  process_identity source_process;
  // Created here and exported: the processes found to hold one of its fds, the only ones whose
  // claims on it are served (Note [matching shared allocations] in collective.cpp).
  meta_vector<process_identity> importers;
  // While released.
  bool released = false;
  meta_vector<host_extent> backup;  // created/classic: the bytes
  CUdeviceptr classic_base = 0;     // classic: the VA range the shim reserved
  std::size_t classic_span = 0;
};

class record_table {
 public:
  std::mutex& mutex() noexcept { return mutex_; }

  // A new record with a fresh visible handle; the caller fills the rest.
  allocation& add(origin from, CUmemGenericAllocationHandle real, std::size_t size,
                  const CUmemAllocationProp& prop);
  allocation* by_visible(CUmemGenericAllocationHandle handle);
  allocation* by_id(std::uint64_t id);
  // The record with a mapping that contains `address`, and that mapping.
  allocation* by_address(CUdeviceptr address, mapping_record** mapping = nullptr);
  // Records with a mapping that starts inside [va, va + size), each once.
  meta_vector<allocation*> mapped_in(CUdeviceptr va, std::size_t size);

  void add_mapping(allocation& a, CUdeviceptr va, std::size_t size, std::size_t offset);
  void remove_mapping(allocation& a, CUdeviceptr va);
  // Forgets a record: closes its fds and gives its backup back (backup_extents.hpp).
  void erase(allocation& a) noexcept;
  // Erases the record if the application can no longer reach it (no reference, no mapping).
  bool erase_if_unreachable(allocation& a) noexcept;

  template <class F>
  void for_each(F&& f) {
    for (auto& [id, a] : by_id_) f(*a);
  }
  std::size_t size() const noexcept { return by_id_.size(); }

 private:
  std::mutex mutex_;
  std::uint64_t next_id_ = 1;
  meta_map<std::uint64_t, std::unique_ptr<allocation>> by_id_;
  meta_map<CUdeviceptr, allocation*> by_va_;  // mapping start -> record
};

record_table& records();

// Closes an fd we own, keeping errno.
void close_quietly(int fd) noexcept;

}  // namespace tagmem::nccl
