// shared_host_bench.cpp — which host memory should the processes of one node share and copy
// through with their GPUs (the one host copy of a replicated tag, docs/replicated.md)? Makes
// --bytes (default 16 GiB) of shared host memory each way below in this process (the exporter)
// and opens it in a child process (the importer), and reports per way: the time to make it, the
// time to open it in the other process, the copy rates between each process's device buffer and
// the shared memory in both directions, and whether every byte written by one process reads
// back in the other.
//
//   tagmem_bench_shared_host [--bytes=16G] [--tsv=shared_host.tsv]
//
// Methods: the two ways of replica/host_share.hpp, through its own make and open, so the figures
// are the replica tier's: memfd (memfd, size, seals, MAP_SHARED, fault-in on
// TAGMEM_HOST_PIN_THREADS threads, cuMemHostRegister; the importer maps and registers) and
// host-located cuMem (cuMemCreate on the device's host NUMA node with POSIX-fd handles, exported;
// reserve + map + access for the device and the host; the importer imports, reserves, maps and
// sets access). Where the driver refuses host cuMem (make falls back to the memfd) that way is
// reported as "not supported by this driver", not a failure.
//
// The importer is this program started again (children.hpp: fork + exec, so no CUDA state crosses
// the fork) and driven over its pipes. The shared memory's descriptor reaches it by inheritance:
// a duplicate without close-on-exec, its number in --fd, so the importer's open time is the
// mapping and registration (or import, map and access) without a transfer of the descriptor.
//
// Copy rates: async copies of the device buffer (256 MiB at most) into or out of the shared memory
// piece after piece on one stream, as tagmem_bench_pinning measures them, so the two tables
// compare. The byte check: the exporter copies a seeded pattern (dataset.hpp) through its device
// buffer into the shared memory; the importer copies every byte back through its own device
// buffer into private pinned memory and compares; then the importer writes the pattern at another
// offset and the exporter checks it the same way. A mismatch makes the exit status 1.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "children.hpp"
#include "dataset.hpp"
#include "device/device.hpp"
#include "options/config.hpp"
#include "replica/host_share.hpp"

using namespace tagmem;
using namespace tagmem::bench;

