// inconsistent_peer.cpp — a rank of the job that speaks the NCCL pause/resume protocol with
// valid-looking but inconsistent content, chosen at random.
//
// It takes every step of the collective with the real group layer (group_session) and the real
// payloads (collective_messages.hpp), in the order an honest shim takes them, so nothing it sends
// fails to decode; but at each step, with even odds, what it says is not what an honest rank
// holding nothing would say: claims on buffers it learned of or invented (any owner, released
// or kept), decisions on buffers it does not own, requests for handles, letters
// to any rank with matching or handle content and descriptors of its own (a pipe, /dev/null, one
// that rank 0 mailed it), failures it reports with any status and message. It follows the
// outcomes as a member does, so it stays in step with the honest ranks whatever they concluded.
//
// Driven by inconsistent_peer_test.cpp over the control channel (fd 100): "pause SEED" or
// "resume SEED" (SEED 0: honest), answered "done" once its side of the call ended (a group error
// it met is part of the game); "quit" ends it. Started without the shim: it needs no driver.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "collective_messages.hpp"
#include "peers/group.hpp"
#include "peers/messages.hpp"

namespace tagmem::nccl {
namespace {

using namespace tagmem::peers;

// The control channel's frames ("<length>:<text>", as tests/preload/peer.cpp writes them).
std::string receive_command(int fd) {
  std::string length;
  char c = 0;
  while (::read(fd, &c, 1) == 1 && c != ':') length += c;
  if (length.empty()) return "quit";
  std::string text(std::stoul(length), '\0');
  for (std::size_t got = 0; got < text.size();) {
    ssize_t n = ::read(fd, &text[got], text.size() - got);
    if (n <= 0) return "quit";
    got += static_cast<std::size_t>(n);
  }
  return text;
}

void send_reply(int fd, const std::string& text) {
  std::string bytes = std::to_string(text.size()) + ":" + text;
  if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) std::exit(4);
}

class liar {
 public:
  liar(group_spec spec, std::uint64_t seed) : spec_(std::move(spec)), rng_(seed), honest_(!seed) {}
  ~liar() {
    if (kept_ >= 0) ::close(kept_);
  }
  liar(const liar&) = delete;
  liar& operator=(const liar&) = delete;

  void pause() {
    auto s = group_session::join(spec_, group_op::pause, true, TAGMEM_SUCCESS, "");
    if (!outcome(*s, "waiting")) return;
    mail(*s, true, "matching");
    mail(*s, true, "learning owners");
    s->all_gather(encode_claims(claims()), "claiming");
    if (!outcome(*s, "checking claims")) return;
    s->all_gather(encode_decisions(decisions()), "deciding");
    if (!outcome(*s, "copying")) return;
    if (!outcome(*s, "unmapping")) outcome(*s, "mapping back");
  }

  void resume() {
    auto s = group_session::join(spec_, group_op::resume, true, TAGMEM_SUCCESS, "");
    if (!outcome(*s, "rebuilding")) return;
    s->all_gather(encode_needs(needs()), "asking for handles");
    mail(*s, false, "handing out handles");
    outcome(*s, "re-sharing");
  }

 private:
  bool lie() { return !honest_ && rng_() % 2 == 0; }
  std::uint64_t any_of(std::uint64_t n) { return rng_() % n; }

  // Record ids it heard of, and ones nobody has.
  std::uint64_t some_id() {
    static const std::uint64_t odd[] = {0, 1, 2, 0x7fffffff, ~0ull};
    if (!ids_.empty() && rng_() % 3) return ids_[any_of(ids_.size())];
    return odd[any_of(std::size(odd))];
  }
  int some_rank() {
    static const int ranks[] = {0, 0, 1, 2, -1, 1000};
    return ranks[any_of(std::size(ranks))];
  }

  // Whether every rank succeeded at this step, saying failure itself when it lies.
  bool outcome(group_session& s, const char* what) {
    rank_outcome mine;
    if (lie() && rng_() % 3 == 0) {
      static const tagmem_status codes[] = {TAGMEM_ERROR_PEER, TAGMEM_ERROR_DRIVER,
                                            TAGMEM_ERROR_OUT_OF_MEMORY, TAGMEM_ERROR_TIMEOUT,
                                            TAGMEM_ERROR_INTERNAL};
      mine.status = codes[any_of(std::size(codes))];
      mine.message = std::string(any_of(3) == 0 ? 4000 : 20, 'x');
    }
    for (const rank_outcome& o : s.outcomes(mine, what))
      if (o.status != TAGMEM_SUCCESS) return false;
    return true;
  }

