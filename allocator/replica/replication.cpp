// replication.cpp — see replication.hpp.
#include "replica/replication.hpp"

#include <cstring>

#include "base/checksum.hpp"
#include "base/error.hpp"
#include "peers/job_identity.hpp"

namespace tagmem {
namespace {

constexpr std::size_t kMaxGroupName = 40;  // the session name adds 17 characters, within 64

bool valid_group(const char* g) {
  const std::size_t n = std::strlen(g);
  if (n == 0 || n > kMaxGroupName) return false;
  for (const char* p = g; *p; ++p) {
    const char c = *p;
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

void set_replication(tag& t, const char* group, int rank, int size) {
  TAGMEM_EXPECTS(!holds_shared_copy(t), TAGMEM_ERROR_TAG_OFFLOADED,
                 std::string("tag '") + t.name() +
                     "' is offloaded through its replicas' shared host copy; reload it before "
                     "changing its replication");
  if (group == nullptr) {
    t.replication().reset();
    return;
  }
  TAGMEM_EXPECTS(valid_group(group), TAGMEM_ERROR_INVALID_ARGUMENT,
                 std::string("replication group name '") + group + "' must be 1-" +
                     std::to_string(kMaxGroupName) + " characters of [A-Za-z0-9._-]");
  TAGMEM_EXPECTS(size >= 1 && size <= kMaxReplicas, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "replication group size " + std::to_string(size) + " is not in 1.." +
                     std::to_string(kMaxReplicas));
  TAGMEM_EXPECTS(
      rank >= 0 && rank < size, TAGMEM_ERROR_INVALID_ARGUMENT,
      "replica rank " + std::to_string(rank) + " is not in 0.." + std::to_string(size - 1));
  replication_spec s{peers::job_identity("replicated tags"), group, rank, size};
  t.replication() = std::make_unique<replication>(std::move(s));
}

replication* replication_of(tag& t) noexcept {
  return static_cast<replication*>(t.replication().get());
}

bool holds_shared_copy(tag& t) noexcept {
  const replication* r = replication_of(t);
  return r != nullptr && r->copy != nullptr;
}

std::size_t drop_spare_copy(tag& t) noexcept {
  replication* r = replication_of(t);
  if (r == nullptr || r->spare == nullptr) return 0;
  const std::size_t n = r->spare->mapped_bytes();
  r->spare.reset();
  return n;
}

std::string replica_session_name(const std::string& group, const char* tag_name) {
  return group + "." + peers::hash_hex(tag_name);
}

std::uint64_t replica_identity(const replication_spec& s, const char* tag_name) {
  std::string key = s.job;
  key.push_back('\0');
  key += s.group;
  key.push_back('\0');
  key += tag_name;
  key.push_back('\0');
  key += std::to_string(s.size);
  return checksum64(key.data(), key.size());
}

}  // namespace tagmem
