// shared_buffer.cpp — a replicated tag's one host copy: its header over the shared host memory
// (Note [shared host copy] in shared_buffer.hpp).
#include "replica/shared_buffer.hpp"

#include <cstring>
#include <random>

#include "base/error.hpp"

namespace tagmem {

namespace {
constexpr std::uint64_t kMagic = 0x7461676d656d5232ull;  // "tagmemR2"
}  // namespace

struct shared_buffer::header {
  std::uint64_t magic;
  std::uint64_t identity;
  std::uint64_t token;
  std::uint64_t bytes;
  std::uint32_t shares;
  std::uint32_t reserved;
  std::int32_t pid[kMaxReplicas];
  std::uint32_t written[kMaxReplicas];  // generations, read and written atomically: other
                                        // processes set them
  // Note [offload alone] in replica/solo_offload.hpp; all read and written atomically.
  std::uint32_t current;  // the latest offload through this copy
  std::uint32_t reserved2;
  std::uint32_t needs[kMaxReplicas];    // the offload each replica must reload from, else 0
  std::uint32_t joined[kMaxReplicas];   // the offload each replica took part in last
  std::uint64_t layout[kMaxReplicas];   // ... the hash of its layout then
  std::uint64_t sampled[kMaxReplicas];  // ... and its sampled checksum then
};

shared_buffer::header& shared_buffer::head() const noexcept {
  static_assert(sizeof(header) <= kHeaderBytes);
  return *reinterpret_cast<header*>(memory_->base());
}

std::unique_ptr<shared_buffer> shared_buffer::create(device& dev, std::uint64_t identity,
                                                     std::size_t bytes, int shares,
                                                     host_share_way prefer) {
  TAGMEM_EXPECTS(shares >= 1 && shares <= kMaxReplicas, TAGMEM_ERROR_INVALID_ARGUMENT,
                 "a replication group has 1.." + std::to_string(kMaxReplicas) + " replicas");
  std::unique_ptr<shared_buffer> b(
      new shared_buffer(host_share::make(dev, kHeaderBytes + bytes, prefer), bytes, shares));
  header& h = b->head();
  std::memset(&h, 0, sizeof h);  // host cuMem comes with no promise of zeroes
  h.identity = identity;
  h.token = (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
            reinterpret_cast<std::uintptr_t>(b->data());
  h.bytes = bytes;
  h.shares = static_cast<std::uint32_t>(shares);
  __atomic_store_n(&h.magic, kMagic, __ATOMIC_RELEASE);
  return b;
}

std::unique_ptr<shared_buffer> shared_buffer::adopt(device& dev, int fd, host_share_way way,
                                                    std::uint64_t identity, std::size_t bytes,
                                                    int shares, const std::string& sender) {
  const std::string bad = sender + " sent a host copy for a replicated tag that ";
  std::unique_ptr<shared_buffer> b(
      new shared_buffer(host_share::open(dev, fd, way, kHeaderBytes + bytes, bad), bytes, shares));
  const header& h = b->head();
  TAGMEM_EXPECTS(__atomic_load_n(&h.magic, __ATOMIC_ACQUIRE) == kMagic && h.identity == identity &&
                     h.bytes == bytes && h.shares == static_cast<std::uint32_t>(shares),
                 TAGMEM_ERROR_PEER, bad + "holds another tag, group or size");
  return b;
}

shared_buffer::range shared_buffer::share(int k) const noexcept {
  const std::size_t step = bytes_ / static_cast<std::size_t>(shares_) / (std::size_t{64} << 10) *
                           (std::size_t{64} << 10);
  return {step * static_cast<std::size_t>(k),
          k + 1 >= shares_ ? bytes_ : step * static_cast<std::size_t>(k + 1)};
}

std::uint64_t shared_buffer::token() const noexcept { return head().token; }

bool shared_buffer::written(int share, std::uint32_t generation) const noexcept {
  return __atomic_load_n(&head().written[share], __ATOMIC_ACQUIRE) == generation;
}

void shared_buffer::mark_written(int share, std::uint32_t generation) noexcept {
  __atomic_store_n(&head().written[share], generation, __ATOMIC_RELEASE);
}

std::uint32_t shared_buffer::current() const noexcept {
  return __atomic_load_n(&head().current, __ATOMIC_SEQ_CST);
}

bool shared_buffer::advance(std::uint32_t from, std::uint32_t to) noexcept {
  return __atomic_compare_exchange_n(&head().current, &from, to, false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST);
}

void shared_buffer::raise_current(std::uint32_t generation) noexcept {
  std::uint32_t now = current();
  while (now < generation && !__atomic_compare_exchange_n(&head().current, &now, generation, false,
                                                          __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
}

std::uint32_t shared_buffer::needs(int replica) const noexcept {
  return __atomic_load_n(&head().needs[replica], __ATOMIC_SEQ_CST);
}

void shared_buffer::set_needs(int replica, std::uint32_t generation) noexcept {
  __atomic_store_n(&head().needs[replica], generation, __ATOMIC_SEQ_CST);
}

void shared_buffer::publish(int replica, const replica_digest& d) noexcept {
  header& h = head();
  __atomic_store_n(&h.joined[replica], 0u, __ATOMIC_SEQ_CST);  // readers skip it meanwhile
  __atomic_store_n(&h.layout[replica], d.layout, __ATOMIC_RELAXED);
  __atomic_store_n(&h.sampled[replica], d.sampled, __ATOMIC_RELAXED);
  __atomic_store_n(&h.joined[replica], d.generation, __ATOMIC_SEQ_CST);
}

bool shared_buffer::published(int replica, std::uint32_t generation,
                              replica_digest* out) const noexcept {
  const header& h = head();
  if (__atomic_load_n(&h.joined[replica], __ATOMIC_SEQ_CST) != generation) return false;
  out->generation = generation;
  out->layout = __atomic_load_n(&h.layout[replica], __ATOMIC_RELAXED);
  out->sampled = __atomic_load_n(&h.sampled[replica], __ATOMIC_RELAXED);
  // Rewritten meanwhile (its owner moved on): not this generation's.
  return __atomic_load_n(&h.joined[replica], __ATOMIC_SEQ_CST) == generation;
}

pid_t shared_buffer::pid_of(int share) const noexcept { return head().pid[share]; }

void shared_buffer::set_pid(int share, pid_t pid) noexcept { head().pid[share] = pid; }

}  // namespace tagmem
