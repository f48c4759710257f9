// shared_buffers.cpp — the two-rank pause/resume scenario (see header).
#include "shared_buffers.hpp"

#include <unistd.h>

#include <numeric>
#include <sstream>

#include "nccl_way.hpp"

namespace tagmem::preload_test {
namespace {

constexpr std::size_t MiB = 1ull << 20;

enum what : std::uint64_t { kLocal = 1, kOwnHalf, kPeerHalf, kClassic, kHost };

std::uint64_t seed(what w, int owner, std::size_t index, int cycle) {
  return (static_cast<std::uint64_t>(w) << 48) ^ (static_cast<std::uint64_t>(owner) << 40) ^
         (static_cast<std::uint64_t>(index) << 20) ^ static_cast<std::uint64_t>(cycle);
}

}  // namespace

shared_scenario::shared_scenario(int rank, control& peer, std::string group,
                                 const scenario_options& opt)
    : me_(rank), other_(1 - rank), peer_(peer), group_(std::move(group)), opt_(opt) {}

std::vector<std::string> shared_scenario::run() {
  try {
    setup();
    for (int cycle = 0; cycle < opt_.cycles; ++cycle) {
      write_cycle(cycle);
      step("written", cycle);
      verify_all(cycle, "before pause");
      step("verified", cycle);
      pause_and_check();
      resume_and_check(cycle);
      step("resumed", cycle);
      if (cycle == 0) share_again_after_resume();
    }
    teardown();
  } catch (const std::exception& e) {
    failures_.push_back(std::string("rank ") + std::to_string(me_) + " stopped: " + e.what());
  }
  return failures_;
}

void shared_scenario::expect(bool ok, const std::string& what) {
  if (!ok) failures_.push_back("rank " + std::to_string(me_) + ": " + what);
}

void shared_scenario::step(const char* name, int cycle) {
  std::string m = std::string(name) + " " + std::to_string(cycle);
  peer_.send(m);
  peer_.expect(m, opt_.timeout_ms * 2);
}

void shared_scenario::setup() {
  use_device(me_);
  baseline_allocations_ = emu_live_allocations();
  baseline_mappings_ = emu_live_mappings();
  // Compact: every buffer of the smallest size, for tests that repeat the scenario many times.
  const std::size_t m = opt_.compact ? 1 : 2;
  for (std::size_t size : {2 * MiB, 2 * m * MiB, (4 * m - 2) * MiB})
    local_.push_back(create_buffer(me_, size, false));
  let_go_of_handle(local_[1]);  // NCCL may drop its handle once mapped
  for (std::size_t size : {2 * m * MiB, 2 * MiB})
    exported_.push_back(create_buffer(me_, size, true));
  classic_big_ = classic_buffer(
      opt_.compact ? 2 * MiB : 3 * MiB);      // served by the shim (TAGMEM_NCCL_CUMEMALLOC=vmm)
  classic_small_ = classic_buffer(64 << 10);  // below TAGMEM_NCCL_CLASSIC_MIN_BYTES: passed through
  host_ = create_buffer(me_, 2 * MiB, false, /*host_located=*/true);

  // Exchange the exported buffers as POSIX fds, as NCCL's proxies do; close ours once sent.
  std::vector<int> fds;
  std::ostringstream sizes;
  for (const buffer& b : exported_) {
    fds.push_back(export_fd(b));
    sizes << b.size << " ";
  }
  peer_.send("exports " + sizes.str(), fds);
  for (int fd : fds) ::close(fd);
  std::vector<int> got;
  std::istringstream in(peer_.receive(&got, opt_.timeout_ms));
  std::string word;
  in >> word;
  expect(word == "exports" && got.size() == 2, "expected two exported fds from the peer");
  for (int fd : got) {
    std::size_t size = 0;
    in >> size;
    imported_.push_back(import_buffer(me_, fd, size));
    ::close(fd);  // NCCL closes the fd once imported
  }
  let_go_of_handle(imported_[1]);
  let_go_of_handle(exported_[1]);  // resume must then borrow a handle to re-export it

  tagmem_nccl_stats s = shim_stats();
  expect(s.local_allocations == 4 && s.exported_allocations == 2 && s.imported_allocations == 2,
         "the shim records 4 local (3 + cuMemAlloc), 2 exported and 2 imported allocations; got " +
             std::to_string(s.local_allocations) + "/" + std::to_string(s.exported_allocations) +
             "/" + std::to_string(s.imported_allocations));
  expect(s.host_located_bytes >= 2 * MiB, "host-located bytes are counted, not recorded");
  expect(s.passthrough_bytes >= (64 << 10), "small cuMemAlloc bytes are passed through");
}

void shared_scenario::write_cycle(int cycle) {
  for (std::size_t i = 0; i < local_.size(); ++i)
    write_bytes(local_[i], 0, pattern(seed(kLocal, me_, i, cycle), local_[i].size));
  for (std::size_t i = 0; i < exported_.size(); ++i)
    write_bytes(exported_[i], 0, pattern(seed(kOwnHalf, me_, i, cycle), exported_[i].size / 2));
  for (std::size_t i = 0; i < imported_.size(); ++i) {
    std::size_t half = imported_[i].size / 2;
    write_bytes(imported_[i], half, pattern(seed(kPeerHalf, me_, i, cycle), half));
  }
  write_bytes(classic_big_, 0, pattern(seed(kClassic, me_, 0, cycle), classic_big_.size));
  write_bytes(classic_small_, 0, pattern(seed(kClassic, me_, 1, cycle), classic_small_.size));
  write_bytes(host_, 0, pattern(seed(kHost, me_, 0, cycle), host_.size));
}

void shared_scenario::check_bytes(const buffer& b, std::size_t offset, std::uint64_t s,
                                  std::size_t n, const std::string& what) {
  expect(read_bytes(b, offset, n) == pattern(s, n), what + ": bytes differ");
}

void shared_scenario::check_shared(const buffer& b, int owner, std::size_t index, int cycle,
                                   const std::string& what) {
  std::size_t half = b.size / 2;
  check_bytes(b, 0, seed(kOwnHalf, owner, index, cycle), half, what + " (owner's half)");
  check_bytes(b, half, seed(kPeerHalf, 1 - owner, index, cycle), half, what + " (peer's half)");
}

void shared_scenario::verify_all(int cycle, const std::string& when) {
  std::string c = " cycle " + std::to_string(cycle) + " " + when;
  for (std::size_t i = 0; i < local_.size(); ++i)
    check_bytes(local_[i], 0, seed(kLocal, me_, i, cycle), local_[i].size,
                "local buffer " + std::to_string(i) + c);
  for (std::size_t i = 0; i < exported_.size(); ++i)
    check_shared(exported_[i], me_, i, cycle, "exported buffer " + std::to_string(i) + c);
  for (std::size_t i = 0; i < imported_.size(); ++i)
    check_shared(imported_[i], other_, i, cycle, "imported buffer " + std::to_string(i) + c);
  for (const buffer& b : second_imports_)
    check_shared(b, other_, 0, cycle, "second mapping of imported buffer 0" + c);
  check_bytes(classic_big_, 0, seed(kClassic, me_, 0, cycle), classic_big_.size,
              "cuMemAlloc buffer" + c);
  check_bytes(classic_small_, 0, seed(kClassic, me_, 1, cycle), classic_small_.size,
              "small cuMemAlloc buffer" + c);
  check_bytes(host_, 0, seed(kHost, me_, 0, cycle), host_.size, "host-located buffer" + c);
}

void shared_scenario::verify_whole_or_gone(int cycle, const std::string& when) {
  std::string c = " cycle " + std::to_string(cycle) + " " + when;
  auto whole = [&](const buffer& b, const std::string& what) {
    bool first = readable(b.va), last = readable(b.va + b.size - 1);
    expect(first == last, what + c + ": mapped in part");
    return first && last;
  };
  for (std::size_t i = 0; i < local_.size(); ++i) {
    std::string what = "local buffer " + std::to_string(i);
    if (whole(local_[i], what))
      check_bytes(local_[i], 0, seed(kLocal, me_, i, cycle), local_[i].size, what + c);
  }
  for (std::size_t i = 0; i < exported_.size(); ++i) {
    std::string what = "exported buffer " + std::to_string(i);
    if (whole(exported_[i], what)) check_shared(exported_[i], me_, i, cycle, what + c);
  }
  for (std::size_t i = 0; i < imported_.size(); ++i) {
    std::string what = "imported buffer " + std::to_string(i);
    if (whole(imported_[i], what)) check_shared(imported_[i], other_, i, cycle, what + c);
  }
  for (const buffer& b : second_imports_) {
    if (whole(b, "second mapping of imported buffer 0"))
      check_shared(b, other_, 0, cycle, "second mapping of imported buffer 0" + c);
  }
  if (whole(classic_big_, "cuMemAlloc buffer"))
    check_bytes(classic_big_, 0, seed(kClassic, me_, 0, cycle), classic_big_.size,
                "cuMemAlloc buffer" + c);
}

std::vector<const buffer*> shared_scenario::released_buffers() const {
  std::vector<const buffer*> out;
  for (const auto* list : {&local_, &exported_, &imported_, &second_imports_})
    for (const buffer& b : *list) out.push_back(&b);
  out.push_back(&classic_big_);
  return out;
}

std::size_t shared_scenario::total(const std::vector<buffer>& v) {
  return std::accumulate(v.begin(), v.end(), std::size_t{0},
                         [](std::size_t n, const buffer& b) { return n + b.size; });
}

void shared_scenario::pause_and_check() {
  const std::size_t classic_span = classic_big_.size <= 2 * MiB ? 2 * MiB : 4 * MiB;  // rounded
  const std::size_t own = total(local_) + total(exported_) + classic_span;
  const std::size_t mapped_here = own + total(imported_) + total(second_imports_);
  const std::size_t rss_before = rss_shmem_bytes();
  const std::uint64_t used_before = emu_device_used_bytes(me_);
  tagmem_status st = shim().pause(group_.c_str(), me_, 2, opt_.timeout_ms);
  expect(st == TAGMEM_SUCCESS,
         std::string("pause: ") + shim().status_string(st) + ": " + shim().last_error());
  if (st != TAGMEM_SUCCESS) throw std::runtime_error("pause failed");
  tagmem_nccl_stats s = shim_stats();
  expect(s.paused == 1, "stats say paused");
  expect(s.last_released_local_bytes == total(local_) + classic_span,
         "released local bytes: " + std::to_string(s.last_released_local_bytes));
  expect(s.last_released_exported_bytes == total(exported_),
         "released exported bytes: " + std::to_string(s.last_released_exported_bytes));
  expect(s.last_released_imported_bytes == total(imported_) + total(second_imports_),
         "released imported bytes: " + std::to_string(s.last_released_imported_bytes));
  expect(s.last_kept_bytes == 0 && s.last_kept_allocations == 0,
         "nothing kept resident: " + std::to_string(s.last_kept_bytes));
  expect(s.backup_bytes == own, "backup holds the bytes of every buffer created here");
  expect(s.resident_bytes == 0, "no recorded buffer resident");
  const std::uint64_t used_after = emu_device_used_bytes(me_);
  expect(used_before - used_after == own,
         "device memory given back: " + std::to_string(used_before - used_after) + " of " +
             std::to_string(own));
  const std::size_t rss_after = rss_shmem_bytes();
  expect(rss_before > rss_after && rss_before - rss_after >= mapped_here * 9 / 10,
         "RSS of device memory dropped by " + std::to_string(rss_before - rss_after) +
             " bytes, expected about " + std::to_string(mapped_here));
  for (const buffer* b : released_buffers()) {
    expect(!readable(b->va) && !readable(b->va + b->size - 1),
           "a released buffer must fault when touched");
  }
  expect(readable(host_.va), "host-located memory stays mapped");
  expect(readable(classic_small_.va), "passed-through cuMemAlloc memory stays mapped");
  // Allocation properties are still answered from the records while released.
  CUmemAllocationProp prop{};
  expect(
      nccl().cuMemGetAllocationPropertiesFromHandle(&prop, exported_[0].handle) == CUDA_SUCCESS &&
          prop.location.id == me_,
      "properties of a released allocation");
}

void shared_scenario::resume_and_check(int cycle) {
  tagmem_status st = shim().resume(group_.c_str(), me_, 2, opt_.timeout_ms);
  expect(st == TAGMEM_SUCCESS,
         std::string("resume: ") + shim().status_string(st) + ": " + shim().last_error());
  if (st != TAGMEM_SUCCESS) throw std::runtime_error("resume failed");
  tagmem_nccl_stats s = shim_stats();
  expect(s.paused == 0 && s.released_bytes == 0 && s.backup_bytes == 0,
         "resumed: nothing released, no backup held");
  for (const buffer* b : released_buffers())
    expect(readable(b->va) && readable(b->va + b->size - 1), "a resumed buffer is mapped again");
  verify_all(cycle, "after resume");
}

void shared_scenario::share_again_after_resume() {
  CUmemGenericAllocationHandle h = 0;
  expect(
      nccl().cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(local_[1].va)) == CUDA_SUCCESS,
      "retain a resumed buffer's handle");
  CUmemAllocationProp prop{};
  expect(nccl().cuMemGetAllocationPropertiesFromHandle(&prop, h) == CUDA_SUCCESS &&
             prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop.location.id == me_,
         "properties through a retained handle");
  expect(nccl().cuMemRelease(h) == CUDA_SUCCESS, "release the retained handle");
  local_[1].handle = 0;

