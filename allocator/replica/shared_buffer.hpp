// shared_buffer.hpp — the one host copy of a replicated tag, shared by the replicas of a node.
//
// Note [shared host copy]: shared host memory (host_share.hpp: host-located cuMem where the
// driver offers it, else a sealed memfd), sized once when it is made; neither way can be resized
// by a process holding it. Each replica maps it for its device and the host, so that copies to
// and from it are DMA at the link's rate like those of the pinned host store. The first 16 KiB are
// a header: a magic number, the identity of what it holds (a hash of the job, the group and the
// tag), a random token that tells this copy from any other, the bytes, the number of shares and,
// per share, the pid of the process that was that rank and the generation (the offload, counted
// from 1 on this copy) whose bytes it holds, set once they are written. The bytes follow the
// header. The header also holds what replicas that offload alone through a kept copy need
// (Note [offload alone] in solo_offload.hpp): the latest offload through the copy, and per
// replica the offload it must still reload from and the digest it published for the offload it
// took part in last.
//
// Rank 0 makes it; the others adopt the descriptor (and the way it was made) that it sends them
// through the group session (peers/group.hpp), which has checked the sender's user, job and
// process. Adopting checks what the descriptor is (host_share::open) and what the header says
// (magic, identity, bytes, shares) before trusting a byte of it; anything else is PEER.
// Destruction unmaps and closes: the memory goes once the last replica holding it lets go (or
// dies).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "device/device.hpp"
#include "replica/host_share.hpp"

namespace tagmem {

inline constexpr int kMaxReplicas = 256;

// What a replica's tag looked like when it took part in one offload (Note [offload alone]).
struct replica_digest {
  std::uint32_t generation = 0;
  std::uint64_t layout = 0;   // hash of its layout (replica_layout.hpp)
  std::uint64_t sampled = 0;  // its sampled checksum, at that offload's offsets
};

class shared_buffer {
 public:
  // Made `prefer`'s way where the driver allows (host_share::make). Throws HOST_OUT_OF_MEMORY
  // or DRIVER.
  static std::unique_ptr<shared_buffer> create(device& dev, std::uint64_t identity,
                                               std::size_t bytes, int shares,
                                               host_share_way prefer = host_share_way::cumem);
  // Takes ownership of `fd` whatever happens. Throws PEER naming `sender` when the descriptor or
  // its header is not what create() makes, the way `way`, for these values.
  static std::unique_ptr<shared_buffer> adopt(device& dev, int fd, host_share_way way,
                                              std::uint64_t identity, std::size_t bytes, int shares,
                                              const std::string& sender);
  shared_buffer(const shared_buffer&) = delete;
  shared_buffer& operator=(const shared_buffer&) = delete;

  int fd() const noexcept { return memory_->fd(); }
  host_share_way way() const noexcept { return memory_->way(); }
  char* data() const noexcept { return memory_->base() + kHeaderBytes; }
  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t mapped_bytes() const noexcept { return kHeaderBytes + bytes_; }
  int shares() const noexcept { return shares_; }
  // Share k's bytes of the run, [begin, end): multiples of 64 KiB, the last share takes the rest.
  struct range {
    std::size_t begin, end;
  };
  range share(int k) const noexcept;

  std::uint64_t token() const noexcept;
  // Whether share `share` holds the bytes of offload `generation`.
  bool written(int share, std::uint32_t generation) const noexcept;
  void mark_written(int share, std::uint32_t generation) noexcept;  // once its bytes are in data()
  // Note [offload alone]: the latest offload through the copy; advance() moves it from `from` to
  // `to` unless another replica did first; raise_current() makes it at least `generation`.
  std::uint32_t current() const noexcept;
  bool advance(std::uint32_t from, std::uint32_t to) noexcept;
  void raise_current(std::uint32_t generation) noexcept;
  // The offload replica `replica` is offloaded through and must reload from, else 0.
  std::uint32_t needs(int replica) const noexcept;
  void set_needs(int replica, std::uint32_t generation) noexcept;
  // The digest each replica publishes for the offload it takes part in; published() reads the
  // one of `replica` if it is for `generation`.
  void publish(int replica, const replica_digest& d) noexcept;
  bool published(int replica, std::uint32_t generation, replica_digest* out) const noexcept;
  pid_t pid_of(int share) const noexcept;
  void set_pid(int share, pid_t pid) noexcept;

  static constexpr std::size_t kHeaderBytes = 16384;

 private:
  shared_buffer(std::unique_ptr<host_share> memory, std::size_t bytes, int shares)
      : memory_(std::move(memory)), bytes_(bytes), shares_(shares) {}
  struct header;
  header& head() const noexcept;

  std::unique_ptr<host_share> memory_;
  std::size_t bytes_ = 0;
  int shares_ = 0;
};

}  // namespace tagmem
