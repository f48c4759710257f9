// threads_stress_test.cpp — concurrency without corruption, on both drivers.
//
// Worker threads allocate, write, free and verify in their own tags on two streams each, so
// blocks freed on one stream are reused on the other (Note [stream-ordered reuse]) while their
// writes may still be queued. Meanwhile an offloader thread moves other tags out and back in
// (offload, reload, swap; BACKUP and DISCARD) and verifies them after every move, and a janitor
// thread empties caches and reads statistics in a loop. Every byte written is read back and
// compared; the test ends after a fixed amount of work (no timing assertions) and a watchdog
// turns a deadlock into a failure with a message. On the emulator copies are slowed down so that
// an ordering bug (memory unmapped or reused under a queued copy) corrupts data or poisons the
// context every time instead of by chance.
//
// Knobs: TAGMEM_STRESS_THREADS (4 workers), TAGMEM_STRESS_ROUNDS (24), TAGMEM_STRESS_MAX_KIB
// (largest allocation, 512), TAGMEM_STRESS_WATCHDOG_S (600).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "driver/driver.hpp"
#include "emu_controls.hpp"
#include "stress_support.hpp"

namespace tagmem::stress {
namespace {

class Stress : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
    bind_device0();
  }
  void TearDown() override { EXPECT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error(); }
};

// The first failure of any thread, and how many there were.
class failures {
 public:
  void add(const std::string& what) {
    std::lock_guard lock(mutex_);
    if (count_++ == 0) first_ = what;
  }
  int count() {
    std::lock_guard lock(mutex_);
    return count_;
  }
  std::string first() {
    std::lock_guard lock(mutex_);
    return first_;
  }

 private:
  std::mutex mutex_;
  int count_ = 0;
  std::string first_;
};

// Aborts the process with a message if the test has not finished in time.
class watchdog {
 public:
  explicit watchdog(std::uint64_t seconds)
      : thread_([this, seconds] {
          std::unique_lock lock(mutex_);
          if (!done_cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "[stress] not finished after %llu s: deadlock?\n",
                         static_cast<unsigned long long>(seconds));
            std::abort();
          }
        }) {}
  ~watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

struct block {
  CUdeviceptr ptr;
  std::size_t size;
  CUstream stream;
  std::vector<unsigned char> bytes;
};

std::string status_text(tagmem_status s) {
  return std::string(tagmem_status_string(s)) + ": " + tagmem_last_error();
}

