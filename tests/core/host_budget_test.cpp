// host_budget_test.cpp — the pinned host store never grows past its budget (Note [host budget]
// in host_budget.hpp): a BACKUP offload that does not fit fails with HOST_OUT_OF_MEMORY before
// anything is pinned and leaves the tag resident with its bytes; the default budget's formula is
// checked against fake /proc and cgroup files. Runs on both drivers.
#include "host/host_budget.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t MiB = 1u << 20;

tagmem_device_stats device_stats() {
  tagmem_device_stats s{};
  EXPECT_EQ(tagmem_device_stats_get(0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s;
}

std::size_t mapped_bytes(const char* tag) {
  tagmem_tag_stats s{};
  EXPECT_EQ(tagmem_tag_stats_get(tag, 0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s.mapped_bytes;
}

// Allocations this large get a mapping of their own size, so a tag's backup is their sum.
constexpr std::size_t kAlloc = 12 * MiB;

// A tagmem whose host store may hold 16 MiB, growing 2 MiB at a time (TAGMEM_HOST_MAX_BYTES).
class HostBudget : public tagmem_test {
 protected:
  scoped_env max_{"TAGMEM_HOST_MAX_BYTES", "16M"};
  scoped_env slab_{"TAGMEM_HOST_SLAB_BYTES", "2M"};
};

TEST_F(HostBudget, OffloadBeyondBudgetFailsAndKeepsTheTagIntact) {
  auto rng = rng_for_test();
  auto big = fill(rng, "big", 2, kAlloc);
  ASSERT_EQ(mapped_bytes("big"), 2 * kAlloc);
  const char* big_tag[] = {"big"};
  TAGMEM_FAILS_WITH(tagmem_offload(big_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
  const std::string message = tagmem_last_error();
  EXPECT_NE(message.find("TAGMEM_HOST_MAX_BYTES"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(16 * MiB)), std::string::npos) << message;    // budget
  EXPECT_NE(message.find(std::to_string(2 * kAlloc)), std::string::npos) << message;  // asked
  EXPECT_EQ(state_of("big"), TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(big), 0u);
  EXPECT_EQ(device_stats().host_pinned_bytes, 0u) << "pinned before checking the budget";

  // Within the budget: offloads and reloads intact, and the store stays within it.
  auto small = fill(rng, "small", 1, kAlloc);
  ASSERT_EQ(mapped_bytes("small"), kAlloc);
  const char* small_tag[] = {"small"};
  TAGMEM_OK(tagmem_offload(small_tag, 1, 0, TAGMEM_BACKUP));
  EXPECT_LE(device_stats().host_pinned_bytes, 16 * MiB);
  TAGMEM_OK(tagmem_reload(small_tag, 1, 0));
  EXPECT_EQ(corrupted(small), 0u);
  // The large tag still does not fit, and is still usable after the second refusal.
  TAGMEM_FAILS_WITH(tagmem_offload(big_tag, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
  EXPECT_EQ(state_of("big"), TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(big), 0u);
  EXPECT_LE(device_stats().host_pinned_high_water, 16 * MiB);
}

TEST_F(HostBudget, SwapBeyondBudgetLeavesBothSidesAsTheyWere) {
  auto rng = rng_for_test();
  auto in = fill(rng, "in", 1, kAlloc);
  const char* in_tag[] = {"in"};
  TAGMEM_OK(tagmem_offload(in_tag, 1, 0, TAGMEM_BACKUP));  // 12 of the 16 MiB
  auto out = fill(rng, "out", 1, kAlloc);                  // 12 MiB more: 8 too many
  ASSERT_EQ(mapped_bytes("out"), kAlloc);
  const char* out_tag[] = {"out"};
  TAGMEM_FAILS_WITH(tagmem_swap(out_tag, 1, in_tag, 1, 0, TAGMEM_BACKUP),
                    TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
  EXPECT_EQ(state_of("out"), TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(out), 0u);
  EXPECT_EQ(state_of("in"), TAGMEM_OFFLOADED_BACKUP);
  TAGMEM_OK(tagmem_reload(in_tag, 1, 0));
  EXPECT_EQ(corrupted(in), 0u);
}

TEST_F(HostBudget, ReserveBeyondBudgetFailsWithinWorks) {
  TAGMEM_FAILS_WITH(tagmem_host_reserve(18 * MiB, 1), TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
  EXPECT_NE(std::string(tagmem_last_error()).find("TAGMEM_HOST_MAX_BYTES"), std::string::npos);
  EXPECT_EQ(device_stats().host_pinned_bytes, 0u);
  TAGMEM_OK(tagmem_host_reserve(16 * MiB, 1));
  tagmem_device_stats s = device_stats();
  EXPECT_EQ(s.host_pinned_bytes, 16 * MiB);
  EXPECT_EQ(s.host_budget_bytes, 16 * MiB);
  // In the background, beyond the budget: nothing more is pinned.
  TAGMEM_OK(tagmem_host_reserve(64 * MiB, 0));
  TAGMEM_OK(tagmem_host_trim(SIZE_MAX));  // waits for the background pinning to stop
  EXPECT_EQ(device_stats().host_pinned_high_water, 16 * MiB);
}

TEST(HostBudgetConfig, ConfigFieldCapsTheStore) {
  tagmem_config config;
  tagmem_config_init(&config);
  config.host_max_bytes = 4 * MiB;
  scoped_env slab("TAGMEM_HOST_SLAB_BYTES", "2M");
  ASSERT_EQ(tagmem_init(&config), TAGMEM_SUCCESS) << tagmem_last_error();
  tagmem_device_stats s{};
  EXPECT_EQ(tagmem_device_stats_get(0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(s.host_budget_bytes, 4 * MiB);
  EXPECT_EQ(tagmem_host_reserve(6 * MiB, 1), TAGMEM_ERROR_HOST_OUT_OF_MEMORY);
  EXPECT_EQ(tagmem_host_reserve(4 * MiB, 1), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
}

// ---- the default budget's formula, from fake files ----------------------------------------

// A directory of fake /proc and cgroup files, removed afterwards.
class fake_system {
 public:
  fake_system() {
    char pattern[] = "/tmp/tagmem_budget_XXXXXX";
    root_ = mkdtemp(pattern);
  }
  ~fake_system() { std::filesystem::remove_all(root_); }
  fake_system(const fake_system&) = delete;
  fake_system& operator=(const fake_system&) = delete;

  std::string path(const std::string& rel) const { return root_ + "/" + rel; }
  void write(const std::string& rel, const std::string& text) const {
    std::filesystem::create_directories(std::filesystem::path(path(rel)).parent_path());
    std::ofstream(path(rel)) << text;
  }
  host_memory_files files() const {
    return {path("self_cgroup"), path("mountinfo"), path("meminfo"), path("zoneinfo")};
  }
  // meminfo with MemTotal and MemAvailable in MiB.
  void meminfo(std::size_t total_mib, std::size_t available_mib) const {
    write("meminfo", "MemTotal:       " + std::to_string(total_mib << 10) +
                         " kB\nMemFree:  1 kB\nMemAvailable:   " +
                         std::to_string(available_mib << 10) + " kB\n");
  }
  // The process in cgroup v2 at `path`, the hierarchy mounted from `hier_root` at <root>/<dir>.
  void cgroup_v2(const std::string& path, const std::string& hier_root,
                 const std::string& dir) const {
    write("self_cgroup", "0::" + path + "\n");
    write("mountinfo", mount_line(30, hier_root, dir, "cgroup2", "rw,nsdelegate"));
  }
  // memory.max and memory.current of the v2 cgroup at <root>/<dir>.
  void v2_limit(const std::string& dir, const std::string& max, std::size_t current_mib) const {
    write(dir + "/memory.max", max + "\n");
    write(dir + "/memory.current", std::to_string(current_mib * MiB) + "\n");
  }
  // A mountinfo line for a cgroup hierarchy mounted from `hier_root` at <root>/<dir>.
  std::string mount_line(int id, const std::string& hier_root, const std::string& dir,
                         const std::string& type, const std::string& options) const {
    return std::to_string(id) + " 1 0:" + std::to_string(id) + " " + hier_root + " " + path(dir) +
           " rw,relatime shared:9 - " + type + " " + type + " " + options + "\n";
  }

 private:
  std::string root_;
};

std::string mib(std::size_t n) { return std::to_string(n * MiB); }

TEST(HostBudgetFormula, MemAvailableAloneLessTheMargin) {
  fake_system f;
  f.meminfo(64 << 10, 10 << 10);  // 64 GiB, 10 GiB available, no cgroup files at all
  host_memory m = read_host_memory(f.files());
  EXPECT_EQ(m.available, (10ull << 30));
  EXPECT_EQ(m.total, (64ull << 30));
  EXPECT_EQ(m.limited_by, "MemAvailable");
  EXPECT_EQ(host_margin(m.total), 2ull << 30);  // total / 32
  EXPECT_EQ(host_headroom(m), 8ull << 30);
}

TEST(HostBudgetFormula, CgroupV2LevelsTightestWinsAndFileCacheCountsAsFree) {
  fake_system f;
  f.meminfo(24 << 10, 20 << 10);
  f.cgroup_v2("/job/step", "/", "cg2");
  f.v2_limit("cg2/job/step", mib(400), 300);
  f.write("cg2/job/step/memory.stat",
          "anon 1\ninactive_file " + mib(20) + "\nactive_file " + mib(30) + "\n");
  f.v2_limit("cg2/job", "max", 900);
  host_memory m = read_host_memory(f.files());
  EXPECT_EQ(m.available, 150 * MiB);  // 400 - (300 - 20 - 30); no zoneinfo: no watermark
  EXPECT_EQ(m.total, 400 * MiB);
  EXPECT_EQ(m.limited_by, "cgroup v2 " + f.path("cg2/job/step"));
  EXPECT_EQ(host_headroom(m), 86 * MiB);  // margin 64 MiB: 400 MiB / 32 is less

  // A parent with less room left limits its children.
  f.v2_limit("cg2/job", mib(1000), 900);
  m = read_host_memory(f.files());
  EXPECT_EQ(m.available, 100 * MiB);
  EXPECT_EQ(m.limited_by, "cgroup v2 " + f.path("cg2/job"));
  EXPECT_EQ(host_headroom(m), 36 * MiB);

  // Used beyond the limit (it happens while the kernel reclaims): no room, no wrap-around.
  f.write("cg2/job/step/memory.current", mib(600) + "\n");
  m = read_host_memory(f.files());
  EXPECT_EQ(m.available, 0u);
  EXPECT_EQ(host_headroom(m), 0u);
}

TEST(HostBudgetFormula, CgroupV1WhenNoV2LevelHasALimit) {
  fake_system f;
  f.meminfo(24 << 10, 20 << 10);
  f.write("self_cgroup", "4:memory:/ci/job\n3:cpu,cpuacct:/\n0::/\n");
  f.write("mountinfo", f.mount_line(30, "/", "unified", "cgroup2", "rw") +
                           f.mount_line(35, "/", "memory", "cgroup", "rw,memory"));
  f.write("unified/cgroup.controllers", "hugetlb\n");  // v2 without the memory controller
  f.write("memory/ci/job/memory.limit_in_bytes", mib(400) + "\n");
  f.write("memory/ci/job/memory.usage_in_bytes", mib(100) + "\n");
  f.write("memory/ci/job/memory.stat", "cache 5\ntotal_inactive_file " + mib(20) + "\n");
  f.write("memory/ci/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  f.write("memory/ci/memory.usage_in_bytes", mib(5000) + "\n");
  host_memory m = read_host_memory(f.files());
  EXPECT_EQ(m.available, 320 * MiB);
  EXPECT_EQ(m.total, 400 * MiB);
  EXPECT_EQ(m.limited_by, "cgroup v1 " + f.path("memory/ci/job"));
}

// The machine's low watermark as /proc/zoneinfo gives it, `pages` spread over three zones.
void zoneinfo(const fake_system& f, std::size_t pages) {
  const std::size_t a = pages / 3, b = pages / 5;
  f.write("zoneinfo",
          "Node 0, zone      DMA\n  pages free     3840\n        min      21\n"
          "        low      " +
              std::to_string(a) +
              "\n        high     40\n"
              "        protection: (0, 1, 2)\nNode 0, zone    DMA32\n        low      " +
              std::to_string(b) +
              "\n      nr_zone_active_file 9999\n"
              "Node 0, zone   Normal\n        low      " +
              std::to_string(pages - a - b) + "\n");
}

// A 2 GiB container whose usage is mostly a checkpoint's file cache, read twice (so all of it is
// active): the kernel reclaims it before it kills anyone, and so the budget counts it, less the
// container's share of the low watermark, as MemAvailable does.
TEST(HostBudgetFormula, ActiveFileCacheAndReclaimableSlabCountLessTheLowWatermarkShare) {
  fake_system f;
  f.meminfo(24 << 10, 20 << 10);
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  zoneinfo(f, 96 * MiB / page);  // 96 MiB; a 2 GiB cgroup of 24 GiB has 8 MiB of it
  f.cgroup_v2("/ctr", "/", "cg2");
  f.v2_limit("cg2/ctr", mib(2048), 1946);
  f.write("cg2/ctr/memory.stat", "anon " + mib(236) + "\nfile " + mib(1700) + "\nactive_file " +
                                     mib(1700) + "\ninactive_file 0\nslab_reclaimable " + mib(10) +
                                     "\n");
  host_memory m = read_host_memory(f.files());
  // reclaimable = 1700 - min(850, 8) + 10 - min(5, 8) = 1697; free = 2048 - (1946 - 1697)
  EXPECT_EQ(m.available, 1799 * MiB);
  EXPECT_EQ(m.limited_by, "cgroup v2 " + f.path("cg2/ctr"));
  EXPECT_EQ(host_headroom(m), 1735 * MiB);  // margin 64 MiB

  // Little cache: at most half of it is kept back.
  f.write("cg2/ctr/memory.stat", "active_file " + mib(6) + "\ninactive_file " + mib(4) + "\n");
  EXPECT_EQ(read_host_memory(f.files()).available, (2048 - 1946 + 5) * MiB);

  // Figures that cannot all be true (cache beyond usage, a watermark beyond memory) never wrap.
  f.write("cg2/ctr/memory.stat", "active_file 18446744073709551615\ninactive_file " + mib(9) +
                                     "\nslab_reclaimable 18446744073709551615\n");
  zoneinfo(f, SIZE_MAX / page);
  m = read_host_memory(f.files());
  EXPECT_LE(m.available, 2048 * MiB);
  EXPECT_GE(m.available, (2048 - 1946) * MiB);
}

TEST(HostBudgetFormula, CgroupV1CountsActiveFileCache) {
  fake_system f;
  f.meminfo(16 << 10, 12 << 10);
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  zoneinfo(f, 64 * MiB / page);  // a 1 GiB cgroup of 16 GiB has 4 MiB of it
  f.write("self_cgroup", "4:memory:/ci/job\n0::/\n");
  f.write("mountinfo", f.mount_line(30, "/", "unified", "cgroup2", "rw") +
                           f.mount_line(35, "/", "memory", "cgroup", "rw,memory"));
  f.write("memory/ci/job/memory.limit_in_bytes", mib(1024) + "\n");
  f.write("memory/ci/job/memory.usage_in_bytes", mib(1000) + "\n");
  f.write("memory/ci/job/memory.stat", "active_file 1\ntotal_active_file " + mib(700) +
                                           "\ntotal_inactive_file " + mib(100) + "\n");
  host_memory m = read_host_memory(f.files());
  EXPECT_EQ(m.available, (1024 - (1000 - 796)) * MiB);  // 800 less the 4 MiB share
  EXPECT_EQ(m.limited_by, "cgroup v1 " + f.path("memory/ci/job"));
}

// The budget read (tagmem_device_stats_get, which reads the cgroup and /proc files) while another
// thread grows the store: every read sees a budget that covers what is pinned and a store that
// only grew. Its suite is named Threads* so that the TSan run (tests/sanitizers.sh) includes it.
class ThreadsHostBudget : public tagmem_test {};

TEST_F(ThreadsHostBudget, ReadWhileTheStoreGrows) {
  restart_with_env("TAGMEM_HOST_SLAB_BYTES", "2M");
  std::atomic<bool> done{false};
  std::thread grower([&] {
    for (std::size_t mib = 2; mib <= 48; mib += 2) {
      EXPECT_EQ(tagmem_host_reserve(mib * MiB, 1), TAGMEM_SUCCESS) << tagmem_last_error();
    }
    done = true;
  });
  std::size_t reads = 0, last_pinned = 0;
  while (!done || reads < 4) {
    tagmem_device_stats s{};
    ASSERT_EQ(tagmem_device_stats_get(0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
    EXPECT_GE(s.host_budget_bytes, s.host_pinned_bytes);
    EXPECT_GE(s.host_pinned_bytes, last_pinned);
    EXPECT_GE(s.host_pinned_high_water, s.host_pinned_bytes);
    last_pinned = s.host_pinned_bytes;
    ++reads;
  }
  grower.join();
  EXPECT_EQ(device_stats().host_pinned_bytes, 48 * MiB);
}

TEST(HostBudgetFormula, ContainerMountOfItsOwnCgroup) {
  fake_system f;
  f.meminfo(24 << 10, 20 << 10);
  // Without a cgroup namespace a container sees its host path, and its own cgroup is mounted.
  f.cgroup_v2("/docker/abc", "/docker/abc", "cg");
  f.v2_limit("cg", mib(2048), 1024);
  host_memory m = read_host_memory(f.files());
  EXPECT_EQ(m.available, 1024 * MiB);
  EXPECT_EQ(m.limited_by, "cgroup v2 " + f.path("cg"));
}

TEST(HostBudgetFormula, UnreadableOrMalformedSourcesLimitNothing) {
  fake_system f;
  f.write("meminfo", "MemTotal: lots\n");
  f.write("self_cgroup", "garbage\n");
  f.write("mountinfo", "not a mount line\n");
  host_memory m = read_host_memory(f.files());
  EXPECT_EQ(m.available, SIZE_MAX);
  EXPECT_EQ(host_headroom(m), SIZE_MAX);
  EXPECT_EQ(m.limited_by, "");

  f.cgroup_v2("/a", "/", "cg2");
  f.v2_limit("cg2/a", "-5", 12);
  EXPECT_EQ(read_host_memory(f.files()).available, SIZE_MAX);
}

}  // namespace
}  // namespace tagmem::test