  // A mail step: its own letters (their descriptors closed once sent, as mail borrows them), and
  // what it learns from the others'.
  void mail(group_session& s, bool pausing, const char* what) {
    std::vector<letter> outbox = letters(pausing);
    auto close_outbox = [&] {
      for (letter& l : outbox)
        for (int fd : l.fds) ::close(fd);
    };
    try {
      s.mail(outbox, learn(), what);
    } catch (...) {
      close_outbox();
      throw;
    }
    close_outbox();
  }

  letter_handler learn() {
    return [this](int, const std::string& blob, owned_fds& fds) {
      try {
        const match_letter l = decode_match_letter(blob);
        ids_.push_back(l.importer_id);
        if (l.owner_id) ids_.push_back(l.owner_id);
      } catch (const error&) {
        ids_.push_back(decode_handle_letter(blob).id);
      }
      // Keep one descriptor rank 0 sent, to send back to it later.
      if (kept_ < 0 && !fds.empty()) kept_ = fds.take(0);
    };
  }

  int some_fd() {
    switch (any_of(3)) {
      case 0:
        if (kept_ >= 0) return ::dup(kept_);
        [[fallthrough]];
      case 1:
        return ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      default: {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) return -1;
        ::close(p[1]);
        return p[0];
      }
    }
  }

  std::vector<letter> letters(bool pausing) {
    std::vector<letter> out;
    if (!lie()) return out;
    for (int n = 1 + static_cast<int>(any_of(2)); n > 0; --n) {
      letter l;
      l.to = rng_() % 4 ? 0 : some_rank();
      l.blob = pausing == (rng_() % 4 != 0)
                   ? encode_match_letter({some_id(), rng_() % 2 ? some_id() : 0})
                   : encode_handle_letter({some_id(), rng_() % 2 == 0});
      for (int k = static_cast<int>(any_of(3)); k > 0; --k)
        if (int fd = some_fd(); fd >= 0) l.fds.push_back(fd);
      out.push_back(std::move(l));
    }
    return out;
  }

  std::vector<claim> claims() {
    std::vector<claim> out;
    if (!lie()) return out;
    for (int n = 1 + static_cast<int>(any_of(3)); n > 0; --n) {
      claim c;
      c.owner = some_rank();
      c.id = some_id();
      c.can_release = rng_() % 2;
      out.push_back(std::move(c));
    }
    return out;
  }

  std::vector<decision> decisions() {
    std::vector<decision> out;
    if (!lie()) return out;
    for (int n = 1 + static_cast<int>(any_of(3)); n > 0; --n)
      out.push_back({some_id(), rng_() % 2 == 0});
    return out;
  }

  std::vector<need> needs() {
    std::vector<need> out;
    if (!lie()) return out;
    for (int n = 1 + static_cast<int>(any_of(3)); n > 0; --n)
      out.push_back({some_rank(), some_id()});
    return out;
  }

  group_spec spec_;
  std::mt19937_64 rng_;
  bool honest_;
  std::vector<std::uint64_t> ids_;
  int kept_ = -1;
};

}  // namespace
}  // namespace tagmem::nccl

int main(int argc, char** argv) {
  using namespace tagmem::nccl;
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s GROUP RANK SIZE TIMEOUT_MS (control channel on fd 100)\n",
                 argv[0]);
    return 2;
  }
  tagmem::peers::group_spec spec;
  try {
    spec = tagmem::peers::resolve_spec(argv[1], std::atoi(argv[2]), std::atoi(argv[3]),
                                       std::atoi(argv[4]));
  } catch (const tagmem::error& e) {
    std::fprintf(stderr, "[inconsistent peer] %s\n", e.what());
    return 2;
  }
  for (;;) {
    std::istringstream command(receive_command(100));
    std::string op;
    std::uint64_t seed = 0;
    command >> op >> seed;
    if (op != "pause" && op != "resume") return op == "quit" ? 0 : 2;
    std::string result = "done";
    try {
      liar l(spec, seed);
      if (op == "pause") {
        l.pause();
      } else {
        l.resume();
      }
    } catch (const tagmem::error& e) {
      result = std::string("done: ") + e.what();  // the group refused it: part of the game
    }
    send_reply(100, result);
  }
}
