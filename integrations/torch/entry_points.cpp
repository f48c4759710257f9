// entry_points.cpp — the pluggable-allocator entry points PyTorch calls (see entry_points.h).
//
// Each entry point is a thin call into tagmem's C ABI: the slot functions allocate in their bound
// tag, the global one in the calling thread's tag scope, the free function frees. State kept here
// is only the slot table and the last failure. Plain C++ on purpose: PyTorch calls these under its
// allocator lock, possibly from threads that never held the GIL, so they must never enter Python.
//
// Note [torch allocator slots]: a CUDAPluggableAllocator is two function pointers and nothing
// else, and PyTorch calls the alloc function without saying which MemPool asked for memory, from
// whichever thread needs it (autograd runs backward on per-device threads). Binding the tag through
// a thread-local scope would put gradients in the wrong tag. Instead each tag gets one of a fixed
// set of exported functions, tagmem_torch_alloc_<k>, whose slot k names the tag; a MemPool made
// from slot k's allocator therefore puts every segment in that tag, from any thread. A slot keeps
// its tag for the life of the process, because PyTorch may free a segment through it long after
// the Python side forgot the pool. The table is written once per slot (name first, then a release
// store of the flag) and read with an acquire load, so the hot path takes no lock.
#include "entry_points.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

namespace {

struct slot {
  std::atomic<bool> bound{false};
  char tag[TAGMEM_MAX_TAG_NAME + 1] = {};
};

slot g_slots[TAGMEM_TORCH_SLOTS];
std::mutex g_bind_mutex;  // serialises binding; allocation never takes it

std::atomic<uint64_t> g_failures{0};
std::mutex g_failure_mutex;
std::string g_last_failure;  // guarded by g_failure_mutex
thread_local std::string t_bind_error;

// Records a failure of `what` with the calling thread's tagmem message and returns the text.
std::string record_failure(const char* what, tagmem_status status) {
  std::string message = std::string("tagmem: ") + what + ": " + tagmem_status_string(status) +
                        ": " + tagmem_last_error();
  g_failures.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(g_failure_mutex);
  g_last_failure = message;
  return message;
}

void* slot_alloc(int k, size_t size, int device, tagmem_stream stream) noexcept {
  if (size == 0) return nullptr;
  const slot& s = g_slots[k];
  try {  // the messages below need host memory; without it the NULL alone says it failed
    if (!s.bound.load(std::memory_order_acquire)) {
      g_failures.fetch_add(1, std::memory_order_relaxed);
      std::string message = "tagmem: allocation through unbound slot " + std::to_string(k);
      std::lock_guard lock(g_failure_mutex);
      g_last_failure = std::move(message);
      return nullptr;
    }
    void* p = nullptr;
    tagmem_status status = tagmem_malloc_tagged(&p, size, s.tag, device, stream);
    if (status != TAGMEM_SUCCESS) {
      record_failure("allocation in a tag pool", status);
      return nullptr;
    }
    return p;
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

extern "C" {

tagmem_status tagmem_torch_bind_slot(int k, const char* tag) {
  auto fail = [](std::string message) {
    t_bind_error = std::move(message);
    return TAGMEM_ERROR_INVALID_ARGUMENT;
  };
  if (k < 0 || k >= TAGMEM_TORCH_SLOTS) {
    return fail("slot " + std::to_string(k) + " is out of range [0, " +
                std::to_string(TAGMEM_TORCH_SLOTS) + ")");
  }
  // tagmem_push_tag checks the name exactly as allocation will. It also creates the tag on the
  // current device, where the slot's first allocations are about to go (tagmem.torch binds with
  // the pool's device current).
  if (tagmem_status s = tagmem_push_tag(tag); s != TAGMEM_SUCCESS) {
    fail(tagmem_last_error());
    return s;
  }
  tagmem_pop_tag();
  std::lock_guard lock(g_bind_mutex);
  slot& s = g_slots[k];
  if (s.bound.load(std::memory_order_relaxed)) {
    if (std::strcmp(s.tag, tag) == 0) return TAGMEM_SUCCESS;
    return fail("slot " + std::to_string(k) + " is bound to tag '" + s.tag + "', not '" + tag +
                "'");
  }
  std::strncpy(s.tag, tag, TAGMEM_MAX_TAG_NAME);
  s.tag[TAGMEM_MAX_TAG_NAME] = '\0';
  s.bound.store(true, std::memory_order_release);
  return TAGMEM_SUCCESS;
}

const char* tagmem_torch_bind_error(void) { return t_bind_error.c_str(); }

const char* tagmem_torch_slot_tag(int k) {
  if (k < 0 || k >= TAGMEM_TORCH_SLOTS) return nullptr;
  return g_slots[k].bound.load(std::memory_order_acquire) ? g_slots[k].tag : nullptr;
}

int tagmem_torch_slot_count(void) { return TAGMEM_TORCH_SLOTS; }

void* tagmem_torch_alloc(size_t size, int device, tagmem_stream stream) {
  if (size == 0) return nullptr;
  void* p = nullptr;
  tagmem_status status = tagmem_malloc(&p, size, device, stream);
  if (status != TAGMEM_SUCCESS) {
    // PyTorch's CUDAPluggableAllocator::allocate() wraps whatever comes back in a tensor without
    // checking it, so a NULL would surface later as an illegal address. An exception reaches
    // Python as a RuntimeError with this message instead.
    throw std::runtime_error(record_failure("allocation", status));
  }
  return p;
}

void tagmem_torch_free(void* ptr, size_t, int, tagmem_stream stream) {
  if (ptr == nullptr) return;
  tagmem_status status = tagmem_free(ptr, stream);
  if (status != TAGMEM_SUCCESS) {
    try {
      std::string message = record_failure("free", status);
      std::fprintf(stderr, "%s\n", message.c_str());
    } catch (...) {
    }
  }
}

uint64_t tagmem_torch_failures(void) { return g_failures.load(std::memory_order_relaxed); }

size_t tagmem_torch_last_failure(char* buffer, size_t length) {
  std::lock_guard lock(g_failure_mutex);
  if (buffer != nullptr && length > 0) {
    size_t n = std::min(length - 1, g_last_failure.size());
    std::memcpy(buffer, g_last_failure.data(), n);
    buffer[n] = '\0';
  }
  return g_last_failure.size();
}

// ---- slot entry points (Note [torch allocator slots]) -------------------------------------------
// clang-format off
#define TAGMEM_TORCH_SLOT(k)                                                                     \
  TAGMEM_TORCH_API void* tagmem_torch_alloc_##k(size_t size, int device, tagmem_stream stream) { \
    return slot_alloc(k, size, device, stream);                                                  \
  }
#define TAGMEM_TORCH_SLOTS_8(a, b, c, d, e, f, g, h)                                    \
  TAGMEM_TORCH_SLOT(a) TAGMEM_TORCH_SLOT(b) TAGMEM_TORCH_SLOT(c) TAGMEM_TORCH_SLOT(d) \
  TAGMEM_TORCH_SLOT(e) TAGMEM_TORCH_SLOT(f) TAGMEM_TORCH_SLOT(g) TAGMEM_TORCH_SLOT(h)
// clang-format on
TAGMEM_TORCH_SLOTS_8(0, 1, 2, 3, 4, 5, 6, 7)
TAGMEM_TORCH_SLOTS_8(8, 9, 10, 11, 12, 13, 14, 15)
TAGMEM_TORCH_SLOTS_8(16, 17, 18, 19, 20, 21, 22, 23)
TAGMEM_TORCH_SLOTS_8(24, 25, 26, 27, 28, 29, 30, 31)
TAGMEM_TORCH_SLOTS_8(32, 33, 34, 35, 36, 37, 38, 39)
TAGMEM_TORCH_SLOTS_8(40, 41, 42, 43, 44, 45, 46, 47)
TAGMEM_TORCH_SLOTS_8(48, 49, 50, 51, 52, 53, 54, 55)
TAGMEM_TORCH_SLOTS_8(56, 57, 58, 59, 60, 61, 62, 63)
static_assert(TAGMEM_TORCH_SLOTS == 64, "one TAGMEM_TORCH_SLOT row per 8 slots above");

}  // extern "C"
