// harness.hpp — what the handoff tests share: two or three processes of one job on one emulated
// GPU, their data and their leak checks.
//
// The test process starts this same binary again as a peer (tests/preload/peer.hpp: --peer=
// <scenario>, a control channel on fd 100 that can carry descriptors); both inherit the
// environment: the emulated driver, TAGMEM_HANDOFF=on, one TAGMEM_JOB and one private
// TAGMEM_PEER_DIR per test run (main.cpp), so that concurrent runs never meet.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "eventually.hpp"
#include "peer.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::handoff_test {

using preload_test::peer_args;
using preload_test::peer_process;

inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t kPiece = 30 * MiB;  // a tag's allocation: one mapping each

// Descriptors of this process that would show a leak: emulated device memory (memfds), sockets,
// and replicated tags' shared host copies (descriptors and mappings).
struct fd_census {
  int device_memory = 0;
  int sockets = 0;
  int shared_copies = 0;
  bool operator==(const fd_census&) const = default;
};
fd_census take_fd_census();
std::string describe(const fd_census& c);

// A new directory, mode 0700, under $TMPDIR or /tmp; removed, with what it holds, when this
// process exits.
std::string make_private_dir(const char* what);

// Allocations of one tag with the random bytes written to them.
struct tag_data {
  std::string tag;
  std::vector<void*> ptrs;
  std::vector<std::vector<unsigned char>> bytes;
};
// Makes device 0's primary context current on this thread (tagmem, or an import, retains it).
void primary_context();
// `count` allocations of `size` bytes in `tag` on device 0, each filled with random bytes.
// Throws std::runtime_error with tagmem's message on failure.
tag_data fill_tag(const std::string& tag, int count, std::size_t size, std::mt19937_64& rng);
// New random bytes from `seed` in every allocation of `d` (the same from the same seed).
void refill(tag_data& d, std::uint64_t seed);
// How many allocations no longer hold their bytes.
std::size_t corrupted(const tag_data& d);
// fill_tag, then the tag offloaded (BACKUP) and its offload over (tagmem_wait_released). Throws
// std::runtime_error with tagmem's message on failure.
tag_data offloaded_backup(const std::string& tag, int count, std::size_t size,
                          std::mt19937_64& rng);

// Runs meet_test.cpp's `discard_giver` with `seed`: it offloads its 60 MiB DISCARD tag, all of it
// handed over, and leaves nothing behind; returns once it exited (failures are the test's).
void discard_giver_hands_over(std::uint64_t seed);

// tagmem_init with the environment variable `name` set to `value` for that call only (then as it
// was before).
tagmem_status init_with(const char* name, const char* value);

// Throws std::runtime_error naming `what` and tagmem's message unless `s` is TAGMEM_SUCCESS.
void check(tagmem_status s, const std::string& what);

tagmem_handoff_stats handoff_stats(int device = 0);
// Calls of `entry` in this process so far (0 on the real driver, where only the handoff
// statistics tell what a reload created).
std::uint64_t emu_calls(const char* entry);
// Live allocations + mappings + reservations of the emulator in this process ("" when none, and
// on the real driver).
std::string emu_leaks();

// Whether some process holds a copy mark (hoff-*.copy, allocator/handoff/copy_gate.hpp) in `dir`:
// a reload with every run mapped and only copies left. Probes the marks as a peer would, without
// tagmem's copy_gate.
bool copy_mark_held(const std::string& dir);

// A reload of `tag` on device 0 on a thread of its own (one that waits for memory given back).
class reload_thread {
 public:
  explicit reload_thread(std::string tag);
  ~reload_thread();
  reload_thread(const reload_thread&) = delete;
  reload_thread& operator=(const reload_thread&) = delete;
  // Waits for the reload: "" when it succeeded, else its status and tagmem's message.
  std::string finish();

 private:
  std::string tag_, outcome_;
  std::thread thread_;
};

// A test of this process on the emulated GPU it shares with its peers: a random seed, and at the
// end tagmem shut down, the device's size restored (tests shrink it to fill it), nothing of it
// used, and no emulator object or descriptor left behind.
class shared_device_test : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // Makes the shared device exactly as large as what its processes use now.
  void fill_device();
  std::uint64_t seed_ = 0;
  std::uint64_t total_ = 0;
  fd_census before_;
};

// The same, with TAGMEM_OFFLOAD_RETURN=queued for this process and the peers it starts (Note
// [early return]); the emulator's copy speed and faults back to normal at the end.
class early_return_test : public shared_device_test {
 protected:
  void SetUp() override;
  void TearDown() override;
};

using test::eventually;

}  // namespace tagmem::handoff_test