// One worker: its own tag, its own two streams.
void run_worker(int id, std::uint64_t rounds, std::size_t max_bytes, failures& fail,
                std::atomic<std::uint64_t>& verified) {
  const auto& api = driver::api();
  bind_device0();
  CUstream streams[2] = {};
  check_cu(api.cuStreamCreate(&streams[0], CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  check_cu(api.cuStreamCreate(&streams[1], CU_STREAM_DEFAULT), "cuStreamCreate");
  const std::string tag = "worker" + std::to_string(id);
  std::mt19937_64 rng(0x5eed + id);
  std::uniform_real_distribution<double> log_size(0.0, std::log2(double(max_bytes)));
  std::vector<block> live;
  std::vector<std::vector<unsigned char>> in_flight;  // bytes of freed blocks still being copied
  for (std::uint64_t round = 0; round < rounds && fail.count() == 0; ++round) {
    for (int i = 0; i < 48; ++i) {
      block b{0,
              std::max<std::size_t>(1, std::size_t(std::exp2(log_size(rng)))),
              streams[rng() % 2],
              {}};
      void* p = nullptr;
      tagmem_status s = tagmem_malloc_tagged(&p, b.size, tag.c_str(), 0, b.stream);
      if (s != TAGMEM_SUCCESS) return fail.add(tag + " malloc: " + status_text(s));
      b.ptr = reinterpret_cast<CUdeviceptr>(p);
      b.bytes.resize(b.size);
      fill_random(b.bytes.data(), b.size, rng());
      check_cu(api.cuMemcpyHtoDAsync(b.ptr, b.bytes.data(), b.size, b.stream), "write");
      live.push_back(std::move(b));
    }
    // Free a third while their writes may still be queued: stream-ordered, so legal.
    for (std::size_t i = 0; i < live.size();) {
      if (rng() % 3) {
        ++i;
        continue;
      }
      tagmem_status s = tagmem_free(reinterpret_cast<void*>(live[i].ptr), live[i].stream);
      if (s != TAGMEM_SUCCESS) return fail.add(tag + " free: " + status_text(s));
      in_flight.push_back(std::move(live[i].bytes));
      live[i] = std::move(live.back());
      live.pop_back();
    }
    // Read everything back on its own stream and compare.
    std::vector<std::vector<unsigned char>> got(live.size());
    for (std::size_t i = 0; i < live.size(); ++i) {
      got[i].resize(live[i].size);
      check_cu(api.cuMemcpyDtoHAsync(got[i].data(), live[i].ptr, live[i].size, live[i].stream),
               "read");
    }
    for (CUstream s : streams) check_cu(api.cuStreamSynchronize(s), "cuStreamSynchronize");
    in_flight.clear();
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (got[i] != live[i].bytes) {
        return fail.add(tag + ": allocation of " + std::to_string(live[i].size) +
                        " bytes lost its bytes in round " + std::to_string(round));
      }
      verified += live[i].size;
    }
  }
  for (block& b : live) {
    if (tagmem_free(reinterpret_cast<void*>(b.ptr), b.stream) != TAGMEM_SUCCESS) {
      fail.add(tag + " final free failed");
    }
  }
  for (CUstream s : streams) {
    api.cuStreamSynchronize(s);
    api.cuStreamDestroy(s);
  }
}

// The offloader: moves its own tags out and in, verifying after every move.
void run_offloader(std::uint64_t rounds, failures& fail, std::atomic<std::uint64_t>& verified) {
  bind_device0();
  copier io(std::size_t{8} << 20);
  struct tensor {
    CUdeviceptr ptr;
    host_buffer bytes;
  };
  const char* tags[3] = {"cold_a", "cold_b", "scratch"};
  std::vector<tensor> tensors[3];
  std::uint64_t seed = 77;
  for (int t = 0; t < 3; ++t) {
    for (std::size_t size : {std::size_t{4096}, std::size_t{300000}, std::size_t{3} << 20}) {
      void* p = nullptr;
      if (tagmem_malloc_tagged(&p, size, tags[t], 0, nullptr) != TAGMEM_SUCCESS) {
        return fail.add(std::string("offloader malloc: ") + tagmem_last_error());
      }
      tensor x{reinterpret_cast<CUdeviceptr>(p), host_buffer(size)};
      seed = fill_random(x.bytes.data(), size, seed);
      io.write(x.ptr, x.bytes.data(), size);
      tensors[t].push_back(std::move(x));
    }
  }
  auto verify = [&](int t, const char* after) {
    for (tensor& x : tensors[t]) {
      if (io.compare(x.ptr, x.bytes.data(), x.bytes.size()) != x.bytes.size()) {
        fail.add(std::string(tags[t]) + " lost its bytes after " + after);
        return false;
      }
      verified += x.bytes.size();
    }
    return true;
  };
  auto ok = [&](tagmem_status s, const char* what) {
    if (s != TAGMEM_SUCCESS) fail.add(std::string("offloader ") + what + ": " + status_text(s));
    return s == TAGMEM_SUCCESS;
  };
  const char* a[] = {"cold_a"};
  const char* b[] = {"cold_b"};
  const char* ab[] = {"cold_a", "cold_b"};
  const char* scratch[] = {"scratch"};
  for (std::uint64_t r = 0; r < rounds && fail.count() == 0; ++r) {
    if (!ok(tagmem_offload(ab, 2, 0, TAGMEM_BACKUP), "offload a,b") ||
        !ok(tagmem_reload(a, 1, 0), "reload a") || !verify(0, "reload") ||
        !ok(tagmem_swap(a, 1, b, 1, 0, TAGMEM_BACKUP), "swap a->b") || !verify(1, "swap") ||
        !ok(tagmem_reload(a, 1, 0), "reload a again") || !verify(0, "second reload") ||
        !ok(tagmem_offload(scratch, 1, 0, TAGMEM_DISCARD), "offload scratch") ||
        !ok(tagmem_reload(scratch, 1, 0), "reload scratch")) {
      return;
    }
    for (tensor& x : tensors[2]) {  // DISCARD: new contents, then checked like the others
      seed = fill_random(x.bytes.data(), x.bytes.size(), seed);
      io.write(x.ptr, x.bytes.data(), x.bytes.size());
    }
    if (!verify(2, "refill")) return;
  }
  for (auto& list : tensors) {
    for (tensor& x : list) tagmem_free(reinterpret_cast<void*>(x.ptr), nullptr);
  }
}

TEST_F(Stress, AllocatorsOnSeveralStreamsWhileAnotherThreadOffloadsAndReloads) {
  const int workers = static_cast<int>(knob("TAGMEM_STRESS_THREADS", 4));
  const std::uint64_t rounds = knob("TAGMEM_STRESS_ROUNDS", 24);
  const std::size_t max_bytes = knob("TAGMEM_STRESS_MAX_KIB", 512) << 10;
  const auto& emu = reliability::emu();
  if (emu.available) emu.set_copy_bytes_per_second(std::uint64_t{4} << 30);  // see file comment
  watchdog dog(knob("TAGMEM_STRESS_WATCHDOG_S", 600));

  failures fail;
  std::atomic<std::uint64_t> verified{0};
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> janitor_calls{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < workers; ++i) {
    threads.emplace_back([&, i] {
      try {
        run_worker(i, rounds, max_bytes, fail, verified);
      } catch (const std::exception& e) {
        fail.add(e.what());
      }
    });
  }
  threads.emplace_back([&] {
    try {
      run_offloader(rounds, fail, verified);
    } catch (const std::exception& e) {
      fail.add(e.what());
    }
  });
  std::thread janitor([&] {
    while (!done.load()) {
      tagmem_status s = tagmem_empty_cache(0);
      if (s != TAGMEM_SUCCESS) fail.add("empty_cache: " + status_text(s));
      tagmem_device_stats ds{};
      if (tagmem_device_stats_get(0, &ds) != TAGMEM_SUCCESS) fail.add("device stats failed");
      tagmem_tag_stats ts{};
      s = tagmem_tag_stats_get("worker0", 0, &ts);
      if (s != TAGMEM_SUCCESS && s != TAGMEM_ERROR_UNKNOWN_TAG) fail.add("tag stats failed");
      janitor_calls += 3;
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  done = true;
  janitor.join();
  if (emu.available) emu.set_copy_bytes_per_second(0);

  EXPECT_EQ(fail.count(), 0) << fail.first();
  EXPECT_GT(verified.load(), 0u);
  EXPECT_GT(janitor_calls.load(), 0u);
  for (int i = 0; i < workers; ++i) {
    tagmem_tag_stats s{};
    ASSERT_EQ(tagmem_tag_stats_get(("worker" + std::to_string(i)).c_str(), 0, &s), TAGMEM_SUCCESS);
    EXPECT_EQ(s.live_allocations, 0u);
    EXPECT_EQ(s.alloc_count, s.free_count);
  }
  tagmem_tag_stats cold{};
  ASSERT_EQ(tagmem_tag_stats_get("cold_a", 0, &cold), TAGMEM_SUCCESS);
  EXPECT_EQ(cold.offload_count, 2 * rounds);
  if (emu.available) {
    EXPECT_EQ(emu.sticky_error(0), CUDA_SUCCESS) << "a copy faulted";
  }
  std::printf("[stress] %d workers + offloader + janitor, %llu rounds: %llu bytes verified\n",
              workers, static_cast<unsigned long long>(rounds),
              static_cast<unsigned long long>(verified.load()));
}

// Note [offload waits] covers offload; the same hazard exists when empty_cache (or the cache
// flush an out-of-memory allocation triggers) unmaps memory whose last block was freed on a
// stream with work still queued on it. With slow emulated copies the hazard is certain: a copy
// still reading the block when its chunk is unmapped faults and poisons the context.
// Excluded from the GPU run by name (Emulator*). Each test gets a stream; whatever happens in
// it, the copy speed, the context's sticky error and the stream are put back afterwards.
class EmulatorStress : public Stress {
 protected:
  void SetUp() override {
    Stress::SetUp();
    ASSERT_TRUE(reliability::emu().available) << "needs the emulated driver";
    check_cu(driver::api().cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }
  void TearDown() override {
    if (reliability::emu().available) {
      reliability::emu().set_copy_bytes_per_second(0);
      reliability::emu().clear_sticky_error(0);
    }
    if (s_) driver::api().cuStreamDestroy(s_);
    Stress::TearDown();
  }
  CUstream s_ = nullptr;
};

TEST_F(EmulatorStress, EmptyCacheAfterAStreamOrderedFreeWaitsForQueuedCopies) {
  const auto& emu = reliability::emu();
  const auto& api = driver::api();
  CUstream s = s_;
  std::vector<unsigned char> bytes(1 << 20, 0x5a);
  emu.set_copy_bytes_per_second(std::uint64_t{20} << 20);  // 1 MiB takes 50 ms
  void* p = nullptr;
  ASSERT_EQ(tagmem_malloc_tagged(&p, bytes.size(), "queued", 0, s), TAGMEM_SUCCESS);
  check_cu(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(p), bytes.data(), bytes.size(), s),
           "cuMemcpyHtoDAsync");
  EXPECT_EQ(tagmem_free(p, s), TAGMEM_SUCCESS);  // legal: the copy is ordered before any reuse
  EXPECT_EQ(tagmem_empty_cache(0), TAGMEM_SUCCESS) << tagmem_last_error();
  const CUresult synced = api.cuStreamSynchronize(s);
  EXPECT_EQ(synced, CUDA_SUCCESS) << "the queued copy faulted: empty_cache unmapped its memory";
  EXPECT_EQ(emu.sticky_error(0), CUDA_SUCCESS);
}

// The same hazard with the cache flush on another thread: between its wait for the device and
// its unmapping, a block may be allocated, written on a stream and freed again. A thread that
// does exactly that in a loop, while another empties the cache in a loop, catches it within a
// few hundred iterations when the wait is not tied to the tag's lock.
TEST_F(EmulatorStress, EmptyCacheOnAnotherThreadNeverUnmapsUnderAQueuedCopy) {
  const auto& emu = reliability::emu();
  const auto& api = driver::api();
  CUstream s = s_;
  std::vector<unsigned char> bytes(256 << 10, 0xa5);
  emu.set_copy_bytes_per_second(std::uint64_t{1} << 30);  // 256 KiB takes 0.25 ms
  std::atomic<bool> done{false};
  failures fail;
  std::thread janitor([&] {
    while (!done.load()) {
      if (tagmem_empty_cache(0) != TAGMEM_SUCCESS) fail.add(tagmem_last_error());
    }
  });
  for (int i = 0; i < 400 && fail.count() == 0; ++i) {
    void* p = nullptr;
    if (tagmem_malloc_tagged(&p, bytes.size(), "churn", 0, s) != TAGMEM_SUCCESS) {
      fail.add(tagmem_last_error());
      break;
    }
    check_cu(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(p), bytes.data(), bytes.size(), s),
             "cuMemcpyHtoDAsync");
    if (tagmem_free(p, s) != TAGMEM_SUCCESS) fail.add(tagmem_last_error());
  }
  const CUresult synced = api.cuStreamSynchronize(s);
  done = true;
  janitor.join();
  EXPECT_EQ(fail.count(), 0) << fail.first();
  EXPECT_EQ(synced, CUDA_SUCCESS) << "a queued copy faulted: its memory was unmapped under it";
  EXPECT_EQ(emu.sticky_error(0), CUDA_SUCCESS);
}

}  // namespace
}  // namespace tagmem::stress
