// fault_cycle.cpp — the steps of the cycle, their completion and the byte checks (see header).
#include "fault_cycle.hpp"

#include <cstring>
#include <utility>

#include "thread_exit_call.hpp"

namespace tagmem::reliability {
namespace {

int tag_index(const char* tag) {
  for (int i = 0; i < 3; ++i) {
    if (std::strcmp(fault_cycle::kTags[i], tag) == 0) return i;
  }
  return -1;
}

std::string list(const std::vector<const char*>& tags) {
  std::string out = "{";
  for (std::size_t i = 0; i < tags.size(); ++i) out += (i ? "," : "") + std::string(tags[i]);
  return out + "}";
}

}  // namespace

fault_cycle::fault_cycle(std::uint64_t seed) : rng_(seed) {
  // Requests that share 2 MiB chunks and one with a segment of its own (12 MiB), kept small so
  // that the sweeps, which run the cycle about a thousand times, stay fast.
  const std::pair<const char*, std::size_t> sizes[] = {
      {"weights", 3000},      {"weights", 200000},
      {"weights", 900 << 10}, {"weights", (10 << 20) + 1},
      {"optim", 64 << 10},    {"optim", 700 << 10},
      {"kv", 1 << 20},        {"kv", 300 << 10}};
  for (const auto& [tag, size] : sizes) {
    allocation a;
    a.tag = tag;
    a.size = size;
    allocations_.push_back(std::move(a));
  }
  auto add = [&](kind what, std::size_t index, std::vector<const char*> out,
                 std::vector<const char*> in, tagmem_offload_mode mode) {
    steps_.push_back(step{what, index, std::move(out), std::move(in), mode});
  };
  for (std::size_t i = 0; i < allocations_.size(); ++i) add(kind::allocate, i, {}, {}, {});
  add(kind::offload, 0, {"weights", "optim"}, {}, TAGMEM_BACKUP);
  add(kind::offload, 0, {"kv"}, {}, TAGMEM_DISCARD);
  add(kind::free, 4, {}, {}, {});  // bookkeeping only: optim is offloaded
  add(kind::reload, 0, {}, {"weights"}, {});
  add(kind::swap, 0, {"weights"}, {"optim", "kv"}, TAGMEM_BACKUP);
  add(kind::swap, 0, {"kv"}, {"weights"}, TAGMEM_DISCARD);
  add(kind::reload, 0, {}, {"kv"}, {});
  add(kind::empty_cache, 0, {}, {}, {});
  for (std::size_t i = 0; i < allocations_.size(); ++i) {
    const kind how = i == 1   ? kind::free_in_exit
                     : i == 6 ? kind::free_as_exit_first_call
                              : kind::free;
    if (i != 4) add(how, i, {}, {}, {});
  }
  add(kind::empty_cache, 0, {}, {}, {});
}

std::string fault_cycle::describe(std::size_t i) const {
  const step& s = steps_[i];
  switch (s.what) {
    case kind::allocate:
      return "allocate " + std::to_string(allocations_[s.index].size) + " in " +
             allocations_[s.index].tag;
    case kind::free:
      return "free allocation " + std::to_string(s.index);
    case kind::free_in_exit:
      return "free allocation " + std::to_string(s.index) +
             " at the exit of a thread that used tagmem";
    case kind::free_as_exit_first_call:
      return "free allocation " + std::to_string(s.index) +
             " as a thread's first call, at its exit";
    case kind::offload:
      return "offload " + list(s.out) + (s.mode == TAGMEM_BACKUP ? " BACKUP" : " DISCARD");
    case kind::reload:
      return "reload " + list(s.in);
    case kind::swap:
      return "swap out " + list(s.out) + " in " + list(s.in) +
             (s.mode == TAGMEM_BACKUP ? " BACKUP" : " DISCARD");
    case kind::empty_cache:
      return "empty_cache";
  }
  return "?";
}

void fault_cycle::fill(allocation& a) {
  a.bytes.resize(a.size);
  std::size_t i = 0;
  std::uint64_t x = rng_();  // seeds a splitmix64 stream: fast enough to refill megabytes
  auto next = [&x] {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (; i + 8 <= a.size; i += 8) {
    std::uint64_t v = next();
    std::memcpy(&a.bytes[i], &v, 8);
  }
  for (; i < a.size; ++i) a.bytes[i] = static_cast<unsigned char>(next());
  std::memcpy(a.ptr, a.bytes.data(), a.size);  // emulated device memory is host memory
}

tagmem_tag_stats fault_cycle::stats(const char* tag) const {
  tagmem_tag_stats s{};
  tagmem_tag_stats_get(tag, 0, &s);
  return s;
}

tagmem_status fault_cycle::run(std::size_t i) {
  tagmem_status st = run_call(i);
  const step& s = steps_[i];
  // A DISCARD offload that failed may have dropped some of its tags' bytes before the failure,
  // even if it put the tags back (tagmem.h promises bytes only for BACKUP).
  if (st != TAGMEM_SUCCESS && s.mode == TAGMEM_DISCARD &&
      (s.what == kind::offload || s.what == kind::swap)) {
    for (const char* t : s.out) lost_[tag_index(t)] = true;
  }
  return st;
}

std::string fault_cycle::last_error() const {
  return exit_error_.empty() ? tagmem_last_error() : exit_error_;
}

tagmem_status fault_cycle::run_call(std::size_t i) {
  const step& s = steps_[i];
  switch (s.what) {
    case kind::allocate: {
      allocation& a = allocations_[s.index];
      tagmem_status st = tagmem_malloc_tagged(&a.ptr, a.size, a.tag, 0, nullptr);
      if (st == TAGMEM_SUCCESS) fill(a);
      return st;
    }
    case kind::free:
    case kind::free_in_exit:
    case kind::free_as_exit_first_call: {
      allocation& a = allocations_[s.index];
      exit_error_.clear();
      tagmem_status st =
          s.what == kind::free
              ? tagmem_free(a.ptr, nullptr)
              : free_at_thread_exit(a.ptr, nullptr, s.what == kind::free_in_exit, exit_error_);
      a.freed = st == TAGMEM_SUCCESS;
      return st;
    }
    case kind::offload:
      return tagmem_offload(s.out.data(), s.out.size(), 0, s.mode);
    case kind::reload:
      return tagmem_reload(s.in.data(), s.in.size(), 0);
    case kind::swap:
      return tagmem_swap(s.out.data(), s.out.size(), s.in.data(), s.in.size(), 0, s.mode);
    case kind::empty_cache:
      return tagmem_empty_cache(0);
  }
  return TAGMEM_ERROR_INTERNAL;
}

std::vector<const char*> fault_cycle::not_yet_offloaded(
    const std::vector<const char*>& tags) const {
  std::vector<const char*> out;
  for (const char* t : tags) {
    tagmem_tag_stats s = stats(t);
    if (s.state == TAGMEM_RESIDENT || s.mapped_bytes > 0) out.push_back(t);
  }
  return out;
}

std::vector<const char*> fault_cycle::still_offloaded(const std::vector<const char*>& tags) const {
  std::vector<const char*> out;
  for (const char* t : tags) {
    if (stats(t).state != TAGMEM_RESIDENT) out.push_back(t);
  }
  return out;
}

std::string fault_cycle::complete(std::size_t i) {
  const step& s = steps_[i];
  auto failed = [](const std::string& what) {
    return "retrying " + what + " failed: " + tagmem_last_error();
  };
  switch (s.what) {
    case kind::allocate:
    case kind::free:
    case kind::free_in_exit:
    case kind::free_as_exit_first_call:
      if (allocations_[s.index].ptr && (s.what == kind::allocate || allocations_[s.index].freed)) {
        return "";
      }
      return run_call(i) == TAGMEM_SUCCESS ? "" : failed(describe(i));
    case kind::empty_cache:
      return run_call(i) == TAGMEM_SUCCESS ? "" : failed(describe(i));
    case kind::offload:
    case kind::swap: {
      auto out = not_yet_offloaded(s.out);
      if (!out.empty() && tagmem_offload(out.data(), out.size(), 0, s.mode) != TAGMEM_SUCCESS) {
        return failed("offload " + list(out));
      }
      if (s.what == kind::offload) return "";
      [[fallthrough]];
    }
    case kind::reload: {
      auto in = still_offloaded(s.in);
      if (!in.empty() && tagmem_reload(in.data(), in.size(), 0) != TAGMEM_SUCCESS) {
        return failed("reload " + list(in));
      }
      return "";
    }
  }
  return "unknown step";
}

void fault_cycle::settle() {
  for (int t = 0; t < 3; ++t) {
    tagmem_tag_stats s = stats(kTags[t]);
    if (s.state == TAGMEM_OFFLOADED_DISCARD) lost_[t] = true;
    if (s.state != TAGMEM_RESIDENT || !lost_[t]) continue;
    for (allocation& a : allocations_) {
      if (tag_index(a.tag) == t && a.ptr && !a.freed) fill(a);
    }
    lost_[t] = false;
  }
}

std::string fault_cycle::check_bytes() {
  std::string out;
  for (std::size_t i = 0; i < allocations_.size(); ++i) {
    allocation& a = allocations_[i];
    if (!a.ptr || a.freed || lost_[tag_index(a.tag)]) continue;
    tagmem_tag_stats s = stats(a.tag);
    if (s.state != TAGMEM_RESIDENT) continue;
    if (s.mapped_bytes != s.reserved_bytes) {
      out += std::string("tag ") + a.tag + " is resident but maps " +
             std::to_string(s.mapped_bytes) + " of " + std::to_string(s.reserved_bytes) +
             " bytes; ";
      continue;
    }
    if (std::memcmp(a.ptr, a.bytes.data(), a.size) != 0) {
      out += "allocation " + std::to_string(i) + " (" + a.tag + ", " + std::to_string(a.size) +
             " bytes) lost its bytes; ";
    }
    bytes_verified_ += a.size;
  }
  return out;
}

}  // namespace tagmem::reliability
