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
// Methods: memfd, exactly as replica/shared_buffer.cpp makes and adopts it (shared_buffer's own
// create and adopt: memfd, size, seals, MAP_SHARED, fault-in on TAGMEM_HOST_PIN_THREADS threads,
// cuMemHostRegister; the importer maps and registers); and host-located cuMem (cuMemCreate on the
// device's host NUMA node with POSIX-fd handles, exported; reserve + map + access for the device
// and the host; the importer imports, reserves, maps and sets access). A driver error while
// making or opening the cuMem way is reported as "not supported by this driver", not a failure.
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
#include "replica/shared_buffer.hpp"

using namespace tagmem;
using namespace tagmem::bench;

namespace {

constexpr std::uint64_t kIdentity = 0x736861726564686full;  // what adopt() checks the header for
constexpr std::uint64_t kSeed = 0x73686d656d;
constexpr const char* kRefused = "not supported by this driver: ";

// A driver error on the cuMem way's setup: the driver does not offer that way (run_way tells it
// from a failure by kRefused, also in an importer's reply).
void cu_or_refuse(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  if (cu().cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown error";
  throw std::runtime_error(std::string(kRefused) + name + " (" + call + ")");
}
#define REFUSABLE(name, ...) cu_or_refuse(cu().name(__VA_ARGS__), #name)

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

int host_numa_id() {
  int id = -1;
  if (cu().cuDeviceGetAttribute(&id, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0) != CUDA_SUCCESS) id = -1;
  return id >= 0 ? id : 0;
}

// Host cuMem mapped for device 0 and the host; the destructor undoes what was done.
struct cumem_mapping {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr va = 0;
  std::size_t size = 0;
  bool mapped = false;
  int fd = -1;  // the exporter's shareable handle
  ~cumem_mapping() {
    if (mapped) cu().cuMemUnmap(va, size);
    if (va) cu().cuMemAddressFree(va, size);
    if (handle) cu().cuMemRelease(handle);
    if (fd >= 0) close(fd);
  }
};

// Rounds `n` up to the granularity; `import_fd` < 0 creates and exports, else imports it.
std::unique_ptr<cumem_mapping> cumem_map(std::size_t n, int numa, int import_fd) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = numa;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  std::size_t gran = 0;
  REFUSABLE(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  auto m = std::make_unique<cumem_mapping>();
  m->size = (n + gran - 1) / gran * gran;
  if (import_fd < 0) {
    REFUSABLE(cuMemCreate, &m->handle, m->size, &prop, 0);
    REFUSABLE(cuMemExportToShareableHandle, &m->fd, m->handle,
              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  } else {
    const CUresult r = cu().cuMemImportFromShareableHandle(
        &m->handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(import_fd)),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(import_fd);  // the handle holds the memory
    cu_or_refuse(r, "cuMemImportFromShareableHandle");
  }
  REFUSABLE(cuMemAddressReserve, &m->va, m->size, gran, 0, 0);
  REFUSABLE(cuMemMap, m->va, m->size, 0, m->handle, 0);
  m->mapped = true;
  CUmemAccessDesc d[2] = {};
  d[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d[0].location.id = 0;
  d[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  d[1].location.id = numa;
  d[0].flags = d[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REFUSABLE(cuMemSetAccess, m->va, m->size, d, 2);
  return m;
}

// One way's shared memory as this process holds it.
struct shared_host {
  std::unique_ptr<shared_buffer> memfd;
  std::unique_ptr<cumem_mapping> cumem;
  char* host() const { return memfd ? memfd->data() : reinterpret_cast<char*>(cumem->va); }
  int fd() const { return memfd ? memfd->fd() : cumem->fd; }
};

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
int run_importer(const std::string& how, int fd, std::size_t n, int numa) {
  FILE *in = nullptr, *out = nullptr;
  if (!parent_pipes(&in, &out, "--importer")) return 2;
  try {
    use_device0();
    device dev(0, make_config(nullptr));
    side sd(n);
    shared_host mem;
    serve(in, out, [&](const std::string& cmd) -> std::string {
      auto t0 = clock::now();
      if (cmd == "open") {
        if (how == "memfd") {
          mem.memfd = shared_buffer::adopt(dev, fd, kIdentity, n, 2, "the exporter");
        } else {
          mem.cumem = cumem_map(n, numa, fd);
        }
        return "ok " + std::to_string(seconds_since(t0));
      }
      if (cmd == "check") {
        const std::string why = check_pattern(sd, mem.host(), shift_of(0));
        return why.empty() ? "ok 0" : "fail importer: " + why;
      }
      if (cmd == "rates") {
        const double d2h = copy_rate(sd, mem.host(), true), h2d = copy_rate(sd, mem.host(), false);
        return "ok 0 " + std::to_string(d2h) + " " + std::to_string(h2d);
      }
      if (cmd == "write") {
        write_pattern(sd, mem.host(), shift_of(1));
        return "ok 0";
      }
      if (cmd == "close") {
        mem = {};
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
bool run_way(const std::string& how, const side& sd, device& dev, int numa, results& out) {
  const std::string name = how == "memfd" ? "memfd + cuMemHostRegister (shared_buffer)"
                                          : "host cuMem (HOST_NUMA create + export + map + access)";
  const std::size_t n = sd.n;
  child kid{"importer"};
  int pass = -1;
  bool ok = true;
  try {
    shared_host mem;
    auto t0 = clock::now();
    if (how == "memfd") {
      mem.memfd = shared_buffer::create(dev, kIdentity, n, 2);
    } else {
      mem.cumem = cumem_map(n, numa, -1);
    }
    const double make_s = seconds_since(t0);
    const double d2h = copy_rate(sd, mem.host(), true), h2d = copy_rate(sd, mem.host(), false);
    write_pattern(sd, mem.host(), shift_of(0));
    pass = fcntl(mem.fd(), F_DUPFD, 10);  // without close-on-exec: the importer inherits it
    if (pass < 0) throw std::runtime_error("duplicating the descriptor failed");
    kid = spawn(kid.who,
                {"tagmem_bench_shared_host", "--importer=" + how, "--fd=" + std::to_string(pass),
                 "--bytes=" + std::to_string(n), "--numa=" + std::to_string(numa)});
    close(pass);
    pass = -1;
    const double open_s = ask(kid.to, kid.from, kid.who, "open");
    ask(kid.to, kid.from, kid.who, "check");
    const answer in = ask_full(kid.to, kid.from, kid.who, "rates");
    ask(kid.to, kid.from, kid.who, "write");
    const std::string why = check_pattern(sd, mem.host(), shift_of(1));
    if (!why.empty()) throw std::runtime_error("exporter: " + why);
    const double close_in = ask(kid.to, kid.from, kid.who, "close");
    child done = std::exchange(kid, child{kid.who});
    finish(done);
    t0 = clock::now();
    mem = {};
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
  args a(argc, argv, {"bytes", "tsv", "importer", "fd", "numa"});
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
  if (const std::string how = a.str("importer", ""); !how.empty()) {
    return run_importer(how, int(a.num("fd", -1)), n, int(a.num("numa", 0)));
  }
  results out;
  bool ok = true;
  try {
    use_device0();
    const int numa = host_numa_id();
    std::printf("# shared host memory, %s, on %s (%s driver), host NUMA node %d\n",
                format_bytes(n).c_str(), device_name().c_str(),
                using_emulator() ? "EMULATED" : "real CUDA", numa);
    std::fflush(stdout);
    device dev(0, make_config(nullptr));
    const side sd(n);
    for (const char* how : {"memfd", "cumem"}) ok = run_way(how, sd, dev, numa, out) && ok;
  } catch (const std::exception& ex) {
    std::printf("ERROR: %s\n", ex.what());
    ok = false;
  }
  out.print("shared host memory " + format_bytes(n) + (ok ? "" : " -- FAILURES, see the log"));
  out.write_tsv(a.str("tsv", ""));
  return ok ? 0 : 1;
}
