// copy_queue.cpp — pieces and their round-robin over the copy streams (see copy_queue.hpp).
#include "copy_queue.hpp"

#include <algorithm>

#include "driver/driver.hpp"
#include "error.hpp"
#include "observe/trace.hpp"

namespace tagmem {

void cut_pieces(CUdeviceptr at, CUdeviceptr end, extent_cursor& cursor, std::size_t piece_bytes,
                meta_vector<backup_piece>& out) {
  const auto& ext = cursor.extents;
  while (at < end) {
    TAGMEM_ASSERT(cursor.index < ext.size());
    const host_extent& e = ext[cursor.index];
    std::size_t n = std::min({piece_bytes, std::size_t(end - at), e.size - cursor.offset});
    out.push_back({at, e.ptr + cursor.offset, n});
    at += n;
    cursor.offset += n;
    if (cursor.offset == e.size) {
      ++cursor.index;
      cursor.offset = 0;
    }
  }
}

copy_queue::~copy_queue() {
  for (CUevent e : events_) dev_.release_event(e);
}

CUevent copy_queue::to_host(const backup_piece& p, const char* tag) {
  CUstream s = dev_.d2h_stream(next_d2h_++);
  TAGMEM_CU(cuMemcpyDtoHAsync, p.host, p.dev, p.bytes, s);
  trace::copy_queued(s, true, tag, p.bytes);
  CUevent e = dev_.acquire_event();
  try {
    events_.push_back(e);
  } catch (...) {
    dev_.release_event(e);
    throw;
  }
  TAGMEM_CU(cuEventRecord, e, s);
  return e;
}

void copy_queue::to_device(const backup_piece& p, const char* tag) {
  CUstream s = dev_.h2d_stream(next_h2d_++);
  TAGMEM_CU(cuMemcpyHtoDAsync, p.dev, p.host, p.bytes, s);
  trace::copy_queued(s, false, tag, p.bytes);
}

}  // namespace tagmem
