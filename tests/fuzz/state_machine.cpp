// state_machine.cpp — decodes a program, runs it against tagmem and the model (state_machine.hpp).
//
// Every operation follows one pattern: decode operands; work out from the model the set of
// errors that apply (an invalid call) or the status a valid one must get (reload's
// OUT_OF_MEMORY is predicted exactly from the emulator's free memory); make the call; check the
// status; apply the call's effect to the model only if it succeeded; then verify() everything.
// When the contract leaves the order of several errors open, any one of them is accepted.
//
// Note [faults in the fuzzer]: the `fault` operation arms one injected driver failure for the
// next operation only. Whether it fired is read from the emulator's call counters (the harness
// makes no driver call while an operation runs). When it fired, the call may fail with DRIVER or
// an out-of-memory status, and may stop half-way where the contract allows it (an offload cut
// short while unmapping leaves a tag offloaded with some mappings still resident; a list reload
// keeps the tags before the failing one). The model then reads each named tag's new state from
// tagmem, checks the transition is one the call could make, and follows it; verify() still
// checks bytes, addresses and every statistic. A host trim whose cuMemHostUnregister or
// cuMemFreeHost failed must return an error and keep that slab pinned (the store's pinned bytes
// still equal the emulator's).
#include "state_machine.hpp"

#include <cuda.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "c_calls.h"
#include "clock_page_state.hpp"
#include "driver/driver.hpp"
#include "emu_controls.hpp"
#include "model.hpp"
#include "program_reader.hpp"
#include "thread_exit_call.hpp"

namespace tagmem::fuzz {
namespace {

// ---- operands ------------------------------------------------------------------------------

const std::string kLongName(TAGMEM_MAX_TAG_NAME + 1, 'x');
const char* const kNames[10] = {
    "t0", "t1", "t2", "kv", "ghost", "", "has space", kLongName.c_str(), nullptr, "t0"};

bool valid_name(const char* n) {
  if (n == nullptr) return false;
  std::size_t len = std::strlen(n);
  if (len == 0 || len > TAGMEM_MAX_TAG_NAME) return false;
  for (std::size_t i = 0; i < len; ++i) {
    if (static_cast<unsigned char>(n[i]) <= ' ' || static_cast<unsigned char>(n[i]) >= 0x7f)
      return false;
  }
  return true;
}

std::string show(const char* n) { return n ? "'" + std::string(n).substr(0, 12) + "'" : "NULL"; }

struct device_arg {
  int value;  // passed to tagmem
  int index;  // the device it means, -1 when invalid
};

device_arg decode_device(std::uint8_t b) {
  static constexpr int invalid[3] = {2, 63, -2};
  switch (b % 8) {
    case 0:
    case 1:
    case 2:
      return {0, 0};
    case 3:
    case 4:
    case 5:
      return {1, 1};
    case 6:
      return {TAGMEM_CURRENT_DEVICE, 0};  // the harness keeps device 0's context current
    default:
      return {invalid[(b >> 3) % 3], -1};
  }
}

// Modes are ints here: an invalid one is only passed on from C (c_calls.h).
int decode_mode(std::uint8_t b) {
  switch (b % 5) {
    case 0:
    case 1:
      return TAGMEM_BACKUP;
    case 2:
    case 3:
      return TAGMEM_DISCARD;
    default:
      return 2 + (b >> 3) % 5;
  }
}

// A swap's modes; an offload also takes TAGMEM_BACKUP_DISK (a swap cannot go to disk).
bool valid_swap_mode(int m) { return m == TAGMEM_BACKUP || m == TAGMEM_DISCARD; }
bool valid_mode(int m) { return valid_swap_mode(m) || m == TAGMEM_BACKUP_DISK; }

// The mode of a valid call, as the enum.
tagmem_offload_mode as_mode(int m) { return m == TAGMEM_BACKUP ? TAGMEM_BACKUP : TAGMEM_DISCARD; }

std::size_t decode_size(std::uint8_t cls, std::uint16_t v, std::size_t device_total,
                        std::size_t chunk) {
  static constexpr std::size_t boundary[7] = {
      255, 256, 1u << 20, (1u << 20) + 1, 10u << 20, (10u << 20) + 1, 2u << 20};
  switch (cls % 8) {
    case 0:
      return 1 + v % 4096;
    case 1:
      return 4096 + std::size_t{v} * 16;
    case 2:
      return (std::size_t{1} << 20) + std::size_t{v} * 144;
    case 3:
      return (std::size_t{10} << 20) + std::size_t{v} * 256;
    case 4:
      return 0;
    case 5:
      return device_total + 1 + v;
    case 6:
      return SIZE_MAX - v;
    default:
      return v % 8 == 7 ? chunk : boundary[v % 8];
  }
}

const char* const kFaultEntries[] = {nullptr,
                                     "cuMemCreate",
                                     "cuMemMap",
                                     "cuMemSetAccess",
                                     "cuMemUnmap",
                                     "cuMemRelease",
                                     "cuMemcpyDtoHAsync",
                                     "cuMemcpyHtoDAsync",
                                     "cuStreamSynchronize",
                                     "cuCtxSynchronize",
                                     "cuMemHostRegister",
                                     "cuMemAddressReserve",
                                     "cuEventRecord",
                                     "cuStreamWaitEvent",
                                     "cuEventCreate",
                                     "cuMemGetInfo",
                                     "cuCtxSetCurrent",
                                     "cuCtxGetCurrent",
                                     "cuStreamCreate",
                                     "cuDevicePrimaryCtxRetain",
                                     "cuMemHostUnregister",
                                     "cuMemHostAlloc",
                                     "cuMemFreeHost"};
constexpr CUresult kFaultErrors[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN,
                                     CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_FAILED};

// ---- expected statuses ---------------------------------------------------------------------

struct status_set {
  std::uint32_t bits = 0;
  void add(tagmem_status s) { bits |= 1u << s; }
  bool has(tagmem_status s) const { return bits & (1u << s); }
  bool empty() const { return bits == 0; }
  std::string text() const {
    std::string out;
    for (int s = 0; s < 32; ++s) {
      if (!(bits & (1u << s))) continue;
      if (!out.empty()) out += "|";
      out += tagmem_status_string(static_cast<tagmem_status>(s));
    }
    return out;
  }
};

// ---- process-wide state --------------------------------------------------------------------

struct process_state {
  bool ready = false;
  CUcontext context[kDevices] = {};
  CUstream streams[kDevices][2] = {};
  reliability::emu_census baseline;  // the emulator with tagmem shut down
};
process_state g_process;
totals g_totals;

constexpr int kOpCount = 13;
constexpr int kMaxSteps = 256;
constexpr std::size_t kMaxScope = 16;

// ---- the runner ----------------------------------------------------------------------------

class runner {
 public:
  runner(const std::uint8_t* data, std::size_t size) : in_(data, size) {}
  program_result run();

