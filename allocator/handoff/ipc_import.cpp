// ipc_import.cpp — mapping another process's exported tagged range (see header).
#include "handoff/ipc_import.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "handoff/ipc_server.hpp"
#include "peers/messages.hpp"

namespace tagmem::handoff {
namespace {

int find_device(const gpu_uuid& uuid, CUdevice* out) {
  int count = 0;
  TAGMEM_CU(cuDeviceGetCount, &count);
  for (int i = 0; i < count; ++i) {
    CUdevice d = 0;
    CUuuid u{};
    TAGMEM_CU(cuDeviceGet, &d, i);
    TAGMEM_CU(cuDeviceGetUuid, &u, d);
    if (std::memcmp(u.bytes, uuid.data(), uuid.size()) == 0) {
      *out = d;
      return i;
    }
  }
  fail(TAGMEM_ERROR_INVALID_ARGUMENT, "the exporting process's GPU " + uuid_hex(uuid) +
                                          " is not visible in this process (CUDA_VISIBLE_DEVICES)");
}

CUmemAllocationProp prop_for(int ordinal) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = ordinal;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// A connected socket to the exporter, checked to be held by the process the handle names.
std::unique_ptr<peers::unix_channel> connect_owner(const ipc_handle& h, const std::string& dir) {
  const peers::rendezvous_paths p = ipc_point(dir, h.owner.pid);
  const std::string them = "process " + std::to_string(h.owner.pid);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  TAGMEM_EXPECTS(fd >= 0, TAGMEM_ERROR_PEER, std::string("socket: ") + std::strerror(errno));
  auto ch = std::make_unique<peers::unix_channel>(fd, "IPC exporter " + them);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, p.socket.c_str(), p.socket.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    fail(TAGMEM_ERROR_PEER,
         them + " exports no tagged memory now (" + std::strerror(errno) + " at '" + p.socket +
             "'): it exited or shut tagmem down, or it uses another TAGMEM_PEER_DIR");
  }
  const peers::peer_credentials cred = ch->credentials();
  TAGMEM_EXPECTS(cred.uid == ::geteuid(), TAGMEM_ERROR_PEER,
                 "the IPC socket of " + them + " is held by uid " + std::to_string(cred.uid));
  TAGMEM_EXPECTS(cred.pid == h.owner.pid && peers::identity_of(cred.pid).same_as(h.owner),
                 TAGMEM_ERROR_PEER,
                 "the handle names " + h.owner.describe() +
                     ", which has exited (its socket is "
                     "held by " +
                     peers::identity_of(cred.pid).describe() + ")");
  return ch;
}

}  // namespace

ipc_import::ipc_import(const ipc_handle& h, const std::string& job, const std::string& dir,
                       int timeout_ms)
    : timeout_ms_(timeout_ms) {
  ordinal_ = find_device(h.uuid, &dev_);
  const CUmemAllocationProp prop = prop_for(ordinal_);
  std::size_t granularity = 0;
  TAGMEM_CU(cuMemGetAllocationGranularity, &granularity, &prop,
            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);

  ch_ = connect_owner(h, dir);
  ipc_open request{{job, h.uuid, granularity, peers::identity_of(::getpid())}, h.id, h.secret};
  ch_->send(kIpcOpen, encode_ipc_open(request), {}, timeout_ms_, "asking for an export");
  peers::message m = ch_->receive(timeout_ms_, "waiting for the exported handles");
  if (m.type == kIpcRefuse) {
    const refuse r =
        peers::decode_from(ch_->peer_name(), "refusal", [&] { return decode_refuse(m.payload); });
    fail(r.status, ch_->peer_name() + " refused: " + r.reason);
  }
  TAGMEM_EXPECTS(m.type == kIpcMapped, TAGMEM_ERROR_PEER,
                 ch_->peer_name() + " answered with something other than handles");
  const ipc_mapped mapped =
      peers::decode_from(ch_->peer_name(), "handles", [&] { return decode_ipc_mapped(m.payload); });
  TAGMEM_EXPECTS(m.fds.size() == mapped.sizes.size(), TAGMEM_ERROR_PEER,
                 ch_->peer_name() + " sent " + std::to_string(m.fds.size()) + " descriptors for " +
                     std::to_string(mapped.sizes.size()) + " handles");
  std::size_t span = 0;
  for (std::uint64_t s : mapped.sizes) {
    TAGMEM_EXPECTS(s % granularity == 0, TAGMEM_ERROR_PEER,
                   ch_->peer_name() + " sent a handle of " + std::to_string(s) +
                       " bytes, not a multiple of " + std::to_string(granularity));
    span += s;
  }

  TAGMEM_CU(cuDevicePrimaryCtxRetain, &ctx_, dev_);
  try {
    context_guard guard(ctx_);
    TAGMEM_CU(cuMemAddressReserve, &base_, span, granularity, 0, 0);
    span_ = span;
    std::size_t at = 0;
    for (std::size_t i = 0; i < mapped.sizes.size(); ++i) {
      CUmemGenericAllocationHandle handle = 0;
      TAGMEM_CU(cuMemImportFromShareableHandle, &handle,
                reinterpret_cast<void*>(static_cast<std::uintptr_t>(m.fds[i])),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      handles_.push_back(handle);
      TAGMEM_CU(cuMemMap, base_ + at, mapped.sizes[i], 0, handle, 0);
      at += mapped.sizes[i];
      mapped_ = at;
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    TAGMEM_CU(cuMemSetAccess, base_, span_, &access, 1);
  } catch (...) {
    unmap();
    throw;
  }
  offset_ = mapped.offset;
  bytes_ = mapped.bytes;
}

void ipc_import::unmap() noexcept {
  const auto& api = driver::api();
  if (ctx_) {
    CUcontext previous = nullptr;
    api.cuCtxGetCurrent(&previous);
    api.cuCtxSetCurrent(ctx_);
    if (mapped_) api.cuMemUnmap(base_, mapped_);
    for (CUmemGenericAllocationHandle h : handles_) api.cuMemRelease(h);
    if (span_) api.cuMemAddressFree(base_, span_);
    api.cuCtxSetCurrent(previous);
    api.cuDevicePrimaryCtxRelease(dev_);
  }
  handles_.clear();
  mapped_ = span_ = 0;
  ctx_ = nullptr;
}

ipc_import::~ipc_import() {
  unmap();
  if (ch_) {
    try {  // the exporter ends the import when the connection ends, CLOSE or not
      ch_->send(kIpcClose, "", {}, timeout_ms_, "closing an import");
    } catch (const std::exception&) {
    }
  }
}

}  // namespace tagmem::handoff
