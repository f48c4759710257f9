// state_machine.hpp — runs a random program of tagmem calls against a reference model.
//
// One program (one fuzzer input) starts a fresh tagmem on the emulated driver with two small
// devices, runs up to max_steps operations and checks after every one of them that tagmem and the
// model agree: the status is the one the model expects (any of the errors that apply, for an
// invalid call), a rejected call changed nothing, every live allocation of a resident tag still
// holds its bytes at its address, and every statistic tagmem reports matches the model and the
// emulator's own counters. Finally it shuts tagmem down and checks that nothing is left in the
// emulator. The model lives in model.hpp; this file decodes and runs operations.
//
// Input format (program_reader.hpp: bytes past the end read as 0):
//   header  config byte: bit 0 chunk 2|4 MiB; bits 1-2 arena default|8|32|64 MiB;
//           bit 3 copy piece 64|1 MiB; bits 4-5 max mapping 1 GiB|2|4|8 MiB;
//           bits 6-7 the release clock's page: none|fresh|a hostile value|truncated
//           two bytes: device 0 and 1 sizes, 24 + (b % 5) * 8 MiB
//   ops     one opcode byte (b % op_count), then its operands:
//     push       name                     pop
//     alloc      flags(bit0 tagged, bits1-2 stream) name device size_class u16
//     free       kind index stream        (kind: live, interior, stale, null, host pointer;
//                                          (kind / 6) % 4: 2 or 3 calls it at a thread's exit)
//     offload    list device mode         reload   list device
//     swap       list list device mode    empty_cache  device
//     rewrite    index u24                (new random bytes into a live allocation)
//     fault      entry nth error          (armed for the next operation only)
//     host       kind u16                 (reserve or trim the pinned store)
//     misuse     kind                     (NULL lists, NULL out-pointers, bad pointers)
//   name: b % 10 → t0 t1 t2 kv ghost "" "has space" <64 chars> NULL t0
//   device: b % 8 → 0 0 0 1 1 1 TAGMEM_CURRENT_DEVICE invalid;  list: count (b % 4), names
//   mode: b % 5 → BACKUP BACKUP DISCARD DISCARD invalid
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tagmem::fuzz {

struct program_result {
  bool ok = true;
  std::string failure;  // the first broken expectation, with the operations that led to it
};

// Totals over every program run in this process (the figures in docs/reliability.md).
struct totals {
  std::uint64_t programs = 0;
  std::uint64_t operations = 0;
  std::uint64_t rejected_as_expected = 0;  // invalid calls that failed with an expected error
  std::uint64_t faults_fired = 0;          // injected driver failures that hit a call
  std::uint64_t bytes_verified = 0;        // bytes compared against the model
  // Frees made at a thread's exit: as its first call, and after it used tagmem.
  std::uint64_t frees_at_thread_exit[2] = {0, 0};
  std::uint64_t clock_page_states[4] = {0, 0, 0, 0};  // programs run with each (header bits 6-7)
};

// Process-wide set-up: environment defaults, the emulator, contexts and streams. Returns false
// with a reason when the emulated driver is not what TAGMEM_LIBCUDA names.
bool prepare(std::string* why);

// Runs one program; prepare() must have succeeded.
program_result run_program(const std::uint8_t* data, std::size_t size);

const totals& process_totals();

}  // namespace tagmem::fuzz