 private:
  // Operations.
  void op_push();
  void op_pop();
  void op_alloc(bool null_out);
  void op_free();
  void op_offload();
  void op_reload();
  void op_swap();
  void op_empty_cache();
  void op_rewrite();
  void op_fault();
  void op_host();
  void op_misuse();

  // A list of tag names for offload/reload/swap.
  std::vector<const char*> decode_list();
  // Adds the errors a list of names gets on device `d`; `want` is the state check per tag.
  enum class want { resident, offloaded };
  void list_errors(const std::vector<const char*>& names, const device_arg& d, want w,
                   status_set& errs);
  // Adds what an offload to disk of a valid list gets besides: the fuzzer sets no disk directory
  // (the disk tier has its own tests), so any tag named is refused.
  void disk_errors(const std::vector<const char*>& names, const device_arg& d, status_set& errs);

  // Call bracket: arms a pending fault, and after the call learns whether it fired.
  void before_call();
  void after_call();
  // Checks a status; returns true when the call succeeded as the model predicted.
  const char* other_thread_message_ = nullptr;  // the message of a call made on another thread
  bool expect(const std::string& call, tagmem_status got, const status_set& rejected,
              tagmem_status predicted = TAGMEM_SUCCESS);

  // Model effects.
  void offloaded(tag_model& t, const tagmem_tag_stats& pre, tagmem_offload_mode mode);
  void reloaded(int device, const std::string& name, tag_model& t, bool counted = true);
  void follow_after_fault(int d, const std::vector<const char*>& out,
                          const std::vector<const char*>& in, tagmem_offload_mode mode,
                          const std::map<std::string, tagmem_tag_stats>& pre);
  void adopt_new_tag(int device, const std::string& name);
  std::size_t next_window();
  CUstream stream_for(int device, std::uint8_t sel) const;
  std::uint64_t free_bytes(int device) const;
  std::size_t reload_fits(int device, const std::vector<const char*>& names, std::uint64_t free);
  tagmem_tag_stats stats_of(int device, const std::string& name);

  void fail(const std::string& what);
  void log(const std::string& line);
  void finish();

  program_reader in_;
  model m_;
  tagmem_config cfg_{};
  std::string failure_;
  std::vector<std::string> trace_;
  std::uint64_t window_seed_ = 0;
  int step_ = 0;

