// replication.hpp — what makes a tag replicated: its replication group, and the shared host copy
// while it is offloaded through it (docs/replicated.md).
//
// The group is named by the caller (replicas of dense weights and of expert weights form
// different groups), within the process's job (peers/job_identity.hpp): the processes of one job
// that name the same group and tag, with their ranks and the group's size, are the tag's
// replicas. The setting is kept with the tag (tag::replication()) and changes only while the tag
// holds no shared host copy. The caller of each function holds the tag's lock.
#pragma once

#include <memory>
#include <string>

#include "replica/shared_buffer.hpp"
#include "tags/tag.hpp"

namespace tagmem {

struct replication_spec {
  std::string job;
  std::string group;
  int rank = 0;
  int size = 1;
};

class replication : public tag_attachment {
 public:
  explicit replication(replication_spec s) : spec(std::move(s)) {}
  std::size_t host_bytes() const noexcept override { return copy ? copy->mapped_bytes() : 0; }

  replication_spec spec;
  std::unique_ptr<shared_buffer> copy;   // while the tag is offloaded through it
  std::unique_ptr<shared_buffer> spare;  // after a reload: kept for the next offload (Note
                                         // [shared copy reuse] in replica_tier.hpp)
  std::uint32_t generation = 0;          // of `copy` or `spare`: the last offload through it
};

// Makes the tag replicated in `group` as `rank` of `size`, or not replicated when group is
// NULL. Throws INVALID_ARGUMENT (a bad group name, rank or size, no job identity) and
// TAG_OFFLOADED (the tag holds a shared host copy now).
void set_replication(tag& t, const char* group, int rank, int size);

// The tag's replication, or null when it is not replicated.
replication* replication_of(tag& t) noexcept;

// Whether the tag is offloaded through a shared host copy (its reload is reload_replicated).
bool holds_shared_copy(tag& t) noexcept;

// Gives back the shared copy a resident replicated tag keeps for its next offload; returns its
// bytes (0 when it kept none).
std::size_t drop_spare_copy(tag& t) noexcept;

// The name of the group session that offloads tag `tag_name` of replication group `group`.
std::string replica_session_name(const std::string& group, const char* tag_name);

// What the shared host copy of that tag is called in its header (job, group, tag and size).
std::uint64_t replica_identity(const replication_spec& s, const char* tag_name);

}  // namespace tagmem
