// libtorch_test.cpp — the libtorch installer end to end: at::Tensors created in tags keep their
// data_ptr() and values across offload/reload (backup) and stay usable after a discard cycle.
//
// Usage: tagmem_libtorch_test           the main test (install() first, then CUDA tensors)
//        tagmem_libtorch_test late      install() after CUDA initialised must throw api_error
// Exits non-zero if any check fails; each check prints PASS or FAIL with what it compared.
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

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "late") == 0) return late();

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
  tagmem::empty_cache();
  check(tagmem::tag_stats("weights", 0).mapped_bytes == 0, "empty_cache() returns the memory");

  std::printf("%s: %d failed check(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
