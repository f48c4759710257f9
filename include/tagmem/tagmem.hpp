// tagmem.hpp — the C++ API of tagmem, header-only over the C ABI in tagmem.h.
//
// Errors are exceptions: every function throws tagmem::error (a std::runtime_error carrying the
// tagmem_status and tagmem_last_error()'s message) where the C function would return a failure.
// Thread safety is that of the C function each one calls. Strings name tags; devices are CUDA
// ordinals or TAGMEM_CURRENT_DEVICE.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "tagmem.h"

namespace tagmem {

// A failed tagmem call: code() is the tagmem_status, what() the message.
class api_error : public std::runtime_error {
 public:
  api_error(tagmem_status code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  tagmem_status code() const noexcept { return code_; }

 private:
  tagmem_status code_;
};

// Throws api_error for a failed status, with the calling thread's last error message.
inline void check(tagmem_status status) {
  if (status != TAGMEM_SUCCESS) {
    throw api_error(status, std::string(tagmem_status_string(status)) + ": " + tagmem_last_error());
  }
}

namespace detail {
inline std::vector<const char*> c_names(const std::vector<std::string>& names) {
  std::vector<const char*> out;
  out.reserve(names.size());
  for (const auto& n : names) out.push_back(n.c_str());
  return out;
}
}  // namespace detail

// Makes `name` the thread's current tag for the scope's lifetime (push on construction, pop on
// destruction). Not copyable or movable: scopes nest strictly.
class tag_scope {
 public:
  explicit tag_scope(const std::string& name) { check(tagmem_push_tag(name.c_str())); }
  ~tag_scope() { tagmem_pop_tag(); }
  tag_scope(const tag_scope&) = delete;
  tag_scope& operator=(const tag_scope&) = delete;
};

// Allocates in the current tag / in `tag`. See tagmem_malloc.
inline void* allocate(std::size_t size, int device = TAGMEM_CURRENT_DEVICE,
                      tagmem_stream stream = nullptr) {
  void* p = nullptr;
  check(tagmem_malloc(&p, size, device, stream));
  return p;
}
inline void* allocate(std::size_t size, const std::string& tag, int device = TAGMEM_CURRENT_DEVICE,
                      tagmem_stream stream = nullptr) {
  void* p = nullptr;
  check(tagmem_malloc_tagged(&p, size, tag.c_str(), device, stream));
  return p;
}
inline void deallocate(void* p, tagmem_stream stream = nullptr) { check(tagmem_free(p, stream)); }

// Offloads, reloads or swaps whole tags. See tagmem_offload / tagmem_reload / tagmem_swap.
inline void offload(const std::vector<std::string>& tags, tagmem_offload_mode mode = TAGMEM_BACKUP,
                    int device = TAGMEM_CURRENT_DEVICE) {
  auto names = detail::c_names(tags);
  check(tagmem_offload(names.data(), names.size(), device, mode));
}
inline void reload(const std::vector<std::string>& tags, int device = TAGMEM_CURRENT_DEVICE) {
  auto names = detail::c_names(tags);
  check(tagmem_reload(names.data(), names.size(), device));
}
inline void swap(const std::vector<std::string>& out, const std::vector<std::string>& in,
                 tagmem_offload_mode mode = TAGMEM_BACKUP, int device = TAGMEM_CURRENT_DEVICE) {
  auto o = detail::c_names(out);
  auto i = detail::c_names(in);
  check(tagmem_swap(o.data(), o.size(), i.data(), i.size(), device, mode));
}
inline void empty_cache(int device = TAGMEM_CURRENT_DEVICE) { check(tagmem_empty_cache(device)); }
inline void wait_released(int device = TAGMEM_CURRENT_DEVICE) {
  check(tagmem_wait_released(device));
}

inline tagmem_tag_stats tag_stats(const std::string& tag, int device = TAGMEM_CURRENT_DEVICE) {
  tagmem_tag_stats s{};
  check(tagmem_tag_stats_get(tag.c_str(), device, &s));
  return s;
}
inline tagmem_device_stats device_stats(int device = TAGMEM_CURRENT_DEVICE) {
  tagmem_device_stats s{};
  check(tagmem_device_stats_get(device, &s));
  return s;
}

// A device allocation owned like a unique_ptr: freed (on its stream) when destroyed.
class buffer {
 public:
  buffer() = default;
  buffer(std::size_t size, const std::string& tag, int device = TAGMEM_CURRENT_DEVICE,
         tagmem_stream stream = nullptr)
      : ptr_(allocate(size, tag, device, stream)), size_(size), stream_(stream) {}
  ~buffer() { reset(); }
  buffer(buffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_), stream_(o.stream_) {
    o.ptr_ = nullptr;
  }
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = o.ptr_;
      size_ = o.size_;
      stream_ = o.stream_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return size_; }
  void reset() noexcept {
    if (ptr_) tagmem_free(ptr_, stream_);
    ptr_ = nullptr;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t size_ = 0;
  tagmem_stream stream_ = nullptr;
};

}  // namespace tagmem
