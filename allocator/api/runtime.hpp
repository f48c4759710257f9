// runtime.hpp — the process-wide runtime, and the one interface that the integrations linked
// with the core (the LD_PRELOAD shim, the NCCL integration) use besides the C ABI.
//
// The runtime is the initialised library: the driver table, each device's state (primary
// context, copy streams, events, created once and then read without a lock), the tags and the
// one pinned host store, sized and capped by the configuration. tagmem_init creates it, or the
// first call that needs it does, from the TAGMEM_* settings; tagmem_shutdown destroys it. Every
// device byte tagmem moves to or from the host goes through a copy_queue into that store,
// whether it is a tag's or NCCL's.
//
// What an integration may use of the core is what this header declares and includes:
//  - runtime::hold: the runtime's devices and host store, for as long as the hold lives;
//  - copy_queue.hpp: copies between a device and host extents, on the device's copy streams;
//  - device.hpp: context_guard and the device's state;
//  - external_tag.hpp: memory held outside the arenas, shown as a tag;
//  - driver/driver.hpp: tagmem's own driver table (never the application's wrapped entry points);
//  - error.hpp, c_error.hpp: failures as tagmem::error, and the C ABI's way of reporting them;
//  - options.hpp: the TAGMEM_* settings; tag_scope.hpp: the calling thread's current tag;
//  - metadata_heap.hpp: the containers tagmem keeps its records in;
//  - observe/log.hpp, observe/trace.hpp: TAGMEM_LOG lines and TAGMEM_TRACE spans.
// Nothing else of allocator/ is part of it.
#pragma once

#include <cuda.h>

#include <functional>
#include <optional>
#include <shared_mutex>

#include "api/c_error.hpp"
#include "api/tag_scope.hpp"
#include "base/error.hpp"
#include "device/device.hpp"
#include "driver/driver.hpp"
#include "host/host_store.hpp"
#include "host/metadata_heap.hpp"
#include "observe/log.hpp"
#include "observe/trace.hpp"
#include "options/config.hpp"
#include "options/options.hpp"
#include "tags/external_tag.hpp"
#include "transfer/copy_queue.hpp"

namespace tagmem {

class registry;

namespace runtime {

// A hold on the runtime: tagmem_shutdown waits until no hold is left. Creating one creates the
// runtime from the TAGMEM_* settings when there is none; that throws what creating it throws
// (NO_DRIVER, DRIVER, INVALID_ARGUMENT). Thread-safe; holds may nest on one thread only while no
// tagmem_init or tagmem_shutdown can be waiting (the C ABI never nests them).
class hold {
 public:
  hold();
  hold(const hold&) = delete;
  hold& operator=(const hold&) = delete;

  registry& core() const noexcept { return *r_; }
  const config& settings() const noexcept;
  // The device, created on first use. Throws INVALID_ARGUMENT (no such device), DRIVER.
  device& dev(int ordinal) const;
  // The pinned host store. Throws DRIVER when device 0 cannot be set up.
  host_store& store() const;

 private:
  std::shared_lock<std::shared_mutex> lock_;
  registry* r_ = nullptr;
};

// tagmem_init: creates the runtime with `cfg`. Throws INVALID_ARGUMENT when it exists.
void start(const config& cfg);
// tagmem_shutdown: destroys the runtime, if any. Throws TAG_OFFLOADED, and destroys nothing,
// while the external tag keeps it (its bytes are in the host store).
void stop();

// The host store when the runtime and its store exist, else nullptr; no hold is taken. For an
// integration that must give back host extents it holds: while it holds any, the external tag
// keeps the runtime (stop() refuses), so the store cannot go away under it.
host_store* store_if_started() noexcept;

// Blocks until all work queued in `device`'s primary context has finished (the wait CUDA's
// cudaFree performs). The calling thread's current context is left as it was. Needs no hold:
// it retains the primary context for the wait only. Returns the driver's error (a sticky error
// of earlier work, CUDA_ERROR_INVALID_VALUE for a bad ordinal); never throws; thread-safe.
CUresult synchronize_device(int device) noexcept;

// Tagged memory NCCL holds outside tagmem, reported by the LD_PRELOAD shim for NCCL's driver
// calls and the application's registrations: while NCCL holds a tag's memory, offloading or
// swapping the tag out is refused (Note [nccl holds] in registry/nccl_holds.hpp). Each call
// does nothing (nullopt, false) when the runtime does not exist: no memory is tagged then.
// Thread-safe; they throw std::bad_alloc only.
namespace nccl_hold {
// Runs `retain` (the driver's cuMemRetainAllocationHandle at `address`, writing `*handle`)
// with the owning tag locked and records the reference; nullopt (not run) for untagged memory.
std::optional<CUresult> retain(CUdeviceptr address, CUmemGenericAllocationHandle* handle,
                               const std::function<CUresult()>& retain);
bool retained(CUmemGenericAllocationHandle h);  // false: not a handle NCCL retained
bool exported(CUmemGenericAllocationHandle h);
bool released(CUmemGenericAllocationHandle h);
bool mapped(CUmemGenericAllocationHandle h, CUdeviceptr va);
void unmapped(CUdeviceptr va, std::size_t size);
void pinned(CUdeviceptr va, std::size_t size, const char* by);  // multicast, dma-buf
void registered(const void* comm, const void* reg, CUdeviceptr base, std::size_t size);
void deregistered(const void* comm, const void* reg, bool graphs_may_share);
}  // namespace nccl_hold

}  // namespace runtime
}  // namespace tagmem
