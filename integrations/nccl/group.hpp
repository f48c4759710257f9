// group.hpp — the processes of a node meeting for one collective operation.
//
// Rank 0 is the hub: it binds <private_dir>/<group>.sock, accepts the other ranks, checks each
// one's credentials (same uid) and hello (same group, size and operation; rank in range and not
// taken), then closes and unlinks the socket it created before answering anyone — so no
// connection for the next operation can reach this one's listener, and no file is left behind.
// The other ranks connect, retrying until the deadline, and check that the hub runs as the same
// user. If any rank said it cannot take part (`ready` false), every rank fails with its reason.
//
// After joining, the session offers three exchanges, each a sequence of bounded waits:
//  - all_gather: every rank contributes a blob and receives all of them, in rank order;
//  - mail: every rank sends letters (a blob and file descriptors) to chosen ranks, routed
//    through the hub one at a time with acknowledgements, so the descriptors in flight stay
//    few (the kernel limits them per user) and a receiver handles each letter as it comes;
//  - outcome: an all_gather of each rank's status and message, so all ranks learn together
//    whether a step failed anywhere.
// A rank that fails in the middle closes its connection; the hub then tells the others (ABORT,
// with the reason) and everyone throws PEER or TIMEOUT naming the rank.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tagmem/tagmem.h"
#include "unix_channel.hpp"

namespace tagmem::nccl {

enum class group_op : std::uint32_t { pause = 1, resume = 2 };
const char* op_name(group_op op);

struct group_spec {
  std::string name;
  int rank = 0;
  int size = 1;
  int timeout_ms = 60000;
};

// Resolves NULL / -1 / 0 from the environment (see tagmem_nccl.h) and checks the values.
// Throws INVALID_ARGUMENT.
group_spec resolve_spec(const char* name, int rank, int size, int timeout_ms);

struct letter {
  int to = 0;
  std::string blob;
  std::vector<int> fds;  // borrowed: the caller still owns and closes them
};

// Receives a letter; takes ownership of `fds`.
using letter_handler =
    std::function<void(int from, const std::string& blob, std::vector<int>& fds)>;

struct rank_outcome {
  tagmem_status status = TAGMEM_SUCCESS;
  std::string message;
};

class group_session {
 public:
  // Joins; throws PEER / TIMEOUT / INVALID_ARGUMENT. With ready == false the call still meets
  // the others, to stop them at once, then throws `why_not` (with its code) on every rank.
  static std::unique_ptr<group_session> join(const group_spec& spec, group_op op, bool ready,
                                             tagmem_status why_code, const std::string& why_not);
  ~group_session();

  int rank() const { return spec_.rank; }
  int size() const { return spec_.size; }
  pid_t pid_of(int rank) const { return pids_[rank]; }
  int rank_of_pid(pid_t pid) const;  // -1 when no rank has it

  std::vector<std::string> all_gather(const std::string& blob, const char* what);
  void mail(const std::vector<letter>& outbox, const letter_handler& on_receive, const char* what);
  std::vector<rank_outcome> outcomes(const rank_outcome& mine, const char* what);

 private:
  group_session(const group_spec& spec, group_op op) : spec_(spec), op_(op) {}
  void join_as_hub(bool ready, tagmem_status why_code, const std::string& why_not);
  void join_as_spoke(bool ready, tagmem_status why_code, const std::string& why_not);
  [[noreturn]] void abort_all(tagmem_status code, const std::string& message);
  void check_abort(message& m);  // throws if m is an ABORT
  int spoke_wait_ms() const;

  group_spec spec_;
  group_op op_;
  std::vector<pid_t> pids_;
  std::vector<std::unique_ptr<unix_channel>> peers_;  // hub: one per rank (null for itself)
  std::unique_ptr<unix_channel> hub_;                 // spoke: the hub
};

}  // namespace tagmem::nccl
