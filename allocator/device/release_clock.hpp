// release_clock.hpp — whether device memory went back to the driver moments ago.
//
// Note [release aftermath]: after cuMemRelease of much memory, the driver's work on what it got
// back occupies the copy engines: for a while (150–250 ms after 60 GiB on an H200) host to device
// copies by the copy engines run far below the link's rate, while a kernel reading pinned host
// memory is not slowed (docs/performance.md, "After a release"). Every cuMemRelease tagmem makes
// adds to this clock a time proportional to its bytes (time_per_gib), from the later of now and
// the end of the time already owed; while more than `least` is owed the process is "after a
// release", and copy_queue lets the copy kernel take host-to-device pieces (Note [copy kernel]).
// The figures behind the constants are the RL cycle's (docs/performance.md): a reload right after
// 60 GiB went back gains from the kernel over its whole length, one right after a 16 GiB offload
// does not gain at all. The clock is shared by the user's processes on the real driver (a page in
// /dev/shm, Note [clock page]; this process's own where that is refused, or with an emulated
// driver), since
// colocated RL runs the trainer and the engine as separate processes on one GPU; and it is one
// for all devices: a release on one device also counts for another, which at worst sends a copy
// to the kernel that the copy engines would have done as fast.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tagmem::release_clock {

// How long, per GiB released, copies count as "after a release" (see docs/performance.md).
inline constexpr std::chrono::milliseconds time_per_gib{16};
// The most that is ever owed, however much is released at once.
inline constexpr std::chrono::milliseconds longest{2000};
// Copies count as after a release only while more than this is owed (24 GiB's worth).
inline constexpr std::chrono::milliseconds least = time_per_gib * 24;

// cuMemRelease of `handle`, `bytes` long; when it succeeds the bytes are noted. The releases of
// a tag's memory (inline, by the release thread, by the recycler) go through here.
CUresult release(CUmemGenericAllocationHandle handle, std::size_t bytes) noexcept;
// Counts `bytes` that cuMemRelease has just given back to the driver.
void note(std::size_t bytes) noexcept;
// The time still owed for releases (0 when none is).
std::chrono::nanoseconds owed() noexcept;
// Whether more than `least` is owed.
bool after_release() noexcept;
// Bytes this process has counted with note() (for tests: they need no clock).
std::uint64_t bytes_noted() noexcept;
// Forgets every release, this user's other processes' too (for tests).
void reset() noexcept;
// Shares the clock through the page at `path` from now on, or keeps it in this process where
// `path` is empty or refused (false then). The real driver's processes share /dev/shm's page
// without asking; tests point it elsewhere.
bool share_through(const std::string& path) noexcept;

}  // namespace tagmem::release_clock
