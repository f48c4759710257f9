// libtorch_test.cpp — the libtorch installer end to end: at::Tensors created in tags keep their
// data_ptr() and values across offload/reload (backup) and stay usable after a discard cycle.
//
// Usage: tagmem_libtorch_test           the main test (install() first, then CUDA tensors)
//        tagmem_libtorch_test late      install() after CUDA initialised must throw api_error
//        tagmem_libtorch_test record [untracked]
//            a tensor recorded on a busy side stream is freed and its memory allocated again:
//            the new bytes must survive the side stream's late write (with "untracked", installed
//            without record-stream tracking: they must be overwritten, which shows the test can
//            fail)
// Exits non-zero if any check fails; each check prints PASS or FAIL with what it compared.
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "tagmem_libtorch.hpp"

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

std::string tag_of(const void* p) {
  char name[TAGMEM_MAX_TAG_NAME + 1] = {};
  if (tagmem_pointer_info(p, name, sizeof(name), nullptr, nullptr, nullptr) != TAGMEM_SUCCESS) {
    return "<not tagmem>";
  }
  return name;
}

size_t device_free() { return tagmem::device_stats(0).device_free_bytes; }  // the driver's view

int late() {
  auto t = torch::ones({16}, torch::kCUDA);  // initialises CUDA and PyTorch's allocator
  try {
    tagmem::libtorch::install();
    check(false, "install() after CUDA initialised throws");
  } catch (const tagmem::api_error& e) {
    check(e.code() == TAGMEM_ERROR_INVALID_ARGUMENT &&
              std::strstr(e.what(), "before CUDA initialises") != nullptr,
          std::string("install() after CUDA initialised throws: ") + e.what());
  }
  check(t.sum().item<float>() == 16.0f, "PyTorch's own allocator still works");
  return g_failures == 0 ? 0 : 1;
}

// Note [recorded stream test]: x lives on the default stream and is used on a side stream that is
// busy (a long sleep kernel, then a write of x). x is recorded there and freed; y, allocated at
// once on the default stream, gets x's memory. Tracked, y's allocation waits for the side
// stream's work before the memory is handed out, so the random bytes copied into y survive;
// untracked, the side stream's late write lands on them.
int record(bool expect_overwritten) {
  tagmem::libtorch::install(/*track_record_streams=*/!expect_overwritten);
  const int64_t n = 64 << 20;
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8);
  torch::manual_seed(4321);
  const at::Tensor data = torch::randint(0, 256, {n}, torch::TensorOptions().dtype(torch::kUInt8));
  at::Tensor x = torch::zeros({n}, opts);
  void* const x_ptr = x.data_ptr();
  torch::cuda::synchronize();
  auto side = c10::cuda::getStreamFromPool(false, 0);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    at::cuda::sleep(int64_t(3) << 30);  // about a second or more of clock cycles
    x.fill_(0xA5);
  }
  x.record_stream(side);
  x.reset();
  at::Tensor y = torch::empty({n}, opts);
  check(y.data_ptr() == x_ptr, "y got x's memory (else the test shows nothing)");
  y.copy_(data.to(torch::kCUDA));
  torch::cuda::synchronize();
  const int64_t differing = y.cpu().ne(data).sum().item<int64_t>();
  if (expect_overwritten) {
    check(differing > 0, "untracked: the side stream's late write overwrote y (" +
                             std::to_string(differing) + " bytes differ)");
  } else {
    check(differing == 0,
          "tracked: no byte of y overwritten (" + std::to_string(differing) + " bytes differ)");
  }
  std::printf("%s: %d failed check(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "late") == 0) return late();
  if (argc > 1 && std::strcmp(argv[1], "record") == 0) {
    return record(argc > 2 && std::strcmp(argv[2], "untracked") == 0);
  }

  tagmem::libtorch::install();
  tagmem::libtorch::install();  // again: harmless
  check(tagmem::libtorch::installed(), "installed() after install()");

  torch::manual_seed(1234);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  at::Tensor w, flat, other;
  {
    tagmem::tag_scope scope("weights");
    w = torch::randn({1024, 1024}, opts);
    flat = torch::randn({1 << 22}, opts);  // 16 MiB, viewed below at a nonzero offset
  }
  other = torch::randn({256}, opts);  // outside any scope: tag "default"
  at::Tensor view = flat.narrow(0, 12345, 100000).view({1000, 100});
  check(tag_of(w.data_ptr()) == "weights", "a tensor created in a scope is in its tag");
  check(tag_of(view.data_ptr()) == "weights", "a view at a nonzero offset is in its base's tag");
  check(tag_of(other.data_ptr()) == "default", "a tensor outside any scope is in 'default'");

  const at::Tensor w_cpu = w.cpu(), view_cpu = view.cpu(), x = torch::randn({1024, 64}, opts);
  const at::Tensor product = torch::matmul(w, x).cpu();
  void* const w_ptr = w.data_ptr();
  void* const view_ptr = view.data_ptr();

  const size_t free_before = device_free();
  tagmem::offload({"weights"});
  const auto offloaded = tagmem::tag_stats("weights", 0);
  check(offloaded.state == TAGMEM_OFFLOADED_BACKUP && offloaded.mapped_bytes == 0,
        "offload(backup) releases the tag's device memory");
  check(device_free() >= free_before + (16u << 20), "the driver sees >= 16 MiB more free memory");
  try {
    tagmem::tag_scope scope("weights");
    auto t = torch::empty({10}, opts);
    check(false, "allocating in an offloaded tag throws");
  } catch (const c10::Error& e) {
    check(std::strstr(e.what(), "TAGMEM_ERROR_TAG_OFFLOADED") != nullptr,
          "allocating in an offloaded tag throws c10::Error with tagmem's message");
  }

  tagmem::reload({"weights"});
  check(w.data_ptr() == w_ptr && view.data_ptr() == view_ptr, "data_ptr() unchanged by reload");
  check(torch::equal(w.cpu(), w_cpu), "weights bit-identical after reload");
  check(torch::equal(view.cpu(), view_cpu), "view at a nonzero offset bit-identical after reload");
  check(torch::equal(torch::matmul(w, x).cpu(), product), "matmul after reload bit-identical");

  tagmem::offload({"weights"}, TAGMEM_DISCARD);
  tagmem::reload({"weights"});
  w.copy_(w_cpu.to(torch::kCUDA));
  check(torch::equal(w.cpu(), w_cpu), "a discarded-and-reloaded tag is writable again");

  other.reset();
  w.reset();
  view.reset();
  flat.reset();
  check(tagmem::tag_stats("weights", 0).live_allocations == 0,
        "freeing the tensors frees their tagmem allocations");
  // Every CUDA allocation of this program went through tagmem: PyTorch's statistics must add
  // up to what tagmem's tags were asked for.
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const int64_t requested = int64_t(tagmem::tag_stats("weights", 0).requested_bytes +
                                    tagmem::tag_stats("default", 0).requested_bytes);
  check(stats.allocated_bytes[0].current == requested,
        "getDeviceStats(): allocated bytes " + std::to_string(stats.allocated_bytes[0].current) +
            " == tagmem's requested bytes " + std::to_string(requested));
  check(stats.allocated_bytes[0].peak >= int64_t(20) << 20, "getDeviceStats(): peak >= 20 MiB");
  c10::cuda::CUDACachingAllocator::emptyCache();  // what torch.cuda.empty_cache() calls
  check(tagmem::tag_stats("weights", 0).mapped_bytes == 0,
        "PyTorch's emptyCache() returns the memory through tagmem");

  std::printf("%s: %d failed check(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
