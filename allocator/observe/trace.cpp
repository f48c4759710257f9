// trace.cpp — the trace buffer, its JSON and NVTX ranges (see trace.hpp).
#include "observe/trace.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "base/error.hpp"
#include "observe/json_text.hpp"
#include "observe/trace_signals.hpp"
#include "options/options.hpp"

#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define TAGMEM_HAVE_NVTX 1
#else
#define TAGMEM_HAVE_NVTX 0
#endif

namespace tagmem::trace {

std::atomic<bool> g_on{false};

namespace {

// Never destroyed: the write at exit may run after static destructors.
struct state {
  std::mutex mutex;
  std::string path;                            // "" : no file
  bool exit_hook = false;                      // the write at exit is registered
  std::vector<std::string> events;             // JSON objects
  std::map<std::string, std::int64_t> mapped;  // per tag, moved by map/unmap spans
  std::int64_t pinned = 0;                     // moved by pinning spans
  std::map<const void*, int> stream_tracks;    // copy stream -> track id
  int tracks[2] = {0, 0};                      // copy tracks per direction
  std::size_t dropped = 0;
};
state& st() {
  static state* s = new state;
  return *s;
}

std::atomic<bool> g_file{false};
std::atomic<bool> g_nvtx{false};
constexpr std::size_t kMaxEvents = 1u << 20;  // past this, events are counted, not kept

int thread_track() {
  static std::atomic<int> next{1};
  thread_local int id = next.fetch_add(1);
  return id;
}

std::string quoted(const char* text) { return json_quoted(text); }

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

void add_locked(state& s, std::string event) {
  if (s.events.size() >= kMaxEvents) {
    ++s.dropped;
    return;
  }
  s.events.push_back(std::move(event));
}

std::string complete_event(const char* name, const char* cat, double ts, double dur, int tid,
                           const char* tag, std::size_t bytes) {
  std::string e = "{\"name\":" + quoted(name) + ",\"cat\":" + quoted(cat) +
                  ",\"ph\":\"X\",\"ts\":" + number(ts) + ",\"dur\":" + number(dur) +
                  ",\"pid\":" + std::to_string(getpid()) + ",\"tid\":" + std::to_string(tid) +
                  ",\"args\":{";
  bool comma = false;
  if (tag) {
    e += "\"tag\":" + quoted(tag);
    comma = true;
  }
  if (bytes) e += std::string(comma ? "," : "") + "\"bytes\":" + std::to_string(bytes);
  return e + "}}";
}

std::string counter_event(const std::string& name, double ts, std::int64_t value) {
  return "{\"name\":" + quoted(name.c_str()) + ",\"ph\":\"C\",\"ts\":" + number(ts) +
         ",\"pid\":" + std::to_string(getpid()) + ",\"args\":{\"bytes\":" + std::to_string(value) +
         "}}";
}

pid_t g_writer = 0;  // the process that registered the write at exit

void write_at_exit() noexcept {
  if (getpid() != g_writer) return;  // a forked child leaving with exit(): the parent's trace
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tagmem: %s\n", e.what());
  }
}

#if TAGMEM_HAVE_NVTX
nvtxDomainHandle_t nvtx_domain() {
  static nvtxDomainHandle_t d = nvtxDomainCreateA("tagmem");
  return d;
}
#endif

}  // namespace

// The machine's monotonic clock (steady_clock is CLOCK_MONOTONIC on Linux), not time since this
// process began: one base in every process, so that a trainer's and an engine's traces opened
// together line up.
double now_us() noexcept {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

// TAGMEM_TRACE is often set once for a whole job (a trainer and an engine, every rank), whose
// processes would otherwise overwrite each other's trace at one path: "%p" becomes the pid of
// the process that starts tagmem, "%%" a single "%"; any other "%" is kept as it is.
std::string expand_trace_path(const char* path) {
  std::string out;
  for (const char* c = path; *c; ++c) {
    if (c[0] == '%' && c[1] == 'p') {
      out += std::to_string(getpid());
      ++c;
    } else if (c[0] == '%' && c[1] == '%') {
      out += '%';
      ++c;
    } else {
      out += *c;
    }
  }
  return out;
}

}  // namespace