  struct pending_fault {
    bool armed = false;
    const char* entry = nullptr;
    std::uint64_t nth = 0;
    CUresult error = CUDA_SUCCESS;
    std::uint64_t calls_before = 0;
  } fault_;
  bool fired_ = false;  // the fault of the current call fired
};

void runner::fail(const std::string& what) {
  if (!failure_.empty()) return;
  std::ostringstream s;
  s << "step " << step_ << ": " << what << "\nlast operations:\n";
  std::size_t from = trace_.size() > 40 ? trace_.size() - 40 : 0;
  for (std::size_t i = from; i < trace_.size(); ++i) s << "  " << trace_[i] << "\n";
  failure_ = s.str();
}

void runner::log(const std::string& line) {
  trace_.push_back("#" + std::to_string(step_) + " " + line);
}

std::size_t runner::next_window() {
  std::uint64_t z = (window_seed_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z % (kPatternBytes - kMaxAllocation);
}

CUstream runner::stream_for(int device, std::uint8_t sel) const {
  if (device < 0 || sel % 4 == 0 || sel % 4 == 3) return nullptr;
  return g_process.streams[device][sel % 4 - 1];
}

std::uint64_t runner::free_bytes(int device) const {
  std::uint64_t used = reliability::emu().device_used_bytes(device);
  return used >= m_.device_bytes[device] ? 0 : m_.device_bytes[device] - used;
}

// How many of `names` a reload on `device` maps from `free` bytes: each tag needs the bytes its
// offload released, tags reload in list order, and the first that does not fit stops the call
// with OUT_OF_MEMORY.
std::size_t runner::reload_fits(int device, const std::vector<const char*>& names,
                                std::uint64_t free) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    const tag_model& t = *m_.find(device, names[i]);
    const std::size_t need = t.mapped_at_offload - t.seen.mapped_bytes;
    if (need > free) return i;
    free -= need;
  }
  return names.size();
}

tagmem_tag_stats runner::stats_of(int device, const std::string& name) {
  tagmem_tag_stats s{};
  if (tagmem_tag_stats_get(name.c_str(), device, &s) != TAGMEM_SUCCESS) {
    fail("stats of '" + name + "' failed: " + tagmem_last_error());
  }
  return s;
}

void runner::before_call() {
  fired_ = false;
  if (!fault_.armed) return;
  const auto& emu = reliability::emu();
  fault_.calls_before = emu.call_count(fault_.entry);
  if (emu.fail_call(fault_.entry, fault_.nth, fault_.error) != 0) {
    fail("tagmem_emu_fail_call refused a fault");
  }
}

void runner::after_call() {
  if (!fault_.armed) return;
  const auto& emu = reliability::emu();
  fired_ = emu.call_count(fault_.entry) - fault_.calls_before >= fault_.nth;
  emu.clear_faults();
  fault_.armed = false;
  if (fired_) {
    ++g_totals.faults_fired;
    if (!fault_.entry || std::strcmp(fault_.entry, "cuMemRelease") == 0) m_.release_pending = true;
    log(std::string("  fault fired: ") + (fault_.entry ? fault_.entry : "any call") + " #" +
        std::to_string(fault_.nth));
    // A failed context restore in tagmem would leave another context current; the harness keeps
    // device 0's current, as TAGMEM_CURRENT_DEVICE in the model assumes.
    driver::api().cuCtxSetCurrent(g_process.context[0]);
  }
}

bool runner::expect(const std::string& call, tagmem_status got, const status_set& rejected,
                    tagmem_status predicted) {
  log(call + " -> " + tagmem_status_string(got));
  // A call made on another thread left its message there (op_free).
  const char* message = other_thread_message_ ? other_thread_message_ : tagmem_last_error();
  other_thread_message_ = nullptr;
  if (got != TAGMEM_SUCCESS && message[0] == '\0') {
    fail(call + " failed with " + tagmem_status_string(got) + " but no message");
  }
  if (fired_) {
    // Note [faults in the fuzzer]: a failed driver call may surface as these statuses.
    bool driverish = got == TAGMEM_ERROR_DRIVER || got == TAGMEM_ERROR_OUT_OF_MEMORY ||
                     got == TAGMEM_ERROR_HOST_OUT_OF_MEMORY;
    bool fine = driverish ||
                (rejected.empty() ? got == TAGMEM_SUCCESS || got == predicted : rejected.has(got));
    if (!fine) fail(call + " under an injected fault returned " + tagmem_status_string(got));
    return got == TAGMEM_SUCCESS && rejected.empty();
  }
  if (!rejected.empty()) {
    if (!rejected.has(got)) {
      fail(call + " returned " + tagmem_status_string(got) + ", expected " + rejected.text());
    } else {
      ++g_totals.rejected_as_expected;
    }
    return false;
  }
  if (got != predicted) {
    fail(call + " returned " + tagmem_status_string(got) + " (" + message + "), model predicted " +
         tagmem_status_string(predicted));
  }
  return got == TAGMEM_SUCCESS;
}

// ---- names and lists -----------------------------------------------------------------------

std::vector<const char*> runner::decode_list() {
  std::vector<const char*> names(in_.byte() % 4);
  for (auto& n : names) n = kNames[in_.byte() % 10];
  return names;
}

void runner::list_errors(const std::vector<const char*>& names, const device_arg& d, want w,
                         status_set& errs) {
  if (d.index < 0) {
    errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
    return;
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!valid_name(names[i])) {
      errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
      continue;
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (names[j] && std::strcmp(names[i], names[j]) == 0) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
    }
    tag_model* t = m_.find(d.index, names[i]);
    if (!t) {
      errs.add(TAGMEM_ERROR_UNKNOWN_TAG);
    } else if (w == want::resident) {
      // An offload cut short may be resumed (tagmem.h: the tag stays offloaded, partly mapped).
      bool resumable = t->state != TAGMEM_RESIDENT && t->seen.mapped_bytes > 0;
      if (t->state != TAGMEM_RESIDENT && !resumable) errs.add(TAGMEM_ERROR_TAG_OFFLOADED);
    } else if (t->state == TAGMEM_RESIDENT) {
      errs.add(TAGMEM_ERROR_TAG_RESIDENT);
    }
  }
}

void runner::disk_errors(const std::vector<const char*>& names, const device_arg& d,
                         status_set& errs) {
  if (names.empty() || d.index < 0) return;  // an empty list succeeds: there is nothing to write
  errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);   // no directory
  for (const char* n : names) {
    // A partly offloaded tag is refused before the directory is looked at.
    const tag_model* t = valid_name(n) ? m_.find(d.index, n) : nullptr;
    if (t && t->state != TAGMEM_RESIDENT) errs.add(TAGMEM_ERROR_TAG_OFFLOADED);
  }
}

std::string join(const std::vector<const char*>& names) {
  std::string out = "{";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + show(names[i]);
  return out + "}";
}

// ---- model effects -------------------------------------------------------------------------

// A completed offload of `t`, whose statistics before the call were `pre`.
void runner::offloaded(tag_model& t, const tagmem_tag_stats& pre, tagmem_offload_mode mode) {
  const std::size_t copied = mode == TAGMEM_BACKUP ? pre.mapped_bytes : 0;
  if (t.state == TAGMEM_RESIDENT) {
    t.mapped_at_offload = pre.mapped_bytes;
    t.reserved_at_offload = pre.reserved_bytes;
    t.host_expected = 0;
    t.pieces_expected = 0;
  }
  t.host_expected += copied;
  t.pieces_expected += copied;
  t.bytes_offloaded += copied;
  t.offload_count++;
  t.state = mode == TAGMEM_BACKUP ? TAGMEM_OFFLOADED_BACKUP : TAGMEM_OFFLOADED_DISCARD;
  t.cut_short = false;
  t.lost_bytes |= mode == TAGMEM_DISCARD;
}

