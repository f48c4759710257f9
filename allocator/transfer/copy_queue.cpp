// copy_queue.cpp — pieces, their round-robin over the copy streams, and the lanes that take
// host-to-device pieces by room (see copy_queue.hpp).
#include "transfer/copy_queue.hpp"

#include <algorithm>
#include <thread>

#include "base/error.hpp"
#include "device/kernel_copy.hpp"
#include "driver/driver.hpp"
#include "observe/trace.hpp"
#include "transfer/copy_clock.hpp"

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

copy_queue::~copy_queue() { give_back_events(); }

void copy_queue::give_back_events() noexcept {
  for (CUevent e : events_) dev_.release_event(e);
  events_.clear();
  for (lane& l : lanes_) {
    for (CUevent e : l.in_flight) dev_.release_event(e);
    l.in_flight.clear();
  }
}

CUevent copy_queue::to_host(const backup_piece& p, const char* tag) {
  CUstream s = dev_.d2h_stream(d2h_one_stream_ ? 0 : next_d2h_++);
  if (d2h_word_ != 0) TAGMEM_CU(cuStreamWaitValue32, s, d2h_word_, 0, CU_STREAM_WAIT_VALUE_EQ);
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

// The lanes are chosen once, at the first piece: the copy streams, and the kernel's when it is
// loaded (hand_out decides, piece by piece, whether it takes any).
void copy_queue::choose_lanes() {
  lanes_chosen_ = true;
  if (lanes_wanted_ != h2d_lanes::by_room) return;
  kernel_copy* kernel = dev_.copy_kernel();
  const std::size_t engines = dev_.copy_stream_count();
  if (kernel != nullptr) {  // first: while wanted, it takes its pieces before the engines
    lanes_.push_back({});
    lanes_.back().stream = kernel->stream();
    lanes_.back().kernel = kernel;
  }
  for (std::size_t i = 0; i < engines; ++i) {
    lanes_.push_back({});
    lanes_.back().stream = dev_.h2d_stream(i);
  }
  for (lane& l : lanes_) l.in_flight.reserve(depth(l, false));
}

void copy_queue::to_device(const backup_piece& p, const char* tag) {
  if (!lanes_chosen_) choose_lanes();
  if (lanes_.empty()) {
    CUstream s = dev_.h2d_stream(next_h2d_++);
    TAGMEM_CU(cuMemcpyHtoDAsync, p.dev, p.host, p.bytes, s);
    trace::copy_queued(s, false, tag, p.bytes);
    return;
  }
  if (failed_) std::rethrow_exception(failed_);
  waiting_.push_back({p, tag});
  hand_out();
}

// Drops the lane's finished pieces from its count. The events given back to the device leave
// the list before a failed query is thrown, so that none is given back twice.
void copy_queue::retire(lane& l) {
  const auto& api = driver::api();
  std::size_t done = 0;
  CUresult r = CUDA_SUCCESS;
  for (; done < l.in_flight.size(); ++done) {
    r = api.cuEventQuery(l.in_flight[done]);
    if (r != CUDA_SUCCESS) break;
    dev_.release_event(l.in_flight[done]);
  }
  l.in_flight.erase(l.in_flight.begin(), l.in_flight.begin() + static_cast<std::ptrdiff_t>(done));
  if (r != CUDA_ERROR_NOT_READY) driver::check(r, "cuEventQuery");
}

// Gives waiting pieces to the lanes with room; returns whether it gave any. A failure is kept
// for finish(): the pieces handed out before it may belong to tags the caller already counts as
// copied.
bool copy_queue::hand_out() {
  bool handed = false;
  try {
    const bool kernel_wanted = dev_.copy_kernel_wanted();
    for (lane& l : lanes_) {
      retire(l);
      if (l.kernel != nullptr && !kernel_wanted) continue;  // the copy engines copy on
      while (l.in_flight.size() < depth(l, kernel_wanted) && next_waiting_ < waiting_.size()) {
        const waiting& w = waiting_[next_waiting_++];
        if (l.kernel != nullptr) {
          l.kernel->launch(w.piece.dev, w.piece.host, w.piece.bytes);
        } else {
          TAGMEM_CU(cuMemcpyHtoDAsync, w.piece.dev, w.piece.host, w.piece.bytes, l.stream);
        }
        trace::copy_queued(l.stream, false, w.tag, w.piece.bytes);
        CUevent e = dev_.acquire_event();
        l.in_flight.push_back(e);  // within the reserve
        TAGMEM_CU(cuEventRecord, e, l.stream);
        handed = true;
      }
    }
  } catch (...) {
    if (!failed_) failed_ = std::current_exception();
    throw;
  }
  if (next_waiting_ == waiting_.size()) {
    waiting_.clear();
    next_waiting_ = 0;
  }
  return handed;
}

void copy_queue::pump() noexcept {
  if (failed_ || !pieces_waiting()) return;
  try {
    hand_out();
  } catch (...) {  // kept in failed_
  }
}

void copy_queue::finish() {
  try {
    while (!failed_ && next_waiting_ < waiting_.size()) {
      if (!hand_out()) std::this_thread::yield();
    }
  } catch (...) {  // kept in failed_, thrown below once the streams are idle
  }
  waiting_.clear();
  next_waiting_ = 0;
  const CUresult r = dev_.wait_copy_streams();
  if (failed_) std::rethrow_exception(failed_);
  driver::check(r, "cuStreamSynchronize");
}

}  // namespace tagmem
