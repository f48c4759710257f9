// scenarios.cpp — the IPC tests' peer processes (see header).
#include "scenarios.hpp"

#include <sstream>
#include <vector>

#include "harness.hpp"
#include "ipc_harness.hpp"
#include "peer.hpp"

namespace tagmem::ipc_test {
namespace {

using handoff_test::check;

struct opened {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

TAGMEM_PEER_SCENARIO(ipc_importer) {
  const handoff_test::fd_census before = handoff_test::take_fd_census();
  std::vector<opened> open;
  for (;;) {
    std::istringstream in(args.channel.receive());
    std::string cmd;
    in >> cmd;
    if (cmd == "exit") return 0;
    if (cmd == "open") {
      std::string text;
      in >> text;
      const tagmem_ipc_handle h = from_text(text);
      opened o;
      int device = -1;
      const tagmem_status s = tagmem_ipc_open(&h, &o.ptr, &o.bytes, &device);
      if (s != TAGMEM_SUCCESS) {
        args.channel.send("error " + status_text(s));
        continue;
      }
      open.push_back(o);
      args.channel.send("opened " + std::to_string(open.size() - 1) + " " +
                        std::to_string(o.bytes));
    } else if (cmd == "check" || cmd == "write") {
      std::size_t i = 0;
      std::uint64_t seed = 0;
      in >> i >> seed;
      const opened& o = open.at(i);
      if (cmd == "write") {
        write_device(o.ptr, random_bytes(seed, o.bytes));
        args.channel.send("written");
      } else {
        args.channel.send(read_device(o.ptr, o.bytes) == random_bytes(seed, o.bytes) ? "same"
                                                                                     : "differs");
      }
    } else if (cmd == "close") {
      std::size_t i = 0;
      in >> i;
      const tagmem_status s = tagmem_ipc_close(open.at(i).ptr);
      args.channel.send(s == TAGMEM_SUCCESS ? "closed" : "error " + status_text(s));
    } else if (cmd == "cycle") {
      std::string text;
      int n = 0;
      in >> text >> n;
      const tagmem_ipc_handle h = from_text(text);
      std::string answer = "cycled";
      for (int k = 0; k < n; ++k) {
        opened o;
        tagmem_status s = tagmem_ipc_open(&h, &o.ptr, &o.bytes, nullptr);
        if (s == TAGMEM_SUCCESS) s = tagmem_ipc_close(o.ptr);
        if (s != TAGMEM_SUCCESS) {
          answer = "error " + status_text(s);
          break;
        }
      }
      args.channel.send(answer);
    } else if (cmd == "census") {
      const handoff_test::fd_census now = handoff_test::take_fd_census();
      const std::string leaks = handoff_test::emu_leaks();
      args.channel.send(now == before && leaks.empty() && ipc_stats().open_here == 0
                            ? "clean"
                            : "fds " + handoff_test::describe(now) + " / " +
                                  handoff_test::describe(before) + " leaks '" + leaks + "'");
    } else {
      return 20;
    }
  }
}

TAGMEM_PEER_SCENARIO(ipc_exporter) {
  const std::uint64_t seed = std::stoull(args.channel.receive());
  void* p = nullptr;
  check(tagmem_malloc_tagged(&p, kExporterBytes, "x", 0, nullptr), "tagmem_malloc_tagged");
  write_device(p, random_bytes(seed, kExporterBytes));
  tagmem_ipc_handle h{};
  check(tagmem_ipc_export(p, kExporterBytes, &h), "tagmem_ipc_export");
  args.channel.send(to_text(h));
  for (;;) {
    std::istringstream in(args.channel.receive());
    std::string cmd;
    std::uint64_t now = 0;
    in >> cmd >> now;
    if (cmd == "exit") return 0;
    if (cmd != "check") return 20;
    args.channel.send(
        read_device(p, kExporterBytes) == random_bytes(now, kExporterBytes) ? "same" : "differs");
  }
}

}  // namespace
}  // namespace tagmem::ipc_test