// A completed reload: BACKUP bytes are back; DISCARD contents are undefined, so the harness
// writes new ones (an engine refilling its cache).
// A reload of `t` (resident now); `counted` false after a faulted call, whose counters the model
// adopts from tagmem instead of predicting them (Note [faults in the fuzzer]).
void runner::reloaded(int device, const std::string& name, tag_model& t, bool counted) {
  const bool lost = t.lost_bytes || t.state == TAGMEM_OFFLOADED_DISCARD;
  t.lost_bytes = false;
  if (counted) {
    t.bytes_reloaded += t.pieces_expected;
    t.reload_count++;
  }
  t.state = TAGMEM_RESIDENT;
  t.host_expected = 0;
  t.pieces_expected = 0;
  t.cut_short = false;
  for (allocation& a : m_.allocations) {
    if (a.device != device || a.tag != name) continue;
    if (lost) {
      write_window(a, next_window());
    }
  }
}

// Note [faults in the fuzzer]: after a call a fault interrupted, each named tag may be where it
// was, where the call was taking it, or (an out-tag whose offload failed) resident again. The
// model follows what tagmem reports, checking only that the move is one of those, and counts the
// tag as `approximate` (counters adopted, not predicted) until it is resident after a clean call.
void runner::follow_after_fault(int d, const std::vector<const char*>& out,
                                const std::vector<const char*>& in, tagmem_offload_mode mode,
                                const std::map<std::string, tagmem_tag_stats>& pre) {
  auto follow = [&](const char* n, bool going_out) {
    auto p = pre.find(n);
    if (p == pre.end()) return;  // invalid or unknown name: the call never touched it
    const tagmem_tag_stats& before = p->second;
    tag_model& t = *m_.find(d, n);
    const tagmem_tag_stats post = stats_of(d, n);
    const tagmem_tag_state target = !going_out              ? TAGMEM_RESIDENT
                                    : mode == TAGMEM_BACKUP ? TAGMEM_OFFLOADED_BACKUP
                                                            : TAGMEM_OFFLOADED_DISCARD;
    if (post.state != before.state && post.state != target && post.state != TAGMEM_RESIDENT) {
      return fail(std::string("after a faulted call tag '") + n + "' went from state " +
                  std::to_string(before.state) + " to " + std::to_string(post.state));
    }
    if (t.state == TAGMEM_RESIDENT && post.state != TAGMEM_RESIDENT) {
      t.mapped_at_offload = before.mapped_bytes;
      t.reserved_at_offload = before.reserved_bytes;
    }
    // A DISCARD offload that was under way may have dropped bytes even if the tag came back.
    if (going_out && mode == TAGMEM_DISCARD) t.lost_bytes = true;
    t.approximate = true;
    // Counters are adopted, not predicted: a DISCARD out-tag that never left counts no reload.
    if (post.state == TAGMEM_RESIDENT && t.state != TAGMEM_RESIDENT) {
      reloaded(d, n, t, false);
    } else if (post.state == TAGMEM_RESIDENT && t.lost_bytes) {
      reloaded(d, n, t, false);  // resident all along, yet part of it may have been remapped empty
    }
    t.state = post.state;
    t.cut_short = post.state != TAGMEM_RESIDENT && post.mapped_bytes > 0;
  };
  for (const char* n : out) {
    if (valid_name(n)) follow(n, true);
  }
  for (const char* n : in) {
    if (valid_name(n)) follow(n, false);
  }
}

// A failed allocation or push may have created its (empty) tag, and no other.
void runner::adopt_new_tag(int device, const std::string& name) {
  for (int d = 0; d < kDevices; ++d) {
    char names[32][TAGMEM_MAX_TAG_NAME + 1];
    std::size_t count = 0;
    if (tagmem_list_tags(d, names, 32, &count) != TAGMEM_SUCCESS) continue;
    for (std::size_t i = 0; i < count && i < 32; ++i) {
      if (m_.find(d, names[i])) continue;
      if (d != device || name != names[i]) {
        return fail(std::string("a failed allocation or push created tag '") + names[i] + "'");
      }
      m_.tags[{d, names[i]}] = tag_model{};
    }
  }
}

// ---- operations ----------------------------------------------------------------------------

void runner::op_push() {
  const char* name = kNames[in_.byte() % 10];
  if (m_.scope.size() >= kMaxScope) return;
  status_set errs;
  if (!valid_name(name)) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
  before_call();
  tagmem_status s = tagmem_push_tag(name);
  after_call();
  if (expect("push " + show(name), s, errs)) {
    m_.scope.emplace_back(name);
    // tagmem.h: the push created the tag on the current device (device 0 in this harness).
    if (!m_.find(0, name)) m_.tags[{0, name}] = tag_model{};
  } else if (s != TAGMEM_SUCCESS && errs.empty()) {
    adopt_new_tag(0, name);  // a fault after the tag was created leaves it existing
  }
}

void runner::op_pop() {
  status_set errs;
  if (m_.scope.empty()) errs.add(TAGMEM_ERROR_SCOPE_EMPTY);
  before_call();
  tagmem_status s = tagmem_pop_tag();
  after_call();
  if (expect("pop", s, errs)) m_.scope.pop_back();
}

