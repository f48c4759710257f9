// ipc_harness.hpp — what the IPC tests share: handles as text, random bytes from a seed, device
// reads and writes through the driver, and the IPC figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tagmem/tagmem.h"

namespace tagmem::ipc_test {

std::string to_text(const tagmem_ipc_handle& h);  // hex
tagmem_ipc_handle from_text(const std::string& s);

// `size` bytes drawn from `seed`: both processes make the same bytes from the same seed.
std::vector<unsigned char> random_bytes(std::uint64_t seed, std::size_t size);

// Device 0's primary context made current, then a copy.
void write_device(const void* ptr, const std::vector<unsigned char>& bytes);
std::vector<unsigned char> read_device(const void* ptr, std::size_t size);

tagmem_ipc_stats ipc_stats();
// Waits (bounded: 10 s) until this process's exports have `n` live importers; false if never.
bool importers_become(std::uint64_t n);

// "STATUS message" of the last call, for a peer's report.
std::string status_text(tagmem_status s);

}  // namespace tagmem::ipc_test
