// harness.cpp — descriptors, data and leak checks of the handoff tests (see header).
#include "harness.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "driver/driver.hpp"
#include "emu_controls.hpp"

namespace tagmem::handoff_test {

namespace {

bool starts_with(const char* s, const char* prefix) {
  return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

// The emulator names each allocation's memfd "tagmem_emu:<location type>:<id>".
bool device_memfd(const char* target) { return starts_with(target, "/memfd:tagmem_emu:1:"); }

// A shared host copy (replica/host_share.hpp): the memfd way's file, or the host cuMem way's
// allocation, which on the emulator is a memfd at a host NUMA location (type 3).
bool shared_copy_memfd(const char* target) {
  return starts_with(target, "/memfd:tagmem-shared-host") ||
         starts_with(target, "/memfd:tagmem_emu:3:");
}

}  // namespace

fd_census take_fd_census() {
  fd_census c;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) throw std::runtime_error("cannot list /proc/self/fd");
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(path.c_str(), target, sizeof target - 1) <= 0) continue;
    if (device_memfd(target)) ++c.device_memory;
    if (shared_copy_memfd(target)) ++c.shared_copies;
    // Note [sockets on the real driver]: libcuda opens sockets of its own when it first loads
    // (seen on an H200, driver 580) and keeps them, so a census taken before the driver loaded
    // differs from one after by those. Sockets are counted on the emulator, where every socket
    // is tagmem's and the same code paths run.
    if (std::strncmp(target, "socket:", 7) == 0 && reliability::emu().available) ++c.sockets;
  }
  ::closedir(d);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const std::size_t at = line.find("/memfd:");
    if (at != std::string::npos && shared_copy_memfd(line.c_str() + at)) ++c.shared_copies;
  }
  return c;
}

std::string describe(const fd_census& c) {
  return std::to_string(c.device_memory) + " device-memory fds, " + std::to_string(c.sockets) +
         " sockets, " + std::to_string(c.shared_copies) + " shared-copy fds and mappings";
}

namespace {

// The directories this process made, removed with what is left in them when it exits (a peer
// forked from it and exiting without exec leaves them to their maker).
struct made_dirs {
  std::mutex mutex;
  std::vector<std::string> paths;
  pid_t maker = ::getpid();
};

made_dirs& dirs() {
  static made_dirs* d = [] {
    auto* m = new made_dirs;  // never destroyed: the exit handler below may run after statics
    std::atexit([] {
      made_dirs& self = dirs();
      if (::getpid() != self.maker) return;
      std::lock_guard lock(self.mutex);
      for (const std::string& p : self.paths) {
        std::error_code ignored;
        std::filesystem::remove_all(p, ignored);
      }
    });
    return m;
  }();
  return *d;
}

}  // namespace

std::string make_private_dir(const char* what) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/tagmem-" + what + "-XXXXXX";
  made_dirs& made = dirs();
  std::lock_guard lock(made.mutex);
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp " + pattern);
  made.paths.push_back(pattern);
  return pattern;
}

void check(tagmem_status s, const std::string& what) {
  if (s != TAGMEM_SUCCESS) {
    throw std::runtime_error(what + ": " + tagmem_status_string(s) + ": " + tagmem_last_error());
  }
}

void primary_context() {
  CUdevice dev = 0;
  CUcontext c = nullptr;
  driver::check(driver::api().cuDeviceGet(&dev, 0), "cuDeviceGet");
  driver::check(driver::api().cuDevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain");
  driver::check(driver::api().cuCtxSetCurrent(c), "cuCtxSetCurrent");
  driver::api().cuDevicePrimaryCtxRelease(dev);  // tagmem holds it; current is enough
}

tag_data fill_tag(const std::string& tag, int count, std::size_t size, std::mt19937_64& rng) {
  tag_data d{tag, {}, {}};
  primary_context();
  for (int i = 0; i < count; ++i) {
    void* p = nullptr;
    check(tagmem_malloc_tagged(&p, size, tag.c_str(), 0, nullptr), "tagmem_malloc_tagged " + tag);
    std::vector<unsigned char> bytes(size);
    for (std::size_t j = 0; j + 8 <= size; j += 8) {
      const std::uint64_t x = rng();
      std::memcpy(&bytes[j], &x, 8);
    }
    driver::check(driver::api().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(p), bytes.data(), size),
                  "cuMemcpyHtoD");
    d.ptrs.push_back(p);
    d.bytes.push_back(std::move(bytes));
  }
  return d;
}

void refill(tag_data& d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  primary_context();
  for (std::size_t i = 0; i < d.ptrs.size(); ++i) {
    for (std::size_t j = 0; j + 8 <= d.bytes[i].size(); j += 8) {
      const std::uint64_t x = rng();
      std::memcpy(&d.bytes[i][j], &x, 8);
    }
    driver::check(driver::api().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(d.ptrs[i]),
                                             d.bytes[i].data(), d.bytes[i].size()),
                  "cuMemcpyHtoD");
  }
}