void configure() noexcept {
  state& s = st();
  const char* path = option_env(option::TRACE);
  const bool nvtx = TAGMEM_HAVE_NVTX && std::getenv("NVTX_INJECTION64_PATH") != nullptr;
  {
    std::lock_guard lock(s.mutex);
    try {
      s.path = path ? expand_trace_path(path) : "";
    } catch (const std::bad_alloc&) {
      s.path.clear();  // no memory for the name: no trace file rather than a crash
      path = nullptr;
    }
    if (path && !s.exit_hook) {
      g_writer = getpid();
      s.exit_hook = std::atexit(write_at_exit) == 0;
      flush_on_signals(flush);  // SIGTERM and SIGINT never reach the write at exit
    }
  }
  g_file.store(path != nullptr);
  g_nvtx.store(nvtx);
  g_on.store(path != nullptr || nvtx);
}

namespace {

// The trace's JSON, written to `f`; whether every byte went out.
bool write_json(std::FILE* f, const state& s) {
  std::fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":", f);
  std::fprintf(f, "%zu},\n\"traceEvents\":[\n", s.dropped);
  for (std::size_t i = 0; i < s.events.size(); ++i) {
    std::fputs(s.events[i].c_str(), f);
    std::fputs(i + 1 < s.events.size() ? ",\n" : "\n", f);
  }
  std::fputs("]}\n", f);
  return std::fflush(f) == 0 && !std::ferror(f);
}

// Writes the trace through `fd` and closes it; whether every byte went out. A FIFO's reader that
// goes away mid-write would raise SIGPIPE, whose default ends the process: it is blocked on this
// thread for the write, and one the write raised is taken before the mask goes back (one that
// was pending already is left to its handler).
bool write_and_close(int fd, const state& s) {
  std::FILE* f = fdopen(fd, "w");
  if (!f) {
    ::close(fd);
    return false;
  }
  sigset_t pipe_signal, old_mask, pending;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, &old_mask);
  const bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
  const bool written = write_json(f, s);
  const bool closed = std::fclose(f) == 0;
  if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
    const timespec now{};
    sigtimedwait(&pipe_signal, nullptr, &now);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return written && closed;
}

// Note [trace file], the second case: a character device or a FIFO at the path (/dev/null, a
// pipe a collector reads) is written into, as `> path` would; it is never replaced. A FIFO with
// no reader is an error, not a wait.
void write_into(const state& s) {
  const int fd = ::open(s.path.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    fail(TAGMEM_ERROR_INVALID_ARGUMENT, "TAGMEM_TRACE: cannot open '" + s.path +
                                            "' for writing (a device or FIFO; one with no "
                                            "reader cannot take the trace)");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (!write_and_close(fd, s))
    fail(TAGMEM_ERROR_INVALID_ARGUMENT, "TAGMEM_TRACE: cannot write '" + s.path + "'");
}

}  // namespace

void flush() {
  state& s = st();
  std::lock_guard lock(s.mutex);
  if (s.path.empty()) return;
  // Note [trace file]: the trace often goes to a shared directory (/tmp), where a name chosen
  // in advance may already be another user's symlink or file. The temporary file gets a name
  // nobody can guess and is created exclusively (mkostemp: O_CREAT|O_EXCL, mode 0600), then
  // renamed over the path, which replaces a symlink there rather than following it. What is not
  // a file or a symlink is never replaced: a rename over TAGMEM_TRACE=/dev/null, in a process
  // run as root, would leave a regular file there for every program on the machine.
  struct stat at {};
  if (::lstat(s.path.c_str(), &at) == 0 && !S_ISREG(at.st_mode) && !S_ISLNK(at.st_mode)) {
    if (S_ISCHR(at.st_mode) || S_ISFIFO(at.st_mode)) return write_into(s);
    fail(TAGMEM_ERROR_INVALID_ARGUMENT, "TAGMEM_TRACE: '" + s.path +
                                            "' is neither a file nor a device nor a FIFO (a "
                                            "directory?): give the path of a file");
  }
  std::string tmp = s.path + ".XXXXXX";
  const int fd = mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) {
    fail(TAGMEM_ERROR_INVALID_ARGUMENT,
         "TAGMEM_TRACE: cannot write '" + tmp + "' (the trace's temporary file)");
  }
  if (!write_and_close(fd, s) || std::rename(tmp.c_str(), s.path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(TAGMEM_ERROR_INVALID_ARGUMENT, "TAGMEM_TRACE: cannot write '" + s.path + "'");
  }
}

