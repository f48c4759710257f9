// model.cpp — the model's bookkeeping and verify(), the comparison run after every step.
#include "model.hpp"

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "emu_controls.hpp"

namespace tagmem::fuzz {
namespace {

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

// Collects the first few differences of one verify() pass.
class findings {
 public:
  template <class... T>
  void add(const T&... parts) {
    if (count_++ >= 8) return;
    std::ostringstream s;
    (s << ... << parts);
    text_ += s.str() + "\n";
  }
  std::string text() const { return text_; }

 private:
  std::string text_;
  int count_ = 0;
};

#define EXPECT_MODEL(cond, ...)        \
  do {                                 \
    if (!(cond)) out.add(__VA_ARGS__); \
  } while (0)

void verify_scope(const model& m, findings& out) {
  EXPECT_MODEL(std::strcmp(tagmem_current_tag(), m.current_tag()) == 0, "current tag is '",
               tagmem_current_tag(), "', model says '", m.current_tag(), "'");
}

void verify_tag_list(const model& m, int d, findings& out) {
  char names[32][TAGMEM_MAX_TAG_NAME + 1];
  std::size_t count = 0;
  tagmem_status s = tagmem_list_tags(d, names, 32, &count);
  EXPECT_MODEL(s == TAGMEM_SUCCESS, "tagmem_list_tags(", d, ") failed: ", tagmem_last_error());
  if (s != TAGMEM_SUCCESS) return;
  std::set<std::string> listed(names, names + std::min<std::size_t>(count, 32));
  std::set<std::string> expected;
  for (const auto& [key, t] : m.tags) {
    if (key.first == d) expected.insert(key.second);
  }
  EXPECT_MODEL(count == expected.size() && listed == expected, "device ", d, " lists ", count,
               " tags, model has ", expected.size());
}

void verify_tag(model& m, const tag_key& key, tag_model& t, findings& out) {
  const char* name = key.second.c_str();
  tagmem_tag_stats s{};
  if (tagmem_tag_stats_get(name, key.first, &s) != TAGMEM_SUCCESS) {
    out.add("stats of tag '", name, "' on device ", key.first, " failed: ", tagmem_last_error());
    return;
  }
  std::uint64_t live = 0;
  std::size_t requested = 0, rounded = 0;
  for (const allocation& a : m.allocations) {
    if (a.device != key.first || a.tag != key.second) continue;
    ++live;
    requested += a.size;
    rounded += round_up(a.size, 256);
  }
  auto where = [&] { return "tag '" + key.second + "' dev " + std::to_string(key.first) + ": "; };
  EXPECT_MODEL(s.state == t.state, where(), "state ", s.state, ", model ", t.state);
  EXPECT_MODEL(s.live_allocations == live, where(), "live_allocations ", s.live_allocations,
               ", model ", live);
  EXPECT_MODEL(s.requested_bytes == requested, where(), "requested_bytes ", s.requested_bytes,
               ", model ", requested);
  EXPECT_MODEL(s.allocated_bytes == rounded, where(), "allocated_bytes ", s.allocated_bytes,
               ", model (requests rounded to 256) ", rounded);
  EXPECT_MODEL(s.allocated_bytes <= s.reserved_bytes, where(), "allocated ", s.allocated_bytes,
               " > reserved ", s.reserved_bytes);
  EXPECT_MODEL(s.alloc_count == t.alloc_count && s.free_count == t.free_count, where(),
               "alloc/free counts ", s.alloc_count, "/", s.free_count, ", model ", t.alloc_count,
               "/", t.free_count);
  if (t.approximate) {
    // Moved by a faulted call (Note [faults in the fuzzer]): counters only grow; adopt them.
    EXPECT_MODEL(s.offload_count >= t.offload_count && s.reload_count >= t.reload_count &&
                     s.bytes_offloaded >= t.bytes_offloaded && s.bytes_reloaded >= t.bytes_reloaded,
                 where(), "counters went backwards");
    t.offload_count = s.offload_count;
    t.reload_count = s.reload_count;
    t.bytes_offloaded = s.bytes_offloaded;
    t.bytes_reloaded = s.bytes_reloaded;
    if (t.state != TAGMEM_RESIDENT) {
      t.host_expected = s.host_bytes;
      t.pieces_expected = t.state == TAGMEM_OFFLOADED_BACKUP ? s.host_bytes : 0;
    }
  }
  EXPECT_MODEL(s.offload_count == t.offload_count && s.reload_count == t.reload_count, where(),
               "offload/reload counts ", s.offload_count, "/", s.reload_count, ", model ",
               t.offload_count, "/", t.reload_count);
  EXPECT_MODEL(s.bytes_offloaded == t.bytes_offloaded && s.bytes_reloaded == t.bytes_reloaded,
               where(), "bytes offloaded/reloaded ", s.bytes_offloaded, "/", s.bytes_reloaded,
               ", model ", t.bytes_offloaded, "/", t.bytes_reloaded);
  if (t.freed_while_offloaded && t.state != TAGMEM_RESIDENT) {
    // A free in an offloaded tag gives the freed block's host copy back, with the free blocks
    // beside it (Note [a freed allocation's host copy]): what is left never grows, and the
    // reload copies back that much less. The bytes of the live allocations are checked as ever.
    EXPECT_MODEL(s.host_bytes <= t.host_expected, where(), "a free grew host_bytes to ",
                 s.host_bytes, " from ", t.host_expected);
    std::size_t given_back = t.host_expected - std::min(t.host_expected, s.host_bytes);
    t.host_expected -= given_back;
    t.pieces_expected -= std::min(given_back, t.pieces_expected);
  }
  t.freed_while_offloaded = false;
  EXPECT_MODEL(s.host_bytes == (t.state == TAGMEM_RESIDENT ? 0 : t.host_expected), where(),
               "host_bytes ", s.host_bytes, ", model ",
               t.state == TAGMEM_RESIDENT ? 0 : t.host_expected);
  EXPECT_MODEL(s.virtual_bytes >= s.reserved_bytes && s.virtual_bytes >= t.max_virtual, where(),
               "virtual_bytes ", s.virtual_bytes, " below reserved ", s.reserved_bytes,
               " or its earlier ", t.max_virtual);
  if (t.state == TAGMEM_RESIDENT) {
    EXPECT_MODEL(s.mapped_bytes == s.reserved_bytes, where(), "resident with mapped ",
                 s.mapped_bytes, " != reserved ", s.reserved_bytes);
  } else {
    EXPECT_MODEL(s.mapped_bytes == 0 || t.cut_short, where(), "offloaded but maps ", s.mapped_bytes,
                 " bytes");
    EXPECT_MODEL(s.reserved_bytes == t.reserved_at_offload, where(), "offloaded reserved ",
                 s.reserved_bytes, ", at offload ", t.reserved_at_offload);
  }
  t.max_virtual = std::max(t.max_virtual, s.virtual_bytes);
  t.seen = s;
}

void verify_allocations(model& m, findings& out, std::uint64_t* bytes_verified) {
  for (const allocation& a : m.allocations) {
    const tag_model* t = m.find(a.device, a.tag);
    if (!t) {
      out.add("allocation ", a.ptr, " in unknown tag '", a.tag, "'");
      continue;
    }
    // Bookkeeping answers for any tag state; the address never changes.
    for (CUdeviceptr probe : {a.ptr, a.ptr + a.size - 1}) {
      char tag[TAGMEM_MAX_TAG_NAME + 1] = {};
      int device = -1;
      void* base = nullptr;
      std::size_t size = 0;
      tagmem_status s = tagmem_pointer_info(reinterpret_cast<void*>(probe), tag, sizeof tag,
                                            &device, &base, &size);
      EXPECT_MODEL(s == TAGMEM_SUCCESS && a.tag == tag && device == a.device &&
                       reinterpret_cast<CUdeviceptr>(base) == a.ptr && size == a.size,
                   "pointer_info(", probe, ") of allocation ", a.ptr, "+", a.size, " in '", a.tag,
                   "': status ", s, " tag '", tag, "' device ", device, " base ", base, " size ",
                   size);
    }
    if (t->state != TAGMEM_RESIDENT || a.window == kUndefined) continue;
    const void* at = reinterpret_cast<const void*>(a.ptr);
    if (std::memcmp(at, pattern() + a.window, a.size) != 0) {
      const auto* got = static_cast<const unsigned char*>(at);
      std::size_t i = 0;
      while (got[i] == pattern()[a.window + i]) ++i;
      out.add("allocation ", a.ptr, "+", a.size, " in '", a.tag, "' dev ", a.device,
              " lost its bytes: first difference at offset ", i);
    }
    *bytes_verified += a.size;
  }
}

void verify_devices(model& m, findings& out) {
  const reliability::emu_controls& emu = reliability::emu();
  std::size_t host_used = 0;
  std::uint64_t resident_mappings = 0;
  bool any_cut_short = false;
  for (auto& [key, t] : m.tags) {
    host_used += t.seen.host_bytes;
    if (t.state == TAGMEM_RESIDENT) resident_mappings += t.seen.mappings;
    any_cut_short |= t.cut_short && t.state != TAGMEM_RESIDENT;
  }
  for (int d = 0; d < kDevices; ++d) {
    std::size_t allocated = 0, reserved = 0, mapped = 0, count = 0;
    for (auto& [key, t] : m.tags) {
      if (key.first != d) continue;
      allocated += t.seen.allocated_bytes;
      reserved += t.seen.reserved_bytes;
      mapped += t.seen.mapped_bytes;
      ++count;
    }
    // A release that failed is retried by the device's release thread (Note [release later]), so
    // while one is pending the emulator's use may fall between two reads: free memory must lie
    // between what the reads before and after the statistics give.
    const std::uint64_t used_before = emu.device_used_bytes(d);
    tagmem_device_stats ds{};
    if (tagmem_device_stats_get(d, &ds) != TAGMEM_SUCCESS) {
      out.add("device stats ", d, " failed: ", tagmem_last_error());
      continue;
    }
    EXPECT_MODEL(ds.allocated_bytes == allocated && ds.reserved_bytes == reserved &&
                     ds.mapped_bytes == mapped && ds.tags == count,
                 "device ", d, " stats (allocated, reserved, mapped, tags) ", ds.allocated_bytes,
                 ",", ds.reserved_bytes, ",", ds.mapped_bytes, ",", ds.tags,
                 " differ from the sums over its tags ", allocated, ",", reserved, ",", mapped, ",",
                 count);
    const std::uint64_t used = emu.device_used_bytes(d);
    EXPECT_MODEL(used == mapped || (m.release_pending && used > mapped), "emulator device ", d,
                 " uses ", used, " bytes, tags map ", mapped);
    const std::uint64_t total = m.device_bytes[d];
    const std::uint64_t free_least = total - std::min(used_before, total);
    const std::uint64_t free_most = total - std::min(used, total);
    EXPECT_MODEL(ds.device_total_bytes == total &&
                     (ds.device_free_bytes == free_most ||
                      (m.release_pending && ds.device_free_bytes >= free_least &&
                       ds.device_free_bytes <= free_most)),
                 "device ", d, " reports free/total ", ds.device_free_bytes, "/",
                 ds.device_total_bytes, "; the emulator's use gives ", free_least, " to ",
                 free_most, " free");
    EXPECT_MODEL(emu.sticky_error(d) == CUDA_SUCCESS, "device ", d,
                 " context is poisoned (an asynchronous copy faulted): CUresult ",
                 emu.sticky_error(d));
    if (d == 0) {
      EXPECT_MODEL(ds.host_used_bytes == host_used, "host store used ", ds.host_used_bytes,
                   ", tags hold ", host_used);
      EXPECT_MODEL(ds.host_pinned_bytes >= ds.host_used_bytes &&
                       ds.host_pinned_high_water >= ds.host_pinned_bytes,
                   "host store pinned ", ds.host_pinned_bytes, " high water ",
                   ds.host_pinned_high_water, " used ", ds.host_used_bytes);
      EXPECT_MODEL(emu.pinned_host_bytes() == ds.host_pinned_bytes, "emulator pins ",
                   emu.pinned_host_bytes(), " host bytes, the store reports ",
                   ds.host_pinned_bytes);
    }
  }
  // Each physical allocation tagmem holds is mapped exactly once; none is left unreleased.
  const std::uint64_t handles = emu.live_allocations(), mappings = emu.live_mappings();
  EXPECT_MODEL(handles == mappings || (m.release_pending && handles > mappings), "emulator holds ",
               handles, " physical allocations but ", mappings, " mappings (a handle was leaked)");
  if (handles == mappings) m.release_pending = false;
  if (!any_cut_short) {
    EXPECT_MODEL(emu.live_mappings() == resident_mappings, "emulator has ", emu.live_mappings(),
                 " mappings, resident tags record ", resident_mappings);
  }
}

}  // namespace

const unsigned char* pattern() {
  static const std::vector<unsigned char> bytes = [] {
    std::vector<unsigned char> v(kPatternBytes);
    std::uint64_t x = 0x9e3779b97f4a7c15ull;
    for (std::size_t i = 0; i < v.size(); i += 8) {
      x += 0x9e3779b97f4a7c15ull;  // splitmix64
      std::uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      std::memcpy(&v[i], &z, 8);
    }
    return v;
  }();
  return bytes.data();
}

tag_model* model::find(int device, const std::string& name) {
  auto it = tags.find({device, name});
  return it == tags.end() ? nullptr : &it->second;
}

const char* model::current_tag() const {
  return scope.empty() ? TAGMEM_DEFAULT_TAG : scope.back().c_str();
}

std::size_t model::live_in(int device, const std::string& name) const {
  std::size_t n = 0;
  for (const allocation& a : allocations) n += a.device == device && a.tag == name;
  return n;
}

long model::find_allocation(CUdeviceptr ptr) const {
  for (std::size_t i = 0; i < allocations.size(); ++i) {
    if (allocations[i].ptr == ptr) return static_cast<long>(i);
  }
  return -1;
}

bool model::overlaps(CUdeviceptr ptr, std::size_t size) const {
  for (const allocation& a : allocations) {
    if (ptr < a.ptr + a.size && a.ptr < ptr + size) return true;
  }
  return false;
}

void write_window(allocation& a, std::size_t window) {
  a.window = window;
  std::memcpy(reinterpret_cast<void*>(a.ptr), pattern() + window, a.size);
}

std::string verify(model& m, std::uint64_t* bytes_verified) {
  findings out;
  verify_scope(m, out);
  for (int d = 0; d < kDevices; ++d) verify_tag_list(m, d, out);
  for (auto& [key, t] : m.tags) verify_tag(m, key, t, out);
  verify_allocations(m, out, bytes_verified);
  verify_devices(m, out);
  return out.text();
}

}  // namespace tagmem::fuzz
