// program_reader.hpp — reads a fuzzer input as a stream of small numbers.
//
// The state-machine fuzzer decodes its input front to back: one opcode byte, then that
// operation's operand bytes. Reading past the end yields zeros, so every byte string is a valid
// program and libFuzzer's mutations (insert, erase, splice) keep producing meaningful ones. The
// format is documented in state_machine.hpp; tests/fuzz/make_seeds.py writes it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tagmem::fuzz {

class program_reader {
 public:
  program_reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  bool done() const noexcept { return pos_ >= size_; }
  std::uint8_t byte() noexcept { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t u16() noexcept {
    std::uint16_t lo = byte();
    return static_cast<std::uint16_t>(lo | (byte() << 8));
  }
  std::uint32_t u24() noexcept {
    std::uint32_t lo = u16();
    return lo | (static_cast<std::uint32_t>(byte()) << 16);
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

}  // namespace tagmem::fuzz