void close() {
  struct forget {
    ~forget() {
      g_file.store(false);
      g_on.store(g_nvtx.load());
      state& s = st();
      std::lock_guard lock(s.mutex);
      s.path.clear();
      s.events.clear();
      s.mapped.clear();
      s.stream_tracks.clear();
      s.tracks[0] = s.tracks[1] = 0;
      s.pinned = 0;
      s.dropped = 0;
    }
  } later;
  flush();
}

void span::begin(const char* name, const char* tag, std::size_t bytes, effect what) noexcept {
  active_ = true;
  name_ = name;
  tag_ = tag;
  bytes_ = bytes;
  what_ = what;
  unwinding_ = std::uncaught_exceptions();
#if TAGMEM_HAVE_NVTX
  if (g_nvtx.load(std::memory_order_relaxed)) {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(nvtx_domain(), &a);
    nvtx_ = true;
  }
#endif
  start_us_ = now_us();
}

void span::end() noexcept {
  const double end_us = now_us();
#if TAGMEM_HAVE_NVTX
  if (nvtx_) nvtxDomainRangePop(nvtx_domain());
#endif
  if (!g_file.load(std::memory_order_relaxed)) return;
  try {
    std::string e = complete_event(name_, "tagmem", start_us_, end_us - start_us_, thread_track(),
                                   tag_, bytes_);
    state& s = st();
    std::lock_guard lock(s.mutex);
    add_locked(s, std::move(e));
    const auto delta = static_cast<std::int64_t>(bytes_);
    if (std::uncaught_exceptions() > unwinding_) return;  // failed: nothing moved
    if ((what_ == effect::mapped_up || what_ == effect::mapped_down) && tag_) {
      std::int64_t& m = s.mapped[tag_];
      m += what_ == effect::mapped_up ? delta : -delta;
      add_locked(s, counter_event(std::string("mapped_bytes ") + tag_, end_us, m));
    } else if (what_ == effect::pinned_up) {
      s.pinned += delta;
      add_locked(s, counter_event("host_pinned_bytes", end_us, s.pinned));
    }
  } catch (...) {  // no memory for the event: it is lost
  }
}

void counter(const std::string& name, std::uint64_t value) noexcept {
  if (!g_file.load(std::memory_order_relaxed)) return;
  try {
    state& s = st();
    std::lock_guard lock(s.mutex);
    if (name == "host_pinned_bytes") s.pinned = static_cast<std::int64_t>(value);
    add_locked(s, counter_event(name, now_us(), static_cast<std::int64_t>(value)));
  } catch (...) {
  }
}

void set_mapped(const char* tag, std::uint64_t value) noexcept {
  if (!g_file.load(std::memory_order_relaxed)) return;
  try {
    state& s = st();
    std::lock_guard lock(s.mutex);
    s.mapped[tag] = static_cast<std::int64_t>(value);
    add_locked(s, counter_event(std::string("mapped_bytes ") + tag, now_us(),
                                static_cast<std::int64_t>(value)));
  } catch (...) {
  }
}

// ---- copy tracks -----------------------------------------------------------------------

void copy_span(const void* stream, bool to_host, double start_us, double dur_us, const char* tag,
               std::size_t bytes) noexcept {
  if (!g_file.load(std::memory_order_relaxed)) return;
  try {
    state& s = st();
    std::lock_guard lock(s.mutex);
    auto [it, fresh] = s.stream_tracks.emplace(stream, 0);
    if (fresh) {
      const int dir = to_host ? 0 : 1;
      it->second = 100000 + dir * 1000 + ++s.tracks[dir];
      const std::string label =
          std::string(to_host ? "copies D2H " : "copies H2D ") + std::to_string(s.tracks[dir]);
      add_locked(s, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(getpid()) +
                        ",\"tid\":" + std::to_string(it->second) +
                        ",\"args\":{\"name\":" + quoted(label.c_str()) + "}}");
    }
    add_locked(s, complete_event(to_host ? "copy D2H" : "copy H2D", "copy", start_us, dur_us,
                                 it->second, tag, bytes));
  } catch (...) {
  }
}

bool recording() noexcept { return g_file.load(std::memory_order_relaxed); }

}  // namespace tagmem::trace
