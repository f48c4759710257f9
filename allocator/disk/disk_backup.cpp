// disk_backup.cpp — streaming a tag to files and back (Note [disk streaming] in disk_backup.hpp).
#include "disk/disk_backup.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "base/checksum.hpp"
#include "base/error.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"

namespace tagmem {
namespace {

// Runs work(i, bounce) for every i in [0, count) on up to `depth` threads, each with its own
// pinned bounce buffer of `buffer_bytes`. Stops handing out pieces at the first failure and
// rethrows it once every thread has finished.
void for_each_piece(device& dev, std::size_t count, int depth, std::size_t buffer_bytes,
                    const std::function<void(std::size_t, char*)>& work) {
  if (count == 0) return;
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::exception_ptr first;
  // The bounce buffer goes back while the device's context is still current on this thread
  // (cuMemFreeHost needs one): `owner` is destroyed before `guard`.
  struct pinned_buffer {
    void* p = nullptr;
    ~pinned_buffer() {
      if (p) driver::api().cuMemFreeHost(p);
    }
  };
  auto worker = [&]() noexcept {
    try {
      context_guard guard(dev.context());
      pinned_buffer owner;
      TAGMEM_CU(cuMemHostAlloc, &owner.p, buffer_bytes, 0u);
      for (std::size_t i; !stop.load() && (i = next.fetch_add(1)) < count;) {
        work(i, static_cast<char*>(owner.p));
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!first) first = std::current_exception();
      stop = true;
    }
  };
  const std::size_t threads = std::min<std::size_t>(static_cast<std::size_t>(depth), count);
  std::vector<std::thread> pool;
  try {
    for (std::size_t i = 1; i < threads; ++i) pool.emplace_back(worker);
  } catch (...) {  // fewer threads than asked: the ones running take every piece
  }
  worker();
  for (std::thread& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

// The ranges a tag's disk backup writes, one file (or several, Note [disk streaming]) each: its
// live allocations, by address, each widened to whole 4 KiB pages so that O_DIRECT takes every
// write; ranges that then overlap are merged. Free memory in the tag's mappings is not written.
// Widening stays inside the allocation's segment (segments are granularity-aligned), and the
// bytes of a neighbour it takes in are the same snapshot that neighbour's own file holds.
meta_vector<std::pair<CUdeviceptr, std::size_t>> live_ranges_to_write(tag& t) {
  constexpr CUdeviceptr page = 4096;
  meta_vector<std::pair<CUdeviceptr, std::size_t>> live, out;
  t.pool().live_ranges(live);
  out.reserve(live.size());
  const auto& maps = t.arena().mappings();
  for (const auto& [ptr, bytes] : live) {
    CUdeviceptr begin = ptr / page * page;
    CUdeviceptr end = (ptr + bytes + page - 1) / page * page;
    auto m = maps.upper_bound(begin);  // the mapping holding `begin` is the one before
    if (m == maps.begin()) continue;
    --m;
    if (!m->second.resident || begin >= m->first + m->second.size) continue;  // nothing to copy
    end = std::min<CUdeviceptr>(end, m->first + m->second.size);  // a segment lies in one mapping
    if (!out.empty() && out.back().first + out.back().second > begin) {
      out.back().second = std::max<std::size_t>(out.back().second, end - out.back().first);
    } else {
      out.emplace_back(begin, std::size_t(end - begin));
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<disk_backup> write_disk_backup(device& dev, tag& t, const disk_settings& s) {
  auto b = std::make_unique<disk_backup>();
  for (const auto& [va, size] : live_ranges_to_write(t)) {
    for (std::size_t start = 0; start < size; start += s.file_bytes) {
      b->files.push_back(std::make_unique<disk_file>(s.dir));  // Note [disk files]
      const std::size_t file = b->files.size() - 1;
      const std::size_t end = std::min(size, start + s.file_bytes);
      for (std::size_t at = start; at < end; at += s.piece_bytes) {
        b->pieces.push_back(
            {va + at, std::min(s.piece_bytes, end - at), file, static_cast<off_t>(at - start), 0});
      }
    }
    b->bytes += size;
  }
  for_each_piece(dev, b->pieces.size(), s.depth, s.piece_bytes, [&](std::size_t i, char* bounce) {
    disk_piece& p = b->pieces[i];
    TAGMEM_CU(cuMemcpyDtoH, bounce, p.dev, p.bytes);
    p.checksum = checksum64(bounce, p.bytes);
    b->files[p.file]->write_all(bounce, p.bytes, p.offset);
  });
  return b;
}

void read_disk_backup(device& dev, disk_backup& b, const disk_settings& s) {
  for_each_piece(dev, b.pieces.size(), s.depth, s.piece_bytes, [&](std::size_t i, char* bounce) {
    const disk_piece& p = b.pieces[i];
    disk_file& f = *b.files[p.file];
    f.read_all(bounce, p.bytes, p.offset);
    TAGMEM_EXPECTS(checksum64(bounce, p.bytes) == p.checksum, TAGMEM_ERROR_IO,
                   "disk backup file " + f.path() + " holds other bytes at offset " +
                       std::to_string(p.offset) + " than were written (checksum mismatch)");
    TAGMEM_CU(cuMemcpyHtoD, p.dev, bounce, p.bytes);
  });
}

void release_freed_disk_copy(disk_backup& b, CUdeviceptr ptr, std::size_t size) noexcept {
  std::vector<unsigned char> freed;  // per file: 1 while all its pieces lie in the range
  try {
    freed.assign(b.files.size(), 0);
  } catch (...) {  // no memory for the list: the files stay until the reload removes them
    return;
  }
  for (const disk_piece& p : b.pieces) freed[p.file] = 1;  // files with pieces
  for (const disk_piece& p : b.pieces) {
    if (p.dev < ptr || p.dev + p.bytes > ptr + size) freed[p.file] = 0;
  }
  std::erase_if(b.pieces, [&](const disk_piece& p) {
    if (!freed[p.file]) return false;
    b.bytes -= p.bytes;
    return true;
  });
  for (std::size_t i = 0; i < b.files.size(); ++i) {
    if (freed[i]) b.files[i].reset();  // closes and removes it
  }
}

}  // namespace tagmem
