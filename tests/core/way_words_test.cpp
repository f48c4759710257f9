// way_words_test.cpp — the words a device's copy streams wait on (device/way_words.hpp, Note
// [copies give way] in offload/give_way.hpp): a device-to-host piece queued behind a closed word
// does not run until the word opens, then copies every byte; words are lent one at a time and
// come back open. Runs on the emulated and the real driver (cuStreamWaitValue32 on pinned host
// memory is what the real one must honour).
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "api/runtime.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "test_support.hpp"
#include "transfer/copy_queue.hpp"

namespace tagmem::test {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

using WayWords = tagmem_test;

TEST_F(WayWords, DeviceToHostPiecesWaitWhileTheWordIsClosed) {
  auto rng = rng_for_test();
  constexpr std::size_t kBytes = 8 * MiB;
  const std::vector<unsigned char> bytes = random_bytes(rng, kBytes);
  void* src = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&src, kBytes, "way", 0, nullptr));
  write_device(src, bytes.data(), kBytes);
  runtime::hold h;
  device& dev = h.dev(0);
  context_guard guard(dev.context());
  const auto& api = driver::api();
  void* host = nullptr;
  ASSERT_EQ(api.cuMemHostAlloc(&host, kBytes, 0), CUDA_SUCCESS);
  std::memset(host, 0, kBytes);
  std::uint32_t* word = dev.ways().lend();
  ASSERT_NE(word, nullptr);
  way_words::set(word, true);
  {
    copy_queue q(dev);
    q.d2h_wait_on(way_words::address(word));
    const auto base = reinterpret_cast<CUdeviceptr>(src);
    CUevent first = q.to_host({base, static_cast<char*>(host), kBytes / 2}, "way");
    CUevent second =
        q.to_host({base + kBytes / 2, static_cast<char*>(host) + kBytes / 2, kBytes / 2}, "way");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(api.cuEventQuery(first), CUDA_ERROR_NOT_READY) << "a piece ran past a closed word";
    EXPECT_EQ(api.cuEventQuery(second), CUDA_ERROR_NOT_READY) << "a piece ran past a closed word";
    const std::vector<unsigned char> zeros(kBytes, 0);
    EXPECT_EQ(std::memcmp(host, zeros.data(), kBytes), 0) << "bytes arrived past a closed word";
    way_words::set(word, false);
    q.finish();
  }
  EXPECT_EQ(std::memcmp(host, bytes.data(), kBytes), 0);
  dev.ways().give_back(word);
  ASSERT_EQ(api.cuMemFreeHost(host), CUDA_SUCCESS);
  TAGMEM_OK(tagmem_free(src, nullptr));
}

TEST_F(WayWords, LentOneAtATimeAndBackOpen) {
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, MiB, "way", 0, nullptr));  // the device exists
  runtime::hold h;
  device& dev = h.dev(0);
  context_guard guard(dev.context());
  std::vector<std::uint32_t*> lent;
  for (int i = 0; i < way_words::count; ++i) {
    lent.push_back(dev.ways().lend());
    ASSERT_NE(lent.back(), nullptr) << "word " << i;
    EXPECT_EQ(*lent.back(), 0u) << "a word lent closed";
    for (std::size_t j = 0; j + 1 < lent.size(); ++j) ASSERT_NE(lent[j], lent.back());
  }
  EXPECT_EQ(dev.ways().lend(), nullptr) << "more words lent than there are";
  way_words::set(lent[5], true);
  dev.ways().give_back(lent[5]);
  std::uint32_t* again = dev.ways().lend();
  EXPECT_EQ(again, lent[5]);
  EXPECT_EQ(*again, 0u) << "a word given back closed came back closed";
  lent[5] = again;
  for (std::uint32_t* w : lent) dev.ways().give_back(w);
  TAGMEM_OK(tagmem_free(p, nullptr));
}

}  // namespace
}  // namespace tagmem::test
