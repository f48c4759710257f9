// claim_forger.cpp — a process of the job that forges claims on rank 0's buffers.
//
// It joins NCCL pauses and resumes as the last rank and takes every step of the collective with
// the real group layer (group_session) and the real payloads (messages.hpp), but with content an
// honest shim never sends: it claims, or asks a new handle for, a buffer of rank 0 that rank 0
// exported to another process. It learns the buffer's record id the way any member can, from the
// claims the importer makes at a pause, which every rank receives. Modes:
//   claim: takes a pause and a resume honestly, then at the claims step of a second pause claims
//          the buffer as if it held it;
//   need:  takes a pause honestly, then at the needs step of the resume asks for the buffer,
//          then takes one more resume honestly (the one that finishes the job).
// It exits 0 when rank 0 refused the forgery — PEER, naming this process and rank 0's — and it
// received no descriptor of the buffer; otherwise 1, saying what happened on stderr. Should the
// forgery be accepted, it still takes the remaining steps (and, after a pause, a resume) the way
// a member would, so that the honest ranks finish and the test sees what the forgery got.
//
// Started by forged_claim_test.cpp without the shim: it needs neither a driver nor records.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "collective_messages.hpp"
#include "peers/group.hpp"
#include "peers/messages.hpp"

namespace tagmem::nccl {
namespace {

using namespace tagmem::peers;

struct forger {
  group_spec spec;
  std::uint64_t target = 0;  // rank 0's exported buffer, learned while matching
  bool knows_target = false;
  std::vector<std::string> problems;

  std::unique_ptr<group_session> join(group_op op) {
    return group_session::join(spec, op, true, TAGMEM_SUCCESS, "");
  }

  // The outcome step, as a member that succeeded; returns rank 0's outcome.
  static rank_outcome outcome(group_session& s, const char* what) {
    return s.outcomes({}, what)[0];
  }

  // Whether rank 0 refused, naming both processes.
  void expect_refused(const rank_outcome& o, const std::string& step) {
    std::string me = "pid " + std::to_string(::getpid());
    std::string owner = "pid " + std::to_string(::getppid());
    bool ok = o.status == TAGMEM_ERROR_PEER &&
              o.message.find("claims buffer " + std::to_string(target)) != std::string::npos &&
              o.message.find(me) != std::string::npos && o.message.find(owner) != std::string::npos;
    if (!ok)
      problems.push_back(step + ": rank 0 did not refuse the forgery (status " +
                         std::to_string(o.status) + ": '" + o.message + "')");
  }

  // Pause, up to the verdict on the claims; `forge` claims the target. Matching: it has nothing
  // to match, keeps no descriptor it is sent, and must get none from rank 0.
  rank_outcome pause_until_verdict(group_session& s, bool forge) {
    outcome(s, "waiting for the devices to be idle");
    // The owner hands a duplicate of its export only to a process it found holding it.
    auto nothing_from_the_owner = [&](int from, const std::string&, owned_fds& fds) {
      if (from == 0 && !fds.empty())
        problems.push_back("rank 0 mailed a descriptor to a process it never exported to");
    };
    s.mail({}, nothing_from_the_owner, "matching");
    s.mail({}, nothing_from_the_owner, "learning owners");
    std::vector<claim> claims;
    if (forge) claims.push_back({0, target, true});
    std::vector<std::string> all = s.all_gather(encode_claims(claims), "claiming");
    for (int r = 1; r + 1 < s.size() && !knows_target; ++r) {
      for (const claim& c : decode_claims(all[r])) {
        if (c.owner != 0) continue;
        target = c.id;
        knows_target = true;
      }
    }
    if (!knows_target) fail(TAGMEM_ERROR_INTERNAL, "no rank claimed a buffer of rank 0");
    return outcome(s, "checking who maps what");
  }

  void finish_pause(group_session& s) {
    s.all_gather(encode_decisions({}), "deciding");
    outcome(s, "copying");
    outcome(s, "unmapping");
  }

  // A resume; with `forge`, asks rank 0 for a new handle of the target. Returns rank 0's outcome
  // of the re-sharing step; a descriptor of the target that arrives is a problem.
  rank_outcome resume(bool forge) {
    auto s = join(group_op::resume);
    outcome(*s, "rebuilding");
    std::vector<need> needs;
    if (forge) needs.push_back({0, target});
    s->all_gather(encode_needs(needs), "asking for handles");
    s->mail(
        {},
        [&](int from, const std::string& blob, owned_fds& fds) {
          handle_letter l = decode_handle_letter(blob);
          if (from == 0 && l.id == target && !fds.empty())
            problems.push_back("rank 0 sent a descriptor of buffer " + std::to_string(target));
        },
        "handing out handles");
    return outcome(*s, "re-sharing");
  }

  void claim_mode() {
    {
      auto s = join(group_op::pause);
      rank_outcome verdict = pause_until_verdict(*s, false);
      if (verdict.status != TAGMEM_SUCCESS)
        fail(verdict.status, "the honest pause failed: " + verdict.message);
      finish_pause(*s);
    }
    rank_outcome resumed = resume(false);
    if (resumed.status != TAGMEM_SUCCESS)
      fail(resumed.status, "the honest resume failed: " + resumed.message);
    auto s = join(group_op::pause);
    rank_outcome verdict = pause_until_verdict(*s, true);
    expect_refused(verdict, "claiming at a pause");
    if (verdict.status != TAGMEM_SUCCESS) return;
    finish_pause(*s);  // accepted: be the member it now passes for
    s.reset();
    resume(false);
  }

  void need_mode() {
    {
      auto s = join(group_op::pause);
      rank_outcome verdict = pause_until_verdict(*s, false);
      if (verdict.status != TAGMEM_SUCCESS)
        fail(verdict.status, "the honest pause failed: " + verdict.message);
      finish_pause(*s);
    }
    expect_refused(resume(true), "asking for a handle at a resume");
    rank_outcome last = resume(false);
    if (last.status != TAGMEM_SUCCESS)
      problems.push_back("the resume after the refusal failed: " + last.message);
  }
};

}  // namespace
}  // namespace tagmem::nccl

int main(int argc, char** argv) {
  using namespace tagmem::nccl;
  using namespace tagmem::peers;
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s claim|need GROUP RANK SIZE TIMEOUT_MS\n", argv[0]);
    return 2;
  }
  std::string mode = argv[1];
  forger f;
  try {
    f.spec = resolve_spec(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
    if (mode == "claim") {
      f.claim_mode();
    } else if (mode == "need") {
      f.need_mode();
    } else {
      std::fprintf(stderr, "[forger] unknown mode '%s'\n", mode.c_str());
      return 2;
    }
  } catch (const tagmem::error& e) {
    f.problems.push_back(std::string("the forger's group call failed: ") + e.what());
  }
  for (const std::string& p : f.problems) std::fprintf(stderr, "[forger] %s\n", p.c_str());
  return f.problems.empty() ? 0 : 1;
}
