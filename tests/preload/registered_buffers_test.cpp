// registered_buffers_test.cpp — tagged memory that NCCL registered and shared cannot be
// offloaded while NCCL holds it, and can again once the hold ends (Note [nccl holds] in
// allocator/registry/nccl_holds.hpp).
//
// Rank 0 allocates a buffer in a tag of its own (tagmem's C ABI, exported by the shim), registers
// it with ncclCommRegister (tagmem_fake_nccl behind the shim's interposer) and does what NCCL
// 2.28's P2P registration does at the first collective on it, through the driver entry points
// the shim hands NCCL: cuMemRetainAllocationHandle at the buffer, one POSIX fd exported per peer
// process, the reference released; each peer imports the fd and maps it at an address of its
// own. While peers map it, offloading or swapping the tag out must fail with PEER naming the tag
// and the registration, and change nothing: both sides keep reading and writing the same bytes.
// The peers then unmap (what NCCL does inside ncclCommDeregister) and, once the last
// registration over the buffer is gone, the offload succeeds and the reload brings back every
// byte, the peers' writes included. Each process checks it kept no descriptor.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nccl_way.hpp"
#include "peer.hpp"
#include "tagmem/tagmem.h"

extern "C" int ncclCommRegister(void* comm, void* buff, size_t size, void** handle);
extern "C" int ncclCommDeregister(void* comm, void* handle);

