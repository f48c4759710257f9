// group.hpp — the processes of a node meeting for one collective operation.
//
// A group is one job: it is named by the job's identity (group_spec::job, from the launcher's
// run id or TAGMEM_NCCL_JOB) and a group name within the job. Rank 0 is the hub: it takes the
// group's lock and listens (rendezvous_point.hpp), accepts the other ranks, checks each one's
// credentials (same uid; the pid the kernel reports becomes that rank's process identity) and
// hello (same job, group, size and operation; rank in range and not taken), then closes and
// unlinks its socket before answering anyone — so no connection for the next operation can
// reach this one's listener. Its welcome names the job, the group and every rank's process; each
// other rank checks all three (and that the process it is connected to is the one named rank 0).
// A process of another job that reaches the socket anyway is an error naming both jobs.
// The other ranks connect, retrying until the deadline.
//
// After joining, the session offers three exchanges, each a sequence of bounded waits:
//  - all_gather: every rank contributes a blob and receives all of them, in rank order;
//  - mail: every rank sends letters (a blob and file descriptors) to chosen ranks, routed
//    through the hub one at a time with acknowledgements, so the descriptors in flight stay
//    few (the kernel limits them per user) and a receiver handles each letter as it comes;
//  - outcome: an all_gather of each rank's status and message, so all ranks learn together
//    whether a step failed anywhere.
// A rank that fails in the middle closes its connection; the hub then tells the others (ABORT,
// with the reason) and everyone throws PEER or TIMEOUT naming the rank. Descriptors received
// are owned (owned_fds) on every path, errors included.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "peers/messages.hpp"
#include "peers/process_identity.hpp"
#include "peers/unix_channel.hpp"
#include "tagmem/tagmem.h"

namespace tagmem::peers {

struct group_spec {
  std::string job;   // the job's identity: only processes of one job meet
  std::string name;  // the group within the job
  int rank = 0;
  int size = 1;
  int timeout_ms = 60000;
};

// Resolves NULL / -1 / 0 and the job identity from the environment (see tagmem_nccl.h) and
// checks the values. Throws INVALID_ARGUMENT naming the setting to give.
group_spec resolve_spec(const char* name, int rank, int size, int timeout_ms);

struct letter {
  int to = 0;
  std::string blob;
  std::vector<int> fds;  // borrowed: the caller still owns and closes them
};

// Receives a letter. `fds` are the receiver's: take() what it keeps, the rest is closed after.
using letter_handler = std::function<void(int from, const std::string& blob, owned_fds& fds)>;

class group_session {
 public:
  // Joins; throws PEER / TIMEOUT / INVALID_ARGUMENT. With ready == false the call still meets
  // the others, to stop them at once, then throws `why_not` (with its code) on every rank.
  static std::unique_ptr<group_session> join(const group_spec& spec, group_op op, bool ready,
                                             tagmem_status why_code, const std::string& why_not);
  ~group_session();

  int rank() const { return spec_.rank; }
  int size() const { return spec_.size; }
  // The process that is rank `r` in this session.
  const process_identity& member(int r) const { return members_[r]; }
  // "rank 2 (pid 123)", for messages.
  std::string describe(int r) const;

  std::vector<std::string> all_gather(const std::string& blob, const char* what);
  void mail(const std::vector<letter>& outbox, const letter_handler& on_receive, const char* what);
  std::vector<rank_outcome> outcomes(const rank_outcome& mine, const char* what);

 private:
  group_session(const group_spec& spec, group_op op) : spec_(spec), op_(op) {}
  void join_as_hub(bool ready, tagmem_status why_code, const std::string& why_not);
  void join_as_spoke(bool ready, tagmem_status why_code, const std::string& why_not);
  [[noreturn]] void abort_all(tagmem_status code, const std::string& message);
  void check_abort(const message& m);  // throws if m is an ABORT
  // A spoke's send; if rank 0 is gone, throws the reason it sent before going, when it did.
  void send_to_hub(std::uint32_t type, const std::string& payload, const std::vector<int>& fds,
                   const char* what);
  int spoke_wait_ms() const;
  std::string who() const;  // "group 'g' of job 'j'"

  group_spec spec_;
  group_op op_;
  std::vector<process_identity> members_;
  std::vector<std::unique_ptr<unix_channel>> peers_;  // hub: one per rank (null for itself)
  std::unique_ptr<unix_channel> hub_;                 // spoke: the hub
};

}  // namespace tagmem::peers
