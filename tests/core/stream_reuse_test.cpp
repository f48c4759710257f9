// stream_reuse_test.cpp — reuse of a block freed on one stream by an allocation whose stream
// cannot be ordered after it on the device: the NULL stream, whose memory the caller may use on
// any stream at once (as cudaMalloc's), and the per-thread default stream, which is another
// stream in each thread (Note [stream-ordered reuse] in block_pool.hpp).
//
// The freeing stream first runs a long memset of an unrelated buffer, then writes old bytes into
// the block; the new owner writes new bytes at once. Reuse that is not ordered after the old work
// lets the old bytes land last. On the emulator copies are slowed so that this happens every
// time; on a GPU the memset is made large instead.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "test_support.hpp"

namespace tagmem::test {
namespace {

class StreamReuse : public tagmem_test {
 public:
  // Fills a segment of its own, so that no remainder split off it competes for the reuse.
  static constexpr std::size_t n = 12u << 20;

  void SetUp() override {
    tagmem_test::SetUp();
    // Emulator: the copies take 75 ms, the memset 200 ms. GPU: a memset of about a millisecond.
    if (using_emulator()) emulator().set_copy_bytes_per_second(std::uint64_t{160} << 20);
    delay_bytes_ = using_emulator() ? std::size_t{32} << 20 : std::size_t{2} << 30;
    TAGMEM_OK(tagmem_malloc_tagged(&delay_, delay_bytes_, "delay", 0, nullptr));
    TAGMEM_OK(tagmem_malloc_tagged(&source_, n, "source", 0, nullptr));
    auto rng = rng_for_test();
    old_ = random_bytes(rng, n);
    new_ = random_bytes(rng, n);
    write_device(source_, old_.data(), n);
  }
  void TearDown() override {
    if (using_emulator()) emulator().set_copy_bytes_per_second(0);
    tagmem_test::TearDown();
  }

  // Queues on `s` the long memset, then the old bytes into `p`.
  void write_old_late(void* p, CUstream s) {
    const auto& api = driver_api_for_tests();
    ASSERT_EQ(api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(delay_), 0, delay_bytes_, s),
              CUDA_SUCCESS);
    ASSERT_EQ(api.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(p),
                                    reinterpret_cast<CUdeviceptr>(source_), n, s),
              CUDA_SUCCESS);
  }

  // How many bytes of the block at `q` are not the new ones.
  std::size_t overwritten(void* q) const {
    const auto now = read_device(q, n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += now[i] != new_[i];
    return bad;
  }

  void* delay_ = nullptr;
  std::size_t delay_bytes_ = 0;
  void* source_ = nullptr;
  std::vector<unsigned char> old_, new_;
};

TEST_F(StreamReuse, NullStreamAllocationIsUsableOnAnyStreamAtOnce) {
  const auto& api = driver_api_for_tests();
  CUstream s = nullptr, t = nullptr;
  ASSERT_EQ(api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void* p = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&p, n, "reuse", 0, s));
  write_old_late(p, s);
  TAGMEM_OK(tagmem_free(p, s));
  void* q = nullptr;
  TAGMEM_OK(tagmem_malloc_tagged(&q, n, "reuse", 0, nullptr));
  ASSERT_EQ(q, p);
  ASSERT_EQ(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(q), new_.data(), n, t),
            CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamSynchronize(t), CUDA_SUCCESS);
  ASSERT_EQ(api.cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(overwritten(q), 0u) << "of " << n << " bytes: the freeing stream wrote after reuse";
  TAGMEM_OK(tagmem_free(q, nullptr));
  api.cuStreamDestroy(s);
  api.cuStreamDestroy(t);
}

// Thread A allocates on its per-thread stream, queues the late write there and frees the block
// on it; then this thread takes the block for `stream`, writes the new bytes with `write_new`,
// and only then lets A wait for its stream. Returns the block.
template <class WriteNew>
void* reuse_after_another_thread(StreamReuse* test, CUstream stream, WriteNew write_new) {
  std::mutex m;
  std::condition_variable cv;
  void* p = nullptr;
  bool freed = false, written = false;
  std::thread a([&] {
    use_primary_context();
    void* mine = nullptr;
    EXPECT_EQ(tagmem_malloc_tagged(&mine, StreamReuse::n, "reuse", 0, CU_STREAM_PER_THREAD),
              TAGMEM_SUCCESS);
    test->write_old_late(mine, CU_STREAM_PER_THREAD);
    EXPECT_EQ(tagmem_free(mine, CU_STREAM_PER_THREAD), TAGMEM_SUCCESS) << tagmem_last_error();
    std::unique_lock lock(m);
    p = mine;
    freed = true;
    cv.notify_all();
    cv.wait(lock, [&] { return written; });
    EXPECT_EQ(driver_api_for_tests().cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return freed; });
  }
  void* q = nullptr;
  EXPECT_EQ(tagmem_malloc_tagged(&q, StreamReuse::n, "reuse", 0, stream), TAGMEM_SUCCESS);
  EXPECT_EQ(q, p);
  if (q) write_new(q);
  {
    std::lock_guard lock(m);
    written = true;
    cv.notify_all();
  }
  a.join();
  return q;
}

TEST_F(StreamReuse, PerThreadStreamFreeIsNotReusedAtOnceByAnotherThreadsStream) {
  const auto& api = driver_api_for_tests();
  void* q = reuse_after_another_thread(this, CU_STREAM_PER_THREAD, [&](void* q) {
    EXPECT_EQ(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(q), new_.data(), n,
                                    CU_STREAM_PER_THREAD),
              CUDA_SUCCESS);
    EXPECT_EQ(api.cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  });
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(overwritten(q), 0u) << "of " << n << " bytes: the other thread wrote after reuse";
  TAGMEM_OK(tagmem_free(q, nullptr));
}

TEST_F(StreamReuse, PerThreadStreamFreeReusedOnTheNullStreamWaitsForTheFreeingThread) {
  const auto& api = driver_api_for_tests();
  CUstream t = nullptr;
  ASSERT_EQ(api.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void* q = reuse_after_another_thread(this, nullptr, [&](void* q) {
    EXPECT_EQ(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(q), new_.data(), n, t),
              CUDA_SUCCESS);
    EXPECT_EQ(api.cuStreamSynchronize(t), CUDA_SUCCESS);
  });
  api.cuStreamDestroy(t);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(overwritten(q), 0u) << "of " << n << " bytes: the other thread wrote after reuse";
  TAGMEM_OK(tagmem_free(q, nullptr));
}

}  // namespace
}  // namespace tagmem::test
