// shared_ledger.cpp — the cross-process device memory count (see header).
#include "shared_ledger.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "option_table.hpp"

namespace tagmem::emu::ledger {
namespace {

constexpr uint64_t kMagic = 0x4c4d47544d454d55ull;  // "UMEMTGML"
constexpr int kDevices = 64;
constexpr int kRecords = 16384;
constexpr int kHolders = 6;
constexpr uint64_t kOwnKey = 1ull << 63;  // keys of a process's own records (not inodes)

struct holder {
  int32_t pid;
  uint64_t start;
};

struct record {
  uint64_t key;  // 0: free
  uint64_t size;
  int32_t device;
  int32_t holders;
  holder held[kHolders];
};

struct file_layout {
  uint64_t magic;
  uint64_t totals[kDevices];
  record records[kRecords];
};

uint64_t start_of(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  for (int field = 3; p && field < 22; ++field) p = std::strchr(p + 1, ' ');
  return p ? std::strtoull(p + 1, nullptr, 10) : 0;
}

struct state {
  int fd = -1;
  file_layout* map = nullptr;
  holder me{};
};

state& s() {
  static state* instance = new state;  // leaked, as the emulator's other tables
  return *instance;
}

class locked {
 public:
  locked() { ::flock(s().fd, LOCK_EX); }
  ~locked() { ::flock(s().fd, LOCK_UN); }
  locked(const locked&) = delete;
  locked& operator=(const locked&) = delete;
};

bool is_me(const holder& h) { return h.pid == s().me.pid && h.start == s().me.start; }

// Drops holders that are no longer alive (a pid reused by another process counts as dead).
void prune() {
  std::vector<std::pair<holder, bool>> seen;
  auto alive = [&](const holder& h) {
    for (const auto& [k, v] : seen)
      if (k.pid == h.pid && k.start == h.start) return v;
    const bool v = (::kill(h.pid, 0) == 0 || errno == EPERM) && start_of(h.pid) == h.start;
    seen.push_back({h, v});
    return v;
  };
  for (record& r : s().map->records) {
    if (r.key == 0) continue;
    int kept = 0;
    for (int i = 0; i < r.holders; ++i)
      if (is_me(r.held[i]) || alive(r.held[i])) r.held[kept++] = r.held[i];
    r.holders = kept;
    if (kept == 0) r.key = 0;
  }
}

uint64_t used_locked(int device) {
  uint64_t sum = 0;
  for (const record& r : s().map->records)
    if (r.key != 0 && r.device == device) sum += r.size;
  return sum;
}

record* find(uint64_t key) {
  for (record& r : s().map->records)
    if (r.key == key) return &r;
  return nullptr;
}

record* free_record() {
  for (record& r : s().map->records)
    if (r.key == 0) return &r;
  return nullptr;
}

bool fits(int device, uint64_t size) {
  if (used_locked(device) + size <= s().map->totals[device]) return true;
  prune();  // memory of processes that died is free again
  return used_locked(device) + size <= s().map->totals[device];
}

}  // namespace

bool enabled(int devices, uint64_t bytes) {
  state& st = s();
  if (st.map) return true;
  const char* path = std::getenv(tagmem::spec_of(tagmem::option::EMU_SHARED_DEVICES).name);
  if (!path || !*path) return false;
  const int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::fprintf(stderr, "tagmem emu: cannot open TAGMEM_EMU_SHARED_DEVICES='%s': %s\n", path,
                 std::strerror(errno));
    return false;
  }
  ::flock(fd, LOCK_EX);
  bool ok = ::ftruncate(fd, sizeof(file_layout)) == 0;  // no change when already that size
  void* m = ok ? ::mmap(nullptr, sizeof(file_layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
               : MAP_FAILED;
  if (m == MAP_FAILED) {
    ::flock(fd, LOCK_UN);
    ::close(fd);
    return false;
  }
  auto* layout = static_cast<file_layout*>(m);
  if (layout->magic != kMagic) {
    for (int d = 0; d < kDevices; ++d) layout->totals[d] = d < devices ? bytes : 0;
    layout->magic = kMagic;
  }
  ::flock(fd, LOCK_UN);
  st.fd = fd;
  st.me = {static_cast<int32_t>(::getpid()), start_of(::getpid())};
  st.map = layout;
  return true;
}

bool hold(int device, uint64_t key, uint64_t size, bool check_fit) {
  locked l;
  if (record* r = find(key)) {
    for (int i = 0; i < r->holders; ++i)
      if (is_me(r->held[i])) return true;
    if (r->holders == kHolders) prune();
    if (r->holders < kHolders) r->held[r->holders++] = s().me;
    return true;  // counted once, whoever holds it
  }
  if (check_fit && !fits(device, size)) return false;
  record* r = free_record();
  if (!r) {
    prune();
    r = free_record();
  }
  if (!r) return !check_fit;  // no room to count it: refused where it could be refused
  r->key = key;
  r->size = size;
  r->device = device;
  r->holders = 1;
  r->held[0] = s().me;
  return true;
}

void drop(uint64_t key) {
  locked l;
  record* r = find(key);
  if (!r) return;
  int kept = 0;
  for (int i = 0; i < r->holders; ++i)
    if (!is_me(r->held[i])) r->held[kept++] = r->held[i];
  r->holders = kept;
  if (kept == 0) r->key = 0;
}

bool adjust_own(int device, int64_t delta) {
  const uint64_t key = kOwnKey | (static_cast<uint64_t>(s().me.pid) << 8) | device;
  locked l;
  record* r = find(key);
  if (delta > 0 && !fits(device, static_cast<uint64_t>(delta))) return false;
  if (!r) {
    if (delta <= 0) return true;
    r = free_record();
    if (!r) return false;
    *r = record{key, 0, device, 1, {s().me}};
  }
  const uint64_t down = delta < 0 ? static_cast<uint64_t>(-delta) : 0;
  r->size = delta >= 0 ? r->size + delta : (r->size > down ? r->size - down : 0);
  return true;
}

uint64_t used(int device) {
  locked l;
  prune();
  return used_locked(device);
}

uint64_t total(int device) { return s().map->totals[device]; }

void set_total(int device, uint64_t bytes) {
  locked l;
  s().map->totals[device] = bytes;
}

}  // namespace tagmem::emu::ledger