namespace {

constexpr std::uint64_t kSeed = 0x73686d656d;
constexpr const char* kRefused = "not supported by this driver: ";

// The driver table has no cuDeviceGetName (tagmem never needs it); the header does.
std::string device_name() {
  char name[256] = "";
  if (void* lib = dlopen(driver::library_path().c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    using get_name = CUresult (*)(char*, int, CUdevice);
    auto f = reinterpret_cast<get_name>(dlsym(lib, "cuDeviceGetName"));
    if (f && f(name, sizeof name, 0) != CUDA_SUCCESS) name[0] = 0;
    dlclose(lib);
  }
  return name[0] ? name : using_emulator() ? "emulated device" : "unknown device";
}

// What each process copies with: its device buffer, stream, private staging and the pattern.
struct side {
  std::size_t n, piece;
  CUdeviceptr dev = 0;
  CUstream s = nullptr;
  pinned_buffer staging;
  pattern pat;  // a size that is no power of two: no two pieces hold the same bytes
  explicit side(std::size_t bytes)
      : n(bytes),
        piece(std::min<std::size_t>(bytes, 256u << 20)),
        staging(piece),
        pat(piece - 3 * 4096 + 40, kSeed) {
    BENCH_CU(cuMemAlloc, &dev, piece);
    BENCH_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
  }
  ~side() {
    cu().cuStreamDestroy(s);
    cu().cuMemFree(dev);
  }
};

// Copy rate (GB/s) between the device buffer and all of `host`, one direction.
double copy_rate(const side& sd, char* host, bool to_host) {
  return bench::copy_rate({{host, sd.n}}, sd.dev, sd.piece, to_host, sd.s);
}

// Byte i of the shared memory holds pattern byte i + shift.
void write_pattern(const side& sd, char* host, std::size_t shift) {
  const std::size_t size = sd.pat.size();
  for (std::size_t off = 0; off < sd.n; off += sd.piece) {
    const std::size_t k = std::min(sd.piece, sd.n - off);
    for (std::size_t done = 0; done < k;) {
      const std::size_t at = (off + shift + done) % size, len = std::min(k - done, size - at);
      BENCH_CU(cuMemcpyHtoDAsync, sd.dev + done, sd.pat.data() + at, len, sd.s);
      done += len;
    }
    BENCH_CU(cuMemcpyDtoHAsync, host + off, sd.dev, k, sd.s);
    BENCH_CU(cuStreamSynchronize, sd.s);
  }
}

// Reads every byte back through the device buffer; "" when all match write_pattern's.
std::string check_pattern(const side& sd, const char* host, std::size_t shift) {
  const std::size_t size = sd.pat.size();
  std::uint64_t bad = 0, first = 0;
  for (std::size_t off = 0; off < sd.n; off += sd.piece) {
    const std::size_t k = std::min(sd.piece, sd.n - off);
    BENCH_CU(cuMemcpyHtoDAsync, sd.dev, host + off, k, sd.s);
    BENCH_CU(cuMemcpyDtoHAsync, sd.staging.data(), sd.dev, k, sd.s);
    BENCH_CU(cuStreamSynchronize, sd.s);
    for (std::size_t done = 0; done < k;) {
      const std::size_t at = (off + shift + done) % size, len = std::min(k - done, size - at);
      const unsigned char* got = sd.staging.data() + done;
      if (std::memcmp(got, sd.pat.data() + at, len) != 0) {
        for (std::size_t i = 0; i < len; ++i) {
          if (got[i] != sd.pat.data()[at + i] && bad++ == 0) first = off + done + i;
        }
      }
      done += len;
    }
  }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(sd.n) + " bytes differ, the first at " +
         std::to_string(first);
}

std::size_t shift_of(int writer) { return writer == 0 ? 0 : 1000003; }

// The importer's side: opens what --fd names, then checks, measures and writes on command.
int run_importer(host_share_way way, int fd, std::size_t n) {
  FILE *in = nullptr, *out = nullptr;
  if (!parent_pipes(&in, &out, "--importer")) return 2;
  try {
    use_device0();
    device dev(0, make_config(nullptr));
    side sd(n);
    std::unique_ptr<host_share> mem;
    serve(in, out, [&](const std::string& cmd) -> std::string {
      auto t0 = clock::now();
      if (cmd == "open") {
        mem = host_share::open(dev, fd, way, n, "the exporter's descriptor ");
        return "ok " + std::to_string(seconds_since(t0));
      }
      if (cmd == "check") {
        const std::string why = check_pattern(sd, mem->base(), shift_of(0));
        return why.empty() ? "ok 0" : "fail importer: " + why;
      }
      if (cmd == "rates") {
        const double d2h = copy_rate(sd, mem->base(), true),
                     h2d = copy_rate(sd, mem->base(), false);
        return "ok 0 " + std::to_string(d2h) + " " + std::to_string(h2d);
      }
      if (cmd == "write") {
        write_pattern(sd, mem->base(), shift_of(1));
        return "ok 0";
      }
      if (cmd == "close") {
        mem.reset();
        return "ok " + std::to_string(seconds_since(t0));
      }
      return {};
    });
  } catch (const std::exception& ex) {
    reply_line(out, std::string("fail ") + ex.what());
    return 1;
  }
  return 0;
}

// One way, both processes: its table row. False when a byte check or a step failed.
bool run_way(host_share_way way, const side& sd, device& dev, results& out) {
  const std::string name = way == host_share_way::memfd
                               ? "memfd + cuMemHostRegister"
                               : "host cuMem (HOST_NUMA create + export + map + access)";
  const std::size_t n = sd.n;
  child kid{"importer"};
  int pass = -1;
  bool ok = true;
  try {
    auto t0 = clock::now();
    std::unique_ptr<host_share> mem = host_share::make(dev, n, way);
    const double make_s = seconds_since(t0);
    if (mem->way() != way) {  // the driver refused (TAGMEM_LOG=info says why)
      throw std::runtime_error(std::string(kRefused) +
                               "host cuMem was refused, make fell back to " +
                               host_share_way_name(mem->way()));
    }
    const double d2h = copy_rate(sd, mem->base(), true), h2d = copy_rate(sd, mem->base(), false);
    write_pattern(sd, mem->base(), shift_of(0));
    pass = fcntl(mem->fd(), F_DUPFD, 10);  // without close-on-exec: the importer inherits it
    if (pass < 0) throw std::runtime_error("duplicating the descriptor failed");
    kid = spawn(kid.who,
                {"tagmem_bench_shared_host", "--importer=" + std::to_string(static_cast<int>(way)),
                 "--fd=" + std::to_string(pass), "--bytes=" + std::to_string(n)});
    close(pass);
    pass = -1;
    const double open_s = ask(kid.to, kid.from, kid.who, "open");
    ask(kid.to, kid.from, kid.who, "check");
    const answer in = ask_full(kid.to, kid.from, kid.who, "rates");
    ask(kid.to, kid.from, kid.who, "write");
    const std::string why = check_pattern(sd, mem->base(), shift_of(1));
    if (!why.empty()) throw std::runtime_error("exporter: " + why);
    const double close_in = ask(kid.to, kid.from, kid.who, "close");
    child done = std::exchange(kid, child{kid.who});
    finish(done);
    t0 = clock::now();
    mem.reset();
    const double close_out = seconds_since(t0);
    out.add(name, "make s / GB/s", fixed(make_s, 3) + " / " + fixed(n / make_s / 1e9, 2),
            "open " + fixed(open_s, 3) + " s; exporter D2H " + fixed(d2h, 1) + ", H2D " +
                fixed(h2d, 1) + " GB/s; importer D2H " + fixed(in.a, 1) + ", H2D " +
                fixed(in.b, 1) + " GB/s; bytes checked both ways; close: exporter " +
                fixed(close_out, 3) + ", importer " + fixed(close_in, 3) + " s");
    std::printf(
        "[shared_host] %s: make %.3f s, open %.3f s; exporter D2H %.1f, H2D %.1f GB/s; importer "
        "D2H %.1f, H2D %.1f GB/s; bytes checked both ways\n",
        name.c_str(), make_s, open_s, d2h, h2d, in.a, in.b);
  } catch (const std::exception& ex) {
    std::string why = ex.what();  // an importer's reply ends in its newline
    why.erase(why.find_last_not_of(" \n") + 1);
    const std::size_t refusal = why.find(kRefused);
    ok = refusal != std::string::npos;
    why = ok ? why.substr(refusal) : "FAILED: " + why;
    out.add(name, "make s / GB/s", "n/a", why);
    std::printf("[shared_host] %s: %s\n", name.c_str(), why.c_str());
  }
  if (pass >= 0) close(pass);
  try {
    if (kid.pid > 0) finish(kid);  // after a failure: the importer may still run
  } catch (...) {
  }
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  args a(argc, argv, {"bytes", "tsv", "importer", "fd"});
  if (!a.ok()) {
    std::fprintf(stderr, "tagmem_bench_shared_host: %s\n", a.error().c_str());
    return 2;
  }
  std::size_t n = 0;
  try {
    n = (a.bytes("bytes", 16ull << 30) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "tagmem_bench_shared_host: bad option: %s\n", ex.what());
    return 2;
  }
  if (const int way = static_cast<int>(a.num("importer", 0)); way != 0) {
    return run_importer(static_cast<host_share_way>(way), int(a.num("fd", -1)), n);
  }
  results out;
  bool ok = true;
  try {
    use_device0();
    std::printf("# shared host memory, %s, on %s (%s driver)\n", format_bytes(n).c_str(),
                device_name().c_str(), using_emulator() ? "EMULATED" : "real CUDA");
    std::fflush(stdout);
    device dev(0, make_config(nullptr));
    const side sd(n);
    for (host_share_way way : {host_share_way::memfd, host_share_way::cumem}) {
      ok = run_way(way, sd, dev, out) && ok;
    }
  } catch (const std::exception& ex) {
    std::printf("ERROR: %s\n", ex.what());
    ok = false;
  }
  out.print("shared host memory " + format_bytes(n) + (ok ? "" : " -- FAILURES, see the log"));
  out.write_tsv(a.str("tsv", ""));
  return ok ? 0 : 1;
}
