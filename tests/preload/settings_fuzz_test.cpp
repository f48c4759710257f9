// settings_fuzz_test.cpp — the settings a process under the shim starts with, chosen at random.
//
// The shim reads its settings while the process loads, before main, and tagmem and the NCCL
// integration read theirs on first use: a value they refuse must leave the process running, with
// each call that needs the setting failing with an error code and a message, never an abort. Each
// round starts this binary again (settings_probe, under the shim and the emulator) with a few
// TAGMEM_* variables of options/options.def and TMS_INIT_ENABLE set to values drawn from a list
// of good, bad and odd ones. The probe makes the calls of a process under the shim — the runtime's
// cudaMalloc outside and inside a tag scope, tagmem_init, an NCCL-style buffer through the wrapped
// driver — and checks that each either works (its bytes read back exactly) or fails with a
// message. The round fails when the probe dies (a signal, a sanitizer's report) or reports a
// problem. TAGMEM_SETTINGS_FUZZ_SEED (else a fresh seed) and TAGMEM_SETTINGS_FUZZ_ROUNDS (default
// 12) repeat or lengthen a run; tests/sanitizers.sh runs more rounds.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "nccl_way.hpp"
#include "peer.hpp"
#include "tagmem/tagmem.h"

extern "C" {
int cudaMalloc(void** ptr, size_t size);
int cudaFree(void* ptr);
}

namespace tagmem::preload_test {
namespace {

// The variables a round may set: every setting of the process but the driver's path, which the
// probe needs as the test sets it. The emulator's own settings (group `emulator`) are left out:
// they describe the machine the probe runs on, not the process, and some make it one where no
// program can run (TAGMEM_EMU_CONTEXT_BYTES=1TiB: a context larger than the device, whose
// creation fails whatever the process's settings).
const std::vector<std::string>& variables() {
  static const std::vector<std::string> names = [] {
    struct setting {
      const char* name;
      const char* group;
    };
    const setting all[] = {
#define TAGMEM_OPTION(id, group, ...) {"TAGMEM_" #id, #group},
#include "options/options.def"
#undef TAGMEM_OPTION
    };
    std::vector<std::string> out = {"TMS_INIT_ENABLE"};
    for (const setting& s : all) {
      if (std::string(s.group) != "emulator" && std::string(s.name) != "TAGMEM_LIBCUDA")
        out.push_back(s.name);
    }
    return out;
  }();
  return names;
}

const char* const kValues[] = {
    "0",
    "1",
    "true",
    "TRUE",
    "off",
    "maybe",
    "-1",
    "2",
    "4096",
    "1MiB",
    "2MiB",
    "3MiB",
    "64KiB",
    "1GiB",
    "1TiB",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "0x10",
    "1e3",
    " 1",
    "1 ",
    "1MiB ",
    "mib",
    "vmm",
    "passthrough",
    "system",
    "mimalloc",
    "info",
    "debug",
    "*",
    "libnccl",
    ",",
    ",,*,,",
    "default",
    "nccl",
    "/",
    "/nonexistent/dir",
    "/dev/null",
    "..",
    "a/b",
    "x\ny",
    "\xff\xfe",
    "%s%n%s",
    "a-tag-name-that-is-longer-than-the-sixty-three-bytes-a-tag-may-have-in-tagmem"};

template <class F>
F shim_fn(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

// ---- the probe (a process started with the settings) ------------------------------------------

TAGMEM_PEER_SCENARIO(settings_probe) {
  std::string report;
  auto problem = [&](const std::string& what) { report += what + "; "; };
  auto last_error = shim_fn<const char* (*)()>("tagmem_last_error");
  auto failed_with_message = [&](const char* call, tagmem_status s) {
    if (s != TAGMEM_SUCCESS && !*last_error())
      problem(std::string(call) + " failed (" + std::to_string(s) + ") without a message");
  };
  auto expect_bytes = [&](void* p, std::size_t size, const char* what) {
    buffer b;
    b.va = reinterpret_cast<CUdeviceptr>(p);
    b.size = size;
    const std::vector<unsigned char> bytes = pattern(size, size);
    write_bytes(b, 0, bytes);
    if (read_bytes(b, 0, size) != bytes) problem(std::string(what) + " lost bytes");
  };
  try {
    use_device(0);
    const std::size_t size = (1u << 20) + 3;
    void* p = nullptr;
    if (cudaMalloc(&p, size) == 0) {  // the runtime's, or the default tag's
      expect_bytes(p, size, "cudaMalloc outside a scope");
      if (int r = cudaFree(p); r != 0) problem("cudaFree outside a scope: " + std::to_string(r));
    }
    failed_with_message("tagmem_init", shim_fn<decltype(&::tagmem_init)>("tagmem_init")(nullptr));
    auto push = shim_fn<decltype(&::tagmem_push_tag)>("tagmem_push_tag");
    auto pop = shim_fn<decltype(&::tagmem_pop_tag)>("tagmem_pop_tag");
    tagmem_status s = push("probe");
    failed_with_message("tagmem_push_tag", s);
    if (s == TAGMEM_SUCCESS) {
      p = nullptr;
      if (cudaMalloc(&p, size) == 0) {
        expect_bytes(p, size, "cudaMalloc in a scope");
        if (int r = cudaFree(p); r != 0) problem("cudaFree in a scope: " + std::to_string(r));
      }
      failed_with_message("tagmem_pop_tag", pop());
    }
    try {
      buffer b = create_buffer(0, 2u << 20, true);
      const std::vector<unsigned char> bytes = pattern(7, b.size);
      write_bytes(b, 0, bytes);
      if (read_bytes(b, 0, b.size) != bytes) problem("an NCCL-style buffer lost bytes");
      free_buffer(b);
    } catch (const std::runtime_error&) {
      // A driver call refused (a setting the NCCL integration refuses): an error code, no abort.
    }
  } catch (const std::exception& e) {
    problem(std::string("the probe's own calls failed: ") + e.what());
  }
  args.channel.send(report.empty() ? "ok" : report);
  return 0;
}

// ---- the rounds --------------------------------------------------------------------------------

std::uint64_t env_number(const char* name, std::uint64_t otherwise) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : otherwise;
}

// Starts the probe with `settings`; "" when it ran to the end and found nothing.
std::string probe(const std::vector<std::string>& settings) {
  peer_process p("settings_probe", unique_group("settings"), settings);
  std::string reply;
  try {
    reply = p.channel().receive(nullptr, 120000);
  } catch (const std::exception& e) {
    reply = e.what();
  }
  const int status = p.wait(120000);
  if (status != 0) return "the probe ended with status " + std::to_string(status) + ": " + reply;
  return reply == "ok" ? "" : reply;
}

std::string shown(const std::vector<std::string>& settings) {
  std::string out;
  for (const std::string& s : settings) out += " '" + s + "'";
  return out;
}

// The rounds run in a scratch directory, removed at the end: a relative path drawn for a setting
// (TAGMEM_TRACE=1MiB, ...) makes its file there, not in the directory the suite runs in.
class scratch_cwd {
 public:
  scratch_cwd() {
    char tmpl[] = "/tmp/tagmem-settings-fuzz-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    old_ = std::filesystem::current_path();
    std::filesystem::current_path(dir_);
  }
  ~scratch_cwd() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::current_path(old_, ec);
    std::filesystem::remove_all(dir_, ec);
  }
  scratch_cwd(const scratch_cwd&) = delete;
  scratch_cwd& operator=(const scratch_cwd&) = delete;