void runner::op_alloc(bool null_out) {
  const std::uint8_t flags = in_.byte();
  const bool tagged = flags & 1;
  const char* name = tagged ? kNames[in_.byte() % 10] : nullptr;
  const device_arg dev = decode_device(in_.byte());
  const std::uint8_t cls = in_.byte();
  const std::uint16_t v = in_.u16();
  const std::size_t total = dev.index >= 0 ? m_.device_bytes[dev.index] : 1;
  const std::size_t size = decode_size(cls, v, total, cfg_.chunk_bytes);
  const CUstream stream = stream_for(dev.index, flags >> 1);
  const std::string tag = tagged ? (name ? name : "") : m_.current_tag();

  status_set errs;
  if (null_out) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
  if (tagged && !valid_name(name)) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
  if (dev.index < 0 || size == 0 || size > total) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
  tag_model* existing = dev.index >= 0 ? m_.find(dev.index, tag) : nullptr;
  if (existing && existing->state != TAGMEM_RESIDENT) errs.add(TAGMEM_ERROR_TAG_OFFLOADED);

  void* p = reinterpret_cast<void*>(0x1);
  before_call();
  tagmem_status s =
      tagged ? tagmem_malloc_tagged(null_out ? nullptr : &p, size, name, dev.value, stream)
             : tagmem_malloc(null_out ? nullptr : &p, size, dev.value, stream);
  after_call();
  std::ostringstream call;
  call << (tagged ? "malloc_tagged " + show(name) : "malloc in '" + tag + "'") << " size " << size
       << " dev " << dev.value << " stream " << stream;

  tagmem_status predicted = TAGMEM_SUCCESS;
  if (s == TAGMEM_ERROR_OUT_OF_MEMORY && errs.empty() && !fired_) {
    // Legitimate only if, after giving back cached memory, the segment it needs did not fit.
    const std::size_t gran = 2u << 20;
    const std::size_t rounded = (size + 255) / 256 * 256;
    const std::size_t need = rounded <= (1u << 20)    ? cfg_.chunk_bytes
                             : rounded <= (10u << 20) ? (20u << 20)
                                                      : (size + gran - 1) / gran * gran;
    if (free_bytes(dev.index) < need) predicted = TAGMEM_ERROR_OUT_OF_MEMORY;
  }
  const bool ok = expect(call.str(), s, errs, predicted);
  if (!null_out && s != TAGMEM_SUCCESS && p != nullptr) fail("a failed malloc left *ptr non-NULL");
  if (s != TAGMEM_SUCCESS) {
    // A valid request that failed for lack of memory (or a driver fault) has created its tag.
    if (errs.empty()) adopt_new_tag(dev.index, tag);
    return;
  }
  if (!ok) return;
  auto ptr = reinterpret_cast<CUdeviceptr>(p);
  if (ptr == 0 || ptr % 256 != 0) return fail("malloc returned a misaligned pointer");
  if (m_.overlaps(ptr, size)) return fail("malloc returned memory overlapping a live allocation");
  if (!m_.find(dev.index, tag)) m_.tags[{dev.index, tag}] = tag_model{};
  m_.find(dev.index, tag)->alloc_count++;
  allocation a{ptr, size, dev.index, tag, stream, kUndefined};
  write_window(a, next_window());
  m_.allocations.push_back(a);
}

void runner::op_free() {
  const std::uint8_t kind_byte = in_.byte();
  const std::uint8_t kind = kind_byte % 6;
  // Where it is called: 0, 1 on this thread; 2 at the exit of a new thread, as its first call;
  // 3 at the exit of a thread that used tagmem (thread_exit_call.hpp).
  int where = kind_byte / 6 % 4;
  // The thread that used tagmem pushes a tag of device 0 that exists, so that it creates none.
  const char* scope_tag = nullptr;
  for (const auto& [key, t] : m_.tags) {
    if (key.first == 0 && valid_name(key.second.c_str())) scope_tag = key.second.c_str();
  }
  if (where == 3 && !scope_tag) where = 2;
  const std::uint8_t index = in_.byte();
  const std::uint8_t sel = in_.byte();
  void* p = nullptr;
  status_set errs;
  long live = -1;
  std::string what;
  int stream_device = -1;
  switch (kind) {
    case 0:
    case 1:
      if (!m_.allocations.empty()) {
        live = index % m_.allocations.size();
        p = reinterpret_cast<void*>(m_.allocations[live].ptr);
        stream_device = m_.allocations[live].device;
        what = "free live";
        break;
      }
      [[fallthrough]];
    case 2:
      if (!m_.allocations.empty()) {
        const allocation& a = m_.allocations[index % m_.allocations.size()];
        if (a.size > 1) {
          p = reinterpret_cast<void*>(a.ptr + 1 + sel % (a.size - 1));
          what = "free interior";
          errs.add(TAGMEM_ERROR_UNKNOWN_POINTER);
          break;
        }
      }
      [[fallthrough]];
    case 3:
      if (!m_.freed.empty()) {
        CUdeviceptr q = m_.freed[index % m_.freed.size()];
        p = reinterpret_cast<void*>(q);
        live = m_.find_allocation(q);  // reused by a later allocation: a valid free
        if (live < 0)
          errs.add(TAGMEM_ERROR_UNKNOWN_POINTER);
        else
          stream_device = m_.allocations[live].device;
        what = "free stale";
        break;
      }
      [[fallthrough]];
    case 4:
      p = nullptr;
      what = "free NULL";
      errs.add(TAGMEM_ERROR_UNKNOWN_POINTER);
      break;
    default:
      p = &what;
      what = "free host pointer";
      errs.add(TAGMEM_ERROR_UNKNOWN_POINTER);
      break;
  }
  const CUstream stream = stream_for(stream_device, sel);
  before_call();
  std::string exit_message;
  tagmem_status s = where < 2
                        ? tagmem_free(p, stream)
                        : reliability::free_at_thread_exit(p, stream, where == 3, exit_message,
                                                           scope_tag ? scope_tag : "");
  after_call();
  std::ostringstream call;
  call << what << " " << p << " stream " << stream;
  if (where >= 2) {
    other_thread_message_ = exit_message.c_str();
    ++g_totals.frees_at_thread_exit[where - 2];
  }
  if (where >= 2)
    call << (where == 3 ? " at the exit of a thread that used tagmem"
                        : " at the exit of a new thread")
         << " (" << exit_message << ")";
  if (!expect(call.str(), s, errs)) return;
  allocation& a = m_.allocations[live];
  tag_model* owner = m_.find(a.device, a.tag);
  owner->free_count++;
  if (owner->state == TAGMEM_OFFLOADED_BACKUP) owner->freed_while_offloaded = true;
  m_.freed.push_back(a.ptr);
  if (m_.freed.size() > 64) m_.freed.erase(m_.freed.begin());
  m_.allocations[live] = m_.allocations.back();
  m_.allocations.pop_back();
}

