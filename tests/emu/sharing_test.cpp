// sharing_test.cpp — Note [emu fd sharing]: POSIX-fd export and import, within one process and
// across two, with the bytes visible on both sides and the memory gone once every side has
// released and unmapped it.
//
// The second process is this test binary run again (posix_spawn of /proc/self/exe) with
// TAGMEM_EMU_TEST_IMPORTER naming its end of a socket pair; a static initializer sees it and
// plays the importer before main() runs, so no test framework or emulator thread of the parent
// is inherited. The fd travels over the socket with SCM_RIGHTS, as NCCL passes it between ranks.
#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "support.hpp"

extern char** environ;

namespace tagmem::emu::test {
namespace {

constexpr int importer_socket_fd = 100;  // where the importer finds its end of the socket pair

struct share_message {
  uint64_t size;
  uint64_t seed;
};

bool send_fd(int sock, int fd, const share_message& message) {
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec io{const_cast<share_message*>(&message), sizeof message};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  return ::sendmsg(sock, &msg, 0) == static_cast<ssize_t>(sizeof message);
}

int receive_fd(int sock, share_message* message) {
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec io{message, sizeof *message};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(sock, &msg, 0) != static_cast<ssize_t>(sizeof *message)) return -1;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (cmsg == nullptr || cmsg->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
  return fd;
}

// The importer process: maps the shared memory, writes the agreed bytes, gives everything back
// and reports whether nothing of the emulator's is left in it. Exit status 0 on success.
int run_importer(int sock) {
  share_message message{};
  const int fd = receive_fd(sock, &message);
  if (fd < 0) return 2;
  CUcontext ctx = nullptr;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  const CUmemAccessDesc rw = access(0);
  const auto data = random_bytes(message.size, message.seed);
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return 3;
  if (cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS)
    return 4;
  ::close(fd);  // the imported handle holds its own reference
  if (cuMemAddressReserve(&va, message.size, 0, 0, 0) != CUDA_SUCCESS ||
      cuMemMap(va, message.size, 0, h, 0) != CUDA_SUCCESS ||
      cuMemSetAccess(va, message.size, &rw, 1) != CUDA_SUCCESS ||
      cuMemcpyHtoD(va, data.data(), data.size()) != CUDA_SUCCESS)
    return 5;
  if (cuMemUnmap(va, message.size) != CUDA_SUCCESS || cuMemRelease(h) != CUDA_SUCCESS ||
      cuMemAddressFree(va, message.size) != CUDA_SUCCESS)
    return 6;
  if (emulator_memfds() != 0 || emulator_memfd_mappings() != 0 ||
      tagmem_emu_live_allocations() != 0)
    return 7;
  const char done = 1;
  return ::write(sock, &done, 1) == 1 ? 0 : 8;
}

[[maybe_unused]] const bool importer_ran = [] {
  if (std::getenv("TAGMEM_EMU_TEST_IMPORTER") == nullptr) return false;
  std::_Exit(run_importer(importer_socket_fd));
}();

using sharing = emu_test;

TEST_F(sharing, ExportImportWithinOneProcess) {
  const int memfds = emulator_memfds();
  mapped_range exporter(2 * granule, 0, /*shareable=*/true);
  int fd = -1;
  CU_ASSERT(cuMemExportToShareableHandle(&fd, exporter.handle(),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle imported = 0;
  CU_ASSERT(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(uintptr_t(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  ::close(fd);
  EXPECT_NE(imported, exporter.handle());
  EXPECT_EQ(tagmem_emu_device_used_bytes(0), 2 * granule);  // counted once, as measured
  CUmemAllocationProp prop{};
  CU_ASSERT(cuMemGetAllocationPropertiesFromHandle(&prop, imported));
  EXPECT_EQ(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(prop.location.id, 0);
  // The real driver does not export an imported handle again (measured on an H200, driver 580).
  int again = -1;
  EXPECT_EQ(
      cuMemExportToShareableHandle(&again, imported, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
      CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(again, -1);

  CUdeviceptr va = 0;
  const CUmemAccessDesc rw = access(0);
  CU_ASSERT(cuMemAddressReserve(&va, 2 * granule, 0, 0, 0));
  CU_ASSERT(cuMemMap(va, 2 * granule, 0, imported, 0));
  CU_ASSERT(cuMemSetAccess(va, 2 * granule, &rw, 1));
  const auto data = random_bytes(2 * granule, test_seed());
  CU_ASSERT(cuMemcpyHtoD(exporter.ptr(), data.data(), data.size()));
  exporter.reset();  // the exporter's side is gone; the importer's keeps the bytes
  std::vector<unsigned char> back(data.size());
  CU_ASSERT(cuMemcpyDtoH(back.data(), va, back.size()));
  EXPECT_EQ(back, data);
  CU_EXPECT(cuMemUnmap(va, 2 * granule));
  CU_EXPECT(cuMemRelease(imported));
  CU_EXPECT(cuMemAddressFree(va, 2 * granule));
  EXPECT_EQ(emulator_memfds(), memfds);
  EXPECT_EQ(emulator_memfd_mappings(), 0);
}

TEST_F(sharing, ExportAndImportRefuseWhatCannotBeShared) {
  const CUmemAllocationProp plain = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  CU_ASSERT(cuMemCreate(&h, granule, &plain, 0));
  int fd = -1;
  EXPECT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);  // not requested at creation
  EXPECT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemExportToShareableHandle(nullptr, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);
  CU_EXPECT(cuMemRelease(h));
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(uintptr_t(null_fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_INVALID_VALUE);  // not device memory
  ::close(null_fd);
  EXPECT_EQ(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(uintptr_t(null_fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_ERROR_UNKNOWN);  // not an fd at all, as measured
}

TEST_F(sharing, SharedMemoryCrossesProcesses) {
  const int memfds = emulator_memfds();
  mapped_range exporter(4 * granule, 0, /*shareable=*/true);
  std::memset(exporter.host(), 0, exporter.size());
  int fd = -1;
  CU_ASSERT(cuMemExportToShareableHandle(&fd, exporter.handle(),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  int sockets[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets), 0);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], importer_socket_fd);
  std::vector<std::string> env_strings{"TAGMEM_EMU_TEST_IMPORTER=1"};
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> env;
  for (auto& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, exe, &actions, nullptr, argv, env.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(sockets[1]);

  const share_message message{exporter.size(), test_seed()};
  ASSERT_TRUE(send_fd(sockets[0], fd, message));
  ::close(fd);
  char done = 0;
  EXPECT_EQ(::read(sockets[0], &done, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the importer failed at step " << WEXITSTATUS(status);
  ::close(sockets[0]);

  // What the other process wrote is here, byte for byte.
  const auto expected = random_bytes(exporter.size(), message.seed);
  std::vector<unsigned char> back(exporter.size());
  CU_ASSERT(cuMemcpyDtoH(back.data(), exporter.ptr(), back.size()));
  EXPECT_EQ(back, expected);
  exporter.reset();
  EXPECT_EQ(emulator_memfds(), memfds);  // no process holds the memory any more
  EXPECT_EQ(emulator_memfd_mappings(), 0);
}

}  // namespace
}  // namespace tagmem::emu::test