std::size_t corrupted(const tag_data& d) {
  primary_context();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < d.ptrs.size(); ++i) {
    std::vector<unsigned char> now(d.bytes[i].size());
    driver::check(driver::api().cuMemcpyDtoH(now.data(), reinterpret_cast<CUdeviceptr>(d.ptrs[i]),
                                             now.size()),
                  "cuMemcpyDtoH");
    bad += now != d.bytes[i];
  }
  return bad;
}

tagmem_handoff_stats handoff_stats(int device) {
  tagmem_handoff_stats s{};
  check(tagmem_handoff_stats_get(device, &s), "tagmem_handoff_stats_get");
  return s;
}

std::uint64_t emu_calls(const char* entry) {
  const auto& e = reliability::emu();
  return e.available ? e.call_count(entry) : 0;
}

reload_thread::reload_thread(std::string tag) : tag_(std::move(tag)) {
  thread_ = std::thread([this] {
    const char* name = tag_.c_str();
    const tagmem_status s = tagmem_reload(&name, 1, 0);
    if (s != TAGMEM_SUCCESS) outcome_ = "status " + std::to_string(s) + ": " + tagmem_last_error();
  });
}

reload_thread::~reload_thread() {
  if (thread_.joinable()) thread_.join();
}

std::string reload_thread::finish() {
  if (thread_.joinable()) thread_.join();
  return outcome_;
}

tag_data offloaded_backup(const std::string& tag, int count, std::size_t size,
                          std::mt19937_64& rng) {
  tag_data d = fill_tag(tag, count, size, rng);
  const char* name = d.tag.c_str();
  check(tagmem_offload(&name, 1, 0, TAGMEM_BACKUP), "tagmem_offload " + tag);
  check(tagmem_wait_released(0), "tagmem_wait_released");
  return d;
}

void discard_giver_hands_over(std::uint64_t seed) {
  peer_process giver("discard_giver", "g");
  giver.channel().send(std::to_string(seed));
  giver.channel().send("offload");
  EXPECT_EQ(giver.channel().receive(),
            "given " + std::to_string(2 * kPiece) + " refused 0 leaks '' fds same");
  EXPECT_EQ(giver.wait(), 0);
}

tagmem_status init_with(const char* name, const char* value) {
  const char* was = std::getenv(name);
  const std::string before = was ? was : "";
  setenv(name, value, 1);
  const tagmem_status s = tagmem_init(nullptr);
  if (was) {  // as it was: main.cpp sets some for every test
    setenv(name, before.c_str(), 1);
  } else {
    unsetenv(name);
  }
  return s;
}

void shared_device_test::SetUp() {
  seed_ = std::random_device{}();
  ASSERT_TRUE(reliability::emu().available);
  total_ = reliability::emu().device_bytes(0);
  before_ = take_fd_census();
}

void shared_device_test::TearDown() {
  tagmem_shutdown();
  reliability::emu().set_device_bytes(0, total_);
  EXPECT_EQ(reliability::emu().device_used_bytes(0), 0u) << "the shared device is not empty";
  EXPECT_EQ(emu_leaks(), "");
  EXPECT_EQ(take_fd_census(), before_) << describe(take_fd_census()) << " / " << describe(before_);
}

void shared_device_test::fill_device() {
  reliability::emu().set_device_bytes(0, reliability::emu().device_used_bytes(0));
}

bool copy_mark_held(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return false;
  bool held = false;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 5 || name.compare(name.size() - 5, 5, ".copy") != 0) continue;
    const int fd = ::open((dir + "/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    held = held || (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK);
    ::close(fd);
  }
  ::closedir(d);
  return held;
}

void early_return_test::SetUp() {
  shared_device_test::SetUp();
  setenv("TAGMEM_OFFLOAD_RETURN", "queued", 1);
}

void early_return_test::TearDown() {
  unsetenv("TAGMEM_OFFLOAD_RETURN");
  reliability::emu().set_copy_bytes_per_second(0);
  reliability::emu().clear_faults();
  shared_device_test::TearDown();
}

std::string emu_leaks() {
  const auto& e = reliability::emu();
  std::string out;
  if (!e.available) return out;
  if (e.live_allocations() != 0) out += std::to_string(e.live_allocations()) + " allocations ";
  if (e.live_mappings() != 0) out += std::to_string(e.live_mappings()) + " mappings ";
  if (e.live_reservations() != 0) out += std::to_string(e.live_reservations()) + " reservations";
  return out;
}

}  // namespace tagmem::handoff_test