void runner::op_offload() {
  std::vector<const char*> names = decode_list();
  const device_arg dev = decode_device(in_.byte());
  const int mode = decode_mode(in_.byte());
  status_set errs;
  if (!valid_mode(mode)) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
  list_errors(names, dev, want::resident, errs);
  if (mode == TAGMEM_BACKUP_DISK) disk_errors(names, dev, errs);
  std::map<std::string, tagmem_tag_stats> pre;
  if (dev.index >= 0) {
    for (const char* n : names) {
      if (valid_name(n) && m_.find(dev.index, n)) pre[n] = m_.find(dev.index, n)->seen;
    }
  }
  before_call();
  tagmem_status s = fuzz_offload(names.data(), names.size(), dev.value, mode);
  after_call();
  const bool ok = expect("offload " + join(names) + " dev " + std::to_string(dev.value) + " mode " +
                             std::to_string(mode),
                         s, errs);
  if (fired_ && errs.empty()) return follow_after_fault(dev.index, names, {}, as_mode(mode), pre);
  if (!ok) return;
  for (const char* n : names) offloaded(*m_.find(dev.index, n), pre[n], as_mode(mode));
}

void runner::op_reload() {
  std::vector<const char*> names = decode_list();
  const device_arg dev = decode_device(in_.byte());
  status_set errs;
  list_errors(names, dev, want::offloaded, errs);
  std::size_t fits = names.size();
  if (errs.empty() && !names.empty()) fits = reload_fits(dev.index, names, free_bytes(dev.index));
  const tagmem_status predicted = fits < names.size() ? TAGMEM_ERROR_OUT_OF_MEMORY : TAGMEM_SUCCESS;
  std::map<std::string, tagmem_tag_stats> pre;
  if (errs.empty()) {
    for (const char* n : names) pre[n] = m_.find(dev.index, n)->seen;
  }
  before_call();
  tagmem_status s = tagmem_reload(names.data(), names.size(), dev.value);
  after_call();
  const bool ok =
      expect("reload " + join(names) + " dev " + std::to_string(dev.value), s, errs, predicted);
  if (fired_ && errs.empty()) return follow_after_fault(dev.index, {}, names, TAGMEM_BACKUP, pre);
  if (!errs.empty() || (!ok && s != predicted)) return;
  for (std::size_t i = 0; i < fits; ++i)
    reloaded(dev.index, names[i], *m_.find(dev.index, names[i]));
}

void runner::op_swap() {
  std::vector<const char*> out = decode_list();
  std::vector<const char*> in = decode_list();
  const device_arg dev = decode_device(in_.byte());
  const int mode = decode_mode(in_.byte());
  status_set errs;
  if (!valid_swap_mode(mode)) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
  list_errors(out, dev, want::resident, errs);
  list_errors(in, dev, want::offloaded, errs);
  for (const char* a : out) {
    for (const char* b : in) {
      if (a && b && std::strcmp(a, b) == 0) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
    }
  }
  std::map<std::string, tagmem_tag_stats> pre;
  std::size_t fits = in.size();
  if (errs.empty()) {
    std::uint64_t free = free_bytes(dev.index);  // the in-side may use what the out-side releases
    for (const char* n : out) {
      pre[n] = m_.find(dev.index, n)->seen;
      free += pre[n].mapped_bytes;
    }
    for (const char* n : in) pre[n] = m_.find(dev.index, n)->seen;
    fits = reload_fits(dev.index, in, free);
  }
  const tagmem_status predicted = fits < in.size() ? TAGMEM_ERROR_OUT_OF_MEMORY : TAGMEM_SUCCESS;
  before_call();
  tagmem_status s = fuzz_swap(out.data(), out.size(), in.data(), in.size(), dev.value, mode);
  after_call();
  const bool ok = expect("swap out " + join(out) + " in " + join(in) + " dev " +
                             std::to_string(dev.value) + " mode " + std::to_string(mode),
                         s, errs, predicted);
  if (fired_ && errs.empty()) return follow_after_fault(dev.index, out, in, as_mode(mode), pre);
  if (!errs.empty() || (!ok && s != predicted)) return;
  for (const char* n : out) offloaded(*m_.find(dev.index, n), pre[n], as_mode(mode));
  for (std::size_t i = 0; i < fits; ++i) reloaded(dev.index, in[i], *m_.find(dev.index, in[i]));
}