namespace tagmem::preload_test {
namespace {

constexpr std::size_t kBytes = 2ull << 20;  // one physical chunk (TAGMEM_CHUNK_BYTES)

// A peer: maps what it is sent, reads, writes and unmaps on request.
TAGMEM_PEER_SCENARIO(registered_peer) {
  control& c = args.channel;
  try {
    use_device(0);
    const long fds_before = open_descriptors();
    buffer mapped;
    for (;;) {
      std::vector<int> fds;
      std::istringstream in(c.receive(&fds));
      std::string verb;
      std::uint64_t seed = 0;
      std::size_t offset = 0, n = 0;
      in >> verb >> seed >> offset >> n;
      if (verb == "map") {
        mapped = import_buffer(0, fds.at(0), n);
        ::close(fds[0]);
        c.send("mapped");
      } else if (verb == "expect") {
        c.send(read_bytes(mapped, offset, n) == pattern(seed, n) ? "same" : "different");
      } else if (verb == "write") {
        write_bytes(mapped, offset, pattern(seed, n));
        c.send("written");
      } else if (verb == "unmap") {
        free_buffer(mapped);
        c.send(open_descriptors() == fds_before ? "unmapped" : "descriptor left");
      } else {
        return verb == "exit" ? 0 : 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[registered_peer] %s\n", e.what());
    return 1;
  }
}

// A process that registers and exports a tagged buffer, begins a CUDA graph capture and then
// deregisters the buffer: the offload must stay refused unless NCCL_GRAPH_REGISTER=0 (a graph
// captured here may share the registration, keeping the peers' mappings past the
// deregistration). Exits 0 when it got what it expected.
TAGMEM_PEER_SCENARIO(capturing_owner) {
  (void)args;
  try {
    use_device(0);
    const char* graph_register = std::getenv("NCCL_GRAPH_REGISTER");
    const bool graphs_may_share = !(graph_register && std::strcmp(graph_register, "0") == 0);
    auto fn = [](const char* name) { return dlsym(RTLD_DEFAULT, name); };
    auto malloc_tagged =
        reinterpret_cast<decltype(&tagmem_malloc_tagged)>(fn("tagmem_malloc_tagged"));
    auto offload = reinterpret_cast<decltype(&tagmem_offload)>(fn("tagmem_offload"));
    const std::string tag = unique_group("cap").substr(0, 40);
    void* p = nullptr;
    if (malloc_tagged(&p, kBytes, tag.c_str(), 0, nullptr) != TAGMEM_SUCCESS) return 2;
    void* reg = nullptr;
    int comm = 0;
    if (ncclCommRegister(&comm, p, kBytes, &reg) != 0) return 3;
    CUmemGenericAllocationHandle h = 0;
    int fd = -1;
    if (nccl().cuMemRetainAllocationHandle(&h, p) != CUDA_SUCCESS ||
        nccl().cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
            CUDA_SUCCESS ||
        nccl().cuMemRelease(h) != CUDA_SUCCESS)
      return 4;
    ::close(fd);
    if (cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) != cudaSuccess) return 5;
    if (ncclCommDeregister(&comm, reg) != 0) return 6;
    const char* names[] = {tag.c_str()};
    const tagmem_status s = offload(names, 1, 0, TAGMEM_BACKUP);
    const std::string message = shim().last_error();
    const bool refused = s == TAGMEM_ERROR_PEER && message.find("CUDA graph") != std::string::npos;
    std::fprintf(stderr, "[capturing_owner] offload: %s %s\n", shim().status_string(s),
                 message.c_str());
    return refused == graphs_may_share ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[capturing_owner] %s\n", e.what());
    return 7;
  }
}

struct core {
  decltype(&tagmem_malloc_tagged) malloc_tagged;
  decltype(&tagmem_free) free;
  decltype(&tagmem_offload) offload;
  decltype(&tagmem_reload) reload;
  decltype(&tagmem_swap) swap;
};

const core& api() {
  static const core c = [] {
    auto fn = [](const char* name) {
      void* f = dlsym(RTLD_DEFAULT, name);
      if (!f) throw std::runtime_error(std::string(name) + ": run under libtagmem_preload.so");
      return f;
    };
    core k;
    k.malloc_tagged = reinterpret_cast<decltype(k.malloc_tagged)>(fn("tagmem_malloc_tagged"));
    k.free = reinterpret_cast<decltype(k.free)>(fn("tagmem_free"));
    k.offload = reinterpret_cast<decltype(k.offload)>(fn("tagmem_offload"));
    k.reload = reinterpret_cast<decltype(k.reload)>(fn("tagmem_reload"));
    k.swap = reinterpret_cast<decltype(k.swap)>(fn("tagmem_swap"));
    return k;
  }();
  return c;
}

// The bytes of the physical chunk mapped at `va` from there on: the emulator maps each physical
// allocation's memfd at its device address, one host mapping each (what NCCL asks of
// cuMemGetAddressRange, which the emulator does not offer).
std::size_t chunk_bytes_at(CUdeviceptr va) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &lo, &hi) == 2 && lo <= va && va < hi)
      return static_cast<std::size_t>(hi - va);
  }
  throw std::runtime_error("no mapping at the buffer");
}