 private:
  std::filesystem::path dir_, old_;
};

// A round that drew TAGMEM_EMU_CONTEXT_BYTES=1TiB failed in the probe's own first driver call
// (TAGMEM_SETTINGS_FUZZ_SEED=2084361857 did, round 5, when the emulator's settings were drawn).
TEST(SettingsFuzz, DrawsTheProcessSettingsAndNoneOfTheEmulatedMachine) {
  for (const std::string& name : variables()) {
    EXPECT_NE(name.rfind("TAGMEM_EMU_", 0), 0u) << name;
    EXPECT_NE(name, "TAGMEM_LIBCUDA");
  }
  for (const char* name : {"TAGMEM_HOST_MAX_BYTES", "TAGMEM_NCCL_DIR", "TAGMEM_PRELOAD_TAG",
                           "TAGMEM_METADATA", "TMS_INIT_ENABLE"}) {
    EXPECT_NE(std::find(variables().begin(), variables().end(), name), variables().end()) << name;
  }
}

TEST(SettingsFuzz, RandomSettingsAtStartNeverStopTheProcess) {
  const scratch_cwd scratch;
  const std::uint64_t seed = env_number("TAGMEM_SETTINGS_FUZZ_SEED", std::random_device()());
  const std::uint64_t rounds = env_number("TAGMEM_SETTINGS_FUZZ_ROUNDS", 12);
  std::mt19937_64 rng(seed);
  for (std::uint64_t round = 0; round < rounds; ++round) {
    std::vector<std::string> settings;
    for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n) {
      const std::string& name = variables()[rng() % variables().size()];
      settings.push_back(name + "=" + kValues[rng() % std::size(kValues)]);
    }
    const std::string found = probe(settings);
    EXPECT_EQ(found, "") << "TAGMEM_SETTINGS_FUZZ_SEED=" << seed << ", round " << round
                         << ", settings" << shown(settings);
    if (!found.empty()) break;
  }
}

}  // namespace
}  // namespace tagmem::preload_test