void runner::op_empty_cache() {
  const device_arg dev = decode_device(in_.byte());
  status_set errs;
  if (dev.index < 0) errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
  before_call();
  tagmem_status s = tagmem_empty_cache(dev.value);
  after_call();
  if (!expect("empty_cache dev " + std::to_string(dev.value), s, errs) || fired_) return;
  // A resident tag without live allocations keeps no physical memory.
  for (auto& [key, t] : m_.tags) {
    if (key.first != dev.index || t.state != TAGMEM_RESIDENT) continue;
    if (m_.live_in(key.first, key.second) == 0 && stats_of(key.first, key.second).mapped_bytes) {
      fail("empty_cache left memory mapped in idle tag '" + key.second + "'");
    }
  }
}

void runner::op_rewrite() {
  const std::uint8_t index = in_.byte();
  in_.u24();  // reserved: keeps the encoding of older inputs stable
  if (m_.allocations.empty()) return;
  allocation& a = m_.allocations[index % m_.allocations.size()];
  if (m_.find(a.device, a.tag)->state != TAGMEM_RESIDENT) return;
  write_window(a, next_window());
  log("rewrite " + std::to_string(a.ptr));
}

void runner::op_fault() {
  constexpr std::size_t entries = sizeof kFaultEntries / sizeof kFaultEntries[0];
  fault_.entry = kFaultEntries[in_.byte() % entries];
  fault_.nth = 1 + in_.byte() % (fault_.entry ? 8 : 48);
  fault_.error = kFaultErrors[in_.byte() % 4];
  fault_.armed = true;
  log(std::string("arm fault: ") + (fault_.entry ? fault_.entry : "any call") + " #" +
      std::to_string(fault_.nth) + " error " + std::to_string(fault_.error));
}

void runner::op_host() {
  const std::uint8_t kind = in_.byte() % 3;
  const std::size_t bytes = std::size_t{in_.u16()} % (8u << 20);
  before_call();
  tagmem_status s = kind == 1 ? tagmem_host_trim(bytes) : tagmem_host_reserve(bytes, kind == 0);
  if (kind == 2 && s == TAGMEM_SUCCESS) {
    s = tagmem_host_reserve(0, 1);  // waits for the background pinning, inside the bracket
  }
  after_call();
  const char* names[3] = {"host_reserve(wait)", "host_trim", "host_reserve(background)"};
  expect(std::string(names[kind]) + " " + std::to_string(bytes), s, {});
  // A trim whose unpin failed keeps that slab (verify() checks the store's pinned bytes against
  // the emulator's) and must say so: no unpinning call of a trim may fail silently.
  const bool unpin_fault = fired_ && fault_.entry &&
                           (std::strcmp(fault_.entry, "cuMemHostUnregister") == 0 ||
                            std::strcmp(fault_.entry, "cuMemFreeHost") == 0);
  if (kind == 1 && unpin_fault && s == TAGMEM_SUCCESS) {
    fail(std::string("host_trim returned success but its ") + fault_.entry + " failed");
  }
}

void runner::op_misuse() {
  const std::uint8_t kind = in_.byte() % 8;
  status_set errs;
  errs.add(TAGMEM_ERROR_INVALID_ARGUMENT);
  tagmem_status s = TAGMEM_SUCCESS;
  std::string what;
  before_call();
  switch (kind) {
    case 0:
      s = tagmem_offload(nullptr, 1, 0, TAGMEM_BACKUP);
      what = "offload(NULL, 1)";
      break;
    case 1:
      s = tagmem_reload(nullptr, 2, 0);
      what = "reload(NULL, 2)";
      break;
    case 2:
      s = tagmem_swap(nullptr, 1, nullptr, 0, 0, TAGMEM_BACKUP);
      what = "swap(out NULL, 1)";
      break;
    case 3:
      s = tagmem_swap(nullptr, 0, nullptr, 1, 1, TAGMEM_DISCARD);
      what = "swap(in NULL, 1)";
      break;
    case 4:
      s = tagmem_tag_stats_get_sized("t0", 0, nullptr, sizeof(tagmem_tag_stats));
      what = "tag_stats_get(NULL out)";
      break;
    case 5: {
      std::size_t count = 0;
      s = tagmem_list_tags(0, nullptr, 4, &count);
      what = "list_tags(NULL names, capacity 4)";
      break;
    }
    case 6: {
      errs = {};
      errs.add(TAGMEM_ERROR_UNKNOWN_POINTER);
      void* q = m_.freed.empty() ? &what : reinterpret_cast<void*>(m_.freed.back());
      if (m_.overlaps(reinterpret_cast<CUdeviceptr>(q), 1)) q = &what;
      s = tagmem_pointer_info(q, nullptr, 0, nullptr, nullptr, nullptr);
      what = "pointer_info(not live)";
      break;
    }
    default:
      s = tagmem_device_stats_get_sized(0, nullptr, sizeof(tagmem_device_stats));
      what = "device_stats_get(NULL out)";
      break;
  }
  after_call();
  expect(what, s, errs);
}

// ---- the program ---------------------------------------------------------------------------

void runner::finish() {
  // Free what is left, give everything back and shut down: the emulator must be as it was.
  if (failure_.empty()) {
    for (const allocation& a : m_.allocations) {
      if (tagmem_free(reinterpret_cast<void*>(a.ptr), nullptr) != TAGMEM_SUCCESS) {
        fail(std::string("final free failed: ") + tagmem_last_error());
        break;
      }
    }
  }
  while (!m_.scope.empty()) {
    tagmem_pop_tag();
    m_.scope.pop_back();
  }
  if (tagmem_shutdown() != TAGMEM_SUCCESS) fail(std::string("shutdown: ") + tagmem_last_error());
  const reliability::emu_census after = reliability::take_census();
  if (!(after == g_process.baseline)) {
    fail("after shutdown the emulator differs from before the program: " +
         reliability::describe_difference(g_process.baseline, after));
  }
}

