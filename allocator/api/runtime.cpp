// runtime.cpp — the one process-wide registry and its lifetime (see runtime.hpp).
#include "api/runtime.hpp"

#include <atomic>
#include <mutex>

#include "registry/registry.hpp"

namespace tagmem::runtime {
namespace {

std::shared_mutex g_lifetime;  // shared: a hold; exclusive: start and stop
// Written under g_lifetime held exclusively; atomic for store_if_started, which reads it
// without the lock.
std::atomic<registry*> g_registry{nullptr};

}  // namespace

hold::hold() {
  for (;;) {
    std::shared_lock lock(g_lifetime);
    if (registry* r = g_registry.load()) {
      lock_ = std::move(lock);
      r_ = r;
      return;
    }
    lock.unlock();
    std::unique_lock create(g_lifetime);
    if (!g_registry.load()) g_registry.store(new registry(make_config(nullptr)));
  }
}

const config& hold::settings() const noexcept { return r_->settings(); }

device& hold::dev(int ordinal) const { return r_->dev(ordinal); }

host_store& hold::store() const { return r_->store(); }

void start(const config& cfg) {
  std::unique_lock lock(g_lifetime);
  TAGMEM_EXPECTS(!g_registry.load(), TAGMEM_ERROR_INVALID_ARGUMENT,
                 "tagmem is already initialised; call tagmem_shutdown() first");
  g_registry.store(new registry(cfg));
}

void stop() {
  std::unique_lock lock(g_lifetime);
  if (const external_tag* t = registered_external_tag(); t && g_registry.load()) {
    std::string why = t->keeps_runtime();
    TAGMEM_EXPECTS(why.empty(), TAGMEM_ERROR_TAG_OFFLOADED, "tagmem_shutdown: " + why);
  }
  delete g_registry.exchange(nullptr);
}

namespace {

// Runs f(holds) under a hold when the runtime exists; `none` otherwise.
template <class R, class F>
R if_started(R none, F&& f) {
  std::shared_lock lock(g_lifetime);
  registry* r = g_registry.load();
  return r ? f(r->held_by_nccl()) : none;
}

}  // namespace

namespace nccl_hold {

std::optional<CUresult> retain(CUdeviceptr address, CUmemGenericAllocationHandle* handle,
                               const std::function<CUresult()>& retain) {
  return if_started(std::optional<CUresult>{},
                    [&](nccl_holds& h) { return h.retain(address, handle, retain); });
}
bool retained(CUmemGenericAllocationHandle h) {
  return if_started(false, [&](nccl_holds& n) { return n.retained(h); });
}
bool exported(CUmemGenericAllocationHandle h) {
  return if_started(false, [&](nccl_holds& n) { return n.exported(h); });
}
bool released(CUmemGenericAllocationHandle h) {
  return if_started(false, [&](nccl_holds& n) { return n.released(h); });
}
bool mapped(CUmemGenericAllocationHandle h, CUdeviceptr va) {
  return if_started(false, [&](nccl_holds& n) { return n.mapped(h, va); });
}
void unmapped(CUdeviceptr va, std::size_t size) {
  if_started(0, [&](nccl_holds& n) { return n.unmapped(va, size), 0; });
}
void pinned(CUdeviceptr va, std::size_t size, const char* by) {
  if_started(0, [&](nccl_holds& n) { return n.pinned(va, size, by), 0; });
}
void registered(const void* comm, const void* reg, CUdeviceptr base, std::size_t size) {
  if_started(0, [&](nccl_holds& n) { return n.registered(comm, reg, base, size), 0; });
}
void deregistered(const void* comm, const void* reg, bool graphs_may_share) {
  if_started(0, [&](nccl_holds& n) { return n.deregistered(comm, reg, graphs_may_share), 0; });
}

}  // namespace nccl_hold

host_store* store_if_started() noexcept {
  registry* r = g_registry.load();
  return r ? r->existing_store() : nullptr;
}

CUresult synchronize_device(int device) noexcept {
  const driver::table& d = driver::api();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (CUresult r = d.cuDeviceGet(&dev, device); r != CUDA_SUCCESS) return r;
  if (CUresult r = d.cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS) return r;
  // Current for the wait, as tagmem's own waits make it, so that the wait means the same
  // whether the driver's cuCtxSynchronize acts on its argument or on the current context.
  CUcontext previous = nullptr;
  CUresult r = d.cuCtxGetCurrent(&previous);
  bool switched = false;
  if (r == CUDA_SUCCESS && previous != ctx) {
    r = d.cuCtxSetCurrent(ctx);
    switched = r == CUDA_SUCCESS;
  }
  if (r == CUDA_SUCCESS) r = d.cuCtxSynchronize(ctx);
  if (switched) d.cuCtxSetCurrent(previous);
  d.cuDevicePrimaryCtxRelease(dev);
  return r;
}

}  // namespace tagmem::runtime