  int fd = export_fd(exported_[0]);
  peer_.send("again " + std::to_string(exported_[0].size), {fd});
  ::close(fd);
  std::vector<int> got;
  std::string msg = peer_.receive(&got, opt_.timeout_ms);
  expect(got.size() == 1, "one fd exported again after resume");
  if (got.size() == 1) {
    second_imports_.push_back(import_buffer(me_, got[0], std::stoull(msg.substr(6))));
    ::close(got[0]);
  }
}

void shared_scenario::teardown() {
  step("teardown", 0);
  for (auto* list : {&second_imports_, &imported_, &exported_, &local_})
    for (buffer& b : *list) free_buffer(b);
  free_buffer(classic_big_);
  free_buffer(classic_small_);
  free_buffer(host_);
  tagmem_nccl_stats s = shim_stats();
  expect(s.held_bytes == 0 && s.allocations == 0,
         "every record is gone after NCCL freed everything (" + std::to_string(s.allocations) +
             " left)");
  step("freed", 0);  // the peer's mappings of our memory are gone too now
  expect(
      emu_live_allocations() == baseline_allocations_ && emu_live_mappings() == baseline_mappings_,
      "no physical allocation or mapping left behind: " + std::to_string(emu_live_allocations()) +
          " allocations, " + std::to_string(emu_live_mappings()) + " mappings against " +
          std::to_string(baseline_allocations_) + " and " + std::to_string(baseline_mappings_) +
          " before the scenario");
}

std::vector<std::string> run_shared_buffers(int rank, control& peer, const std::string& group,
                                            const scenario_options& opt) {
  return shared_scenario(rank, peer, group, opt).run();
}

}  // namespace tagmem::preload_test
