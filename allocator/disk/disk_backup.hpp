// disk_backup.hpp — a tag's bytes in files: written from the device and read back, streamed.
//
// Note [disk streaming]: a tag's live allocations go to one file each (Note [disk files]), or
// several when one is larger than TAGMEM_DISK_FILE_BYTES; free memory in its mappings is not
// written (a caller such as torch_memory_saver's counts a file per allocation, and the bytes
// that matter are the allocations'). An allocation's range is rounded out to whole 4 KiB pages
// for O_DIRECT, so allocations sharing a page share a file. The host BACKUP copies whole mappings
// instead (Note [copies span mappings]): fewer, larger copies suit the copy engines, where here
// the file count is what callers see. Each file is cut into pieces of TAGMEM_DISK_PIECE_BYTES.
// TAGMEM_DISK_DEPTH threads each own a pinned bounce buffer of one piece and take the next piece in
// turn: a device-to-host copy into the buffer, then the write (or, reloading, the read, then the
// copy to the device). So that many requests are in flight at once, on the disk and on PCIe, and
// host memory holds depth pieces, never the tag. Each piece's checksum is taken from the bounce
// buffer before it is written and checked after it is read back, before anything reaches the
// device: a reload never puts bytes the disk changed into a tag.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "disk/disk_file.hpp"
#include "tags/tag.hpp"

namespace tagmem {

struct disk_settings {
  std::string dir;              // TAGMEM_DISK_DIR or tagmem_set_disk_dir()
  std::size_t piece_bytes = 0;  // TAGMEM_DISK_PIECE_BYTES
  std::size_t file_bytes = 0;   // TAGMEM_DISK_FILE_BYTES or tagmem_set_disk_file_bytes()
  int depth = 0;                // TAGMEM_DISK_DEPTH
};

struct disk_piece {
  CUdeviceptr dev = 0;
  std::size_t bytes = 0;
  std::size_t file = 0;  // index into disk_backup::files
  off_t offset = 0;
  std::uint64_t checksum = 0;
};

class disk_backup : public tag_attachment {
 public:
  std::vector<std::unique_ptr<disk_file>> files;  // removed with the backup
  std::vector<disk_piece> pieces;
  std::size_t bytes = 0;
};

// Writes the tag's live allocations to new files in s.dir. Throws (IO for the disk, DRIVER,
// HOST_OUT_OF_MEMORY for the bounce buffers) with every file it made removed; the tag is not
// changed either way.
std::unique_ptr<disk_backup> write_disk_backup(device& dev, tag& t, const disk_settings& s);

// Note [a freed allocation's disk copy]: a free in a tag offloaded to disk removes at once the
// files that hold nothing but bytes of the range the free leaves without a live block ([ptr, ptr +
// size): the block with its free neighbours), and forgets their pieces, as a free gives back a
// freed allocation's host copy (Note [a freed allocation's host copy]); the reload reads the rest.
// A file that also holds bytes of a live allocation (allocations sharing a page share its file,
// Note [disk streaming]) stays. The caller holds the tag's lock.
void release_freed_disk_copy(disk_backup& b, CUdeviceptr ptr, std::size_t size) noexcept;

// Copies every piece of `b` back to the device (its ranges must be mapped). Throws IO on a read
// error, a short file or a checksum that does not match; pieces already copied stay copied.
void read_disk_backup(device& dev, disk_backup& b, const disk_settings& s);

}  // namespace tagmem