class NcclRegistered : public ::testing::Test {
 protected:
  void SetUp() override {
    use_device(0);
    tag_ = unique_group("reg").substr(0, 40);
    void* p = nullptr;
    ASSERT_EQ(api().malloc_tagged(&p, kBytes, tag_.c_str(), 0, nullptr), TAGMEM_SUCCESS)
        << shim().last_error();
    mine_.va = reinterpret_cast<CUdeviceptr>(p);
    mine_.size = kBytes;
    expected_ = pattern(0x7265'6701, kBytes);
    write_bytes(mine_, 0, expected_);
  }
  void TearDown() override {
    if (mine_.va) {
      EXPECT_EQ(api().free(reinterpret_cast<void*>(mine_.va), nullptr), TAGMEM_SUCCESS);
    }
  }

  tagmem_status offload() {
    const char* names[] = {tag_.c_str()};
    return api().offload(names, 1, 0, TAGMEM_BACKUP);
  }
  // Refused with PEER, naming the tag and `why`; nothing moved.
  void expect_refused(const char* why) {
    const char* names[] = {tag_.c_str()};
    for (bool swap : {false, true}) {
      const tagmem_status s = swap ? api().swap(names, 1, nullptr, 0, 0, TAGMEM_BACKUP) : offload();
      ASSERT_EQ(s, TAGMEM_ERROR_PEER) << (swap ? "swap: " : "offload: ") << shim().last_error();
      const std::string message = shim().last_error();
      EXPECT_NE(message.find("'" + tag_ + "'"), std::string::npos) << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
    }
    EXPECT_EQ(read_bytes(mine_, 0, kBytes), expected_) << "the refused offload changed bytes";
  }
  void expect_offload_and_reload() {
    const char* names[] = {tag_.c_str()};
    ASSERT_EQ(offload(), TAGMEM_SUCCESS) << shim().last_error();
    EXPECT_FALSE(readable(mine_.va)) << "the offloaded tag is still mapped";
    ASSERT_EQ(api().reload(names, 1, 0), TAGMEM_SUCCESS) << shim().last_error();
    EXPECT_EQ(read_bytes(mine_, 0, kBytes), expected_) << "a byte changed over offload and reload";
  }
  // NCCL's P2P registration at the first collective: retain, export one fd, release. The fd is
  // the caller's.
  int export_like_nccl() {
    CUmemGenericAllocationHandle h = 0;
    EXPECT_EQ(nccl().cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(mine_.va)),
              CUDA_SUCCESS);
    int fd = -1;
    EXPECT_EQ(
        nccl().cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        CUDA_SUCCESS);
    EXPECT_EQ(nccl().cuMemRelease(h), CUDA_SUCCESS);
    return fd;
  }
  void share_with(peer_process& p) {
    const int fd = export_like_nccl();
    p.channel().send("map 0 0 " + std::to_string(chunk_bytes_at(mine_.va)), {fd});
    ::close(fd);
    p.channel().expect("mapped");
  }
  // Peer `p` writes its own stretch, which rank 0 must see; then both agree on all of it.
  void write_through(peer_process& p, std::uint64_t seed, std::size_t offset, std::size_t n) {
    p.channel().send("write " + std::to_string(seed) + " " + std::to_string(offset) + " " +
                     std::to_string(n));
    p.channel().expect("written");
    const std::vector<unsigned char> bytes = pattern(seed, n);
    std::copy(bytes.begin(), bytes.end(), expected_.begin() + static_cast<long>(offset));
    EXPECT_EQ(read_bytes(mine_, 0, kBytes), expected_) << "rank 0 does not see the peer's write";
  }
  void peer_sees_all(peer_process& p) {
    const std::uint64_t seed = 0x5eed'0000 + static_cast<std::uint64_t>(p.pid());
    expected_ = pattern(seed, kBytes);
    write_bytes(mine_, 0, expected_);
    p.channel().send("expect " + std::to_string(seed) + " 0 " + std::to_string(kBytes));
    p.channel().expect("same");
  }
  void unmap_and_exit(peer_process& p) {
    p.channel().send("unmap");
    p.channel().expect("unmapped");
  }
  void finish(peer_process& p) {
    p.channel().send("exit");
    EXPECT_EQ(p.wait(), 0) << "the peer's checks failed (its messages are on stderr)";
  }

  std::string tag_;
  buffer mine_;
  std::vector<unsigned char> expected_;
  int comm_a_ = 0, comm_b_ = 0;  // two communicators' addresses stand for them
};

TEST_F(NcclRegistered, OffloadRefusedWhileAPeerMapsItAndDoneAfterDeregister) {
  peer_process peer("registered_peer", unique_group("regpeer"));
  const long fds_before = open_descriptors();
  void* reg = nullptr;
  ASSERT_EQ(ncclCommRegister(&comm_a_, reinterpret_cast<void*>(mine_.va), kBytes, &reg), 0);
  share_with(peer);
  expect_refused("ncclCommRegister");
  write_through(peer, 0x11, kBytes / 4, kBytes / 4);
  peer_sees_all(peer);
  expect_refused("ncclCommRegister");
  unmap_and_exit(peer);  // NCCL's deregistration: the peer unmaps, then the call returns
  ASSERT_EQ(ncclCommDeregister(&comm_a_, reg), 0);
  EXPECT_EQ(open_descriptors(), fds_before) << "a descriptor of the export was left open";
  expect_offload_and_reload();
  finish(peer);
}

