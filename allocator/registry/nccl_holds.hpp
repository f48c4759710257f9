// nccl_holds.hpp — tagged memory that NCCL holds outside tagmem, and the offloads it refuses.
//
// Note [nccl holds]: NCCL's buffer registration (ncclCommRegister, and the registration it does
// on its own when a CUDA graph captures a collective, NCCL_GRAPH_REGISTER) takes the physical
// memory under a user buffer with cuMemRetainAllocationHandle, exports it as a POSIX fd to each
// peer process of the node (whose proxy thread imports and maps it at an address of its own) or,
// for a peer in the same process, maps the handle a second time itself; NVLS binds it to a
// multicast object and GPUDirect RDMA takes a dma-buf of it. Unmapping the tag's memory and
// mapping new memory at the same addresses would leave every such holder on the old pages: a
// peer reads and writes memory nobody sees any more (or a later allocation that recycles it),
// and a CUDA graph replayed after the reload waits for data that never arrives. So while any
// hold exists, an offload or swap-out of the tag is refused with PEER, naming the tag, the
// memory and the hold (the ipc refusal's rule, Note [ipc] in handoff/ipc_server.hpp).
//
// The LD_PRELOAD shim routes NCCL's driver calls and reports them here, per physical part of a
// tag: a retain (until NCCL releases the handle again — NCCL 2.28 does so right after the
// export), an export (until the buffer's registration ends: the application's
// ncclCommDeregister of the last registration over the part, which NCCL answers only after the
// peers unmapped), a mapping of the handle in this process (until NCCL unmaps it), a multicast
// binding or dma-buf (for as long as the process runs: their end is not seen). An export made
// while no ncclCommRegister registration covered the part came from a CUDA graph's registration,
// which ends when the graph is destroyed, unseen here: it too holds for as long as the process
// runs. A graph captured over a buffer registered with ncclCommRegister shares that registration
// (no new export): once any CUDA graph was captured in the process (and NCCL_GRAPH_REGISTER is
// not 0), a deregistration no longer ends an export's hold. Thread-safe; the mutex is a leaf
// under the tags' locks.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "host/metadata_heap.hpp"

namespace tagmem {

class tag;

class nccl_holds {
 public:
  // Runs `retain` (the driver's cuMemRetainAllocationHandle at `address`, writing `*handle`)
  // with the tag that owns `address` locked, so that no offload runs between the retain and its
  // record, and records the hold. nullopt, without running it, when no tag owns `address`.
  std::optional<CUresult> retain(std::uint64_t address, CUmemGenericAllocationHandle* handle,
                                 const std::function<CUresult()>& retain);
  // NCCL retained again (at another address that maps it: its own second mapping) / exported /
  // released / mapped at `va` a handle it retained. False for other handles.
  bool retained(CUmemGenericAllocationHandle h);
  bool exported(CUmemGenericAllocationHandle h);
  bool released(CUmemGenericAllocationHandle h);
  bool mapped(CUmemGenericAllocationHandle h, std::uint64_t va);
  // NCCL unmapped [va, va + size): ends the mappings of held handles that start there.
  void unmapped(std::uint64_t va, std::size_t size);
  // A multicast binding or dma-buf over [va, va + size) (`by` names it): holds every tagged
  // part it touches.
  void pinned(std::uint64_t va, std::size_t size, const char* by);
  // The application's ncclCommRegister / ncclCommDeregister of [base, base + size) with
  // communicator `comm`, which returned registration `reg` (NCCL counts repeated registrations
  // of one range in one `reg`). Registrations of untagged memory are not kept.
  // `graphs_may_share`: a CUDA graph captured in this process may have taken its own reference
  // to the registration, which keeps the peers' mappings past the deregistration, unseen: the
  // exports under it then hold for as long as the process runs.
  void registered(const void* comm, const void* reg, std::uint64_t base, std::size_t size);
  void deregistered(const void* comm, const void* reg, bool graphs_may_share);

  // Throws PEER when NCCL holds memory of one of `tags` (their locks held by the caller).
  void refuse(const meta_vector<tag*>& tags, const char* operation);

 private:
  struct part_hold {
    tag* owner = nullptr;
    std::uint64_t va = 0;  // the tag's physical part: where it is mapped, its size, its handle
    std::size_t bytes = 0;
    CUmemGenericAllocationHandle handle = 0;
    int retains = 0;                       // NCCL's references not yet released
    bool registered_export = false;        // exported under an ncclCommRegister registration
    bool graph_export = false;             // exported under none: a CUDA graph's registration
    meta_vector<std::uint64_t> mapped_at;  // NCCL's own mappings of the handle here
    const char* pinned_by = nullptr;
    bool held() const {
      return retains > 0 || registered_export || graph_export || !mapped_at.empty() || pinned_by;
    }
  };
  struct registration {
    const void* comm;
    const void* reg;
    std::uint64_t base;
    std::size_t size;
    int count;
  };
  // The part of a tag's mapping that holds `address`; the tag's lock held. False when none.
  static bool part_at(tag& t, std::uint64_t address, part_hold& out);
  part_hold* by_handle(CUmemGenericAllocationHandle h);
  bool covered(const part_hold& p) const;
  static std::string describe(const part_hold& p);

  std::mutex mutex_;
  // One per physical part NCCL ever retained, kept once nothing holds it: NCCL maps a handle
  // for a peer in its own process after it released its reference (the value identifies it).
  meta_vector<part_hold> parts_;
  meta_vector<registration> registrations_;
};

}  // namespace tagmem
