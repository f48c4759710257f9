// copy_kernel_test.cpp — reloads whose host-to-device copies the copy kernel shares with the copy
// engines (Note [copy kernel] in kernel_copy.hpp, Note [release aftermath] in release_clock.hpp).
// The CopyKernel suite runs on both drivers (on a GPU the real kernel moves the bytes);
// EmulatorCopyKernel counts launches and makes every driver call of such a reload fail once.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "device/release_clock.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t MiB = 1u << 20;
const char* weights[] = {"weights"};

// Shuts tagmem down and starts it again with TAGMEM_COPY_KERNEL=`use` (and copy pieces of
// `piece` bytes, the default when null).
void restart_with(const char* use, const char* piece = nullptr) {
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
  scoped_env env("TAGMEM_COPY_KERNEL", use);
  std::optional<scoped_env> pieces;
  if (piece) pieces.emplace("TAGMEM_COPY_PIECE_BYTES", piece);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
}

// Weights in allocations of several sizes (pieces of 64 MiB, and shorter ones where a mapping or
// a host extent ends); `small` ones for the sweeps, which reload once per driver call.
enum class weights_size { full, small };
std::vector<filled> weights_of(std::mt19937_64& rng, weights_size size = weights_size::full) {
  const std::size_t unit = size == weights_size::full ? 96 * MiB : 24 * MiB;
  auto all = fill(rng, "weights", 3, unit);
  for (std::size_t n : {std::size_t{3} * MiB, unit / 2 + 4096, 2 * unit + 8 * MiB}) {
    auto one = fill(rng, "weights", 1, n);
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

using CopyKernel = tagmem_test;

TEST_F(CopyKernel, AlwaysReloadsEveryByte) {
  restart_with("always");
  auto rng = rng_for_test();
  auto all = weights_of(rng);
  for (int round = 0; round < 3; ++round) {
    TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_reload(weights, 1, 0));
    EXPECT_EQ(corrupted(all), 0u) << "round " << round;
    refill(rng, all);
  }
  for (const filled& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
}

TEST_F(CopyKernel, OffAndAfterReleaseReloadEveryByte) {
  for (const char* use : {"off", "after_release"}) {
    restart_with(use);
    auto rng = rng_for_test();
    auto all = weights_of(rng);
    release_clock::note(std::size_t{60} << 30);  // as if 60 GiB had just gone back
    TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
    TAGMEM_OK(tagmem_reload(weights, 1, 0));
    EXPECT_EQ(corrupted(all), 0u) << use;
    release_clock::reset();
    for (const filled& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
  }
}

// Note [release aftermath]'s arithmetic, with margins of hundreds of milliseconds for a slow run.
TEST(ReleaseClock, OwesTimeByTheGiBCountsAboveItsFloorAndCaps) {
  using std::chrono::milliseconds;
  constexpr std::size_t GiB = std::size_t{1} << 30;
  release_clock::reset();
  EXPECT_EQ(release_clock::owed().count(), 0);
  EXPECT_FALSE(release_clock::after_release());
  release_clock::note(GiB / 2 - 1);  // rounds down to whole MiB: 511 MiB owe 7.98 ms
  EXPECT_LE(release_clock::owed(), milliseconds(8));
  release_clock::reset();
  release_clock::note(16 * GiB);  // 256 ms: below the 24 GiB floor
  EXPECT_GT(release_clock::owed(), milliseconds(0));
  EXPECT_LE(release_clock::owed(), release_clock::time_per_gib * 16);
  EXPECT_FALSE(release_clock::after_release());
  release_clock::note(44 * GiB);  // added to what is still owed: 60 GiB, 960 ms
  EXPECT_TRUE(release_clock::after_release());
  EXPECT_GT(release_clock::owed(), release_clock::least);
  EXPECT_LE(release_clock::owed(), release_clock::time_per_gib * 60);
  release_clock::note(std::size_t{1} << 48);  // no overflow; never more than `longest`
  EXPECT_LE(release_clock::owed(), release_clock::longest);
  EXPECT_GT(release_clock::owed(), release_clock::longest - milliseconds(500));
  release_clock::reset();
  EXPECT_FALSE(release_clock::after_release());
}

using EmulatorCopyKernel = tagmem_test;

std::uint64_t launches() { return emulator().call_count("cuLaunchKernel"); }

// The default: a reload shares its copies with the kernel only while a release is recent, and a
// DISCARD offload's release is one. (So is a BACKUP offload's: the clock is reset after those
// below that must not count.)
TEST_F(EmulatorCopyKernel, AfterReleaseUsesTheKernelOnlyAfterARelease) {
  restart_with("after_release");
  release_clock::reset();
  auto rng = rng_for_test();
  auto all = weights_of(rng);
  void* kv = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&kv, std::size_t{6} << 30, "kv", 0, nullptr));
  const char* kv_tag[] = {"kv"};

  TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
  release_clock::reset();
  std::uint64_t before = launches();
  TAGMEM_OK(tagmem_reload(weights, 1, 0));
  EXPECT_EQ(launches() - before, 0u) << "no release";
  EXPECT_EQ(corrupted(all), 0u);

  const std::uint64_t noted = release_clock::bytes_noted();
  TAGMEM_OK(tagmem_offload(kv_tag, 1, 0, TAGMEM_DISCARD));
  TAGMEM_OK(tagmem_wait_released(0));
  EXPECT_GE(release_clock::bytes_noted() - noted, std::uint64_t{6} << 30)
      << "the DISCARD offload's release counts";
  EXPECT_FALSE(release_clock::after_release()) << "6 GiB is less than a release that counts";
  TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
  release_clock::note(std::size_t{1} << 40);  // the longest window: outlasts a sanitized run
  before = launches();
  TAGMEM_OK(tagmem_reload(weights, 1, 0));
  EXPECT_GT(launches() - before, 0u) << "reload right after a release";
  EXPECT_EQ(corrupted(all), 0u);

  refill(rng, all);
  TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
  release_clock::reset();
  before = launches();
  TAGMEM_OK(tagmem_reload(weights, 1, 0));
  EXPECT_EQ(launches() - before, 0u) << "the window is over";
  EXPECT_EQ(corrupted(all), 0u);
  for (const filled& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
  TAGMEM_OK(tagmem_free(kv, nullptr));
}

TEST_F(EmulatorCopyKernel, OffNeverLaunches) {
  restart_with("off");
  auto rng = rng_for_test();
  auto all = weights_of(rng);
  release_clock::note(std::size_t{60} << 30);
  const std::uint64_t before = launches();
  TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(weights, 1, 0));
  EXPECT_EQ(launches() - before, 0u);
  EXPECT_EQ(corrupted(all), 0u);
  release_clock::reset();
  for (const filled& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
}

// A kernel that cannot be loaded (when tagmem sets the device up) leaves every copy to the copy
// engines.
TEST_F(EmulatorCopyKernel, AKernelThatDoesNotLoadLeavesTheCopyEngines) {
  for (const char* call : {"cuModuleLoadData", "cuModuleGetFunction"}) {
    ASSERT_EQ(emulator().fail_call(call, 1, CUDA_ERROR_INVALID_IMAGE), 0);
    restart_with("always");
    void* first = nullptr;  // sets device 0 up, if tagmem_init did not
    TAGMEM_OK(tagmem_malloc_tagged(&first, 1 << 20, "weights", 0, nullptr));
    TAGMEM_OK(tagmem_free(first, nullptr));
    EXPECT_EQ(emulator().call_count(call) > 0, true);
    emulator().clear_faults();
    auto rng = rng_for_test();
    auto all = weights_of(rng, weights_size::small);
    TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
    const std::uint64_t before = launches();
    TAGMEM_OK(tagmem_reload(weights, 1, 0));
    EXPECT_EQ(launches() - before, 0u) << call;
    EXPECT_EQ(corrupted(all), 0u) << call;
    for (const filled& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
  }
}

// Every driver call a shared reload makes fails once, in turn: the reload either succeeds with
// every byte, or fails with the tag still offloaded and its backup whole, and a retry restores it.
TEST_F(EmulatorCopyKernel, EachCallOfASharedReloadFailingLosesNothing) {
  restart_with("always");
  auto rng = rng_for_test();
  auto all = weights_of(rng, weights_size::small);
  TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(tagmem_reload(weights, 1, 0));  // loads the kernel: the sweep sees steady reloads
  const std::uint64_t total_before = emulator().call_count(nullptr);
  TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
  const std::uint64_t offload_calls = emulator().call_count(nullptr) - total_before;
  TAGMEM_OK(tagmem_reload(weights, 1, 0));
  const std::uint64_t reload_calls = emulator().call_count(nullptr) - total_before - offload_calls;
  ASSERT_GT(reload_calls, 10u);
  std::uint64_t failed = 0;
  for (std::uint64_t n = 1; n <= reload_calls; ++n) {
    refill(rng, all);
    TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
    ASSERT_EQ(emulator().fail_call(nullptr, n, CUDA_ERROR_UNKNOWN), 0);
    const tagmem_status s = tagmem_reload(weights, 1, 0);
    emulator().clear_faults();
    for (int d = 0; d < emulator().device_count(); ++d) emulator().clear_sticky_error(d);
    if (s != TAGMEM_SUCCESS) {
      ++failed;
      EXPECT_EQ(state_of("weights"), TAGMEM_OFFLOADED_BACKUP) << "call " << n;
      TAGMEM_OK(tagmem_reload(weights, 1, 0));
    }
    ASSERT_EQ(corrupted(all), 0u) << "call " << n << (s == TAGMEM_SUCCESS ? "" : " (retried)");
  }
  EXPECT_GT(failed, 0u);
  for (const filled& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
}

// A query of a piece's event that fails after the queries before it succeeded (those events went
// back to the device's pool) gives no event back twice: at shutdown each one is destroyed once.
TEST_F(EmulatorCopyKernel, AFailedQueryGivesEveryEventBackOnce) {
  restart_with("always", "1MiB");  // many pieces: lanes full, finished ones queried in turn
  const std::uint64_t created = emulator().call_count("cuEventCreate");
  const std::uint64_t destroyed = emulator().call_count("cuEventDestroy");
  auto rng = rng_for_test();
  auto all = weights_of(rng, weights_size::small);
  TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
  std::uint64_t queries = emulator().call_count("cuEventQuery");
  TAGMEM_OK(tagmem_reload(weights, 1, 0));
  queries = emulator().call_count("cuEventQuery") - queries;
  ASSERT_GT(queries, 20u);
  // The first queries of a reload: enough for lanes that hold finished and running pieces.
  for (std::uint64_t n = 1; n <= std::min<std::uint64_t>(queries, 40); ++n) {
    TAGMEM_OK(tagmem_offload(weights, 1, 0, TAGMEM_BACKUP));
    ASSERT_EQ(emulator().fail_call("cuEventQuery", n, CUDA_ERROR_UNKNOWN), 0);
    const tagmem_status s = tagmem_reload(weights, 1, 0);
    emulator().clear_faults();
    if (s != TAGMEM_SUCCESS) TAGMEM_OK(tagmem_reload(weights, 1, 0));
    ASSERT_EQ(corrupted(all), 0u) << "query " << n;
  }
  for (const filled& a : all) TAGMEM_OK(tagmem_free(a.ptr, nullptr));
  TAGMEM_OK(tagmem_shutdown());
  EXPECT_GT(emulator().call_count("cuEventCreate") - created, 0u) << queries << " queries";
  EXPECT_EQ(emulator().call_count("cuEventDestroy") - destroyed,
            emulator().call_count("cuEventCreate") - created);
  TAGMEM_OK(tagmem_init(nullptr));
}

}  // namespace
}  // namespace tagmem::test
