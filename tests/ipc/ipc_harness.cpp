// ipc_harness.cpp — handles as text, random bytes, device copies (see header).
#include "ipc_harness.hpp"

#include <chrono>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <thread>

#include "driver/driver.hpp"
#include "harness.hpp"

namespace tagmem::ipc_test {

std::string to_text(const tagmem_ipc_handle& h) {
  std::string s;
  for (unsigned char b : h.bytes) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", b);
    s += hex;
  }
  return s;
}

tagmem_ipc_handle from_text(const std::string& s) {
  tagmem_ipc_handle h{};
  if (s.size() != 2 * sizeof h.bytes) throw std::runtime_error("not a handle: " + s);
  for (std::size_t i = 0; i < sizeof h.bytes; ++i) {
    h.bytes[i] = static_cast<unsigned char>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  }
  return h;
}

std::vector<unsigned char> random_bytes(std::uint64_t seed, std::size_t size) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> out(size);
  for (std::size_t i = 0; i < size; i += 8) {
    const std::uint64_t x = rng();
    for (std::size_t j = 0; j < 8 && i + j < size; ++j) out[i + j] = (x >> (8 * j)) & 0xff;
  }
  return out;
}

void write_device(const void* ptr, const std::vector<unsigned char>& bytes) {
  handoff_test::primary_context();
  driver::check(
      driver::api().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(ptr), bytes.data(), bytes.size()),
      "cuMemcpyHtoD");
}

std::vector<unsigned char> read_device(const void* ptr, std::size_t size) {
  handoff_test::primary_context();
  std::vector<unsigned char> out(size);
  driver::check(driver::api().cuMemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(ptr), size),
                "cuMemcpyDtoH");
  return out;
}

bool importers_become(std::uint64_t n) {
  for (int i = 0; i < 1000; ++i) {
    if (ipc_stats().importers == n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

tagmem_ipc_stats ipc_stats() {
  tagmem_ipc_stats s{};
  handoff_test::check(tagmem_ipc_stats_get(&s), "tagmem_ipc_stats_get");
  return s;
}

std::string status_text(tagmem_status s) {
  return std::string(tagmem_status_string(s)) + " " + (s ? tagmem_last_error() : "");
}

}  // namespace tagmem::ipc_test