program_result runner::run() {
  const auto& emu = reliability::emu();
  const std::uint8_t config = in_.byte();
  static constexpr std::size_t arena[4] = {0, 8u << 20, 32u << 20, 64u << 20};
  static constexpr std::size_t max_mapping[4] = {0, 2u << 20, 4u << 20, 8u << 20};
  tagmem_config_init(&cfg_);
  cfg_.chunk_bytes = (config & 1) ? (4u << 20) : (2u << 20);
  cfg_.arena_bytes = arena[(config >> 1) & 3];
  cfg_.copy_piece_bytes = (config & 8) ? (1u << 20) : 0;
  cfg_.max_mapping_bytes = max_mapping[(config >> 4) & 3];
  test::use_clock_page(static_cast<test::clock_page_state>(config >> 6));
  ++g_totals.clock_page_states[config >> 6];
  for (int d = 0; d < kDevices; ++d) {
    m_.device_bytes[d] = (24u + (in_.byte() % 5) * 8u) << 20;
    emu.set_device_bytes(d, m_.device_bytes[d]);
    emu.clear_sticky_error(d);
  }
  emu.clear_faults();
  const reliability::emu_census start = reliability::take_census();
  if (!(start == g_process.baseline)) {
    fail("the emulator is not clean before the program: " +
         reliability::describe_difference(g_process.baseline, start));
  }
  if (tagmem_init(&cfg_) != TAGMEM_SUCCESS) {
    fail(std::string("tagmem_init: ") + tagmem_last_error());
    return {false, failure_};
  }
  driver::api().cuCtxSetCurrent(g_process.context[0]);
  std::uint64_t verified = 0;
  for (step_ = 1; step_ <= kMaxSteps && !in_.done() && failure_.empty(); ++step_) {
    const bool faulted = fault_.armed;
    switch (in_.byte() % kOpCount) {
      case 0:
        op_push();
        break;
      case 1:
        op_pop();
        break;
      case 2:
        op_alloc(false);
        break;
      case 3:
        op_free();
        break;
      case 4:
        op_offload();
        break;
      case 5:
        op_reload();
        break;
      case 6:
        op_swap();
        break;
      case 7:
        op_empty_cache();
        break;
      case 8:
        op_rewrite();
        break;
      case 9:
        op_fault();
        break;
      case 10:
        op_host();
        break;
      case 11:
        op_misuse();
        break;
      default:
        op_alloc(in_.byte() % 16 == 0);
        break;  // allocation is the most common call
    }
    if (faulted && fault_.armed) {  // the operation made no call; drop the fault
      fault_.armed = false;
    }
    ++g_totals.operations;
    CUcontext current = nullptr;
    driver::api().cuCtxGetCurrent(&current);
    if (current != g_process.context[0]) fail("tagmem left another CUDA context current");
    if (!failure_.empty()) break;
    std::string diff = verify(m_, &verified);
    if (!diff.empty()) fail("the model and tagmem disagree:\n" + diff);
    if (!fired_) {
      for (auto& [key, t] : m_.tags) t.approximate &= t.state != TAGMEM_RESIDENT;
    }
    fired_ = false;
  }
  finish();
  ++g_totals.programs;
  g_totals.bytes_verified += verified;
  return {failure_.empty(), failure_};
}

}  // namespace

bool prepare(std::string* why) {
  if (g_process.ready) return true;
  // Small pinned slabs keep a program's first BACKUP offload cheap; the system allocator for
  // tagmem's records lets AddressSanitizer see them (mimalloc would hide them).
  setenv("TAGMEM_HOST_SLAB_BYTES", "2M", 0);
  setenv("TAGMEM_METADATA", "system", 0);
  // Every driver call on this thread, so that an input injects its faults into the same calls on
  // every replay, and device memory equals the model's after each step (the background release
  // of DISCARD offloads and of swaps has its own tests in tests/core/release_test.cpp).
  setenv("TAGMEM_DISCARD_RELEASE", "wait", 1);
  setenv("TAGMEM_SWAP_RELEASE", "inline", 1);
  unsetenv("TAGMEM_DISK_DIR");  // runner::disk_errors
  const auto& emu = reliability::emu();
  if (!emu.available || emu.device_count() < kDevices) {
    *why = "TAGMEM_LIBCUDA must name libtagmem_emu.so with at least 2 devices";
    return false;
  }
  if (tagmem_init(nullptr) != TAGMEM_SUCCESS) {
    *why = std::string("tagmem_init: ") + tagmem_last_error();
    return false;
  }
  // Contexts and streams the programs use; retained for the life of the process.
  const auto& api = driver::api();
  for (int d = 0; d < kDevices; ++d) {
    CUdevice dev = 0;
    if (api.cuDeviceGet(&dev, d) != CUDA_SUCCESS ||
        api.cuDevicePrimaryCtxRetain(&g_process.context[d], dev) != CUDA_SUCCESS ||
        api.cuCtxSetCurrent(g_process.context[d]) != CUDA_SUCCESS ||
        api.cuStreamCreate(&g_process.streams[d][0], CU_STREAM_DEFAULT) != CUDA_SUCCESS ||
        api.cuStreamCreate(&g_process.streams[d][1], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      *why = "cannot create the harness's contexts and streams";
      return false;
    }
  }
  api.cuCtxSetCurrent(g_process.context[0]);
  tagmem_shutdown();
  pattern();
  g_process.baseline = reliability::take_census();
  g_process.ready = true;
  return true;
}

program_result run_program(const std::uint8_t* data, std::size_t size) {
  return runner(data, size).run();
}

const totals& process_totals() { return g_totals; }

}  // namespace tagmem::fuzz