TEST_F(NcclRegistered, TwoPeersAndTwoRegistrationsHoldItUntilTheLastEnds) {
  void* reg_a = nullptr;
  void* reg_b = nullptr;
  ASSERT_EQ(ncclCommRegister(&comm_a_, reinterpret_cast<void*>(mine_.va), kBytes, &reg_a), 0);
  ASSERT_EQ(ncclCommRegister(&comm_b_, reinterpret_cast<void*>(mine_.va + kBytes / 2), kBytes / 2,
                             &reg_b),
            0);
  peer_process first("registered_peer", unique_group("regpeer1"));
  peer_process second("registered_peer", unique_group("regpeer2"));
  share_with(first);
  share_with(second);
  write_through(first, 0x21, 0, kBytes / 8);
  write_through(second, 0x22, kBytes / 2, kBytes / 8);
  peer_sees_all(first);
  peer_sees_all(second);
  expect_refused("ncclCommRegister");
  unmap_and_exit(first);
  unmap_and_exit(second);
  ASSERT_EQ(ncclCommDeregister(&comm_a_, reg_a), 0);
  expect_refused("ncclCommRegister");  // comm_b's registration still covers the memory
  ASSERT_EQ(ncclCommDeregister(&comm_b_, reg_b), 0);
  expect_offload_and_reload();
  finish(first);
  finish(second);
}

TEST_F(NcclRegistered, ReferencesAndOwnMappingsHoldItUntilReleased) {
  // A reference not yet released (NCCL between its retain and its release).
  CUmemGenericAllocationHandle h = 0;
  ASSERT_EQ(nccl().cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(mine_.va)),
            CUDA_SUCCESS);
  expect_refused("cuMemRetainAllocationHandle");
  // A peer in this process: NCCL maps the handle a second time, and releases its reference.
  buffer second = second_mapping(buffer{mine_.va, chunk_bytes_at(mine_.va), h, buffer::created}, 0);
  // A reference taken and dropped through the second mapping (ncclCuMemFreeAddr does that) is
  // not the first reference's end.
  CUmemGenericAllocationHandle again = 0;
  ASSERT_EQ(nccl().cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(second.va)),
            CUDA_SUCCESS);
  ASSERT_EQ(nccl().cuMemRelease(again), CUDA_SUCCESS);
  expect_refused("cuMemRetainAllocationHandle");
  ASSERT_EQ(nccl().cuMemRelease(h), CUDA_SUCCESS);
  expect_refused("NCCL maps it at");
  EXPECT_EQ(read_bytes(second, 0, kBytes), expected_);
  free_second_mapping(second);
  expect_offload_and_reload();
}

TEST(NcclRegisteredGraphs, ACaptureKeepsTheHoldPastDeregistrationUnlessGraphRegisterIsOff) {
  peer_process captured("capturing_owner", unique_group("cap1"));
  EXPECT_EQ(captured.wait(), 0) << "after a capture the deregistration ended the hold";
  peer_process off("capturing_owner", unique_group("cap0"), {"NCCL_GRAPH_REGISTER=0"});
  EXPECT_EQ(off.wait(), 0) << "with NCCL_GRAPH_REGISTER=0 the deregistration did not end it";
}

TEST_F(NcclRegistered, AnExportOutsideAnyRegistrationHoldsItForGood) {
  // What NCCL's registration for a captured CUDA graph does: no ncclCommRegister covers it, and
  // its end (the graph destroyed) is not seen, so the tag stays held.
  ::close(export_like_nccl());
  expect_refused("CUDA graph");
}

}  // namespace
}  // namespace tagmem::preload_test
