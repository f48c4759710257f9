// shared_buffer.hpp — the one host copy of a replicated tag, shared by the replicas of a node.
//
// Note [shared host copy]: a memfd, sized once when it is made and sealed against shrinking,
// growing and further seals, so that no process holding it can truncate it under another's
// mapping. Each replica maps it MAP_SHARED and registers the mapping with the driver
// (cuMemHostRegister), so that copies to and from it are DMA at the link's rate like those of
// the pinned host store. The first page is a header: a magic number, the identity of what it
// holds (a hash of the job, the group and the tag), a random token that tells this copy from any
// other, the bytes, the number of shares and, per share, the pid of the process that was that
// rank and the generation (the offload, counted from 1 on this copy) whose bytes it holds, set
// once they are written. The bytes follow the header page.
//
// Rank 0 makes it; the others adopt the descriptor it sends them through the group session
// (peers/group.hpp), which has checked the sender's user, job and process. Adopting checks what
// the descriptor is (a regular file of the exact size, with the seals) and what the header says
// (magic, identity, bytes, shares) before trusting a byte of it; anything else is PEER.
// Destruction unregisters, unmaps and closes: the memory goes once the last replica holding it
// lets go (or dies).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "device/device.hpp"

namespace tagmem {

inline constexpr int kMaxReplicas = 256;

class shared_buffer {
 public:
  // Throws HOST_OUT_OF_MEMORY (memfd, size, mapping) or DRIVER (registration).
  static std::unique_ptr<shared_buffer> create(device& dev, std::uint64_t identity,
                                               std::size_t bytes, int shares);
  // Takes ownership of `fd` whatever happens. Throws PEER naming `sender` when the descriptor or
  // its header is not what create() makes for these values.
  static std::unique_ptr<shared_buffer> adopt(device& dev, int fd, std::uint64_t identity,
                                              std::size_t bytes, int shares,
                                              const std::string& sender);
  ~shared_buffer();
  shared_buffer(const shared_buffer&) = delete;
  shared_buffer& operator=(const shared_buffer&) = delete;

  int fd() const noexcept { return fd_; }
  char* data() const noexcept { return base_ + kHeaderBytes; }
  std::size_t bytes() const noexcept { return bytes_; }
  std::size_t mapped_bytes() const noexcept { return kHeaderBytes + bytes_; }
  int shares() const noexcept { return shares_; }

  std::uint64_t token() const noexcept;
  // Whether share `share` holds the bytes of offload `generation`.
  bool written(int share, std::uint32_t generation) const noexcept;
  void mark_written(int share, std::uint32_t generation) noexcept;  // once its bytes are in data()
  pid_t pid_of(int share) const noexcept;
  void set_pid(int share, pid_t pid) noexcept;

  static constexpr std::size_t kHeaderBytes = 4096;

 private:
  shared_buffer(device& dev, int fd, std::size_t bytes, int shares)
      : dev_(dev), fd_(fd), bytes_(bytes), shares_(shares) {}
  // Throws; the destructor undoes what was done. `fault_in`: the maker touches the pages first.
  void map_and_register(bool fault_in);
  struct header;
  header& head() const noexcept;

  device& dev_;
  int fd_ = -1;
  std::size_t bytes_ = 0;
  int shares_ = 0;
  char* base_ = nullptr;
  bool registered_ = false;
};

}  // namespace tagmem
