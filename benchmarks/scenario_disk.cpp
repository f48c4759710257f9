// scenario_disk.cpp — TAGMEM_BACKUP_DISK: offload and reload of one tag to files in
// TAGMEM_BENCH_DISK_DIR (else TAGMEM_DISK_DIR), beside the disk's own sequential rate measured in
// the same run: one file of the same size written and read back with O_DIRECT in 16 MiB requests
// from one thread (dd-style), its page cache dropped before the read.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "options/options.hpp"
#include "scenarios.hpp"

namespace tagmem::bench {
namespace {

struct disk_rate {
  double write = 0, read = 0;  // GB/s
};

// dd-style: writes `bytes` to a new file in `dir` with O_DIRECT (plain I/O where refused), then
// reads it back; the file is removed.
disk_rate measure_disk(const std::string& dir, std::size_t bytes) {
  const std::size_t chunk = 16u << 20;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, chunk) != 0) throw std::runtime_error("posix_memalign");
  std::memset(buf, 0x5a, chunk);
  const std::string path = dir + "/tagmem_bench_dd." + std::to_string(getpid());
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd < 0) fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    std::free(buf);
    throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  }
  disk_rate r;
  auto run = [&](bool write) {
    auto t0 = clock::now();
    for (std::size_t at = 0; at < bytes; at += chunk) {
      const std::size_t n = std::min(chunk, bytes - at);
      const ssize_t got = write ? pwrite(fd, buf, n, off_t(at)) : pread(fd, buf, n, off_t(at));
      if (got != ssize_t(n)) throw std::runtime_error("dd-style I/O on " + path + " failed");
    }
    if (write) fsync(fd);
    return bytes / 1e9 / seconds_since(t0);
  };
  try {
    r.write = run(true);
    posix_fadvise(fd, 0, off_t(bytes), POSIX_FADV_DONTNEED);
    r.read = run(false);
  } catch (...) {
    close(fd);
    unlink(path.c_str());
    std::free(buf);
    throw;
  }
  close(fd);
  unlink(path.c_str());
  std::free(buf);
  return r;
}

}  // namespace

void run_disk(env& e) {
  const char* dir = option_text(option::BENCH_DISK_DIR);
  if (!*dir) dir = option_text(option::DISK_DIR);
  if (!*dir) throw std::runtime_error("set TAGMEM_BENCH_DISK_DIR to a directory on a disk");
  session s;
  check(tagmem_set_disk_dir(dir), "tagmem_set_disk_dir");
  const char* tag = "disk";
  const std::size_t total =
      std::max<std::size_t>(64u << 20, std::size_t(4.0 * (1ull << 30) * e.opt.scale));
  std::vector<std::size_t> sizes(16, total / 16 / (1u << 20) * (1u << 20));  // O_DIRECT sizes
  dataset d(tag, sizes);
  d.fill(e.pat, 0);
  const disk_rate raw = measure_disk(dir, d.bytes());
  const char* tags[] = {tag};
  std::vector<double> off, rel;
  for (int c = 1; c <= e.opt.cycles; ++c) {
    sync_device();
    auto t0 = clock::now();
    check(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP_DISK), "tagmem_offload(DISK)");
    off.push_back(seconds_since(t0));
    t0 = clock::now();
    check(tagmem_reload(tags, 1, 0), "tagmem_reload");
    rel.push_back(seconds_since(t0));
    std::printf("[disk] cycle %d: offload %.1f ms, reload %.1f ms\n", c, off.back() * 1e3,
                rel.back() * 1e3);
    verify(e, d, "disk", c, c == 1);
    d.fill(e.pat, c);
  }
  const double gb = d.bytes() / 1e9;
  const double off_r = gb / median(off), rel_r = gb / median(rel);
  e.out.add("disk", "directory / user bytes", std::string(dir) + " / " + fixed(gb, 2) + " GB",
            "TAGMEM_DISK_PIECE_BYTES, TAGMEM_DISK_DEPTH as set");
  e.out.add("disk", "disk dd-style write / read GB/s (O_DIRECT, 16 MiB)",
            fixed(raw.write, 2) + " / " + fixed(raw.read, 2), "same run, same size");
  e.out.add("disk", "offload GB/s (median)", fixed(off_r, 2),
            fixed(off_r / raw.write, 2) + " of the disk's write rate");
  e.out.add("disk", "reload GB/s (median)", fixed(rel_r, 2),
            fixed(rel_r / raw.read, 2) + " of the disk's read rate");
}

}  // namespace tagmem::bench
