// order_test.cpp — an offload whose memory goes to the job's processes copies its pieces out in
// address order, on one device-to-host stream, so that its mappings are handed over one after
// another from the start (Note [unmap as copied] in allocator/offload/offload_engine.cpp); without
// handoff its pieces go round-robin over every D2H stream, as before. Read from the process's
// trace (TAGMEM_TRACE), whose copy spans name their stream; on the emulated driver and a GPU
// (TAGMEM_COPY_STREAMS at its default, 2).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "harness.hpp"
#include "test_support.hpp"
#include "trace_events.hpp"

namespace tagmem::handoff_test {
namespace {

using test::d2h_tracks;
using test::scoped_env;

// Offloads (BACKUP) a tag of `count` mappings cut into 4 MiB pieces with TAGMEM_HANDOFF as given,
// reloads it and checks every byte; returns the D2H streams its offload's pieces ran on, with
// how many each.
std::map<std::string, std::size_t> offload_streams(const char* handoff, int count,
                                                   std::mt19937_64& rng) {
  const std::string path = ::testing::TempDir() + "tagmem_order_" + std::to_string(rng()) + ".json";
  scoped_env trace("TAGMEM_TRACE", path.c_str());
  scoped_env mode("TAGMEM_HANDOFF", handoff);
  scoped_env pieces("TAGMEM_COPY_PIECE_BYTES", "4MiB");
  check(tagmem_init(nullptr), "tagmem_init");
  tag_data d = fill_tag("ordered", count, kPiece, rng);
  const char* tags[] = {"ordered"};
  check(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), "tagmem_offload");
  check(tagmem_wait_released(0), "tagmem_wait_released");
  check(tagmem_trace_flush(), "tagmem_trace_flush");
  const auto streams = d2h_tracks(path, "ordered");
  std::size_t copies = 0;
  for (const auto& [track, pieces] : streams) copies += pieces;
  EXPECT_GE(copies, (count * kPiece) / (4 * MiB)) << path;  // more where host slabs end
  check(tagmem_reload(tags, 1, 0), "tagmem_reload");
  EXPECT_EQ(corrupted(d), 0u);
  for (void* p : d.ptrs) check(tagmem_free(p, nullptr), "tagmem_free");
  check(tagmem_shutdown(), "tagmem_shutdown");
  std::remove(path.c_str());
  return streams;
}

TEST(HandoffOrder, AnOffloadThatHandsOverCopiesOutInOrderOnOneStream) {
  std::mt19937_64 rng(std::random_device{}());
  const int count = 3 + static_cast<int>(rng() % 3);
  EXPECT_EQ(offload_streams("on", count, rng).size(), 1u) << "handoff: one D2H stream";
  // The same offload without handoff: round-robin over the device's two D2H streams.
  EXPECT_EQ(offload_streams("off", count, rng).size(), 2u) << "no handoff: both streams";
}

}  // namespace
}  // namespace tagmem::handoff_test
